"""Warning and Normal Events on TeamSpaces, recorded as client-go's recorder records them.

An Event is named from (TeamSpace uid, reason, message), as earlier versions named it, so a
problem is one Event however often it is seen: seen again, it is counted on that Event (count and
lastTimestamp, a merge patch guarded by the resourceVersion read), rate-limited as client-go's
recorder limits it (tools/record/events_cache.go): event_write decides from the Event alone, so
that a pass without memory decides as the long-running controller does, and SpamFilter bounds
the writes about one TeamSpace whose problem keeps changing.

EventRecorder.record() says what became of an Event (RECORDED, HELD, FAILED, NOT_LEADER) and
leaves the saying and the stopping to its caller (the executor). Best effort: a failure is logged,
never fatal.
"""

from __future__ import annotations

import calendar
import hashlib
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from . import plan
from .api import MERGE_PATCH, Api, ApiError, path_of
from .logs import about
from .plan import API_VERSION, MANAGED_BY

# client-go's recorder defaults: an Event may be written EVENT_BURST times in a row, then once per
# EVENT_REFILL_SECONDS, so that a problem that lasts (or an object that flaps) cannot flood etcd;
# each write also renews the Event's TTL on the API server, so a lasting problem keeps its Event.
EVENT_BURST = 25
EVENT_REFILL_SECONDS = 300.0
# Bound of each of the recorder's memories (the Events it wrote, the spam filter's buckets): least
# recently used first out.
RECORDED_EVENTS_MAX = 10000

# What record() returns.
RECORDED, HELD, FAILED, NOT_LEADER = "recorded", "held", "failed", "not-leader"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Recorded:
    """What became of one Event: RECORDED (count: as the server now has it), HELD (written too
    often lately, or no uid to name it by), FAILED (logged), NOT_LEADER (not written: this
    process may not write now)."""

    outcome: str
    count: int = 0


def event_name(teamspace: str, uid: str, reason: str, message: str) -> str:
    """An Event's name: one per (TeamSpace uid, reason, message), the same in every version."""
    digest = hashlib.sha256(f"{uid}\n{reason}\n{message}".encode()).hexdigest()[:16]
    return f"{teamspace[:200]}.cnpa.{digest}"


def event_object(teamspace: str, uid: str, type_: str, reason: str, message: str,
                 namespace: str, now: str) -> dict:
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": event_name(teamspace, uid, reason, message), "namespace": namespace,
                         "labels": dict([MANAGED_BY])},
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


class EventRecorder:
    """Records Events on TeamSpaces in `namespace`; may_write() is asked just before each write
    (the Lease's fence)."""

    def __init__(self, api: Api, namespace: str = "default", *,
                 may_write: Callable[[], bool] = lambda: True) -> None:
        self.api = api
        self.namespace = namespace
        self.may_write = may_write
        # Event name -> the Event as the server last answered (what event_write needs of it):
        # the long-running controller reads an Event only when it does not know it yet.
        self._recorded: OrderedDict[str, dict] = OrderedDict()
        self._lock = threading.Lock()
        self.spam = SpamFilter()
        self.writes = 0  # Event creates and patches sent and answered

    def record(self, name: str, uid: str, event: plan.Event, now: str) -> Recorded:
        """Record a problem as an Event on TeamSpace name (uid): one per distinct problem, counted
        each time it is seen again (event_write, SpamFilter say when not)."""
        if not uid:
            return Recorded(HELD)
        obj = event_object(name, uid, event.type, event.reason, event.message, self.namespace,
                           now)
        ev = obj["metadata"]["name"]
        spent = False
        # Twice at most: a second time only after somebody else wrote or deleted it meanwhile.
        for _attempt in (1, 2):
            try:
                previous = self._known(ev)
                if previous is None:
                    previous = self._read(obj)
            except ApiError as exc:
                log.warning("TeamSpace %s: could not read the Event %s: %s", name, event.reason,
                            exc, extra=about(name))
                return Recorded(FAILED)
            send = event_write(previous, obj, now)
            if send is None:
                return Recorded(HELD)
            if not spent:
                if not self.spam.allow(uid):
                    return Recorded(HELD)
                spent = True
            if not self.may_write():
                return Recorded(NOT_LEADER)
            try:
                answer = self._send(obj, *send)
            except ApiError as exc:
                self._forget(ev)
                if exc.status == 409:
                    continue  # AlreadyExists, or a patch of an older version: read it again
                log.warning("TeamSpace %s: could not record the Event %s: %s", name,
                            event.reason, exc, extra=about(name))
                return Recorded(FAILED)
            self._remember(ev, answer)
            return Recorded(RECORDED, answer.get("count") or 1)
        return Recorded(FAILED)

    def _send(self, obj: dict, method: str, body: dict) -> dict:
        if method == "PATCH":
            try:
                return self.api.request("PATCH", path_of(obj), body=body, content_type=MERGE_PATCH)
            except ApiError as exc:
                if exc.status != 404:
                    raise
            # Deleted meanwhile (its TTL, or by hand): made again, as client-go does.
        return self.api.request("POST", path_of(obj, collection=True), body=obj)

    def _read(self, obj: dict) -> dict | None:
        try:
            return self.api.request("GET", path_of(obj))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def _known(self, ev: str) -> dict | None:
        with self._lock:
            known = self._recorded.get(ev)
            if known is not None:
                self._recorded.move_to_end(ev)
            return known

    def _remember(self, ev: str, answer: dict) -> None:
        """An Event write went through: what the server answered is what the next one builds on."""
        kept = {k: answer.get(k) for k in ("count", "firstTimestamp", "lastTimestamp")}
        kept["metadata"] = {"resourceVersion": (answer.get("metadata") or {}).get("resourceVersion")}
        with self._lock:
            self.writes += 1
            self._recorded[ev] = kept
            self._recorded.move_to_end(ev)
            if len(self._recorded) > RECORDED_EVENTS_MAX:
                self._recorded.popitem(last=False)

    def _forget(self, ev: str) -> None:
        with self._lock:
            self._recorded.pop(ev, None)
