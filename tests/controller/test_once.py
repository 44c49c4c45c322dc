"""One pass from a fresh list (python3 -m cnpa_controller --once / --plan) against a real API
server: reconcile.sh's contract (a converged pass writes nothing, one stdout line per write,
exit statuses) with the watch controller's executor."""

from __future__ import annotations

import re

from ctllib import FINALIZER, ControllerProcess, get_or_none, quota_hard, ready, teamspace


def empty_cluster(host, c: ControllerProcess) -> None:
    """Earlier tests leave TeamSpaces (some broken on purpose) that a pass over every TeamSpace
    would reconcile too: deleted, and released by passes of this process."""
    host.kubectl("delete", "teamspaces", "--all", "--wait=false")
    for _ in range(5):
        if not host.get("teamspaces")["items"]:
            return
        c.once()
    assert not host.get("teamspaces")["items"], host.get("teamspaces")


def test_a_pass_converges_then_writes_nothing_then_archives_a_deletion(host, tmp_path):
    c = ControllerProcess(host, tmp_path / "once")
    empty_cluster(host, c)
    host.apply(teamspace("once-a", pods=4, cpu="500m"))
    first = c.once()
    assert first.returncode == 0, first.stderr
    assert ready(host, "once-a"), first.stdout + first.stderr
    assert quota_hard(host, "once-a") == {"pods": "4", "requests.cpu": "500m"}
    lines = first.stdout.splitlines()
    assert "teamspace once-a: finalizer added" in lines
    assert "teamspace once-a: namespace team-once-a created" in lines
    assert all(line.startswith("teamspace once-a: ") for line in lines), lines

    again = c.once()
    assert (again.returncode, again.stdout) == (0, ""), again.stderr

    uid = host.get("teamspace", "once-a")["metadata"]["uid"]
    host.kubectl("delete", "teamspace", "once-a", "--wait=false")
    assert FINALIZER in host.get("teamspace", "once-a")["metadata"]["finalizers"]
    gone = c.once()
    assert gone.returncode == 0, gone.stderr
    assert f"teamspace once-a: archived to {c.archive}/once-a.json" in gone.stdout.splitlines()
    assert f'"uid":"{uid}"' in (c.archive / "once-a.json").read_text()
    assert get_or_none(host, "teamspace", "once-a") is None


def test_plan_prints_the_writes_and_writes_nothing(host, tmp_path):
    c = ControllerProcess(host, tmp_path / "plan")
    empty_cluster(host, c)
    host.apply(teamspace("once-plan", pods=2))
    out = c.once("--plan")
    assert out.returncode == 0, out.stderr
    steps = [line for line in out.stdout.splitlines() if '"teamspace":"once-plan"' in line]
    assert steps and len(steps) == len(out.stdout.splitlines())
    assert get_or_none(host, "namespace", "team-once-plan") is None
    assert not host.get("teamspace", "once-plan")["metadata"].get("finalizers")


def test_an_unreadable_api_server_is_status_2_and_a_bad_argument_3(host, tmp_path):
    kubeconfig = tmp_path / "unreachable"
    # Port 1 on loopback: nothing listens there, the connection is refused at once.
    kubeconfig.write_text(re.sub(r"server: https://127\.0\.0\.1:[0-9]+", "server: https://127.0.0.1:1",
                                 host.inst.kubeconfig.read_text()))
    c = ControllerProcess(host, tmp_path / "down", KUBECONFIG=str(kubeconfig),
                          CNPA_REQUEST_TIMEOUT="2s")
    down = c.once()
    assert down.returncode == 2, down.stderr
    assert "nothing written" in down.stderr
    assert c.once("--twice").returncode == 3
