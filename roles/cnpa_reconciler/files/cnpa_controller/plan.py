"""What the TeamSpace controller writes, as a pure function of what it has read.

`plan(teamspace, namespace, quota, now)` looks at one TeamSpace, the namespace `team-<name>` and
the quota `team-quota` in it as the API server returned them (None when absent), and returns the
writes that bring them to the desired state, in the order they must happen. It reads nothing,
writes nothing and keeps no state: the same inputs always give the same plan, and a converged
TeamSpace gives an empty one. The controller (cnpa_controller) runs it for every TeamSpace of a
pass (`--once`, which reconcile.sh runs) and for one TeamSpace at a time from its watches.

A plan is a list of intents, one dataclass per kind of write (AddFinalizer, Archive,
CreateNamespace, SetQuota, SetStatus, ...): what it is about and what it wants, in the spec's
nouns, never how it is sent (the executor turns each into its request). Every intent names its
TeamSpace and the line said once it went through. Problems that no write can fix are Report
intents: the executor logs them and records a Warning Event, and the TeamSpace's status says
Ready False with the same reason and message.

Python 3.9+, standard library only (the lab VM's python3; the `kubernetes` client is not needed).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from .quantity import MAX_CPU_LENGTH, quantity, same_quantity, stored_cpu

GROUP = "platform.labhub.io"
API_VERSION = f"{GROUP}/v1alpha1"
FINALIZER = f"{GROUP}/cleanup"
LABEL = f"{GROUP}/teamspace"
QUOTA = "team-quota"
# TeamSpace NAME's namespace is team-NAME (namespace_of), and namespace team-NAME concerns
# TeamSpace NAME (teamspace_of).
NAMESPACE_PREFIX = "team-"
# Every object the controller makes carries this label (Events, archive ConfigMaps, the Lease).
MANAGED_BY = ("app.kubernetes.io/managed-by", "cnpa-op")
DEFAULT_CPU = "1"

# The order in which writes happen within a pass. A TeamSpace whose write fails is left out of
# the later steps, so its status never claims what is not in place.
STEPS = ("problem", "finalizer", "archive", "release", "namespace", "quota", "status")

# Event reasons: Warning unless noted.
INVALID_NAME = "InvalidName"
INVALID_CPU = "InvalidCPU"
INVALID_PODS = "InvalidPods"
NAMESPACE_TERMINATING = "NamespaceTerminating"
NAMESPACE_NOT_OURS = "NamespaceNotOurs"
NAMESPACE_OWNED_BY_OTHER = "NamespaceOwnedByOther"
QUOTA_SCOPED = "QuotaScoped"
ARCHIVE_FAILED = "ArchiveFailed"
ARCHIVE_RECORD_MISMATCH = "ArchiveRecordMismatch"  # the cluster's copy is not this record
QUOTA_REVERTED = "QuotaReverted"  # Normal: an edit of the quota was set back
RECONCILED = "Reconciled"  # the Ready condition's reason when it is True

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


# -- the intents ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Intent:
    """One write for one TeamSpace (name and uid); `says` is the line printed once it went
    through. `step` orders the writes of a TeamSpace (STEPS); step and op name them in metrics
    and in the reason of a failure (StepOpFailed)."""

    teamspace: str
    uid: str
    says: str
    step: ClassVar[str] = ""
    op: ClassVar[str] = ""

    def __init_subclass__(cls, step: str = "", op: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.step, cls.op = step, op


@dataclass(frozen=True)
class Report(Intent, step="problem", op="report"):
    """A problem no write can fix: logged, and recorded as a Warning Event (Ready False follows
    as a SetStatus of its own)."""

    event: Event


@dataclass(frozen=True)
class AddFinalizer(Intent, step="finalizer", op="add"):
    """Our finalizer on a live TeamSpace. `first`: it has no finalizer list yet, and one is made
    only if there still is none (a list another client adds meanwhile is never replaced);
    otherwise ours is appended to the list as it is when the write arrives."""

    first: bool


@dataclass(frozen=True)
class RemoveDuplicateFinalizer(Intent, step="finalizer", op="dedup"):
    """Ours twice (an old version's passes raced): the copy at `index` goes, if it is still ours
    there (a list changed meanwhile makes the write fail instead of removing another)."""

    index: int


@dataclass(frozen=True)
class Archive(Intent, step="archive", op="write"):
    """The record of a deleting TeamSpace, kept before our finalizer is released."""

    record: dict  # name, uid, pods


@dataclass(frozen=True)
class ReleaseFinalizer(Intent, step="release", op="remove"):
    """Our finalizer off a deleting TeamSpace once its archive record is kept, if it is still at
    `index`."""

    index: int


@dataclass(frozen=True)
class CreateNamespace(Intent, step="namespace", op="create"):
    """team-NAME, labelled for the TeamSpace and controlled by it: the garbage collector deletes
    it after the TeamSpace, nothing here ever does."""

    namespace: dict  # the Namespace as it is to be created


@dataclass(frozen=True)
class RestoreNamespaceOwner(Intent, step="namespace", op="patch"):
    """Our namespace lost or had its ownerReference altered: set to `owner_references`, only if
    it is still at `resource_version` (a namespace changed since the read waits for the next
    pass)."""

    namespace: str
    resource_version: str
    owner_references: list


@dataclass(frozen=True)
class CreateQuota(Intent, step="quota", op="create"):
    """team-quota in the TeamSpace's namespace, with the limits its spec asks for."""

    quota: dict  # the ResourceQuota as it is to be created


@dataclass(frozen=True)
class SetQuota(Intent, step="quota", op="replace"):
    """The quota's limits set to `hard`. First the quota as read (`quota`, with those limits),
    guarded by its resourceVersion; quota admission updates its status on every pod create, and
    a guarded write can lose to that every time, so then the limits alone, guarded by the limits
    as read (`was`: a status update does not touch them, a newer write of the limits does), with
    the ones we do not set removed (`remove`). `event`: a revert of somebody's edit is news."""

    quota: dict
    hard: dict
    was: dict
    remove: tuple
    event: Event | None


@dataclass(frozen=True)
class SetStatus(Intent, step="status", op="replace"):
    """The TeamSpace's status replaced by `teamspace_object`'s. `namespace_created`: the namespace
    is created earlier in the same pass, and its uid, known only then, goes into
    status.namespaceUID."""

    teamspace_object: dict
    namespace_created: bool


def namespace_of(name: str) -> str:
    """The namespace of TeamSpace `name`."""
    return NAMESPACE_PREFIX + name


def teamspace_of(namespace: str) -> str | None:
    """The TeamSpace a namespace is named for, whatever its labels say (the plan judges those);
    None for a namespace not named team-NAME."""
    if namespace.startswith(NAMESPACE_PREFIX) and len(namespace) > len(NAMESPACE_PREFIX):
        return namespace[len(NAMESPACE_PREFIX):]
    return None


def quota_matches(have: dict, hard: dict) -> bool:
    """The quota's limits are exactly the desired ones, compared as the server stores them."""
    if set(have) != set(hard):
        return False
    cpu, stored = quantity(hard["requests.cpu"]), quantity(have["requests.cpu"])
    return (same_quantity(have["pods"], hard["pods"]) and cpu is not None
            and stored == stored_cpu(cpu))


def _short(value: Any) -> str:
    """A value for a message: quoted, at most 64 characters of it."""
    text = json.dumps(value)
    return text if len(text) <= 66 else f"{text[:64]}... ({len(text)} characters)"


def owner_reference(teamspace: dict) -> dict:
    return {"apiVersion": API_VERSION, "kind": "TeamSpace", "name": teamspace["metadata"]["name"],
            "uid": teamspace["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def desired_hard(teamspace: dict) -> dict:
    spec = teamspace.get("spec") or {}
    return {"pods": str(spec.get("pods")), "requests.cpu": spec.get("cpu", DEFAULT_CPU)}


def as_dict(intent: Intent) -> dict:
    """An intent as JSON-ready data, its kind first (what --plan prints)."""
    return {"intent": type(intent).__name__, "step": intent.step, **asdict(intent)}


def _ids(teamspace: dict) -> dict:
    meta = teamspace["metadata"]
    return {"teamspace": meta["name"], "uid": meta.get("uid", "")}


def _finalizer_writes(teamspace: dict) -> list:
    finalizers = teamspace["metadata"].get("finalizers")
    ours = [i for i, f in enumerate(finalizers or []) if f == FINALIZER]
    if len(ours) > 1:
        return [RemoveDuplicateFinalizer(**_ids(teamspace), says="duplicate finalizer removed",
                                         index=ours[-1])]
    if ours:
        return []
    return [AddFinalizer(**_ids(teamspace), says="finalizer added", first=finalizers is None)]


def _deletion_writes(teamspace: dict) -> list:
    """Archive every deleting TeamSpace (ours or not any more), then release our finalizer."""
    meta = teamspace["metadata"]
    record = {"name": meta["name"], "uid": meta.get("uid", ""),
              "pods": (teamspace.get("spec") or {}).get("pods")}
    writes: list = [Archive(**_ids(teamspace), says="archived", record=record)]
    ours = [i for i, f in enumerate(meta.get("finalizers") or []) if f == FINALIZER]
    if ours:
        writes.append(ReleaseFinalizer(**_ids(teamspace), says="finalizer released", index=ours[0]))
    return writes


def _problem(teamspace: dict, namespace: dict | None, quota: dict | None) -> tuple | None:
    """(reason, message) of what no write can fix, or None."""
    name = teamspace["metadata"]["name"]
    ns_name = namespace_of(name)
    spec = teamspace.get("spec") or {}
    pods = spec.get("pods")
    if isinstance(pods, bool) or not isinstance(pods, int) or pods < 0:
        return INVALID_PODS, f"spec.pods {_short(pods)} is not a whole number of pods"
    if len(ns_name) > 63 or not _DNS_LABEL.fullmatch(ns_name):
        return INVALID_NAME, (f"namespace name {_short(ns_name)} is not a valid DNS label (lowercase "
                              "letters, digits, '-'; at most 63); rename the TeamSpace")
    cpu = spec.get("cpu", DEFAULT_CPU)
    value = quantity(cpu)
    if value is None or value < 0:
        return INVALID_CPU, (f"spec.cpu {_short(cpu)} is not a non-negative quantity of at most "
                             f"{MAX_CPU_LENGTH} characters (e.g. \"1\", \"500m\", \"0.5\")")
    if namespace is None:
        return None
    ns_meta = namespace["metadata"]
    if ns_meta.get("deletionTimestamp"):
        return NAMESPACE_TERMINATING, f"namespace {ns_name} is terminating; waiting for it to go"
    label = (ns_meta.get("labels") or {}).get(LABEL)
    if label != name:
        return NAMESPACE_NOT_OURS, (f"namespace {ns_name} is labelled for TeamSpace {_short(label)}, "
                                    "not adopting it")
    if not namespace_is_ours(teamspace, namespace):
        others = [r for r in ns_meta.get("ownerReferences") or [] if r.get("controller")]
        uid = teamspace["metadata"].get("uid")
        if others and others[0].get("uid") == uid:
            recorded = (teamspace.get("status") or {}).get("namespaceUID")
            return NAMESPACE_NOT_OURS, (
                f"namespace {ns_name} (uid {ns_meta.get('uid')}) names this TeamSpace as its "
                "controller but is not the one cnpa-op created for it"
                + (f" (that was uid {recorded})" if recorded else "")
                + " and it carries labels or annotations cnpa-op does not set "
                f"({_short(_foreign_metadata(teamspace, namespace))}): its ownerReference may be "
                "copied from this TeamSpace's public uid; not adopting it - delete it and it is "
                "recreated")
        if others:
            o = others[0]
            return NAMESPACE_OWNED_BY_OTHER, (
                f"namespace {ns_name} is controlled by {o.get('kind')}/{o.get('name')} uid "
                f"{o.get('uid')}, not this TeamSpace; waiting for the garbage collector")
        return NAMESPACE_NOT_OURS, (
            f"namespace {ns_name} was not created for this TeamSpace "
            f"(uid {teamspace['metadata'].get('uid')}): "
            "it carries our label but not our ownerReference (made by someone else, or left by an "
            "earlier TeamSpace deleted with --cascade=orphan); not adopting it - delete or rename it")
    if quota is not None and ((quota.get("spec") or {}).get("scopes")
                              or (quota.get("spec") or {}).get("scopeSelector")):
        scopes = {k: v for k, v in quota["spec"].items() if k in ("scopes", "scopeSelector") and v}
        return QUOTA_SCOPED, (f"quota {QUOTA} in {ns_name} has scopes {json.dumps(scopes, sort_keys=True)}, "
                              "which cannot be changed; delete it and it is recreated")
    return None


def namespace_is_ours(teamspace: dict, namespace: dict) -> bool:
    """Created by the controller for this TeamSpace: its uid is the one recorded in status; or,
    until a uid is recorded for it (a pass that created it ended before its status write), it is
    controlled by this TeamSpace's uid and exactly as the controller makes it. A label proves
    nothing, and an ownerReference little: the TeamSpace's uid is public, so anyone who may create
    namespaces can race the controller (or recreate team-NAME after a deletion) with one of their
    own, labelled or annotated to their liking (Pod Security, node selectors)."""
    meta = namespace["metadata"]
    recorded = (teamspace.get("status") or {}).get("namespaceUID")
    if recorded and recorded == meta.get("uid"):
        return True
    uid = teamspace["metadata"].get("uid")
    controlled = any(r.get("controller") and r.get("uid") == uid
                     for r in meta.get("ownerReferences") or [])
    return controlled and not _foreign_metadata(teamspace, namespace)


def _foreign_metadata(teamspace: dict, namespace: dict) -> dict:
    """The labels and annotations of a namespace that the controller does not set."""
    meta = namespace["metadata"]
    ours = {LABEL: teamspace["metadata"]["name"], "kubernetes.io/metadata.name": meta.get("name")}
    foreign = {k: v for k, v in (meta.get("labels") or {}).items() if ours.get(k) != v}
    foreign.update(meta.get("annotations") or {})
    return foreign


def _ready(teamspace: dict, ok: bool, reason: str, message: str, now: str) -> dict:
    generation = teamspace["metadata"].get("generation")
    old = ready_condition(teamspace)
    status = "True" if ok else "False"
    since = old.get("lastTransitionTime") if old and old.get("status") == status else now
    return {"type": "Ready", "status": status, "reason": reason, "message": message,
            "observedGeneration": generation, "lastTransitionTime": since}


def ready_condition(teamspace: dict) -> dict:
    for c in (teamspace.get("status") or {}).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == "Ready":
            return c
    return {}


def _status_write(teamspace: dict, status: dict, says: str, *, namespace_created: bool = False) -> list:
    """Replace the status (subresource) if it differs; lastTransitionTime alone is no difference."""
    old = teamspace.get("status") or {}

    def comparable(s: dict) -> dict:
        s = dict(s)
        s["conditions"] = [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                           for c in s.get("conditions") or [] if isinstance(c, dict)]
        return s

    if comparable(old) == comparable(status) and not namespace_created:
        return []
    obj = {k: v for k, v in teamspace.items() if k != "status"}
    obj["metadata"] = {k: v for k, v in teamspace["metadata"].items() if k != "managedFields"}
    obj["status"] = status
    return [SetStatus(**_ids(teamspace), says=says, teamspace_object=obj,
                      namespace_created=namespace_created)]


def _other_conditions(teamspace: dict) -> list:
    """The status's conditions other than Ready (kept as they are)."""
    return [c for c in (teamspace.get("status") or {}).get("conditions") or []
            if isinstance(c, dict) and c.get("type") != "Ready"]


def _not_ready(teamspace: dict, reason: str, message: str, now: str) -> list:
    """The status write (if it changes anything) that says Ready False for this reason."""
    status = dict(teamspace.get("status") or {})
    status["conditions"] = [*_other_conditions(teamspace), _ready(teamspace, False, reason, message, now)]
    return _status_write(teamspace, status, f"status written (Ready False, {reason})")


def _reported(teamspace: dict, reason: str, message: str, now: str) -> list:
    """A problem no write can fix: logged and recorded as a Warning Event, and Ready False."""
    return [Report(**_ids(teamspace), says=message, event=Event("Warning", reason, message)),
            *_not_ready(teamspace, reason, message, now)]


def failed_status(teamspace: dict, reason: str, message: str, now: str) -> list:
    """After a write failed for a reason the TeamSpace's owner should see: Ready False."""
    return _not_ready(teamspace, reason, message[:1024], now)


def utc_now() -> str:
    """The `now` the plan takes: the time written into conditions and Events (UTC, seconds)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def plan(teamspace: dict, namespace: dict | None, quota: dict | None, now: str) -> list:
    """The writes that bring one TeamSpace's namespace, quota and status to the desired state."""
    meta = teamspace["metadata"]
    if meta.get("deletionTimestamp"):
        return _deletion_writes(teamspace)
    name = meta["name"]
    ns_name = namespace_of(name)
    # Our finalizer first and on every live TeamSpace, valid or not: its deletion must wait for
    # the archive record whatever else is wrong with it.
    writes = _finalizer_writes(teamspace)
    problem = _problem(teamspace, namespace, quota)
    if problem is not None and problem[0] != QUOTA_SCOPED:
        return writes + _reported(teamspace, *problem, now)

    if namespace is None:
        writes.append(CreateNamespace(
            **_ids(teamspace), says=f"namespace {ns_name} created",
            namespace={"apiVersion": "v1", "kind": "Namespace",
                       "metadata": {"name": ns_name, "labels": {LABEL: name},
                                    "ownerReferences": [owner_reference(teamspace)]}}))
    else:
        owners = namespace["metadata"].get("ownerReferences") or []
        if owner_reference(teamspace) not in owners:
            # Ours (namespace_is_ours) but the reference is missing or altered: restore it,
            # keep other owners that are not controllers.
            keep = [r for r in owners if not r.get("controller") and r.get("uid") != meta["uid"]]
            writes.append(RestoreNamespaceOwner(
                **_ids(teamspace), says=f"namespace {ns_name} ownerReference restored",
                namespace=ns_name, resource_version=namespace["metadata"].get("resourceVersion"),
                owner_references=[*keep, owner_reference(teamspace)]))

    hard = desired_hard(teamspace)
    if problem is not None:  # a scoped quota: immutable, and the controller may not delete
        return writes + _reported(teamspace, *problem, now)
    if quota is None:
        writes.append(CreateQuota(
            **_ids(teamspace), says=f"quota {QUOTA} created {json.dumps(hard, separators=(',', ':'))}",
            quota={"apiVersion": "v1", "kind": "ResourceQuota",
                   "metadata": {"name": QUOTA, "namespace": ns_name, "labels": {LABEL: name}},
                   "spec": {"hard": hard}}))
    else:
        have = (quota.get("spec") or {}).get("hard") or {}
        if not quota_matches(have, hard):
            body = {k: v for k, v in quota.items() if k != "status"}
            body["metadata"] = {k: v for k, v in quota["metadata"].items() if k != "managedFields"}
            body["spec"] = {**(quota.get("spec") or {}), "hard": hard}
            # With the spec as last reconciled, a difference is an edit of the quota: a revert.
            revert = (teamspace.get("status") or {}).get("observedGeneration") == meta.get("generation")
            shown = json.dumps(hard, separators=(",", ":"))
            was = json.dumps(have, separators=(",", ":"), sort_keys=True)
            if revert:
                says = f"quota {QUOTA} set back to {shown} (was {was})"
                event = Event("Normal", QUOTA_REVERTED,
                              f"quota {QUOTA} in {ns_name} was {was}; set back to {shown}")
            else:
                says = f"quota {QUOTA} set to {shown} (generation {meta.get('generation')})"
                event = None
            writes.append(SetQuota(
                **_ids(teamspace), says=says, event=event,
                quota={"apiVersion": "v1", "kind": "ResourceQuota", **body}, hard=hard,
                was=dict(have), remove=tuple(k for k in have if k not in hard)))

    # Status last: it is reached only when every write above succeeded, so observedGeneration
    # never claims a generation whose namespace and quota are not in place.
    status = {**(teamspace.get("status") or {}), "observedGeneration": meta.get("generation"),
              "namespace": ns_name}
    if namespace is not None:
        status["namespaceUID"] = namespace["metadata"].get("uid")
    matched = f"namespace {ns_name} and quota {QUOTA} match the spec"
    status["conditions"] = [*_other_conditions(teamspace), _ready(teamspace, True, RECONCILED, matched, now)]
    return writes + _status_write(
        teamspace, status, f"status written (observedGeneration {meta.get('generation')}, Ready True)",
        namespace_created=namespace is None)
