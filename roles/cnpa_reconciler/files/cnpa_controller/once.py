"""One pass over every TeamSpace, from a fresh list: `python3 -m cnpa_controller --once`.

What reconcile.sh does, with the executor the watch controller uses: one paginated list of each
kind the plan reads, the plan of every TeamSpace, and its writes, the TeamSpaces side by side
(each one's writes in the plan's order, so its archive record is on disk before its finalizer
goes). A pass over a converged cluster writes nothing.

A pass that has something to write takes its turn on the controllers' Lease first
(turn.PassTurn), as every writer does, whichever mode runs where: while another process holds the
Lease and renews it, the pass writes nothing (that process writes); where the Lease's namespace
does not exist, no controller can hold it and the pass writes unfenced. A pass with nothing to
write sends no request beyond its lists.

run_until() makes passes until the TeamSpaces are what a caller waits for (the uninstall: every
one carries the finalizer, then none does) and says what they are then.

Exit status as reconcile.sh's: 0 converged or converging (another controller's writes
included); 1 some TeamSpace failed or has a problem no write can fix (named on stderr, retried
next pass), or the pass lost the Lease before it was done or may not read it; 2 the API server
could not be read (nothing written); 4 the archive directory is missing or was replaced.
reconcile.sh adds the lock (75) and the deadline (124); the caller maps an internal error to 3.
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from . import plan
from .api import Api, ApiError
from .cache import Caches
from .config import EXIT_ARCHIVE, EXIT_FAILED, EXIT_OK, EXIT_UNREADABLE, PASS_SECONDS, Settings
from .executor import Executor
from .plan import FINALIZER
from .turn import PassTurn

# What run_until waits for: no TeamSpace holds our finalizer (RELEASED), or every TeamSpace that
# is not being deleted holds it (FINALIZED).
RELEASED, FINALIZED = "released", "finalized"
UNTIL = (RELEASED, FINALIZED)
PAUSE_SECONDS = 1.0

log = logging.getLogger(__name__)


def read_state(api: Api, *, page_size: int, request_timeout: float) -> Caches:
    """The three kinds, listed once each (no watch), at the same time: each list is a few
    sequential pages, and a pass is mostly waiting on them. Raises ApiError if any cannot be read."""
    caches = Caches(api, lambda name: None, page_size=page_size,
                    request_timeout=request_timeout)
    with ThreadPoolExecutor(len(caches.all)) as pool:
        for done in [pool.submit(informer.relist) for informer in caches.all]:
            done.result()
    return caches


def plans(caches: Caches, now: str) -> list[tuple[dict, list]]:
    """Every TeamSpace with something to write, and what (in name order)."""
    out = []
    for name in sorted(caches.teamspaces.list_keys()):
        teamspace, namespace, quota = caches.state(name)
        writes = plan.plan(teamspace, namespace, quota, now)
        if writes:
            out.append((teamspace, writes))
    return out


def run_pass(api: Api, settings: Settings, *, now: str, say: Callable[[str, str], None],
             turn: PassTurn | None = None,
             plan_only: Callable[[str], None] | None = None) -> int:
    """One pass. turn: the Lease to take before writing (None: this is the only writer);
    plan_only: print each planned write (one JSON line) and write nothing."""
    try:
        caches = read_state(api, page_size=settings.list_page_size,
                            request_timeout=settings.request_timeout)
    except ApiError as exc:
        log.error("cannot list TeamSpaces, namespaces or quotas (API server unreachable or CRD "
                  "missing?); pass aborted, nothing written: %s", exc)
        return EXIT_UNREADABLE
    todo = plans(caches, now)
    if plan_only is not None:
        for _teamspace, writes in todo:
            for w in writes:
                plan_only(json.dumps(plan.as_dict(w), separators=(",", ":")))
        return EXIT_OK
    if not todo:
        return EXIT_OK
    if turn is not None:
        got = turn.take()
        if got == turn.REFUSED:
            return EXIT_FAILED
        if got not in (turn.LEADING, turn.NO_LEASE):
            log.warning("lease %s is held by %s, which renews it: this pass writes nothing "
                        "(%d TeamSpaces to reconcile; that controller writes)",
                        turn.elector.describe(), got, len(todo))
            return EXIT_OK
    try:
        executor = Executor.from_settings(
            api, settings, may_write=turn.may_write if turn is not None else lambda: True,
            observe=caches.observe, say=say)
        with ThreadPoolExecutor(max(1, min(settings.workers, len(todo)))) as pool:
            results = list(pool.map(lambda item: executor.execute(item[0], item[1], now), todo))
    finally:
        if turn is not None:
            turn.done()
    if any(r.archive_broken for r in results):
        return EXIT_ARCHIVE
    if any(r.not_leader for r in results):
        log.warning("the pass lost lease %s before it was done; the next pass goes on",
                    turn.elector.describe() if turn is not None else "")
        return EXIT_FAILED
    if any(r.failed or r.problems for r in results):
        return EXIT_FAILED
    return EXIT_OK


def waiting(teamspaces: list[dict], until: str) -> list[str]:
    """The names of the TeamSpaces that are not yet what `until` waits for."""
    names = []
    for t in teamspaces:
        meta = t.get("metadata") or {}
        ours = FINALIZER in (meta.get("finalizers") or [])
        if ours if until == RELEASED else (not ours and not meta.get("deletionTimestamp")):
            names.append(meta.get("name"))
    return names


def described(teamspaces: list[dict]) -> list[dict]:
    """What a caller reads of each TeamSpace: to delete that very one, or to say what holds it."""
    return [{"name": meta.get("name"), "uid": meta.get("uid"),
             "deleting": meta.get("deletionTimestamp") is not None,
             "finalizers": meta.get("finalizers") or []}
            for meta in ((t.get("metadata") or {}) for t in teamspaces)]


def list_teamspaces(api: Api, settings: Settings) -> list[dict]:
    """Every TeamSpace, in name order. Raises ApiError."""
    caches = Caches(api, lambda name: None, page_size=settings.list_page_size,
                    request_timeout=settings.request_timeout)
    caches.teamspaces.relist()
    return [caches.teamspaces.get(name) for name in sorted(caches.teamspaces.list_keys())]


def run_until(api: Api, settings: Settings, *, until: str, max_passes: int,
              one_pass: Callable[[], int], clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> dict | None:
    """Passes (one_pass() makes one and returns its exit status), PAUSE_SECONDS apart, until
    the TeamSpaces listed after a pass are what `until` waits for, or max_passes were made, or
    max_passes * PASS_SECONDS have gone by. Returns passes, last_exit, left (the names still
    waiting) and every TeamSpace (described); None when they could not be listed."""
    deadline = clock() + max_passes * PASS_SECONDS
    passes = 0
    while True:
        last_exit = one_pass()
        passes += 1
        try:
            teamspaces = list_teamspaces(api, settings)
        except ApiError as exc:
            log.error("cannot list the TeamSpaces after pass %d: %s", passes, exc)
            return None
        left = waiting(teamspaces, until)
        if not left or passes >= max_passes or clock() >= deadline:
            return {"passes": passes, "last_exit": last_exit, "left": left,
                    "teamspaces": described(teamspaces)}
        sleep(PAUSE_SECONDS)
