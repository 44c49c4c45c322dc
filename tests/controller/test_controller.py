"""The long-running controller (python3 -m cnpa_controller) against a real API server.

Each test starts its own controller process on this node; the TeamSpaces are made and changed
with kubectl inside the test host, as a user would.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import time

import pytest
from ctllib import (
    events,
    get_or_none,
    quota_hard,
    restart_apiserver,
    wait_ready,
)
from hostlib import wait_for

from cnpa_controller.events import EVENT_BURST, EVENT_REFILL_SECONDS
from cnpa_controller.plan import FINALIZER, LABEL
from fixtures import teamspace


def test_a_new_teamspace_gets_namespace_quota_finalizer_and_ready(host, controller):
    host.apply(teamspace("ctl-new", pods=3, cpu="500m"))
    t = wait_ready(host, "ctl-new")
    assert FINALIZER in t["metadata"]["finalizers"]
    ns = host.get("namespace", "team-ctl-new")
    assert ns["metadata"]["labels"][LABEL] == "ctl-new"
    owner = ns["metadata"]["ownerReferences"]
    assert [(o["kind"], o["uid"], o["controller"]) for o in owner] == \
        [("TeamSpace", t["metadata"]["uid"], True)]
    assert t["status"]["namespaceUID"] == ns["metadata"]["uid"]
    assert quota_hard(host, "ctl-new") == {"pods": "3", "requests.cpu": "500m"}
    out = controller.out()
    assert "teamspace ctl-new: namespace team-ctl-new created" in out
    assert "teamspace ctl-new: finalizer added" in out


def test_an_edited_quota_is_set_back(host, controller):
    host.apply(teamspace("ctl-edit", pods=2))
    wait_ready(host, "ctl-edit")
    host.kubectl("patch", "resourcequota", "team-quota", "-n", "team-ctl-edit", "--type", "merge",
                 "-p", json.dumps({"spec": {"hard": {"pods": "9", "limits.memory": "1Gi"}}}))
    wait_for(lambda: quota_hard(host, "ctl-edit") == {"pods": "2", "requests.cpu": "1"},
             timeout=60, what="the quota set back")
    assert "teamspace ctl-edit: quota team-quota set back" in controller.out()
    assert events(host, "ctl-edit", "QuotaReverted")


def test_a_deleted_teamspace_is_archived_then_goes(host, controller):
    host.apply(teamspace("ctl-gone", pods=2))
    first = wait_ready(host, "ctl-gone")["metadata"]["uid"]
    host.kubectl("delete", "teamspace", "ctl-gone", "--wait=false")
    wait_for(lambda: get_or_none(host, "teamspace", "ctl-gone") is None, timeout=60,
             what="TeamSpace ctl-gone gone")
    record = controller.archive / "ctl-gone.json"
    assert json.loads(record.read_text()) == {"name": "ctl-gone", "uid": first, "pods": 2}
    lines = controller.out().splitlines()
    assert lines.index(f"teamspace ctl-gone: archived to {record}") < \
        lines.index("teamspace ctl-gone: finalizer released")
    # The same name again (its old namespace may still be terminating), deleted again: the
    # earlier record is kept beside the new one.
    host.apply(teamspace("ctl-gone", pods=5))
    second = wait_ready(host, "ctl-gone", timeout=120)["metadata"]["uid"]
    host.kubectl("delete", "teamspace", "ctl-gone", "--wait=false")
    wait_for(lambda: get_or_none(host, "teamspace", "ctl-gone") is None, timeout=60,
             what="TeamSpace ctl-gone gone again")
    assert json.loads(record.read_text()) == {"name": "ctl-gone", "uid": second, "pods": 5}
    kept = controller.archive / f"ctl-gone.{first}.json"
    assert json.loads(kept.read_text())["uid"] == first


def test_a_namespace_not_ours_is_reported_never_adopted(host, controller):
    host.kubectl("create", "namespace", "team-ctl-foreign")
    host.kubectl("label", "namespace", "team-ctl-foreign", "owner=somebody-else")
    host.apply(teamspace("ctl-foreign", pods=2))

    def reported():
        t = get_or_none(host, "teamspace", "ctl-foreign") or {}
        conds = (t.get("status") or {}).get("conditions") or []
        return any(c.get("reason") == "NamespaceNotOurs" and c.get("status") == "False"
                   for c in conds)

    wait_for(reported, timeout=60, what="Ready False NamespaceNotOurs")
    assert events(host, "ctl-foreign", "NamespaceNotOurs")
    # Several retries later it is still untouched: no label, no owner, no quota.
    wait_for(lambda: controller.err().count("TeamSpace ctl-foreign: namespace team-ctl-foreign") >= 3,
             timeout=60, what="the controller retrying")
    ns = host.get("namespace", "team-ctl-foreign")
    assert LABEL not in ns["metadata"].get("labels", {})
    assert not ns["metadata"].get("ownerReferences")
    assert quota_hard(host, "ctl-foreign") is None
    # Once the foreign namespace is gone, the TeamSpace gets its own.
    host.kubectl("delete", "namespace", "team-ctl-foreign", "--wait=true", timeout=120)
    t = wait_ready(host, "ctl-foreign", timeout=120)
    ns = host.get("namespace", "team-ctl-foreign")
    assert ns["metadata"]["ownerReferences"][0]["uid"] == t["metadata"]["uid"]


@pytest.mark.etcd_too
def test_a_lasting_problem_counts_on_one_event_with_bounded_writes(host, controller):
    """The controller retries a TeamSpace whose namespace is somebody else's (a retry cap of 2 s
    here): each retry sees the problem again. Its one Event counts the sightings it writes, its
    lastTimestamp moves, and the writes stop at the burst while the sightings go on."""
    began = time.monotonic()
    host.kubectl("create", "namespace", "team-ctl-lasting")
    host.kubectl("label", "namespace", "team-ctl-lasting", "owner=somebody-else")
    host.apply(teamspace("ctl-lasting", pods=2))
    said = "TeamSpace ctl-lasting: namespace team-ctl-lasting already exists"

    def counted(at_least: int):
        found = events(host, "ctl-lasting", "NamespaceNotOurs")
        return found if found and found[0].get("count", 1) >= at_least else None

    [first] = wait_for(lambda: counted(2), timeout=60, what="the Event counted twice")
    # Sightings beyond what the burst lets through: the writes must have stopped meanwhile.
    wait_for(lambda: controller.err().count(said) >= EVENT_BURST + 5, timeout=180,
             what="the controller seeing the problem again and again")
    seen = controller.err().count(said)
    [last] = events(host, "ctl-lasting", "NamespaceNotOurs")
    bound = EVENT_BURST + int((time.monotonic() - began) / EVENT_REFILL_SECONDS) + 1
    assert first["count"] < last["count"] <= bound < seen, (first["count"], last["count"], seen)
    assert last["metadata"]["name"] == first["metadata"]["name"]
    assert last["firstTimestamp"] == first["firstTimestamp"]
    assert last["lastTimestamp"] > last["firstTimestamp"]
    assert "event Warning NamespaceNotOurs recorded (seen" in controller.out()
    host.kubectl("delete", "teamspace", "ctl-lasting", "--wait=false")
    host.kubectl("delete", "namespace", "team-ctl-lasting", "--wait=false")
    wait_for(lambda: get_or_none(host, "teamspace", "ctl-lasting") is None, timeout=60,
             what="TeamSpace ctl-lasting gone")


@pytest.mark.etcd_too
def test_a_change_made_while_the_watches_were_broken_is_reconciled(host, controller):
    host.apply(teamspace("ctl-watch", pods=4))
    wait_ready(host, "ctl-watch")
    seen = len(controller.err())
    restart_apiserver(host)
    # Changed at once, while the controller is still reconnecting (its backoff grew while the
    # server was down); resync is an hour away, so only a resumed watch or a relist can see it.
    host.kubectl("patch", "resourcequota", "team-quota", "-n", "team-ctl-watch", "--type", "merge",
                 "-p", json.dumps({"spec": {"hard": {"pods": "40"}}}))
    wait_for(lambda: quota_hard(host, "ctl-watch") == {"pods": "4", "requests.cpu": "1"},
             timeout=90, what="the quota set back after the API server restart")
    news = controller.err()[seen:]
    assert "watch of ResourceQuota" in news or "list of ResourceQuota" in news, news
    assert controller.proc.poll() is None


def test_sigterm_stops_it_cleanly(host, start_controller):
    c = start_controller("sigterm")
    c.proc.send_signal(signal.SIGTERM)
    assert c.wait(60) == 0
    assert "stopped" in c.err()


def test_a_broken_archive_directory_keeps_the_finalizer_and_exits_4(host, start_controller,
                                                                    tmp_path):
    first = start_controller("first")
    host.apply(teamspace("ctl-kept", pods=2))
    wait_ready(host, "ctl-kept")
    assert first.stop() == 0
    # Its parent is a file: the directory cannot exist (reconcile.sh's exit 4 case).
    (tmp_path / "not-a-dir").write_text("")
    broken = start_controller("broken", CNPA_ARCHIVE_DIR=str(tmp_path / "not-a-dir" / "archive"))
    host.kubectl("delete", "teamspace", "ctl-kept", "--wait=false")
    assert broken.wait(60) == 4
    t = get_or_none(host, "teamspace", "ctl-kept")
    assert t is not None and FINALIZER in t["metadata"]["finalizers"]
    assert t["metadata"].get("deletionTimestamp")
    assert events(host, "ctl-kept", "ArchiveFailed")
    # A controller with its archive directory back archives and releases it.
    again = start_controller("again")
    wait_for(lambda: get_or_none(host, "teamspace", "ctl-kept") is None, timeout=60,
             what="TeamSpace ctl-kept gone")
    assert json.loads((again.archive / "ctl-kept.json").read_text())["uid"] == t["metadata"]["uid"]


def _lease(host, namespace: str) -> dict:
    return (get_or_none(host, "lease", "cnpa-op", "-n", namespace) or {}).get("spec") or {}


def _election_events(host, namespace: str) -> list[str]:
    items = host.get("events", "-n", namespace, "--field-selector", "reason=LeaderElection")["items"]
    return [e["message"] for e in items if e["involvedObject"].get("name") == "cnpa-op"]


def _writers(host, name: str) -> set[str]:
    """User agents of the controllers' writes of TeamSpace NAME or its namespace and quota."""
    return {e.get("userAgent", "") for e in host.audit_lines()
            if e.get("verb") in ("create", "update", "patch")
            and e.get("userAgent", "").startswith("cnpa-controller/")
            and name in (e.get("objectRef", {}).get("name"), e.get("objectRef", {}).get("namespace", "")[5:])}


