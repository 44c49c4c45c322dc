"""labhub.cnpa as another team installs and uses it: the collection built from a source tree,
installed offline with its dependencies into a collections path of its own, and a playbook of
theirs that uses its roles by their full names, run from outside the repository. Shared by
tests/collection (install, sanity, upgrade) and tests/multihost (a consumer's --limit run)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".venv" / "bin"
LOGS = ROOT / ".cache" / "test-logs"
GALAXY = yaml.safe_load((ROOT / "galaxy.yml").read_text())


def consumer_playbook(mode: str | None = "watch") -> str:
    """A consumer's playbook: the roles in order; mode None leaves cnpa_controller_mode to its
    default (the mode the cluster records)."""
    asked = f"  vars:\n    cnpa_controller_mode: {mode}\n" if mode else ""
    return ("---\n- name: Our platform's TeamSpace API, from the collection labhub.cnpa\n"
            "  hosts: k3s\n  gather_facts: false\n" + asked +
            "  roles:\n    - role: labhub.cnpa.cnpa_crd\n    - role: labhub.cnpa.cnpa_reconciler\n"
            "    - role: labhub.cnpa.cnpa_controller\n")


def run(argv: list, cwd: Path, env: dict, log: str, timeout: float = 900) -> str:
    """Run a command, its output to LOGS/log; fail with the output's end when it fails."""
    LOGS.mkdir(parents=True, exist_ok=True)
    with open(LOGS / log, "w") as fh:
        proc = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, stdout=fh,
                              stderr=subprocess.STDOUT, timeout=timeout, check=False)
    text = (LOGS / log).read_text(errors="replace")
    tail = "\n".join(text.splitlines()[-60:])
    assert proc.returncode == 0, f"{argv[0]} {argv[1]} failed ({LOGS / log}):\n{tail}"
    return text


def consumer_env(path: Path, bin_dir: Path = BIN) -> dict:
    """Ansible as another team runs it: only the collections installed in path, no ansible.cfg of
    ours (cwd is outside the repository), bin_dir's Ansible first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(path), ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false",
               ANSIBLE_FORCE_COLOR="0", NO_COLOR="1",
               PATH=f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}")
    return env


def bundled_collections() -> Path:
    """ansible_collections of the pinned `ansible` package in .venv."""
    return Path(importlib.util.find_spec("ansible_collections").submodule_search_locations[0])


def build(source: Path, work: Path, name: str) -> Path:
    """The collection in source built into work: its tarball."""
    version = yaml.safe_load((source / "galaxy.yml").read_text())["version"]
    env = consumer_env(work / name)
    run([BIN / "ansible-galaxy", "collection", "build", "--output-path", work, source],
        cwd=work, env=env, log=f"collection-{name}-build.log")
    return work / f"labhub-cnpa-{version}.tar.gz"


def install(tarball: Path, work: Path, name: str, dependencies: dict[str, Path],
            bin_dir: Path = BIN) -> SimpleNamespace:
    """tarball installed offline, by bin_dir's ansible-galaxy, into work/name, its dependencies
    copied first from the directories given (no Galaxy here)."""
    consumer = work / f"{name}-consumer"
    consumer.mkdir()
    path = work / name
    env = consumer_env(path, bin_dir)
    for dependency, copy in dependencies.items():
        namespace, dep = dependency.split(".")
        shutil.copytree(copy, path / "ansible_collections" / namespace / dep, symlinks=True)
    text = run([bin_dir / "ansible-galaxy", "collection", "install", "--offline", "-p", path,
                tarball], cwd=consumer, env=env, log=f"collection-{name}-install.log")
    version = re.search(r"labhub-cnpa-(.+)\.tar\.gz$", tarball.name)[1]
    assert f"labhub.cnpa:{version} was installed successfully" in text, text
    return SimpleNamespace(tarball=tarball, path=path, consumer=consumer, env=env, version=version,
                           bin=bin_dir, root=path / "ansible_collections" / "labhub" / "cnpa")


def build_and_install(source: Path, work: Path, name: str) -> SimpleNamespace:
    """The collection in source built and installed with the pinned Ansible, the dependencies its
    galaxy.yml declares copied from the ones the `ansible` package bundles."""
    tarball = build(source, work, name)
    wanted = yaml.safe_load((source / "galaxy.yml").read_text()).get("dependencies") or {}
    return install(tarball, work, name, {dep: bundled_collections() / dep.replace(".", "/")
                                         for dep in wanted})
