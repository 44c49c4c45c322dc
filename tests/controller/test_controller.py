"""The long-running controller (python3 -m cnpa_controller) against a real API server.

Each test starts its own controller process on this node; the TeamSpaces are made and changed
with kubectl inside the test host, as a user would.
"""

from __future__ import annotations

import json
import signal

from ctllib import (
    FINALIZER,
    LABEL,
    events,
    get_or_none,
    quota_hard,
    restart_apiserver,
    teamspace,
    wait_ready,
)
from hostlib import wait_for


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
