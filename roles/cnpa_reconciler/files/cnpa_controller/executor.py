"""Send one TeamSpace's planned writes: the one executor, of every pass (--once, reconcile.sh)
and of the long-running controller.

The plan (plan.plan) decides every write; this module turns each intent into its request and
sends it, one TeamSpace at a time, and so each write's error belongs to that TeamSpace by
construction:
- steps in the plan's order (plan.STEPS); a write that fails leaves its TeamSpace out of the
  later steps, so its status never claims what is not in place;
- a status replace carries the resourceVersion our own earlier write returned (else it would
  conflict with it) and the uid of the namespace created a moment ago;
- the archive record of a deleting TeamSpace is kept (archive.ArchiveStore) before its finalizer
  may be released; an archive directory that is missing or was replaced refuses every release:
  the controller then exits 4 so that systemd restarts it with fresh mounts;
- a quota's guarded replace (resourceVersion) that fails is followed by its fallback, a JSON
  patch guarded by the limits as read, sent alone;
- patches of a TeamSpace are guarded by its uid (a JSON patch test op): a TeamSpace deleted and
  made again under the same name since the cache saw it is never patched by mistake;
- a conflict (optimistic concurrency) is routine: logged, retried, no Event; another failure is a
  Warning Event and, unless it was the status write itself, Ready False (plan.failed_status);
- Events (events.EventRecorder) record the problems, one per (uid, reason, message), counted
  while a problem lasts; the Events of the plan's writes (QuotaReverted) go out once the write
  went through.

The archive store and the recorder return what became of a record or an Event; this module
decides what follows (Ready False, the leader's stop, the lines said, the metrics counted).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Callable

from . import plan
from .api import JSON_PATCH, MERGE_PATCH, Api, ApiError, path_of
from .archive import ArchiveStore
from .config import Settings
from .events import NOT_LEADER, RECORDED, EventRecorder
from .logs import about
from .plan import API_VERSION, FINALIZER, LABEL, NAMESPACE_NOT_OURS, STEPS

CONFLICT = "Conflict"

log = logging.getLogger(__name__)


class NotLeader(Exception):
    """Leadership was lost before a write: the pass stops, writing nothing more."""


class TeamSpaceGone(Exception):
    """The TeamSpace no longer exists (404 on a write to it): its pass ends, nothing failed."""


@dataclass
class Result:
    """What became of one TeamSpace's pass."""
    writes: int = 0
    failed: bool = False  # some write failed (conflicts included): retry with backoff
    problems: bool = False  # the plan reported what no write can fix
    not_leader: bool = False
    gone: bool = False  # the TeamSpace was gone when written to
    archive_broken: bool = False
    errors: list = field(default_factory=list)  # reasons of the failures


def _teamspace_path(name: str, subresource: str = "") -> str:
    return path_of({"apiVersion": API_VERSION, "kind": "TeamSpace", "metadata": {"name": name}},
                   subresource=subresource)


def _guarded(intent: plan.Intent, ops: list) -> list:
    """A JSON patch of a TeamSpace, guarded by its uid: a TeamSpace deleted and made again under
    the same name since it was read is never patched by mistake."""
    return [{"op": "test", "path": "/metadata/uid", "value": intent.uid}, *ops] if intent.uid else ops


def _remove_ours_at(index: int) -> list:
    return [{"op": "test", "path": f"/metadata/finalizers/{index}", "value": FINALIZER},
            {"op": "remove", "path": f"/metadata/finalizers/{index}"}]