@pytest.mark.etcd_too
def test_with_leader_election_one_writes_and_the_other_takes_over(host, start_controller):
    """Two controllers with leader election on, as on two hosts: one holds the Lease and writes,
    the other writes nothing; when the leader stops (SIGTERM releases the Lease) the other takes
    over and serves a TeamSpace created meanwhile. Each transition is an Event on the Lease."""
    ns = "ctl-election"
    if not host.exists("namespace", ns):
        host.kubectl("create", "namespace", ns)
    election = {"CNPA_LEADER_ELECTION": "1", "CNPA_LEASE_NAMESPACE": ns, "CNPA_LEASE_SECONDS": "4",
                "CNPA_RENEW_SECONDS": "3", "CNPA_LEASE_RETRY_SECONDS": "0.5"}
    a = start_controller("a", CNPA_LEASE_IDENTITY="ctl-a", **election)
    b = start_controller("b", CNPA_LEASE_IDENTITY="ctl-b", **election)
    holder = wait_for(lambda: _lease(host, ns).get("holderIdentity"), timeout=60, what="a Lease holder")
    leader, other = (a, b) if holder == "ctl-a" else (b, a)
    host.apply(teamspace("ctl-elected", pods=2))
    wait_ready(host, "ctl-elected")
    assert "teamspace ctl-elected: finalizer added" in leader.out()
    assert "teamspace ctl-elected:" not in other.out()
    # The audit log tells who wrote: only the leader's process (its user agent names it).
    wait_for(lambda: _writers(host, "ctl-elected"), timeout=10, what="the audit log's lines")
    assert _writers(host, "ctl-elected") == {f"cnpa-controller/{holder}"}
    wait_for(lambda: f"{holder} became leader" in _election_events(host, ns), timeout=30,
             what="the LeaderElection Event of the first leader")

    leader.proc.send_signal(signal.SIGTERM)
    assert leader.wait(60) == 0
    successor = "ctl-b" if holder == "ctl-a" else "ctl-a"
    wait_for(lambda: _lease(host, ns).get("holderIdentity") == successor, timeout=60,
             what=f"{successor} holding the Lease")
    host.apply(teamspace("ctl-after", pods=2))
    wait_ready(host, "ctl-after")
    assert "teamspace ctl-after: finalizer added" in other.out()
    assert _lease(host, ns).get("leaseTransitions", 0) >= 1
    wait_for(lambda: f"{successor} became leader" in _election_events(host, ns), timeout=30,
             what="the LeaderElection Event of the successor")


