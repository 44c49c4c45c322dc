"""One pass from a fresh list against a real API server, run both ways: `python3 -m
cnpa_controller --once` (and `--plan`), and reconcile.sh, which runs it under its lock and
deadline. The lab's contract: a converged pass writes nothing, one stdout line per write, exit
statuses."""

from __future__ import annotations

import json
import re
import time

import pytest
from ctllib import ControllerProcess, events, get_or_none, quota_hard, ready

from cnpa_controller.events import EVENT_BURST, EVENT_REFILL_SECONDS
from cnpa_controller.plan import FINALIZER
from fixtures import teamspace


@pytest.fixture(params=["--once", "reconcile.sh"])
def one_pass(request):
    """one_pass(c, *args): a pass (args: "--plan" for a plan) through the way under test."""
    if request.param == "--once":
        run = lambda c, *args: c.once(*(args or ("--once",)))  # noqa: E731
    else:
        run = lambda c, *args: c.reconcile(*args)  # noqa: E731
    # Names of its own: a namespace of the other way's test may still be terminating.
    run.tag = "once" if request.param == "--once" else "rsh"
    return run


def empty_cluster(host, c: ControllerProcess) -> None:
    """Earlier tests leave TeamSpaces (some broken on purpose) that a pass over every TeamSpace
    would reconcile too: deleted, and released by passes of this process."""
    host.kubectl("delete", "teamspaces", "--all", "--wait=false")
    for _ in range(5):
        if not host.get("teamspaces")["items"]:
            return
        c.once()
    assert not host.get("teamspaces")["items"], host.get("teamspaces")


def test_a_pass_converges_then_writes_nothing_then_archives_a_deletion(host, tmp_path,
                                                                         one_pass):
    c = ControllerProcess(host, tmp_path / "once")
    name = f"{one_pass.tag}-a"
    empty_cluster(host, c)
    host.apply(teamspace(name, pods=4, cpu="500m"))
    first = one_pass(c)
    assert first.returncode == 0, first.stderr
    assert ready(host, name), first.stdout + first.stderr
    assert quota_hard(host, name) == {"pods": "4", "requests.cpu": "500m"}
    lines = first.stdout.splitlines()
    assert f"teamspace {name}: finalizer added" in lines
    assert f"teamspace {name}: namespace team-{name} created" in lines
    assert all(line.startswith(f"teamspace {name}: ") for line in lines), lines

    again = one_pass(c)
    assert (again.returncode, again.stdout) == (0, ""), again.stderr

    uid = host.get("teamspace", name)["metadata"]["uid"]
    host.kubectl("delete", "teamspace", name, "--wait=false")
    assert FINALIZER in host.get("teamspace", name)["metadata"]["finalizers"]
    gone = one_pass(c)
    assert gone.returncode == 0, gone.stderr
    assert f"teamspace {name}: archived to {c.archive}/{name}.json" in gone.stdout.splitlines()
    assert f'"uid":"{uid}"' in (c.archive / f"{name}.json").read_text()
    assert get_or_none(host, "teamspace", name) is None


def test_plan_prints_the_writes_and_writes_nothing(host, tmp_path, one_pass):
    c = ControllerProcess(host, tmp_path / "plan")
    name = f"{one_pass.tag}-plan"
    empty_cluster(host, c)
    host.apply(teamspace(name, pods=2))
    out = one_pass(c, "--plan")
    assert out.returncode == 0, out.stderr
    steps = [line for line in out.stdout.splitlines() if f'"teamspace":"{name}"' in line]
    assert steps and len(steps) == len(out.stdout.splitlines())
    assert get_or_none(host, "namespace", f"team-{name}") is None
    assert not host.get("teamspace", name)["metadata"].get("finalizers")


def test_an_unreadable_api_server_is_status_2_and_a_bad_argument_3(host, tmp_path, one_pass):
    kubeconfig = tmp_path / "unreachable"
    # Port 1 on loopback: nothing listens there, the connection is refused at once.
    kubeconfig.write_text(re.sub(r"server: https://127\.0\.0\.1:[0-9]+", "server: https://127.0.0.1:1",
                                 host.inst.kubeconfig.read_text()))
    c = ControllerProcess(host, tmp_path / "down", KUBECONFIG=str(kubeconfig),
                          CNPA_REQUEST_TIMEOUT="2s")
    down = one_pass(c)
    assert down.returncode == 2, down.stderr
    assert "nothing written" in down.stderr
    assert one_pass(c, "--twice").returncode == 3