def request_of(intent: plan.Intent, written: dict, *, fallback: bool = False
               ) -> tuple[str, str, str | None, object]:
    """(method, path, content type, body) of an intent. written: path -> (resourceVersion, uid) of
    what this TeamSpace's earlier writes returned. fallback: a SetQuota's second request."""
    if isinstance(intent, plan.AddFinalizer):
        ops = ([{"op": "test", "path": "/metadata/finalizers", "value": None},
                {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}]
               if intent.first else [{"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}])
        return "PATCH", _teamspace_path(intent.teamspace), JSON_PATCH, _guarded(intent, ops)
    if isinstance(intent, (plan.RemoveDuplicateFinalizer, plan.ReleaseFinalizer)):
        return ("PATCH", _teamspace_path(intent.teamspace), JSON_PATCH,
                _guarded(intent, _remove_ours_at(intent.index)))
    if isinstance(intent, plan.CreateNamespace):
        return "POST", path_of(intent.namespace, collection=True), None, intent.namespace
    if isinstance(intent, plan.RestoreNamespaceOwner):
        # The resourceVersion makes the merge patch conditional.
        return ("PATCH", f"/api/v1/namespaces/{intent.namespace}", MERGE_PATCH,
                {"metadata": {"resourceVersion": intent.resource_version,
                              "ownerReferences": intent.owner_references}})
    if isinstance(intent, plan.CreateQuota):
        return "POST", path_of(intent.quota, collection=True), None, intent.quota
    if isinstance(intent, plan.SetQuota):
        if fallback:
            # Conditional on the limits as read, not on the resourceVersion (which the quota's
            # status updates keep moving): a late write, such as a deposed leader's, cannot undo
            # a newer one. Replacing the map removes the limits we do not set.
            return ("PATCH", path_of(intent.quota), JSON_PATCH,
                    [{"op": "test", "path": "/spec/hard", "value": intent.was},
                     {"op": "replace", "path": "/spec/hard", "value": intent.hard}])
        return "PUT", path_of(intent.quota), None, intent.quota
    if isinstance(intent, plan.SetStatus):
        body = json.loads(json.dumps(intent.teamspace_object))
        mine = written.get(_teamspace_path(intent.teamspace))
        if mine:  # our own finalizer patch a moment ago: else this replace conflicts with it
            body["metadata"]["resourceVersion"] = mine[0]
        if intent.namespace_created:
            ns = written.get(f"/api/v1/namespaces/{plan.namespace_of(intent.teamspace)}")
            body["status"]["namespaceUID"] = ns[1] if ns else None
        return "PUT", _teamspace_path(intent.teamspace, "status"), None, body
    raise ValueError(f"the plan has an intent this executor does not know: {intent!r}")


def written_key(method: str, path: str, body: object) -> str:
    """The object a request wrote, as request_of's `written` names it: its path (a create is sent
    to its collection, a status replace to the subresource)."""
    return path_of(body) if method == "POST" else path.removesuffix("/status")


def is_conflict(exc: ApiError) -> bool:
    """Somebody wrote the object since it was read: routine, retried, not worth an Event. A JSON
    patch whose test op failed (the list or the uid changed meanwhile) is one too."""
    if exc.status == 409 and exc.reason != "AlreadyExists":
        return True
    # What the API server answers when a JSON patch's test op fails.
    text = exc.message.lower()
    return exc.status == 422 and ("rejected our request due to an error in our request" in text
                                  or "testing value" in text)


class Executor:
    def __init__(self, api: Api, *, archive_dir: str, event_namespace: str = "default",
                 archive_namespace: str = "",
                 may_write: Callable[[], bool] = lambda: True,
                 observe: Callable[[dict], None] = lambda obj: None,
                 say: Callable[[str, str], None] = lambda name, what: None,
                 count: Callable[..., None] = lambda name, labels=None: None) -> None:
        self.api = api
        self.may_write = may_write
        self.observe = observe
        self.say = say
        self.count = count
        self.archive = ArchiveStore(api, archive_dir, archive_namespace, may_write=may_write)
        self.events = EventRecorder(api, event_namespace, may_write=may_write)

    @classmethod
    def from_settings(cls, api: Api, settings: Settings, **kw) -> Executor:
        """The executor of a pass or of the controller: where these settings keep records and
        Events; kw: may_write, observe, say, count."""
        return cls(api, archive_dir=settings.archive_dir, event_namespace=settings.event_namespace,
                   archive_namespace=settings.archive_namespace, **kw)

    # -- one TeamSpace ---------------------------------------------------------------------
    def execute(self, teamspace: dict, writes: list, now: str) -> Result:
        result = Result()
        order = {s: i for i, s in enumerate(STEPS)}
        written: dict[str, tuple] = {}
        failures: list[tuple[str, str]] = []
        try:
            for w in sorted(writes, key=lambda w: order[w.step]):
                if result.failed:
                    break  # later steps of a TeamSpace whose write failed are left out
                if isinstance(w, plan.Report):
                    result.problems = True
                    log.warning("TeamSpace %s: %s", w.teamspace, w.event.message, extra=about(w.teamspace))
                    self._event(w.teamspace, w.uid, w.event, now)
                elif isinstance(w, plan.Archive):
                    self._archive(w, result, failures)
                else:
                    self._send(w, written, result, failures, now)
            # Writes that failed for a reason the owner should see: Ready False, once.
            if failures and not teamspace["metadata"].get("deletionTimestamp"):
                reason, message = failures[0]
                for w in plan.failed_status(teamspace, reason, message, now):
                    self._send(w, written, result, [], now)
        except TeamSpaceGone:
            name = teamspace["metadata"]["name"]
            log.info("TeamSpace %s: gone; nothing more to write", name, extra=about(name))
        except NotLeader:
            result.not_leader = True
            name = teamspace["metadata"]["name"]
            log.info("TeamSpace %s: no longer the leader; pass stopped before its next write", name,
                     extra=about(name))
        return result

    def _check_leader(self) -> None:
        if not self.may_write():
            raise NotLeader()

    def _send(self, w: plan.Intent, written: dict, result: Result, failures: list,
              now: str) -> None:
        self._check_leader()
        try:
            path, obj = self._request(w, written)
        except ApiError as exc:
            if not isinstance(w, plan.SetQuota):
                self._failed_write(w, w.op, exc, result, failures, now)
                return
            # The guarded replace lost (to quota admission's status updates, or to an edit):
            # the fallback cannot lose, and what it says is about this quota only.
            self._check_leader()
            try:
                path, obj = self._request(w, written, fallback=True)
            except ApiError as exc2:
                self._failed_write(w, "patch", exc2, result, failures, now)
                return
        meta = obj.get("metadata") or {}
        written[path] = (meta.get("resourceVersion"), meta.get("uid"))
        if obj.get("kind"):
            self.observe(obj)
        result.writes += 1
        self.count("cnpa_writes_total", {"step": w.step, "op": w.op})
        self.say(w.teamspace, w.says)
        ev = getattr(w, "event", None)
        if ev:
            self._event(w.teamspace, w.uid, ev, now)

    def _request(self, w: plan.Intent, written: dict, *, fallback: bool = False) -> tuple[str, dict]:
        method, path, ctype, body = request_of(w, written, fallback=fallback)
        answer = self.api.request(method, path, body=body, content_type=ctype)
        return written_key(method, path, body), answer

    def _failed_write(self, w: plan.Intent, op: str, exc: ApiError, result: Result,
                      failures: list, now: str) -> None:
        step, name = w.step, w.teamspace
        err = str(exc) or "no message"
        on_teamspace = isinstance(w, (plan.AddFinalizer, plan.RemoveDuplicateFinalizer,
                                      plan.ReleaseFinalizer, plan.SetStatus))
        if exc.status == 404 and on_teamspace:
            # The TeamSpace itself is gone (released a moment ago, the watch not there yet):
            # nothing to retry and nothing to tell its owner.
            result.gone = True
            raise TeamSpaceGone()
        if isinstance(w, plan.CreateNamespace) and exc.reason == "AlreadyExists":
            if self._namespace_labelled(w.namespace["metadata"]["name"]):
                # Ours (or labelled for a TeamSpace, which the plan judges): the cache has not
                # seen it yet. Retried, and then the plan sees it.
                self._fail(w, result, failures, CONFLICT,
                           f"namespace create: {err}; the cache had not seen it yet, retrying", now)
            else:
                self._fail(w, result, failures, NAMESPACE_NOT_OURS,
                           f"namespace {plan.namespace_of(name)} already exists and is not "
                           f"managed by cnpa-op (no {LABEL}={name} label); not adopting or "
                           "modifying it - delete or rename it", now)
        elif is_conflict(exc) or (exc.reason == "AlreadyExists" and step == "quota"):
            self._fail(w, result, failures, CONFLICT,
                       f"{step} {op} conflicted with another write ({err}); retrying", now)
        else:
            self._fail(w, result, failures, f"{step.capitalize()}{op.capitalize()}Failed",
                       f"{step} {op} failed: {err}; retrying", now)

    def _namespace_labelled(self, ns: str) -> bool:
        try:
            obj = self.api.request("GET", f"/api/v1/namespaces/{ns}")
        except ApiError:
            return False
        return LABEL in ((obj.get("metadata") or {}).get("labels") or {})

    def _fail(self, w: plan.Intent, result: Result, failures: list, reason: str, message: str,
              now: str) -> None:
        """A write for one TeamSpace did not go through. The owner learns why from an Event and
        the Ready condition (conflicts excepted)."""
        result.failed = True
        result.errors.append(reason)
        self.count("cnpa_errors_total", {"reason": reason})
        log.warning("TeamSpace %s: %s", w.teamspace, message, extra=about(w.teamspace))
        if reason == CONFLICT:
            return
        self._event(w.teamspace, w.uid, plan.Event("Warning", reason, message), now)
        if w.step != "status":
            failures.append((reason, message))

    # -- the archive store's and the recorder's outcomes --------------------------------------
    def _archive(self, w: plan.Archive, result: Result, failures: list) -> None:
        kept = self.archive.keep(w)
        for op, line in kept.written:
            result.writes += 1
            self.count("cnpa_writes_total", {"step": "archive", "op": op})
            self.say(w.teamspace, line)
        if kept.broken:
            result.archive_broken = True
        if kept.not_leader:
            raise NotLeader()
        if kept.failure:
            self._fail(w, result, failures, *kept.failure, plan.utc_now())

    def _event(self, name: str, uid: str, event: plan.Event, now: str) -> None:
        done = self.events.record(name, uid, event, now)
        if done.outcome == NOT_LEADER:
            raise NotLeader()
        if done.outcome == RECORDED:
            self.say(name, f"event {event.type} {event.reason} recorded"
                     + (f" (seen {done.count} times)" if done.count > 1 else ""))
