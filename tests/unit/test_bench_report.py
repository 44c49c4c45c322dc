"""bench/report.py's verdicts on the watch controller's targets, on hand-made results: each target is reported
met or MISSED by how much, from the same figures the tables show."""

from __future__ import annotations

import json
from pathlib import Path

from bench import report

ROOT = Path(__file__).resolve().parents[2]


def watch_run(n, *, converge=10.0, restore=(0.05, 0.06, 0.08), ready=(0.07, 0.08, 0.09),
              idle_cpu=0.2, window=20.0, requests=None):
    return {"controller": "watch", "n": n, "converge_s": converge, "restore_s": list(restore),
            "ready_s": list(ready), "load": {"before": [0.5, 0.7, 0.9]},
            "idle": {"wall_s": None, "cpu_s": idle_cpu * window / 100, "cpu_pct": idle_cpu,
                     "window_s": window, "writes": 2,
                     "requests": requests if requests is not None else {"update leases": 2}}}


def results(*runs, sizes=(1000,)):
    return {"sizes": list(sizes), "trials": 3, "runs": list(runs)}


def line(lines, start):
    hits = [x for x in lines if x.startswith(start)]
    assert len(hits) == 1, lines
    return hits[0]


def test_cpu_pct_of_the_loop_counts_its_sleep_and_of_older_kopf_rows_their_3_s_window():
    loop = {"idle": {"wall_s": 1.0, "cpu_s": 0.4}}
    assert report.cpu_pct(loop) == 10.0
    assert report.cpu_pct({"idle": {"wall_s": None, "cpu_s": 0.03, "note": "3 s"}}) == 1.0
    assert report.cpu_pct({"idle": {"cpu_pct": 0.25, "cpu_s": 9}}) == 0.25
    assert report.cpu_pct({"controller": "floor"}) is None


def test_all_targets_met():
    res = results(watch_run(1000, converge=11.0), {"controller": "floor", "n": 1000, "converge_s": 10.0},
                  {"controller": "kopf", "n": 1000, "converge_s": 12.0, "restore_s": [0.06],
                   "idle": {"wall_s": None, "cpu_s": 1.0, "cpu_pct": 5.0}},
                  {"controller": "watch-ha", "n": 1000, "candidates": 3, "leader_lost_s": [12.0, 14.9],
                   "takeovers": [{"killed": "a", "new_leader": "b"}] * 2})
    out = report.watch_targets(res)
    assert "MISSED" not in "\n".join(out)
    assert "1.10x" in line(out, "- 1000 new TeamSpaces converged within 1.25x")
    assert "kopf 5.0 %" in line(out, "- Idle at N=1000")


def test_misses_say_by_how_much():
    res = results(watch_run(1000, converge=15.0, restore=(0.2, 0.2, 0.5), idle_cpu=1.5,
                            requests={"list teamspaces": 1, "update leases": 2}),
                  {"controller": "floor", "n": 1000, "converge_s": 10.0},
                  {"controller": "kopf", "n": 1000, "converge_s": 12.0},
                  {"controller": "watch-ha", "n": 1000, "candidates": 3, "leader_lost_s": [16.5],
                   "takeovers": [{"killed": "a", "new_leader": "b"}]})
    out = report.watch_targets(res)
    idle = line(out, "- Idle at N=1000")
    assert "MISSED" in idle and "1 lists" in idle and "0.50 points over" in idle
    restore = line(out, "- Quota restore")
    assert "p50 over by 0.10 s" in restore and "p95 over by 0.20 s" in restore
    assert "MISSED by 0.25x" in line(out, "- 1000 new TeamSpaces converged")
    assert "MISSED by 25%" in line(out, "- ... and no slower than kopf")
    assert "MISSED by 1.5 s" in line(out, "- Leader lost")
    assert "met" in line(out, "- New TeamSpace → Ready")


def test_a_write_other_than_a_lease_renewal_misses_the_idle_target():
    res = results(watch_run(200, requests={"update leases": 2, "update teamspaces": 1}), sizes=(200,))
    assert "MISSED" in line(report.watch_targets(res), "- Idle at N=200")


def test_ratios_compare_at_the_same_n_only():
    res = results(watch_run(200, converge=10.0), watch_run(1000, converge=50.0),
                  {"controller": "floor", "n": 1000, "converge_s": 40.0},
                  {"controller": "reconcile.sh", "n": 200, "converge_s": 20.0, "restore_s": [1.5],
                   "ready_s": [1.4], "idle": {"wall_s": 0.5, "cpu_s": 0.7}},
                  sizes=(200, 1000))
    rows = report.watch_ratios(res)[2:]
    assert rows[0].startswith("| 200 | - | - | 2.0x | - | 25x | - | 18x | - | 100x |"), rows[0]
    assert rows[1].startswith("| 1000 | 1.2x | - | - |"), rows[1]