def test_a_lasting_problem_counts_on_one_event_pass_after_pass(host, tmp_path):
    """Each pass is a new process that knows nothing of the last one: it reads the Event and
    counts on it, up to the burst; the passes after that write nothing for it (they only read
    it), and there is still one Event."""
    c = ControllerProcess(host, tmp_path / "lasting")
    empty_cluster(host, c)
    host.kubectl("create", "namespace", "team-once-lasting")
    host.kubectl("label", "namespace", "team-once-lasting", "owner=somebody-else")
    host.apply(teamspace("once-lasting", pods=2))
    began = time.monotonic()
    first = c.once()
    assert first.returncode == 1 and "not managed by cnpa-op" in first.stderr, first.stderr
    [created] = events(host, "once-lasting", "NamespaceNotOurs")
    assert created["count"] == 1
    # The next second: lastTimestamp has whole seconds.
    time.sleep(1.1)
    passes = EVENT_BURST + 3
    recorded = 0
    for _ in range(passes - 1):
        out = c.once()
        assert out.returncode == 1, out.stderr
        recorded += "event Warning NamespaceNotOurs recorded (seen" in out.stdout
    [last] = events(host, "once-lasting", "NamespaceNotOurs")
    bound = EVENT_BURST + int((time.monotonic() - began) / EVENT_REFILL_SECONDS) + 1
    assert created["count"] < last["count"] <= bound < passes, (last["count"], passes)
    assert last["count"] == recorded + 1  # every write said so; the held-back passes did not
    assert last["metadata"]["name"] == created["metadata"]["name"]
    assert last["firstTimestamp"] == created["firstTimestamp"] < last["lastTimestamp"]
    host.kubectl("delete", "namespace", "team-once-lasting", "--wait=false")
    host.kubectl("delete", "teamspace", "once-lasting", "--wait=false")
    for _ in range(5):
        if get_or_none(host, "teamspace", "once-lasting") is None:
            break
        c.once()
    assert get_or_none(host, "teamspace", "once-lasting") is None


def test_passes_until_finalized_then_released_say_what_the_uninstall_reads(host, tmp_path):
    """The uninstall's two waits, as one process each: every TeamSpace gets the finalizer, then,
    once they are deleted, every one is archived and released; one JSON line says what they
    are (a finalizer of somebody else's stays, and the line says so)."""
    c = ControllerProcess(host, tmp_path / "until")
    empty_cluster(host, c)
    names = ["until-a", "until-b", "until-held"]
    host.apply(teamspace("until-a", pods=1))
    host.apply(teamspace("until-b", pods=1))
    host.apply(teamspace("until-held", pods=1, finalizers=["example.com/hold"]))
    own = c.once("--once", "--until", "finalized", "--max-passes", "5")
    assert own.returncode == 0, own.stderr
    [line] = own.stdout.splitlines()
    out = json.loads(line)
    assert (out["left"], out["last_exit"]) == ([], 0) and 1 <= out["passes"] <= 5, out
    uids = {n: host.get("teamspace", n)["metadata"]["uid"] for n in names}
    assert out["teamspaces"] == [
        {"name": "until-a", "uid": uids["until-a"], "deleting": False, "finalizers": [FINALIZER]},
        {"name": "until-b", "uid": uids["until-b"], "deleting": False, "finalizers": [FINALIZER]},
        {"name": "until-held", "uid": uids["until-held"], "deleting": False,
         "finalizers": ["example.com/hold", FINALIZER]}]
    # The passes' write lines went to stderr: stdout is the one JSON line the roles read.
    assert "teamspace until-a: finalizer added" in own.stderr.splitlines()

    for n in names:
        host.kubectl("delete", "teamspace", n, "--wait=false")
    released = c.once("--once", "--until", "released", "--max-passes", "5")
    assert released.returncode == 0, released.stderr
    [line] = released.stdout.splitlines()
    out = json.loads(line)
    assert out["left"] == [] and out["last_exit"] == 0, out
    assert out["teamspaces"] == [{"name": "until-held", "uid": uids["until-held"], "deleting": True,
                                  "finalizers": ["example.com/hold"]}]
    for n in names:
        assert json.loads((c.archive / f"{n}.json").read_text())["uid"] == uids[n]
        assert f"teamspace {n}: finalizer released" in released.stderr.splitlines()
    host.kubectl("patch", "teamspace", "until-held", "--type=merge",
                 "-p", '{"metadata":{"finalizers":null}}')
