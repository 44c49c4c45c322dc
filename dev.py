#!/usr/bin/env python3
"""The project's two entry points, with set-up included.

    python3 dev.py test            lint + unit tests + real-host tests + `molecule test`
    python3 dev.py lab             the whole lab against a local throwaway test host
    python3 dev.py lab --destroy   remove that host again
    python3 dev.py setup           only the set-up the others do first
    python3 dev.py lint            only the linters

Set-up: a virtualenv in .venv with requirements-dev.txt (ansible bundles kubernetes.core, so
no Ansible Galaxy is needed), and the Debian packages the tests use. It is re-done only when
the requirements change. Needs root for the test host (debootstrap, systemd-nspawn).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / "bin"
# shellcheck for the linters; the test host's own needs (debootstrap, systemd-nspawn, Go, ...)
# are installed by testhost itself when it builds.
DEBIAN_PACKAGES = ["shellcheck", "openssh-client", "debootstrap", "systemd-container"]
LAB_HOST = "lab"


def say(msg: str) -> None:
    print(f"==> {msg}", flush=True)


def sh(cmd: list[str], **kw) -> int:
    env = dict(os.environ, PATH=f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
               **kw.pop("env", {}))
    return subprocess.run(cmd, cwd=kw.pop("cwd", ROOT), env=env, check=False, **kw).returncode


def setup() -> None:
    missing = [p for p in DEBIAN_PACKAGES if subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", p], capture_output=True, text=True,
        check=False).stdout != "install ok installed"]
    if missing:
        say(f"installing Debian packages: {' '.join(missing)}")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for cmd in (["apt-get", "update", "-qq"],
                    ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing]):
            if subprocess.run(cmd, env=env, check=False).returncode != 0:
                sys.exit(f"dev.py: `{' '.join(cmd)}` failed (root and Debian's registry needed)")
    reqs = b"".join((ROOT / f).read_bytes() for f in ("requirements.txt", "requirements-dev.txt"))
    stamp = VENV / ".requirements.sha256"
    digest = hashlib.sha256(reqs + sys.version.encode()).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return
    if not (BIN / "python").exists():
        say(f"creating virtualenv {VENV}")
        venv.create(VENV, with_pip=True)
    say("installing Python requirements (requirements-dev.txt)")
    for cmd in ([str(BIN / "python"), "-m", "pip", "install", "-q", "--upgrade", "pip"],
                [str(BIN / "python"), "-m", "pip", "install", "-q", "-r",
                 str(ROOT / "requirements-dev.txt")]):
        if sh(cmd) != 0:
            sys.exit("dev.py: pip install failed; see the output above")
    stamp.write_text(digest)


def lint() -> int:
    return sh([str(BIN / "pytest"), "-q", "tests/lint"])


def test(extra: list[str]) -> int:
    # One pytest run, so its closing line counts everything: unit tests, linters, the real
    # host's properties, and `molecule test` (the lab end to end, verified against the cluster).
    return sh([str(BIN / "pytest"), "-v", "-rfE", "--durations=10",
               "tests/unit", "tests/lint", "tests/host", "tests/molecule", *extra])


def lab(destroy: bool, extra: list[str]) -> int:
    py = str(BIN / "python")
    if destroy:
        return sh([py, "-m", "testhost", "destroy", LAB_HOST])
    info = subprocess.run([py, "-m", "testhost", "info", LAB_HOST], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    if info.returncode != 0 or not json.loads(info.stdout)["running"]:
        if info.returncode == 0:
            sh([py, "-m", "testhost", "destroy", LAB_HOST])
        say(f"creating local test host {LAB_HOST!r} (first time: builds the control plane, ~6-15 min)")
        if sh([py, "-m", "testhost", "create", LAB_HOST], stdout=subprocess.DEVNULL) != 0:
            return 1
    inventory = json.loads(subprocess.run([py, "-m", "testhost", "info", LAB_HOST], cwd=ROOT,
                                          capture_output=True, text=True,
                                          check=True).stdout)["inventory"]
    say(f"running site.yml against {LAB_HOST} ({inventory})")
    rc = sh([str(BIN / "ansible-playbook"), "-i", inventory, "site.yml", *extra])
    if rc == 0:
        say(f"the host stays up: `python3 -m testhost exec {LAB_HOST} -- cat /root/cnpa-op/report.json`;"
            f" remove it with `python3 dev.py lab --destroy`")
    return rc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["setup", "lint", "test", "lab"])
    parser.add_argument("--destroy", action="store_true", help="with lab: remove the host")
    args, extra = parser.parse_known_args()
    if os.geteuid() != 0 and args.command in ("test", "lab"):
        sys.exit("dev.py: the test host needs root (debootstrap, systemd-nspawn, nsenter)")
    if shutil.which("apt-get") is None:
        sys.exit("dev.py: needs a Debian-family machine (apt-get)")
    setup()
    if args.command == "lint":
        return lint()
    if args.command == "test":
        return test(extra)
    if args.command == "lab":
        return lab(args.destroy, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
