"""The pure parts of testhost/build.py: what the build module replaces and stamps in."""

from __future__ import annotations

from pathlib import Path

import pytest

from testhost import build
from testhost.common import HostError

KUBERNETES_GOMOD = """module k8s.io/kubernetes

go 1.26.0

require (
\tgithub.com/spf13/cobra v1.10.2
\tk8s.io/api v0.0.0
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
\tk8s.io/sample-apiserver => ./staging/src/k8s.io/sample-apiserver
)
"""


def test_every_staging_replacement_is_found():
    assert build._staging_modules(KUBERNETES_GOMOD) == [
        "k8s.io/api", "k8s.io/client-go", "k8s.io/sample-apiserver"]


def test_a_gomod_without_staging_replacements_is_an_error():
    with pytest.raises(HostError, match="staging"):
        build._staging_modules("module k8s.io/kubernetes\n\ngo 1.26.0\n")


def test_the_build_module_requires_the_release_and_replaces_staging(tmp_path):
    gomod = tmp_path / "kubernetes.mod"
    gomod.write_text(KUBERNETES_GOMOD)
    mod = build._module(tmp_path / "m", "cnpa-op/x", str(gomod), {"k8s.io/kubernetes": "v1.36.5"},
                        {"k8s.io/api": "v0.36.5"}, ["k8s.io/kubernetes/cmd/kubectl"])
    text = (mod / "go.mod").read_text()
    assert "go 1.26.0\n" in text
    assert "require k8s.io/kubernetes v1.36.5\n" in text
    assert "\tk8s.io/api => k8s.io/api v0.36.5\n" in text
    assert '_ "k8s.io/kubernetes/cmd/kubectl"' in (mod / "programs.go").read_text()
    assert (mod / "programs.go").read_text().startswith("//go:build tools\n")


def test_the_etcd_version_is_the_one_the_release_pins(tmp_path):
    (tmp_path / "build").mkdir()
    (tmp_path / "build/dependencies.yaml").write_text(
        'dependencies:\n  - name: "cni"\n    version: 1.7.1\n'
        '  - name: "etcd"\n    version: 3.6.8\n    refPaths:\n    - path: x\n')
    assert build._etcd_version(tmp_path) == "3.6.8"


def test_version_stamps_are_those_of_kubernetes_own_build(tmp_path):
    info = tmp_path / "v.info"
    info.write_text('{"Version": "v1.36.5", "Time": "2026-09-23T18:59:36Z"}')
    flags = build._version_ldflags("v1.36.5", {"Info": str(info)})
    for pkg in ("k8s.io/client-go/pkg/version", "k8s.io/component-base/version"):
        assert f"-X {pkg}.gitVersion=v1.36.5" in flags
        assert f"-X {pkg}.gitMajor=1" in flags
        assert f"-X {pkg}.gitMinor=36" in flags
        assert f"-X {pkg}.buildDate=2026-09-23T18:59:36Z" in flags


@pytest.mark.parametrize("value", ["1.36.5", "v1.36", "latest", "v1.36.5; rm -rf /"])
def test_a_malformed_version_is_refused(monkeypatch, value):
    monkeypatch.setenv("CNPA_KUBE_VERSION", value)
    with pytest.raises(HostError, match="CNPA_KUBE_VERSION"):
        build.version()


def test_the_default_version_keys_the_cache(monkeypatch):
    monkeypatch.delenv("CNPA_KUBE_VERSION", raising=False)
    assert build.version() == build.DEFAULT_VERSION
    assert build.bin_dir().parts[-2:] == (f"kubernetes-{build.DEFAULT_VERSION}", "bin")
    assert isinstance(build.bin_dir(), Path)


