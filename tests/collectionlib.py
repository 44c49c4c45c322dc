"""labhub.cnpa as another team installs and uses it: the collection built from a source tree,
installed offline with its dependencies into a collections path of its own, and a playbook of
theirs that uses its roles by their full names, run from outside the repository. Shared by
tests/collection (install, sanity, upgrade) and tests/multihost (a consumer's --limit run)."""

from __future__ import annotations

import importlib.util
import os
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


def consumer_env(path: Path) -> dict:
    """Ansible as another team runs it: only the collections installed in path, no ansible.cfg of
    ours (cwd is outside the repository)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(path), ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false",
               ANSIBLE_FORCE_COLOR="0", NO_COLOR="1", PATH=f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}")
    return env


def build_and_install(source: Path, work: Path, name: str) -> SimpleNamespace:
    """The collection in source built into work, installed offline into work/name with its
    dependencies copied from the ansible package's bundled ones (no Galaxy here)."""
    consumer = work / f"{name}-consumer"
    consumer.mkdir()
    path = work / name
    env = consumer_env(path)
    version = yaml.safe_load((source / "galaxy.yml").read_text())["version"]
    run([BIN / "ansible-galaxy", "collection", "build", "--output-path", work, source],
        cwd=consumer, env=env, log=f"collection-{name}-build.log")
    tarball = work / f"labhub-cnpa-{version}.tar.gz"
    bundled = Path(importlib.util.find_spec("ansible_collections").submodule_search_locations[0])
    for dependency in GALAXY["dependencies"]:
        namespace, dep = dependency.split(".")
        shutil.copytree(bundled / namespace / dep, path / "ansible_collections" / namespace / dep,
                        symlinks=True)
    text = run([BIN / "ansible-galaxy", "collection", "install", "--offline", "-p", path, tarball],
               cwd=consumer, env=env, log=f"collection-{name}-install.log")
    assert f"labhub.cnpa:{version} was installed successfully" in text, text
    return SimpleNamespace(tarball=tarball, path=path, consumer=consumer, env=env, version=version,
                           root=path / "ansible_collections" / "labhub" / "cnpa")
