"""What the caches keep of each object: the record plan.plan reads, and nothing else.

An object as the API server sends it carries far more than the plan reads: managedFields (often
half its size), the annotations kubectl apply leaves, a quota's status that moves with every pod.
With thousands of TeamSpaces, three caches of whole objects cost about 34 KiB per TeamSpace
(the benchmark's figures). Each cache therefore keeps a slim record instead, as client-go's informers
do with SetTransform: a dict of the same shape (the plan, its input type and its tests are
unchanged), with only
- the fields plan.plan reads (a unit test fails when it reads one a record drops),
- the resourceVersion and uid the executor's guarded writes carry,
- for a quota, all it has but managedFields and status: the executor replaces a quota with a PUT
  of its record (guarded by its resourceVersion), and a PUT without somebody's label or
  annotation would remove it;
- for a TeamSpace, what its status replace sends: the API server takes only the status from a
  replace of the status subresource, so its record needs no labels or annotations.
Each record is a fresh copy whose short strings are interned (sys.intern): the keys, the kinds,
"True", "Ready", a quota's "pods" and the like are then one object shared by every record, not
one copy per decoded event (about a fifth of a record's memory; the benchmark's cache_memory).
"""

from __future__ import annotations

import sys
from typing import Any

# Strings up to this long are interned (names and uids are shorter; long messages are not).
SHARED_UP_TO = 64

# metadata fields kept, by kind; every kind keeps its apiVersion and kind.
TEAMSPACE_METADATA = ("name", "uid", "resourceVersion", "generation", "deletionTimestamp",
                      "finalizers")
NAMESPACE_METADATA = ("name", "uid", "resourceVersion", "deletionTimestamp", "labels",
                      "annotations", "ownerReferences")


def _pick(d: dict, keys: tuple) -> dict:
    return {k: d[k] for k in keys if k in d}


def teamspace(obj: dict) -> dict:
    record = _pick(obj, ("apiVersion", "kind", "spec", "status"))
    record["metadata"] = _pick(obj.get("metadata") or {}, TEAMSPACE_METADATA)
    return record


def namespace(obj: dict) -> dict:
    record = _pick(obj, ("apiVersion", "kind"))
    record["metadata"] = _pick(obj.get("metadata") or {}, NAMESPACE_METADATA)
    return record


def quota(obj: dict) -> dict:
    record = {k: v for k, v in obj.items() if k != "status"}
    record["metadata"] = {k: v for k, v in (obj.get("metadata") or {}).items()
                          if k != "managedFields"}
    return record


BY_KIND = {"TeamSpace": teamspace, "Namespace": namespace, "ResourceQuota": quota}


def _compact(value: Any) -> Any:
    if isinstance(value, str):
        return sys.intern(value) if len(value) <= SHARED_UP_TO else value
    if isinstance(value, dict):
        return {sys.intern(k) if isinstance(k, str) else k: _compact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_compact(v) for v in value]
    return value


def record_of(obj: dict) -> dict:
    """The slim record of an object the caches hold (an object of another kind as it is)."""
    slim: Any = BY_KIND.get(obj.get("kind"))
    return _compact(slim(obj)) if slim is not None else obj
