"""`python3 -m cnpa_controller --once --until released|finalized`: passes until the TeamSpaces
are what the uninstall and the lab reset wait for, then one JSON line saying what they are (the
roles run it as reconcile.sh --until, under the script's lock: tests/unit/test_reconcile.py).
Against a scripted list here; tests/controller/test_once.py runs it against a real API server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import fixtures
from cnpa_controller import ApiError
from cnpa_controller.config import PASS_SECONDS, Settings
from cnpa_controller.once import FINALIZED, PAUSE_SECONDS, RELEASED, run_until, waiting
from cnpa_controller.plan import FINALIZER

ROOT = Path(__file__).resolve().parents[2]


def ts(name, finalizers=None, deleting=False, uid=None):
    meta = {"uid": uid or f"uid-{name}", "resourceVersion": "1"}
    if finalizers is not None:
        meta["finalizers"] = finalizers
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return fixtures.teamspace(name, **meta)


def test_what_each_mode_waits_for():
    them = [ts("bare"), ts("ours", [FINALIZER]), ts("theirs", ["example.com/x"]),
            ts("both", ["example.com/x", FINALIZER]), ts("going", deleting=True, finalizers=["x"]),
            ts("going-ours", [FINALIZER], deleting=True)]
    # Finalized: every TeamSpace not being deleted carries ours (a deleting one cannot get it).
    assert waiting(them, FINALIZED) == ["bare", "theirs"]
    # Released: none carries ours, whether it is being deleted or not.
    assert waiting(them, RELEASED) == ["ours", "both", "going-ours"]


class Lists:
    """The API server as the driver sees it: each list of TeamSpaces answers with the next of
    `states` (the last one again once they run out), or raises what it holds."""

    def __init__(self, *states):
        self.states = list(states)
        self.lists = 0

    def request(self, method, path, **kw):
        assert (method, path) == ("GET", "/apis/platform.labhub.io/v1alpha1/teamspaces")
        state = self.states[min(self.lists, len(self.states) - 1)]
        self.lists += 1
        if isinstance(state, Exception):
            raise state
        return {"metadata": {"resourceVersion": "9"}, "items": state}


def drive(api, until, max_passes=5, exits=(0,), seconds_per_pass=0.0):
    now = [0.0]
    passes, slept = [], []

    def one_pass():
        passes.append(now[0])
        now[0] += seconds_per_pass
        return exits[min(len(passes), len(exits)) - 1]

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    out = run_until(api, Settings(archive_dir="/nonexistent"), until=until,
                    max_passes=max_passes, one_pass=one_pass, clock=lambda: now[0], sleep=sleep)
    return out, passes, slept


def test_passes_until_every_live_teamspace_is_finalized_then_says_what_they_are():
    api = Lists([ts("b"), ts("a")], [ts("b", [FINALIZER]), ts("a")],
                [ts("b", [FINALIZER]), ts("a", ["x", FINALIZER]), ts("c", ["x"], deleting=True)])
    out, passes, slept = drive(api, FINALIZED, exits=(0, 1, 0))
    assert out == {"passes": 3, "last_exit": 0, "left": [],
                   "teamspaces": [
                       {"name": "a", "uid": "uid-a", "deleting": False,
                        "finalizers": ["x", FINALIZER]},
                       {"name": "b", "uid": "uid-b", "deleting": False, "finalizers": [FINALIZER]},
                       {"name": "c", "uid": "uid-c", "deleting": True, "finalizers": ["x"]}]}
    assert len(passes) == 3 and slept == [PAUSE_SECONDS] * 2


def test_passes_until_released_stop_at_max_passes_naming_what_is_left():
    held = [ts("a", [FINALIZER], deleting=True), ts("b", ["example.com/x"], deleting=True)]
    out, passes, _ = drive(Lists(held), RELEASED, max_passes=4, exits=(1,))
    assert (out["passes"], out["last_exit"], out["left"]) == (4, 1, ["a"])
    assert [t["name"] for t in out["teamspaces"]] == ["a", "b"] and len(passes) == 4
    # Gone, or only another's finalizer left: released.
    out, _, _ = drive(Lists([ts("b", ["example.com/x"], deleting=True)]), RELEASED)
    assert out["passes"] == 1 and out["left"] == []
    assert out["teamspaces"][0]["finalizers"] == ["example.com/x"]


def test_no_pass_begins_after_max_passes_times_the_pass_deadline():
    """Passes that take long (a Lease to wait for, a slow server) end the run by time too."""
    out, passes, _ = drive(Lists([ts("a")]), FINALIZED, max_passes=3,
                           seconds_per_pass=PASS_SECONDS * 1.5)
    assert out["passes"] == 2 and out["left"] == ["a"]
    assert passes[-1] < 3 * PASS_SECONDS


def test_a_list_that_fails_after_a_pass_is_no_answer():
    out, passes, _ = drive(Lists([ts("a")], ApiError(0, "", "connection refused")), FINALIZED)
    assert out is None and len(passes) == 2


def _run(*args, **env):
    full = {k: v for k, v in os.environ.items() if not k.startswith(("CNPA_", "KUBECONFIG"))}
    return subprocess.run([sys.executable, "-m", "cnpa_controller", *args], cwd=ROOT,
                          env={**full, **env}, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("args", "said"), [
    (["--until", "released"], "--until needs --once"),
    (["--plan", "--until", "released"], "--until needs --once"),
    (["--once", "--max-passes", "3"], "--max-passes needs --until"),
    (["--once", "--until", "gone"], "invalid choice: 'gone'"),
    (["--once", "--until", "released", "--max-passes", "0"], "from 1 to 1000"),
])
def test_a_bad_until_is_usage_and_status_3(args, said):
    proc = _run(*args, KUBECONFIG="/nonexistent/kubeconfig")
    assert proc.returncode == 3 and said in proc.stderr, proc.stderr
    assert proc.stdout == ""


def test_an_unreachable_api_server_is_status_2_and_nothing_on_stdout(tmp_path):
    proc = _run("--once", "--until", "finalized", "--max-passes", "3",
                KUBECONFIG=str(fixtures.unreachable_kubeconfig(tmp_path)),
                CNPA_ARCHIVE_DIR=str(tmp_path / "archive"), CNPA_REQUEST_TIMEOUT="2s")
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and "cannot list the TeamSpaces after pass 1" in proc.stderr


def test_the_roles_name_the_finalizer_the_package_uses():
    """The roles' one copy of the finalizer's name (roles/cnpa/vars/main.yml): every role and
    playbook refers to it, the admission policies render it into their CEL expressions."""
    import yaml

    with open(ROOT / "roles/cnpa/vars/main.yml", encoding="utf-8") as fh:
        assert yaml.safe_load(fh)["cnpa_finalizer"] == FINALIZER
    package = ROOT / "roles/cnpa_reconciler/files/cnpa_controller"
    naming = sorted(str(f.relative_to(ROOT)) for d in ("roles", "playbooks")
                    for f in (ROOT / d).rglob("*") if f.is_file() and package not in f.parents
                    and f.suffix in (".yml", ".yaml", ".j2", ".sh")
                    and FINALIZER in f.read_text(encoding="utf-8"))
    assert naming == ["roles/cnpa/vars/main.yml"]
