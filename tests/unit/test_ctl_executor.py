"""The executor (of the watch controller and of every pass reconcile.sh runs) against a scripted
API: the plan's writes sent in order (archive before release, failures belong to one TeamSpace,
quota fallback, uid guards, Events named as earlier versions named them, leadership checked per
write)."""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import time

import pytest

import fixtures
from cnpa_controller import ApiError, plan
from cnpa_controller.archive import ArchiveStore, archive_configmap, mktemp
from cnpa_controller.events import (
    EVENT_BURST,
    EVENT_REFILL_SECONDS,
    HELD,
    NOT_LEADER,
    RECORDED,
    EventRecorder,
    SpamFilter,
    event_name,
    event_write,
)
from cnpa_controller.executor import Executor, request_of

NOW = "2026-01-01T00:00:00Z"
FIN = plan.FINALIZER


def teamspace(name="a", uid="u-1", pods=3, finalizers=None, deleting=False, status=None, rv="7"):
    """A TeamSpace as the API server returns it."""
    meta = {"uid": uid, "generation": 1, "resourceVersion": rv}
    if finalizers is not None:
        meta["finalizers"] = finalizers
    if deleting:
        meta["deletionTimestamp"] = NOW
    t = fixtures.teamspace(name, pods, "1", **meta)
    if status is not None:
        t["status"] = status
    return t


class FakeApi:
    """Answers every write with the object it was sent (kind, a new resourceVersion and uid);
    `fail` maps (method, path) to the ApiError to raise instead. Events are kept as the API
    server keeps them (create, get, merge patch with a resourceVersion precondition), since how
    an Event is written depends on the one there."""

    def __init__(self, fail=None, on_request=None, answers=None):
        self.calls = []
        self.fail = fail or {}
        self.on_request = on_request
        self.answers = answers or {}  # (method, path) -> the object to answer with
        self.rv = 100
        self.events = {}  # path -> Event

    def _event(self, method, path, body):
        if method == "POST":
            path = f"{path}/{body['metadata']['name']}"
            if path in self.events:
                raise ApiError(409, "AlreadyExists", "events exists")
            self.events[path] = json.loads(json.dumps(body))
        elif path not in self.events:
            raise ApiError(404, "NotFound", "events not found")
        elif method == "PATCH":
            have = self.events[path]
            want = (body.get("metadata") or {}).get("resourceVersion")
            if want and want != have["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", "the object has been modified")
            have.update({k: v for k, v in body.items() if k != "metadata"})
        if method != "GET":
            self.rv += 1
            self.events[path]["metadata"]["resourceVersion"] = str(self.rv)
        return json.loads(json.dumps(self.events[path]))

    def request(self, method, path, *, body=None, content_type=None, **kw):
        self.calls.append((method, path, content_type, body))
        if self.on_request:
            self.on_request(method, path, body)
        err = self.fail.get((method, path))
        if err is not None:
            raise err
        if (method, path) in self.answers:
            return json.loads(json.dumps(self.answers[(method, path)]))
        if "/events" in path:
            return self._event(method, path, body)
        self.rv += 1
        if method == "PATCH":
            kind = "ResourceQuota" if "resourcequotas" in path else "TeamSpace"
            return {"kind": kind, "metadata": {"resourceVersion": str(self.rv), "uid": "u-1"}}
        obj = json.loads(json.dumps(body or {}))
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        obj["metadata"].setdefault("uid", f"uid-{self.rv}")
        return obj

    def writes(self):
        return [(m, p) for m, p, _, _ in self.calls if "/events" not in p]

    def event_writes(self):
        return [(m, b) for m, p, _, b in self.calls if "/events" in p and m != "GET"]


