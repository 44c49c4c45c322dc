"""The caches' slim records (cnpa_controller/records.py) hold every field plan.plan reads.

The plan runs on objects as the API server sends them, wrapped so that every field it reads (by
key, or a test of a key's presence) is noted; each noted field must be in the slim record with the
same value, or absent from both. A plan that starts to read a field the records drop fails here,
whatever the objects' values. And on every sample the plan of the records is the plan of the
whole objects, but for the bodies the executor sends (smaller by what the API server ignores or
the record keeps whole).
"""

from __future__ import annotations

import copy

import pytest

from cnpa_controller import plan, records

NOW = "2026-01-01T00:00:00Z"
FIN = plan.FINALIZER
MISSING = object()


class Probe(dict):
    """A dict that notes the path of every key read from it (and from what it holds)."""

    def __init__(self, data: dict, path: tuple, seen: set) -> None:
        super().__init__(data)
        self._path, self._seen = path, seen

    def _wrap(self, key, value):
        return probe(value, (*self._path, key), self._seen)

    def __getitem__(self, key):
        self._seen.add((*self._path, key))
        return self._wrap(key, super().__getitem__(key))

    def get(self, key, default=None):
        self._seen.add((*self._path, key))
        return self._wrap(key, super().get(key, default))

    def __contains__(self, key) -> bool:
        self._seen.add((*self._path, key))
        return super().__contains__(key)

    def items(self):
        # Iterating reads the whole of it (a label and annotation check), noted as path + "*";
        # but see BODY_COPIES.
        self._seen.add((*self._path, "*"))
        return [(k, self._wrap(k, v)) for k, v in super().items()]

    def values(self):
        return [v for _k, v in self.items()]


def probe(value, path: tuple, seen: set):
    if isinstance(value, dict) and not isinstance(value, Probe):
        return Probe(value, path, seen)
    if isinstance(value, list):
        return [probe(v, (*path, "[]"), seen) for v in value]
    return value


def at(obj, path: tuple):
    """The values at path (lists stand for each of their elements), MISSING where absent."""
    found = [obj]
    for key in path:
        step = []
        for o in found:
            if key == "[]":
                step += o if isinstance(o, list) else [MISSING]
            elif isinstance(o, dict):
                step.append(o.get(key, MISSING))
            else:
                step.append(MISSING)
        found = step
    return found


MANAGED = [{"manager": "kubectl-client-side-apply", "operation": "Update",
            "apiVersion": "v1", "time": NOW, "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:x": {}}}}}]


def full_teamspace(name="a", uid="u-1", pods=3, cpu="1", status=None, **meta) -> dict:
    """A TeamSpace as kubectl apply leaves it: every metadata field the server writes."""
    m = {"name": name, "uid": uid, "generation": 2, "resourceVersion": "70",
         "creationTimestamp": NOW, "labels": {"team": "x"},
         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}" * 40},
         "managedFields": MANAGED, **meta}
    t = {"apiVersion": plan.API_VERSION, "kind": "TeamSpace", "metadata": m,
         "spec": {"pods": pods, "cpu": cpu}}
    if status is not None:
        t["status"] = status
    return t


def full_namespace(t: dict, **meta) -> dict:
    name = f"team-{t['metadata']['name']}"
    m = {"name": name, "uid": "ns-1", "resourceVersion": "71", "creationTimestamp": NOW,
         "labels": {plan.LABEL: t["metadata"]["name"], "kubernetes.io/metadata.name": name},
         "ownerReferences": [plan.owner_reference(t)], "managedFields": MANAGED, **meta}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": m,
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}


def full_quota(t: dict, hard: dict | None = None, **spec) -> dict:
    ns = f"team-{t['metadata']['name']}"
    return {"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": "team-quota", "namespace": ns, "uid": "q-1",
                         "resourceVersion": "72", "creationTimestamp": NOW,
                         "labels": {plan.LABEL: t["metadata"]["name"]},
                         "annotations": {"note": "kept by a PUT"}, "managedFields": MANAGED},
            "spec": {"hard": hard or {"pods": "3", "requests.cpu": "1"}, **spec},
            "status": {"hard": {"pods": "3"}, "used": {"pods": "1"}}}


