"""docs/benchmark.md (table, targets, command) and docs/benchmark.png from bench/run.py's results.

Every figure the page states is either a result (bench/results.json), a setting of the program
(cnpa_controller.config) or of the method (bench.method), formatted from there: the page cannot
state a default or a method the code no longer has. What a row ran with is the row's own."""

from __future__ import annotations

import sys
from pathlib import Path

from bench.method import (
    CLIENT_IN_FLIGHT,
    FLOOR_IN_FLIGHT,
    FRESH_HOST_FROM,
    IDLE_WINDOW,
    LEGACY_HA_TIMINGS,
    MAX_N,
    PERIOD,
    POLL,
    QUIET_FOR,
)
from cnpa_controller.config import LEASE_SECONDS, RENEW_SECONDS, RETRY_SECONDS, Settings

RESYNC = Settings.resync_seconds  # the watch controller's default resync period
CTLS = ("reconcile.sh", "reconcile.sh-before", "naive", "kopf", "watch", "floor")
OURS = ("reconcile.sh",)  # the 3 s loop: the controller the ratios and its targets are about
COLORS = {"reconcile.sh": "tab:blue", "reconcile.sh-before": "tab:cyan", "naive": "tab:red",
          "kopf": "tab:green", "watch": "tab:purple",
          "floor": "tab:gray"}


def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, min(len(s) - 1, -(-len(s) * q // 100) - 1))] if q < 100 else s[-1]


def fmt(v, nd: int = 2) -> str:
    return "-" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))


def verbs(reqs: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in reqs.items()) or "none"


def runs_by(results: dict, datastore: str = "etcd") -> dict:
    """The runs on one datastore by (controller, N); rows from before 2026-12-05 were on etcd."""
    return {(r["controller"], r["n"]): r for r in results["runs"]
            if r.get("datastore", "etcd") == datastore}


def datastores(results: dict) -> list[str]:
    return sorted({r.get("datastore", "etcd") for r in results["runs"]})


def spread(values: list[float] | None) -> str:
    if not values:
        return "-"
    return f"{fmt(pct(values, 50))} / {fmt(pct(values, 95))} / {fmt(pct(values, 100))}, {len(values)}"


def load(r: dict) -> str:
    """The machine's load average when the run started (runs from before it was recorded: -)."""
    la = (r.get("load") or {}).get("before")
    return f"{la[0]:.2f} / {la[1]:.2f}" if la else "-"


def cpu_pct(r: dict) -> float | None:
    """Idle CPU as a share of one core: a pass's CPU over pass + 3 s sleep for the loop, CPU over
    the idle window for an event-driven peer (earlier results: computed from what they have)."""
    idle = r.get("idle") or {}
    if idle.get("cpu_pct") is not None:
        return idle["cpu_pct"]
    if idle.get("cpu_s") is None:
        return None
    if idle.get("wall_s") is not None:
        return 100 * idle["cpu_s"] / (idle["wall_s"] + 3.0)
    return 100 * idle["cpu_s"] / idle.get("window_s", 3.0)


def ratio(a, b) -> str:
    """a / b as the ratio tables print it; - where either is missing."""
    if a is None or not b:
        return "-"
    x = a / b
    return f"{x:.0f}x" if x >= 10 else f"{x:.1f}x" if x >= 1 else f"{x:.2f}x"


def table(results: dict, ds: str = "etcd") -> list[str]:
    by = runs_by(results, ds)
    out = ["| N | controller | converge (s) | idle pass wall (s) | idle requests by verb | idle writes "
           "| restore p50 / p95 / max (s), trials | new → ready p50 / p95 / max (s), trials "
           "| idle CPU (s) / % of a core / peak RSS (MiB) "
           "| work pass wall / CPU (s), writes | load (1 / 5 min) |",
           "|---:|---|---:|---:|---|---:|---|---|---|---|---|"]
    for n in results["sizes"]:
        for c in CTLS:
            r = by.get((c, n))
            if r is None:
                continue
            if "error" in r:
                out.append(f"| {n} | {c} | failed: {r['error']} | | | | | | | | {load(r)} |")
                continue
            if c == "floor":  # no controller: nothing runs between the converges
                out.append(f"| {n} | floor | {fmt(r['converge_s'], 1)} | - | - | - | - | - | - "
                           f"| {fmt(r.get('writes_per_teamspace'))} writes per TeamSpace, "
                           f"{r.get('in_flight', '?')} in flight | {load(r)} |")
                continue
            idle, work = r.get("idle", {}), r.get("work")
            wall = fmt(idle.get("wall_s")) if idle.get("wall_s") is not None else f"({idle.get('note')})"
            w = (f"{fmt(work['wall_s'])} / {fmt(work['cpu_s'])}, {work['writes']}" if work
                 else f"converge CPU {fmt(r.get('converge_cpu_s'))}")
            out.append(
                f"| {n} | {c} | {fmt(r['converge_s'], 1)} | {wall} | {verbs(idle.get('requests', {}))} "
                f"| {idle.get('writes')} | {spread(r.get('restore_s'))} | {spread(r.get('ready_s'))} "
                f"| {fmt(idle.get('cpu_s'))} / {fmt(cpu_pct(r), 1)} / {fmt(idle.get('maxrss_mib'), 1)} "
                f"| {w} | {load(r)} |")
    return out