class Logged(logging.Handler):
    """The executor's log lines (it logs through `logging`), while a `with` lasts."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def __enter__(self) -> list[str]:
        logging.getLogger("cnpa_controller").addHandler(self)
        return self.lines

    def __exit__(self, *exc) -> None:
        logging.getLogger("cnpa_controller").removeHandler(self)


def run(api, t, ns=None, quota=None, tmp_path=None, **kw):
    said = []
    ex = Executor(api, archive_dir=str(tmp_path or "/nonexistent"), say=lambda n, w: said.append(w),
                  **kw)
    with Logged() as logged:
        result = ex.execute(t, plan.plan(t, ns, quota, NOW), NOW)
    return result, said, logged


TS_PATH = "/apis/platform.labhub.io/v1alpha1/teamspaces/a"


def test_a_new_teamspace_gets_finalizer_namespace_quota_status_in_order():
    api = FakeApi()
    result, said, _ = run(api, teamspace())
    assert api.writes() == [("PATCH", TS_PATH), ("POST", "/api/v1/namespaces"),
                            ("POST", "/api/v1/namespaces/team-a/resourcequotas"),
                            ("PUT", TS_PATH + "/status")]
    assert not result.failed and result.writes == 4
    assert said[0] == "finalizer added" and said[-1].startswith("status written")
    # No problem, no request about Events, not even a read.
    assert not [c for c in api.calls if "/events" in c[1]]
    # The finalizer patch is guarded by the TeamSpace's uid.
    assert api.calls[0][2] == "application/json-patch+json"
    assert api.calls[0][3][0] == {"op": "test", "path": "/metadata/uid", "value": "u-1"}
    # The status replace carries the version our finalizer patch returned and the new
    # namespace's uid (as reconcile.sh fills them in).
    status = api.calls[3][3]
    assert status["metadata"]["resourceVersion"] == "101"
    assert status["status"]["namespaceUID"] == "uid-102"


def test_a_failed_write_stops_that_teamspace_and_says_ready_false():
    api = FakeApi(fail={("POST", "/api/v1/namespaces"): ApiError(500, "InternalError", "etcd down")})
    result, _, logged = run(api, teamspace(finalizers=[FIN]))
    assert result.failed and result.errors == ["NamespaceCreateFailed"]
    writes = api.writes()
    assert ("POST", "/api/v1/namespaces/team-a/resourcequotas") not in writes
    assert writes[-1] == ("PUT", TS_PATH + "/status")
    cond = [c for c in api.calls if c[1].endswith("/status")][-1][3]["status"]["conditions"][-1]
    assert (cond["status"], cond["reason"]) == ("False", "NamespaceCreateFailed")
    events = [b for m, p, _, b in api.calls if p.endswith("/events")]
    assert [e["reason"] for e in events] == ["NamespaceCreateFailed"]
    assert any("etcd down" in line for line in logged)


def test_a_conflict_is_retried_without_event_or_status():
    api = FakeApi(fail={("PATCH", TS_PATH): ApiError(422, "Invalid",
                        "the server rejected our request due to an error in our request")})
    result, _, _ = run(api, teamspace())
    assert result.failed and result.errors == ["Conflict"]
    assert api.writes() == [("PATCH", TS_PATH)]
    assert not [c for c in api.calls if c[1].endswith("/events")]


def test_an_existing_namespace_without_our_label_is_reported_not_ours():
    api = FakeApi(fail={("POST", "/api/v1/namespaces"): ApiError(409, "AlreadyExists", "exists")})
    api.request_get = api.request

    def request(method, path, **kw):
        if method == "GET":
            api.calls.append((method, path, None, None))
            return {"kind": "Namespace", "metadata": {"name": "team-a", "labels": {}}}
        return api.request_get(method, path, **kw)

    api.request = request
    result, _, _ = run(api, teamspace(finalizers=[FIN]))
    assert result.errors == ["NamespaceNotOurs"]
    status = [c for c in api.calls if c[1].endswith("/status")][-1][3]
    assert status["status"]["conditions"][-1]["reason"] == "NamespaceNotOurs"
    assert not [c for c in api.calls if "resourcequotas" in c[1]]


def test_an_existing_namespace_with_our_label_is_a_cache_not_yet_updated():
    api = FakeApi(fail={("POST", "/api/v1/namespaces"): ApiError(409, "AlreadyExists", "exists")})
    real = api.request

    def request(method, path, **kw):
        if method == "GET":
            return {"kind": "Namespace", "metadata": {"labels": {plan.LABEL: "a"}}}
        return real(method, path, **kw)

    api.request = request
    result, _, _ = run(api, teamspace(finalizers=[FIN]))
    # Retried, not reported as somebody else's: no Event, no status.
    assert result.failed and result.errors == ["Conflict"]
    assert api.writes() == [("POST", "/api/v1/namespaces")]
    assert not [c for c in api.calls if c[1].endswith("/events")]


def test_a_lost_quota_replace_falls_back_to_a_patch_guarded_by_the_limits_as_read():
    t = teamspace(finalizers=[FIN], status={"namespaceUID": "ns-1", "observedGeneration": 1})
    ns = {"metadata": {"name": "team-a", "uid": "ns-1", "labels": {plan.LABEL: "a"},
                       "ownerReferences": [plan.owner_reference(t)]}}
    quota = {"apiVersion": "v1", "kind": "ResourceQuota",
             "metadata": {"name": "team-quota", "namespace": "team-a", "resourceVersion": "5"},
             "spec": {"hard": {"pods": "9", "requests.cpu": "1"}}}
    qpath = "/api/v1/namespaces/team-a/resourcequotas/team-quota"
    api = FakeApi(fail={("PUT", qpath): ApiError(409, "Conflict", "modified")})
    result, said, _ = run(api, t, ns, quota)
    assert api.writes()[:2] == [("PUT", qpath), ("PATCH", qpath)]
    assert api.calls[1][2] == "application/json-patch+json"
    assert api.calls[1][3] == [
        {"op": "test", "path": "/spec/hard", "value": {"pods": "9", "requests.cpu": "1"}},
        {"op": "replace", "path": "/spec/hard", "value": {"pods": "3", "requests.cpu": "1"}}]
    assert not result.failed
    assert any(s.startswith("quota team-quota set back") for s in said)
    assert [b["reason"] for m, p, _, b in api.calls if p.endswith("/events")] == ["QuotaReverted"]


def test_archive_is_on_disk_before_the_finalizer_is_released(tmp_path):
    t = teamspace(finalizers=[FIN], deleting=True)
    seen_at_release = []

    def on_request(method, path, body):
        if method == "PATCH":
            seen_at_release.append((tmp_path / "a.json").read_text())

    api = FakeApi(on_request=on_request)
    result, said, _ = run(api, t, tmp_path=tmp_path)
    assert seen_at_release == ['{"name":"a","uid":"u-1","pods":3}\n']
    assert said == [f"archived to {tmp_path}/a.json", "finalizer released"]
    assert api.calls[0][3][0] == {"op": "test", "path": "/metadata/uid", "value": "u-1"}
    assert not result.failed


def test_the_archive_directory_is_listed_once_not_per_deletion(tmp_path, monkeypatch):
    """Leftovers of a killed pass are swept once, before this executor's first temporary file;
    a listing per record made a mass deletion quadratic in the records already archived."""
    (tmp_path / ".old.json.Ab12cd").write_text("left by a killed pass")
    listed = []
    real = os.scandir
    monkeypatch.setattr(os, "scandir", lambda p=".": (listed.append(p), real(p))[1])
    ex = Executor(FakeApi(), archive_dir=str(tmp_path))
    for i in range(5):
        t = teamspace(name=f"t{i}", uid=f"u-{i}", finalizers=[FIN], deleting=True)
        assert not ex.execute(t, plan.plan(t, None, None, NOW), NOW).failed
    assert listed == [str(tmp_path)]
    assert not (tmp_path / ".old.json.Ab12cd").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"t{i}.json" for i in range(5)]


def test_an_earlier_record_of_the_same_name_is_kept(tmp_path):
    (tmp_path / "a.json").write_text('{"name":"a","uid":"old","pods":1}\n')
    (tmp_path / ".a.json.Xy12ab").write_text("left by a killed pass")
    api = FakeApi()
    run(api, teamspace(finalizers=[FIN], deleting=True), tmp_path=tmp_path)
    assert (tmp_path / "a.old.json").read_text() == '{"name":"a","uid":"old","pods":1}\n'
    assert json.loads((tmp_path / "a.json").read_text())["uid"] == "u-1"
    assert not (tmp_path / ".a.json.Xy12ab").exists()
    # Archived already: a second pass writes no record again and still releases.
    api = FakeApi()
    _, said, _ = run(api, teamspace(finalizers=[FIN], deleting=True), tmp_path=tmp_path)
    assert said == ["finalizer released"]


@pytest.mark.parametrize("found", [b"not json {", b'{"name":"a","pods":1}\n', b"\xff\xfe\x00 torn",
                                   b'{"uid":"../../x"}'])
def test_a_record_that_cannot_be_read_is_kept_aside_byte_for_byte(tmp_path, found):
    """NAME.json that is not a record of ours (torn, edited, another tool's) is never overwritten
    unread: kept as NAME.unreadable-DIGEST.json, the same name on every pass."""
    (tmp_path / "a.json").write_bytes(found)
    for _ in range(2):
        result, said, _ = run(FakeApi(), teamspace(finalizers=[FIN], deleting=True),
                              tmp_path=tmp_path)
        assert not result.failed and said[-1] == "finalizer released"
    kept = sorted(p.name for p in tmp_path.iterdir() if p.name != "a.json")
    assert len(kept) == 1 and fnmatch.fnmatchcase(kept[0], "a.unreadable-????????????.json")
    assert (tmp_path / kept[0]).read_bytes() == found
    assert json.loads((tmp_path / "a.json").read_text())["uid"] == "u-1"


def test_a_broken_archive_directory_refuses_the_release(tmp_path):
    (tmp_path / "file").write_text("")
    api = FakeApi()
    said = []
    ex = Executor(api, archive_dir=str(tmp_path / "file" / "archive"),
                  say=lambda n, w: said.append(w))
    t = teamspace(finalizers=[FIN], deleting=True)
    result = ex.execute(t, plan.plan(t, None, None, NOW), NOW)
    assert result.archive_broken and result.failed
    assert api.writes() == []  # no release, and no status on a deleting TeamSpace
    assert [b["reason"] for m, p, _, b in api.calls if p.endswith("/events")] == ["ArchiveFailed"]


def test_leadership_lost_mid_pass_stops_the_writes():
    api = FakeApi()
    answers = iter([True, False])
    result, _, _ = run(api, teamspace(), may_write=lambda: next(answers, False))
    assert result.not_leader
    assert api.writes() == [("PATCH", TS_PATH)]


def test_the_archive_store_and_the_recorder_say_not_leader_instead_of_writing(tmp_path):
    """Each asks may_write() just before its own writes and returns the outcome: the executor,
    not they, stops the TeamSpace's pass."""
    api = FakeApi()
    t = teamspace(finalizers=[FIN], deleting=True)
    [archive, _release] = plan.plan(t, None, None, NOW)
    kept = ArchiveStore(api, str(tmp_path), "cnpa-system", may_write=lambda: False).keep(archive)
    assert kept.not_leader and not kept.written and kept.failure is None
    assert list(tmp_path.iterdir()) == [] and api.calls == []
    # Its file written, then the fence lapses before the cluster's copy.
    answers = iter([True, False])
    kept = ArchiveStore(api, str(tmp_path), "cnpa-system",
                        may_write=lambda: next(answers)).keep(archive)
    assert kept.not_leader and kept.written == [("write", f"archived to {tmp_path}/a.json")]
    assert api.calls == []
    done = EventRecorder(api, may_write=lambda: False).record(
        "a", "u-1", plan.Event("Warning", "Bad", "x"), NOW)
    assert done.outcome == NOT_LEADER and api.event_writes() == []


def test_leadership_lost_before_the_archive_keeps_the_finalizer(tmp_path):
    api = FakeApi()
    result, said, _ = run(api, teamspace(finalizers=[FIN], deleting=True), tmp_path=tmp_path,
                          may_write=lambda: False)
    assert result.not_leader and not result.failed and said == []
    assert api.writes() == [] and list(tmp_path.iterdir()) == []


def test_a_problem_seen_again_is_counted_on_its_one_event():
    t = teamspace(finalizers=[FIN], pods="x")
    api = FakeApi()
    ex = Executor(api, archive_dir="/nonexistent")
    for i in range(3):
        now = f"2026-01-01T00:00:0{i}Z"
        result = ex.execute(t, plan.plan(t, None, None, now), now)
        assert result.problems
    [ev] = api.events.values()
    assert (ev["count"], ev["firstTimestamp"], ev["lastTimestamp"]) == \
        (3, "2026-01-01T00:00:00Z", "2026-01-01T00:00:02Z")
    assert [m for m, _ in api.event_writes()] == ["POST", "PATCH", "PATCH"]
    # Client-go's recorder patches too: a merge patch of what changed, guarded here by the
    # version it read, so that a count raised by another writer is never lowered.
    patch = [c for c in api.calls if c[0] == "PATCH" and "/events/" in c[1]][-1]
    assert patch[2] == "application/merge-patch+json"
    assert {k: v for k, v in patch[3].items() if k != "metadata"} == \
        {"count": 3, "lastTimestamp": "2026-01-01T00:00:02Z"}
    assert set(patch[3]["metadata"]) == {"resourceVersion"}
    # The controller remembers what it wrote: it read the Event once, before creating it.
    assert [c[0] for c in api.calls if "/events/" in c[1]].count("GET") == 1
    assert ex.events.writes == 3


def test_a_pass_without_memory_reads_the_event_and_counts_on():
    """Each pass is a new process: the Event read from the server is what it knows."""
    t = teamspace(finalizers=[FIN], pods="x")
    api = FakeApi()
    for i in range(3):
        now = f"2026-01-01T00:00:0{i}Z"
        Executor(api, archive_dir="/nonexistent").execute(t, plan.plan(t, None, None, now), now)
    [ev] = api.events.values()
    assert ev["count"] == 3 and ev["lastTimestamp"] == "2026-01-01T00:00:02Z"
    assert [m for m, _ in api.event_writes()] == ["POST", "PATCH", "PATCH"]


def test_a_lasting_problem_makes_bounded_writes():
    """Seen on every pass of a day: EVENT_BURST writes, then one per EVENT_REFILL_SECONDS."""
    api = FakeApi()
    start = 1_767_225_600  # 2026-01-01T00:00:00Z
    seconds = 86_400
    problem = plan.Event("Warning", "InvalidPods", "spec.pods x")
    for at in range(start, start + seconds, 3):
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
        EventRecorder(api).record("a", "u-1", problem, now)
    [ev] = api.events.values()
    writes = len(api.event_writes())
    assert writes == ev["count"]
    assert writes <= EVENT_BURST + seconds / EVENT_REFILL_SECONDS + 1
    assert writes >= seconds / EVENT_REFILL_SECONDS  # still counting while it lasts


def test_an_event_deleted_meanwhile_is_made_again():
    t = teamspace(name="Bad_Name")
    api = FakeApi()
    ex = Executor(api, archive_dir="/nonexistent")
    ex.execute(t, plan.plan(t, None, None, NOW), NOW)
    api.events.clear()  # its TTL, or kubectl delete
    ex.execute(t, plan.plan(t, None, None, NOW), NOW)
    assert [m for m, _ in api.event_writes()] == ["POST", "PATCH", "POST"]
    [ev] = api.events.values()
    assert ev["count"] == 1


def test_an_event_another_writer_counted_is_read_again_not_lowered():
    t = teamspace(name="Bad_Name")
    api = FakeApi()
    ex = Executor(api, archive_dir="/nonexistent")
    ex.execute(t, plan.plan(t, None, None, NOW), NOW)
    [ev] = api.events.values()
    ev.update(count=7)  # another controller host, leading for a while
    ev["metadata"]["resourceVersion"] = "500"
    ex.execute(t, plan.plan(t, None, None, NOW), NOW)
    assert ev["count"] == 8
    assert [m for m, _ in api.event_writes()] == ["POST", "PATCH", "PATCH"]


def test_an_event_that_cannot_be_read_is_logged_and_not_fatal():
    class Forbidden(FakeApi):
        def request(self, method, path, **kw):
            if method == "GET" and "/events/" in path:
                raise ApiError(403, "Forbidden", "events is forbidden")
            return super().request(method, path, **kw)

    api = Forbidden()
    result, _, logged = run(api, teamspace(name="Bad_Name"))
    assert result.problems and not result.failed and not api.events
    assert any("could not read the Event InvalidName" in line for line in logged)


def test_what_to_send_given_the_previous_event_and_now():
    new = {"metadata": {"name": "a.cnpa.0"}, "count": 1}
    assert event_write(None, new, NOW) == ("POST", new)

    def seen(count, last, rv="9"):
        return {"count": count, "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": last,
                "metadata": {"resourceVersion": rv}}

    # Within the burst every sighting is written, however soon.
    assert event_write(seen(1, NOW), new, NOW) == \
        ("PATCH", {"count": 2, "lastTimestamp": NOW, "metadata": {"resourceVersion": "9"}})
    assert event_write(seen(EVENT_BURST - 1, NOW), new, NOW)[1]["count"] == EVENT_BURST
    # Past it, once per refill period.
    assert event_write(seen(EVENT_BURST, NOW), new, "2026-01-01T00:04:59Z") is None
    assert event_write(seen(EVENT_BURST, NOW), new, "2026-01-01T00:05:00Z") == \
        ("PATCH", {"count": EVENT_BURST + 1, "lastTimestamp": "2026-01-01T00:05:00Z",
                   "metadata": {"resourceVersion": "9"}})
    # A time far ahead of ours (a host with a wrong clock wrote it) does not hold it for good;
    # one slightly ahead does.
    assert event_write(seen(EVENT_BURST, "2026-01-01T06:00:00Z"), new, NOW) is not None
    assert event_write(seen(EVENT_BURST, "2026-01-01T00:00:30Z"), new, NOW) is None
    # Fractions of a second, or what is not a time at all.
    assert event_write(seen(EVENT_BURST, "2026-01-01T00:00:00.123456Z"), new,
                       "2026-01-01T00:05:00Z") is not None
    assert event_write(seen(EVENT_BURST, "junk"), new, NOW) is not None
    # An Event without count (another client's) counts as one; without a version, unguarded.
    assert event_write({"lastTimestamp": NOW}, new, NOW) == \
        ("PATCH", {"count": 2, "lastTimestamp": NOW})


def test_the_spam_filter_is_a_token_bucket_per_teamspace():
    clock = [0.0]
    spam = SpamFilter(burst=3, refill_seconds=10.0, size=2, clock=lambda: clock[0])
    assert [spam.allow("u-1") for _ in range(4)] == [True, True, True, False]
    assert spam.allow("u-2")  # its own bucket
    clock[0] = 10.0
    assert [spam.allow("u-1") for _ in range(2)] == [True, False]
    clock[0] = 1000.0  # refilled up to the burst, not beyond
    assert [spam.allow("u-1") for _ in range(4)] == [True, True, True, False]
    # Bounded: the least recently used bucket goes (and comes back full).
    spam.allow("u-3")
    assert len(spam._buckets) == 2 and "u-2" not in spam._buckets


def test_many_problems_of_one_teamspace_are_bounded_by_its_bucket():
    """An object whose problem keeps changing (each message its own Event) cannot flood etcd."""
    api = FakeApi()
    rec = EventRecorder(api)
    outcomes = [rec.record("a", "u-1", plan.Event("Warning", "Flapping", f"message {i}"), NOW)
                for i in range(EVENT_BURST + 10)]
    assert len(api.event_writes()) == EVENT_BURST
    assert [o.outcome for o in outcomes] == [RECORDED] * EVENT_BURST + [HELD] * 10
    rec.record("b", "u-2", plan.Event("Warning", "Flapping", "another object"), NOW)
    assert len(api.event_writes()) == EVENT_BURST + 1


def test_the_memory_of_events_is_bounded(monkeypatch):
    monkeypatch.setattr("cnpa_controller.events.RECORDED_EVENTS_MAX", 3)
    api = FakeApi()
    rec = EventRecorder(api)
    for i in range(5):
        rec.record(f"t{i}", f"u-{i}", plan.Event("Warning", "Bad", "x"), NOW)
    assert len(rec._recorded) == 3 and len(api.events) == 5


def test_event_names_stay_what_earlier_versions_named_them():
    """An Event's name is how a problem already recorded is found again: a new version that named
    it otherwise would record every lasting problem once more after an upgrade."""
    assert event_name("a", "u-1", "QuotaScoped", "quota x y") == "a.cnpa.797faa88c26c05cb"


def test_an_unknown_intent_is_an_error_not_a_skipped_write():
    with pytest.raises(ValueError):
        request_of(plan.Intent("a", "u", "something"), {})


def test_archive_temporary_names_are_what_the_sweep_removes(tmp_path):
    fd, path = mktemp(str(tmp_path), ".a.json.")
    os.close(fd)
    assert fnmatch.fnmatch(os.path.basename(path), ".*.json.??????")


CM_PATH = "/api/v1/namespaces/cnpa-system/configmaps"


def test_with_an_archive_namespace_the_record_is_also_in_the_cluster_before_the_release(tmp_path):
    order = []
    api = FakeApi(on_request=lambda method, path, body: order.append((method, path)))
    result, said, _ = run(api, teamspace(finalizers=[FIN], deleting=True), tmp_path=tmp_path,
                          archive_namespace="cnpa-system")
    assert order == [("POST", CM_PATH), ("PATCH", TS_PATH)]
    cm = api.calls[0][3]
    assert cm["metadata"]["name"] == "archive-u-1"
    assert cm["metadata"]["labels"]["platform.labhub.io/archived-teamspace"] == "a"
    assert cm["data"] == {"a.json": '{"name":"a","uid":"u-1","pods":3}\n'}
    assert said[-2:] == ["archived to ConfigMap cnpa-system/archive-u-1", "finalizer released"]
    assert not result.failed


def test_a_record_the_cluster_cannot_keep_keeps_the_finalizer(tmp_path):
    api = FakeApi(fail={("POST", CM_PATH): ApiError(403, "Forbidden", "configmaps is forbidden")})
    result, _, logged = run(api, teamspace(finalizers=[FIN], deleting=True), tmp_path=tmp_path,
                            archive_namespace="cnpa-system")
    assert result.failed and "ArchiveFailed" in result.errors
    assert ("PATCH", TS_PATH) not in api.writes()
    assert any("cannot keep the archive record" in line for line in logged)
    # The next pass finds the record on disk and tries the cluster's copy again, then releases.
    api = FakeApi()
    result, _, _ = run(api, teamspace(finalizers=[FIN], deleting=True), tmp_path=tmp_path,
                       archive_namespace="cnpa-system")
    assert api.writes() == [("POST", CM_PATH), ("PATCH", TS_PATH)]
    assert not result.failed


def test_a_record_already_in_the_cluster_is_the_record(tmp_path):
    """Made by an earlier pass or another host: read, found to be this record, and released."""
    record = '{"name":"a","uid":"u-1","pods":3}'
    there = archive_configmap("a", "u-1", record, "cnpa-system")
    api = FakeApi(fail={("POST", CM_PATH): ApiError(409, "AlreadyExists", "exists")},
                  answers={("GET", f"{CM_PATH}/archive-u-1"): there})
    result, _, _ = run(api, teamspace(finalizers=[FIN], deleting=True), tmp_path=tmp_path,
                       archive_namespace="cnpa-system")
    assert ("PATCH", TS_PATH) in api.writes()
    assert not result.failed


@pytest.mark.parametrize("change", ["data", "labels"])
def test_a_configmap_in_place_that_is_not_the_record_keeps_the_finalizer(tmp_path, change):
    """archive-UID made beforehand by somebody else (uids are public), or edited: not trusted
    as the record of this deletion; a Warning Event says which ConfigMap to remove."""
    forged = archive_configmap("a", "u-1", '{"name":"a","uid":"u-1","pods":99}', "cnpa-system")
    if change == "labels":
        forged = archive_configmap("a", "u-1", '{"name":"a","uid":"u-1","pods":3}', "cnpa-system")
        del forged["metadata"]["labels"]["platform.labhub.io/archived-teamspace"]
    api = FakeApi(fail={("POST", CM_PATH): ApiError(409, "AlreadyExists", "exists")},
                  answers={("GET", f"{CM_PATH}/archive-u-1"): forged})
    result, said, _ = run(api, teamspace(finalizers=[FIN], deleting=True), tmp_path=tmp_path,
                          archive_namespace="cnpa-system")
    assert result.failed and "finalizer released" not in said
    assert ("PATCH", TS_PATH) not in api.writes()
    [event] = [b for m, p, _, b in api.calls if p.endswith("/events")]
    assert (event["type"], event["reason"]) == ("Warning", "ArchiveRecordMismatch")
    assert "kubectl delete configmap -n cnpa-system archive-u-1" in event["message"]


def test_the_record_in_the_cluster_is_immutable(tmp_path):
    api = FakeApi()
    run(api, teamspace(finalizers=[FIN], deleting=True), tmp_path=tmp_path,
        archive_namespace="cnpa-system")
    [body] = [b for m, p, _, b in api.calls if (m, p) == ("POST", CM_PATH)]
    assert body["immutable"] is True


def test_a_teamspace_gone_when_written_is_no_failure_and_no_event(tmp_path):
    api = FakeApi(fail={("PATCH", TS_PATH): ApiError(404, "NotFound", "teamspaces \"a\" not found")})
    result, _, _ = run(api, teamspace(finalizers=[FIN], deleting=True), tmp_path=tmp_path)
    assert result.gone and not result.failed
    assert not [c for c in api.calls if c[1].endswith("/events")]


def test_a_full_disk_never_costs_the_earlier_record(small_disk):
    """The earlier record is copied aside before NAME.json is replaced. On a full disk that copy
    fails: nothing torn may be left for a later pass (once there is room again) to take for a
    good copy and then replace the only complete one."""
    d = small_disk.path
    earlier = '{"name":"a","uid":"old","pods":1}\n'
    (d / "a.json").write_text(earlier)
    small_disk.fill()
    t = teamspace(finalizers=[FIN], deleting=True)
    result, said, _ = run(FakeApi(), t, tmp_path=d)
    assert result.failed and "finalizer released" not in said
    assert (d / "a.json").read_text() == earlier
    small_disk.free()
    result, said, _ = run(FakeApi(), t, tmp_path=d)
    assert not result.failed and said[-1] == "finalizer released"
    assert (d / "a.old.json").read_text() == earlier
    assert json.loads((d / "a.json").read_text())["uid"] == "u-1"
    assert sorted(p.name for p in d.iterdir()) == ["a.json", "a.old.json"]


def test_a_torn_copy_of_the_earlier_record_is_made_again(tmp_path):
    earlier = '{"name":"a","uid":"old","pods":1}\n'
    (tmp_path / "a.json").write_text(earlier)
    (tmp_path / "a.old.json").write_text('{"name":"a","ui')  # left by an older version
    run(FakeApi(), teamspace(finalizers=[FIN], deleting=True), tmp_path=tmp_path)
    assert (tmp_path / "a.old.json").read_text() == earlier


# -- every write a deposed leader could still land carries a precondition -----------------------

def _every_intent() -> list:
    """At least one intent of every kind the plan makes, from states that call for them."""
    t = teamspace(finalizers=[FIN], status={"namespaceUID": "ns-1", "observedGeneration": 1})
    ours = {"metadata": {"name": "team-a", "uid": "ns-1", "resourceVersion": "3",
                         "labels": {plan.LABEL: "a"}, "ownerReferences": [plan.owner_reference(t)]}}
    quota = {"apiVersion": "v1", "kind": "ResourceQuota",
             "metadata": {"name": "team-quota", "namespace": "team-a", "resourceVersion": "5"},
             "spec": {"hard": {"pods": "9", "requests.cpu": "1", "secrets": "1"}}}
    orphan = {"metadata": {**ours["metadata"], "ownerReferences": []}}
    intents = [*plan.plan(teamspace(), None, None, NOW),                      # finalizer, creates
               *plan.plan(teamspace(finalizers=["x"]), None, None, NOW),      # finalizer, not first
               *plan.plan(teamspace(finalizers=[FIN, FIN]), ours, quota, NOW),
               *plan.plan(t, orphan, quota, NOW),                             # owner, quota, status
               *plan.plan(teamspace(finalizers=[FIN], deleting=True), None, None, NOW)]
    return intents


def test_every_write_a_late_leader_could_land_is_conditional():
    """The fence (is_leader() just before each write, a write timeout of lease - renew seconds)
    bounds when a write is SENT, not when the API server applies it: a deposed leader's write
    can land after a takeover. So every write is conditional on the state it was planned from:
    a replace or merge patch carries the resourceVersion read, a JSON patch starts with a test
    op, and a create fails when the object exists (a namespace also names its TeamSpace's uid as
    owner, so one made late for a TeamSpace since deleted is collected). A new kind of write
    without one fails here."""
    written = {}
    kinds = set()
    for intent in _every_intent():
        if isinstance(intent, (plan.Report, plan.Archive)):
            continue   # an Event (create or guarded patch) and a file: no write of the objects
        kinds.add(type(intent))
        requests = [request_of(intent, written)]
        if isinstance(intent, plan.SetQuota):
            requests.append(request_of(intent, written, fallback=True))
        for method, path, ctype, body in requests:
            what = f"{type(intent).__name__}: {method} {path}"
            if method == "POST":
                if isinstance(intent, plan.CreateNamespace):
                    assert body["metadata"]["ownerReferences"][0]["uid"] == intent.uid, what
                continue
            if ctype == "application/json-patch+json":
                assert body[0]["op"] == "test", what
            else:
                assert (body.get("metadata") or {}).get("resourceVersion"), what
    writers = {c for c in vars(plan).values() if isinstance(c, type) and issubclass(c, plan.Intent)
               and c not in (plan.Intent, plan.Report, plan.Archive)}
    assert kinds == writers, f"not covered: {writers - kinds}"
