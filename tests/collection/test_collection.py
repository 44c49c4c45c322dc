"""labhub.cnpa as another team uses it: the collection built from this repository, installed from
its tarball with no network into an empty collections path, checked by `ansible-test sanity`, and
used from a directory outside the repository by a playbook against a real test host; and an
upgrade from the previous release (its tarball built from its commit, PREVIOUS) to this one.

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
from hostlib import Host, recap, session_host, wait_for

from fixtures import teamspace

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
BIN = ROOT / ".venv" / "bin"
LOGS = ROOT / ".cache" / "test-logs"
# ansible-test's HOME: its per-test virtualenvs and its pip bootstrap, kept between runs.
ANSIBLE_TEST_HOME = (Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                     / "cnpa-op" / "ansible-test")
GALAXY = yaml.safe_load((ROOT / "galaxy.yml").read_text())
# The release an upgrade starts from: 1.0.0, the commit tagged v1.0.0 (named by its id, which
# every clone of main has, tags or not).
PREVIOUS = "9fc8a3bbc52db84b439045f2bbc5f80e2c4d22ea"

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


@pytest.fixture(scope="module")
def collection(tmp_path_factory):
    return build_and_install(ROOT, tmp_path_factory.mktemp("collection"), "current")


def test_the_tarball_is_the_collection_and_carries_its_own_files(collection):
    manifest = json.loads((collection.root / "MANIFEST.json").read_text())["collection_info"]
    assert (manifest["namespace"], manifest["name"], manifest["version"]) == \
        ("labhub", "cnpa", GALAXY["version"])
    assert manifest["dependencies"] == GALAXY["dependencies"]
    with tarfile.open(collection.tarball) as tar:
        top = {name.split("/")[0] for name in tar.getnames()}
        # The dashboard and alerts are for whoever runs the controller the collection installs.
        assert {"monitoring/grafana-dashboard.json", "monitoring/alerts.yml"} <= set(tar.getnames())
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


def a_host(name: str):
    if os.geteuid() != 0:
        pytest.skip("the test host needs root")
    with session_host(name, "CNPA_COLLECTION_TESTHOST_REUSE") as inst:
        yield Host(inst)


@pytest.fixture(scope="module")
def host():
    yield from a_host(os.environ.get("CNPA_COLLECTION_TESTHOST_NAME", "pytest-collection"))


@pytest.fixture(scope="module")
def upgrade_host():
    yield from a_host(os.environ.get("CNPA_UPGRADE_TESTHOST_NAME", "pytest-upgrade"))


def test_a_playbook_outside_the_repository_installs_a_serving_controller(collection, host):
    play = collection.consumer / "platform.yml"
    play.write_text(CONSUMER_PLAYBOOK)
    inventory = str(host.inst.inventory)
    run([BIN / "ansible-playbook", "-i", inventory, play], cwd=collection.consumer,
        env=collection.env, log="collection-consumer.log")
    assert host.sh("systemctl is-active cnpa-op.service").stdout.strip() == "active"
    # The roles' default layout (cnpa_layout=system): code under /opt/cnpa-op.
    assert host.sh("cat /opt/cnpa-op/reconcile.sh").stdout == (ROOT / "reconcile.sh").read_text()

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


@pytest.fixture(scope="module")
def previous(tmp_path_factory):
    """The previous release, built from its commit as it was released."""
    work = tmp_path_factory.mktemp("previous")
    source = work / "source"
    source.mkdir()
    tag = subprocess.run(["git", "-C", ROOT, "rev-parse", "--verify", "-q", f"{PREVIOUS}^{{commit}}"],
                         capture_output=True, text=True, check=False)
    assert tag.returncode == 0, (f"the upgrade test starts from release 1.0.0, commit {PREVIOUS}: "
                                 "this checkout does not have it (a clone of main has)")
    archive = subprocess.run(["git", "-C", ROOT, "archive", "--format=tar", PREVIOUS],
                             capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", source], input=archive.stdout, check=True)
    built = build_and_install(source, work, "previous")
    assert built.version != GALAXY["version"], "this release has the previous one's version"
    return built


def managers(host: Host, *what: str) -> set[str]:
    """The field managers of an object (kubectl leaves managedFields out unless asked)."""
    got = host.get(*what, "--show-managed-fields")
    return {entry["manager"] for entry in got["metadata"].get("managedFields", [])}


def test_an_upgrade_from_the_previous_release_loses_nothing_and_changes_nothing_twice(
        previous, collection, upgrade_host):
    host = upgrade_host
    inventory = str(host.inst.inventory)
    run([BIN / "ansible-playbook", "-i", inventory, "labhub.cnpa.controller"],
        cwd=previous.consumer, env=previous.env, log="collection-upgrade-previous.log")
    for name in ("kept", "gone"):
        host.apply(teamspace(name, pods=2))
    for name in ("kept", "gone"):
        wait_for(lambda n=name: host.get("resourcequota", "-n", f"team-{n}")["items"], timeout=60,
                 what=f"the previous release's controller to serve {name}")
    host.kubectl("delete", "teamspace", "gone", "--wait=true", "--timeout=60s")
    record = host.sh("cat /root/cnpa-op/archive/gone.json").stdout
    assert json.loads(record)["name"] == "gone"
    in_cluster = host.get("configmaps", "-n", "cnpa-system",
                          "-l", "platform.labhub.io/archived-teamspace=gone")["items"]
    assert len(in_cluster) == 1
    kept_uid = host.get("teamspace", "kept")["metadata"]["uid"]

    text = run([BIN / "ansible-playbook", "-i", inventory, "labhub.cnpa.controller"],
               cwd=collection.consumer, env=collection.env, log="collection-upgrade-current.log")
    assert recap(text, host.inst.name)["failed"] == 0

    # Nothing lost: the TeamSpace and what it owns, the archive record on disk and in the cluster.
    kept = host.get("teamspace", "kept")
    assert kept["metadata"]["uid"] == kept_uid
    assert host.get("resourcequota", "-n", "team-kept")["items"]
    # The previous release kept its archive under /root/cnpa-op (the lab's layout): the record is
    # there still, and copied to this release's archive.
    assert host.sh("cat /root/cnpa-op/archive/gone.json").stdout == record
    assert host.sh("cat /var/lib/cnpa-op/archive/gone.json").stdout == record
    assert [c["metadata"]["uid"] for c in host.get(
        "configmaps", "-n", "cnpa-system", "-l", "platform.labhub.io/archived-teamspace=gone")["items"]] \
        == [c["metadata"]["uid"] for c in in_cluster]
    # One controller, the new one, writing: it serves a TeamSpace made after the upgrade.
    assert host.sh("systemctl is-active cnpa-op.service").stdout.strip() == "active"
    pids = host.sh("pgrep -f -- '-m [c]npa_controller' || true").stdout.split()
    assert len(pids) == 1, pids
    assert host.sh("cat /opt/cnpa-op/cnpa_controller/plan.py").stdout == \
        (ROOT / "cnpa_controller" / "plan.py").read_text()
    host.apply(teamspace("after", pods=1))
    wait_for(lambda: host.get("resourcequota", "-n", "team-after")["items"], timeout=60,
             what="the upgraded controller to serve a new TeamSpace")
    # Applied server-side from now on, and field manager cnpa-op alone owns what the previous
    # release wrote: what a later release drops goes from the server too.
    assert managers(host, "clusterrole", "cnpa-op") == {"cnpa-op"}
    assert managers(host, "clusterrole", "cnpa-teamspaces-view") == {"cnpa-op"}
    assert "OpenAPI-Generator" not in managers(host, "crd", "teamspaces.platform.labhub.io")

    text = run([BIN / "ansible-playbook", "-i", inventory, "labhub.cnpa.controller"],
               cwd=collection.consumer, env=collection.env, log="collection-upgrade-again.log")
    assert recap(text, host.inst.name)["changed"] == 0, text[-3000:]

    # What a release applied and a later one no longer has goes: here a label field manager
    # cnpa-op applied to the ClusterRole (as a release with that label would have), and the next
    # run, which applies the object without it.
    role = host.get("clusterrole", "cnpa-op")
    applied = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": "cnpa-op", "labels": {**role["metadata"]["labels"],
                                                          "example.io/dropped": "yes"}},
               "rules": role["rules"]}
    host.sh("kubectl apply --server-side --field-manager=cnpa-op --force-conflicts -f -",
            input_text=json.dumps(applied))
    assert host.get("clusterrole", "cnpa-op")["metadata"]["labels"]["example.io/dropped"] == "yes"
    text = run([BIN / "ansible-playbook", "-i", inventory, "labhub.cnpa.controller"],
               cwd=collection.consumer, env=collection.env, log="collection-upgrade-dropped.log")
    assert recap(text, host.inst.name)["failed"] == 0, text[-3000:]
    after = host.get("clusterrole", "cnpa-op")
    assert "example.io/dropped" not in after["metadata"]["labels"]
    assert after["rules"] == role["rules"]

    # The uninstall knows both layouts: the code of each goes, the records of each stay.
    host.kubectl("delete", "teamspace", "--all", "--wait=true", "--timeout=60s")
    text = run([BIN / "ansible-playbook", "-i", inventory, "labhub.cnpa.uninstall"],
               cwd=collection.consumer, env=collection.env, log="collection-upgrade-uninstall.log")
    assert recap(text, host.inst.name)["failed"] == 0, text[-3000:]
    left = host.sh("ls -d /root/cnpa-op/* /opt/cnpa-op/* /var/lib/cnpa-op/archive/* 2>/dev/null"
                   " || true").stdout.split()
    assert sorted(left) == sorted(["/root/cnpa-op/archive", "/var/lib/cnpa-op/archive/after.json",
                                   "/var/lib/cnpa-op/archive/gone.json",
                                   "/var/lib/cnpa-op/archive/kept.json"]), left
