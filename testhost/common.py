"""Shared helpers: cache location, logging, running commands with clear failures."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from .progress import EVERY as PROGRESS_SECONDS
from .progress import wait as progress_wait

_T0 = time.monotonic()


class HostError(RuntimeError):
    """A step failed; the message names the step and what to do about it."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    path = Path(base) / "cnpa-op"
    path.mkdir(parents=True, exist_ok=True)
    return path


def log(msg: str) -> None:
    print(f"[testhost {time.monotonic() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], *, step: str, cwd: Path | None = None, env: dict | None = None,
        quiet: bool = False, logfile: Path | None = None, timeout: float | None = None,
        progress: Callable[[], str] | None = None) -> str:
    """Run cmd; on failure raise HostError naming the step (and the log file if any).

    Output goes to logfile when given, else it is captured (and returned). Either way, while cmd
    runs a line with the step, the elapsed time and what progress() says is logged every
    PROGRESS_SECONDS (testhost.progress), so no long step is silent."""
    full_env = dict(os.environ, **(env or {}))
    with contextlib.ExitStack() as stack:
        fh = stack.enter_context(open(logfile, "ab")) if logfile is not None else None
        proc = subprocess.Popen(cmd, cwd=cwd, env=full_env, stdin=subprocess.DEVNULL,
                                stdout=fh or subprocess.PIPE,
                                stderr=subprocess.STDOUT if fh else subprocess.PIPE,
                                text=fh is None)
        try:
            stdout, stderr = progress_wait(proc, step=step, say=log, detail=progress,
                                           every=PROGRESS_SECONDS, timeout=timeout)
        except subprocess.TimeoutExpired:
            where = f"; its log: {logfile}" if logfile else ""
            raise HostError(f"{step} did not finish within {timeout / 60:.0f} min{where}") from None
    if logfile is not None:
        if proc.returncode != 0:
            tail = Path(logfile).read_text(errors="replace").splitlines()[-25:]
            raise HostError(f"{step} failed (exit {proc.returncode}); last lines of {logfile}:\n"
                            + "\n".join(tail))
        return ""
    if proc.returncode != 0:
        raise HostError(f"{step} failed (exit {proc.returncode}): {' '.join(cmd)}\n"
                        f"{stderr.strip() or stdout.strip()}")
    if not quiet and stdout.strip():
        log(stdout.strip().splitlines()[-1])
    return stdout


def require_root() -> None:
    if os.geteuid() != 0:
        raise HostError("the test host needs root (debootstrap, systemd-nspawn, nsenter)")


_apt_updated = False


APT_TIMEOUT = 20 * 60


def apt_install(packages: list[str]) -> None:
    """Install Debian packages that are missing (dpkg-query decides), updating lists once.

    One apt at a time: on a fresh machine `testhost prepare` builds kine (gcc) and both rootfs
    (debootstrap) at once, and test workers create hosts side by side, while apt-get takes its
    lock without waiting. So the callers queue on a lock of ours and look again once they hold it.
    """
    global _apt_updated
    if not _missing(packages):
        return
    # Machine-wide, as apt's own lock is (runs with other caches share it).
    lock_dir = Path("/run/lock") if os.access("/run/lock", os.W_OK) else cache_dir()
    with open(lock_dir / "cnpa-testhost-apt.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the holder's apt-get runs are bounded below
        missing = _missing(packages)
        if not missing:
            return
        log(f"installing Debian packages: {' '.join(missing)}")
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        if not _apt_updated:
            run(["apt-get", "update", "-qq"], step="apt-get update", env=env, quiet=True,
                timeout=APT_TIMEOUT)
            _apt_updated = True
        run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
            step=f"apt-get install {' '.join(missing)}", env=env, quiet=True, timeout=APT_TIMEOUT)


def _missing(packages: list[str]) -> list[str]:
    missing = []
    for pkg in packages:
        probe = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg],
                               capture_output=True, text=True, check=False)
        if "install ok installed" not in probe.stdout:
            missing.append(pkg)
    return missing


def which_or_fail(tool: str, package: str) -> str:
    path = shutil.which(tool)
    if not path:
        raise HostError(f"{tool} not found; install Debian package {package}")
    return path
