"""Leader election over a coordination.k8s.io/v1 Lease, with client-go's leaderelection semantics.

Every controller host runs an Elector; exactly one of them reconciles (the one that holds the
Lease), the others watch the Lease and take it over when its holder stops renewing it.

How it decides (as client-go's `tryAcquireOrRenew`, checked against its source):
- The Lease records holderIdentity, leaseDurationSeconds, acquireTime, renewTime and
  leaseTransitions. A candidate takes it only when it is free (no holder), or expired: no change
  of the record seen for leaseDurationSeconds, measured from when THIS process last saw the record
  change, on its own monotonic clock. renewTime is written for people and other tools but never
  compared with our clock, so clock skew between hosts does not matter (only their rates do).
- Every write is a PUT (or the first POST) carrying the resourceVersion that was read: of two
  candidates that both saw the lease expire, the second write fails with 409 Conflict, so two can
  never both win. leaseTransitions is incremented when the holder changes.
- The holder renews every retry period (from the start of one renewal to the next), as
  client-go's fast path does: one PUT of the Lease it last wrote (its resourceVersion), no read
  first. Only a conflict (409) or not leading sends it back to read the Lease first. Renewals
  are sequential (each carries the resourceVersion the one before returned), so the fence holds
  without a gap while every request is answered within renew/2 seconds (3.5 s by default; more
  exactly while max(retry, latency) + latency <= renew). Slower renewals that still succeed keep
  the Lease but leave gaps of 2 x latency - renew seconds per renewal, in which this process
  does not write (25 % of the time at 4 s, by the unit tests of the decisions). A request is
  given up after renew - retry seconds (the pending-write rule below covers one that landed).
- Unlike client-go, a record that names our identity counts as ours only if it is exactly the
  record we last wrote (or the one a renewal whose answer was lost tried to write: it may have
  landed): a second process with the same identity (a restarted service beside a frozen old one)
  is treated as another holder, never renewed over. After a crash the restarted process
  therefore waits one lease duration; a clean shutdown calls release(), which frees the Lease at
  once (client-go's ReleaseOnCancel).
- A deleted Lease is created again (the role lets the identity create that one Lease name only):
  at once by a leader whose fence still holds (nobody else may create it before then), by
  anybody else only once it has been missing for lease_seconds as this process saw it, as for an
  expired record: the deposed leader's fence has lapsed by then, so two never write at once.

Fencing: is_leader() is True only while the local clock is before the start of the last
successful acquire/renew write + renew_seconds. Others can take over only lease_seconds after they
saw that write, which landed after it started, so with renew_seconds < lease_seconds a process
that was frozen (SIGSTOP, a stalled VM) finds is_leader() False the moment it resumes, before it
could send anything. The clock is CLOCK_BOOTTIME, which goes on while the machine is suspended
(CLOCK_MONOTONIC stops), checked against the wall clock as well: a VM paused by its host may
see neither stop, but its wall clock is stepped forward once it runs again. The remaining window
is a write already past its is_leader() check when the process froze; callers check is_leader()
immediately before each write. A lapse of the fence while the Lease is still ours (renewals too
slow or failing) is logged as such.

Errors of the API are logged and retried; run() never raises. Transitions are logged as one line
naming the identity and the Lease, and reported through on_change(bool); lease_event() records
them as an Event on the Lease for `kubectl describe lease`.

Identity: unique per process is best (e.g. hostname plus a random suffix); the hostname alone
works too (see above for what a restart then costs).
"""

from __future__ import annotations

import copy
import datetime
import logging
import random
import threading
import time
from typing import Callable

from .api import DEFAULT_TIMEOUT, Api, ApiError
from .config import LEASE_SECONDS, RENEW_SECONDS, RETRY_SECONDS, LeaseSettings
from .plan import MANAGED_BY

log = logging.getLogger("cnpa_controller.leader")

LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
EVENTS = "/api/v1/namespaces/{namespace}/events"
RECORD_FIELDS = ("holderIdentity", "leaseDurationSeconds", "acquireTime", "renewTime", "leaseTransitions")
MISSING = {"missing": True}  # the record of a Lease that does not exist (observed like any other)
# Candidates that are not leading poll with jitter (as client-go's JitterUntil) so that they do
# not all hit the API server in the same instant after a leader goes.
JITTER = 0.2


