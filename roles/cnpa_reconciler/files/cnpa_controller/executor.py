"""Send one TeamSpace's planned writes: the one executor, of every pass (--once, reconcile.sh)
and of the long-running controller.

The plan (plan.plan) decides every write; this module turns each intent into its request and
sends it, one TeamSpace at a time, and so each write's error belongs to that TeamSpace by
construction:
- steps in the plan's order (plan.STEPS); a write that fails leaves its TeamSpace out of the
  later steps, so its status never claims what is not in place;
- a status replace carries the resourceVersion our own earlier write returned (else it would
  conflict with it) and the uid of the namespace created a moment ago;
- the archive record of a deleting TeamSpace is written to a temporary file, flushed, renamed and
  its directory flushed before its finalizer may be released; an earlier record of the same name
  with another uid is kept as NAME.UID.json; an archive directory that is missing or was replaced
  (the service's sandbox still binds the old one) refuses every release: the controller then
  exits 4 so that systemd restarts it with fresh mounts;
- a quota's guarded replace (resourceVersion) that fails is followed by its fallback, an
  unguarded merge patch, sent alone;
- patches of a TeamSpace are guarded by its uid (a JSON patch test op): a TeamSpace deleted and
  made again under the same name since the cache saw it is never patched by mistake;
- a conflict (optimistic concurrency) is routine: logged, retried, no Event; another failure is a
  Warning Event and, unless it was the status write itself, Ready False (plan.failed_status);
- Events are named from (uid, reason, message), as earlier versions named them, so a problem is one
  Event however often it is seen; the Events of the plan's writes (QuotaReverted) go out once the
  write went through. A problem seen again counts on its Event (count, lastTimestamp: a merge
  patch), rate-limited as client-go's recorder limits it (tools/record/events_cache.go), see
  event_write and SpamFilter.
"""

from __future__ import annotations

import calendar
import errno
import fnmatch
import hashlib
import json
import logging
import os
import random
import string
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from . import plan
from .api import Api, ApiError, path_of
from .config import Settings
from .logs import about
from .plan import API_VERSION, FINALIZER, LABEL, NAMESPACE_NOT_OURS, STEPS

ARCHIVE_FAILED = plan.ARCHIVE_FAILED
CONFLICT = "Conflict"
MANAGED_BY = ("app.kubernetes.io/managed-by", "cnpa-op")
JSON_PATCH, MERGE_PATCH = "application/json-patch+json", "application/merge-patch+json"
# client-go's recorder defaults: an Event may be written EVENT_BURST times in a row, then once per
# EVENT_REFILL_SECONDS, so that a problem that lasts (or an object that flaps) cannot flood etcd;
# each write also renews the Event's TTL on the API server, so a lasting problem keeps its Event.
EVENT_BURST = 25
EVENT_REFILL_SECONDS = 300.0
# Bound of each of the executor's Event memories (the Events it wrote, the spam filter's buckets):
# least recently used first out.
RECORDED_EVENTS_MAX = 10000

log = logging.getLogger(__name__)


class NotLeader(Exception):
    """Leadership was lost before a write: the pass stops, writing nothing more."""


class TeamSpaceGone(Exception):
    """The TeamSpace no longer exists (404 on a write to it): its pass ends, nothing failed."""


@dataclass
class Result:
    """What became of one TeamSpace's pass."""
    writes: int = 0
    failed: bool = False  # some write failed (conflicts included): retry with backoff
    problems: bool = False  # the plan reported what no write can fix
    not_leader: bool = False
    gone: bool = False  # the TeamSpace was gone when written to
    archive_broken: bool = False
    errors: list = field(default_factory=list)  # reasons of the failures


def event_name(teamspace: str, uid: str, reason: str, message: str) -> str:
    """An Event's name: one per (TeamSpace uid, reason, message), the same in every version."""
    digest = hashlib.sha256(f"{uid}\n{reason}\n{message}".encode()).hexdigest()[:16]
    return f"{teamspace[:200]}.cnpa.{digest}"


def event_object(teamspace: str, uid: str, type_: str, reason: str, message: str,
                 namespace: str, now: str) -> dict:
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": event_name(teamspace, uid, reason, message), "namespace": namespace,
                         "labels": {MANAGED_BY[0]: MANAGED_BY[1]}},
            "involvedObject": {"apiVersion": API_VERSION, "kind": "TeamSpace", "name": teamspace,
                               "uid": uid},
            "type": type_, "reason": reason, "message": message[:1024], "count": 1,
            "firstTimestamp": now, "lastTimestamp": now, "source": {"component": "cnpa-op"}}


