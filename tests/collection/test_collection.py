"""labhub.cnpa as another team uses it: the collection built from this repository, installed from
its tarball with no network into an empty collections path, checked by `ansible-test sanity`, and
used from a directory outside the repository by a playbook against a real test host; and an
upgrade from the previous release (its tarball built from its commit, PREVIOUS) to this one.

At both ends of what the collection claims: the highest ansible-core of meta/runtime.yml's
requires_ansible with the highest kubernetes.core of galaxy.yml's dependency (the pinned
ansible-core of requirements.lock, the kubernetes.core its `ansible` package bundles), and the
lowest with the lowest (tests/collection/lowest/: ansible-core in a virtualenv of its own, and
kubernetes.core taken from the `ansible` wheel that bundles it). The lowest reuses the tarball
built for the highest, and the upgrade test's host once that test has uninstalled everything.

No Galaxy here: the collection's dependencies are installed from those copies, and Ansible is told
to look nowhere else (ANSIBLE_COLLECTIONS_SCAN_SYS_PATH=false), so what the consumer runs is the
tarball's."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from collectionlib import (
    BIN,
    GALAXY,
    ROOT,
    build_and_install,
    consumer_playbook,
    install,
    run,
)
from hostlib import Host, recap, session_host, wait_for

from fixtures import teamspace

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cnpa-op"
# ansible-test's HOME: its per-test virtualenvs and its pip bootstrap, kept between runs.
ANSIBLE_TEST_HOME = CACHE / "ansible-test"
# The lowest ansible-core's virtualenv, its ansible-test HOME, the wheel kubernetes.core comes from.
MATRIX_CACHE = CACHE / "collection-matrix"
LOWEST = HERE / "lowest"
RUNTIME = yaml.safe_load((ROOT / "meta" / "runtime.yml").read_text())
# The release an upgrade starts from: 1.0.0, the commit tagged v1.0.0 (named by its id, which
# every clone of main has, tags or not).
PREVIOUS = "9fc8a3bbc52db84b439045f2bbc5f80e2c4d22ea"

CONSUMER_PLAYBOOK = consumer_playbook("watch")


def declared(spec: str) -> tuple[str, str]:
    """The two ends of a range the collection declares, ">=LOW,<=HIGH": both are tested."""
    found = re.fullmatch(r">=(\d+\.\d+\.\d+),<=(\d+\.\d+\.\d+)", spec.replace(" ", ""))
    assert found, f"{spec!r}: the collection declares a closed range of tested versions"
    return found[1], found[2]


def collection_version(root: Path) -> str:
    return json.loads((root / "MANIFEST.json").read_text())["collection_info"]["version"]


def _digest(*paths: Path) -> str:
    return hashlib.sha256(b"".join(p.read_bytes() for p in paths)).hexdigest()[:12]


@contextmanager
def matrix_lock() -> Iterator[None]:
    """The matrix cache to one worker at a time: the sanity test (unit tests/collection/) and
    the lowest Ansible's install (the upgrade's unit) may make the same virtualenv at once."""
    MATRIX_CACHE.mkdir(parents=True, exist_ok=True)
    with open(MATRIX_CACHE / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield


def lowest_ansible_core() -> Path:
    """bin/ of a virtualenv with the lowest ansible-core (LOWEST/requirements.lock, hashes), made
    once per lock and Python in the cache."""
    with matrix_lock():
        return _lowest_ansible_core()


def _lowest_ansible_core() -> Path:
    lock = LOWEST / "requirements.lock"
    venv = MATRIX_CACHE / f"ansible-core-{_digest(lock)}-py{sys.version_info.major}{sys.version_info.minor}"
    done = venv / ".installed"
    if not done.exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=300)
        subprocess.run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--require-hashes",
                        "--no-deps", "-r", lock], check=True, timeout=900)
        done.touch()
    return venv / "bin"


def lowest_kubernetes_core() -> Path:
    """The lowest kubernetes.core: ansible_collections/kubernetes/core out of the `ansible` wheel
    of LOWEST/kubernetes-core.lock (downloaded with its hash, not installed), kept in the cache."""
    with matrix_lock():
        return _lowest_kubernetes_core()


def _lowest_kubernetes_core() -> Path:
    lock = LOWEST / "kubernetes-core.lock"
    out = MATRIX_CACHE / f"kubernetes-core-{_digest(lock)}"
    core = out / "ansible_collections" / "kubernetes" / "core"
    if not (out / ".extracted").exists():
        wheels = MATRIX_CACHE / "wheels"
        subprocess.run([BIN / "python", "-m", "pip", "download", "-q", "--no-deps",
                        "--require-hashes", "-r", lock, "-d", wheels], check=True, timeout=900)
        name, version = re.search(r"^(\S+)==(\S+)", lock.read_text(), re.M).groups()
        shutil.rmtree(out, ignore_errors=True)
        prefix = "ansible_collections/kubernetes/core/"
        downloaded = wheels / f"{name}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(downloaded) as wheel:
            wheel.extractall(out, [n for n in wheel.namelist() if n.startswith(prefix)])
        (out / ".extracted").touch()
        downloaded.unlink()   # 47 MB, of which the collection is 1
    return core


@pytest.fixture(scope="module")
def collection(tmp_path_factory):
    """The tarball, installed with the highest ansible-core and kubernetes.core declared."""
    installed = build_and_install(ROOT, tmp_path_factory.mktemp("collection"), "current")
    from ansible.release import __version__ as core
    assert core == declared(RUNTIME["requires_ansible"])[1], core
    kubernetes_core = collection_version(installed.path / "ansible_collections/kubernetes/core")
    assert kubernetes_core == declared(GALAXY["dependencies"]["kubernetes.core"])[1]
    return installed


@pytest.fixture(scope="module")
def lowest(collection):
    """The same tarball installed with the lowest ansible-core and kubernetes.core declared."""
    bin_dir = lowest_ansible_core()
    core = subprocess.run([bin_dir / "python", "-c",
                           "from ansible.release import __version__; print(__version__)"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    assert core == declared(RUNTIME["requires_ansible"])[0], core
    kubernetes_core = lowest_kubernetes_core()
    assert collection_version(kubernetes_core) == \
        declared(GALAXY["dependencies"]["kubernetes.core"])[0]
    return install(collection.tarball, collection.tarball.parent, "lowest",
                   {"kubernetes.core": kubernetes_core}, bin_dir)


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


def _ansible_test_home(home: Path, pip_lock: Path) -> Path:
    """HOME for ansible-test, with its pip bootstrap in its cache (tests/collection/get_pip.py):
    one per ansible-core, whose ansible-test bootstraps a pip of its own (pip_lock)."""
    cache = home / ".ansible" / "test" / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    if not list(cache.glob("pip-*.whl")):
        subprocess.run([BIN / "python", "-m", "pip", "download", "-q", "--no-deps",
                        "--require-hashes", "-r", pip_lock, "-d", cache],
                       check=True, timeout=300)
    version = re.search(r"^pip==([\d.]+)", pip_lock.read_text(), re.M)[1]
    shutil.copyfile(HERE / "get_pip.py", cache / f"get_pip_{version.replace('.', '_')}.py")
    return home


def sanity(installed: SimpleNamespace, home: Path, log: str) -> None:
    """`ansible-test sanity` of installed's ansible-core on the installed collection, with no
    ignore file."""
    assert not (installed.root / "tests" / "sanity").exists()
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    env = dict(installed.env, HOME=str(home))
    text = run([installed.bin / "ansible-test", "sanity", "--python", python], cwd=installed.root,
               env=env, log=log, timeout=1800)
    assert "Running sanity test \"validate-modules\"" in text and "pylint" in text, text[-3000:]


def test_ansible_test_sanity_passes_with_no_ignore_file(collection):
    sanity(collection, _ansible_test_home(ANSIBLE_TEST_HOME, HERE / "ansible-test-pip.lock"),
           "collection-sanity.log")


def test_ansible_test_sanity_passes_on_the_lowest_ansible_core(lowest):
    home = MATRIX_CACHE / f"ansible-test-{_digest(LOWEST / 'requirements.lock')}"
    sanity(lowest, _ansible_test_home(home, LOWEST / "ansible-test-pip.lock"),
           "collection-sanity-lowest.log")


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


def consume(installed: SimpleNamespace, host: Host, team: str, log: str) -> None:
    """The consumer's playbook (CONSUMER_PLAYBOOK, from a directory outside the repository) with
    installed's Ansible and collections: a controller that serves a TeamSpace; then the
    collection's own playbook, which finds nothing to change."""
    play = installed.consumer / "platform.yml"
    play.write_text(CONSUMER_PLAYBOOK)
    inventory = str(host.inst.inventory)
    run([installed.bin / "ansible-playbook", "-i", inventory, play], cwd=installed.consumer,
        env=installed.env, log=f"{log}-consumer.log")
    assert host.sh("systemctl is-active cnpa-op.service").stdout.strip() == "active"
    # The roles' default layout (cnpa_layout=system): code under /opt/cnpa-op.
    assert host.sh("cat /opt/cnpa-op/reconcile.sh").stdout == (ROOT / "reconcile.sh").read_text()

    host.apply(teamspace(team, pods=3))
    quotas = wait_for(lambda: host.get("resourcequota", "-n", f"team-{team}")["items"],
                      timeout=60, what=f"the controller to create {team}'s namespace and quota")
    quota = quotas[0]
    assert quota["spec"]["hard"]["pods"] == "3"

    # The collection's own playbook after the consumer's roles: the same code, nothing to change.
    started = time.monotonic()
    text = run([installed.bin / "ansible-playbook", "-i", inventory, "labhub.cnpa.controller"],
               cwd=installed.consumer, env=installed.env, log=f"{log}-controller.log")
    assert recap(text, host.inst.name)["changed"] == 0, (time.monotonic() - started, text[-3000:])