def test_with_an_archive_namespace_every_record_is_also_kept_in_the_cluster(host, start_controller):
    """CNPA_ARCHIVE_NAMESPACE: the record of a deletion outlives the host that wrote it (a
    ConfigMap per deleted TeamSpace, made before the finalizer goes); without the namespace to
    keep it in, the deletion waits."""
    ns = "ctl-archive"
    host.kubectl("delete", "namespace", ns, "--ignore-not-found")
    c = start_controller("clusterarchive", CNPA_ARCHIVE_NAMESPACE=ns)
    host.apply(teamspace("ctl-kept-twice", pods=5))
    uid = wait_ready(host, "ctl-kept-twice")["metadata"]["uid"]
    host.kubectl("delete", "teamspace", "ctl-kept-twice", "--wait=false")
    wait_for(lambda: events(host, "ctl-kept-twice", "ArchiveFailed"), timeout=60,
             what="ArchiveFailed while the archive namespace is missing")
    t = get_or_none(host, "teamspace", "ctl-kept-twice")
    assert t is not None and FINALIZER in t["metadata"]["finalizers"]
    host.kubectl("create", "namespace", ns)
    wait_for(lambda: get_or_none(host, "teamspace", "ctl-kept-twice") is None, timeout=90,
             what="TeamSpace ctl-kept-twice gone once the namespace exists")
    cm = host.get("configmap", f"archive-{uid}", "-n", ns)
    assert json.loads(cm["data"]["ctl-kept-twice.json"]) == {"name": "ctl-kept-twice", "uid": uid, "pods": 5}
    assert cm["metadata"]["labels"]["platform.labhub.io/archived-teamspace"] == "ctl-kept-twice"
    assert json.loads((c.archive / "ctl-kept-twice.json").read_text())["uid"] == uid


