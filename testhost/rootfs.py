"""A cached Debian rootfs for the test host: systemd, sshd, jq, python3.

trixie by default; bookworm (Debian 12) on request (`create NAME --suite bookworm`), to prove
the lab against the older release a real lab VM may run (its python3-kubernetes is too old for
kubernetes.core, its jq is 1.6). Each suite has its own tarballs; trixie's cache key is the one
it had before suites existed.

kubectl, etcd and kine are not Debian's: each instance gets the ones built with its control plane
(build.py), so kubectl inside the host is the server's version, as k3s bundles its own. The tree is
debootstrapped once, given the host's unit files (see files/), and stored as a tarball keyed by
a hash of everything that went into it, so editing files/ or the package list rebuilds it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import time
from pathlib import Path

from .build import _wait_for_lock
from .common import HostError, apt_install, cache_dir, log, run

SUITE = "trixie"  # the default
SUITES = ("trixie", "bookworm")
MIRROR = "http://deb.debian.org/debian"
PACKAGES = [
    "systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "jq", "openssl",
    "ca-certificates", "iproute2", "procps", "curl", "less",
]
FILES = Path(__file__).with_name("files")
STALE_SECONDS = 24 * 3600


def _check(suite: str) -> str:
    if suite not in SUITES:
        raise HostError(f"unknown suite {suite!r}: choose one of {', '.join(SUITES)}")
    return suite


def _key(suite: str = SUITE) -> str:
    digest = hashlib.sha256(f"{suite} {MIRROR} {' '.join(PACKAGES)}".encode())
    for path in sorted(FILES.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(FILES)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def tarball(suite: str = SUITE) -> Path:
    return cache_dir() / f"rootfs-{_check(suite)}-{_key(suite)}.tar"


def _partial(name: str, suite: str) -> Path:
    """A work path of one suite's build (trixie keeps the names it had)."""
    return cache_dir() / (name if suite == SUITE else f"{suite}-{name}")


def _debootstrap_cached(suite: str) -> Path:
    """The plain debootstrap tree, cached separately so editing files/ does not re-download."""
    digest = hashlib.sha256(f"{suite} {MIRROR} {' '.join(PACKAGES)}".encode()).hexdigest()[:12]
    base = cache_dir() / f"debootstrap-{suite}-{digest}.tar"
    if base.exists():
        return base
    apt_install(["debootstrap"])
    tree = _partial("debootstrap.partial", suite)
    shutil.rmtree(tree, ignore_errors=True)
    logfile = _partial("debootstrap.log", suite)
    logfile.unlink(missing_ok=True)
    log(f"debootstrap {suite} (about 90 s and 300 MB; log: {logfile})")
    run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", suite,
         str(tree), MIRROR], step=f"debootstrap {suite}", logfile=logfile)
    shutil.rmtree(tree / "var/cache/apt/archives", ignore_errors=True)
    (tree / "var/cache/apt/archives/partial").mkdir(parents=True)
    _pack(tree, base)
    shutil.rmtree(tree)
    return base


def _pack(tree: Path, dest: Path) -> None:
    tmp = dest.with_suffix(".partial")
    run(["tar", "--numeric-owner", "--xattrs", "-C", str(tree), "-cf", str(tmp), "."],
        step=f"pack {dest.name}", quiet=True)
    tmp.rename(dest)


def _customise(tree: Path) -> None:
    """Install the host's own files and settings that are the same for every instance."""
    for src in sorted(FILES.rglob("*")):
        rel = src.relative_to(FILES)
        dest = tree / rel
        if src.is_dir():
            dest.mkdir(parents=True, exist_ok=True)
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest)
        if rel.parts[:2] == ("usr", "local") or src.suffix == ".sh":
            dest.chmod(0o755)
    # The AnsiballZ bytecode cache (files/usr/lib/python3/dist-packages/cnpa_testhost_pyc.py)
    # trusts only a directory of root's that no one else may write.
    pyc = tree / "var/cache/cnpa-testhost-pyc"
    pyc.mkdir(parents=True, exist_ok=True)
    pyc.chmod(0o755)
    # Host keys are per instance (made at create time); the ones debootstrap made are shared.
    for key in (tree / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    wants = tree / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    # The datastore (etcd.service or kine.service) is enabled per instance, at create time.
    for unit in ("kube-apiserver.service", "kube-controller-manager.service"):
        link = wants / unit
        link.unlink(missing_ok=True)
        link.symlink_to(f"/etc/systemd/system/{unit}")
    # As on k3s, root's plain `kubectl` finds the admin kubeconfig.
    kube = tree / "root/.kube"
    kube.mkdir(parents=True, exist_ok=True)
    (kube / "config").unlink(missing_ok=True)
    (kube / "config").symlink_to("/etc/rancher/k3s/k3s.yaml")
    # Units that only make noise or fail in a container without hardware.
    for unit in ("systemd-timesyncd.service", "apt-daily.timer", "apt-daily-upgrade.timer",
                 "e2scrub_all.timer", "fstrim.timer", "dpkg-db-backup.timer"):
        (tree / "etc/systemd/system" / unit).unlink(missing_ok=True)
        (tree / "etc/systemd/system" / unit).symlink_to("/dev/null")


def ensure(suite: str = SUITE) -> Path:
    """Return the path of the suite's customised rootfs tarball, building it if needed. Hosts
    created at the same time (the test workers) build it once: the others wait for the first."""
    dest = tarball(suite)
    if dest.exists():
        log(f"rootfs cached: {dest}")
        os.utime(dest)  # in use: see _build
        return dest
    if os.geteuid() != 0:
        raise HostError("building the rootfs needs root")
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / f"rootfs-{_check(suite)}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _wait_for_lock(lock, f"another process is building the {suite} rootfs")
        if dest.exists():
            log(f"rootfs cached: {dest}")
            return dest
        return _build(suite, dest)


def _build(suite: str, dest: Path) -> Path:
    base = _debootstrap_cached(suite)
    tree = _partial("rootfs.partial", suite)
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir()
    log(f"customising rootfs from {base.name}")
    run(["tar", "--numeric-owner", "--xattrs", "-C", str(tree), "-xf", str(base)],
        step="unpack debootstrap tree", quiet=True)
    _customise(tree)
    _pack(tree, dest)
    shutil.rmtree(tree)
    _remove_unused(suite, dest)
    log(f"rootfs ready: {dest}")
    return dest


def _remove_unused(suite: str, dest: Path) -> None:
    """Remove the suite's tarballs of other keys once unused for a day (ensure() marks each use):
    another checkout sharing the cache (other units in files/) may be unpacking its own now."""
    for old in cache_dir().glob(f"rootfs-{suite}-*.tar"):
        if old != dest and time.time() - old.stat().st_mtime > STALE_SECONDS:
            old.unlink()
