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
