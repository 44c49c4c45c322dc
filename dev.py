#!/usr/bin/env python3
"""The project's two entry points, with set-up included.

    python3 dev.py test            lint + unit tests + real-host tests + `molecule test`
    python3 dev.py test --long     the same with the long forms of the soak and chaos tests
    python3 dev.py lab             the whole lab: on the k3s VM itself when this machine has
                                   /etc/rancher/k3s/k3s.yaml, else against a local throwaway
                                   test host (CNPA_LAB_TESTHOST=1 forces the test host)
    python3 dev.py lab --reset     on the k3s VM: consent to reset the lab's own objects of an
                                   earlier run without being asked (see lab_reset_args)
    python3 dev.py lab --destroy   remove that test host again
    python3 dev.py setup           only the set-up the others do first
    python3 dev.py lint            only the linters
    python3 dev.py docs            rewrite docs/lab.md's variable table from the roles'
                                   meta/argument_specs.yml (variable_docs.py; --check: only compare)

Arguments after `--` go on unchanged: to pytest with test (`python3 dev.py test -- -k name`), to
ansible-playbook with lab (`python3 dev.py lab -- -v`). Any other argument dev.py does not know,
or an option given to a command it does not belong to (`lab --check`), is refused with the usage
and exit 2, before anything is set up or run.

Set-up: a virtualenv in .venv with requirements.lock (lab) or requirements-dev.lock (tests and
linters), every package pinned with hashes; the `ansible` package bundles kubernetes.core, so no
Ansible Galaxy is needed. The checkout itself is importable there (link_checkout). Plus
the Debian packages the command uses (the test host installs its own: testhost/). It is re-done
only when the requirements change. Needs root (the lab writes /root/cnpa-op; the test host needs
debootstrap, systemd-nspawn). What each command leaves on the machine: README.md, "What the two
commands leave on this machine"; how long each takes: docs/figures.md.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

# The script's directory is on sys.path: the test host's helpers (standard library only).
from testhost import progress
from testhost.common import HostError
from testhost.common import apt_install as testhost_apt_install

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / "bin"
# Only what the tests themselves call. The test host installs what it needs (debootstrap,
# systemd-container, openssh-client) itself when it is created (testhost.common.apt_install).
# strace: tests/faults/test_trust.py checks that an archive record is flushed before its finalizer goes.
# Not prometheus: installing it would start a Prometheus service on a machine without systemd;
# the monitoring tests unpack its binaries into the cache instead (testhost/prometheus.py).
TEST_PACKAGES = ["shellcheck", "strace"]
K3S_KUBECONFIG = Path("/etc/rancher/k3s/k3s.yaml")
# CNPA_LAB_TESTHOST_NAME: another name for the lab's test host (e.g. beside one already running).
LAB_HOST = os.environ.get("CNPA_LAB_TESTHOST_NAME") or "lab"
RESET_QUESTION = ("this removes TeamSpaces alpha/beta, their namespaces and the lab's evidence; "
                  "continue? [y/N] ")


def say(msg: str) -> None:
    print(f"==> {msg}", flush=True)


def sh(cmd: list[str], **kw) -> int:
    env = dict(os.environ, PATH=f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
               **kw.pop("env", {}))
    return subprocess.run(cmd, cwd=kw.pop("cwd", ROOT), env=env, check=False, **kw).returncode


def apt_install(packages: list[str]) -> None:
    """The test host's apt_install (one implementation), failing the way dev.py fails."""
    try:
        testhost_apt_install(packages)
    except HostError as exc:
        sys.exit(f"dev.py: {exc}\n(installing Debian packages needs root and Debian's package "
                 "registry: docs/troubleshooting.md)")


# What is installed: the lock files (every package pinned, with hashes) compiled from the
# requirements*.txt beside them (README, "Updating the lock files"). requirements-dev.lock holds
# every pin of requirements.lock (tests/unit/test_locks.py), so a dev venv also serves the lab.
REQUIREMENTS = {"requirements.lock": ["requirements.lock"],
                "requirements-dev.lock": ["requirements.lock", "requirements-dev.lock"]}


def _digest(files: list[str]) -> str:
    data = b"".join((ROOT / f).read_bytes() for f in files) + sys.version.encode()
    return hashlib.sha256(data).hexdigest()


# The controller package, as the role installs it (one directory holding cnpa_controller/), and
# this checkout's own modules (testhost, fixtures, bench): what the tests and the benchmark import.
IMPORTED = [ROOT / "roles/cnpa_reconciler/files", ROOT]


def link_checkout(venv: Path = VENV) -> Path:
    """Make this checkout importable in the virtualenv, as an editable install would: a .pth file
    in its site-packages naming IMPORTED. (pip refuses an editable install together with
    --require-hashes, and one without it would build the project with an unpinned setuptools.)"""
    site = venv / f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
    pth = site / "cnpa-op.pth"
    text = "".join(f"{path}\n" for path in IMPORTED)
    if not pth.exists() or pth.read_text() != text:
        pth.write_text(text)
    return pth


