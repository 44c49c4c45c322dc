"""The benchmark's event-driven peer: the same job as reconcile.sh, built with kopf.

Not part of the project's controller. bench/run.py runs it on the machine (with the bench host's
kubeconfig) as `kopf run --standalone --all-namespaces bench/kopf_peer.py`. It reacts to watch
events instead of polling: TeamSpace created/resumed/spec changed -> namespace, quota, status;
TeamSpace deleted -> archive record, then kopf releases the finalizer (the same one reconcile.sh
uses); a managed quota deleted or edited -> put it back. kopf keeps its own bookkeeping in
annotations of the TeamSpaces (its diff base and progress), which is part of its cost.
"""

from __future__ import annotations

import json
import os
import tempfile

import kopf
import kubernetes
from kubernetes.client.rest import ApiException

GROUP = "platform.labhub.io"
FINALIZER = f"{GROUP}/cleanup"
LABEL = f"{GROUP}/teamspace"
QUOTA = "team-quota"
ARCHIVE_DIR = os.environ.get("CNPA_ARCHIVE_DIR", "/tmp/cnpa-kopf-archive")


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_):
    settings.persistence.finalizer = FINALIZER
    settings.posting.enabled = False  # no Event objects: keep the writes comparable
    kubernetes.config.load_kube_config()


def core() -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api()


def desired_hard(spec) -> dict:
    return {"pods": str(spec["pods"]), "requests.cpu": str(spec.get("cpu", "1"))}


def ensure(name: str, uid: str, spec) -> None:
    """Namespace (owned by the TeamSpace) and quota exactly as the spec says."""
    ns_name = f"team-{name}"
    owner = {"apiVersion": f"{GROUP}/v1alpha1", "kind": "TeamSpace", "name": name, "uid": uid,
             "controller": True, "blockOwnerDeletion": True}
    try:
        core().create_namespace({"metadata": {"name": ns_name, "labels": {LABEL: name},
                                              "ownerReferences": [owner]}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    quota = {"metadata": {"name": QUOTA, "namespace": ns_name, "labels": {LABEL: name}},
             "spec": {"hard": desired_hard(spec)}}
    try:
        core().create_namespaced_resource_quota(ns_name, quota)
    except ApiException as exc:
        if exc.status != 409:
            raise
        core().replace_namespaced_resource_quota(QUOTA, ns_name, quota)


@kopf.on.resume(GROUP, "v1alpha1", "teamspaces")
@kopf.on.create(GROUP, "v1alpha1", "teamspaces")
@kopf.on.update(GROUP, "v1alpha1", "teamspaces", field="spec")
def teamspace(name, uid, meta, spec, patch, **_):
    ensure(name, uid, spec)
    patch.status["observedGeneration"] = meta["generation"]
    patch.status["namespace"] = f"team-{name}"


@kopf.on.delete(GROUP, "v1alpha1", "teamspaces")
def archive(name, uid, spec, **_):
    os.makedirs(ARCHIVE_DIR, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=ARCHIVE_DIR, prefix=f".{name}.")
    with os.fdopen(fd, "w") as fh:
        json.dump({"name": name, "uid": uid, "pods": spec.get("pods")}, fh)
    os.replace(tmp, os.path.join(ARCHIVE_DIR, f"{name}.json"))


@kopf.on.event("", "v1", "resourcequotas", labels={LABEL: kopf.PRESENT})
def quota_event(event, body, **_):
    """A managed quota was deleted or edited: put the TeamSpace's limits back."""
    name = body["metadata"]["labels"][LABEL]
    if body["metadata"]["name"] != QUOTA:
        return
    try:
        ts = kubernetes.client.CustomObjectsApi().get_cluster_custom_object(
            GROUP, "v1alpha1", "teamspaces", name)
    except ApiException as exc:
        if exc.status == 404:
            return
        raise
    if ts["metadata"].get("deletionTimestamp"):
        return
    want = desired_hard(ts["spec"])
    if event["type"] != "DELETED" and _same(body["spec"].get("hard", {}), want):
        return
    ensure(name, ts["metadata"]["uid"], ts["spec"])


def _same(actual: dict, want: dict) -> bool:
    if set(actual) != set(want):
        return False
    return all(_canon(actual[k]) == _canon(want[k]) for k in want)


def _canon(q: str) -> float | None:
    try:
        return float(q[:-1]) / 1000 if q.endswith("m") else float(q)
    except ValueError:
        return None