def samples() -> list[tuple[dict, dict | None, dict | None]]:
    """States that take the plan down each of its branches."""
    out = []
    fresh = full_teamspace()
    out.append((fresh, None, None))                                           # all to create
    t = full_teamspace(finalizers=[FIN], status={"observedGeneration": 2, "namespace": "team-a",
                                                 "namespaceUID": "ns-1"})
    out.append((t, full_namespace(t), full_quota(t)))                          # converged
    out.append((t, full_namespace(t), full_quota(t, {"pods": "99", "requests.cpu": "1",
                                                     "secrets": "2"})))        # drift
    out.append((t, full_namespace(t, ownerReferences=[]), None))               # owner lost
    out.append((t, full_namespace(t, annotations={"x": "y"}, ownerReferences=[]), None))
    out.append((full_teamspace(finalizers=[FIN]), full_namespace(t, uid="ns-2",
                annotations={"scheduler.alpha.kubernetes.io/node-selector": "x"}), None))
    out.append((t, full_namespace(t, labels={plan.LABEL: "other"}), None))     # not ours
    out.append((t, full_namespace(t, deletionTimestamp=NOW), None))           # terminating
    other = {**plan.owner_reference(t), "uid": "someone", "name": "z"}
    out.append((t, full_namespace(t, ownerReferences=[other]), None))          # owned by other
    out.append((t, full_namespace(t), full_quota(t, scopes=["BestEffort"])))   # scoped quota
    out.append((full_teamspace(finalizers=[FIN, "x", FIN]), None, None))       # duplicate
    out.append((full_teamspace(finalizers=["x", FIN], deletionTimestamp=NOW), None, None))
    out.append((full_teamspace(pods="3"), None, None))                         # invalid pods
    out.append((full_teamspace(cpu="lots"), None, None))                       # invalid cpu
    out.append((full_teamspace(name="A_b"), None, None))                       # invalid name
    ready = copy.deepcopy(t)
    ready["status"]["conditions"] = [{"type": "Ready", "status": "True", "reason": "Reconciled",
                                      "message": "m", "observedGeneration": 1,
                                      "lastTransitionTime": NOW},
                                     {"type": "Other", "status": "True"}]
    out.append((ready, full_namespace(ready), full_quota(ready)))              # generation moved
    return out


# The plan iterates over these to build the bodies the executor sends back (a status replace, a
# quota replace), not to decide anything: what those bodies must keep is tested on its own below.
BODY_COPIES = {("teamspace", "*"), ("teamspace", "metadata", "*"), ("quota", "*"),
               ("quota", "metadata", "*")}


@pytest.mark.parametrize("state", samples(), ids=range(len(samples())))
def test_every_field_the_plan_reads_is_in_the_record(state):
    seen: set = set()
    names = ("teamspace", "namespace", "quota")
    wrapped = [probe(o, (n,), seen) if o is not None else None for n, o in zip(names, state)]
    plan.plan(*wrapped, NOW)
    whole = dict(zip(names, state))
    slim = {n: records.record_of(o) if o is not None else None for n, o in whole.items()}
    read = sorted(seen - BODY_COPIES, key=str)
    assert read, "nothing noted: the probe does not see the plan's reads"
    for path in read:
        name, rest = path[0], path[1:]
        if whole[name] is None:
            continue
        what = f"the plan reads {'.'.join(map(str, path))}, which the slim record drops"
        if rest[-1:] == ("*",):   # iterated: all of it
            assert at(slim[name], rest[:-1]) == at(whole[name], rest[:-1]), what
            continue
        have, want = at(slim[name], rest), at(whole[name], rest)
        # A mapping read by key is read further down (noted there): here only that it is there.
        assert [v if not isinstance(v, dict) else {} for v in have] == \
            [v if not isinstance(v, dict) else {} for v in want], what


def _decisions(intents: list) -> list:
    """The plan's intents without the bodies sent back whole (they differ by design)."""
    out = []
    for i in intents:
        d = plan.as_dict(i)
        d.pop("teamspace_object", None)
        d.pop("quota", None)
        out.append(d)
    return out


@pytest.mark.parametrize("state", samples(), ids=range(len(samples())))
def test_the_plan_of_the_records_is_the_plan_of_the_objects(state):
    slim = [records.record_of(o) if o is not None else None for o in state]
    assert _decisions(plan.plan(*slim, NOW)) == _decisions(plan.plan(*state, NOW))


def test_the_bodies_sent_back_keep_what_the_server_would_otherwise_lose():
    """A quota is replaced whole from its record: somebody's label or annotation must survive;
    a TeamSpace's status replace needs its name, uid and resourceVersion (the rest is ignored by
    the status subresource)."""
    t = full_teamspace(finalizers=[FIN], status={"observedGeneration": 1})
    ns = full_namespace(t)
    q = full_quota(t, {"pods": "99", "requests.cpu": "1"})
    intents = plan.plan(records.record_of(t), records.record_of(ns), records.record_of(q), NOW)
    [set_quota] = [i for i in intents if isinstance(i, plan.SetQuota)]
    assert set_quota.quota["metadata"]["annotations"] == {"note": "kept by a PUT"}
    assert set_quota.quota["metadata"]["labels"] == q["metadata"]["labels"]
    assert "managedFields" not in set_quota.quota["metadata"] and "status" not in set_quota.quota
    [status] = [i for i in intents if isinstance(i, plan.SetStatus)]
    body = status.teamspace_object
    assert {k: body["metadata"][k] for k in ("name", "uid", "resourceVersion")} == \
        {"name": "a", "uid": "u-1", "resourceVersion": "70"}
    assert (body["apiVersion"], body["kind"]) == (plan.API_VERSION, "TeamSpace")


def test_records_leave_out_what_costs_memory():
    t = full_teamspace(finalizers=[FIN])
    for obj in (t, full_namespace(t), full_quota(t)):
        slim = records.record_of(obj)
        assert "managedFields" not in slim["metadata"], obj["kind"]
        assert "creationTimestamp" not in slim["metadata"] or obj["kind"] == "ResourceQuota"
    assert "annotations" not in records.record_of(t)["metadata"]
    assert "status" not in records.record_of(full_quota(t))
    assert "spec" not in records.record_of(full_namespace(t))
