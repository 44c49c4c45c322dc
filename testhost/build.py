"""Build the test host's control plane from Go modules: kube-apiserver, kube-controller-manager,
kubectl and etcd of one Kubernetes release, cached by version.

`k8s.io/kubernetes` is served by the Go module proxy, but its go.mod points every staging module
(`k8s.io/api`, `k8s.io/apiserver`, `k8s.io/client-go`, ...) at `./staging/...`, which a module
download does not contain, and a dependency's replace directives are ignored anyway. So the build
happens in a module of our own that requires `k8s.io/kubernetes vX.Y.Z` and replaces each staging
module with its published `v0.Y.Z` (the usual way out-of-tree schedulers build against it). The
release's generated sources (deepcopy, openapi) are committed upstream, so no code generation runs.
etcd is the version that release pins in its build/dependencies.yaml, built from
`go.etcd.io/etcd/server/v3` in a module of its own (its dependency graph is not Kubernetes').

kine (build_kine), the datastore of a single k3s server, is built the same way in a module of its
own, with cgo for SQLite, for the hosts that store in it (instance.py, --datastore kine).

Cache (under cnpa-op's cache directory): kubernetes-<version>/bin/ holds the four binaries,
kubernetes-<version>/build/ the two build modules and their logs, kine-<version>/ the same for
kine, go/ the Go module download cache (GOMODCACHE, 1.05 GB on 2026-12-04, shared by the
builds). Go's build cache is used only during a build and removed afterwards (about 3 GB for the
control plane); CNPA_KEEP_GO_BUILD_CACHE=1 keeps it.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import struct
import subprocess
import time
from pathlib import Path

from .common import PROGRESS_SECONDS, HostError, apt_install, cache_dir, log, run
from .progress import elapsed_text

# The minor that k3s's stable channel ships, at the newest patch the module proxy serves.
DEFAULT_VERSION = "v1.36.5"
KUBERNETES_BINARIES = ("kube-apiserver", "kube-controller-manager", "kubectl")
BINARIES = (*KUBERNETES_BINARIES, "etcd")
DOWNLOAD_TIMEOUT = 30 * 60
BUILD_TIMEOUT = 75 * 60


def version() -> str:
    """The Kubernetes release of the test host: CNPA_KUBE_VERSION, else DEFAULT_VERSION."""
    wanted = os.environ.get("CNPA_KUBE_VERSION") or DEFAULT_VERSION
    if not re.fullmatch(r"v1\.\d+\.\d+", wanted):
        raise HostError(f"CNPA_KUBE_VERSION={wanted!r}: expected a release such as {DEFAULT_VERSION}")
    return wanted


def release_dir() -> Path:
    return cache_dir() / f"kubernetes-{version()}"


def bin_dir() -> Path:
    return release_dir() / "bin"


def built() -> bool:
    return all((bin_dir() / name).is_file() for name in BINARIES)


def build(force: bool = False) -> Path:
    """Return the directory holding the binaries, building them if the cache lacks them."""
    return _cached(release_dir(), f"the control plane {version()}", built, _build_locked, force)


def _cached(where: Path, what: str, done, make, force: bool) -> Path:
    """where/bin once done() says it is complete, made by make() under where/build.lock: two
    processes asking at once build once, the second waits for the first."""
    where.mkdir(parents=True, exist_ok=True)
    with open(where / "build.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _wait_for_lock(lock, f"another process is building {what}")
        if done() and not force:
            log(f"{what} cached in {where / 'bin'}")
            return where / "bin"
        return make()


def _wait_for_lock(lock, what: str, every: float = PROGRESS_SECONDS,
                   timeout: float = DOWNLOAD_TIMEOUT + 2 * BUILD_TIMEOUT) -> None:
    """Take the lock once its holder lets go, saying so every `every` seconds meanwhile (a cold
    build holds it for about 10 min; a silent wait that long looks hung)."""
    log(f"{what}; waiting for it")
    t0 = time.monotonic()
    next_line = t0 + every
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        now = time.monotonic()
        if now - t0 > timeout:
            raise HostError(f"{what} and has held {lock.name} for over {timeout / 60:.0f} min; "
                            "if no build runs any more (`ps -ef | grep 'go build'`), try again")
        if now >= next_line:
            log(f"{what}: waited {elapsed_text(now - t0)} for it so far")
            next_line = now + every
        time.sleep(1)


class _Go:
    """The go command with the project's caches, run with progress lines and a log.

    The module cache is shared (Go locks it itself); the build cache is the caller's own, since
    each build removes its build cache at the end and two builds may run at once. Without
    cgo_cflags nothing is compiled with cgo; with them (kine's SQLite) cgo is on with those flags.
    """

    def __init__(self, gocache: Path | None = None, cgo_cflags: str | None = None) -> None:
        go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists()
                                    else None)
        if go is None:
            raise HostError("the go command is needed to build the control plane and kine (Go >= "
                            "1.26, as this project's machines have in /usr/local/go); none on PATH")
        self.go = go
        self.gocache = gocache or cache_dir() / "go" / "build-cache"
        self.env = {
            "GOMODCACHE": str(cache_dir() / "go" / "mod"), "GOCACHE": str(self.gocache),
            # -modcacherw: the module cache can be deleted with a plain rm -rf.
            "GOFLAGS": "-mod=mod -modcacherw", "CGO_ENABLED": "0", "GOWORK": "off",
            "GO111MODULE": "on", "GOPATH": str(cache_dir() / "go" / "path"),
        }
        if cgo_cflags is not None:
            self.env |= {"CGO_ENABLED": "1", "CGO_CFLAGS": cgo_cflags}

    def drop_build_cache(self) -> None:
        if os.environ.get("CNPA_KEEP_GO_BUILD_CACHE") != "1":
            log(f"removing Go's build cache {self.gocache} ({_size_mb(self.gocache)} MB; "
                "CNPA_KEEP_GO_BUILD_CACHE=1 keeps it)")
            shutil.rmtree(self.gocache, ignore_errors=True)

    def out(self, *args: str, cwd: Path, step: str, progress=None) -> str:
        return run([self.go, *args], step=step, cwd=cwd, env=self.env, quiet=True,
                   timeout=DOWNLOAD_TIMEOUT, progress=progress)

    def logged(self, *args: str, cwd: Path, step: str, logfile: Path, timeout: float,
               progress) -> None:
        run([self.go, *args], step=step, cwd=cwd, env=self.env, logfile=logfile, timeout=timeout,
            progress=progress)


def _build_locked() -> Path:
    v = version()
    go = _Go()
    log(f"building the control plane {v} from Go modules with "
        f"{go.out('version', cwd=cache_dir(), step='go version').strip()}; cold, this downloads "
        "about 1 GB of modules and compiles for about 9 min on 2 cores (progress every "
        f"{PROGRESS_SECONDS:.0f} s); cached afterwards")
    work = release_dir() / "build"
    work.mkdir(parents=True, exist_ok=True)
    stage = release_dir() / "bin.partial"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    t0 = time.monotonic()

    k8s_mod = _fetch(go, "k8s.io/kubernetes", v, work)
    # Staging modules are published as v0.<minor>.<patch> of the release: v1.36.5 -> v0.36.5.
    staging_version = "v0." + v.removeprefix("v1.")
    programs = [f"k8s.io/kubernetes/cmd/{b}" for b in KUBERNETES_BINARIES]
    kube = _module(work / "kubernetes", "cnpa-op/testhost-kubernetes", k8s_mod["GoMod"],
                   {"k8s.io/kubernetes": v},
                   dict.fromkeys(_staging_modules(Path(k8s_mod["GoMod"]).read_text()),
                                 staging_version), programs)
    etcd_version = _etcd_version(Path(k8s_mod["Dir"]))
    etcd_program = "go.etcd.io/etcd/server/v3"  # the etcd main package is the module root
    etcd = _module(work / "etcd", "cnpa-op/testhost-etcd", k8s_mod["GoMod"],
                   {etcd_program: f"v{etcd_version}"}, {}, [etcd_program])
    log(f"etcd v{etcd_version}: the version Kubernetes {v} pins (build/dependencies.yaml)")

    for mod in (kube, etcd):
        _download(go, mod)
    _compile(go, kube, programs, _version_ldflags(v, k8s_mod), stage, ", ".join(KUBERNETES_BINARIES))
    _compile(go, etcd, [etcd_program], "-s -w", stage, "etcd")
    (stage / "server").rename(stage / "etcd")  # go names it after the path before /v3

    _check_versions(stage, v, etcd_version)
    out = bin_dir()
    shutil.rmtree(out, ignore_errors=True)
    stage.rename(out)
    go.drop_build_cache()
    log(f"built the control plane {v} (etcd v{etcd_version}) into {out} in "
        f"{(time.monotonic() - t0) / 60:.1f} min")
    return out


def _fetch(go: _Go, path: str, ver: str, work: Path) -> dict:
    log(f"fetching {path}@{ver} from the Go module proxy")
    modcache = Path(go.env["GOMODCACHE"]) / "cache" / "download"
    text = go.out("mod", "download", "-json", f"{path}@{ver}", cwd=work,
                  step=f"go mod download {path}@{ver} (is the Go module proxy reachable?)",
                  progress=lambda: f"module cache {_size_mb(modcache)} MB")
    info = json.loads(text)
    if info.get("Error"):
        raise HostError(f"go mod download {path}@{ver}: {info['Error']}")
    return info


def _staging_modules(gomod: str) -> list[str]:
    """The k8s.io modules that k8s.io/kubernetes replaces with its own ./staging tree."""
    mods = re.findall(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/", gomod, flags=re.M)
    if not mods:
        raise HostError("k8s.io/kubernetes's go.mod names no ./staging replacements; "
                        "the build module does not know what to replace")
    return mods


def _etcd_version(k8s_dir: Path) -> str:
    deps = (k8s_dir / "build" / "dependencies.yaml").read_text()
    found = re.search(r'-\s+name:\s+"etcd"\s*\n\s+version:\s*([\d.]+)', deps)
    if not found:
        raise HostError(f"no etcd version in {k8s_dir}/build/dependencies.yaml")
    return found.group(1)


def _module(path: Path, name: str, go_of: str, requires: dict[str, str],
            replaces: dict[str, str], packages: list[str]) -> Path:
    """A build module: go.mod with our requirements and replacements (its go directive that of
    the go.mod at go_of), a file importing the programs (so `go mod tidy` resolves their
    dependencies)."""
    path.mkdir(parents=True, exist_ok=True)
    godirective = re.search(r"^go\s+(\S+)", Path(go_of).read_text(), flags=re.M).group(1)
    lines = [f"module {name}", "", f"go {godirective}", ""]
    lines += [f"require {m} {v}" for m, v in requires.items()]
    if replaces:
        lines += ["", "replace ("] + [f"\t{m} => {m} {v}" for m, v in sorted(replaces.items())] + [")"]
    gomod = "\n".join(lines) + "\n"
    stamp = path / "go.mod.in"
    if not stamp.exists() or stamp.read_text() != gomod:
        stamp.write_text(gomod)
        (path / "go.mod").write_text(gomod)
        (path / "go.sum").unlink(missing_ok=True)
    (path / "programs.go").write_text(
        "//go:build tools\n\n// The programs this module builds; the tag keeps it out of builds.\n"
        "package programs\n\nimport (\n" + "".join(f'\t_ "{p}"\n' for p in packages) + ")\n")
    return path


def _download(go: _Go, mod: Path) -> None:
    modcache = Path(go.env["GOMODCACHE"]) / "cache" / "download"
    log(f"resolving and downloading the modules of {mod.name} (go mod tidy; log: {mod / 'tidy.log'})")
    go.logged("mod", "tidy", cwd=mod, step=f"go mod tidy in {mod}", logfile=mod / "tidy.log",
              timeout=DOWNLOAD_TIMEOUT,
              progress=lambda: f"module cache {_size_mb(modcache)} MB")


def _compile(go: _Go, mod: Path, packages: list[str], ldflags: str, out: Path,
             names: str, tags: str = "") -> None:
    tagged = [f"-tags={tags}"] if tags else []
    total = len(go.out("list", *tagged, "-deps", *packages, cwd=mod,
                       step=f"go list -deps in {mod}").split())
    logfile = mod / "build.log"
    logfile.unlink(missing_ok=True)
    log(f"compiling {names}: {total} packages (log: {logfile})")

    def progress() -> str:
        done = len(logfile.read_text(errors="replace").splitlines()) if logfile.exists() else 0
        return f"{done} of {total} packages compiled (rest cached or pending)"

    go.logged("build", "-v", "-trimpath", *tagged, "-ldflags", ldflags, "-o", f"{out}/", *packages,
              cwd=mod, step=f"go build {names}", logfile=logfile, timeout=BUILD_TIMEOUT,
              progress=progress)


def _version_ldflags(v: str, k8s_mod: dict) -> str:
    """What Kubernetes' own build stamps in (hack/lib/version.sh), so `kubectl version` and
    /version report the release rather than v0.0.0-master."""
    info = json.loads(Path(k8s_mod["Info"]).read_text())
    major, minor = v[1:].split(".")[:2]
    values = {"gitVersion": v, "gitMajor": major, "gitMinor": minor, "gitTreeState": "clean",
              "buildDate": info.get("Time", "1970-01-01T00:00:00Z").replace("+00:00", "Z")}
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/client-go/pkg/version", "k8s.io/component-base/version"):
        flags += [f"-X {pkg}.{key}={value}" for key, value in values.items()]
    return " ".join(flags)


def _check_versions(stage: Path, v: str, etcd_version: str) -> None:
    checks = {"kube-apiserver": (["--version"], f"Kubernetes {v}"),
              "kube-controller-manager": (["--version"], f"Kubernetes {v}"),
              "kubectl": (["version", "--client"], f"Client Version: {v}"),
              "etcd": (["--version"], f"etcd Version: {etcd_version}")}
    for name, (args, expected) in checks.items():
        proc = subprocess.run([str(stage / name), *args], capture_output=True, text=True,
                              timeout=60, check=False)
        if expected not in proc.stdout:
            raise HostError(f"{stage / name} {' '.join(args)} printed {proc.stdout.strip()!r} "
                            f"{proc.stderr.strip()!r}; expected {expected!r}")


def _size_mb(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) // 2**20


# -- kine ----------------------------------------------------------------------------------------
# kine serves the etcd API from SQL; a single k3s server keeps its cluster in SQLite through it
# (k3s's default datastore), so a test host can store where the lab's users' k3s stores.
KINE_VERSION = "v0.17.5"
KINE_MODULE = "github.com/k3s-io/kine"
# Tags of kine's own scripts/build that SQLite does not need (nats: kine's embedded NATS server).
KINE_TAGS_LEFT_OUT = ("nats",)


def kine_dir() -> Path:
    return cache_dir() / f"kine-{KINE_VERSION}"


def kine_built() -> bool:
    return (kine_dir() / "bin" / "kine").is_file()


def build_kine(force: bool = False) -> Path:
    """Return the directory holding the kine binary, building it if the cache lacks it."""
    return _cached(kine_dir(), f"kine {KINE_VERSION}", kine_built, _build_kine_locked, force)


def _build_kine_locked() -> Path:
    # cgo compiles SQLite (mattn/go-sqlite3), as k3s's kine does; libc6-dev brings libc.a for
    # the static link.
    apt_install(["gcc", "libc6-dev"])
    work = kine_dir() / "build"
    work.mkdir(parents=True, exist_ok=True)
    stage = kine_dir() / "bin.partial"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    gocache = work / "go-build-cache"
    t0 = time.monotonic()
    fetcher = _Go(gocache)
    kine_mod = _fetch(fetcher, KINE_MODULE, KINE_VERSION, work)
    tags, cflags = _kine_flags((Path(kine_mod["Dir"]) / "scripts" / "build").read_text())
    go = _Go(gocache, cgo_cflags=cflags)
    log(f"building kine {KINE_VERSION} (SQLite through cgo, tags {tags}) with "
        f"{go.out('version', cwd=work, step='go version').strip()}; cold, this takes 3-5 min on "
        f"2 cores (progress every {PROGRESS_SECONDS:.0f} s); cached afterwards")
    mod = _module(work / "kine", "cnpa-op/testhost-kine", kine_mod["GoMod"],
                  {KINE_MODULE: KINE_VERSION}, {}, [KINE_MODULE])
    _download(go, mod)
    # As kine's scripts/build links it on Linux: static, its version stamped in. The linker's
    # warnings about getaddrinfo and friends in a static binary are expected (kine's own build
    # has them); kine here resolves no names and looks up no users.
    ldflags = f"-X {KINE_MODULE}/pkg/version.Version={KINE_VERSION} -s -w -extldflags -static"
    _compile(go, mod, [KINE_MODULE], ldflags, stage, "kine", tags)
    _check_kine(stage / "kine")
    out = kine_dir() / "bin"
    shutil.rmtree(out, ignore_errors=True)
    stage.rename(out)
    go.drop_build_cache()
    log(f"built kine {KINE_VERSION} into {out} in {(time.monotonic() - t0) / 60:.1f} min")
    return out


def _kine_flags(script: str) -> tuple[str, str]:
    """The build tags (less KINE_TAGS_LEFT_OUT) and CGO_CFLAGS of kine's own scripts/build."""
    tags = re.search(r'^TAGS="([^"]*)"', script, flags=re.M)
    cflags = re.search(r'^CGO_CFLAGS="([^"]*)"', script, flags=re.M)
    if not tags or not cflags:
        raise HostError(f"no TAGS= or CGO_CFLAGS= in kine {KINE_VERSION}'s scripts/build; "
                        "its build changed, see how it builds now")
    kept = [t for t in tags.group(1).split(",") if t and t not in KINE_TAGS_LEFT_OUT]
    return ",".join(kept), " ".join(cflags.group(1).split())


def _check_kine(binary: Path) -> None:
    proc = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60,
                          check=False)
    expected = f"kine version {KINE_VERSION}"
    if expected not in proc.stdout:
        raise HostError(f"{binary} --version printed {proc.stdout.strip()!r} "
                        f"{proc.stderr.strip()!r}; expected {expected!r}")
    if not _is_static(binary):
        raise HostError(f"{binary} is dynamically linked; it must run in any rootfs (static)")


def _is_static(path: Path) -> bool:
    """True when the 64-bit ELF file asks for no program interpreter (no PT_INTERP header)."""
    with open(path, "rb") as fh:
        head = fh.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2:
            raise HostError(f"{path} is not a 64-bit ELF file")
        order = "<" if head[5] == 1 else ">"
        (phoff,) = struct.unpack_from(f"{order}Q", head, 32)
        phentsize, phnum = struct.unpack_from(f"{order}HH", head, 54)
        fh.seek(phoff)
        table = fh.read(phentsize * phnum)
    pt_interp = 3
    return all(struct.unpack_from(f"{order}I", table, i * phentsize)[0] != pt_interp
               for i in range(phnum))
