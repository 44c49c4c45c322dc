"""reconcile.sh against a fake kubectl: desired state, zero writes when converged, finalizers.

These run the real script with bash and jq; only kubectl is replaced (tests/unit/fake_kubectl.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
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

    def run(self, **env_extra):
        self.log_file.unlink(missing_ok=True)
        (self.tmp / "calls.log").unlink(missing_ok=True)
        env = dict(os.environ, KUBECTL=str(FAKE), FAKE_KUBE_STATE=str(self.state_file),
                   FAKE_KUBE_LOG=str(self.log_file), CNPA_BASE_DIR=str(self.tmp / "base"),
                   FAKE_KUBE_CALLS=str(self.tmp / "calls.log"))
        env.update(env_extra)
        return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True,
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
    assert ts["status"] == {"observedGeneration": 3, "namespace": "team-alpha"}
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
    t = teamspace("a", "u", cpu=spec_cpu, finalizers=[FIN],
                  status={"observedGeneration": 1, "namespace": "team-a"})
    c = Cluster(tmp_path, [t], [ns], [q])
    res = c.run()
    assert res.returncode == 0, res.stderr
    assert c.writes() == []


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


def test_deletion_completes_when_ours_is_the_last_finalizer(tmp_path):
    c = Cluster(tmp_path, [teamspace("beta", "u-b", finalizers=[FIN], deleting=True)])
    assert c.run().returncode == 0
    assert "beta" not in c.state["teamspaces"]


def test_finalizer_stays_when_archive_cannot_be_written(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    c = Cluster(tmp_path, [teamspace("beta", "u-b", finalizers=[FIN], deleting=True)])
    res = c.run(CNPA_ARCHIVE_DIR=str(blocker / "archive"))
    assert res.returncode == 1
    assert "beta" in res.stderr
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
    assert "status" not in st["teamspaces"]["x"]  # never claims what is not in place


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
    assert c.object_writes() == []
    assert [e["reason"] for e in c.state["events"].values()] == ["NamespaceOwnedByOther"]
    assert c.state["namespaces"]["team-a"]["metadata"]["ownerReferences"][0]["uid"] == "old-uid"


def test_removed_owner_reference_is_restored_keeping_other_owners(tmp_path):
    other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "cm"}
    c = Cluster(tmp_path, [teamspace("a", "u")], [_owned_ns("a", "u", refs=[other])])
    assert c.run().returncode == 0
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
    # The same problems on the next pass: logged again, but no new Event (bounded).
    res = c.run()
    assert res.returncode == 1 and "TeamSpace cpu:" in res.stderr
    assert len(_events(c)) == 3
    assert [w for w in c.writes() if w["resource"] == "events"] == []
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
    assert "TeamSpace a: quota team-quota in team-a was" in res.stderr
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
    assert c.object_writes() == []
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
    res = c.run()
    assert res.returncode == 0, res.stderr
    assert len(c.object_writes()) == 26 * 4
    # 3 lists; finalizers: one patch creating the list, one appending to an existing one;
    # one create of all namespaces, one of all quotas, one replace of all statuses.
    assert sorted(c.calls()) == sorted([f"get {TS}", "get namespaces", "get resourcequotas",
                                        "patch", "patch", "create", "create",
                                        "replace"])
    assert all(t["metadata"]["finalizers"][-1] == FIN and t["status"]["observedGeneration"] == 1
               for t in c.state["teamspaces"].values())
    assert c.state["teamspaces"]["other"]["metadata"]["finalizers"] == ["example.com/other", FIN]


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
    assert res.returncode == 1 and "status update failed" in res.stderr
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
    assert "set to" in res.stderr and "set back" not in res.stderr
    assert c.state["quotas"]["team-a"]["spec"]["hard"]["pods"] == "5"
    assert c.state.get("events", {}) == {}
