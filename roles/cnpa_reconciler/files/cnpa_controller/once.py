"""One pass over every TeamSpace, from a fresh list: `python3 -m cnpa_controller --once`.

What reconcile.sh does, with the executor the watch controller uses: one paginated list of each
kind the plan reads, the plan of every TeamSpace, and its writes, the TeamSpaces side by side
(each one's writes in the plan's order, so its archive record is on disk before its finalizer
goes). A pass over a converged cluster writes nothing.

Exit status as reconcile.sh's: 0 converged or converging; 1 some TeamSpace failed or has a
problem no write can fix (named on stderr, retried next pass); 2 the API server could not be read
(nothing written); 4 the archive directory is missing or was replaced. reconcile.sh adds the lock
(75) and the deadline (124); the caller maps an internal error to 3.
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from . import plan
from .api import Api, ApiError
from .cache import Caches
from .controller import EXIT_ARCHIVE, EXIT_OK
from .executor import Executor

EXIT_FAILED, EXIT_UNREADABLE = 1, 2

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


def run_pass(api: Api, *, archive_dir: str, event_namespace: str, archive_namespace: str,
             page_size: int, request_timeout: float, workers: int, now: str,
             say: Callable[[str, str], None],
             plan_only: Callable[[str], None] | None = None) -> int:
    """One pass; plan_only: print each planned write (one JSON line) and write nothing."""
    try:
        caches = read_state(api, page_size=page_size, request_timeout=request_timeout)
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
    executor = Executor(api, archive_dir=archive_dir, event_namespace=event_namespace,
                        archive_namespace=archive_namespace, observe=caches.observe,
                        say=say)
    with ThreadPoolExecutor(max(1, min(workers, len(todo)))) as pool:
        results = list(pool.map(lambda item: executor.execute(item[0], item[1], now), todo))
    if any(r.archive_broken for r in results):
        return EXIT_ARCHIVE
    if any(r.failed or r.problems for r in results):
        return EXIT_FAILED
    return EXIT_OK
