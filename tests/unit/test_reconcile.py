"""reconcile.sh against a fake kubectl: desired state, zero writes when converged, finalizers.

These run the real script with bash and jq; only kubectl is replaced (tests/unit/fake_kubectl.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "reconcile.sh"
FAKE = Path(__file__).with_name("fake_kubectl.py")
FIN = "platform.labhub.io/cleanup"
LABEL = "platform.labhub.io/teamspace"
TS = "teamspaces.v1alpha1.platform.labhub.io"

pytestmark = pytest.mark.skipif(not (shutil.which("bash") and shutil.which("jq")),
                                reason="reconcile.sh needs bash and jq")


def teamspace(name, uid, pods=4, cpu="1", gen=1, finalizers=None, deleting=False, status=None):
    meta = {"name": name, "uid": uid, "generation": gen, "resourceVersion": "1"}
    if finalizers is not None:
        meta["finalizers"] = finalizers
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    obj = {"apiVersion": "platform.labhub.io/v1alpha1", "kind": "TeamSpace", "metadata": meta,
           "spec": {"pods": pods, "cpu": cpu}}
    if status is not None:
        obj["status"] = status
    return obj


class Cluster:
    def __init__(self, tmp: Path, teamspaces, namespaces=(), quotas=()):
        self.tmp = tmp
        self.state_file = tmp / "state.json"
        self.log_file = tmp / "requests.log"
        self.archive = tmp / "base" / "archive"
        self.state_file.write_text(json.dumps({
            "teamspaces": {t["metadata"]["name"]: t for t in teamspaces},
            "namespaces": {n["metadata"]["name"]: n for n in namespaces},
            "quotas": {q["metadata"]["namespace"]: q for q in quotas},
        }))

    @property
    def state(self):
        return json.loads(self.state_file.read_text())

    def requests(self):
        if not self.log_file.exists():
            return []
        return [json.loads(line) for line in self.log_file.read_text().splitlines()]

    def writes(self):
        return [r for r in self.requests() if r["verb"] != "list"]

    def object_writes(self):
        """Writes other than Events (which record problems and reverted edits)."""
        return [w for w in self.writes() if w["resource"] != "events"]

    def calls(self):
        """kubectl processes of the last run, as "VERB TYPE"."""
        return (self.tmp / "calls.log").read_text().splitlines()

    def save(self, state):
        self.state_file.write_text(json.dumps(state))

    def run(self, *args, **env_extra):
        self.log_file.unlink(missing_ok=True)
        (self.tmp / "calls.log").unlink(missing_ok=True)
        env = dict(os.environ, KUBECTL=str(FAKE), FAKE_KUBE_STATE=str(self.state_file),
                   FAKE_KUBE_LOG=str(self.log_file), CNPA_BASE_DIR=str(self.tmp / "base"),
                   FAKE_KUBE_CALLS=str(self.tmp / "calls.log"),
                   CNPA_LOCK_FILE=str(self.tmp / "pass.lock"))
        env.update(env_extra)
        return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True,
                              timeout=60, check=False)


def test_one_pass_builds_namespace_quota_status_and_finalizer(tmp_path):
    c = Cluster(tmp_path, [teamspace("alpha", "u-a", pods=4, gen=3)])
    res = c.run()
    assert res.returncode == 0, res.stderr
    st = c.state
    ns = st["namespaces"]["team-alpha"]
    assert ns["metadata"]["labels"] == {LABEL: "alpha"}
    assert ns["metadata"]["ownerReferences"] == [{
        "apiVersion": "platform.labhub.io/v1alpha1", "kind": "TeamSpace", "name": "alpha",
        "uid": "u-a", "controller": True, "blockOwnerDeletion": True}]
    assert st["quotas"]["team-alpha"]["spec"]["hard"] == {"pods": "4", "requests.cpu": "1"}
    ts = st["teamspaces"]["alpha"]
    [ready] = ts["status"].pop("conditions")
    assert ts["status"] == {"observedGeneration": 3, "namespace": "team-alpha",
                            "namespaceUID": ns["metadata"]["uid"]}
    assert (ready["type"], ready["status"], ready["reason"], ready["observedGeneration"]) == \
        ("Ready", "True", "Reconciled", 3)
    assert ts["metadata"]["finalizers"] == [FIN]
    # status went through the subresource, never the main endpoint
    assert {"verb": "update", "resource": f"{TS}/status",
            "name": "alpha"} in c.requests()


def test_second_pass_writes_nothing_and_lists_a_constant_number_of_times(tmp_path):
    c = Cluster(tmp_path, [teamspace(f"t{i}", f"u{i}", pods=i + 1) for i in range(6)])
    assert c.run().returncode == 0
    assert len(c.writes()) == 6 * 4
    res = c.run()
    assert res.returncode == 0, res.stderr
    assert c.writes() == []
    assert [r["verb"] for r in c.requests()] == ["list", "list", "list"]


@pytest.mark.parametrize("spec_cpu,quota_cpu", [("0.5", "500m"), ("1", "1000m"), ("2", "2"),
                                                 ("1500m", "1.5"), ("1k", "1000")])
def test_quantities_compare_canonically(tmp_path, spec_cpu, quota_cpu):
    ns = {"metadata": {"name": "team-a", "labels": {LABEL: "a"}, "resourceVersion": "1",
                       "ownerReferences": [{"apiVersion": "platform.labhub.io/v1alpha1",
                                            "kind": "TeamSpace", "name": "a", "uid": "u",
                                            "controller": True, "blockOwnerDeletion": True}]}}
    q = {"metadata": {"name": "team-quota", "namespace": "team-a", "resourceVersion": "1"},
         "spec": {"hard": {"pods": "4", "requests.cpu": quota_cpu}}}
    t = teamspace("a", "u", cpu=spec_cpu, finalizers=[FIN])
    c = Cluster(tmp_path, [t], [ns], [q])
    res = c.run()
    assert res.returncode == 0, res.stderr
    # The first pass records status (Ready, the namespace's uid); the quota is left alone.
    assert [w["resource"] for w in c.writes()] == [f"{TS}/status"]
    assert c.run().returncode == 0 and c.writes() == []


def test_drifted_quota_is_set_back_and_extra_limits_removed(tmp_path):
    c = Cluster(tmp_path, [teamspace("a", "u", pods=6)])
    c.run()
    st = c.state
    st["quotas"]["team-a"]["spec"]["hard"] = {"pods": "99", "requests.cpu": "1", "secrets": "3"}
    c.state_file.write_text(json.dumps(st))
    assert c.run().returncode == 0
    assert c.state["quotas"]["team-a"]["spec"]["hard"] == {"pods": "6", "requests.cpu": "1"}
    assert [w["resource"] for w in c.writes()] == ["resourcequotas", "events"]


def test_deleted_quota_is_recreated_with_a_new_uid(tmp_path):
    c = Cluster(tmp_path, [teamspace("a", "u")])
    c.run()
    st = c.state
    old_uid = st["quotas"].pop("team-a")["metadata"]["uid"]
    c.state_file.write_text(json.dumps(st))
    assert c.run().returncode == 0
    assert c.state["quotas"]["team-a"]["metadata"]["uid"] != old_uid


def test_foreign_finalizers_are_kept(tmp_path):
    c = Cluster(tmp_path, [teamspace("a", "u", finalizers=["example.com/other"])])
    assert c.run().returncode == 0
    assert c.state["teamspaces"]["a"]["metadata"]["finalizers"] == ["example.com/other", FIN]
    c.run()
    assert c.state["teamspaces"]["a"]["metadata"]["finalizers"] == ["example.com/other", FIN]


def test_deletion_archives_then_releases_only_our_finalizer(tmp_path):
    t = teamspace("beta", "u-b", pods=2, finalizers=["example.com/other", FIN], deleting=True)
    c = Cluster(tmp_path, [t])
    res = c.run()
    assert res.returncode == 0, res.stderr
    record = json.loads((c.archive / "beta.json").read_text())
    assert record == {"name": "beta", "uid": "u-b", "pods": 2}
    assert c.state["teamspaces"]["beta"]["metadata"]["finalizers"] == ["example.com/other"]
    assert not list(c.archive.glob(".*"))  # no temporary file left behind
    # no namespace is created for a TeamSpace being deleted
    assert c.state["namespaces"] == {}


def test_a_killed_pass_leaves_no_temporary_file_behind_the_next(tmp_path):
    """Temporary files of a pass killed between mktemp and mv, of this name and of others, are
    swept by the next pass that archives; the records beside them stay."""
    c = Cluster(tmp_path, [teamspace("beta", "u-b", finalizers=[FIN], deleting=True)])
    c.archive.mkdir(parents=True)
    for left in (".beta.json.Ab12cd", ".gone.json.Xy34ef"):
        (c.archive / left).write_text("torn")
    (c.archive / "gone.json").write_text('{"name":"gone","uid":"u-g","pods":1}\n')
    assert c.run().returncode == 0
    assert sorted(p.name for p in c.archive.iterdir()) == ["beta.json", "gone.json"]


def test_deletion_completes_when_ours_is_the_last_finalizer(tmp_path):
    c = Cluster(tmp_path, [teamspace("beta", "u-b", finalizers=[FIN], deleting=True)])
    assert c.run().returncode == 0
    assert "beta" not in c.state["teamspaces"]


def test_finalizer_stays_when_archive_cannot_be_written(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    c = Cluster(tmp_path, [teamspace("beta", "u-b", finalizers=[FIN], deleting=True)])
    res = c.run(CNPA_ARCHIVE_DIR=str(blocker / "archive"))
    assert res.returncode == 4  # the directory is missing and cannot be made
    assert "TeamSpace beta: archive directory" in res.stderr
    assert c.state["teamspaces"]["beta"]["metadata"]["finalizers"] == [FIN]
    assert c.object_writes() == []


def test_one_bad_teamspace_does_not_stop_the_others(tmp_path):
    foreign = {"metadata": {"name": "team-x", "resourceVersion": "1"}}
    c = Cluster(tmp_path, [teamspace("bad.dot", "u1"), teamspace("cpu", "u2", cpu="abc"),
                           teamspace("x", "u3"), teamspace("good", "u4")], [foreign])
    res = c.run()
    assert res.returncode == 1
    for name in ("bad.dot", "cpu", "x"):
        assert f"TeamSpace {name}:" in res.stderr
    st = c.state
    assert st["teamspaces"]["good"]["status"]["namespace"] == "team-good"
    assert "team-good" in st["quotas"]
    assert st["namespaces"]["team-x"] == foreign  # not adopted, not modified
    # Never claims what is not in place: Ready False, no observedGeneration.
    x = st["teamspaces"]["x"]
    assert "observedGeneration" not in x["status"]
    [ready] = x["status"]["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", "NamespaceNotOurs")
    # Every live TeamSpace carries our finalizer, valid or not.
    assert all(t["metadata"]["finalizers"] == [FIN] for t in st["teamspaces"].values())


def test_unreachable_api_fails_fast_without_writes(tmp_path):
    c = Cluster(tmp_path, [teamspace("a", "u")])
    res = c.run(FAKE_KUBE_DOWN="1")
    assert res.returncode == 2
    assert "API server unreachable" in res.stderr
    assert c.writes() == []


def test_status_follows_the_generation_in_place(tmp_path):
    c = Cluster(tmp_path, [teamspace("a", "u", pods=4, gen=1)])
    c.run()
    st = c.state
    st["teamspaces"]["a"]["spec"]["pods"] = 8
    st["teamspaces"]["a"]["metadata"]["generation"] = 2
    c.state_file.write_text(json.dumps(st))
    c.run()
    st = c.state
    assert st["quotas"]["team-a"]["spec"]["hard"]["pods"] == "8"
    assert st["teamspaces"]["a"]["status"]["observedGeneration"] == 2


def _owned_ns(name, uid, refs=None):
    ref = {"apiVersion": "platform.labhub.io/v1alpha1", "kind": "TeamSpace", "name": name,
           "uid": uid, "controller": True, "blockOwnerDeletion": True}
    return {"metadata": {"name": f"team-{name}", "labels": {LABEL: name}, "resourceVersion": "1",
                         "ownerReferences": [ref] if refs is None else refs}}


def test_namespace_of_an_earlier_teamspace_is_not_adopted(tmp_path):
    # Same name, new uid: the old namespace belongs to the deleted TeamSpace; wait for the GC.
    c = Cluster(tmp_path, [teamspace("a", "new-uid")], [_owned_ns("a", "old-uid")])
    res = c.run()
    assert res.returncode == 1
    assert "TeamSpace a:" in res.stderr and "old-uid" in res.stderr
    assert [w["resource"] for w in c.object_writes()] == [TS, f"{TS}/status"]  # finalizer, Ready
    assert [e["reason"] for e in c.state["events"].values()] == ["NamespaceOwnedByOther"]
    assert c.state["namespaces"]["team-a"]["metadata"]["ownerReferences"][0]["uid"] == "old-uid"


def test_removed_owner_reference_is_restored_keeping_other_owners(tmp_path):
    other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "cm"}
    ns = _owned_ns("a", "u", refs=[other])
    ns["metadata"]["uid"] = "ns-uid"
    # Restored only because the status records this namespace as the one made for it.
    t = teamspace("a", "u", status={"namespaceUID": "ns-uid"})
    c = Cluster(tmp_path, [t], [ns])
    res = c.run()
    assert res.returncode == 0, res.stderr
    assert "teamspace a: namespace team-a ownerReference restored" in res.stdout
    refs = c.state["namespaces"]["team-a"]["metadata"]["ownerReferences"]
    assert refs[0] == other and refs[1]["uid"] == "u" and refs[1]["controller"] is True
    assert c.run().returncode == 0 and c.writes() == []


def _events(c):
    return sorted(c.state.get("events", {}).values(), key=lambda e: e["reason"])


def test_problems_become_one_event_each_on_the_teamspace_and_are_not_repeated(tmp_path):
    foreign = {"metadata": {"name": "team-x", "resourceVersion": "1"}}
    c = Cluster(tmp_path, [teamspace("bad.dot", "u1"), teamspace("cpu", "u2", cpu="abc"),
                           teamspace("x", "u3"), teamspace("good", "u4")], [foreign])
    res = c.run()
    assert res.returncode == 1
    assert "team-x already exists and is not managed by cnpa-op" in res.stderr
    assert "TeamSpace good" not in res.stderr  # each error belongs to its own TeamSpace
    evs = _events(c)
    assert [(e["reason"], e["involvedObject"]["name"], e["involvedObject"]["uid"], e["type"])
            for e in evs] == [("InvalidCPU", "cpu", "u2", "Warning"),
                              ("InvalidName", "bad.dot", "u1", "Warning"),
                              ("NamespaceNotOurs", "x", "u3", "Warning")]
    for e in evs:
        assert e["metadata"]["namespace"] == "default"
        assert e["involvedObject"]["kind"] == "TeamSpace"
        assert e["message"] and not e["message"].startswith("reconcile:")
    assert "not managed by cnpa-op" in evs[2]["message"]
    # The same problems on the next pass: logged again, but no new Event (bounded), and no
    # status write (Ready False is already there). (x's create is retried and fails again: the
    # fake logs only writes that succeed.)
    res = c.run()
    assert res.returncode == 1 and "TeamSpace cpu:" in res.stderr
    assert len(_events(c)) == 3
    assert c.writes() == []
    # Fixed input converges and then passes are write-free (no Event list either).
    st = c.state
    st["teamspaces"]["cpu"]["spec"]["cpu"] = "250m"
    del st["teamspaces"]["bad.dot"]
    del st["namespaces"]["team-x"]
    c.state_file.write_text(json.dumps(st))
    assert c.run().returncode == 0
    assert c.state["quotas"]["team-cpu"]["spec"]["hard"]["requests.cpu"] == "250m"
    assert c.state["namespaces"]["team-x"]["metadata"]["ownerReferences"][0]["uid"] == "u3"
    assert c.run().returncode == 0
    assert [r["verb"] for r in c.requests()] == ["list", "list", "list"]


def test_archive_failure_is_an_event(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    c = Cluster(tmp_path, [teamspace("beta", "u-b", finalizers=[FIN], deleting=True)])
    c.run(CNPA_ARCHIVE_DIR=str(blocker / "archive"))
    [ev] = _events(c)
    assert ev["reason"] == "ArchiveFailed" and "keeping the finalizer" in ev["message"]


def test_junk_quota_is_set_back_and_the_revert_is_an_event(tmp_path):
    c = Cluster(tmp_path, [teamspace("a", "u", pods=6)])
    c.run()
    st = c.state
    st["quotas"]["team-a"]["spec"] = {"hard": {"pods": "1000", "requests.memory": "1Ti"}}
    c.state_file.write_text(json.dumps(st))
    res = c.run()
    assert res.returncode == 0, res.stderr
    assert c.state["quotas"]["team-a"]["spec"] == {"hard": {"pods": "6", "requests.cpu": "1"}}
    assert res.stdout.splitlines()[0] == (
        'teamspace a: quota team-quota set back to {"pods":"6","requests.cpu":"1"} '
        '(was {"pods":"1000","requests.memory":"1Ti"})')
    [ev] = _events(c)
    assert (ev["type"], ev["reason"]) == ("Normal", "QuotaReverted")
    assert "1Ti" in ev["message"]
    assert c.run().returncode == 0 and c.writes() == []


def test_scoped_quota_is_reported_not_patched(tmp_path):
    # Scopes are immutable in the API: the only fix is to delete the quota (the user's call).
    c = Cluster(tmp_path, [teamspace("a", "u", pods=6)])
    c.run()
    st = c.state
    st["quotas"]["team-a"]["spec"] = {"hard": {"pods": "6", "requests.cpu": "1"},
                                      "scopes": ["NotBestEffort"]}
    c.state_file.write_text(json.dumps(st))
    res = c.run()
    assert res.returncode == 1 and "delete it and it is recreated" in res.stderr
    assert [w["resource"] for w in c.object_writes()] == [f"{TS}/status"]  # Ready False
    assert [e["reason"] for e in _events(c)] == ["QuotaScoped"]
    st = c.state
    del st["quotas"]["team-a"]
    c.state_file.write_text(json.dumps(st))
    assert c.run().returncode == 0
    assert c.state["quotas"]["team-a"]["spec"] == {"hard": {"pods": "6", "requests.cpu": "1"}}


def test_duplicate_of_our_finalizer_is_removed_others_kept(tmp_path):
    t = teamspace("a", "u", finalizers=[FIN, "example.com/other", FIN])
    c = Cluster(tmp_path, [t])
    assert c.run().returncode == 0
    assert c.state["teamspaces"]["a"]["metadata"]["finalizers"] == [FIN, "example.com/other"]
    assert c.run().returncode == 0 and c.writes() == []


def test_finalizer_is_appended_without_a_version_guard_once_a_list_exists(tmp_path):
    # A stale resourceVersion (another client wrote meanwhile) must not stop the append.
    t = teamspace("a", "u", finalizers=["example.com/other"])
    t["metadata"]["resourceVersion"] = "stale"
    c = Cluster(tmp_path, [t])
    assert c.run().returncode == 0
    assert c.state["teamspaces"]["a"]["metadata"]["finalizers"] == ["example.com/other", FIN]


def test_writes_of_one_kind_share_one_kubectl_process_whatever_the_number(tmp_path):
    c = Cluster(tmp_path, [teamspace(f"t{i}", f"u{i}", pods=i + 1) for i in range(25)]
                + [teamspace("other", "uo", finalizers=["example.com/other"])])
    res = c.run(CNPA_WRITE_WORKERS="1")
    assert res.returncode == 0, res.stderr
    assert len(c.object_writes()) == 26 * 4
    assert len(res.stdout.splitlines()) == 26 * 4  # one line per write
    # 3 lists; finalizers: one patch creating the list, one appending to an existing one;
    # one create of all namespaces, one of all quotas, one replace of all statuses.
    assert sorted(c.calls()) == sorted([f"get {TS}", "get namespaces", "get resourcequotas",
                                        "patch", "patch", "create", "create",
                                        "replace"])
    assert all(t["metadata"]["finalizers"][-1] == FIN and t["status"]["observedGeneration"] == 1
               for t in c.state["teamspaces"].values())
    assert c.state["teamspaces"]["other"]["metadata"]["finalizers"] == ["example.com/other", FIN]


def test_a_large_group_of_writes_goes_out_from_several_kubectl_processes_each_object_once(tmp_path):
    c = Cluster(tmp_path, [teamspace(f"t{i}", f"u{i}", pods=i + 1) for i in range(60)])
    res = c.run(CNPA_WRITE_WORKERS="2")
    assert res.returncode == 0, res.stderr
    assert len(c.object_writes()) == 60 * 4
    assert sorted(res.stdout.splitlines()) == sorted(set(res.stdout.splitlines()))
    # 60 writes of a kind, more than 25: two Lists of 30 (at most CNPA_WRITE_WORKERS at once).
    assert sorted(c.calls()) == sorted([f"get {TS}", "get namespaces", "get resourcequotas",
                                        *["patch", "create", "create", "replace"] * 2])
    assert sorted(c.state["namespaces"]) == sorted(f"team-t{i}" for i in range(60))
    assert all(c.state["quotas"][f"team-t{i}"]["spec"]["hard"]["pods"] == str(i + 1)
               for i in range(60))
    assert c.run().returncode == 0 and c.object_writes() == []


def test_a_failure_inside_one_of_several_lists_belongs_to_its_teamspace_alone(tmp_path):
    foreign = {"metadata": {"name": "team-t17", "resourceVersion": "1"}}
    c = Cluster(tmp_path, [teamspace(f"t{i}", f"u{i}") for i in range(60)], [foreign])
    res = c.run(CNPA_WRITE_WORKERS="3")
    assert res.returncode == 1
    assert [line for line in res.stderr.splitlines() if line.startswith("reconcile: TeamSpace")] == [
        "reconcile: TeamSpace t17: namespace team-t17 already exists and is not managed by cnpa-op"
        f" (no {LABEL}=t17 label); not adopting or modifying it - delete or rename it"]
    assert c.state["namespaces"]["team-t17"] == foreign
    assert sorted(c.state["quotas"]) == sorted(f"team-t{i}" for i in range(60) if i != 17)
    assert [e["reason"] for e in c.state["events"].values()] == ["NamespaceNotOurs"]


@pytest.mark.parametrize("env", [{"CNPA_WRITE_WORKERS": "0"}, {"CNPA_WRITE_WORKERS": "x"},
                                 {"CNPA_PASS_DEADLINE": "-1"}])
def test_bad_settings_are_refused_before_anything_is_read(tmp_path, env):
    c = Cluster(tmp_path, [teamspace("a", "u")])
    res = c.run(**env)
    assert res.returncode == 3 and "CNPA_" in res.stderr
    assert not (tmp_path / "calls.log").exists()


def test_a_finalizer_list_added_meanwhile_is_not_replaced(tmp_path):
    # The pass read no finalizers; another client adds one before our patch arrives.
    c = Cluster(tmp_path, [teamspace("a", "u")])
    res = c.run(FAKE_KUBE_AFTER_LIST=json.dumps(
        {"teamspaces": {"a": {"metadata": {"finalizers": ["example.com/x"], "resourceVersion": "7"}}}}))
    assert res.returncode == 1
    assert c.state["teamspaces"]["a"]["metadata"]["finalizers"] == ["example.com/x"]
    assert c.state["namespaces"] == {}  # nothing else for it this pass
    assert c.state.get("events", {}) == {}  # a lost race is routine, not an Event
    assert c.run().returncode == 0
    assert c.state["teamspaces"]["a"]["metadata"]["finalizers"] == ["example.com/x", FIN]


def test_status_is_not_written_over_a_change_made_after_the_read(tmp_path):
    c = Cluster(tmp_path, [teamspace("a", "u", finalizers=[FIN])])
    res = c.run(FAKE_KUBE_AFTER_LIST=json.dumps(
        {"teamspaces": {"a": {"metadata": {"generation": 2, "resourceVersion": "7"},
                              "spec": {"pods": 9}}}}))
    assert res.returncode == 1 and "status replace conflicted" in res.stderr
    assert "status" not in c.state["teamspaces"]["a"]
    assert c.run().returncode == 0
    st = c.state
    assert st["teamspaces"]["a"]["status"]["observedGeneration"] == 2
    assert st["quotas"]["team-a"]["spec"]["hard"]["pods"] == "9"


def test_a_quota_that_follows_a_spec_change_is_not_an_event(tmp_path):
    c = Cluster(tmp_path, [teamspace("a", "u", pods=4)])
    assert c.run().returncode == 0
    st = c.state
    st["teamspaces"]["a"]["spec"]["pods"] = 5
    st["teamspaces"]["a"]["metadata"]["generation"] = 2
    c.state_file.write_text(json.dumps(st))
    res = c.run()
    assert res.returncode == 0, res.stderr
    assert "set to" in res.stdout and "set back" not in res.stdout
    assert c.state["quotas"]["team-a"]["spec"]["hard"]["pods"] == "5"
    assert c.state.get("events", {}) == {}


# -- issue 11: trust ---------------------------------------------------------------------------

def test_a_converged_pass_prints_nothing_and_each_write_is_one_line(tmp_path):
    c = Cluster(tmp_path, [teamspace("a", "u", pods=2)])
    res = c.run()
    assert res.stdout.splitlines() == [
        "teamspace a: finalizer added", "teamspace a: namespace team-a created",
        'teamspace a: quota team-quota created {"pods":"2","requests.cpu":"1"}',
        "teamspace a: status written (observedGeneration 1, Ready True)"]
    res = c.run()
    assert (res.returncode, res.stdout, c.writes()) == (0, "", [])


def test_plan_prints_named_writes_and_writes_nothing(tmp_path):
    c = Cluster(tmp_path, [teamspace("a", "u", pods=2)])
    res = c.run("--plan")
    assert res.returncode == 0, res.stderr
    plan = [json.loads(line) for line in res.stdout.splitlines()]
    assert [(w["step"], w["op"], w["teamspace"]) for w in plan] == [
        ("finalizer", "add", "a"), ("namespace", "create", "a"), ("quota", "create", "a"),
        ("status", "replace", "a")]
    assert c.writes() == []
    assert c.run("--bogus").returncode == 3


def test_an_unknown_step_in_the_plan_fails_loudly(tmp_path):
    fake_plan = tmp_path / "plan.py"
    fake_plan.write_text('import json\nprint(json.dumps({"step": "teleport", "teamspace": "a"}))\n')
    c = Cluster(tmp_path, [teamspace("a", "u")])
    res = c.run(CNPA_PLAN=str(fake_plan))
    assert res.returncode == 3 and "step this script does not know: teleport" in res.stderr
    assert c.writes() == []


@pytest.mark.parametrize("spec_cpu,stored", [("0.0005", "1m"), ("1.5e0", "1500e-3"),
                                             ("500u", "1m"), ("100n", "1m"), ("5e-1", "500e-3"),
                                             ("2Ki", "2048"), ("1E", "1e18")])
def test_quantities_over_the_whole_grammar(tmp_path, spec_cpu, stored):
    c = Cluster(tmp_path, [teamspace("a", "u", cpu=spec_cpu)])
    res = c.run()
    assert res.returncode == 0, res.stderr
    # What the API server stores for the quota is its canonical form: no write follows from it.
    st = c.state
    st["quotas"]["team-a"]["spec"]["hard"]["requests.cpu"] = stored
    c.save(st)
    assert c.run().returncode == 0 and c.writes() == []


def test_a_huge_cpu_value_breaks_nothing_for_the_others(tmp_path):
    huge = "1" * 200_000
    c = Cluster(tmp_path, [teamspace("huge", "u1", cpu=huge), teamspace("ok", "u2"),
                           teamspace("gone", "u3", finalizers=[FIN], deleting=True)])
    res = c.run()
    assert res.returncode == 1
    assert "team-ok" in c.state["quotas"] and "gone" not in c.state["teamspaces"]
    assert (c.archive / "gone.json").exists()
    [ev] = [e for e in c.state["events"].values() if e["reason"] == "InvalidCPU"]
    assert len(ev["message"]) < 1100 and "200000 characters" not in ev["message"][:40]
    assert c.state["teamspaces"]["huge"]["metadata"]["finalizers"] == [FIN]


def test_thousands_of_own_events_do_not_stop_a_pass(tmp_path):
    events = {f"old.cnpa.{i:016x}": {"metadata": {"name": f"old.cnpa.{i:016x}", "namespace": "default"}}
              for i in range(5000)}
    c = Cluster(tmp_path, [teamspace("bad", "u", cpu="abc")])
    st = c.state
    st["events"] = events
    c.save(st)
    res = c.run()
    assert res.returncode == 1 and "Argument list too long" not in res.stderr
    assert [e["reason"] for e in c.state["events"].values() if "old" not in e["metadata"]["name"]] \
        == ["InvalidCPU"]


def test_a_batch_write_that_fails_is_resent_alone_and_its_error_is_its_own(tmp_path):
    foreign = {"kind": "Namespace", "metadata": {"name": "team-b", "resourceVersion": "1"}}
    c = Cluster(tmp_path, [teamspace("a", "ua"), teamspace("b", "ub"), teamspace("c", "uc")], [foreign])
    res = c.run()
    assert res.returncode == 1
    assert [line for line in res.stderr.splitlines() if "TeamSpace" in line] == [
        "reconcile: TeamSpace b: namespace team-b already exists and is not managed by cnpa-op "
        "(no platform.labhub.io/teamspace=b label); not adopting or modifying it - delete or rename it"]
    assert sorted(c.state["quotas"]) == ["team-a", "team-c"]
    assert [e["involvedObject"]["name"] for e in c.state["events"].values()] == ["b"]


def test_every_live_teamspace_gets_the_finalizer_and_every_deletion_is_archived(tmp_path):
    held = teamspace("held", "u-h", pods=3, finalizers=["example.com/hold"], deleting=True)
    c = Cluster(tmp_path, [teamspace("bad", "u-b", cpu="abc"), held])
    assert c.run().returncode == 1
    assert c.state["teamspaces"]["bad"]["metadata"]["finalizers"] == [FIN]
    assert json.loads((c.archive / "held.json").read_text()) == {"name": "held", "uid": "u-h", "pods": 3}
    assert c.state["teamspaces"]["held"]["metadata"]["finalizers"] == ["example.com/hold"]
    # Archived once: the next pass neither rewrites the record nor says anything.
    mtime = (c.archive / "held.json").stat().st_mtime_ns
    res = c.run()
    assert "held" not in res.stdout and (c.archive / "held.json").stat().st_mtime_ns == mtime


def test_an_earlier_record_of_the_same_name_is_kept(tmp_path):
    c = Cluster(tmp_path, [teamspace("a", "uid-1", pods=1, finalizers=[FIN], deleting=True)])
    assert c.run().returncode == 0
    st = c.state
    st["teamspaces"]["a"] = teamspace("a", "uid-2", pods=2, finalizers=[FIN], deleting=True)
    c.save(st)
    res = c.run()
    assert res.returncode == 0, res.stderr
    assert json.loads((c.archive / "a.json").read_text())["uid"] == "uid-2"
    assert json.loads((c.archive / "a.uid-1.json").read_text()) == {"name": "a", "uid": "uid-1", "pods": 1}


def test_a_labelled_namespace_not_made_for_the_teamspace_is_not_adopted(tmp_path):
    # Pre-labelled by someone, or left by `kubectl delete --cascade=orphan` (no ownerReference).
    ns = {"kind": "Namespace", "metadata": {"name": "team-a", "uid": "ns-1", "resourceVersion": "1",
                                            "labels": {LABEL: "a"}}}
    c = Cluster(tmp_path, [teamspace("a", "u")], [ns])
    res = c.run()
    assert res.returncode == 1 and "not adopting it" in res.stderr
    assert c.state["namespaces"]["team-a"] == ns
    assert "team-a" not in c.state["quotas"]
    assert [e["reason"] for e in c.state["events"].values()] == ["NamespaceNotOurs"]


def test_a_quota_that_loses_its_guarded_replace_is_set_back_by_an_unguarded_patch(tmp_path):
    c = Cluster(tmp_path, [teamspace("a", "u", pods=4)])
    c.run()
    st = c.state
    st["quotas"]["team-a"]["spec"]["hard"]["pods"] = "40"
    st["quotas"]["team-a"]["metadata"]["resourceVersion"] = "read"
    c.save(st)
    # Quota admission updates the quota's status right after the read.
    res = c.run(FAKE_KUBE_AFTER_LIST=json.dumps(
        {"quotas": {"team-a": {"metadata": {"resourceVersion": "later"},
                               "status": {"used": {"pods": "1"}}}}}))
    assert res.returncode == 0, res.stderr
    assert c.state["quotas"]["team-a"]["spec"]["hard"]["pods"] == "4"
    assert [e["reason"] for e in c.state["events"].values()] == ["QuotaReverted"]


def test_passes_take_turns_and_a_pass_has_a_deadline(tmp_path):
    c = Cluster(tmp_path, [teamspace("a", "u")])
    lock = str(tmp_path / "pass.lock")
    holder = subprocess.Popen(["flock", lock, "sleep", "30"], start_new_session=True)
    try:
        for _ in range(100):  # until the holder has the lock (bounded: 10 s)
            if subprocess.run(["flock", "-n", lock, "true"], check=False).returncode:
                break
            time.sleep(0.1)
        res = c.run(CNPA_PASS_DEADLINE="4")
        assert res.returncode == 75 and "another pass has held" in res.stderr
        assert c.requests() == []
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    slow = tmp_path / "slow-kubectl"
    slow.write_text("#!/bin/sh\nsleep 30\n")
    slow.chmod(0o755)
    res = c.run(CNPA_PASS_DEADLINE="2", KUBECTL=str(slow))
    assert res.returncode == 124 and "deadline of 2 s" in res.stderr


def test_a_replaced_archive_directory_ends_the_pass_with_status_4(tmp_path):
    # What the sandbox sees when the directory is replaced on the host: a deleted directory.
    archive = tmp_path / "base" / "archive"
    archive.mkdir(parents=True)
    keep = os.open(archive, os.O_RDONLY)
    try:
        archive.rmdir()
        c = Cluster(tmp_path, [teamspace("b", "u", finalizers=[FIN], deleting=True)])
        res = c.run(CNPA_ARCHIVE_DIR=f"/proc/{os.getpid()}/fd/{keep}")
    finally:
        os.close(keep)
    assert res.returncode == 4 and "was replaced" in res.stderr
    assert c.state["teamspaces"]["b"]["metadata"]["finalizers"] == [FIN]


def test_a_full_disk_never_costs_the_earlier_record(tmp_path, small_disk):
    """As the watch controller's executor (tests/unit/test_ctl_executor.py): on a full disk the
    copy of the earlier record fails without leaving a torn copy that the next pass, once there
    is room, would take for a good one before it replaces the only complete record."""
    d = small_disk.path
    earlier = '{"name":"a","uid":"uid-1","pods":1}\n'
    (d / "a.json").write_text(earlier)
    small_disk.fill()
    c = Cluster(tmp_path, [teamspace("a", "uid-2", pods=2, finalizers=[FIN], deleting=True)])
    res = c.run(CNPA_ARCHIVE_DIR=str(d))
    assert res.returncode == 1 and "cannot keep the earlier record" in res.stderr
    assert (d / "a.json").read_text() == earlier
    small_disk.free()
    res = c.run(CNPA_ARCHIVE_DIR=str(d))
    assert res.returncode == 0, res.stderr
    assert (d / "a.uid-1.json").read_text() == earlier
    assert json.loads((d / "a.json").read_text())["uid"] == "uid-2"
    assert sorted(p.name for p in d.iterdir()) == ["a.json", "a.uid-1.json"]