def setup(requirements: str = "requirements-dev.lock", packages: list[str] = TEST_PACKAGES) -> None:
    apt_install(packages)
    stamp = VENV / ".requirements.sha256"
    installed = stamp.read_text().split() if stamp.exists() else []
    if _digest(REQUIREMENTS[requirements]) in installed:
        link_checkout()
        return
    if not (BIN / "python").exists():
        say(f"creating virtualenv {VENV}")
        try:
            venv.create(VENV, with_pip=True)
        except (subprocess.CalledProcessError, SystemExit):
            # Debian's own python3 keeps ensurepip in a separate package (its venv exits).
            shutil.rmtree(VENV)
            apt_install([f"python{sys.version_info.major}.{sys.version_info.minor}-venv"])
            venv.create(VENV, with_pip=True)
    say(f"installing Python requirements ({requirements}; under 2 min the first time)")
    # pip -q says nothing while it downloads and installs: a line every 30 s says it is alive.
    proc = subprocess.Popen([str(BIN / "python"), "-m", "pip", "install", "-q", "--require-hashes",
                             "--no-deps", "-r", str(ROOT / requirements)], cwd=ROOT)
    progress.wait(proc, step="pip install", say=say)
    if proc.returncode != 0:
        sys.exit("dev.py: pip install failed; see the output above")
    link_checkout()
    covered = [name for name, files in REQUIREMENTS.items()
               if set(files) <= set(REQUIREMENTS[requirements])]
    stamp.write_text("\n".join(_digest(REQUIREMENTS[name]) for name in covered) + "\n")


def lint() -> int:
    return sh([str(BIN / "pytest"), "-q", "tests/lint"])


# `python3 dev.py test --long`: the same tests in their long forms (docs/faults.md): each variable
# stretches one test that runs on every commit in a short form.
LONG_FORMS = {
    "CNPA_SOAK_SECONDS": "1800",   # tests/multihost/test_watch_faults.py::test_soak, 30 min
    "CNPA_CHAOS_N": "5000",        # tests/multihost/test_watch_chaos.py at N = 5,000
}
# pytest-xdist workers: the host tests mostly wait on their hosts (Ansible runs, API server
# restarts, timed faults), so more workers than cores still shorten the run (docs/figures.md).
WORKERS = os.environ.get("CNPA_TEST_WORKERS") or "3"
LOGS = ROOT / ".cache" / "test-logs"