def ratios(results: dict) -> list[str]:
    by = runs_by(results)
    out = ["| N | controller (X) | converge: naive / X | converge: kopf / X | idle wall: naive / X "
           "| idle requests: naive / X | restore p50: naive / X | restore p50: kopf / X |",
           "|---:|---|---:|---:|---:|---:|---:|---:|"]

    def nreq(x):
        return sum(x["idle"]["requests"].values()) if x.get("idle") else None

    for n in results["sizes"]:
        nv, kp = by.get(("naive", n), {}), by.get(("kopf", n), {})
        for c in OURS:
            r = by.get((c, n), {})
            if "converge_s" not in r:
                continue
            out.append(
                f"| {n} | {c} | {ratio(nv.get('converge_s'), r['converge_s'])} "
                f"| {ratio(kp.get('converge_s'), r['converge_s'])} "
                f"| {ratio(nv.get('idle', {}).get('wall_s'), r['idle']['wall_s'])} "
                f"| {ratio(nreq(nv), nreq(r))} "
                f"| {ratio(pct(nv.get('restore_s', []), 50), pct(r['restore_s'], 50))} "
                f"| {ratio(pct(kp.get('restore_s', []), 50), pct(r['restore_s'], 50))} |")
    return out


def before_after(results: dict, ds: str = "etcd") -> list[str]:
    """reconcile.sh against an earlier reconcile.sh (--reconcile-before), same host and run.
    Above 1x: the current script is that much faster."""
    by = runs_by(results, ds)
    out = ["| N | idle pass wall: before / now | work pass wall: before / now | converge: before / now "
           "| restore p50: before / now | scripts (before → now) |",
           "|---:|---:|---:|---:|---:|---|"]
    for n in results["sizes"]:
        b, r = by.get(("reconcile.sh-before", n), {}), by.get(("reconcile.sh", n), {})
        if "converge_s" not in b or "converge_s" not in r:
            continue
        out.append(
            f"| {n} | {fmt(b['idle']['wall_s'])} / {fmt(r['idle']['wall_s'])} = "
            f"{ratio(b['idle']['wall_s'], r['idle']['wall_s'])} "
            f"| {fmt(b['work']['wall_s'])} / {fmt(r['work']['wall_s'])} = "
            f"{ratio(b['work']['wall_s'], r['work']['wall_s'])} "
            f"| {fmt(b['converge_s'], 1)} / {fmt(r['converge_s'], 1)} = "
            f"{ratio(b['converge_s'], r['converge_s'])} "
            f"| {fmt(pct(b['restore_s'], 50))} / {fmt(pct(r['restore_s'], 50))} "
            f"| {b.get('script', {}).get('sha256', '?')} → {r.get('script', {}).get('sha256', '?')} |")
    return out if len(out) > 2 else []


def before_after_section(results: dict) -> list[str]:
    out = []
    for ds in datastores(results):
        rows = before_after(results, ds)
        if rows:
            out += [f"## reconcile.sh against an earlier reconcile.sh ({ds})", "",
                    "Both installed in the same host with what the role puts beside them, each run by",
                    "cnpa-op.service's 3 s loop for converge and restore, and by hand for the idle and",
                    "work passes (median of 5 idle passes; one work pass). `reconcile.sh-before` is the",
                    "script given as `--reconcile-before` (its sha256 prefix in the last column).", "",
                    *rows, ""]
    return out


