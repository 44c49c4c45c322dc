"""cnpa_controller.leader without an API server: the pure decisions, and the Elector driven step by
step against an in-memory Lease that enforces resourceVersion as the API server does, on a fake
clock. The real API server is in tests/controller/test_leader.py (this file has another
basename: test modules in directories without __init__.py must have distinct names)."""

from __future__ import annotations

import copy
import json
import threading

import pytest

from cnpa_controller import ApiError, leader
from cnpa_controller.config import LeaseSettings
from cnpa_controller.leader import Elector, decide, next_spec, record_of, released_spec
from cnpa_controller.turn import PassTurn

ME, OTHER = "host-a", "host-b"
PATH = "/apis/coordination.k8s.io/v1/namespaces/cnpa-system/leases/cnpa-op"


def rec(holder, *, duration=4, transitions=0, renew="2020-01-01T00:00:00.000000Z"):
    return {"holderIdentity": holder, "leaseDurationSeconds": duration, "acquireTime": renew,
            "renewTime": renew, "leaseTransitions": transitions}


# -- decide ---------------------------------------------------------------------------------------

def test_free_lease_is_acquired_at_once():
    assert decide(rec(""), ME, None, observed_at=100, now=100, lease_seconds=4) == "acquire"
    assert decide(rec(None), ME, None, observed_at=100, now=100, lease_seconds=4) == "acquire"


def test_held_lease_waits_for_expiry_measured_from_our_observation():
    # renewTime says 2020: by the writer's clock it expired long ago, but we only just saw this
    # record, so it is not expired for us (skew between hosts must not matter).
    held = rec(OTHER, duration=4)
    assert decide(held, ME, None, observed_at=100, now=100, lease_seconds=4) == "wait"
    assert decide(held, ME, None, observed_at=100, now=103.9, lease_seconds=4) == "wait"
    assert decide(held, ME, None, observed_at=100, now=104, lease_seconds=4) == "acquire"


def test_expiry_uses_the_duration_the_holder_declared():
    held = rec(OTHER, duration=30)
    assert decide(held, ME, None, observed_at=100, now=110, lease_seconds=4) == "wait"
    assert decide(held, ME, None, observed_at=100, now=130, lease_seconds=4) == "acquire"


def test_our_own_record_is_renewed():
    mine = rec(ME)
    assert decide(copy.deepcopy(mine), ME, mine, observed_at=100, now=100, lease_seconds=4) == "renew"


def test_our_identity_in_a_record_we_did_not_write_is_another_holder():
    # A second process with our identity (restarted service, the old one frozen) renewed it.
    mine = rec(ME, renew="2026-01-01T00:00:01.000000Z")
    theirs = rec(ME, renew="2026-01-01T00:00:02.000000Z")
    assert decide(theirs, ME, mine, observed_at=100, now=101, lease_seconds=4) == "wait"
    assert decide(theirs, ME, None, observed_at=100, now=101, lease_seconds=4) == "wait"
    assert decide(theirs, ME, mine, observed_at=100, now=104, lease_seconds=4) == "acquire"


def test_specs_written():
    old = rec(OTHER, transitions=6, renew="2026-01-01T00:00:00.000000Z")
    acquired = next_spec(old, ME, "acquire", 4, wall=1767225601.5)
    assert acquired == {"holderIdentity": ME, "leaseDurationSeconds": 4, "leaseTransitions": 7,
                        "acquireTime": "2026-01-01T00:00:01.500000Z",
                        "renewTime": "2026-01-01T00:00:01.500000Z"}
    renewed = next_spec(acquired, ME, "renew", 4, wall=1767225603.25)
    assert renewed["acquireTime"] == "2026-01-01T00:00:01.500000Z"
    assert renewed["renewTime"] == "2026-01-01T00:00:03.250000Z"
    assert renewed["leaseTransitions"] == 7
    released = released_spec(renewed, wall=1767225604)
    assert released["holderIdentity"] == "" and released["leaseDurationSeconds"] == 1
    assert released["leaseTransitions"] == 7


# -- the Elector against an in-memory Lease -------------------------------------------------------