def micro_time(wall: float) -> str:
    """A metav1.MicroTime: RFC 3339 with microseconds, in UTC."""
    return datetime.datetime.fromtimestamp(wall, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# -- the pure decisions ---------------------------------------------------------------------------


def record_of(lease: dict) -> dict:
    """The election record of a Lease: the spec fields client-go compares to notice a change."""
    spec = lease.get("spec") or {}
    return {k: spec.get(k) for k in RECORD_FIELDS}


def decide(record: dict, identity: str, mine: dict | None, observed_at: float, now: float,
           lease_seconds: float) -> str:
    """What to do with a Lease whose record is `record`: "renew", "acquire" or "wait".

    mine is the record of our last successful write (None if we never wrote one), observed_at the
    local monotonic time at which this record was first seen (it changes whenever the record
    does), now the local monotonic time. lease_seconds is our own duration, used when the record
    states none.
    """
    holder = record.get("holderIdentity") or ""
    if holder == identity and record == mine:
        return "renew"
    if not holder:
        return "acquire"
    duration = record.get("leaseDurationSeconds") or lease_seconds
    if now >= observed_at + duration:
        return "acquire"
    return "wait"


def next_spec(record: dict, identity: str, action: str, lease_seconds: float, wall: float) -> dict:
    """The spec to write for `action` ("renew" or "acquire") over the current record."""
    now = micro_time(wall)
    transitions = record.get("leaseTransitions") or 0
    spec = {"holderIdentity": identity, "leaseDurationSeconds": max(1, int(lease_seconds)),
            "renewTime": now}
    if action == "renew":
        spec["acquireTime"] = record.get("acquireTime") or now
        spec["leaseTransitions"] = transitions
    else:
        spec["acquireTime"] = now
        spec["leaseTransitions"] = transitions + 1
    return spec


def released_spec(record: dict, wall: float) -> dict:
    """The spec that gives the Lease up (client-go's release: no holder, a 1 s duration)."""
    now = micro_time(wall)
    return {"holderIdentity": "", "leaseDurationSeconds": 1, "acquireTime": now, "renewTime": now,
            "leaseTransitions": record.get("leaseTransitions") or 0}


# -- the elector ----------------------------------------------------------------------------------


def boottime() -> float:
    """Seconds on CLOCK_BOOTTIME (runs on through a suspend), else CLOCK_MONOTONIC."""
    try:
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):
        return time.monotonic()