def test_each_set_of_lease_timings_gets_its_own_leader_lost_verdict():
    ha = {"controller": "watch-ha", "n": 200, "candidates": 3,
          "takeovers": [{"killed": "a", "new_leader": "b"}]}
    res = results(watch_run(200), {**ha, "leader_lost_s": [16.2]},
                  {**ha, "leader_lost_s": [9.8], "timings": {"lease_s": 8, "renew_s": 5, "retry_s": 1}},
                  sizes=(200,))
    out = [x for x in report.watch_targets(res) if x.startswith("- Leader lost")]
    assert len(out) == 2
    assert "(Lease 15 s" in out[0] and "MISSED by 1.2 s" in out[0]
    assert "(Lease 8 s" in out[1] and ": met (" in out[1]
    assert "| 8 / 5 / 1 | 9.8 |" in "\n".join(report.ha_table(res))


def test_rows_measured_under_load_are_flagged_at_the_top():
    quiet = {**watch_run(200), "load": {"before": [0.4, 0.5, 0.6]}, "started": "2026-12-05 03:00 UTC"}
    busy = {**watch_run(1000), "load": {"before": [9.7, 10.1, 8.0]}, "started": "2026-12-04 18:33 UTC"}
    assert report.load_line(results(quiet, sizes=(200,))) == []
    line = report.load_line(results(quiet, busy, sizes=(200, 1000)))[0]
    assert "1 rows (watch)" in line and "2026-12-04" in line and "9.7-9.7" in line
    assert report.LOAD_NOTE not in line  # written for other rows


def test_the_hand_written_load_note_is_shown_for_exactly_the_rows_it_describes():
    committed = json.loads((ROOT / "bench/results.json").read_text())
    line = report.load_line(committed)[0]
    assert report.LOAD_NOTE in line and "2026-12-04" not in line.split("**")[1]
    busy = next(r for r in committed["runs"] if (r.get("load") or {}).get("before", [0])[0] >= 2)
    redone = {**committed, "runs": [{**r, "started": "2026-12-07 09:00 UTC"} if r is busy else r
                                    for r in committed["runs"]]}
    assert report.LOAD_NOTE not in report.load_line(redone)[0]


def test_rows_of_each_datastore_are_kept_apart_and_compared():
    etcd = watch_run(1000, converge=11.0)
    kine = {**watch_run(1000, converge=13.0), "datastore": "kine",
            "delete": {"delete_s": 7.5, "requests_s": 3.0}}
    res = results(etcd, kine, {"controller": "floor", "n": 1000, "converge_s": 10.0, "datastore": "kine"})
    assert report.runs_by(res)[("watch", 1000)]["converge_s"] == 11.0  # no datastore: etcd
    assert report.runs_by(res, "kine")[("watch", 1000)]["converge_s"] == 13.0
    row = line(report.datastore_table(res), "| 1000 | watch |")
    assert row.split(" | ")[2:4] == ["11.0", "13.0"]  # etcd, kine (sorted)
    assert "1.3x" in line(report.watch_ratios(res, "kine"), "| 1000 |")
    assert report.datastore_table(results(etcd)) == []


def _page(tmp_path) -> str:
    committed = json.loads((ROOT / "bench/results.json").read_text())
    report.write_report(committed, tmp_path, committed.get("command", ""))
    return (tmp_path / "benchmark.md").read_text()


def test_the_committed_page_is_what_the_committed_results_give(tmp_path):
    """docs/benchmark.md is generated: `bench/run.py --report-only` rewrites it from
    bench/results.json, the code's settings and bench/NOTES.md, and nothing else may change it."""
    assert _page(tmp_path) == (ROOT / "docs/benchmark.md").read_text(), \
        "run `.venv/bin/python bench/run.py --report-only` and commit docs/benchmark.md"


def test_the_page_states_the_program_s_and_the_method_s_figures_as_the_code_has_them(tmp_path):
    from bench import method
    from cnpa_controller.config import LEASE_SECONDS, RENEW_SECONDS, RETRY_SECONDS, Settings

    page = _page(tmp_path)
    assert (f"by default the program's, lease {LEASE_SECONDS} s,\n  renew {RENEW_SECONDS} s, "
            f"retry {RETRY_SECONDS} s") in page
    assert f"(resync {Settings.resync_seconds:g} s,\n  {Settings.workers} workers" in page
    assert f"{method.FLOOR_IN_FLIGHT} TeamSpaces in flight" in page
    assert f"naive up to N = {method.MAX_N['naive']:,}" in page
    # What the page said while the program's Lease was 10 / 7 s.
    assert "default\n  timings: lease 15 s" not in page
