"""The controller's work queue: de-duplication, one worker per name, re-processing, backoff."""

from __future__ import annotations

import threading

from cnpa_controller.workqueue import WorkQueue


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def drain(q: WorkQueue) -> list:
    names = []
    while (name := q.get(timeout=0)) is not None:
        names.append(name)
        q.done(name)
    return names


def test_a_name_queued_twice_is_processed_once():
    q = WorkQueue()
    for name in ("a", "b", "a", "a", "c", "b"):
        q.add(name)
    assert len(q) == 3
    assert drain(q) == ["a", "b", "c"]


def test_a_name_changed_while_processed_is_processed_again_after_not_meanwhile():
    q = WorkQueue()
    q.add("a")
    assert q.get(timeout=0) == "a"
    q.add("a")  # an event while a worker is on it
    q.add("a")
    # No second worker may take it while the first is on it.
    assert q.get(timeout=0) is None
    q.done("a")
    assert q.get(timeout=0) == "a"
    q.done("a")
    assert q.get(timeout=0) is None


def test_retry_backoff_doubles_up_to_the_cap_and_forget_resets_it():
    clock = Clock()
    q = WorkQueue(retry_base=0.5, retry_cap=4.0, clock=clock)
    assert [q.retry("a") for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    q.forget("a")
    assert q.retry("a") == 0.5


def test_a_retried_name_comes_back_only_when_due():
    clock = Clock()
    q = WorkQueue(retry_base=2.0, clock=clock)
    q.retry("a")
    assert q.get(timeout=0) is None
    clock.now += 1.9
    assert q.get(timeout=0) is None
    clock.now += 0.2
    assert q.get(timeout=0) == "a"


def test_a_due_retry_of_a_queued_name_is_not_a_second_entry():
    clock = Clock()
    q = WorkQueue(retry_base=1.0, clock=clock)
    q.add("a")
    q.retry("a")
    clock.now += 5
    assert drain(q) == ["a"]


def test_get_wakes_for_an_add_from_another_thread_and_shutdown_ends_waiters():
    q = WorkQueue()
    got = []
    t = threading.Thread(target=lambda: got.append(q.get(timeout=10)))
    t.start()
    q.add("x")
    t.join(10)
    assert got == ["x"]
    t = threading.Thread(target=lambda: got.append(q.get(timeout=10)))
    t.start()
    q.shutdown()
    t.join(10)
    assert not t.is_alive() and got == ["x", None]
    q.add("y")  # ignored once shut down
    assert q.get(timeout=0) is None


def test_many_workers_never_hold_the_same_name_at_once():
    q = WorkQueue()
    held: set = set()
    lock = threading.Lock()
    clashes = []
    done = []

    def worker():
        while (name := q.get(timeout=0.2)) is not None:
            with lock:
                if name in held:
                    clashes.append(name)
                held.add(name)
            # While held, more events for the same name arrive.
            q.add(name) if len(done) < 200 else None
            with lock:
                held.discard(name)
                done.append(name)
            q.done(name)

    for i in range(50):
        q.add(f"n{i % 5}")
    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not clashes
    assert len(done) >= 5


def test_a_name_waits_for_one_delayed_add_at_the_earliest_time_asked():
    clock = Clock()
    q = WorkQueue(clock=clock)
    q.add_after("a", 10)
    q.add_after("a", 30)  # later: the waiting one stands
    q.add_after("a", 5)   # earlier: replaces it
    assert q.delayed() == 1
    clock.now += 5
    assert drain(q) == ["a"]
    assert q.delayed() == 0
    clock.now += 30  # neither superseded time brings it back
    assert drain(q) == []


def test_a_teamspace_failing_for_hours_has_at_most_one_timer():
    """Six hours of simulated time of a name whose every pass fails, as the controller drives the
    queue: each pass that fails retries with backoff, each resync (300 s) and each watch event
    (here every 7 s: quota status churn, or a follower's plan that is never empty) adds it again."""
    clock = Clock()
    q = WorkQueue(retry_base=0.5, retry_cap=30.0, clock=clock)
    passes = most_waiting = 0
    t_end = clock.now + 6 * 3600
    next_event, next_resync = clock.now, clock.now + 300
    while clock.now < t_end:
        if clock.now >= next_event:
            q.add("team-x")
            next_event += 7
        if clock.now >= next_resync:
            q.add("team-x")
            next_resync += 300
        while (name := q.get(timeout=0)) is not None:
            passes += 1
            q.retry(name)  # the pass failed
            q.done(name)
        most_waiting = max(most_waiting, q.delayed(), len(q._later))
        clock.now += 0.25
    assert most_waiting == 1
    # Bounded work: one pass per event and resync, plus the one retry chain at the cap.
    assert passes <= 6 * 3600 * (1 / 7 + 1 / 300 + 1 / 30) + 10