def test_hosts_made_at_once_build_the_rootfs_once(tmp_path, monkeypatch):
    """Two test workers creating their first hosts at the same time on a cold cache: one builds
    the rootfs, the other waits for it (two builds into one work directory break each other)."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from testhost import rootfs

    monkeypatch.setattr(rootfs, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(rootfs.os, "geteuid", lambda: 0)
    builds = []

    def build(suite, dest):
        builds.append(suite)
        time.sleep(1.5)
        dest.write_text("rootfs")
        return dest

    monkeypatch.setattr(rootfs, "_build", build)
    with ThreadPoolExecutor(2) as pool:
        made = list(pool.map(lambda _: rootfs.ensure("trixie"), range(2)))
    assert builds == ["trixie"]
    assert made[0] == made[1] == rootfs.tarball("trixie")


# kine's scripts/build of v0.17.5, as far as the build reads it (TAGS= and CGO_CFLAGS=).
KINE_BUILD_SCRIPT = '''#!/bin/bash
LINKFLAGS="
      -X github.com/k3s-io/kine/pkg/version.Version=$VERSION
"
CGO_CFLAGS="
      -DSQLITE_DEFAULT_MEMSTATUS=0
      -DSQLITE_ENABLE_UNLOCK_NOTIFY
      -DSQLITE_THREADSAFE=1
"

TAGS="nats,sqlite_unlock_notify,sqlite_vtable,sqlite_stat4"

echo Building Kine
'''


def test_kine_is_built_with_the_tags_and_cflags_of_its_own_build_less_nats():
    tags, cflags = build._kine_flags(KINE_BUILD_SCRIPT)
    assert tags == "sqlite_unlock_notify,sqlite_vtable,sqlite_stat4"
    assert cflags == "-DSQLITE_DEFAULT_MEMSTATUS=0 -DSQLITE_ENABLE_UNLOCK_NOTIFY -DSQLITE_THREADSAFE=1"


def test_a_kine_build_script_without_tags_is_an_error():
    with pytest.raises(HostError, match="scripts/build"):
        build._kine_flags("#!/bin/bash\ngo build -o bin/kine\n")


def test_kine_is_cached_by_its_version():
    assert build.kine_dir().name == f"kine-{build.KINE_VERSION}"


def test_a_cgo_build_has_cgo_on_and_its_own_build_cache(monkeypatch, tmp_path):
    monkeypatch.setattr(build.shutil, "which", lambda _: "/usr/bin/go")
    plain = build._Go()
    cgo = build._Go(tmp_path / "cache", cgo_cflags="-DSQLITE_THREADSAFE=1")
    assert plain.env["CGO_ENABLED"] == "0" and "CGO_CFLAGS" not in plain.env
    assert cgo.env["CGO_ENABLED"] == "1"
    assert cgo.env["CGO_CFLAGS"] == "-DSQLITE_THREADSAFE=1"
    assert cgo.env["GOCACHE"] == str(tmp_path / "cache") != plain.env["GOCACHE"]
    assert cgo.env["GOMODCACHE"] == plain.env["GOMODCACHE"]  # modules are shared


def _elf(path: Path, segment_types: list[int]) -> Path:
    """A 64-bit little-endian ELF header and program header table, nothing else."""
    import struct
    phoff, phentsize = 64, 56
    head = bytearray(64)
    head[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", head, 32, phoff)
    struct.pack_into("<HH", head, 54, phentsize, len(segment_types))
    table = b"".join(struct.pack("<I", t) + bytes(phentsize - 4) for t in segment_types)
    path.write_bytes(bytes(head) + table)
    return path


def test_a_binary_without_an_interpreter_is_static(tmp_path):
    pt_load, pt_interp, pt_note = 1, 3, 4
    assert build._is_static(_elf(tmp_path / "static", [pt_load, pt_load, pt_note]))
    assert not build._is_static(_elf(tmp_path / "dynamic", [6, pt_interp, pt_load]))
    (tmp_path / "script").write_text("#!/bin/sh\n")
    with pytest.raises(HostError, match="ELF"):
        build._is_static(tmp_path / "script")


def test_two_kine_builds_at_once_build_once(tmp_path, monkeypatch):
    """Two hosts created at once on a cold cache: one builds kine, the other waits and uses it."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setattr(build, "cache_dir", lambda: tmp_path)
    builds = []

    def make():
        builds.append(1)
        time.sleep(1.5)
        (build.kine_dir() / "bin").mkdir(parents=True)
        (build.kine_dir() / "bin" / "kine").write_text("kine")
        return build.kine_dir() / "bin"

    monkeypatch.setattr(build, "_build_kine_locked", make)
    with ThreadPoolExecutor(2) as pool:
        made = list(pool.map(lambda _: build.build_kine(), range(2)))
    assert builds == [1]
    assert made == [tmp_path / f"kine-{build.KINE_VERSION}" / "bin"] * 2


def test_another_checkouts_rootfs_is_kept_until_unused_for_a_day(tmp_path, monkeypatch):
    import os
    import time

    from testhost import rootfs

    monkeypatch.setattr(rootfs, "cache_dir", lambda: tmp_path)
    mine, recent, old = (tmp_path / f"rootfs-trixie-{key}.tar" for key in ("aaa", "bbb", "ccc"))
    for tarball in (mine, recent, old):
        tarball.write_text("rootfs")
    two_days_ago = time.time() - 2 * 24 * 3600
    os.utime(old, (two_days_ago, two_days_ago))
    rootfs._remove_unused("trixie", mine)
    assert mine.exists() and recent.exists() and not old.exists()