def _token(host, sa: str, ns: str, secret: str) -> str:
    """A token of ServiceAccount sa bound to Secret secret: deleting the Secret revokes it."""
    host.kubectl("create", "secret", "generic", secret, "-n", ns)
    return host.kubectl("create", "token", sa, "-n", ns, "--duration=3600s",
                        "--bound-object-kind=Secret", f"--bound-object-name={secret}").stdout.strip()


def _rejected(host, server: str, token: str) -> bool:
    proc = host.kubectl("--kubeconfig", "/dev/null", "--server", server, "--token", token,
                        "--insecure-skip-tls-verify", "get", "--raw", "/api", check=False)
    return proc.returncode != 0 and "Unauthorized" in proc.stderr


def _server(host) -> str:
    return host.kubectl("config", "view", "--minify", "-o",
                        "jsonpath={.clusters[0].cluster.server}").stdout.strip()


def test_a_renewed_token_file_is_used_once_the_old_token_is_revoked(host, start_controller, tmp_path):
    """The role gives the watch controller a kubeconfig naming a token file that a timer renews
    before the token expires. The controller must read the file again: here each token is bound
    to a Secret, and deleting the Secret revokes it at once (instead of waiting for an expiry of
    at least 10 minutes), three times in a row. With leader election on, the Lease needs the
    token too."""
    ns, sa = "ctl-token", "ctl-token"
    if not host.exists("namespace", ns):
        host.kubectl("create", "namespace", ns)
        host.kubectl("create", "serviceaccount", sa, "-n", ns)
        # A test identity: what the controller may do is tests/faults' concern, not this test's.
        host.kubectl("create", "clusterrolebinding", "ctl-token", "--clusterrole=cluster-admin",
                     f"--serviceaccount={ns}:{sa}")
    suffix = str(int(time.time()))
    token_file = tmp_path / "sa-token"
    token_file.write_text(_token(host, sa, ns, f"t0-{suffix}"))
    admin = host.inst.kubeconfig.read_text()
    server = _server(host)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {
            "server": server,
            "certificate-authority-data": re.search(r"certificate-authority-data: (\S+)", admin)[1]}}],
        "users": [{"name": "u", "user": {"tokenFile": str(token_file)}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    c = start_controller("token", KUBECONFIG=str(kubeconfig), CNPA_LEADER_ELECTION="1",
                         CNPA_LEASE_NAMESPACE=ns, CNPA_LEASE_SECONDS="4", CNPA_RENEW_SECONDS="3",
                         CNPA_LEASE_RETRY_SECONDS="0.5")
    host.apply(teamspace("ctl-token", pods=1))
    wait_ready(host, "ctl-token")
    for renewal in range(1, 4):
        old = token_file.read_text().strip()
        new = tmp_path / "sa-token.new"
        new.write_text(_token(host, sa, ns, f"t{renewal}-{suffix}"))
        new.replace(token_file)  # as the token unit renews it
        host.kubectl("delete", "secret", f"t{renewal - 1}-{suffix}", "-n", ns)
        # The API server caches a token it accepted for up to 10 s.
        wait_for(lambda old=old: _rejected(host, server, old), timeout=60, interval=1,
                 what=f"the token before renewal {renewal} rejected")
        host.kubectl("patch", "teamspace", "ctl-token", "--type", "merge",
                     "-p", json.dumps({"spec": {"pods": renewal + 1}}))
        wait_for(lambda renewal=renewal: quota_hard(host, "ctl-token") == {
            "pods": str(renewal + 1), "requests.cpu": "1"}, timeout=60,
            what=f"the change after renewal {renewal} served")
        wait_ready(host, "ctl-token")
    assert c.proc.poll() is None, c.err()


def test_a_forged_archive_configmap_is_not_taken_for_the_record(host, start_controller):
    """archive-UID made beforehand by someone who may create ConfigMaps there (uids are public):
    the deletion waits with a Warning Event instead of being released on a record it did not
    write; once that ConfigMap is removed, the real record is kept and the deletion goes on."""
    ns = "ctl-forged-archive"
    if not host.exists("namespace", ns):
        host.kubectl("create", "namespace", ns)
    start_controller("forgedarchive", CNPA_ARCHIVE_NAMESPACE=ns)
    name = f"ctl-forged-cm-{int(time.time()) % 100000}"  # a new one on a reused host
    host.apply(teamspace(name, pods=3))
    uid = wait_ready(host, name)["metadata"]["uid"]
    host.apply({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": f"archive-{uid}", "namespace": ns,
                             "labels": {"platform.labhub.io/archived-teamspace": name,
                                        "app.kubernetes.io/managed-by": "cnpa-op"}},
                "data": {f"{name}.json": json.dumps({"name": name, "uid": uid, "pods": 50}) + "\n"}})
    host.kubectl("delete", "teamspace", name, "--wait=false")
    [event] = wait_for(lambda: events(host, name, "ArchiveRecordMismatch"), timeout=60,
                       what="the ArchiveRecordMismatch Event")
    assert event["type"] == "Warning" and f"archive-{uid}" in event["message"]
    assert FINALIZER in get_or_none(host, "teamspace", name)["metadata"]["finalizers"]
    host.kubectl("delete", "configmap", f"archive-{uid}", "-n", ns)
    wait_for(lambda: get_or_none(host, "teamspace", name) is None, timeout=90,
             what=f"TeamSpace {name} gone once the forged ConfigMap is removed")
    cm = host.get("configmap", f"archive-{uid}", "-n", ns)
    assert json.loads(cm["data"][f"{name}.json"])["pods"] == 3
    assert cm.get("immutable") is True


def test_a_namespace_with_a_forged_owner_reference_is_not_adopted(host, start_controller):
    """team-NAME deleted, then made again by somebody else before the controller could, with an
    ownerReference copied from the TeamSpace (its uid is public) and a label of their own:
    refused with a Warning Event and Ready False; no quota is put into it."""
    c = start_controller("forgedns")
    name = f"ctl-forged-ns-{int(time.time()) % 100000}"  # a new one on a reused host
    host.apply(teamspace(name, pods=3))
    t = wait_ready(host, name)
    c.stop()
    host.kubectl("delete", "namespace", f"team-{name}", "--timeout=120s")
    ref = {"apiVersion": "platform.labhub.io/v1alpha1", "kind": "TeamSpace", "name": name,
           "uid": t["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    host.apply({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": f"team-{name}", "ownerReferences": [ref],
                             "labels": {LABEL: name,
                                        "pod-security.kubernetes.io/enforce": "privileged"}}})
    start_controller("forgedns2")
    [event] = wait_for(lambda: events(host, name, "NamespaceNotOurs"), timeout=60,
                       what="the NamespaceNotOurs Event")
    assert event["type"] == "Warning" and "pod-security.kubernetes.io/enforce" in event["message"]
    got = get_or_none(host, "teamspace", name)
    ready = next(c for c in got["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "NamespaceNotOurs")
    assert quota_hard(host, name) is None


@pytest.mark.etcd_too
def test_a_list_whose_continue_token_expired_is_made_again_in_one_piece(host, caplog):
    """A paged list (the informer's relist: 500 objects a page, 1 here) whose pages span a
    compaction: the datastore no longer has the version the continue token names, the API server
    answers 410, and the informer lists again in one piece, missing nothing. On etcd any
    compaction past the token does it; kine keeps its newest 1000 revisions through a
    compaction, so there it takes more than 1000 writes as well (both run here: conftest)."""
    from cnpa_controller import ApiError
    from cnpa_controller.api import connect
    from cnpa_controller.cache import Informer

    ns = f"ctl-continue-{int(time.time()) % 100000}"
    host.kubectl("create", "namespace", ns)
    for i in range(5):
        host.kubectl("create", "configmap", f"cm-{i}", "-n", ns)
    api = connect(str(host.inst.kubeconfig))
    path = f"/api/v1/namespaces/{ns}/configmaps"
    pages: list = []

    def expire(token: str) -> None:
        """Write past the token and wait (bounded) until the server says it expired."""
        churn = {"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"churn-{i}", "namespace": ns}}
            for i in range(1100)]}
        host.kubectl("create", "-f", "-", input_text=json.dumps(churn), timeout=300)

        def expired() -> bool:
            try:
                api.request("GET", path, query={"limit": 1, "continue": token})
            except ApiError as exc:
                return exc.status == 410
            return False
        wait_for(expired, timeout=120, interval=2, what="the continue token expired by compaction")

    class PausingApi:
        """The informer's API, but the first continue token is made to expire before it is used."""

        def request(self, method, p, **kw):
            page = api.request(method, p, **kw)
            token = (page.get("metadata") or {}).get("continue")
            pages.append(kw.get("query", {}).get("continue"))
            if token and len(pages) == 1:
                expire(token)
            return page

    informer = Informer(PausingApi(), "ConfigMap", path, page_size=1)
    with caplog.at_level(logging.INFO, logger="cnpa_controller"):
        informer.relist()
    assert "list of ConfigMap expired between pages; listing in one piece" in caplog.messages, \
        caplog.messages
    names = {k.split("/", 1)[1] for k in informer.list_keys()}
    assert {f"cm-{i}" for i in range(5)} <= names and len(names) >= 1105
    host.kubectl("delete", "namespace", ns, "--wait=false")