class Elector:
    """Campaign for, hold and give up one Lease. See the module docstring for the semantics."""

    def __init__(self, api: Api, namespace: str, name: str, identity: str, *,
                 lease_seconds: float = LEASE_SECONDS, renew_seconds: float = RENEW_SECONDS,
                 retry_seconds: float = RETRY_SECONDS,
                 on_change: Callable[[bool], None] | None = None, clock=boottime,
                 wall=time.time, news: int = logging.INFO) -> None:
        if not 0 < retry_seconds < renew_seconds < lease_seconds:
            raise ValueError("need 0 < retry_seconds < renew_seconds < lease_seconds")
        if not identity:
            raise ValueError("identity must not be empty")
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.renew_seconds = renew_seconds
        self.retry_seconds = retry_seconds
        self.on_change = on_change
        # The level of the ordinary transitions' lines: a pass takes and gives the Lease back on
        # every pass that writes, which is no news (turn.PassTurn: debug).
        self._news = news
        self._clock = clock
        self._wall = wall
        # A renewal may take as long as leaves room for one more attempt before the fence lapses.
        self._timeout = max(0.5, min(DEFAULT_TIMEOUT, renew_seconds - retry_seconds))
        self._lock = threading.Lock()
        self._report_lock = threading.Lock()
        self._valid_until = float("-inf")   # fence on our clock, see is_leader()
        self._valid_until_wall = float("-inf")   # the same on the wall clock
        self._mine: dict | None = None   # record of our last successful write
        self._written: dict | None = None   # the Lease as that write returned it (fast path)
        # (record, start) of a write whose answer never came: it may have landed.
        self._pending: tuple[dict, float, float] | None = None
        self._observed: dict | None = None
        self._observed_at = 0.0
        self._reported = False
        self._released = False
        self.transitions_seen = 0
        self.stepped_at = float("-inf")   # our clock when run() last went round (alive())
        self.lease_uid = ""   # for lease_event(..., uid=elector.lease_uid)

    @classmethod
    def of(cls, api: Api, lease: LeaseSettings, **kw) -> Elector:
        """An Elector of the Lease these settings name, with their timings."""
        return cls(api, lease.namespace, lease.name, lease.identity,
                   lease_seconds=lease.lease_seconds, renew_seconds=lease.renew_seconds,
                   retry_seconds=lease.retry_seconds, **kw)

    @property
    def path(self) -> str:
        return LEASES.format(namespace=self.namespace) + "/" + self.name

    def describe(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def request_timeout(self) -> float:
        """How long each of its requests may take (renew - retry seconds, at most 10 s)."""
        return self._timeout

    def is_leader(self) -> bool:
        return self._clock() < self._valid_until and self._wall() < self._valid_until_wall

    def run(self, stop: threading.Event) -> None:
        """Campaign and renew until stop is set (or release() was called). Never raises."""
        log.log(self._news, "%s: candidate for lease %s", self.identity, self.describe())
        while not stop.is_set() and not self._released:
            self.stepped_at = self._clock()
            self._report()   # a fence that lapsed while we waited is news before the next try
            began = self._clock()
            self.step()   # a bug in a step must not end the campaign silently: logged
            if self.is_leader():
                # Renewals start every retry period, however long each took: a renewal then
                # lands before the fence lapses as long as requests take less than
                # renew - retry seconds (waiting retry seconds after each answer would allow
                # only half that).
                pause = self.retry_seconds - (self._clock() - began)
            else:
                pause = self.retry_seconds * (1 + JITTER * random.random())
            stop.wait(max(0.0, pause))
        self._report()

    def step(self) -> None:
        """One read-decide-write of the campaign, as run() makes them. Never raises."""
        try:
            self._step()
        except Exception:
            log.exception("%s: leader election step failed on lease %s", self.identity,
                          self.describe())
        self._report()

    def observed(self) -> dict | None:
        """The Lease's record as last read (MISSING when it did not exist)."""
        return self._observed

    def alive(self) -> bool:
        """run() went round recently: a step (a read and a write, each bounded by the request
        timeout) and the longest pause between two ago, with a second to spare. False when it
        stopped or hangs: this process could then neither renew nor take over (/readyz)."""
        bound = self.retry_seconds * (1 + JITTER) + 2 * self._timeout + 1
        return self._clock() - self.stepped_at <= bound

    def release(self) -> None:
        """Stop acting as leader and, if the Lease is still ours, free it so another takes over at
        once. Ends run(). Errors are logged: an unreleased Lease only delays the takeover."""
        # Stop acting (and say so) before the Lease can go to another; a step of run() still in
        # flight cannot re-arm the fence once _released is set (see _won).
        self._released = True
        self._valid_until = self._valid_until_wall = float("-inf")
        self._report()
        with self._lock:
            self._valid_until = self._valid_until_wall = float("-inf")
            mine, self._mine, self._written = self._mine, None, None
            if mine is not None:
                self._release(mine)

    # -- internals --------------------------------------------------------------------------------

    def _release(self, mine: dict) -> None:
        for _attempt in range(2):
            try:
                lease = self.api.request("GET", self.path, timeout=self._timeout)
                if record_of(lease) != mine:
                    log.info("%s: lease %s no longer ours, nothing to release", self.identity,
                             self.describe())
                    return
                lease["spec"] = {**lease.get("spec", {}), **released_spec(mine, self._wall())}
                self.api.request("PUT", self.path, body=lease, timeout=self._timeout)
                log.log(self._news, "%s: released lease %s", self.identity, self.describe())
                return
            except ApiError as err:
                if err.status != 409:
                    log.warning("%s: cannot release lease %s: %s", self.identity, self.describe(), err)
                    return
        log.warning("%s: cannot release lease %s: it keeps changing", self.identity, self.describe())

    def _step(self) -> None:
        with self._lock:
            if self._released:
                return
            if self._written is not None and self.is_leader():
                self._renew_fast()
                return
            try:
                lease = self.api.request("GET", self.path, timeout=self._timeout)
            except ApiError as err:
                if err.status == 404:
                    self._missing()
                else:
                    log.warning("%s: cannot read lease %s: %s", self.identity, self.describe(), err)
                return
            record = record_of(lease)
            now = self._clock()
            if record != self._observed:
                self._observed, self._observed_at = record, now
            if self._pending is not None and record == self._pending[0]:
                # A write whose answer was lost did land: it is ours, fenced from its start.
                pending, self._pending = self._pending, None
                self._won(lease, pending[1], pending[2])
            if self._mine is not None and record != self._mine:
                # Not the record we wrote last: whatever the fence says, the Lease is not ours.
                log.info("%s: lease %s now held by %r", self.identity, self.describe(),
                         record.get("holderIdentity"))
                self._mine = self._written = None
                self._valid_until = self._valid_until_wall = float("-inf")
            action = decide(record, self.identity, self._mine, self._observed_at, now, self.lease_seconds)
            if action == "wait":
                return
            lease["spec"] = {**lease.get("spec", {}),
                             **next_spec(record, self.identity, action, self.lease_seconds, self._wall())}
            self._write(lease, action)

    def _renew_fast(self) -> None:
        """client-go's fast path: renew the Lease we wrote last without reading it first."""
        lease = copy.deepcopy(self._written)
        lease["spec"] = {**lease.get("spec", {}),
                         **next_spec(self._mine, self.identity, "renew", self.lease_seconds,
                                     self._wall())}
        self._write(lease, "renew")

    def _write(self, lease: dict, action: str) -> None:
        started, started_wall = self._clock(), self._wall()
        try:
            written = self.api.request("PUT", self.path, body=lease, timeout=self._timeout)
        except ApiError as err:
            self._written = None   # read before the next write
            if err.status == 404:
                self._missing()   # deleted meanwhile
                return
            if err.status == 0:
                self._pending = (record_of(lease), started, started_wall)
            # 409: another candidate (or our own lost write) wrote first; the next read shows who.
            log.log(logging.INFO if err.status == 409 else logging.WARNING,
                    "%s: cannot %s lease %s: %s", self.identity, action, self.describe(), err)
            return
        self._won(written, started, started_wall)

    def _missing(self) -> None:
        """The Lease does not exist: create it now if we lead (our fence holds: no other
        candidate creates it before lease_seconds), else once it has been missing that long."""
        now = self._clock()
        if self._observed != MISSING:
            self._observed, self._observed_at = MISSING, now
        if (self._mine is not None and self.is_leader()) or now >= self._observed_at + self.lease_seconds:
            self._create()

    def _create(self) -> None:
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": self.name, "namespace": self.namespace,
                              "labels": dict([MANAGED_BY])},
                 "spec": {**next_spec({}, self.identity, "acquire", self.lease_seconds, self._wall()),
                          "leaseTransitions": 0}}
        started, started_wall = self._clock(), self._wall()
        try:
            written = self.api.request("POST", LEASES.format(namespace=self.namespace), body=lease,
                                       timeout=self._timeout)
        except ApiError as err:
            if err.status == 0:
                self._pending = (record_of(lease), started, started_wall)
            # 409 AlreadyExists: another candidate created it; the next read sees its record.
            log.log(logging.INFO if err.status == 409 else logging.WARNING,
                    "%s: cannot create lease %s: %s", self.identity, self.describe(), err)
            return
        self._won(written, started, started_wall)

    def _won(self, written: dict, started: float, started_wall: float) -> None:
        self._mine = record_of(written)
        self._written = written
        self._pending = None
        self._observed, self._observed_at = self._mine, self._clock()
        self.lease_uid = (written.get("metadata") or {}).get("uid", self.lease_uid)
        if not self._released:
            self._valid_until = started + self.renew_seconds
            self._valid_until_wall = started_wall + self.renew_seconds

    def _report(self) -> None:
        """Log and report a change of is_leader() since the last report (once per transition)."""
        with self._report_lock:
            leading = self.is_leader()
            if leading == self._reported:
                return
            self._reported = leading
            self.transitions_seen += 1
        if leading:
            log.log(self._news, "%s: became leader on lease %s", self.identity, self.describe())
        elif self._mine is not None and not self._released:
            log.warning("%s: stopped leading on lease %s: no renewal succeeded for %g s; not "
                        "writing until one does", self.identity, self.describe(),
                        self.renew_seconds)
        else:
            log.log(self._news, "%s: stopped leading on lease %s", self.identity, self.describe())
        if self.on_change is not None:
            try:
                self.on_change(leading)
            except Exception:
                log.exception("%s: on_change(%s) failed", self.identity, leading)


def lease_event(api: Api, namespace: str, lease: str, identity: str, became_leader: bool, *,
                uid: str = "", component: str = "cnpa-op",
                timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Record a leader transition as an Event on the Lease (reason LeaderElection, as client-go's
    Lease lock records them). Best effort: returns False after logging an error."""
    now = datetime.datetime.now(datetime.timezone.utc)
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    involved = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "name": lease,
                "namespace": namespace}
    if uid:
        involved["uid"] = uid
    event = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{lease}.", "namespace": namespace,
                     "labels": dict([MANAGED_BY])},
        "involvedObject": involved,
        "type": "Normal", "reason": "LeaderElection",
        "message": f"{identity} {'became leader' if became_leader else 'stopped leading'}",
        "count": 1, "firstTimestamp": stamp, "lastTimestamp": stamp,
        "source": {"component": component},
        "reportingComponent": component, "reportingInstance": identity[:128],
    }
    try:
        api.request("POST", EVENTS.format(namespace=namespace), body=event, timeout=timeout)
        return True
    except ApiError as err:
        log.warning("cannot record the leader Event on lease %s/%s: %s", namespace, lease, err)
        return False
