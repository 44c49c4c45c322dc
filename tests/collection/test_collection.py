"""labhub.cnpa as another team uses it: the collection built from this repository, installed from
its tarball with no network into an empty collections path, checked by `ansible-test sanity`, and
used from a directory outside the repository by a playbook against a real test host.

No Galaxy here: the collection's dependencies (kubernetes.core, ansible.posix) are installed from
the copies the pinned `ansible` package bundles, and Ansible is told to look nowhere else
(ANSIBLE_COLLECTIONS_SCAN_SYS_PATH=false), so what the consumer runs is the tarball's."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from fixtures import teamspace
from hostlib import Host, session_host, wait_for

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
BIN = ROOT / ".venv" / "bin"
LOGS = ROOT / ".cache" / "test-logs"
# ansible-test's HOME: its per-test virtualenvs and its pip bootstrap, kept between runs.
ANSIBLE_TEST_HOME = (Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                     / "cnpa-op" / "ansible-test")
GALAXY = yaml.safe_load((ROOT / "galaxy.yml").read_text())

CONSUMER_PLAYBOOK = """\
---
- name: Our platform's TeamSpace API, from the collection labhub.cnpa
  hosts: k3s
  gather_facts: false
  vars:
    cnpa_controller_mode: watch
  roles:
    - role: labhub.cnpa.cnpa_crd
    - role: labhub.cnpa.cnpa_reconciler
    - role: labhub.cnpa.cnpa_controller
"""


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


def recap(text: str, name: str) -> dict[str, int]:
    line = re.search(rf"^{re.escape(name)}\s*:\s*(.*)$", text, re.MULTILINE)
    assert line, f"no PLAY RECAP line for {name}"
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line.group(1))}


@pytest.fixture(scope="module")
def collection(tmp_path_factory):
    work = tmp_path_factory.mktemp("collection")
    consumer = work / "consumer"
    consumer.mkdir()
    path = work / "collections"
    # Only what the consumer installed, and no ansible.cfg of ours (cwd is outside the repository).
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(path), ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false",
               ANSIBLE_FORCE_COLOR="0", NO_COLOR="1", PATH=f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}")
    run([BIN / "ansible-galaxy", "collection", "build", "--output-path", work, ROOT],
        cwd=consumer, env=env, log="collection-build.log")
    tarball = work / f"labhub-cnpa-{GALAXY['version']}.tar.gz"
    bundled = Path(importlib.util.find_spec("ansible_collections").submodule_search_locations[0])
    for dependency in GALAXY["dependencies"]:
        namespace, name = dependency.split(".")
        shutil.copytree(bundled / namespace / name, path / "ansible_collections" / namespace / name,
                        symlinks=True)
    text = run([BIN / "ansible-galaxy", "collection", "install", "--offline", "-p", path, tarball],
               cwd=consumer, env=env, log="collection-install.log")
    assert "labhub.cnpa:" + GALAXY["version"] + " was installed successfully" in text, text
    return SimpleNamespace(tarball=tarball, path=path, consumer=consumer, env=env,
                           root=path / "ansible_collections" / "labhub" / "cnpa")


def test_the_tarball_is_the_collection_and_carries_its_own_files(collection):
    manifest = json.loads((collection.root / "MANIFEST.json").read_text())["collection_info"]
    assert (manifest["namespace"], manifest["name"], manifest["version"]) == \
        ("labhub", "cnpa", GALAXY["version"])
    assert manifest["dependencies"] == GALAXY["dependencies"]
    with tarfile.open(collection.tarball) as tar:
        top = {name.split("/")[0] for name in tar.getnames()}
    assert not top & {"tests", "bench", "testhost", "molecule", ".venv", "library", "dev.py"}, top
    # One source: what the roles install is the very file the lab's top-level entries link to.
    carried = collection.root / "roles" / "cnpa_reconciler" / "files"
    assert (carried / "reconcile.sh").read_bytes() == (ROOT / "reconcile.sh").read_bytes()
    assert (ROOT / "reconcile.sh").resolve() == ROOT / "roles/cnpa_reconciler/files/reconcile.sh"
    assert sorted(p.name for p in (carried / "cnpa_controller").glob("*.py")) == \
        sorted(p.name for p in (ROOT / "cnpa_controller").glob("*.py"))
    assert (collection.root / "plugins" / "modules" / "cnpa_measure.py").is_file()
    doc = subprocess.run([BIN / "ansible-doc", "-t", "module", "labhub.cnpa.cnpa_measure", "--json"],
                         cwd=collection.consumer, env=collection.env, capture_output=True,
                         text=True, check=True, timeout=120)
    assert "labhub.cnpa.cnpa_measure" in json.loads(doc.stdout)


def _ansible_test_home() -> Path:
    """HOME for ansible-test, with its pip bootstrap in its cache (tests/collection/get_pip.py)."""
    cache = ANSIBLE_TEST_HOME / ".ansible" / "test" / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    if not list(cache.glob("pip-*.whl")):
        subprocess.run([BIN / "python", "-m", "pip", "download", "-q", "--no-deps",
                        "--require-hashes", "-r", HERE / "ansible-test-pip.lock", "-d", cache],
                       check=True, timeout=300)
    version = re.search(r"^pip==([\d.]+)", (HERE / "ansible-test-pip.lock").read_text(), re.M)[1]
    shutil.copyfile(HERE / "get_pip.py", cache / f"get_pip_{version.replace('.', '_')}.py")
    return ANSIBLE_TEST_HOME


def test_ansible_test_sanity_passes_with_no_ignore_file(collection):
    assert not (collection.root / "tests" / "sanity").exists()
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    env = dict(collection.env, HOME=str(_ansible_test_home()))
    text = run([BIN / "ansible-test", "sanity", "--python", python], cwd=collection.root, env=env,
               log="collection-sanity.log", timeout=1800)
    assert "Running sanity test \"validate-modules\"" in text and "pylint" in text, text[-3000:]


@pytest.fixture(scope="module")
def host():
    if os.geteuid() != 0:
        pytest.skip("the test host needs root")
    with session_host(os.environ.get("CNPA_COLLECTION_TESTHOST_NAME", "pytest-collection"),
                      "CNPA_COLLECTION_TESTHOST_REUSE") as inst:
        yield Host(inst)


def test_a_playbook_outside_the_repository_installs_a_serving_controller(collection, host):
    play = collection.consumer / "platform.yml"
    play.write_text(CONSUMER_PLAYBOOK)
    inventory = str(host.inst.inventory)
    run([BIN / "ansible-playbook", "-i", inventory, play], cwd=collection.consumer,
        env=collection.env, log="collection-consumer.log")
    assert host.sh("systemctl is-active cnpa-op.service").stdout.strip() == "active"
    assert host.sh("cat /root/cnpa-op/reconcile.sh").stdout == (ROOT / "reconcile.sh").read_text()

    host.apply(teamspace("consumer-team", pods=3))
    quotas = wait_for(lambda: host.get("resourcequota", "-n", "team-consumer-team")["items"],
                      timeout=60, what="the controller to create consumer-team's namespace and quota")
    quota = quotas[0]
    assert quota["spec"]["hard"]["pods"] == "3"

    # The collection's own playbook after the consumer's roles: the same code, nothing to change.
    started = time.monotonic()
    text = run([BIN / "ansible-playbook", "-i", inventory, "labhub.cnpa.controller"],
               cwd=collection.consumer, env=collection.env, log="collection-controller.log")
    assert recap(text, host.inst.name)["changed"] == 0, (time.monotonic() - started, text[-3000:])