def test_a_playbook_outside_the_repository_installs_a_serving_controller(collection, host):
    consume(collection, host, "consumer-team", "collection")


GROUP_PLAYBOOK = """---
- name: The collection's module_defaults group reaches its module and kubernetes.core's
  hosts: k3s
  gather_facts: false
  module_defaults:
    group/labhub.cnpa.k8s:
      kubeconfig: "{{ kubeconfig }}"
  roles:
    - role: labhub.cnpa.cnpa  # a kubernetes client on the target, as the other roles have it
  tasks:
    - name: Measure
      labhub.cnpa.cnpa_measure: {kind: Namespace, name: default, until: present, timeout: 20}
      register: measured
      ignore_errors: true
    - name: Read
      kubernetes.core.k8s_info: {kind: Namespace, name: default}
      register: read
      ignore_errors: true
    - name: Report
      delegate_to: localhost
      ansible.builtin.copy:
        dest: "{{ out }}"
        mode: "0644"
        content: "{{ {'measured': measured is failed, 'read': read is failed,
                      'messages': [measured.msg | default(''), read.msg | default('')]} | to_json }}"
"""


def test_the_action_group_gives_its_defaults_to_cnpa_measure_and_kubernetes_core(collection, host):
    """group/labhub.cnpa.k8s in a consumer's module_defaults: a kubeconfig that does not exist
    fails both modules (the host's own ~/.kube/config would have served them), the real one
    serves both."""
    assert host.sh("test -s /root/.kube/config", check=False).returncode == 0
    play = collection.consumer / "group.yml"
    play.write_text(GROUP_PLAYBOOK)
    outcome = {}
    for kubeconfig in ("/nonexistent/group-kubeconfig", "/etc/rancher/k3s/k3s.yaml"):
        out = collection.consumer / "group-outcome.json"
        out.unlink(missing_ok=True)
        run([collection.bin / "ansible-playbook", "-i", str(host.inst.inventory), play,
             "-e", f"kubeconfig={kubeconfig}", "-e", f"out={out}"], cwd=collection.consumer,
            env=collection.env, log="collection-group.log")
        outcome[kubeconfig] = json.loads(out.read_text())
    bad = outcome["/nonexistent/group-kubeconfig"]
    assert bad["measured"] and bad["read"], bad
    assert all("Invalid kube-config file" in m for m in bad["messages"]), bad
    good = outcome["/etc/rancher/k3s/k3s.yaml"]
    assert not good["measured"] and not good["read"], good


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
    gone_uid = json.loads(record)["uid"]
    # This archive already holds a record of another TeamSpace named gone (deleted under the
    # system layout by an earlier install): both records must survive the migration.
    other = '{"name":"gone","uid":"0f0f0f0f-0000-4000-8000-000000000001","pods":1}\n'
    host.sh("mkdir -p /var/lib/cnpa-op/archive && cat > /var/lib/cnpa-op/archive/gone.json",
            input_text=other)

    text = run([BIN / "ansible-playbook", "-i", inventory, "labhub.cnpa.controller"],
               cwd=collection.consumer, env=collection.env, log="collection-upgrade-current.log")
    assert recap(text, host.inst.name)["failed"] == 0

    # Nothing lost: the TeamSpace and what it owns, the archive record on disk and in the cluster.
    kept = host.get("teamspace", "kept")
    assert kept["metadata"]["uid"] == kept_uid
    assert host.get("resourcequota", "-n", "team-kept")["items"]
    # The previous release kept its archive under /root/cnpa-op (the lab's layout): the record is
    # there still, and copied to this release's archive, beside the other gone's record, as the
    # controller keeps an earlier record of a name (NAME.UID.json).
    assert host.sh("cat /root/cnpa-op/archive/gone.json").stdout == record
    assert host.sh("cat /var/lib/cnpa-op/archive/gone.json").stdout == other
    assert host.sh(f"cat /var/lib/cnpa-op/archive/gone.{gone_uid}.json").stdout == record
    # The previous release's code under /root/cnpa-op, which could still be run by hand against
    # the cluster, is gone; its archive stays (and crd.yaml, which runs nothing: the uninstall's).
    assert host.sh("ls /root/cnpa-op").stdout.split() == ["archive", "crd.yaml"], \
        host.sh("ls -la /root/cnpa-op").stdout
    assert [c["metadata"]["uid"] for c in host.get(
        "configmaps", "-n", "cnpa-system", "-l", "platform.labhub.io/archived-teamspace=gone")["items"]] \
        == [c["metadata"]["uid"] for c in in_cluster]
    # One controller, the new one, writing: it serves a TeamSpace made after the upgrade.
    assert host.sh("systemctl is-active cnpa-op.service").stdout.strip() == "active"
    pids = host.sh("pgrep -f -- '-m [c]npa_controller' || true").stdout.split()
    assert len(pids) == 1, pids
    # The code is one release, named by `current`, and the controller runs from that release's
    # directory itself (resolved when it started), not from the link.
    release = host.sh("readlink -f /opt/cnpa-op/current").stdout.strip()
    assert re.fullmatch(r"/opt/cnpa-op/releases/[0-9a-f]{16}", release), release
    assert host.sh(f"cat {release}/cnpa_controller/plan.py").stdout == \
        (ROOT / "cnpa_controller" / "plan.py").read_text()
    assert host.sh(f"readlink /proc/{pids[0]}/cwd").stdout.strip() == release
    assert host.sh("test -e /opt/cnpa-op/cnpa_controller", check=False).returncode != 0
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
                                   f"/var/lib/cnpa-op/archive/gone.{gone_uid}.json",
                                   "/var/lib/cnpa-op/archive/kept.json"]), left


def test_the_lowest_ansible_core_and_kubernetes_core_install_a_serving_controller(lowest,
                                                                                upgrade_host):
    """The consumer's install and the collection's playbook, as above, with the lowest Ansible and
    kubernetes.core: on the upgrade test's host once that test's uninstall has left nothing of the
    install (no third host), or on a fresh one when it runs alone."""
    host = upgrade_host
    installed = host.sh("systemctl cat cnpa-op.service >/dev/null 2>&1 && echo unit; "
                        "kubectl get crd teamspaces.platform.labhub.io >/dev/null 2>&1 && echo crd; "
                        "true").stdout.split()
    if installed:
        # The upgrade test stopped before its uninstall: this one's, with the lowest Ansible.
        text = run([lowest.bin / "ansible-playbook", "-i", str(host.inst.inventory),
                    "labhub.cnpa.uninstall", "-e", "cnpa_controller_delete_teamspaces=true"],
                   cwd=lowest.consumer, env=lowest.env, log="collection-lowest-uninstall.log")
        assert recap(text, host.inst.name)["failed"] == 0, text[-3000:]
    consume(lowest, host, "lowest-team", "collection-lowest")
