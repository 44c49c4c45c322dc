"""Watch-fed caches of the objects the plan reads: TeamSpaces, their namespaces and quotas.

One informer per kind: it lists the kind once (paginated, so a large cluster is read in bounded
pieces), then watches from the list's resourceVersion. It keeps each object's slim record
(records.py: what the plan reads and the executor sends back), not the whole object. The cache
is what the workers read, so an idle controller sends no list requests at all; each change
reaches it as one watch event, and the
handler queues the name of the TeamSpace the object concerns (never the event itself: the worker
reads the whole current state, level-triggered, as a pass does).

What each informer asks for is what a pass (once.py) lists, and for the same reasons:
- every TeamSpace (cluster-scoped);
- the namespaces that carry our label `platform.labhub.io/teamspace` (any value). A namespace
  team-X made by somebody else without our label is not in the cache: the plan then plans to
  create team-X, the create fails with AlreadyExists, and the executor reports NamespaceNotOurs
  (as in a pass; the failure is retried with backoff, so a foreign namespace that is
  deleted later is noticed within the retry cap). One that carries our label for another
  TeamSpace, or without our ownerReference, is in the cache and the plan reports it.
- the quotas named team-quota (fieldSelector metadata.name=team-quota), in any namespace.

A watch ends normally after the server's timeout (timeoutSeconds, jittered so that the kinds do
not all reconnect at once) and is resumed from the last resourceVersion seen (bookmarks keep it
fresh, so a resume rarely finds it too old). A resume that is answered 410 Gone (the version was
compacted away) starts a full relist. As client-go's reflector: a watch the API server refuses
or fails (403 after a lost permission, 500, 429, any status) lists again, after capped
exponential backoff, since what happened meanwhile reached no watch; a break without an answer
(connection refused or lost, API server restarting) resumes the watch where it was; a relist
that fails is retried the same way.

Never blind while ready: an informer is stale once its list or watch has failed for longer than
stale_seconds in a row, with no event or bookmark and no watch open for a second since (stale()):
the controller's
/readyz then says so, and the metrics count every failure by resource and code. Lists alone do
not end a run of failures: a cache refreshed only by relists every backoff is no longer
watching.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Callable

from . import records
from .api import DEFAULT_TIMEOUT, Api, ApiError
from .plan import API_VERSION, LABEL, QUOTA, namespace_of, teamspace_of

# Seconds a watch must stay open to count as working (shorter, with nothing in it: a failure).
SHORT_WATCH = 1.0

log = logging.getLogger(__name__)


def teamspace_of_teamspace(obj: dict) -> str | None:
    return (obj.get("metadata") or {}).get("name") or None


def teamspace_of_namespace(obj: dict) -> str | None:
    """Namespace team-X concerns TeamSpace X, whatever its label says (the plan judges that)."""
    return teamspace_of((obj.get("metadata") or {}).get("name") or "")


def teamspace_of_quota(obj: dict) -> str | None:
    """Quota team-quota in namespace team-X concerns TeamSpace X; other quotas none."""
    meta = obj.get("metadata") or {}
    if meta.get("name") != QUOTA:
        return None
    return teamspace_of(meta.get("namespace") or "")


def object_key(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


def _newer(a: str | None, b: str | None) -> bool:
    """resourceVersion a is provably newer than b. Versions are opaque to clients, but every API
    server (etcd's revisions, k3s's kine) makes them increasing integers; with anything else
    nothing is provably newer, and the cache follows the watch alone."""
    try:
        return int(a) > int(b)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


class Gone(Exception):
    """The resourceVersion asked for is too old (410): only a relist helps."""


class Informer:
    """A cache of one kind of object, filled by list and watch, in a thread of its own (run)."""

    def __init__(self, api: Api, kind: str, path: str, *, label_selector: str | None = None,
                 field_selector: str | None = None,
                 on_change: Callable[[dict], None] = lambda obj: None,
                 page_size: int = 500, watch_timeout: int = 300, backoff_cap: float = 30.0,
                 request_timeout: float = DEFAULT_TIMEOUT, stale_seconds: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.kind = kind
        self.path = path
        self.selectors = {"labelSelector": label_selector, "fieldSelector": field_selector}
        self.on_change = on_change
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self.backoff_cap = backoff_cap
        self.request_timeout = request_timeout
        self.synced = threading.Event()
        self.resource_version = ""
        self.relists = 0  # full lists made (the first one included)
        self.watches = 0  # watch requests made
        self.stale_seconds = stale_seconds
        self._clock = clock
        # HTTP status (or "<error>": no answer) -> lists and watches that failed with it.
        self.failures: dict[str, int] = {}
        self.last_error = ""
        # Our clock when the current run of failures began (None: the watch works), and when the
        # watch now open was opened (None: none is).
        self._failing_since: float | None = None
        self._watching_since: float | None = None
        self._lock = threading.Lock()
        self._store: dict[str, dict] = {}
        self._deleted: dict[str, str | None] = {}  # key -> resourceVersion of its deletion
        self._watch = None   # the watch open now (close() breaks it)

    # -- reading the cache -----------------------------------------------------------------
    def get(self, key: str) -> dict | None:
        with self._lock:
            return self._store.get(key)

    def list_keys(self) -> list[str]:
        with self._lock:
            return list(self._store)

    def __len__(self) -> int:
        with self._lock:
            return len(self._store)

    def observe(self, obj: dict) -> None:
        """Take in an object a write of ours returned: the cache must not wait for the watch to
        learn what we just wrote (a pass planned on the older copy would write it again, or take
        our own new namespace for somebody else's). An older copy never replaces a newer one."""
        obj = records.record_of(obj)
        key = object_key(obj)
        meta = obj.get("metadata") or {}
        rv = meta.get("resourceVersion")
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            return  # our write released its last finalizer: it is gone, not to be cached
        with self._lock:
            if key in self._deleted and not _newer(rv, self._deleted[key]):
                return  # the watch reported it deleted after this write: stays deleted
            have = self._store.get(key)
            if have is None:
                # Absent although the watch is already past this version: it was deleted since
                # (the tombstones above are bounded and may have been emptied).
                if not self.resource_version or _newer(rv, self.resource_version):
                    self._store[key] = obj
            elif _newer(rv, (have.get("metadata") or {}).get("resourceVersion")):
                self._store[key] = obj

    # -- health ------------------------------------------------------------------------------
    def _failed(self, exc: Exception) -> None:
        code = str(exc.status) if isinstance(exc, ApiError) and exc.status else "<error>"
        with self._lock:
            self.failures[code] = self.failures.get(code, 0) + 1
            self.last_error = str(exc)[:300]
            if self._failing_since is None:
                self._failing_since = self._clock()

    def _heard(self) -> None:
        """The watch works: an event or a bookmark came."""
        if self._failing_since is not None:
            with self._lock:
                self._failing_since = None

    def _watching(self, opened: bool) -> None:
        with self._lock:
            self._watching_since = self._clock() if opened else None

    def stale(self) -> float:
        """Seconds this informer's list or watch has been failing for, once that is longer than
        stale_seconds; 0 while it works (or fails for less). A watch open for a second counts
        as working (a quiet one may bring nothing for minutes); one that the server ends at once
        (client-go's "very short watch") does not end a run of failures."""
        with self._lock:
            now = self._clock()
            if self._watching_since is not None and now - self._watching_since >= SHORT_WATCH:
                self._failing_since = None
            if self._failing_since is None:
                return 0.0
            failing = now - self._failing_since
        return failing if failing > self.stale_seconds else 0.0

    # -- list and watch ----------------------------------------------------------------------
    def relist(self) -> None:
        """List every object (in pages of page_size) and replace the cache; the objects that
        were added, changed or removed since the cache last knew them are handed to on_change."""
        items: dict[str, dict] = {}
        token = None
        paged = True
        while True:
            query = {**self.selectors, "continue": token}
            if paged:
                query["limit"] = self.page_size
            try:
                page = self.api.request("GET", self.path, query=query,
                                        timeout=self.request_timeout)
            except ApiError as exc:
                if exc.status == 410 and token:
                    # The continue token expired (the pages spanned a compaction). Paging again
                    # could expire again and again on a busy server: one list in one piece, as
                    # client-go's reflector falls back to.
                    log.info("list of %s expired between pages; listing in one piece", self.kind)
                    items, token, paged = {}, None, False
                    continue
                raise
            for obj in page.get("items") or []:
                # A list's items carry no kind; the plan and the executor's paths want it.
                obj.setdefault("kind", self.kind)
                obj.setdefault("apiVersion", API_VERSION if self.kind == "TeamSpace" else "v1")
                items[object_key(obj)] = records.record_of(obj)
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                break
        list_rv = meta.get("resourceVersion") or ""
        with self._lock:
            old = self._store
            # What our own writes put here after the list's snapshot is newer than the list: kept
            # (the watch from list_rv brings it again anyway); everything else is the list's.
            for key, obj in old.items():
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if _newer(rv, list_rv) and (key not in items or _newer(
                        rv, items[key]["metadata"].get("resourceVersion"))):
                    items[key] = obj
            self._store = items
            self.resource_version = list_rv
            self.relists += 1
        changed = [obj for key, obj in items.items()
                   if (old.get(key) or {}).get("metadata", {}).get("resourceVersion")
                   != obj["metadata"].get("resourceVersion")]
        changed += [obj for key, obj in old.items() if key not in items]
        self.synced.set()
        for obj in changed:
            self.on_change(obj)

    def watch(self, stop: threading.Event) -> None:
        """One watch from the current resourceVersion until the server ends it or it breaks."""
        # Jitter (as client-go's reflector): kinds and replicas do not all reconnect together.
        timeout = int(self.watch_timeout * (1 + random.random()))
        query = {**self.selectors, "resourceVersion": self.resource_version,
                 "allowWatchBookmarks": "true", "timeoutSeconds": timeout}
        self.watches += 1
        # The read timeout outlives the server's by a margin: a connection that went silent
        # (host gone, no FIN) is noticed instead of waited on forever.
        try:
            events = self.api.watch(self.path, query, timeout + 30,
                                    connect_timeout=self.request_timeout)
        except ApiError as exc:
            if exc.status == 410:
                raise Gone(f"watch of {self.kind}: {exc.message}") from exc
            raise
        self._watch = events
        self._watching(True)
        began, seen = time.monotonic(), 0
        try:
            for event in events:
                if stop.is_set():
                    return
                seen += 1
                self._event(event)
        finally:
            self._watch = None
            self.stale()   # a watch that lasted is a success even if nothing came
            self._watching(False)
            events.close()
        if not seen and time.monotonic() - began < SHORT_WATCH:
            # A watch the server (or a proxy) ends at once, with nothing in it, is a failure
            # (client-go's "very short watch"): resumed at once it would spin.
            raise ApiError(0, "ShortWatch", f"watch of {self.kind} ended at once with no event")

    def _event(self, event: dict) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone(f"watch of {self.kind}: {obj.get('message')}")
            raise ApiError(int(obj.get("code") or 0), str(obj.get("reason") or ""),
                           str(obj.get("message") or "watch error"))
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        self._heard()
        if kind == "BOOKMARK":
            self.resource_version = rv or self.resource_version
            return
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            return
        obj = records.record_of(obj)
        key = object_key(obj)
        with self._lock:
            if kind == "DELETED":
                self._store.pop(key, None)
                # Remembered (a bounded while) so that the answer to one of our writes,
                # taken in after this event, does not bring the object back.
                if len(self._deleted) >= 10000:
                    self._deleted.clear()
                self._deleted[key] = rv
            else:
                have = self._store.get(key)
                # A copy our own write put here may be newer than this event (which then
                # reports an earlier change): keep it; the watch brings ours next.
                if have is None or not _newer(have["metadata"].get("resourceVersion"), rv):
                    self._store[key] = obj
            self.resource_version = rv or self.resource_version
        self.on_change(obj)

    def run(self, stop: threading.Event) -> None:
        """List, then watch and resume until stop is set; relist on 410 Gone. Failures are
        retried with exponential backoff capped at backoff_cap seconds."""
        delay = 0.0
        need_list = True
        while not stop.is_set():
            if delay:
                stop.wait(delay)
                if stop.is_set():
                    return
            started = time.monotonic()
            try:
                if need_list:
                    self.relist()
                    need_list = False
                    started = time.monotonic()
                self.watch(stop)
                delay = 0.0
            except Gone as exc:
                log.info("%s; listing %s again", exc, self.kind)
                self._failed(ApiError(410, "Expired", str(exc)))
                need_list = True
                # Paced: a server that answers every watch with 410 must not be made to list
                # everything in a tight loop.
                delay = min(self.backoff_cap, max(0.2, delay * 2))
            except Exception as exc:  # a broken stream, no connection, a refused request
                if stop.is_set():
                    return
                self._failed(exc)
                # A watch that ran for a while before it broke is a fresh failure, not one more.
                if not need_list and time.monotonic() - started > 60:
                    delay = 0.0
                delay = min(self.backoff_cap, max(0.2, delay * 2))
                what = "list" if need_list else "watch"
                if isinstance(exc, ApiError) and exc.status not in (0, 429):
                    # Refused or failed by the API server (a lost permission, an error): what
                    # changed meanwhile reached no watch, so list again (client-go's reflector).
                    # Without an answer (status 0), or told to slow down (429), the watch
                    # resumes where it was, as the reflector's retriable watch errors do.
                    need_list = True
                log.warning("%s of %s failed (%s); retrying in %.1f s%s", what, self.kind, exc,
                            delay, ", then listing again" if need_list and what == "watch" else "")

    def close(self) -> None:
        """Break the current watch (at shutdown), so that its thread ends."""
        events = self._watch
        if events is not None:
            events.close()


class Caches:
    """The three informers of the controller, feeding one handler with TeamSpace names."""

    def __init__(self, api: Api, enqueue: Callable[[str], None], **options) -> None:
        def handler(mapping: Callable[[dict], str | None]) -> Callable[[dict], None]:
            def on_change(obj: dict) -> None:
                name = mapping(obj)
                if name:
                    enqueue(name)
            return on_change

        self.teamspaces = Informer(api, "TeamSpace", f"/apis/{API_VERSION}/teamspaces",
                                   on_change=handler(teamspace_of_teamspace), **options)
        self.namespaces = Informer(api, "Namespace", "/api/v1/namespaces", label_selector=LABEL,
                                   on_change=handler(teamspace_of_namespace), **options)
        self.quotas = Informer(api, "ResourceQuota", "/api/v1/resourcequotas",
                               field_selector=f"metadata.name={QUOTA}",
                               on_change=handler(teamspace_of_quota), **options)
        self.all = (self.teamspaces, self.namespaces, self.quotas)
        self._threads: list[threading.Thread] = []

    def start(self, stop: threading.Event) -> None:
        for inf in self.all:
            t = threading.Thread(target=inf.run, args=(stop,), name=f"informer-{inf.kind}",
                                 daemon=True)
            t.start()
            self._threads.append(t)

    def synced(self) -> bool:
        return all(inf.synced.is_set() for inf in self.all)

    def state(self, name: str) -> tuple[dict | None, dict | None, dict | None]:
        """The TeamSpace NAME, namespace team-NAME and its quota, as the caches have them."""
        ns = namespace_of(name)
        return (self.teamspaces.get(name), self.namespaces.get(ns),
                self.quotas.get(f"{ns}/{QUOTA}"))

    def observe(self, obj: dict) -> None:
        inf = {"TeamSpace": self.teamspaces, "Namespace": self.namespaces,
               "ResourceQuota": self.quotas}.get(obj.get("kind"))
        if inf is not None:
            inf.observe(obj)

    def close(self) -> None:
        for inf in self.all:
            inf.close()