def _seconds(timestamp: object) -> float | None:
    """Unix time of an RFC 3339 timestamp as the API server writes an Event's (UTC, whole
    seconds; a fraction is ignored); None if it is not one."""
    try:
        return float(calendar.timegm(time.strptime(str(timestamp)[:19], "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


def event_write(previous: dict | None, new: dict, now: str) -> tuple[str, dict] | None:
    """What to send for a problem seen at `now`, given its Event as the server last answered
    (None: there is none): ("POST", the new Event), ("PATCH", a merge patch counting it once
    more), or None: nothing, the Event was written too often lately.

    Decided from the Event alone, so that a pass (which keeps nothing from one pass to the next)
    decides as the long-running controller does: the first EVENT_BURST writes go through, after
    that one per EVENT_REFILL_SECONDS (client-go's spam filter for a problem that lasts). The
    patch carries the resourceVersion read: a count another writer raised meanwhile is read
    again (409), never lowered."""
    if previous is None:
        return "POST", new
    count = previous.get("count") or 1
    last = _seconds(previous.get("lastTimestamp") or previous.get("firstTimestamp"))
    at = _seconds(now)
    # A time that cannot be read, or far ahead of ours (a host whose clock was wrong), must not
    # hold the Event back for good.
    due = (count < EVENT_BURST or last is None or at is None
           or not -EVENT_REFILL_SECONDS < at - last < EVENT_REFILL_SECONDS)
    if not due:
        return None
    patch: dict = {"count": count + 1, "lastTimestamp": now}
    version = (previous.get("metadata") or {}).get("resourceVersion")
    if version:
        patch["metadata"] = {"resourceVersion": version}
    return "PATCH", patch


class SpamFilter:
    """client-go's EventSourceObjectSpamFilter: a token bucket per TeamSpace (its uid; the source
    is always this controller) that every Event write about it takes a token from, so that an
    object whose problem keeps changing (a new message is a new Event, which event_write cannot
    hold back) is bounded too. In memory only: it spans the long-running controller's life, and
    one pass."""

    def __init__(self, burst: int = EVENT_BURST, refill_seconds: float = EVENT_REFILL_SECONDS,
                 size: int = RECORDED_EVENTS_MAX, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.burst, self.refill_seconds, self.size, self._clock = burst, refill_seconds, size, clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (tokens, when)
        self._lock = threading.Lock()

    def allow(self, key: str) -> bool:
        with self._lock:
            now = self._clock()
            tokens, then = self._buckets.pop(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - then) / self.refill_seconds)
            allowed = tokens >= 1.0
            self._buckets[key] = (tokens - 1.0 if allowed else tokens, now)
            if len(self._buckets) > self.size:
                self._buckets.popitem(last=False)
            return allowed


ARCHIVE_LABEL = "platform.labhub.io/archived-teamspace"


def archive_configmap(teamspace: str, uid: str, record: str, namespace: str) -> dict:
    """The cluster's copy of an archive record: one ConfigMap per deleted TeamSpace (by uid, so a
    second TeamSpace of the same name gets its own), labelled with the TeamSpace's name so that
    `kubectl get configmaps -n NAMESPACE -l platform.labhub.io/archived-teamspace=NAME` finds
    every record of that name. Immutable: its data can never be changed, only the whole record
    deleted (the role's admission policy refuses the rest, and any create but the controller's)."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"archive-{uid}", "namespace": namespace,
                         "labels": {MANAGED_BY[0]: MANAGED_BY[1], ARCHIVE_LABEL: teamspace[:63]}},
            "data": {f"{teamspace}.json": record + "\n"}, "immutable": True}


def same_record(have: dict, want: dict) -> bool:
    """An archive ConfigMap found in place is this record: the same data, labelled as ours."""
    labels = (have.get("metadata") or {}).get("labels") or {}
    return (have.get("data") == want["data"]
            and all(labels.get(k) == v for k, v in want["metadata"]["labels"].items()))


def _teamspace_path(name: str, subresource: str = "") -> str:
    return path_of({"apiVersion": API_VERSION, "kind": "TeamSpace", "metadata": {"name": name}},
                   subresource=subresource)


def _guarded(intent: plan.Intent, ops: list) -> list:
    """A JSON patch of a TeamSpace, guarded by its uid: a TeamSpace deleted and made again under
    the same name since it was read is never patched by mistake."""
    return [{"op": "test", "path": "/metadata/uid", "value": intent.uid}, *ops] if intent.uid else ops


def _remove_ours_at(index: int) -> list:
    return [{"op": "test", "path": f"/metadata/finalizers/{index}", "value": FINALIZER},
            {"op": "remove", "path": f"/metadata/finalizers/{index}"}]


def request_of(intent: plan.Intent, written: dict, *, fallback: bool = False
               ) -> tuple[str, str, str | None, object]:
    """(method, path, content type, body) of an intent. written: path -> (resourceVersion, uid) of
    what this TeamSpace's earlier writes returned. fallback: a SetQuota's second request."""
    if isinstance(intent, plan.AddFinalizer):
        ops = ([{"op": "test", "path": "/metadata/finalizers", "value": None},
                {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}]
               if intent.first else [{"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}])
        return "PATCH", _teamspace_path(intent.teamspace), JSON_PATCH, _guarded(intent, ops)
    if isinstance(intent, (plan.RemoveDuplicateFinalizer, plan.ReleaseFinalizer)):
        return ("PATCH", _teamspace_path(intent.teamspace), JSON_PATCH,
                _guarded(intent, _remove_ours_at(intent.index)))
    if isinstance(intent, plan.CreateNamespace):
        return "POST", path_of(intent.namespace, collection=True), None, intent.namespace
    if isinstance(intent, plan.RestoreNamespaceOwner):
        # The resourceVersion makes the merge patch conditional.
        return ("PATCH", f"/api/v1/namespaces/{intent.namespace}", MERGE_PATCH,
                {"metadata": {"resourceVersion": intent.resource_version,
                              "ownerReferences": intent.owner_references}})
    if isinstance(intent, plan.CreateQuota):
        return "POST", path_of(intent.quota, collection=True), None, intent.quota
    if isinstance(intent, plan.SetQuota):
        if fallback:
            # Conditional on the limits as read, not on the resourceVersion (which the quota's
            # status updates keep moving): a late write, such as a deposed leader's, cannot undo
            # a newer one. Replacing the map removes the limits we do not set.
            return ("PATCH", path_of(intent.quota), JSON_PATCH,
                    [{"op": "test", "path": "/spec/hard", "value": intent.was},
                     {"op": "replace", "path": "/spec/hard", "value": intent.hard}])
        return "PUT", path_of(intent.quota), None, intent.quota
    if isinstance(intent, plan.SetStatus):
        body = json.loads(json.dumps(intent.teamspace_object))
        mine = written.get(_teamspace_path(intent.teamspace))
        if mine:  # our own finalizer patch a moment ago: else this replace conflicts with it
            body["metadata"]["resourceVersion"] = mine[0]
        if intent.namespace_created:
            ns = written.get(f"/api/v1/namespaces/team-{intent.teamspace}")
            body["status"]["namespaceUID"] = ns[1] if ns else None
        return "PUT", _teamspace_path(intent.teamspace, "status"), None, body
    raise ValueError(f"the plan has an intent this executor does not know: {intent!r}")


def written_key(method: str, path: str, body: object) -> str:
    """The object a request wrote, as request_of's `written` names it: its path (a create is sent
    to its collection, a status replace to the subresource)."""
    return path_of(body) if method == "POST" else path.removesuffix("/status")


def _short_json(value: object) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= 200 else f"{text[:200]}... ({len(text)} characters)"


def is_conflict(exc: ApiError) -> bool:
    """Somebody wrote the object since it was read: routine, retried, not worth an Event. A JSON
    patch whose test op failed (the list or the uid changed meanwhile) is one too."""
    if exc.status == 409 and exc.reason != "AlreadyExists":
        return True
    # What the API server answers when a JSON patch's test op fails.
    text = exc.message.lower()
    return exc.status == 422 and ("rejected our request due to an error in our request" in text
                                  or "testing value" in text)


def kept_record_path(d: str, name: str, uid: str, have: str) -> str:
    """Where the record found at NAME.json is kept before the record of `uid` replaces it: "" when
    it is an earlier copy of that same deletion's record; NAME.OLDUID.json when it records another
    deletion of that name; NAME.unreadable-DIGEST.json when it cannot be read as a record (torn by
    hand, or from a tool of somebody else's): nothing found there is overwritten unread. (Long
    names: without NAME, as the record itself then is.)"""
    try:
        old = json.loads(have).get("uid") or ""
    except (ValueError, AttributeError):
        old = ""
    if old == uid:
        return ""
    if not old or not isinstance(old, str) or "/" in old:
        old = "unreadable-" + hashlib.sha256(have.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return os.path.join(d, f"{name}.{old}.json" if len(name) <= 200 else f"{old}.json")


def archive_directory_broken(path: str) -> bool:
    """The directory was removed or replaced since the service's sandbox bound it (it sees a
    deleted directory, link count 0, or the read-only file system beneath once the kernel has
    detached the bind mount), or it is missing and cannot be made."""
    try:
        if os.path.isdir(path) and os.stat(path).st_nlink == 0:
            return True
        os.makedirs(path, exist_ok=True)
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return True


def _fsync_path(path: str, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Executor:
    def __init__(self, api: Api, *, archive_dir: str, event_namespace: str = "default",
                 archive_namespace: str = "",
                 may_write: Callable[[], bool] = lambda: True,
                 observe: Callable[[dict], None] = lambda obj: None,
                 say: Callable[[str, str], None] = lambda name, what: None,
                 count: Callable[..., None] = lambda name, labels=None: None) -> None:
        self.api = api
        self.archive_dir = archive_dir
        self.event_namespace = event_namespace
        self.archive_namespace = archive_namespace
        self.may_write = may_write
        self.observe = observe
        self.say = say
        self.count = count
        # Event name -> the Event as the server last answered (what event_write needs of it):
        # the long-running controller reads an Event only when it does not know it yet.
        self._recorded: OrderedDict[str, dict] = OrderedDict()
        self._recorded_lock = threading.Lock()
        self.spam = SpamFilter()
        self.event_writes = 0  # Event creates and patches sent and answered
        self._swept = ""  # the archive directory whose leftovers are gone
        self._sweep_lock = threading.Lock()

    @classmethod
    def from_settings(cls, api: Api, settings: Settings, **kw) -> Executor:
        """The executor of a pass or of the controller: where these settings keep records and
        Events; kw: may_write, observe, say, count."""
        return cls(api, archive_dir=settings.archive_dir, event_namespace=settings.event_namespace,
                   archive_namespace=settings.archive_namespace, **kw)

    # -- one TeamSpace ---------------------------------------------------------------------
    def execute(self, teamspace: dict, writes: list, now: str) -> Result:
        result = Result()
        order = {s: i for i, s in enumerate(STEPS)}
        written: dict[str, tuple] = {}
        failures: list[tuple[str, str]] = []
        try:
            for w in sorted(writes, key=lambda w: order[w.step]):
                if result.failed:
                    break  # later steps of a TeamSpace whose write failed are left out
                if isinstance(w, plan.Report):
                    result.problems = True
                    log.warning("TeamSpace %s: %s", w.teamspace, w.event.message, extra=about(w.teamspace))
                    self.event(w.teamspace, w.uid, w.event, now)
                elif isinstance(w, plan.Archive):
                    self._archive(w, result, failures)
                else:
                    self._send(w, written, result, failures, now)
            # Writes that failed for a reason the owner should see: Ready False, once.
            if failures and not teamspace["metadata"].get("deletionTimestamp"):
                reason, message = failures[0]
                for w in plan.failed_status(teamspace, reason, message, now):
                    self._send(w, written, result, [], now)
        except TeamSpaceGone:
            name = teamspace["metadata"]["name"]
            log.info("TeamSpace %s: gone; nothing more to write", name, extra=about(name))
        except NotLeader:
            result.not_leader = True
            name = teamspace["metadata"]["name"]
            log.info("TeamSpace %s: no longer the leader; pass stopped before its next write", name,
                     extra=about(name))
        return result

    def _check_leader(self) -> None:
        if not self.may_write():
            raise NotLeader()

    def _send(self, w: plan.Intent, written: dict, result: Result, failures: list,
              now: str) -> None:
        self._check_leader()
        try:
            path, obj = self._request(w, written)
        except ApiError as exc:
            if not isinstance(w, plan.SetQuota):
                self._failed_write(w, w.op, exc, result, failures, now)
                return
            # The guarded replace lost (to quota admission's status updates, or to an edit):
            # the fallback cannot lose, and what it says is about this quota only.
            self._check_leader()
            try:
                path, obj = self._request(w, written, fallback=True)
            except ApiError as exc2:
                self._failed_write(w, "patch", exc2, result, failures, now)
                return
        meta = obj.get("metadata") or {}
        written[path] = (meta.get("resourceVersion"), meta.get("uid"))
        if obj.get("kind"):
            self.observe(obj)
        result.writes += 1
        self.count("cnpa_writes_total", {"step": w.step, "op": w.op})
        self.say(w.teamspace, w.says)
        ev = getattr(w, "event", None)
        if ev:
            self.event(w.teamspace, w.uid, ev, now)

    def _request(self, w: plan.Intent, written: dict, *, fallback: bool = False) -> tuple[str, dict]:
        method, path, ctype, body = request_of(w, written, fallback=fallback)
        answer = self.api.request(method, path, body=body, content_type=ctype)
        return written_key(method, path, body), answer

    def _failed_write(self, w: plan.Intent, op: str, exc: ApiError, result: Result,
                      failures: list, now: str) -> None:
        step, name = w.step, w.teamspace
        err = str(exc) or "no message"
        on_teamspace = isinstance(w, (plan.AddFinalizer, plan.RemoveDuplicateFinalizer,
                                      plan.ReleaseFinalizer, plan.SetStatus))
        if exc.status == 404 and on_teamspace:
            # The TeamSpace itself is gone (released a moment ago, the watch not there yet):
            # nothing to retry and nothing to tell its owner.
            result.gone = True
            raise TeamSpaceGone()
        if isinstance(w, plan.CreateNamespace) and exc.reason == "AlreadyExists":
            if self._namespace_labelled(w.namespace["metadata"]["name"]):
                # Ours (or labelled for a TeamSpace, which the plan judges): the cache has not
                # seen it yet. Retried, and then the plan sees it.
                self._fail(w, result, failures, CONFLICT,
                           f"namespace create: {err}; the cache had not seen it yet, retrying", now)
            else:
                self._fail(w, result, failures, NAMESPACE_NOT_OURS,
                           f"namespace team-{name} already exists and is not managed by cnpa-op "
                           f"(no {LABEL}={name} label); not adopting or modifying it - delete or "
                           "rename it", now)
        elif is_conflict(exc) or (exc.reason == "AlreadyExists" and step == "quota"):
            self._fail(w, result, failures, CONFLICT,
                       f"{step} {op} conflicted with another write ({err}); retrying", now)
        else:
            self._fail(w, result, failures, f"{step.capitalize()}{op.capitalize()}Failed",
                       f"{step} {op} failed: {err}; retrying", now)

    def _namespace_labelled(self, ns: str) -> bool:
        try:
            obj = self.api.request("GET", f"/api/v1/namespaces/{ns}")
        except ApiError:
            return False
        return LABEL in ((obj.get("metadata") or {}).get("labels") or {})

    def _fail(self, w: plan.Intent, result: Result, failures: list, reason: str, message: str,
              now: str) -> None:
        """A write for one TeamSpace did not go through. The owner learns why from an Event and
        the Ready condition (conflicts excepted)."""
        result.failed = True
        result.errors.append(reason)
        self.count("cnpa_errors_total", {"reason": reason})
        log.warning("TeamSpace %s: %s", w.teamspace, message, extra=about(w.teamspace))
        if reason == CONFLICT:
            return
        self.event(w.teamspace, w.uid, plan.Event("Warning", reason, message), now)
        if w.step != "status":
            failures.append((reason, message))

    # -- archive -----------------------------------------------------------------------------
    def _archive(self, w: plan.Archive, result: Result, failures: list) -> None:
        now = plan.utc_now()
        name, uid, d = w.teamspace, w.uid, self.archive_dir
        if archive_directory_broken(d):
            result.archive_broken = True
            self._fail(w, result, failures, ARCHIVE_FAILED,
                       f"archive directory {d} is missing or was replaced while cnpa-op runs; "
                       "keeping the finalizer until the service restarts (deletion waits)", now)
            return
        self._check_leader()
        record = json.dumps(w.record, separators=(",", ":"), ensure_ascii=False)
        path = os.path.join(d, f"{name}.json" if len(name) <= 240 else f"{uid}.json")
        try:
            # Any bytes: a file that is not UTF-8 is kept aside like any unreadable one.
            with open(path, encoding="utf-8", errors="surrogateescape") as fh:
                have = fh.read()
        except OSError:
            have = None
        if have is not None and have.rstrip("\n") == record:
            # Archived on this host by an earlier pass; the cluster's copy may still be missing.
            self._archive_in_cluster(w, record, result, failures, now)
            return
        self._sweep(d)
        if have is not None:
            keep = kept_record_path(d, name, uid, have)
            if keep:
                try:
                    self._keep(d, name, keep, have)
                except OSError:
                    self._fail(w, result, failures, ARCHIVE_FAILED,
                               f"cannot keep the earlier record of {name} as {keep}; keeping "
                               "the finalizer, deletion waits", now)
                    return
        try:
            self._write_durably(d, name, path, record + "\n")
        except OSError:
            self._fail(w, result, failures, ARCHIVE_FAILED,
                       f"cannot write {path}; keeping the finalizer, deletion waits", now)
            return
        result.writes += 1
        self.count("cnpa_writes_total", {"step": "archive", "op": "write"})
        self.say(name, f"archived to {path}")
        self._archive_in_cluster(w, record, result, failures, now)

    def _archive_in_cluster(self, w: plan.Archive, record: str, result: Result, failures: list,
                            now: str) -> None:
        """With several controller hosts, the host that archived a deletion may die right after
        releasing the finalizer, and its disk with it: the record is also kept in the cluster,
        as ConfigMap archive-UID in the archive namespace, before the release. One already there
        (an earlier pass, another host) is read and must be this record: a ConfigMap of that
        name with other content (made by somebody else, or before the policy protected them) is
        no record of this deletion, and the finalizer stays until it is removed."""
        if not self.archive_namespace:
            return
        name, uid = w.teamspace, w.uid
        obj = archive_configmap(name, uid, record, self.archive_namespace)
        where = f"ConfigMap {self.archive_namespace}/{obj['metadata']['name']}"
        self._check_leader()
        try:
            self.api.request("POST", path_of(obj, collection=True), body=obj)
        except ApiError as exc:
            if exc.reason != "AlreadyExists":
                self._fail(w, result, failures, ARCHIVE_FAILED,
                           f"cannot keep the archive record in {where} ({exc}); keeping the "
                           "finalizer, deletion waits", now)
                return
            try:
                have = self.api.request("GET", path_of(obj))
            except ApiError as exc2:
                self._fail(w, result, failures, ARCHIVE_FAILED,
                           f"{where} exists and cannot be read ({exc2}); keeping the finalizer, "
                           "deletion waits", now)
                return
            if not same_record(have, obj):
                self._fail(w, result, failures, plan.ARCHIVE_RECORD_MISMATCH,
                           f"{where} exists but is not this deletion's record (it holds "
                           f"{_short_json(have.get('data'))}, labels "
                           f"{_short_json((have.get('metadata') or {}).get('labels'))}); not "
                           "trusting it: keeping the finalizer until it is removed (kubectl "
                           f"delete configmap -n {self.archive_namespace} "
                           f"{obj['metadata']['name']})", now)
            return
        result.writes += 1
        self.count("cnpa_writes_total", {"step": "archive", "op": "configmap"})
        self.say(name, f"archived to ConfigMap {self.archive_namespace}/{obj['metadata']['name']}")

    def _sweep(self, d: str) -> None:
        """A process killed between creating a temporary file and renaming it leaves it behind:
        removed once, before this executor makes its own. Not per record: a listing of the
        directory per deletion made a mass deletion quadratic in the records kept (all of it
        holding the interpreter's lock; docs/benchmark.md). Under a lock, so that no temporary
        file of this executor exists while the sweep runs; a pass (reconcile.sh) is one
        executor, so it sweeps once per pass."""
        if self._swept == d:
            return
        with self._sweep_lock:
            if self._swept == d:
                return
            try:
                with os.scandir(d) as entries:
                    for entry in entries:
                        if fnmatch.fnmatchcase(entry.name, ".*.json.??????"):
                            os.unlink(entry.path)
            except OSError:
                return  # tried again with the next record; writing it says what is wrong
            self._swept = d

    def _keep(self, d: str, name: str, keep: str, have: str) -> None:
        """The earlier record, before NAME.json is replaced: a copy made like the record itself
        (temporary file, flushed, renamed), so a full disk or a crash leaves no torn copy that a
        later pass would take for a good one; a copy that exists must be byte for byte the
        earlier record, or it is made again."""
        try:
            with open(keep, encoding="utf-8", errors="surrogateescape") as fh:
                if fh.read() == have:
                    return
        except FileNotFoundError:
            pass
        self._write_durably(d, name, keep, have)

    def _write_durably(self, d: str, name: str, path: str, text: str) -> None:
        """path holds text in full, on disk (file and directory flushed), or is unchanged."""
        tmp = None
        try:
            fd, tmp = self._mktemp(d, f".{name}.json.")
            with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
            tmp = None
            _fsync_path(d, directory=True)
        finally:
            if tmp:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    @staticmethod
    def _mktemp(d: str, prefix: str) -> tuple[int, str]:
        """.NAME.json.XXXXXX, mktemp's form (earlier versions' reconcile.sh left these too: the
        sweep removes either's leftovers)."""
        chars = string.ascii_letters + string.digits
        for _attempt in range(100):
            path = os.path.join(d, prefix + "".join(random.choices(chars, k=6)))
            try:
                return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), path
            except FileExistsError:
                continue
        raise OSError(errno.EEXIST, "no free temporary name", d)

    # -- Events ------------------------------------------------------------------------------
    def event(self, name: str, uid: str, event: plan.Event, now: str) -> None:
        """Record a problem as an Event on the TeamSpace: one per distinct problem, counted each
        time it is seen again (event_write, SpamFilter say when not). Best effort: a failure is
        logged, never fatal."""
        if not uid:
            return
        type_, reason = event.type, event.reason
        obj = event_object(name, uid, type_, reason, event.message, self.event_namespace, now)
        ev = obj["metadata"]["name"]
        spent = False
        # Twice at most: a second time only after somebody else wrote or deleted it meanwhile.
        for _attempt in (1, 2):
            try:
                previous = self._known(ev)
                if previous is None:
                    previous = self._read_event(obj)
            except ApiError as exc:
                log.warning("TeamSpace %s: could not read the Event %s: %s", name, reason, exc,
                            extra=about(name))
                return
            send = event_write(previous, obj, now)
            if send is None:
                return
            if not spent:
                if not self.spam.allow(uid):
                    return
                spent = True
            method, body = send
            self._check_leader()
            try:
                if method == "PATCH":
                    try:
                        answer = self.api.request("PATCH", path_of(obj), body=body,
                                                  content_type=MERGE_PATCH)
                    except ApiError as exc:
                        if exc.status != 404:
                            raise
                        # Deleted meanwhile (its TTL, or by hand): made again, as client-go does.
                        method, body = "POST", obj
                if method == "POST":
                    answer = self.api.request("POST", path_of(obj, collection=True), body=obj)
            except ApiError as exc:
                self._forget(ev)
                if exc.status == 409:
                    continue  # AlreadyExists, or a patch of an older version: read it again
                log.warning("TeamSpace %s: could not record the Event %s: %s", name, reason, exc,
                            extra=about(name))
                return
            self._remember(ev, answer)
            count = answer.get("count") or 1
            self.say(name, f"event {type_} {reason} recorded"
                     + (f" (seen {count} times)" if count > 1 else ""))
            return

    def _read_event(self, obj: dict) -> dict | None:
        try:
            return self.api.request("GET", path_of(obj))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def _known(self, ev: str) -> dict | None:
        with self._recorded_lock:
            known = self._recorded.get(ev)
            if known is not None:
                self._recorded.move_to_end(ev)
            return known

    def _remember(self, ev: str, answer: dict) -> None:
        """An Event write went through: what the server answered is what the next one builds on."""
        kept = {k: answer.get(k) for k in ("count", "firstTimestamp", "lastTimestamp")}
        kept["metadata"] = {"resourceVersion": (answer.get("metadata") or {}).get("resourceVersion")}
        with self._recorded_lock:
            self.event_writes += 1
            self._recorded[ev] = kept
            self._recorded.move_to_end(ev)
            if len(self._recorded) > RECORDED_EVENTS_MAX:
                self._recorded.popitem(last=False)

    def _forget(self, ev: str) -> None:
        with self._recorded_lock:
            self._recorded.pop(ev, None)