class FakeLeases:
    """One namespace's Leases with the API server's optimistic concurrency."""

    def __init__(self):
        # As the role leaves it: made by the admin, no holder yet (lease.yml).
        self.obj = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": "cnpa-op", "namespace": "cnpa-system", "resourceVersion": "0",
                                 "uid": "uid-0", "labels": {"app.kubernetes.io/managed-by": "cnpa-op"}},
                    "spec": {}}
        self.rv = 0
        self.fail: Exception | None = None
        self.before_write = None   # called once before the next PUT is applied
        self.lose_answer = False   # the next write is applied, but its answer never comes
        self.writes = []
        self.calls = []
        self.namespace = True      # the Lease's namespace exists
        self.latency = 0.0         # seconds each request takes on `clock` (see slow())
        self.clock = None

    def request(self, method, path, *, body=None, timeout=10.0):
        """The controller's Api.request, answered as the API server would."""
        assert timeout <= 10
        self.calls.append(method)
        if self.latency:
            self.clock.t += self.latency
        if self.fail is not None:
            raise self.fail
        if method == "GET":
            if path == "/api/v1/namespaces/cnpa-system":
                if not self.namespace:
                    raise ApiError(404, "NotFound", 'namespaces "cnpa-system" not found')
                return {"metadata": {"name": "cnpa-system"}}
            assert path == PATH
            if self.obj is None:
                raise ApiError(404, "NotFound")
            return copy.deepcopy(self.obj)
        body = json.loads(json.dumps(body))   # what goes over the wire: plain JSON
        if method == "POST":
            assert path == PATH.rsplit("/", 1)[0]
            if self.obj is not None:
                raise ApiError(409, "AlreadyExists")
        elif method == "PUT":
            assert path == PATH
            hook, self.before_write = self.before_write, None
            if hook:
                hook()
            # like the API server: a PUT without resourceVersion is an unconditional update
            sent = body["metadata"].get("resourceVersion")
            if self.obj is None:
                # (1.36, a Lease deleted: "StorageError: invalid object" for a guarded update)
                raise ApiError(409, "Conflict") if sent is not None else ApiError(404, "NotFound")
            if sent is not None and sent != self.obj["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict")
        self.rv += 1
        body["metadata"]["resourceVersion"] = str(self.rv)
        body["metadata"].setdefault("uid", "uid-1")
        self.obj = body
        self.writes.append((method, copy.deepcopy(body["spec"])))
        if self.lose_answer:
            self.lose_answer = False
            raise ApiError(0, "ReadTimeoutError")
        return copy.deepcopy(body)

    @property
    def spec(self):
        return self.obj["spec"]


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


@pytest.fixture
def world():
    leases, clock = FakeLeases(), Clock()
    clock.api = leases  # what elector() hands the Elector
    return leases, clock


def elector(clock, identity, changes=None):
    on_change = changes.append if isinstance(changes, list) else changes
    return Elector(clock.api, "cnpa-system", "cnpa-op", identity, lease_seconds=4, renew_seconds=3,
                   retry_seconds=0.5, clock=clock, wall=lambda: 1767225600.0 + clock.t,
                   on_change=on_change)


def step(*electors):
    for e in electors:
        e._step()
        e._report()


def test_first_candidate_takes_the_free_lease_and_leads(world):
    leases, clock = world
    changes = []
    a = elector(clock, ME, changes)
    assert not a.is_leader()
    step(a)
    assert a.is_leader() and changes == [True]
    assert leases.writes[0][0] == "PUT"
    assert leases.spec["holderIdentity"] == ME and leases.spec["leaseTransitions"] == 1
    assert a.lease_uid == "uid-0"   # for the Event on the Lease


