"""The controller's loop around one TeamSpace: what it does when it may not write."""

from __future__ import annotations

import io

from cnpa_controller.config import Settings
from cnpa_controller.controller import Controller
from fixtures import teamspace


class Follower:
    """An elector that never leads (or has just lost the Lease without a reported change)."""

    def __init__(self, on_change):
        pass

    def is_leader(self):
        return False


class NoApi:
    def request(self, *a, **k):
        raise AssertionError("a process that does not lead must send nothing")


def test_a_name_found_while_not_leading_is_looked_at_again_not_dropped(tmp_path):
    c = Controller(NoApi(), Settings(archive_dir=str(tmp_path), not_leader_retry_seconds=2.0),
                   make_elector=Follower, out=io.StringIO())
    c.caches.teamspaces._store["a"] = teamspace("a", 2, uid="u-1", generation=1,
                                                resourceVersion="5")
    c.reconcile("a")
    # Not forgotten: back in the queue once a renewal could have made this process the leader
    # again (a brief lapse reports no change, so nothing else would queue it before the resync).
    assert c.queue.delayed() == 1


class Candidate(Follower):
    """A follower whose election loop may have stopped going round."""

    running = True

    def alive(self):
        return self.running


def test_healthz_names_a_stuck_worker_and_readyz_what_is_not_ready(tmp_path):
    from cnpa_controller.health import Heartbeats

    now = [0.0]
    c = Controller(NoApi(), Settings(archive_dir=str(tmp_path), request_timeout=2.0),
                   make_elector=Candidate, out=io.StringIO())
    c.heartbeats = Heartbeats(clock=lambda: now[0])
    assert c.wedge_seconds == 2 * 7 * 2.0 + 5
    c.heartbeats.beat("main")
    c.heartbeats.beat("worker-0")
    assert c.healthz() == []
    assert c.readyz() == [f"cache of {kind} not synced"
                          for kind in ("TeamSpace", "Namespace", "ResourceQuota")]
    for informer in c.caches.all:
        informer.synced.set()
    assert c.readyz() == ["workers not started"]
    c.workers_started.set()
    assert c.readyz() == []
    c.elector.running = False
    assert c.readyz() == ["leader election loop not running"]
    c.elector.running = True
    now[0] = 40.0
    c.heartbeats.beat("main")   # the main loop goes on; worker-0 is stuck
    assert c.healthz() == ["worker-0: stuck for 40 s (more than 33 s)"]
    assert c.readyz() == c.healthz()


def test_a_cache_whose_watch_keeps_failing_fails_readyz_not_healthz(tmp_path):
    """Never blind while ready: a watch refused for longer than cache_stale_seconds (a lost
    permission) is named by /readyz; /healthz stays ok (a restart would not help)."""
    from cnpa_controller.api import ApiError

    now = [0.0]
    c = Controller(NoApi(), Settings(archive_dir=str(tmp_path), cache_stale_seconds=30),
                   make_elector=Candidate, out=io.StringIO())
    for informer in c.caches.all:
        informer.synced.set()
        informer._clock = lambda: now[0]
    c.workers_started.set()
    c.heartbeats.beat("main")
    namespaces = c.caches.namespaces
    namespaces._failed(ApiError(403, "Forbidden", 'namespaces is forbidden: cannot "watch"'))
    now[0] = 29.0
    assert c.readyz() == []
    now[0] = 31.0
    [problem] = c.readyz()
    assert problem.startswith("cache of Namespace stale: its list or watch has failed for 31 s")
    assert "forbidden" in problem
    assert c.healthz() == []
    namespaces._heard()   # watching again
    assert c.readyz() == []


def test_a_resync_queues_every_name_once_a_period_a_slice_at_a_time(tmp_path):
    """Not 10,000 names in one instant: each tick a slice, every name once per period."""
    import threading

    c = Controller(NoApi(), Settings(archive_dir=str(tmp_path), resync_seconds=5),
                   make_elector=Candidate, out=io.StringIO())
    for i in range(23):
        c.caches.teamspaces._store[f"t{i:02d}"] = teamspace(f"t{i:02d}", 2, uid=f"u{i}")
    added: list[list[str]] = []
    ticks = [0]

    class Stop(threading.Event):
        def wait(self, timeout=None):
            # Each tick: what was queued since the last one, then the next tick.
            added.append(list(c.queue._queue))
            c.queue._queue.clear()
            c.queue._dirty.clear()
            ticks[0] += 1
            return ticks[0] > 10

    c.stop = Stop()
    c.resync(tick=1.0)
    slices = [s for s in added[1:] if s]
    assert [len(s) for s in added[1:6]] == [5, 5, 5, 5, 3]   # 23 names over 5 ticks
    assert sorted(n for s in added[1:6] for n in s) == sorted(c.caches.teamspaces.list_keys())
    assert added[6:11] == added[1:6]   # the next period goes round again
    assert len(slices) >= 9
