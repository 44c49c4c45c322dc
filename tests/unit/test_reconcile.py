"""reconcile.sh's own part: the lock, the deadline, its usage, and which code it runs.

The pass itself is `python3 -m cnpa_controller --once` (tests/unit/test_ctl_executor.py for its
writes, tests/controller/test_once.py for whole passes through this script against a real API
server). Here the script runs as the role installs it: beside the package.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixtures import unreachable_kubeconfig

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not (shutil.which("flock") and shutil.which("timeout")),
                                reason="reconcile.sh needs flock and timeout")


@pytest.fixture
def installed(tmp_path):
    """reconcile.sh and cnpa_controller/*.py beside it, as installed."""
    d = tmp_path / "cnpa-op"
    (d / "cnpa_controller").mkdir(parents=True)
    shutil.copy(ROOT / "reconcile.sh", d)
    for f in (ROOT / "cnpa_controller").glob("*.py"):
        shutil.copy(f, d / "cnpa_controller")
    return d


def run(installed: Path, tmp_path: Path, *args: str, cwd: Path | None = None, **env: str):
    full = {"PATH": os.environ["PATH"], "KUBECONFIG": str(unreachable_kubeconfig(tmp_path)),
            "CNPA_PYTHON": sys.executable, "CNPA_BASE_DIR": str(tmp_path / "base"),
            "CNPA_LOCK_FILE": str(tmp_path / "pass.lock"), "CNPA_REQUEST_TIMEOUT": "2s", **env}
    return subprocess.run([str(installed / "reconcile.sh"), *args], env=full, cwd=cwd or tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)


def test_an_unreadable_api_server_is_status_2_and_nothing_written(installed, tmp_path):
    res = run(installed, tmp_path)
    assert res.returncode == 2, res.stderr
    assert "nothing written" in res.stderr and res.stdout == ""
    assert run(installed, tmp_path, "--plan").returncode == 2


USAGE = "usage: reconcile.sh [--plan | --until released|finalized [--max-passes N]]"


@pytest.mark.parametrize("args, env, named", [
    (["--twice"], {}, USAGE),
    (["--plan", "x"], {}, USAGE),
    (["--until"], {}, USAGE),
    (["--until", "gone"], {}, USAGE),
    (["--until", "released", "--until", "finalized"], {}, USAGE),
    (["--max-passes", "3"], {}, USAGE),
    (["--until", "released", "--max-passes", "0"], {}, USAGE),
    (["--until", "released", "--max-passes", "1001"], {}, USAGE),
    (["--until", "released", "--max-passes"], {}, USAGE),
    (["--plan", "--until", "released"], {}, USAGE),
    (["--once"], {}, USAGE),
    (["--until", "released"], {"CNPA_PASS_DEADLINE": "x"}, "CNPA_PASS_DEADLINE"),
    ([], {"CNPA_PASS_DEADLINE": "0"}, "CNPA_PASS_DEADLINE"),
    ([], {"CNPA_WORKERS": "0"}, "CNPA_WORKERS"),
    ([], {"CNPA_ARCHIVE_DIR": "relative"}, "CNPA_ARCHIVE_DIR"),
    ([], {"KUBECONFIG": "/nonexistent/kubeconfig"}, "/nonexistent/kubeconfig"),
])
def test_bad_usage_and_settings_are_status_3_and_named(installed, tmp_path, args, env, named):
    res = run(installed, tmp_path, *args, **env)
    assert res.returncode == 3, res.stderr
    assert named in res.stderr


def test_a_missing_package_is_status_3_not_a_teamspace_failure(installed, tmp_path):
    shutil.rmtree(installed / "cnpa_controller")
    # A target's python3, which has no cnpa_controller of its own: this one without its
    # site-packages, where the virtualenv makes the checkout's importable.
    python = tmp_path / "python3"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    python.chmod(0o755)
    res = run(installed, tmp_path, CNPA_PYTHON=str(python))
    assert res.returncode == 3 and "cannot load cnpa_controller" in res.stderr, res.stderr


def test_only_the_installed_package_is_imported(installed, tmp_path):
    """A pass runs as root, often from a directory others can write (/tmp): a cnpa_controller
    there, or in PYTHONPATH, must not be what runs."""
    planted = tmp_path / "planted"
    evil = planted / "cnpa_controller"
    evil.mkdir(parents=True)
    marker = tmp_path / "planted-code-ran"
    (evil / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (evil / "__main__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    res = run(installed, tmp_path, cwd=planted, PYTHONPATH=str(planted))
    assert res.returncode == 2, res.stderr
    assert not marker.exists()


def test_passes_take_turns_and_a_pass_has_a_deadline(installed, tmp_path):
    lock = str(tmp_path / "pass.lock")
    holder = subprocess.Popen(["flock", lock, "sleep", "30"], start_new_session=True)
    try:
        for _ in range(100):  # until the holder has the lock (bounded: 10 s)
            if subprocess.run(["flock", "-n", lock, "true"], check=False).returncode:
                break
            time.sleep(0.1)
        res = run(installed, tmp_path, CNPA_PASS_DEADLINE="4")
        assert res.returncode == 75 and "another pass has held" in res.stderr
        # A plan writes nothing and takes no turn: it runs (and finds the API unreadable).
        assert run(installed, tmp_path, "--plan", CNPA_PASS_DEADLINE="4").returncode == 2
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    # A pass that hangs (here the interpreter itself) is stopped at its deadline.
    slow = tmp_path / "slow-python"
    slow.write_text("#!/bin/sh\nexec sleep 30\n")
    slow.chmod(0o755)
    t0 = time.monotonic()
    res = run(installed, tmp_path, CNPA_PASS_DEADLINE="2", CNPA_PYTHON=str(slow))
    assert res.returncode == 124 and "deadline of 2 s" in res.stderr
    assert time.monotonic() - t0 < 20


FAKE_MAIN = """
import fcntl, json, os, sys

def main(argv):
    # What reconcile.sh handed over, and whether its lock was held meanwhile.
    with open(os.environ["CNPA_LOCK_FILE"], "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = False
        except BlockingIOError:
            held = True
    print(json.dumps({"argv": list(argv), "lock_held": held}))
    return 0
"""


@pytest.mark.parametrize("args, argv, deadline, env", [
    ([], ["--once"], "60", {}),
    (["--plan"], ["--plan"], "60", {}),
    (["--until", "released", "--max-passes", "3"],
     ["--once", "--until", "released", "--max-passes", "3"], "300", {}),
    (["--max-passes", "7", "--until", "finalized"],
     ["--once", "--until", "finalized", "--max-passes", "7"], "430", {"CNPA_PASS_DEADLINE": "5"}),
    (["--until", "finalized"], ["--once", "--until", "finalized", "--max-passes", "20"], "1320", {}),
])
def test_until_hands_the_passes_to_the_package_under_one_lock_and_a_deadline_for_them(
        installed, tmp_path, args, argv, deadline, env):
    """--until [--max-passes N] is the package's --once --until, the lock held for the whole run
    (a plan takes none) and the deadline N x 60 s (the package's bound) + 2 x the pass's."""
    (installed / "cnpa_controller" / "__main__.py").write_text(FAKE_MAIN)
    # timeout(1) as reconcile.sh calls it, its arguments written down.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    seen = tmp_path / "timeout-args"
    (bin_dir / "timeout").write_text(
        f"#!/bin/sh\necho \"$2\" > {seen}\nexec {shutil.which('timeout')} \"$@\"\n")
    (bin_dir / "timeout").chmod(0o755)
    res = run(installed, tmp_path, *args, PATH=f"{bin_dir}:{os.environ['PATH']}", **env)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out == {"argv": argv, "lock_held": argv != ["--plan"]}
    assert seen.read_text().split() == [deadline]


def test_the_deadline_of_until_follows_the_package_bounds():
    """reconcile.sh computes the deadline of --until from the package's bound (no pass begun
    after --max-passes x PASS_SECONDS) and gives the package's default --max-passes itself."""
    from cnpa_controller.__main__ import MAX_PASSES
    from cnpa_controller.config import PASS_SECONDS

    text = (ROOT / "reconcile.sh").read_text()
    assert f"RUN_DEADLINE=$((MAX_PASSES * {PASS_SECONDS} + 2 * DEADLINE))" in text
    assert f"MAX_PASSES=${{MAX_PASSES:-{MAX_PASSES}}}" in text