def test_a_missing_lease_is_created_once_it_has_been_missing_for_a_lease(world):
    leases, clock = world
    leases.obj = None
    changes = []
    a = elector(clock, ME, changes)
    step(a)
    clock.t += 3.9
    step(a)
    assert not a.is_leader() and leases.obj is None
    clock.t += 0.1
    step(a)
    assert a.is_leader() and changes == [True]
    assert leases.writes[0][0] == "POST"
    assert leases.spec["holderIdentity"] == ME and leases.spec["leaseTransitions"] == 0
    assert leases.obj["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "cnpa-op"}
    assert a.lease_uid == "uid-1"


def test_create_race_loser_just_rereads(world):
    leases, clock = world
    a, b = elector(clock, ME), elector(clock, OTHER)
    leases.obj = None
    step(a)
    clock.t += 4
    step(a)
    # b saw 404 too, but a's POST landed first: b's POST gets AlreadyExists and b follows.
    b._create()
    assert not b.is_leader() and leases.spec["holderIdentity"] == ME
    step(b)
    assert not b.is_leader()


def test_exactly_one_of_two_wins_a_free_lease(world):
    leases, clock = world
    a, b = elector(clock, ME), elector(clock, OTHER)
    step(a)
    a.release()
    assert leases.spec["holderIdentity"] == ""
    c = elector(clock, "host-c")
    # b and c both read the free Lease; c's write lands between b's read and b's write.
    leases.before_write = lambda: step(c)
    step(b)
    assert c.is_leader() and not b.is_leader()
    assert leases.spec["holderIdentity"] == "host-c"


def test_takeover_only_after_lease_seconds_of_no_change(world):
    leases, clock = world
    a, b = elector(clock, ME), elector(clock, OTHER)
    step(a, b)
    assert a.is_leader() and not b.is_leader()
    for _ in range(10):   # a renews every retry period: b never sees an expired lease
        clock.t += 0.5
        step(a, b)
        assert a.is_leader() and not b.is_leader()
    renewals = [spec["renewTime"] for _, spec in leases.writes]
    assert len(set(renewals)) == len(renewals) == 11
    # a dies (no more steps). b takes over only once 4 s passed since it saw the last change.
    seen = clock.t
    for _ in range(7):   # up to 3.5 s
        clock.t += 0.5
        step(b)
        assert not b.is_leader()
    clock.t = seen + 4
    step(b)
    assert b.is_leader()
    assert leases.spec["holderIdentity"] == OTHER and leases.spec["leaseTransitions"] == 2


def test_is_leader_is_fenced_on_the_local_clock(world):
    _leases, clock = world
    changes = []
    a = elector(clock, ME, changes)
    step(a)
    assert a.is_leader()
    clock.t += 2.99
    assert a.is_leader()
    clock.t += 0.02   # renew_seconds after the write started, with no renewal in between
    assert not a.is_leader()
    assert changes == [True]   # reported by the loop, which is not running here
    a._report()
    assert changes == [True, False]


def test_frozen_leader_resumes_as_follower(world):
    leases, clock = world
    a_changes, b_changes = [], []
    a, b = elector(clock, ME, a_changes), elector(clock, OTHER, b_changes)
    step(a, b)
    clock.t += 10        # a is frozen; b keeps polling
    step(b)              # first sees the record unchanged (its 4 s started at its first read)
    assert b.is_leader()
    assert not a.is_leader()   # before a could send anything
    step(a)
    assert not a.is_leader() and a_changes == [True, False]
    assert leases.spec["holderIdentity"] == OTHER
    # and a does not take the Lease back while b renews it
    for _ in range(10):
        clock.t += 0.5
        step(b, a)
        assert b.is_leader() and not a.is_leader()


def test_failed_renewals_give_up_after_renew_seconds(world):
    leases, clock = world
    changes = []
    a = elector(clock, ME, changes)
    step(a)
    leases.fail = ApiError(503, "ServiceUnavailable")
    for _ in range(5):
        clock.t += 0.5
        step(a)      # errors are absorbed
    assert a.is_leader()
    clock.t += 0.6
    step(a)
    assert not a.is_leader() and changes == [True, False]
    # the API comes back and nobody else took the Lease: a may renew its own record again
    leases.fail = None
    step(a)
    assert a.is_leader() and changes == [True, False, True]
    assert leases.spec["leaseTransitions"] == 1


def test_restart_with_the_same_identity_waits_for_expiry(world):
    leases, clock = world
    old = elector(clock, ME)
    step(old)
    new = elector(clock, ME)   # crashed and restarted: it never wrote this record
    step(new)
    assert not new.is_leader()
    clock.t += 4
    step(new)
    assert new.is_leader() and not old.is_leader()
    assert leases.spec["leaseTransitions"] == 2
    step(old)   # the old process resumes: the record is no longer the one it wrote
    assert not old.is_leader()
    assert leases.spec["holderIdentity"] == ME and new.is_leader()


def test_release_reports_before_it_gives_the_lease_up(world):
    leases, clock = world
    seen = []
    a = elector(clock, ME, lambda leading: seen.append((leading, leases.spec["holderIdentity"])))
    step(a)
    a.release()
    assert seen == [(True, ME), (False, ME)]   # stopped acting while the Lease was still ours
    assert leases.spec["holderIdentity"] == ""


def test_a_renewal_in_flight_does_not_rearm_a_released_elector(world):
    leases, clock = world
    a = elector(clock, ME)
    step(a)
    clock.t += 0.5
    # release() is called while a renewal is on its way to the API server: it has done what it
    # does before waiting for the step to finish
    def release_begins():
        a._released = True
        a._valid_until = float("-inf")

    leases.before_write = release_begins
    a._step()
    assert not a.is_leader()


def test_release_frees_the_lease_only_if_still_ours(world):
    leases, clock = world
    changes = []
    a, b = elector(clock, ME, changes), elector(clock, OTHER)
    step(a)
    a.release()
    assert not a.is_leader() and changes == [True, False]
    assert leases.spec["holderIdentity"] == "" and leases.spec["leaseDurationSeconds"] == 1
    step(a)   # released electors do not campaign again, even for a free Lease
    assert not a.is_leader() and leases.spec["holderIdentity"] == ""
    step(b)   # free: no waiting
    assert b.is_leader() and leases.spec["leaseTransitions"] == 2

    # a frozen leader that lost the Lease does not clear the new holder's record on shutdown
    c = elector(clock, "host-c")
    step(c)
    clock.t += 10
    step(c)
    assert c.is_leader()
    writes = len(leases.writes)
    b.release()
    assert len(leases.writes) == writes and leases.spec["holderIdentity"] == "host-c"


@pytest.mark.parametrize("failure", [ApiError(0, "ConnectionRefused"), ValueError("not JSON")])
def test_run_never_raises_and_stops(world, caplog, failure):
    leases, _clock = world
    leases.fail = failure
    a = Elector(leases, "cnpa-system", "cnpa-op", ME, lease_seconds=4, renew_seconds=3,
                retry_seconds=0.01)
    stop = threading.Event()
    t = threading.Thread(target=a.run, args=(stop,), daemon=True)
    t.start()
    t.join(0.3)
    assert t.is_alive() and "lease cnpa-system/cnpa-op" in caplog.text
    stop.set()
    t.join(5)
    assert not t.is_alive()


def test_transitions_are_logged_with_identity_and_lease(world, caplog):
    _leases, clock = world
    caplog.set_level("INFO", logger="cnpa_controller.leader")
    a = elector(clock, ME)
    step(a)
    a.release()
    lines = [r.getMessage() for r in caplog.records]
    assert "host-a: became leader on lease cnpa-system/cnpa-op" in lines
    assert "host-a: stopped leading on lease cnpa-system/cnpa-op" in lines


def test_durations_must_leave_room_for_fencing():
    with pytest.raises(ValueError):
        Elector(None, "ns", "l", ME, lease_seconds=4, renew_seconds=4, retry_seconds=1)
    with pytest.raises(ValueError):
        Elector(None, "ns", "l", ME, lease_seconds=4, renew_seconds=3, retry_seconds=3)


def test_record_of_ignores_metadata():
    lease = {"metadata": {"resourceVersion": "9", "labels": {"x": "y"}}, "spec": rec(ME)}
    assert record_of(lease) == rec(ME)


# -- renewals as client-go makes them -------------------------------------------------------------

def test_the_leader_renews_with_one_write_and_no_read(world):
    """Each renewal is one PUT of the Lease it wrote last: with a read first, a request of modest
    latency doubled the time between renewals and the fence lapsed although all of them succeeded."""
    leases, clock = world
    a = elector(clock, ME)
    step(a)
    leases.calls.clear()
    for _ in range(5):
        clock.t += 0.5
        step(a)
    assert leases.calls == ["PUT"] * 5 and a.is_leader()


def test_a_conflict_on_the_fast_path_reads_the_lease_again(world):
    leases, clock = world
    a, b = elector(clock, ME), elector(clock, OTHER)
    step(a)
    leases.obj["metadata"]["resourceVersion"] = "99"   # somebody else's write, e.g. kubectl edit
    leases.calls.clear()
    clock.t += 0.5
    step(a)
    assert leases.calls == ["PUT"]   # 409
    clock.t += 0.5
    step(a, b)
    assert leases.calls[1:3] == ["GET", "PUT"] and a.is_leader() and not b.is_leader()


def test_a_renewal_whose_answer_was_lost_keeps_the_lead(world):
    """The PUT landed but its answer never came (timeout): the next read shows the record we
    tried to write. It is ours; stepping down for a whole lease would be for nothing."""
    leases, clock = world
    changes = []
    a = elector(clock, ME, changes)
    step(a)
    clock.t += 0.5
    leases.lose_answer = True
    step(a)
    clock.t += 0.5
    step(a)
    assert a.is_leader() and changes == [True]
    assert leases.spec["holderIdentity"] == ME and leases.spec["leaseTransitions"] == 1


def test_a_deleted_lease_is_created_again_at_once_by_its_leader(world):
    leases, clock = world
    a, b = elector(clock, ME), elector(clock, OTHER)
    step(a, b)
    leases.obj = None   # kubectl delete lease
    clock.t += 0.5
    step(b, a)   # b finds it missing first, and waits; a's renewal is refused (409)
    step(a, b)   # a reads it, finds it missing and, still leading, creates it at once
    assert a.is_leader() and not b.is_leader() and leases.spec["holderIdentity"] == ME


def test_a_follower_creates_a_deleted_lease_only_once_the_old_leader_s_fence_has_lapsed(world):
    """Created at once, the Lease would let a follower write beside a leader whose fence still
    holds (seen on three hosts: the leader's writes went on for seconds after the follower's
    first). Missing, it counts as a record that must stay unchanged for lease_seconds."""
    leases, clock = world
    a, b = elector(clock, ME), elector(clock, OTHER)
    step(a, b)
    leases.obj = None
    step(b)   # b finds it missing; a is gone too (killed): nobody renews
    for _ in range(7):   # up to 3.5 s
        clock.t += 0.5
        step(b)
        assert not b.is_leader() and leases.obj is None
    assert not a.is_leader()   # a's fence (3 s) lapsed before b may create it (4 s)
    clock.t += 0.5
    step(b)
    assert b.is_leader() and leases.spec["holderIdentity"] == OTHER


def test_the_fence_holds_on_the_wall_clock_too(world):
    """A VM paused by its host may find its boot-time clock barely moved; its wall clock is
    stepped forward when it runs again: either clock past the fence ends the lead."""
    leases, clock = world
    wall = [1767225600.0]
    a = Elector(leases, "cnpa-system", "cnpa-op", ME, lease_seconds=4, renew_seconds=3,
                retry_seconds=0.5, clock=clock, wall=lambda: wall[0])
    step(a)
    assert a.is_leader()
    wall[0] += 3.01
    assert not a.is_leader()


def test_the_fence_uses_the_boot_time_clock():
    assert leader.Elector.__init__.__kwdefaults__["clock"] is leader.boottime
    before = leader.boottime()
    assert leader.boottime() >= before


def test_a_lapse_of_the_fence_while_the_lease_is_ours_is_a_warning(world, caplog):
    _leases, clock = world
    a = elector(clock, ME)
    step(a)
    clock.t += 3.1   # no renewal for renew_seconds (slow or failing requests)
    a._report()
    assert "no renewal succeeded for 3 s" in caplog.text


def test_alive_while_the_loop_goes_round_within_its_bound():
    now = [100.0]
    e = Elector(None, "ns", "l", ME, lease_seconds=10, renew_seconds=7, retry_seconds=2,
                clock=lambda: now[0], wall=lambda: now[0])
    assert not e.alive()   # run() has not started
    e.stepped_at = now[0]
    # A pause with its jitter and a step of two requests (each at most renew - retry seconds).
    bound = 2 * (1 + leader.JITTER) + 2 * 5 + 1
    now[0] += bound - 0.05
    assert e.alive()
    now[0] += 0.1
    assert not e.alive()


# -- how slow an API server may be ----------------------------------------------------------------

def lapsed_fraction(latency: float, *, renew: float = 7, retry: float = 2, cycles: int = 200) -> float:
    """The fraction of time a leader whose every renewal succeeds, each taking `latency` seconds,
    is not allowed to write: run()'s schedule (a renewal starts every retry seconds, or as soon as
    the one before was answered) on a fake clock."""
    leases, clock = FakeLeases(), Clock()
    leases.clock = clock
    e = Elector(leases, "cnpa-system", "cnpa-op", ME, lease_seconds=renew + 3, renew_seconds=renew,
                retry_seconds=retry, clock=clock, wall=lambda: 1767225600.0 + clock.t)
    e.step()
    assert e.is_leader()
    leases.latency = latency
    lapsed, t0 = 0.0, clock.t
    for _ in range(cycles):
        began = clock.t
        valid_until = e._valid_until
        e.step()   # the clock moves by the request's latency meanwhile
        lapsed += max(0.0, clock.t - max(valid_until, began))
        assert e._mine is not None, "every renewal succeeded"
        clock.t += max(0.0, retry - (clock.t - began))
    return lapsed / (clock.t - t0)


@pytest.mark.parametrize("latency", [0.05, 2.0, 3.0, 3.5])
def test_renewals_that_succeed_keep_the_fence_while_each_takes_at_most_half_the_renew_period(
        latency):
    """leader.py's promise: with every request answered within renew/2 seconds (3.5 s by
    default), a leader never stops writing."""
    assert lapsed_fraction(latency) == 0


def test_slower_renewals_that_succeed_leave_gaps_of_twice_the_latency_less_the_renew_period():
    """Beyond renew/2 each renewal, though it succeeds, lands after the fence of the one before
    lapsed (renewals are sequential: each carries the resourceVersion the one before returned).
    At 4 s: 1 s in every 4 s; at 5 s: 3 s in every 5 s."""
    assert lapsed_fraction(4.0) == pytest.approx(0.25, abs=0.01)
    assert lapsed_fraction(5.0) == pytest.approx(0.6, abs=0.01)


# -- a pass's turn on the Lease -------------------------------------------------------------------

def turn(clock, identity=ME):
    lease = LeaseSettings(identity, "cnpa-system", "cnpa-op", lease_seconds=4, renew_seconds=3,
                          retry_seconds=0.5)
    return PassTurn(clock.api, lease, clock=clock,
                           wall=lambda: 1767225600.0 + clock.t)


def waiting(clock):
    def wait(seconds):
        clock.t += seconds
    return wait


def test_a_pass_takes_a_free_lease_writes_under_its_fence_and_gives_it_back(world):
    leases, clock = world
    t = turn(clock)
    assert t.take(wait=waiting(clock)) == t.LEADING and t.may_write()
    assert leases.spec["holderIdentity"] == ME
    t.done()
    assert leases.spec["holderIdentity"] == "" and not t.may_write()


def test_a_pass_writes_nothing_while_a_live_controller_holds_the_lease(world):
    leases, clock = world
    watch = elector(clock, OTHER)
    step(watch)
    t = turn(clock)

    def wait(seconds):   # the watch controller renews while the pass looks
        clock.t += seconds
        step(watch)

    assert t.take(wait=wait) == OTHER and not t.may_write()
    assert leases.spec["holderIdentity"] == OTHER and clock.t < 1000 + 4
    t.done()
    assert leases.spec["holderIdentity"] == OTHER


def test_a_pass_takes_over_a_lease_whose_holder_stopped_renewing(world):
    leases, clock = world
    dead = elector(clock, OTHER)
    step(dead)          # took it, then died without giving it back
    t = turn(clock)
    assert t.take(wait=waiting(clock)) == t.LEADING
    assert leases.spec["holderIdentity"] == ME and clock.t >= 1000 + 4
    assert leases.spec["leaseTransitions"] == 2
    t.done()


def test_a_pass_writes_unfenced_only_where_no_lease_can_exist(world):
    leases, clock = world
    leases.obj, leases.namespace = None, False
    t = turn(clock)
    assert t.take(wait=waiting(clock)) == t.NO_LEASE and t.may_write()
    assert leases.obj is None and leases.writes == []
    t.done()


def test_a_pass_finding_the_lease_deleted_waits_a_lease_as_any_candidate(world):
    """Its leader may still be writing under a fence of up to renew seconds: a pass creates the
    Lease again only once it has been missing for lease_seconds, as an Elector does."""
    leases, clock = world
    leases.obj = None
    t = turn(clock)
    assert t.take(wait=waiting(clock)) == t.LEADING
    assert leases.writes[0][0] == "POST" and clock.t >= 1000 + 4
    t.done()
    assert leases.spec["holderIdentity"] == ""


def test_a_pass_that_may_not_read_the_lease_writes_nothing_and_says_so(world, caplog):
    leases, clock = world
    leases.fail = ApiError(403, "Forbidden", 'leases "cnpa-op" is forbidden')
    t = turn(clock)
    assert t.take(wait=waiting(clock)) == t.REFUSED and not t.may_write()
    assert clock.t == 1000 and leases.calls == ["GET"]
    assert "needs get, update and create on that Lease" in caplog.text
