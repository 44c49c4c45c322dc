"""tests/multihost/mhlib.py's readers of what the test hosts record (the API server's audit log,
the controllers' archive directories), on files made here: the multi-host checks rest on them,
and at thousands of TeamSpaces (test_watch_chaos.py's long form) the audit log is rotated."""

from __future__ import annotations

import json
from pathlib import Path

import mhlib
import pytest

UID = "0f0f0f0f-1111-4222-8333-444455556666"
OTHER = "aaaaaaaa-bbbb-4ccc-8ddd-eeeeffff0000"


class Inst:
    def __init__(self, name: str, root: Path, running: bool = True) -> None:
        self.name, self.root, self._running = name, root, running

    def running(self) -> bool:
        return self._running


class Host:
    def __init__(self, name: str, root: Path, running: bool = True) -> None:
        self.inst = Inst(name, root, running)


def event(when: str, agent: str, verb: str = "patch", resource: str = "teamspaces",
          code: int = 200) -> str:
    return json.dumps({
        "kind": "Event", "stage": "ResponseComplete", "verb": verb,
        "requestURI": f"/apis/platform.labhub.io/v1alpha1/{resource}/x",
        "user": {"username": "system:serviceaccount:cnpa-system:cnpa-op"}, "sourceIPs": ["127.0.0.1"],
        "userAgent": agent, "objectRef": {"resource": resource, "name": "x"},
        "responseStatus": {"code": code}, "requestReceivedTimestamp": when,
        "annotations": {"authorization.k8s.io/decision": "allow"}}, separators=(",", ":"))


def test_controller_requests_reads_the_rotated_logs_too(tmp_path):
    logs = tmp_path / mhlib.AUDIT_LOG
    logs.parent.mkdir(parents=True)
    a, b = "cnpa-controller/mh-a_1 (linux)", "cnpa-controller/mh-b_2"
    # Named by the time each was rotated, as the API server names them (lumberjack).
    (logs.parent / "audit-2026-12-06T21-00-00.000.log").write_text(
        event("2026-12-06T20:59:00.000000Z", a) + "\n"
        + event("2026-12-06T20:59:01.000000Z", "kubectl/v1.36.5") + "\n")
    (logs.parent / "audit-2026-12-06T20-00-00.000.log").write_text(
        event("2026-12-06T19:59:00.000000Z", a, verb="update", resource="leases") + "\n")
    logs.write_text(event("2026-12-06T21:30:00.000000Z", b, verb="create") + "\n"
                    + event("2026-12-06T21:30:01.000000Z", b, verb="get") + "\n"
                    + event("2026-12-06T21:30:02.000000Z", b)[:80])  # being written
    host = Host("mh-a", tmp_path)

    got = mhlib.controller_requests(host)
    assert [(e["identity"], e["verb"], e["objectRef"]["resource"]) for e in got] == [
        ("mh-a_1", "update", "leases"), ("mh-a_1", "patch", "teamspaces"),
        ("mh-b_2", "create", "teamspaces")]
    assert set(got[0]) == {*mhlib._AUDIT_KEYS, "identity"}  # user, annotations, ... dropped
    assert [e["identity"] for e in mhlib.controller_requests(host, "2026-12-06T21:00:00Z")] == ["mh-b_2"]


def test_archive_files_counts_each_hosts_files_per_uid(tmp_path):
    def archive(host: str, files: dict[str, str]) -> Path:
        d = tmp_path / host / mhlib.ARCHIVE_DIR.lstrip("/")
        d.mkdir(parents=True)
        for name, text in files.items():
            (d / name).write_text(text)
        return tmp_path / host

    hosts = [Host("a", archive("a", {"t.json": json.dumps({"name": "t", "uid": UID}),
                                     f"t.{OTHER}.json": json.dumps({"name": "t", "uid": OTHER})})),
             Host("b", archive("b", {"t.json": json.dumps({"name": "t", "uid": UID}),
                                     "notes.txt": UID})),
             Host("c", archive("c", {"t.json": UID}), running=False)]
    assert mhlib.archive_files(hosts) == {UID: {"a": 1, "b": 1}, OTHER: {"a": 1}}
    assert mhlib.file_records(hosts, UID) == {"a": 1, "b": 1}
    assert mhlib.file_records(hosts, OTHER) == {"a": 1, "b": 0}


class Deleted:
    """A workload whose one TeamSpace was deleted, as problems() reads it."""

    def __init__(self) -> None:
        self.live, self.uncertain, self.deleted = {}, {}, {UID: "t"}


@pytest.mark.parametrize("owners, left", [([UID], True), ([OTHER], False), ([], False)])
def test_problems_finds_the_namespace_a_deleted_teamspace_left(owners, left):
    namespaces = [{"metadata": {"name": "team-t", "ownerReferences": [{"uid": u} for u in owners]}}]
    snap = {"teamspaces": [], "namespaces": namespaces, "quotas": [], "archives": [
        {"metadata": {"name": f"archive-{UID}", "labels": {mhlib.ARCHIVE_LABEL: "t"}}}]}
    wrong = mhlib.problems(snap, [Deleted()], True)
    assert wrong == ([f"t ({UID}) deleted but its namespace ['team-t'] is still there"] if left else [])
