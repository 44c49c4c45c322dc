"""playbooks/uninstall.yml on a real host, after playbooks/controller.yml.

What uninstall promises (docs/install.md): while TeamSpaces exist it changes nothing without
cnpa_controller_delete_teamspaces=true; with it, every TeamSpace is archived (reconcile.sh's own
record) before it goes, a TeamSpace held by another finalizer is named and keeps that finalizer,
and at the end nothing of the project is left (API objects, Events, files, units) but the archive
and what is not ours (a namespace team-<n> it did not make); a second run changes nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass

import pytest
from hostlib import ROOT, wait_for

import fixtures

GROUP = "platform.labhub.io"
TS = f"teamspaces.{GROUP}"
FIN = f"{GROUP}/cleanup"
# controller.yml's layout (cnpa_layout=system): code, then records, each in a directory of its own.
BASE = "/opt/cnpa-op"
RECORDS = "/var/lib/cnpa-op"
ARCHIVE = f"{RECORDS}/archive"
OURS = "app.kubernetes.io/managed-by=cnpa-op"
CONFIRM = "cnpa_controller_delete_teamspaces=true"
# Everything an install puts on the host outside the archive (uninstall must remove all of it).
FILES = [f"{BASE}/reconcile.sh", f"{BASE}/releases", f"{BASE}/current", f"{BASE}/cnpa_controller",
         f"{BASE}/crd.yaml",
         "/etc/cnpa-op",
         "/etc/systemd/system/cnpa-op.service", "/etc/systemd/system/cnpa-op-token.service",
         "/etc/systemd/system/cnpa-op-token.timer", "/run/cnpa-op", "/var/cache/cnpa-op",
         "/opt/cnpa-op"]
POLICIES = ["namespaces", "quotas", "teamspaces", "leases", "archive-records", "namespace-owners",
            "teamspace-deletion"]
OBJECTS = [f"crd/{TS}", "clusterrole/cnpa-op", "clusterrole/cnpa-teamspaces-view",
           "clusterrole/cnpa-teamspaces-edit", "clusterrole/cnpa-teamspaces-admin",
           "clusterrolebinding/cnpa-op", "namespace/cnpa-system",
           *[f"{kind}/cnpa-op-{name}" for name in POLICIES
             for kind in ("validatingadmissionpolicy", "validatingadmissionpolicybinding")]]
NAMESPACED = ["-n", "default", "role/cnpa-op-events", "rolebinding/cnpa-op-events"]
# watch mode's (playbooks/controller.yml): the Lease and the Role/RoleBinding that let it be held.
LEASE_OBJECTS = ["-n", "cnpa-system", "role/cnpa-op-lease", "rolebinding/cnpa-op-lease",
                 "lease.coordination.k8s.io/cnpa-op"]


@dataclass
class Run:
    rc: int
    out: dict | None
    stderr: str
    host: str

    @property
    def stats(self) -> dict:
        return (self.out or {}).get("stats", {}).get(self.host, {})

    def tasks(self, flag: str) -> list[str]:
        return [f"{t['task']['name']}: {t['hosts'][self.host].get('msg', '')}"
                for p in (self.out or {}).get("plays", []) for t in p["tasks"]
                if t["hosts"].get(self.host, {}).get(flag)]

    def __str__(self) -> str:
        return (f"exit {self.rc}, stats {self.stats}, failed {self.tasks('failed')}, "
                f"changed {self.tasks('changed')}, stderr {self.stderr[-2000:]}")


def play(host, playbook: str, *extra: str) -> Run:
    # One JSON document on stdout; not the timing callbacks of ansible.cfg, which print there too.
    env = dict(os.environ, PATH=f"{ROOT / '.venv/bin'}:/usr/bin:/bin",
               ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_CALLBACKS_ENABLED="ansible.posix.json", ANSIBLE_FORCE_COLOR="0")
    proc = subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(host.inst.inventory),
                           str(ROOT / "playbooks" / playbook), *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    out = json.loads(proc.stdout) if proc.stdout.startswith("{") else None
    return Run(proc.returncode, out, proc.stderr + ("" if out else proc.stdout), host.inst.name)


def install(host) -> None:
    # With the client in the role's virtualenv (as on Debian 12), so that the uninstall must remove
    # that too; the test host's own python3-kubernetes would do.
    run = play(host, "controller.yml", "-e", "cnpa_python_client_source=venv")
    assert run.rc == 0, str(run)


def teamspace(host, name: str, pods: int = 2, **meta) -> dict:
    host.apply(fixtures.teamspace(name, pods, **meta))
    return host.get(TS, name)


def served(host, name: str) -> bool:
    t = host.get(TS, name)
    return (t.get("status", {}).get("namespace") == f"team-{name}"
            and FIN in t["metadata"].get("finalizers", []))


def events_ours(host) -> list[str]:
    return host.kubectl("get", "events", "-A", "-l", OURS, "-o", "name").stdout.split()


def leftovers(host) -> list[str]:
    """Everything of the project still on the host, but the archive."""
    left = [f for f in FILES if host.sh(f"test -e {f}", check=False).returncode == 0]
    left += host.kubectl("get", "--ignore-not-found", "-o", "name", *OBJECTS).stdout.split()
    left += host.kubectl("get", "--ignore-not-found", "-o", "name", *NAMESPACED).stdout.split()
    left += host.kubectl("get", "--ignore-not-found", "-o", "name", *LEASE_OBJECTS).stdout.split()
    left += host.kubectl("get", "--ignore-not-found", "-o", "name", "-n", "cnpa-system",
                         "serviceaccount/cnpa-op").stdout.split()
    # Anything labelled ours, of any kind the server lists, in any namespace.
    kinds = host.sh("kubectl api-resources --verbs=list -o name | paste -s -d, -").stdout.strip()
    left += host.kubectl("get", kinds, "-A", "-l", OURS, "-o", "name").stdout.split()
    units = host.sh("systemctl list-unit-files --no-legend 'cnpa-op*'; "
                    "systemctl list-units --all --no-legend 'cnpa-op*'").stdout.split("\n")
    left += [u for u in units if u.strip()]
    return left


def archived(host, name: str) -> dict | None:
    proc = host.sh(f"cat {ARCHIVE}/{name}.json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def admin_writes(host, since: str) -> list[str]:
    """Write requests the admin (Ansible) made at or after an RFC 3339 time (audit log)."""
    return [f"{e['verb']} {e.get('objectRef', {}).get('resource')}/{e.get('objectRef', {}).get('name')}"
            for e in host.audit_lines()
            if e.get("user", {}).get("username") == "admin"
            and e.get("verb") in ("create", "update", "patch", "delete", "deletecollection")
            and e.get("stage", "ResponseComplete") == "ResponseComplete"
            and e.get("requestReceivedTimestamp", "") >= since]


@pytest.fixture(scope="module")
def installed(host):
    """The controller installed once for this module (an install costs a minute or more); each
    test installs again only what an earlier one removed (controller.yml is idempotent)."""
    install(host)
    yield host
    # Leave the session's host without the project for the other tests, whatever happened here.
    if host.exists("crd", TS):
        for t in host.get(TS)["items"]:
            if "example.io/hold" in t["metadata"].get("finalizers", []):
                host.kubectl("patch", TS, t["metadata"]["name"], "--type=merge",
                             "-p", json.dumps({"metadata": {"finalizers": [FIN]}}))
    if leftovers(host) or host.sh(f"test -e {BASE} -o -e {RECORDS}", check=False).returncode == 0:
        play(host, "uninstall.yml", "-e", CONFIRM, "-e", "cnpa_reconciler_keep_records=false")
    host.kubectl("delete", "namespace", "team-ib-squat", "--ignore-not-found", "--wait=false")


def test_uninstall_changes_nothing_while_teamspaces_exist_without_confirmation(installed):
    host = installed
    a, b = teamspace(host, "ib-keep-a"), teamspace(host, "ib-keep-b")
    wait_for(lambda: served(host, "ib-keep-a") and served(host, "ib-keep-b"), timeout=60,
             what="both TeamSpaces served")
    files = host.sh(f"find {BASE} {RECORDS} /etc/cnpa-op /etc/systemd/system -name 'cnpa*'"
                    " -o -path '*cnpa-op*' | sort | xargs stat -c '%n %Y %s'").stdout
    # To the microsecond, as the audit log's timestamps: the watch controller serves both
    # TeamSpaces within the second they were created in, and those creates are not the run's.
    since = host.sh("date -u +%Y-%m-%dT%H:%M:%S.%6NZ").stdout.strip()

    run = play(host, "uninstall.yml")

    assert run.rc != 0, str(run)
    message = " ".join(run.tasks("failed"))
    assert "ib-keep-a" in message and "ib-keep-b" in message
    assert "cnpa_controller_delete_teamspaces" in message
    assert run.stats.get("changed") == 0, str(run)
    # Nothing was written to the API server by the run, and nothing of the install moved.
    assert admin_writes(host, since) == []
    assert host.get(TS, "ib-keep-a")["metadata"]["uid"] == a["metadata"]["uid"]
    assert host.get(TS, "ib-keep-b")["metadata"]["uid"] == b["metadata"]["uid"]
    assert host.sh("systemctl is-active cnpa-op").stdout.strip() == "active"
    assert host.sh(f"find {BASE} {RECORDS} /etc/cnpa-op /etc/systemd/system -name 'cnpa*'"
                   " -o -path '*cnpa-op*' | sort | xargs stat -c '%n %Y %s'").stdout == files
    assert leftovers(host)  # still installed


def test_uninstall_archives_releases_and_leaves_nothing(installed):
    host = installed
    if not host.exists("crd", TS):
        install(host)
    # One TeamSpace with data in its namespace; one whose namespace is not ours (made before it,
    # so the controller refuses it and records an Event); one held by another finalizer too.
    data = teamspace(host, "ib-data")
    host.kubectl("create", "namespace", "team-ib-squat")
    host.kubectl("create", "configmap", "precious", "-n", "team-ib-squat", "--from-literal=k=v")
    squat = teamspace(host, "ib-squat")
    held = teamspace(host, "ib-held", finalizers=["example.io/hold"])
    wait_for(lambda: served(host, "ib-data") and served(host, "ib-held"), timeout=60,
             what="the TeamSpaces served")
    host.kubectl("create", "configmap", "data", "-n", "team-ib-data", "--from-literal=k=v")
    wait_for(lambda: events_ours(host), timeout=60, what="the controller's Event on ib-squat")
    uids = {t["metadata"]["name"]: t["metadata"]["uid"] for t in (data, squat, held)}

    # Another finalizer holds ib-held: the run archives and releases it, keeps that finalizer,
    # names it, and stops before removing the API.
    run = play(host, "uninstall.yml", "-e", CONFIRM)
    assert run.rc != 0, str(run)
    message = " ".join(run.tasks("failed"))
    assert "ib-held" in message and "example.io/hold" in message, message
    still = host.get(TS, "ib-held")
    assert still["metadata"]["deletionTimestamp"]
    assert still["metadata"]["finalizers"] == ["example.io/hold"]
    assert not host.exists(TS, "ib-data") and not host.exists(TS, "ib-squat")
    assert host.exists("crd", TS)

    # Whoever set it removes it; the next run finishes the job.
    host.kubectl("patch", TS, "ib-held", "--type=json",
                 "-p", json.dumps([{"op": "remove", "path": "/metadata/finalizers/0"}]))
    run = play(host, "uninstall.yml", "-e", CONFIRM)
    assert run.rc == 0, str(run)

    # A record per deleted TeamSpace, in reconcile.sh's format, kept by default.
    for name, uid in uids.items():
        assert archived(host, name) == {"name": name, "uid": uid,
                                        "pods": 2}, host.sh(f"ls -la {ARCHIVE}").stdout
    # Their namespaces went with them (the data too: that is what the confirmation is for); the
    # namespace that was never ours stays, with its data.
    wait_for(lambda: not host.exists("namespace", "team-ib-data"), timeout=60, what="team-ib-data gone")
    assert host.get("configmap", "precious", "-n", "team-ib-squat")["data"] == {"k": "v"}
    assert leftovers(host) == []
    assert events_ours(host) == []
    assert host.sh(f"test -e {BASE}", check=False).returncode != 0
    assert host.sh(f"ls {RECORDS}").stdout.split() == ["archive"]

    # Asked to, the archive goes too, and its directory with it; then a run changes nothing
    # (and does not make the directory again).
    drop = ("-e", CONFIRM, "-e", "cnpa_reconciler_keep_records=false")
    run = play(host, "uninstall.yml", *drop)
    assert run.rc == 0 and run.stats.get("changed", 0) > 0, str(run)
    assert host.sh(f"test -e {RECORDS}", check=False).returncode != 0
    again = play(host, "uninstall.yml", *drop)
    assert again.rc == 0 and again.stats.get("changed") == 0, str(again)
    assert leftovers(host) == [] and host.sh(f"test -e {BASE} -o -e {RECORDS}", check=False).returncode != 0


def test_uninstall_keeps_the_records_in_the_cluster_unless_asked(installed):
    """The watch controller keeps every archive record also as ConfigMap archive-UID in
    cnpa-system (cnpa_controller_archive_configmaps): records, so kept by default, with the
    namespace holding them; a second run then changes nothing; keep_records=false removes them."""
    host = installed
    if not host.exists("crd", TS):
        install(host)
    gone = teamspace(host, "ib-gone")
    uid = gone["metadata"]["uid"]
    wait_for(lambda: served(host, "ib-gone"), timeout=60, what="ib-gone served")
    host.kubectl("delete", TS, "ib-gone", "--wait=true", "--timeout=60s")
    record = host.get("configmap", f"archive-{uid}", "-n", "cnpa-system")
    assert record["metadata"]["labels"]["platform.labhub.io/archived-teamspace"] == "ib-gone"
    assert json.loads(record["data"]["ib-gone.json"]) == {"name": "ib-gone", "uid": uid, "pods": 2}

    run = play(host, "uninstall.yml", "-e", CONFIRM)
    assert run.rc == 0, str(run)
    assert set(leftovers(host)) == {"namespace/cnpa-system", f"configmap/archive-{uid}"}
    assert "archive records" in json.dumps(run.out), str(run)
    again = play(host, "uninstall.yml", "-e", CONFIRM)
    assert again.rc == 0 and again.stats.get("changed") == 0, str(again)

    run = play(host, "uninstall.yml", "-e", CONFIRM, "-e", "cnpa_reconciler_keep_records=false")
    assert run.rc == 0, str(run)
    assert leftovers(host) == [] and host.sh(f"test -e {BASE} -o -e {RECORDS}", check=False).returncode != 0
