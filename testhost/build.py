"""Build kube-apiserver and kube-controller-manager from Debian's kubernetes source, offline.

Debian bookworm ships the full upstream 1.20.2 tree (with vendor/) as source package
kubernetes 1.20.5+really1.20.2. Its vendored reflect2 1.0.1 crashes binaries built with
Go >= 1.18 the first time a custom resource is created, so it is replaced with Debian's
reflect2 1.0.2 before building. The result is cached, keyed by the source version.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from .common import HostError, apt_install, cache_dir, log, run

SOURCE_PACKAGE = "kubernetes"
SOURCE_VERSION = "1.20.5+really1.20.2"
BINARIES = ("kube-apiserver", "kube-controller-manager")
SRC_LIST = Path("/etc/apt/sources.list.d/cnpa-op-deb-src.sources")
BUILD_DEPS = ["golang-go", "rsync", "dpkg-dev", "make", "gcc", "libc6-dev"]


def bin_dir() -> Path:
    return cache_dir() / f"kubernetes-{SOURCE_VERSION}" / "bin"


def built() -> bool:
    return all((bin_dir() / name).is_file() for name in BINARIES)


def _ensure_deb_src() -> None:
    if SRC_LIST.exists():
        return
    log(f"adding a bookworm deb-src entry ({SRC_LIST}) for apt-get source")
    SRC_LIST.write_text(
        "Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm\n"
        "Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
    run(["apt-get", "update", "-qq"], step="apt-get update (deb-src)", quiet=True)


def _fetch_source(work: Path) -> Path:
    tarballs = sorted(work.glob(f"{SOURCE_PACKAGE}_{SOURCE_VERSION}.orig.tar.*"))
    if not tarballs:
        _ensure_deb_src()
        log(f"fetching Debian source {SOURCE_PACKAGE}={SOURCE_VERSION}-* (about 34 MB)")
        run(["apt-get", "source", "--download-only", "-qq", SOURCE_PACKAGE],
            step="apt-get source kubernetes (is the bookworm deb-src entry reachable?)",
            cwd=work, quiet=True)
        tarballs = sorted(work.glob(f"{SOURCE_PACKAGE}_{SOURCE_VERSION}.orig.tar.*"))
    if not tarballs:
        have = ", ".join(p.name for p in work.iterdir())
        raise HostError(f"no {SOURCE_PACKAGE}_{SOURCE_VERSION}.orig tarball after apt-get source "
                        f"(got: {have}); Debian's bookworm source version may have changed")
    return tarballs[0]


def _extract(tarball: Path, work: Path) -> Path:
    tree = work / "tree"
    if (tree / "Makefile").exists():
        return tree
    log(f"extracting {tarball.name}")
    staging = work / "tree.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    with tarfile.open(tarball) as tf:
        tf.extractall(staging, filter="tar") if hasattr(tarfile, "data_filter") else tf.extractall(staging)
    (top,) = list(staging.iterdir())
    top.rename(tree)
    staging.rmdir()
    return tree


def _replace_reflect2(tree: Path, work: Path) -> None:
    marker = tree / ".cnpa-reflect2-replaced"
    if marker.exists():
        return
    log("replacing vendored modern-go/reflect2 1.0.1 with Debian's 1.0.2 (Go >= 1.18 crash fix)")
    deb_dir = work / "reflect2-deb"
    shutil.rmtree(deb_dir, ignore_errors=True)
    deb_dir.mkdir()
    run(["apt-get", "download", "-qq", "golang-github-modern-go-reflect2-dev"],
        step="apt-get download golang-github-modern-go-reflect2-dev", cwd=deb_dir, quiet=True)
    (deb,) = list(deb_dir.glob("*.deb"))
    run(["dpkg-deb", "-x", str(deb), str(deb_dir / "x")], step="dpkg-deb -x reflect2", quiet=True)
    src = deb_dir / "x/usr/share/gocode/src/github.com/modern-go/reflect2"
    if not src.is_dir():
        raise HostError(f"reflect2 sources not found in {deb.name} at {src}")
    dest = tree / "vendor/github.com/modern-go/reflect2"
    shutil.rmtree(dest)
    shutil.copytree(src, dest, symlinks=True)
    marker.write_text("golang-github-modern-go-reflect2-dev\n")


def build(force: bool = False) -> Path:
    """Return the directory holding the binaries, building them if the cache lacks them."""
    lock_path = cache_dir() / "build.lock"
    with open(lock_path, "w") as lock:
        if not built():
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log("another process is building the control plane; waiting for it")
                fcntl.flock(lock, fcntl.LOCK_EX)
        else:
            fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_locked(force)


def _build_locked(force: bool) -> Path:
    if built() and not force:
        log(f"control plane cached in {bin_dir()}")
        return bin_dir()
    apt_install(BUILD_DEPS)
    work = cache_dir() / f"kubernetes-{SOURCE_VERSION}" / "src"
    work.mkdir(parents=True, exist_ok=True)
    tree = _extract(_fetch_source(work), work)
    _replace_reflect2(tree, work)
    go_env = {"GOPROXY": "off", "CGO_ENABLED": "0", "GOFLAGS": "", "GO111MODULE": "",
              "KUBE_BUILD_PLATFORMS": "linux/amd64" if os.uname().machine == "x86_64" else "",
              "HOME": str(work)}
    go_env = {k: v for k, v in go_env.items() if v or k in ("GOFLAGS",)}
    logfile = work / "build.log"
    log(f"make generated_files (2-3 min; log: {logfile})")
    run(["make", "generated_files"], step="make generated_files", cwd=tree, env=go_env,
        logfile=logfile)
    log("make kube-apiserver kube-controller-manager (12-15 min cold on 2 cores)")
    run(["make", "WHAT=cmd/kube-apiserver cmd/kube-controller-manager"],
        step="make kube-apiserver kube-controller-manager", cwd=tree, env=go_env, logfile=logfile)
    out = bin_dir()
    out.mkdir(parents=True, exist_ok=True)
    for name in BINARIES:
        found = list((tree / "_output").glob(f"**/bin/{name}"))
        if not found:
            raise HostError(f"{name} not produced by the build; see {logfile}")
        tmp = out / f".{name}.tmp"
        shutil.copy2(found[0], tmp)
        tmp.rename(out / name)
    version = subprocess.run([str(out / "kube-apiserver"), "--version"], capture_output=True,
                             text=True, check=False).stdout.strip()
    log(f"built {version} into {out}")
    if os.environ.get("CNPA_KEEP_BUILD_TREE") != "1":
        # 2.5 GB of build output; only the binaries are needed again.
        shutil.rmtree(tree / "_output", ignore_errors=True)
    return out
