"""Prometheus and promtool for the monitoring tests, from Debian's package but not installed.

Installing Debian's `prometheus` would start a Prometheus service on :9090 on a machine whose PID
1 is not systemd (its postinst runs `invoke-rc.d prometheus start` when /etc/init.d/prometheus
exists), create a system user, and pull a dozen JavaScript packages for a web UI no test uses.
The tests need only its two static binaries, so the package is downloaded (`apt-get download`)
and unpacked (`dpkg-deb -x`) into the cache, once per package version; nothing is installed.
"""

from __future__ import annotations

import fcntl
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .common import HostError, cache_dir, log, run

PACKAGE = "prometheus"
BINARIES = ("prometheus", "promtool")


def candidate_version() -> str:
    """The version apt would install, from the local package lists (updated once if empty)."""
    for attempt in range(2):
        proc = subprocess.run(["apt-cache", "show", "--no-all-versions", PACKAGE],
                              capture_output=True, text=True, check=False)
        found = re.search(r"^Version: (\S+)$", proc.stdout, re.MULTILINE)
        if found:
            return found.group(1)
        if attempt == 0:
            # A fresh machine (a CI container) may have no package lists yet.
            run(["apt-get", "update", "-qq"], step="apt-get update", quiet=True,
                env={"DEBIAN_FRONTEND": "noninteractive"})
    raise HostError(f"apt knows no package {PACKAGE!r}: is Debian's main archive in the sources?")


def binaries() -> Path:
    """The directory holding `prometheus` and `promtool` of Debian's package, unpacked on first
    use into ~/.cache/cnpa-op/prometheus-VERSION (concurrent callers wait for one another)."""
    if shutil.which("apt-get") is None:
        raise HostError("Prometheus for the tests comes from Debian's package: needs apt-get")
    version = candidate_version()
    where = cache_dir() / f"prometheus-{re.sub(r'[^A-Za-z0-9.+~-]', '_', version)}"

    def done() -> bool:
        return all((where / name).is_file() for name in BINARIES)

    if done():
        return where
    with open(cache_dir() / "prometheus.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done():
            return where
        log(f"unpacking Debian's {PACKAGE} {version} into {where} (not installing it)")
        with tempfile.TemporaryDirectory(dir=cache_dir(), prefix=".prometheus-") as tmp:
            # As root, apt's download sandbox user (_apt) cannot write in root's cache.
            run(["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root",
                 f"{PACKAGE}={version}"], cwd=Path(tmp), step=f"apt-get download {PACKAGE}",
                quiet=True)
            [deb] = Path(tmp).glob("*.deb")
            run(["dpkg-deb", "-x", str(deb), str(Path(tmp) / "root")],
                step=f"dpkg-deb -x {deb.name}", quiet=True)
            staged = Path(tmp) / "bin"
            staged.mkdir()
            for name in BINARIES:
                (Path(tmp) / "root/usr/bin" / name).rename(staged / name)
            staged.rename(where)
    return where
