"""The controller's loop: caches, queue, workers, resync, leadership and shutdown.

Each worker takes a TeamSpace name from the queue and reads the TeamSpace, namespace team-NAME
and its quota FROM THE CACHES: the whole current state, never the delta of the event that queued
the name (level-triggered, like a pass). It asks the plan what to write and, only
while this process is the leader, has the executor write it. Workers start only once every cache
has synced: a plan made on a half-filled namespace cache would try to create namespaces that
exist and report them as somebody else's.

Every process keeps its caches warm, leader or not, so a process that becomes the leader queues
every TeamSpace and reconciles at once, without listing anything.

The main loop starts the workers once the caches have synced, touches its heartbeat every tick
and feeds systemd's watchdog while healthz() finds nothing wrong (health.py). Metrics: the names
and labels are metrics.KNOWN's and those its collector reads from the caches and the queue.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any, Callable

from . import health, logs, plan
from .api import Api
from .cache import Caches
from .config import EXIT_ARCHIVE, EXIT_OK, Settings
from .executor import Executor
from .logs import about
from .workqueue import WorkQueue

log = logging.getLogger(__name__)


class AlwaysLeader:
    """Stand-in for leader.Elector (same methods) where no leader election runs: this process
    is the only writer."""

    def __init__(self, on_change: Callable[[bool], None] | None = None) -> None:
        self.on_change = on_change

    def is_leader(self) -> bool:
        return True

    def run(self, stop: threading.Event) -> None:
        if self.on_change is not None:
            self.on_change(True)
        stop.wait()

    def release(self) -> None:
        pass


class NoMetrics:
    """Stand-in for metrics.Metrics (same methods) when metrics are not wanted."""

    def inc(self, name: str, labels: dict | None = None, by: float = 1) -> None:
        pass

    def set(self, name: str, value: float, labels: dict | None = None) -> None:
        pass

    def observe(self, name: str, value: float, labels: dict | None = None) -> None:
        pass

    def queue(self, name: str = "") -> None:
        return None

    def watch(self, **objects) -> None:
        pass

    request = None

    def write_textfile(self, path: str) -> None:
        pass


# controller-runtime's result label for each of ours (cnpa_reconciles_total's). A process that
# does not lead reconciles nothing (as controller-runtime's do not): its "standby" (nothing to
# write) and "not_leader" (something to write) are counted apart, the latter in
# cnpa_not_leader_total.
RUNTIME_RESULT = {"converged": "success", "written": "success", "problem": "success",
                  "gone": "success", "failed": "error", "internal_error": "error"}
NOT_RECONCILED = ("standby", "not_leader")
CONTROLLER = "teamspace"


class Controller:
    def __init__(self, api: Api, settings: Settings, *,
                 make_elector: Callable[[Callable[[bool], None]], Any] | None = None,
                 metrics: Any = None, out=None) -> None:
        self.api = api
        self.settings = settings
        self.out = out or sys.stdout
        self._print_lock = threading.Lock()
        self.metrics = metrics or NoMetrics()
        self.stop = threading.Event()
        self.exit_status = EXIT_OK
        self.queue = WorkQueue(retry_cap=settings.retry_max_seconds, metrics=self.metrics.queue())
        self.heartbeats = health.Heartbeats()
        self.wedge_seconds = health.wedge_bound(settings.request_timeout, len(plan.STEPS))
        self.workers_started = threading.Event()
        self.metrics.set("controller_runtime_max_concurrent_reconciles", settings.workers,
                         {"controller": CONTROLLER})
        # Labelled counters exist from their first increment on, and rate()/increase() cannot
        # count that first one (there is no earlier sample): a first error would go unseen by an
        # alert. controller-runtime starts them at 0 for the same reason.
        for runtime_result in sorted(set(RUNTIME_RESULT.values())):
            self.metrics.inc("controller_runtime_reconcile_total",
                             {"controller": CONTROLLER, "result": runtime_result}, by=0)
        self.metrics.inc("controller_runtime_reconcile_errors_total", {"controller": CONTROLLER},
                         by=0)
        if self.metrics.request is not None:
            api.observe = self.metrics.request
        # The elector tells this controller when leadership changes (on_change, from run() on).
        self.elector = (make_elector or AlwaysLeader)(self.leader_changed)
        # Without election there is no Lease, and no leader series (client-go exports none).
        self.lease_name = getattr(self.elector, "name", "")
        if self.lease_name:
            self.metrics.set("leader_election_master_status", 0, {"name": self.lease_name})
            # From 0, as the reconcile counters above: a process's first takeover is then seen.
            self.metrics.inc("cnpa_leader_transitions_total", {"name": self.lease_name}, by=0)
        self.caches = Caches(api, self.queue.add, page_size=settings.list_page_size,
                             watch_timeout=settings.watch_timeout_seconds,
                             request_timeout=max(settings.request_timeout, 30.0),
                             stale_seconds=settings.cache_stale_seconds)
        self.executor = Executor.from_settings(api, settings, may_write=self.elector.is_leader,
                                               observe=self.caches.observe, say=self.say,
                                               count=self._count)
        self.metrics.watch(caches=self.caches, queue=self.queue)

    # -- output (the journal) --------------------------------------------------------------
    def say(self, name: str, what: str) -> None:
        """One line per write that went through, as a pass prints them."""
        line = logs.write_line(name, what)
        with self._print_lock:
            print(line, file=self.out, flush=True)

    def _count(self, name: str, labels: dict | None = None) -> None:
        self.metrics.inc(name, labels)

    # -- leadership --------------------------------------------------------------------------
    def leader_changed(self, leading: bool) -> None:
        if leading:
            log.info("became the leader")
        else:
            log.warning("lost the leadership; not writing")
        if self.lease_name:
            lease = {"name": self.lease_name}
            self.metrics.set("leader_election_master_status", 1 if leading else 0, lease)
            self.metrics.inc("cnpa_leader_transitions_total", lease)
        if leading:
            # Whatever changed while another process led (or none did) is reconciled now.
            self.enqueue_all()

    def _not_leader(self, name: str) -> None:
        """Something to write, but this process may not write now. Usually another process leads
        and this one queues everything anyway when it becomes leader; but leadership can also
        lapse for a moment and come back without a change being reported (a slow renewal), so
        the name is looked at again once a renewal could have happened."""
        self.queue.add_after(name, self.settings.not_leader_retry_seconds)

    def enqueue_all(self) -> None:
        for name in self.caches.teamspaces.list_keys():
            self.queue.add(name)

    # -- one TeamSpace ---------------------------------------------------------------------
    def reconcile(self, name: str) -> str:
        """Reconcile one TeamSpace; the result (cnpa_reconciles_total's label, or gone)."""
        teamspace, namespace, quota = self.caches.state(name)
        leading = self.elector.is_leader()
        if teamspace is None:
            self.queue.forget(name)  # gone: its namespace goes with it (ownerReference)
            return "gone" if leading else "standby"
        now = plan.utc_now()
        writes = plan.plan(teamspace, namespace, quota, now)
        if not writes:
            self.queue.forget(name)
            return "converged" if leading else "standby"
        if not leading:
            self._not_leader(name)
            return "not_leader"
        result = self.executor.execute(teamspace, writes, now)
        if result.not_leader:
            self._not_leader(name)
            return "not_leader"
        if result.archive_broken:
            self.exit_status = EXIT_ARCHIVE
            log.error("archive directory %s is missing or was replaced; exiting with status 4 so "
                      "that the service restarts with fresh mounts", self.settings.archive_dir)
            self.stop.set()
        if result.failed:
            delay = self.queue.retry(name)
            log.info("TeamSpace %s: retrying in %.1f s", name, delay, extra=about(name))
            return "failed"
        self.queue.forget(name)
        self.metrics.set("cnpa_last_successful_sync_timestamp_seconds", time.time())
        return "problem" if result.problems else "written"

    def worker(self, who: str) -> None:
        try:
            while not self.stop.is_set():
                self.heartbeats.beat(who)
                name = self.queue.get(timeout=1.0)
                if name is None:
                    continue
                began = time.monotonic()
                try:
                    result = self.reconcile(name)
                except Exception:
                    # One bad object never stops the others: logged, retried with backoff.
                    log.exception("TeamSpace %s: internal error, retrying:", name,
                                  extra=about(name))
                    self.metrics.inc("cnpa_errors_total", {"reason": "InternalError"})
                    self.queue.retry(name)
                    result = "internal_error"
                finally:
                    self.queue.done(name)
                self._reconciled(result, time.monotonic() - began)
        finally:
            self.heartbeats.forget(who)   # a worker that ended at shutdown is not wedged

    def _reconciled(self, result: str, seconds: float) -> None:
        if result in NOT_RECONCILED:
            if result == "not_leader":
                self.metrics.inc("cnpa_not_leader_total")
            return
        runtime = {"controller": CONTROLLER}
        self.metrics.observe("controller_runtime_reconcile_time_seconds", seconds, runtime)
        self.metrics.inc("controller_runtime_reconcile_total",
                         {**runtime, "result": RUNTIME_RESULT[result]})
        if RUNTIME_RESULT[result] == "error":
            self.metrics.inc("controller_runtime_reconcile_errors_total", runtime)
        if result not in ("gone", "internal_error"):
            self.metrics.inc("cnpa_reconciles_total", {"result": result})

    def resync(self, tick: float = 1.0) -> None:
        """Every resync period, every TeamSpace is queued: a change no event reported (or one
        missed) is still found. From the cache: no list request. Spread over the period, a
        slice every tick, not all at once: at 10,000 TeamSpaces a resync that queued every name
        in one instant made a burst of work (and of latency for a real change queued behind it)
        every period; sliced, it is a steady trickle that goes round once a period."""
        while not self.stop.is_set():
            names = sorted(self.caches.teamspaces.list_keys())
            steps = max(1, int(self.settings.resync_seconds / tick))
            per_step = -(-len(names) // steps)   # ceil: every name once a period
            for step in range(steps):
                if self.stop.wait(tick):
                    return
                for name in names[step * per_step:(step + 1) * per_step]:
                    self.queue.add(name)
            self.metrics.inc("cnpa_resyncs_total")

    def textfile(self) -> None:
        while not self.stop.wait(self.settings.metrics_textfile_seconds):
            self._write_textfile()

    def _write_textfile(self) -> None:
        try:
            self.metrics.write_textfile(self.settings.metrics_textfile)
        except OSError as exc:
            log.warning("cannot write the metrics textfile: %s", exc)

    # -- health ------------------------------------------------------------------------------
    def healthz(self) -> list[str]:
        """What makes this process unhealthy (nothing: healthy); health.py says what counts."""
        return [f"{who}: stuck for {age:.0f} s (more than {self.wedge_seconds:g} s)"
                for who, age in self.heartbeats.stale(self.wedge_seconds)]

    def readyz(self) -> list[str]:
        problems = self.healthz()
        if self.stop.is_set():
            problems.append("stopping")
        if not self.caches.synced():
            problems += [f"cache of {inf.kind} not synced" for inf in self.caches.all
                         if not inf.synced.is_set()]
        elif not self.workers_started.is_set():
            problems.append("workers not started")
        for inf in self.caches.all:
            failing = inf.stale()
            if failing:
                problems.append(f"cache of {inf.kind} stale: its list or watch has failed for "
                                f"{failing:.0f} s ({inf.last_error})")
        alive = getattr(self.elector, "alive", None)
        if alive is not None and not alive():
            problems.append("leader election loop not running")
        return problems

    # -- the whole run -----------------------------------------------------------------------
    def run(self) -> int:
        threads = [threading.Thread(target=self.elector.run, args=(self.stop,), name="elector",
                                    daemon=True)]
        threads[0].start()
        self.caches.start(self.stop)
        log.info("listing TeamSpaces, namespaces and quotas")
        watchdog = health.watchdog_seconds()
        # Started, not synced: an API server that is down at boot must not fail the start;
        # /readyz tells when the caches are in.
        health.notify("READY=1")
        tick = health.tick_seconds(watchdog)
        while True:
            self.heartbeats.beat("main")
            if not self.workers_started.is_set() and self.caches.synced():
                threads += self._start_workers()
            if watchdog and not self.healthz():
                health.notify("WATCHDOG=1")
            # Polled more often until the workers run: they start soon after the caches sync.
            if self.stop.wait(tick if self.workers_started.is_set() else min(tick, 0.2)):
                break
        health.notify("STOPPING=1")
        return self.shutdown(threads)

    def _start_workers(self) -> list[threading.Thread]:
        log.info("caches synced: %d TeamSpaces, %d namespaces, %d quotas",
                 len(self.caches.teamspaces), len(self.caches.namespaces), len(self.caches.quotas))
        self.metrics.set("cnpa_last_successful_sync_timestamp_seconds", time.time())
        threads = []
        for i in range(self.settings.workers):
            t = threading.Thread(target=self.worker, args=(f"worker-{i}",), name=f"worker-{i}",
                                 daemon=True)
            t.start()
            threads.append(t)
        extra = [self.resync]
        if self.settings.metrics_textfile:
            extra.append(self.textfile)
        for target in extra:
            t = threading.Thread(target=target, name=target.__name__, daemon=True)
            t.start()
            threads.append(t)
        self.workers_started.set()
        return threads

    def shutdown(self, threads: list) -> int:
        """Stop taking names, let the passes under way finish (bounded by their requests'
        timeouts), give the Lease up so that another process takes over at once."""
        self.stop.set()
        log.info("stopping: finishing the passes under way, then giving the Lease up")
        self.queue.shutdown()
        deadline = time.monotonic() + 4 * self.settings.request_timeout + 5
        for t in threads:
            if t.name.startswith("worker-"):
                t.join(max(0.0, deadline - time.monotonic()))
        try:
            self.elector.release()
        except Exception as exc:
            log.warning("could not release the Lease: %s", exc)
        self.caches.close()
        if self.settings.metrics_textfile:
            self._write_textfile()
        log.info("stopped")
        return self.exit_status