def watch_ratios(results: dict, ds: str = "etcd") -> list[str]:
    """The watch controller against the floor, kopf and the 3 s loop, same N and (where measured
    together) same run. Above 1x: the watch controller is that much faster / cheaper."""
    by = runs_by(results, ds)
    out = ["| N | converge: watch / floor | converge: kopf / watch | converge: loop / watch "
           "| restore p50: kopf / watch | restore p50: loop / watch | ready p50: kopf / watch "
           "| ready p50: loop / watch | idle CPU: kopf / watch | idle CPU: loop / watch |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n in results["sizes"]:
        w = by.get(("watch", n), {})
        if "converge_s" not in w:
            continue
        fl, kp, lp = (by.get((c, n), {}) for c in ("floor", "kopf", "reconcile.sh"))

        def p50(r, key):
            return pct(r.get(key) or [], 50)
        out.append(
            f"| {n} | {ratio(w['converge_s'], fl.get('converge_s'))} "
            f"| {ratio(kp.get('converge_s'), w['converge_s'])} "
            f"| {ratio(lp.get('converge_s'), w['converge_s'])} "
            f"| {ratio(p50(kp, 'restore_s'), p50(w, 'restore_s'))} "
            f"| {ratio(p50(lp, 'restore_s'), p50(w, 'restore_s'))} "
            f"| {ratio(p50(kp, 'ready_s'), p50(w, 'ready_s'))} "
            f"| {ratio(p50(lp, 'ready_s'), p50(w, 'ready_s'))} "
            f"| {ratio(cpu_pct(kp), cpu_pct(w))} | {ratio(cpu_pct(lp), cpu_pct(w))} |")
    return out


def delete_table(results: dict, ds: str = "etcd") -> list[str]:
    """N deletions: time until all archived, released and gone, against the floor's."""
    by = runs_by(results, ds)
    out = ["| N | controller | delete requests sent (s) | all gone (s) | / floor | control plane CPU (s) "
           "| load (1 / 5 min) |", "|---:|---|---:|---:|---:|---|---|"]
    for n in results["sizes"]:
        floor = ((by.get(("floor", n)) or {}).get("delete") or {}).get("delete_s")
        for c in CTLS:
            d = (by.get((c, n)) or {}).get("delete")
            if not d:
                continue
            cpu = ", ".join(f"{k} {v}" for k, v in (d.get("server_cpu_s") or {}).items())
            out.append(f"| {n} | {c} | {fmt(d.get('requests_s'), 1)} | {fmt(d.get('delete_s'), 1)} "
                       f"| {ratio(d.get('delete_s'), floor) if c != 'floor' else '-'} | {cpu} "
                       f"| {load(by[(c, n)])} |")
    return out


def datastore_table(results: dict) -> list[str]:
    """The same measurements on kine and etcd, from the same run (rows of each datastore)."""
    stores = datastores(results)
    if len(stores) < 2:
        return []
    by = {ds: runs_by(results, ds) for ds in stores}
    head = " | ".join(f"{what} {ds}" for what in ("converge (s)", "restore p50 (s)", "idle CPU %",
                                                   "delete (s)") for ds in stores)
    out = [f"| N | controller | {head} |", "|---:|---|" + "---:|" * (4 * len(stores))]
    for n in results["sizes"]:
        for c in CTLS:
            rs = [by[ds].get((c, n)) or {} for ds in stores]
            if not any("converge_s" in r for r in rs):
                continue
            cells = [fmt(r.get("converge_s"), 1) for r in rs]
            cells += [fmt(pct(r.get("restore_s") or [], 50), 3) for r in rs]
            cells += [fmt(cpu_pct(r), 2) if r.get("idle") else "-" for r in rs]
            cells += [fmt((r.get("delete") or {}).get("delete_s"), 1) for r in rs]
            out.append(f"| {n} | {c} | " + " | ".join(cells) + " |")
    return out


def server_table(results: dict, ds: str = "etcd") -> list[str]:
    """What the server did while N TeamSpaces converged: CPU seconds of its processes and who
    wrote (audit log). The floor's row says what bounds the floor."""
    by = runs_by(results, ds)
    out = ["| N | controller | converge (s) | kube-apiserver / datastore / kube-controller-manager CPU (s) "
           "| API server CPU, share of 2 cores | writes by user (audit log) |",
           "|---:|---|---:|---|---:|---|"]
    for n in results["sizes"]:
        for c in (*CTLS, "watch-ha"):
            r = by.get((c, n), {})
            cpu = r.get("converge_server_cpu_s")
            if not cpu:
                continue
            busy = cpu.get("kube-apiserver", 0) / (2 * r["converge_s"])
            writers = ", ".join(f"{u.removeprefix('system:serviceaccount:kube-system:')} {k}"
                                for u, k in r.get("converge_writes_by_user", {}).items())
            store = cpu.get("etcd", cpu.get("kine"))
            out.append(f"| {n} | {c} | {fmt(r['converge_s'], 1)} | {fmt(cpu.get('kube-apiserver'), 1)} / "
                       f"{fmt(store, 1)} / {fmt(cpu.get('kube-controller-manager'), 1)} "
                       f"| {busy:.0%} | {writers} |")
    return out


def ha_table(results: dict) -> list[str]:
    rs = [r for r in results["runs"] if r["controller"] == "watch-ha"]
    if not rs:
        return []
    out = ["| N | candidates | lease / renew / retry (s) | leader SIGKILLed → change reconciled (s), "
           "each trial | takeovers | load (1 / 5 min) |",
           "|---:|---:|---|---|---|---|"]
    for r in sorted(rs, key=lambda r: r["n"]):
        if "error" in r:
            out.append(f"| {r['n']} | | | failed: {r['error']} | | {load(r)} |")
            continue
        lat = ", ".join(f"{x:.1f}" for x in r["leader_lost_s"])
        tk = "; ".join(f"{t['killed']} → {t['new_leader']}" for t in r["takeovers"])
        t = r.get("timings") or LEGACY_HA_TIMINGS
        out.append(f"| {r['n']} | {r['candidates']} | {t['lease_s']:g} / {t['renew_s']:g} / "
                   f"{t['retry_s']:g} | {lat} | {tk} | {load(r)} |")
    return out


def watch_targets(results: dict) -> list[str]:
    """The watch controller's targets, each met or MISSED by how much, at the largest N measured
    (the targets' N = 5,000 may not have been run: the line says which N)."""
    by = runs_by(results)
    rs = [by[("watch", n)] for n in results["sizes"] if "converge_s" in by.get(("watch", n), {})]
    if not rs:
        return []
    out = ["**watch** (`python3 -m cnpa_controller`):", ""]
    big = max(rs, key=lambda r: r["n"])
    idle = big["idle"]
    lists = sum(v for k, v in idle["requests"].items() if k.split()[0] == "list")
    other = {k: v for k, v in idle["requests"].items()
             if k.split()[0] in ("create", "update", "patch", "delete") and not k.endswith(" leases")}
    c = cpu_pct(big)
    kp = by.get(("kopf", big["n"]), {})
    ok = lists == 0 and not other and c < 1
    quiet = idle.get("quiet")
    rs_ = idle.get("resync")
    out.append(f"- Idle at N={big['n']} (target at 5,000): no lists between resyncs, no writes but "
               f"Lease renewals, CPU under 1 % of a core: {'met' if ok else 'MISSED'} ({lists} lists, "
               f"{verbs(idle['requests'])} in {idle.get('window_s', '?')} s; CPU {c:.2f} %"
               f"{'' if c < 1 else f', {c - 1:.2f} points over'}; kopf {fmt(cpu_pct(kp), 1)} %)"
               + (f"; the window started once the cluster was quiet, {quiet['waited_s']} s after the "
                  f"trials" if quiet else "; measured while the cluster still wrote (before 2026-12-05)")
               + (f". A window of {rs_['window_s']:.0f} s holding a resync: {rs_['cpu_s']:.2f} CPU s "
                  f"({verbs(rs_['requests'])}); over a whole {RESYNC:.0f} s period that averages "
                  f"{100 * (c / 100 * (RESYNC - rs_['window_s']) + rs_['cpu_s']) / RESYNC:.2f} %"
                  if rs_ else "") + ".")
    for key, what in (("restore_s", "Quota restore"), ("ready_s", "New TeamSpace → Ready")):
        have = [r for r in rs if r.get(key)]
        if not have:
            continue
        w50 = max(pct(r[key], 50) for r in have)
        w95 = max(pct(r[key], 95) for r in have)
        miss = [f"p50 over by {w50 - 0.1:.2f} s"] if w50 > 0.1 else []
        miss += [f"p95 over by {w95 - 0.3:.2f} s"] if w95 > 0.3 else []
        kps = [x for r in have for x in by.get(("kopf", r["n"]), {}).get(key) or []]  # same Ns
        out.append(f"- {what} p50 ≤ 0.1 s, p95 ≤ 0.3 s at every N: "
                   f"{'met' if not miss else 'MISSED (' + ', '.join(miss) + ')'} (worst single N: "
                   f"p50 {w50:.3f} s, p95 {w95:.3f} s; N = {', '.join(str(r['n']) for r in have)}; "
                   f"kopf pooled p50 {fmt(pct(kps, 50), 3)} s).")
    fl = by.get(("floor", big["n"]), {})
    if "converge_s" in fl:
        x = big["converge_s"] / fl["converge_s"]
        out.append(f"- {big['n']} new TeamSpaces converged within 1.25x of the floor (target at 5,000): "
                   f"{'met' if x <= 1.25 else f'MISSED by {x - 1.25:.2f}x'} ({big['converge_s']:.1f} s "
                   f"against the floor's {fl['converge_s']:.1f} s: {x:.2f}x).")
    if "converge_s" in kp:
        x = big["converge_s"] / kp["converge_s"]
        out.append(f"- ... and no slower than kopf: {'met' if x <= 1 else f'MISSED by {x - 1:.0%}'} "
                   f"(kopf {kp['converge_s']:.1f} s: {x:.2f}x kopf's time).")
    by_timings: dict = {}  # one verdict per set of Lease timings
    for r in results["runs"]:
        if r["controller"] == "watch-ha" and r.get("leader_lost_s"):
            t = r.get("timings") or LEGACY_HA_TIMINGS
            by_timings.setdefault((t["lease_s"], t["renew_s"], t["retry_s"]), []).extend(r["leader_lost_s"])
    for (lease, renew, retry), ha in sorted(by_timings.items(), reverse=True):
        worst = max(ha)
        out.append(f"- Leader lost → a change made meanwhile reconciled within 15 s (Lease {lease:g} s, "
                   f"renew {renew:g} s, retry {retry:g} s): "
                   f"{'met' if worst <= 15 else f'MISSED by {worst - 15:.1f} s'} (worst of {len(ha)} "
                   f"kills {worst:.1f} s, median {pct(ha, 50):.1f} s).")
    return out


def targets(results: dict, ctl: str) -> list[str]:
    by = runs_by(results)
    out = []
    # The 3 s loop's targets are stated for N up to 200 (at 1,000 kubectl pages each list: 6 requests).
    rs = [by[(ctl, n)] for n in results["sizes"]
          if n <= 200 and (ctl, n) in by and "error" not in by[(ctl, n)]]
    if not rs:
        return []
    out.append(f"**{ctl}** (the 3 s loop, N up to 200):")
    out.append("")
    lists_ok = all(r["idle"]["requests"] == {"list": 3} for r in rs)
    writes_ok = all(max(r["idle"]["writes_all"]) == 0 for r in rs)
    out.append(f"- Idle pass, 3 list requests and 0 writes for every N: "
               f"{'met' if lists_ok and writes_ok else 'MISSED'} "
               "(" + "; ".join(f"N={r['n']}: {verbs(r['idle']['requests'])}" for r in rs) + ").")
    big = max(rs, key=lambda r: r["n"])
    w = big["idle"]["wall_s"]
    out.append(f"- Idle pass wall time at N={big['n']} under 0.5 s: "
               f"{'met' if w < 0.5 else f'MISSED by {w - 0.5:.3f} s'} "
               f"({w:.2f} s, median of {len(big['idle']['wall_all_s'])}; all: "
               f"{', '.join(f'{x:.2f}' for x in big['idle']['wall_all_s'])}).")
    c = big["converge_s"]
    out.append(f"- Convergence of {big['n']} new TeamSpaces under 15 s: "
               f"{'met' if c < 15 else f'MISSED by {c - 15:.1f} s'} ({c:.1f} s).")
    nv = by.get(("naive", big["n"]), {})
    if "converge_s" in nv:
        x = nv["converge_s"] / c
        out.append(f"- At least 5x faster than the naive baseline: {'met' if x >= 5 else 'MISSED'} "
                   f"({x:.1f}x: naive {nv['converge_s']:.1f} s).")
    allr = [x for r in rs for x in r["restore_s"]]
    p50, p95 = pct(allr, 50), pct(allr, 95)
    worst95 = max(pct(r["restore_s"], 95) for r in rs)
    worst50 = max(pct(r["restore_s"], 50) for r in rs)
    out.append(f"- Quota restore p95 ≤ 3.5 s: {'met' if worst95 <= 3.5 else 'MISSED'} (all N pooled "
               f"p95 {p95:.2f} s; worst single N {worst95:.2f} s).")
    out.append(f"- Quota restore p50 ≤ 2 s: {'met' if worst50 <= 2 else 'MISSED'} (pooled p50 "
               f"{p50:.2f} s; worst single N {worst50:.2f} s).")
    return out


def plot(results: dict, path: Path) -> None:
    # Imported here: the tables need no matplotlib (requirements-bench.txt), their tests neither.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    by = runs_by(results)
    sizes = results["sizes"]
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    (a1, a2), (a3, a4) = axes

    def series(ctl, fn):
        xs, ys = [], []
        for n in sizes:
            r = by.get((ctl, n))
            if r and "error" not in r:
                v = fn(r)
                if v is not None:
                    xs.append(n)
                    ys.append(v)
        return xs, ys

    passes = False
    for c in CTLS:
        kw = {"marker": "o", "color": COLORS[c], "label": c}
        a3.plot(*series(c, lambda r: r.get("converge_s")), **kw)
        deleted = series(c, lambda r: (r.get("delete") or {}).get("delete_s"))
        if deleted[0]:
            a3.plot(*deleted, **{**kw, "linestyle": "--", "marker": "x", "label": f"{c} (delete all)"})
        if c == "floor":  # no process of its own: converge only
            continue
        idle = series(c, lambda r: r.get("idle", {}).get("wall_s"))
        passes = passes or bool(idle[0])
        a1.plot(*idle, **kw)
        work = series(c, lambda r: (r.get("work") or {}).get("wall_s"))
        if work[0]:  # kopf has no passes, so no work pass either
            a1.plot(*work, **{**kw, "linestyle": "--", "marker": "s", "label": f"{c} (work pass)"})
        a2.plot(*series(c, lambda r: sum(r["idle"]["requests"].values()) if r.get("idle") else None),
                **{**kw, "label": c + (" (per idle window)" if c in ("kopf", "watch") else "")})
    a1.axhline(0.5, color="grey", linestyle=":", label="target: idle 0.5 s")
    # Log scales need a positive value: a run without reconcile.sh rows has no pass to draw.
    a1.set(title="Pass wall time (idle: solid, all specs changed: dashed)", xlabel="TeamSpaces (N)",
           ylabel="seconds", **({"xscale": "log", "yscale": "log"} if passes else {}))
    a2.set(title="API requests per idle pass (audit log)", xlabel="TeamSpaces (N)",
           ylabel="requests", xscale="log", yscale="symlog")
    a3.axhline(15, color="grey", linestyle=":", label="3 s loop's target: 15 s at N=200")
    a3.set(title="Converge: N new TeamSpaces -> all in place (dashed: all deleted)",
           xlabel="TeamSpaces (N)",
           ylabel="seconds", xscale="log", yscale="log")
    data, labels, colors = [], [], []
    for c in CTLS:
        for n in sizes:
            r = by.get((c, n))
            if r and r.get("restore_s"):
                data.append(r["restore_s"])
                labels.append(f"{c}\nN={n}")
                colors.append(COLORS[c])
    if data:
        bp = a4.boxplot(data, whis=(5, 95), patch_artist=True)
        for patch, col in zip(bp["boxes"], colors):
            patch.set_facecolor(col)
            patch.set_alpha(0.4)
        a4.set_xticks(range(1, len(labels) + 1), labels, fontsize=6, rotation=90)
    a4.axhline(3.0, color="grey", linestyle=":", label="loop period 3 s")
    a4.axhline(3.5, color="black", linestyle=":", label="target p95 3.5 s")
    a4.set(title="Quota restore latency (box: p25-p75, whiskers p5-p95)",
           ylabel="seconds (linear to 5 s, then log)")
    a4.set_yscale("symlog", linthresh=5)
    a4.set_ylim(bottom=0)
    a2.set_ylim(bottom=0)
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    for ax in (a1, a2, a3):
        ax.set_xticks(sizes)
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_major_formatter(plain)
    for ax in axes.flat:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("cnpa-op reconcile cost vs number of TeamSpaces (bench/run.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def server_line(results: dict) -> str:
    servers = results.get("servers") or ({"etcd": results["server"]} if results.get("server") else {})
    if not servers:
        return "Server: not recorded (results from before the server version was recorded)."
    first = next(iter(servers.values()))
    stores = "; ".join(s.get("datastore") or f"etcd {s['etcd']}" for s in servers.values())
    return (f"Server: **Kubernetes {first['kubernetes']}** (kube-apiserver, kube-controller-manager "
            f"and kubectl {first['kubectl']} of the test host, built from Go modules); datastore: "
            f"{stores}.")


# Which rows began at a load of 2.0 or more and why, written by hand for exactly these rows
# (controller, N, datastore, start; see the Analysis): once another row begins at 2.0 or more, or
# one of these is measured again, the note no longer describes them and the page leaves it out.
LOAD_NOTE_ROWS = frozenset({
    ("watch-ha", 200, "etcd", "2026-12-04 18:20 UTC"),
    ("kopf", 5000, "etcd", "2026-12-05 17:07 UTC"),
    ("kopf", 1000, "kine", "2026-12-05 17:21 UTC"),
    ("kopf", 5000, "kine", "2026-12-05 17:30 UTC"),
    ("floor", 5000, "etcd", "2026-12-05 20:45 UTC"),
    ("watch", 5000, "kine", "2026-12-05 20:53 UTC"),
    ("floor", 5000, "kine", "2026-12-05 21:04 UTC"),
    ("reconcile.sh", 1000, "etcd", "2026-12-06 01:23 UTC"),
})
LOAD_NOTE = (
    "The 11.9 is the watch-ha row with the old 15 s lease, from a loaded run; the role now uses a "
    "10 s lease, measured at load 0.6. The other seven began at 2.0-4.4. Six come from the runs of "
    "2026-12-05 16:59 and 20:33 UTC, with nothing else running on the machine (Analysis): there the "
    "load is the benchmark's own work, such as tearing down the previous row's host. The seventh, "
    "reconcile.sh at N = 1,000 (2.1), comes from the run of 2026-12-06 01:15 UTC, which the "
    "Analysis does not describe.")


def load_line(results: dict) -> list[str]:
    """At the top, the rows that began at a load average of 2 or more on the 2 shared cores, and
    (LOAD_NOTE, while it describes exactly these rows) why; else the days they began."""
    busy = [r for r in results["runs"] if ((r.get("load") or {}).get("before") or [0])[0] >= 2]
    if not busy:
        return []
    loads = [r["load"]["before"][0] for r in busy]
    rows = {(r["controller"], r["n"], r.get("datastore", "etcd"), r.get("started")) for r in busy}
    why = (LOAD_NOTE if rows == LOAD_NOTE_ROWS
           else f"They began on {', '.join(sorted({r.get('started', '?')[:10] for r in busy}))}.")
    return [f"**Load: {len(busy)} rows ({', '.join(sorted({r['controller'] for r in busy}))}) began at "
            f"a load average of {min(loads):.1f}-{max(loads):.1f} on 2 shared cores (column \"load\"); "
            f"every other recorded load was below 2.0.** {why} Absolute times are noisy on 2 shared "
            "cores; read the ratios of one run.", ""]


def kine_sections(results: dict) -> list[str]:
    """The rows measured on kine (the test host's datastore since 2026-12-05: a single k3s
    server's SQLite), beside the etcd rows above."""
    if "kine" not in datastores(results):
        return []
    return ["## On kine (SQLite, a single k3s server's datastore), beside etcd", "",
            "The same measurements with the host's API server storing in kine (SQLite) instead of",
            "etcd, rows from the same run (`--datastores etcd,kine`); every table above is etcd's.",
            "", *datastore_table(results), "", "### Results on kine", "", *table(results, "kine"),
            "", "### The watch controller against the floor and kopf, on kine", "",
            *watch_ratios(results, "kine"), "", "### Mass deletion on kine", "",
            *delete_table(results, "kine"), "", "### What the server did, on kine", "",
            *server_table(results, "kine"), ""]


def write_report(results: dict, docs: Path, command: str) -> None:
    docs.mkdir(exist_ok=True)
    try:
        plot(results, docs / "benchmark.png")
    except ModuleNotFoundError as e:  # the project's .venv has no matplotlib (requirements-bench.txt)
        if e.name != "matplotlib":
            raise
        print(f"{docs / 'benchmark.png'} left as it is: no matplotlib here (requirements-bench.txt; "
              "bench-venv has it)", file=sys.stderr)
    md = [
        "# Benchmark: reconcile cost vs number of TeamSpaces",
        "",
        server_line(results),
        "",
        *load_line(results),
        "Generated by `bench/run.py` (do not edit by hand). Regenerate the table, this page and",
        "`benchmark.png` (and the raw numbers in `bench/results.json`) with, as root on the machine",
        "that runs the test hosts:",
        "",
        "```sh",
        "python3 -m venv bench-venv && echo \"import site; site.addsitedir('$PWD/.venv/lib/python3.11/\\",
        "site-packages')\" > bench-venv/lib/python3.11/site-packages/main-venv.pth  # the project's .venv",
        "bench-venv/bin/pip install kopf==1.45.2 matplotlib==3.11.2   # requirements-bench.txt's two",
        "sudo bench-venv/bin/python bench/run.py   # all sizes and peers: hours; see --help",
        "```",
        "",
        "These figures were produced by: "
        + "; then ".join(f"`{e['command']}` ({e['started']})" for e in results.get("earlier", []))
        + ("; then " if results.get("earlier") else "") + f"`{command}` ({results.get('started', '?')})"
        + " (`--merge` keeps the other controllers' rows of `bench/results.json`).",
        "",
        "It creates its own throwaway test host (`python -m testhost create bench`, destroyed at",
        "the end), logs the admin user's reads too in that host's audit log, installs the CRD,",
        "`reconcile.sh` and `cnpa-op.service` from this repository (unit rendered from",
        "`roles/cnpa_controller`) and measures these controllers doing the same job on the same host:",
        "",
        "- **reconcile.sh**: the project's controller: a lock and a deadline around one pass of the",
        "  package (`python3 -m cnpa_controller --once`: 3 lists, one plan per TeamSpace, writes only",
        f"  what differs, {Settings.workers} TeamSpaces' writes at a time). Rows before 2026-12-06 "
        "measured the",
        "  earlier script, bash and jq driving kubectl (writes of one kind in one List, up to 4",
        "  kubectl processes for a large one); `reconcile.sh-before` is such a script, measured beside",
        "  the current one in the same run;",
        "- **naive**: `bench/naive_reconcile.sh`, written for the benchmark: gets and applies each",
        f"  object separately (one kubectl per object) every pass, in the same unit (loop, sleep "
        f"{PERIOD:g});",
        "- **kopf**: `bench/kopf_peer.py`, an event-driven peer built with kopf (watches, no polling),",
        "  run on the machine against the host's API server;",
        "- **watch**: `python3 -m cnpa_controller` (watch-fed caches, a work queue, the same",
        "  plan as reconcile.sh), run like kopf on the machine against the host's API server, with",
        "  leader election on (one candidate) and the controller's own defaults (resync "
        f"{RESYNC:g} s,",
        f"  {Settings.workers} workers since 2026-12-05, 4 before; the unit's are the same); its "
        "requests are told",
        "  apart in the audit log by its user agent",
        "  `cnpa-controller/IDENTITY`;",
        "- **floor** (not a controller): the same TeamSpace creates, and for each the writes",
        "  `plan()` gives for it as created (finalizer, namespace, quota, status), sent as",
        "  the watch controller's executor sends them by one client as soon as each TeamSpace exists:",
        f"  no list, watch, cache or decision, {FLOOR_IN_FLIGHT} TeamSpaces in flight "
        "(`FLOOR_IN_FLIGHT`). No",
        "  controller can converge faster on this host; what bounds it is in the server table below.",
        "- **watch-ha**: three watch controllers (distinct `CNPA_LEASE_IDENTITY`, one Lease, with",
        "  the Lease timings each row names in \"Leader lost\": by default the program's, lease "
        f"{LEASE_SECONDS} s,",
        f"  renew {RENEW_SECONDS} s, retry {RETRY_SECONDS} s; rows without recorded timings ran "
        + " / ".join(f"{t:g}" for t in LEGACY_HA_TIMINGS.values()) + " s);",
        "  the leader is SIGKILLed and one TeamSpace's",
        "  spec changed right after; the time until that change is reconciled (quota and status).",
        "  The killed process is started again as a candidate before the next trial.",
        "",
        f"Sizes run per controller: naive up to N = {MAX_N['naive']:,} (one pass takes minutes "
        "there), the 3 s loop",
        f"up to N = {MAX_N['reconcile.sh']:,}: at 5,000 its idle pass alone (3.5 s, see Analysis) "
        "is longer than",
        f"its {PERIOD:g} s sleep, so it no longer is a 3 s loop.",
        "",
        f"Started {results.get('started', '?')}; restore trials per run: up to {results['trials']}"
        " (the naive baseline: as many as fit in 200 s). Machine: 2 cores shared with other test",
        "hosts, so absolute times are noisy; ratios from the same run are the figures to read. Rows from",
        "2026-12-04 18:00 UTC on carry the machine's load average (1 / 5 min, `os.getloadavg()`, what",
        "`uptime` shows) when it started; rows without one are older runs (see the commands above).",
        "",
        "## Definitions",
        "",
        f"- **converge**: from the first create request of N TeamSpaces ({CLIENT_IN_FLIGHT} in "
        "parallel) to every one",
        "  having its namespace (ownerReference to it), its quota (pods as in the spec) and",
        "  `status.observedGeneration == metadata.generation`, with the service running (polled every",
        "  0.2 s).",
        "- **idle pass**: the service stopped, one pass run by hand in the host with the service's",
        "  environment, nothing to do (median of 5 for reconcile.sh). Requests: the audit log's lines",
        "  for that pass (user admin, user agent kubectl), by verb. kopf has no passes: its row shows",
        "  what it did during a 3 s idle window.",
        "- **CPU / peak RSS**: CPU time (user + system) of every process of the pass (bash, kubectl,",
        "  jq) and the peak resident memory of its largest single process (getrusage of the children).",
        "- **restore**: delete `team-quota` of a random TeamSpace at a random moment of the loop, time",
        f"  until a quota with a new uid exists (polled every {POLL:g} s in the rows with a load "
        "average, 0.05 s in the older ones).",
        "- **new → ready**: create one more TeamSpace at a random moment of the loop, time until its",
        f"  status is written for its generation (polled every {POLL:g} s; the status is the last "
        "write of",
        "  a TeamSpace's pass, after its namespace and quota). Not run for naive.",
        "- **idle CPU % of a core**: the loop: a pass's CPU over (pass wall + 3 s sleep); kopf and",
        f"  watch: their process's CPU (from /proc) over an idle window ({IDLE_WINDOW:g} s in the "
        "rows with a load average, 3 s",
        "  in the older ones), whose requests the idle columns show by verb and resource. "
        "Since 2026-12-05 the",
        f"  window starts once nobody but Lease holders has written for {QUIET_FOR:g} s: after N "
        "new namespaces",
        "  the controller-manager's service-account, root-CA and quota controllers write into each",
        "  at 20 requests/s apiece (minutes at N = 5,000), and each quota status write is an event",
        "  both peers receive. For the watch controller the window holds no resync; from N = 1,000",
        "  a second window of the same length around a resync gives its cost.",
        f"- **rows from N = {FRESH_HOST_FROM:,} on** start on a new test host since 2026-12-05 "
        "(before: on the one",
        "  host, after the previous row's namespaces were deleted).",
        "- **work pass**: the service stopped, every TeamSpace's `spec.pods` changed, one pass by hand.",
        "",
        "## Results",
        "",
        *table(results),
        "",
        "## Ratios (same run, same host)",
        "",
        *ratios(results),
        "",
        "## The watch controller against the floor, kopf and the 3 s loop",
        "",
        "Above 1x: the watch controller is that much faster or cheaper (converge: watch / floor is",
        "the other way round, how far above the floor it is).",
        "",
        *watch_ratios(results),
        "",
        *kine_sections(results),
        *before_after_section(results),
        "## Mass deletion",
        "",
        f"Last in each row, with the controller running: every one of its N TeamSpaces deleted "
        f"({CLIENT_IN_FLIGHT}",
        "requests in parallel), timed until none is left, each archived (the watch controller and",
        "the floor: on disk and as a ConfigMap) and its finalizer released. The floor sends, for",
        "each deletion as soon as it is answered, the writes the plan gives for it, through the",
        f"watch controller's executor ({FLOOR_IN_FLIGHT} in flight). Both start with an empty "
        "archive directory",
        "(since aff07eb; before, the watch controller's kept earlier runs' records, so each of its",
        "deletions also kept the earlier record of its name), and the executor lists the directory",
        "once, not before each record (since 304c28e).",
        "",
        *delete_table(results),
        "",
        "## What the server did while N TeamSpaces converged",
        "",
        "CPU seconds of the test host's control plane processes over the converge, and the writes",
        "of every user in the audit log (admin: the benchmark's creates and the controller under",
        "test, by user agent; the controller-manager's service-account controller and",
        "root-ca-cert-publisher write a ServiceAccount and a ConfigMap into every new namespace, the",
        "resourcequota controller a status into every quota).",
        "",
        *server_table(results),
        "",
        "## Leader lost (HA run)",
        "",
        *ha_table(results),
        "",
        "## Targets of the watch controller",
        "",
        *watch_targets(results),
        "",
        "## Targets of the 3 s loop",
        "",
        *targets(results, "reconcile.sh"),
        "",
        "![benchmark plot](benchmark.png)",
        "",
    ]
    notes = Path(__file__).with_name("NOTES.md")
    if notes.exists():  # the reading of these figures, written by hand next to this script
        md += ["## Analysis", "", notes.read_text().strip(), ""]
    (docs / "benchmark.md").write_text("\n".join(md))