@contextlib.contextmanager
def prepared_in_background():
    """The test hosts' cache filled in the background (testhost/prepare.py) while the block runs.
    testhost needs only the standard library, so it starts before the virtualenv exists: on a
    fresh machine its downloads and compiles run beside pip's install, the unit tests beside all
    of them. It ends with the block: a run that got as far as a test host needs it no longer, and
    a failure of it shows in the tests that needed the piece (they make it themselves and say why
    it failed)."""
    LOGS.mkdir(parents=True, exist_ok=True)
    with open(LOGS / "prepare.log", "w") as log:
        prepare = subprocess.Popen([sys.executable, "-m", "testhost", "prepare"], cwd=ROOT,
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield
    finally:
        if prepare.poll() is None:
            prepare.terminate()
            prepare.wait(60)
        if prepare.returncode:
            say(f"preparing the test hosts' cache failed (exit {prepare.returncode}): "
                f"{LOGS / 'prepare.log'}")


def test(extra: list[str], long: bool = False) -> int:
    # One pytest run, so its closing line counts everything: unit tests, linters, the real
    # host's properties, and `molecule test` (the lab end to end, verified against the cluster).
    # The tests sharing a host stay together in one worker (tests/conftest.py).
    LOGS.mkdir(parents=True, exist_ok=True)
    env = dict(LONG_FORMS) if long else {}
    (LOGS / "timeline.tsv").unlink(missing_ok=True)
    env["CNPA_TEST_TIMELINE"] = str(LOGS / "timeline.tsv")  # tests/conftest.py: each test's times
    if long:
        say("long forms: " + ", ".join(f"{k}={v}" for k, v in LONG_FORMS.items()))
    return sh([str(BIN / "pytest"), "-v", "-rfE", "--durations=10",
               "-n", WORKERS, "--dist", "loadscope", "--no-loadscope-reorder",
               "tests/unit", "tests/lint", "tests/host", "tests/controller", "tests/faults",
               "tests/multihost", "tests/molecule", "tests/collection", *extra], env=env)


def lab_reset_args(*, own_testhost: bool, reset: bool, interactive: bool,
                   ask=input) -> list[str] | None:
    """The consent the lab's playbooks need to reset the lab's objects of an earlier run
    (cnpa_lab_reset), or None when the user said no.

    On dev.py's own throwaway test host nothing but the lab lives there: always given. On a real
    k3s VM: given with --reset, else asked on a terminal; without a terminal (CI, a pipe) not
    given, and the playbooks stop before touching anything if there is something to reset."""
    if own_testhost or reset:
        return ["-e", "cnpa_lab_reset=true"]
    if not interactive:
        return []
    say("site.yml first resets what an earlier lab run left on this cluster, if anything")
    try:
        answer = ask(RESET_QUESTION)
    except EOFError:
        answer = ""
    return ["-e", "cnpa_lab_reset=true"] if answer.strip().lower() in ("y", "yes") else None


def lab(destroy: bool, reset: bool, extra: list[str]) -> int:
    py = str(BIN / "python")
    if destroy:
        return sh([py, "-m", "testhost", "destroy", LAB_HOST])
    if K3S_KUBECONFIG.exists() and os.environ.get("CNPA_LAB_TESTHOST") != "1":
        consent = lab_reset_args(own_testhost=False, reset=reset,
                                 interactive=sys.stdin.isatty() and sys.stdout.isatty())
        if consent is None:
            say("nothing changed (python3 dev.py lab --reset, or answer y, to go ahead)")
            return 1
        say(f"{K3S_KUBECONFIG} found: running site.yml on this machine (inventory.ini: localhost)")
        return sh([str(BIN / "ansible-playbook"), "site.yml", *consent, *extra])
    info = subprocess.run([py, "-m", "testhost", "info", LAB_HOST], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    if info.returncode != 0 or not json.loads(info.stdout)["running"]:
        if info.returncode == 0:
            sh([py, "-m", "testhost", "destroy", LAB_HOST])
        say(f"creating local test host {LAB_HOST!r} (the first time it builds the control plane "
            "and kine from Go modules and a Debian rootfs, which takes minutes, with a progress "
            "line every 30 s; with the cache seconds; figures: docs/figures.md)")
        if sh([py, "-m", "testhost", "create", LAB_HOST], stdout=subprocess.DEVNULL) != 0:
            return 1
    inventory = json.loads(subprocess.run([py, "-m", "testhost", "info", LAB_HOST], cwd=ROOT,
                                          capture_output=True, text=True,
                                          check=True).stdout)["inventory"]
    say(f"running site.yml against {LAB_HOST} ({inventory})")
    rc = sh([str(BIN / "ansible-playbook"), "-i", inventory, "site.yml",
             *lab_reset_args(own_testhost=True, reset=reset, interactive=False), *extra])
    if rc == 0:
        say(f"the host stays up: `python3 -m testhost exec {LAB_HOST} -- cat /root/cnpa-op/report.json`;"
            f" remove it with `python3 dev.py lab --destroy`")
    return rc


# Which command each option belongs to; given with another command it is refused.
OPTION_COMMANDS = {"destroy": "lab", "reset": "lab", "check": "docs", "long": "test"}
# The commands that pass arguments after `--` on (to pytest, to ansible-playbook).
EXTRA_COMMANDS = ("test", "lab")


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The command and its options, and the arguments after the first `--` (passed on as they
    are). Anything else is refused with the usage and exit 2 (argparse's error), before any
    set-up or action."""
    parser = argparse.ArgumentParser(prog="dev.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     usage="python3 dev.py {setup,lint,test,lab,docs} [options] "
                                           "[-- ARGS for pytest or ansible-playbook]")
    parser.add_argument("command", choices=["setup", "lint", "test", "lab", "docs"])
    parser.add_argument("--destroy", action="store_true", help="with lab: remove the host")
    parser.add_argument("--reset", action="store_true",
                        help="with lab on a k3s VM: reset the lab's objects of an earlier run "
                             "without asking")
    parser.add_argument("--check", action="store_true",
                        help="with docs: only say whether docs/lab.md is up to date")
    parser.add_argument("--long", action="store_true",
                        help="with test: the long forms of the soak and chaos tests (LONG_FORMS)")
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv)
    for option, command in OPTION_COMMANDS.items():
        if getattr(args, option) and args.command != command:
            parser.error(f"--{option} belongs to `{command}`, not to `{args.command}`")
    if extra and args.command not in EXTRA_COMMANDS:
        parser.error(f"`{args.command}` passes nothing on: arguments after -- are for "
                     f"{' and '.join(EXTRA_COMMANDS)}")
    return args, extra


def main(argv: list[str] | None = None) -> int:
    args, extra = parse(sys.argv[1:] if argv is None else argv)
    if os.geteuid() != 0 and args.command in ("test", "lab"):
        sys.exit("dev.py: the test host needs root (debootstrap, systemd-nspawn, nsenter)")
    if shutil.which("apt-get") is None:
        sys.exit("dev.py: needs a Debian-family machine (apt-get)")
    if args.command == "test":
        with prepared_in_background():
            setup()
            return test(extra, long=args.long)
    if args.command in ("lab", "docs"):
        setup("requirements.lock", [])
    else:
        setup()
    if args.command == "lint":
        return lint()
    if args.command == "lab":
        return lab(args.destroy, args.reset, extra)
    if args.command == "docs":
        return sh([str(BIN / "python"), "variable_docs.py", "--check" if args.check else "--write"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
