"""A de-duplicating queue of TeamSpace names, with per-name retry backoff.

The semantics of client-go's rate-limited work queue, which every Kubernetes controller relies on:
- a name queued twice before a worker takes it is processed once (events are hints: the worker
  reads the whole current state from the caches, so one pass covers every event before it);
- a name is never processed by two workers at once; one that changes while it is being processed
  is queued again and processed after the current pass is done (nothing is lost);
- a name whose pass failed is queued again after a delay that doubles with each failure in a row,
  up to a cap (a broken object does not spin a worker, and still gets retried); a pass that
  succeeds forgets its failures;
- a name waits for at most one delayed add: a later add_after keeps the earlier of the two times
  (client-go's delaying queue). Otherwise every event or resync of a name that keeps failing
  would start one more timer chain, and their number would grow with uptime.

Its metrics are client-go's too (metrics.QueueMetrics): adds, retries, how long a name waited
before a worker took it and how long the worker took; depth and the longest-running worker are
read from the queue when scraped.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from typing import Any, Callable


class NoQueueMetrics:
    def added(self) -> None:
        pass

    def retried(self) -> None:
        pass

    def taken(self, waited: float) -> None:
        pass

    def done(self, worked: float) -> None:
        pass


class WorkQueue:
    def __init__(self, *, retry_base: float = 0.5, retry_cap: float = 30.0,
                 clock: Callable[[], float] = time.monotonic, metrics: Any = None) -> None:
        self._clock = clock
        self._metrics = metrics or NoQueueMetrics()
        self._retry_base = retry_base
        self._retry_cap = retry_cap
        self._cond = threading.Condition()
        self._queue: deque[str] = deque()
        self._dirty: set[str] = set()       # queued and not yet taken by a worker
        self._processing: set[str] = set()  # taken by a worker, not yet done
        self._added_at: dict[str, float] = {}    # dirty name -> when it was added
        self._started_at: dict[str, float] = {}  # name being processed -> when it was taken
        self._later: list[tuple[float, int, str]] = []  # (due, sequence, name), a heap
        # name -> when it is due: the one delayed add that counts (heap entries that disagree
        # were superseded by an earlier time and are skipped when they come up).
        self._waiting: dict[str, float] = {}
        self._sequence = 0
        self._failures: dict[str, int] = {}
        self._shutdown = False

    def add(self, name: str) -> None:
        with self._cond:
            self._add(name)

    def _add(self, name: str) -> None:
        if self._shutdown or name in self._dirty:
            return
        self._dirty.add(name)
        self._added_at[name] = self._clock()
        self._metrics.added()
        if name not in self._processing:
            self._queue.append(name)
            self._cond.notify()

    def add_after(self, name: str, delay: float) -> None:
        with self._cond:
            if self._shutdown:
                return
            if delay <= 0:
                self._add(name)
                return
            due = self._clock() + delay
            if self._waiting.get(name, float("inf")) <= due:
                return
            self._waiting[name] = due
            self._sequence += 1
            heapq.heappush(self._later, (due, self._sequence, name))
            self._cond.notify()

    def retry(self, name: str) -> float:
        """Queue the name again after its backoff delay; returns the delay."""
        with self._cond:
            n = self._failures.get(name, 0)
            self._failures[name] = n + 1
            delay = min(self._retry_cap, self._retry_base * (2 ** min(n, 62)))
        self._metrics.retried()
        self.add_after(name, delay)
        return delay

    def forget(self, name: str) -> None:
        with self._cond:
            self._failures.pop(name, None)

    def failures(self, name: str) -> int:
        with self._cond:
            return self._failures.get(name, 0)

    def _promote(self) -> float | None:
        """Move the delayed names that are due into the queue; the seconds until the next one."""
        now = self._clock()
        while self._later and self._later[0][0] <= now:
            due, _seq, name = heapq.heappop(self._later)
            if self._waiting.get(name) == due:
                del self._waiting[name]
                self._add(name)
        return self._later[0][0] - now if self._later else None

    def get(self, timeout: float | None = None) -> str | None:
        """The next name to process (the caller must call done() with it), or None when the queue
        is shut down or nothing came within timeout seconds."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._cond:
            while True:
                if self._shutdown:
                    return None
                wait = self._promote()
                if self._queue:
                    name = self._queue.popleft()
                    self._dirty.discard(name)
                    self._processing.add(name)
                    now = self._clock()
                    self._started_at[name] = now
                    self._metrics.taken(now - self._added_at.pop(name, now))
                    return name
                if deadline is not None:
                    left = deadline - self._clock()
                    if left <= 0:
                        return None
                    wait = left if wait is None else min(wait, left)
                self._cond.wait(wait)

    def done(self, name: str) -> None:
        with self._cond:
            self._processing.discard(name)
            started = self._started_at.pop(name, None)
            if started is not None:
                self._metrics.done(self._clock() - started)
            if name in self._dirty and not self._shutdown:
                self._queue.append(name)
                self._cond.notify()

    def shutdown(self) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()

    def __len__(self) -> int:
        """Names waiting to be processed now (the queue depth; delayed retries not counted)."""
        with self._cond:
            return len(self._queue)

    def longest_running(self) -> float:
        """Seconds the name processed longest so far has been processed (0 when none is)."""
        with self._cond:
            if not self._started_at:
                return 0.0
            return max(0.0, self._clock() - min(self._started_at.values()))

    def unfinished(self) -> float:
        """Seconds of the work in progress so far, summed over the names being processed."""
        with self._cond:
            now = self._clock()
            return sum(max(0.0, now - at) for at in self._started_at.values())

    def active(self) -> int:
        """Names being processed now (one per busy worker)."""
        with self._cond:
            return len(self._processing)

    def delayed(self) -> int:
        """Names waiting for a delayed add (at most one timer each)."""
        with self._cond:
            return len(self._waiting)

    def timers(self) -> int:
        """Delayed adds pending, superseded ones included (they are dropped when due)."""
        with self._cond:
            return len(self._later)
