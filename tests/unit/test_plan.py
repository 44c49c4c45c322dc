"""plan: the pure decision of what to write, called directly (no API server, no files): typed
intents, in the spec's nouns."""

from __future__ import annotations

from fractions import Fraction

import pytest

import fixtures
from cnpa_controller import plan as p

NOW = "2026-12-03T00:00:00Z"


@pytest.mark.parametrize("text,value", [
    ("1", 1), ("500m", Fraction(1, 2)), ("0.5", Fraction(1, 2)), ("500u", Fraction(5, 10**4)),
    ("100n", Fraction(1, 10**7)), ("5e-1", Fraction(1, 2)), ("1.5e0", Fraction(3, 2)),
    ("1500e-3", Fraction(3, 2)), ("2Ki", 2048), ("1E", 10**18), ("1e3", 1000), (".5", Fraction(1, 2)),
    ("5.", 5), ("+1", 1), ("-1", -1), (3, 3)])
def test_quantity_values(text, value):
    assert p.quantity(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1e", "1Ki5", "1 ", "e3", "1.2.3", "0x10", "1mi",
                                  "1e999", "1" * 65, None, True, 1.5, ["1"]])
def test_not_quantities(text):
    assert p.quantity(text) is None


def ts(name="a", uid="u", gen=1, finalizers=(p.FINALIZER,), status=None, cpu="1"):
    t = fixtures.teamspace(name, 4, cpu, uid=uid, generation=gen, resourceVersion="5",
                           finalizers=list(finalizers))
    if status is not None:
        t["status"] = status
    return t


def ns(name="a", uid="ns-uid", owner_uid="u", **labels):
    refs = [] if owner_uid is None else [{**p.owner_reference(ts(name, owner_uid))}]
    return {"metadata": {"name": f"team-{name}", "uid": uid, "resourceVersion": "2",
                         "labels": {p.LABEL: name, **labels}, "ownerReferences": refs}}


def quota(name="a", **hard):
    return {"metadata": {"name": p.QUOTA, "namespace": f"team-{name}"},
            "spec": {"hard": hard or {"pods": "4", "requests.cpu": "1"}}}


def converged_status():
    ready = {"type": "Ready", "status": "True", "reason": p.RECONCILED,
             "message": "namespace team-a and quota team-quota match the spec",
             "observedGeneration": 1, "lastTransitionTime": "2026-01-01T00:00:00Z"}
    return {"observedGeneration": 1, "namespace": "team-a", "namespaceUID": "ns-uid",
            "conditions": [ready]}


def test_converged_plans_nothing():
    assert p.plan(ts(status=converged_status()), ns(), quota(), NOW) == []


def test_a_namespace_recorded_in_status_is_ours_even_without_the_reference():
    plan = p.plan(ts(status=converged_status()), ns(owner_uid=None), quota(), NOW)
    assert [type(w) for w in plan] == [p.RestoreNamespaceOwner]
    assert plan[0].owner_references == [p.owner_reference(ts())]
    assert plan[0].resource_version == "2"


def test_a_labelled_namespace_without_our_reference_or_record_is_not_ours():
    plan = p.plan(ts(), ns(owner_uid=None), quota(), NOW)
    assert [type(w) for w in plan] == [p.Report, p.SetStatus]
    assert plan[0].event.reason == p.NAMESPACE_NOT_OURS
    assert plan[1].teamspace_object["status"]["conditions"][0]["status"] == "False"


def test_ready_transition_time_moves_only_when_ready_changes():
    st = converged_status()
    st["observedGeneration"] = 0
    [w] = p.plan(ts(status=st), ns(), quota(), NOW)
    assert w.teamspace_object["status"]["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    [_, w] = p.plan(ts(status=converged_status(), cpu="abc"), ns(), quota(), NOW)
    assert w.teamspace_object["status"]["conditions"][0]["lastTransitionTime"] == NOW


def test_deletion_is_archived_whoever_holds_it():
    t = ts(finalizers=["example.com/x"])
    t["metadata"]["deletionTimestamp"] = NOW
    assert p.plan(t, None, None, NOW) == [
        p.Archive("a", "u", "archived", record={"name": "a", "uid": "u", "pods": 4})]
    t["metadata"]["finalizers"].append(p.FINALIZER)
    assert [type(w) for w in p.plan(t, None, None, NOW)] == [p.Archive, p.ReleaseFinalizer]
    assert p.plan(t, None, None, NOW)[1].index == 1


def test_quota_drift_is_a_guarded_replace_with_an_unguarded_patch_to_fall_back_on():
    drifted = quota(pods="9", secrets="1", **{"requests.cpu": "1"})
    drifted["metadata"]["resourceVersion"] = "7"
    [w] = p.plan(ts(status=converged_status()), ns(), drifted, NOW)
    assert isinstance(w, p.SetQuota) and w.quota["metadata"]["resourceVersion"] == "7"
    assert w.quota["spec"] == {"hard": {"pods": "4", "requests.cpu": "1"}}
    assert w.hard == {"pods": "4", "requests.cpu": "1"} and w.remove == ("secrets",)
    assert w.event.reason == p.QUOTA_REVERTED


def test_every_write_names_its_step_and_target():
    for name in "abc":
        for w in p.plan(ts(name=name, finalizers=()), None, None, NOW):
            assert w.step in p.STEPS and w.teamspace == name and w.uid == "u" and w.says
            assert p.as_dict(w)["intent"] == type(w).__name__


@pytest.mark.parametrize("spec,stored", [("0.0005", "1m"), ("500u", "1m"), ("100n", "1m"),
                                         ("1500u", "2m"), ("1.0001", "1001m"), ("5e-1", "500e-3"),
                                         ("1.5e0", "1500e-3"), ("2Ki", "2Ki"), ("1", "1")])
def test_quota_cpu_compares_as_the_server_stores_it(spec, stored):
    # What kube-apiserver 1.36 stored for each value (kubectl create --dry-run=server).
    assert p.quota_matches({"pods": "4", "requests.cpu": stored}, {"pods": "4", "requests.cpu": spec})
    assert not p.quota_matches({"pods": "4", "requests.cpu": "2"}, {"pods": "4", "requests.cpu": spec})


def test_an_unrecorded_namespace_controlled_by_us_and_as_we_make_it_is_ours():
    # Created by a pass that ended before its status write: the next pass adopts it.
    plan = p.plan(ts(), ns(uid="ns-new"), quota(), NOW)
    assert [type(w) for w in plan] == [p.SetStatus]
    assert plan[0].teamspace_object["status"]["namespaceUID"] == "ns-new"


@pytest.mark.parametrize("status", [None, converged_status()])
def test_a_forged_namespace_with_our_reference_and_labels_of_its_own_is_not_ours(status):
    """team-a made by somebody else (first, or after ours was deleted) with an ownerReference
    copied from the TeamSpace's public uid and labels of their own: refused, never adopted."""
    forged = ns(uid="ns-forged", **{"pod-security.kubernetes.io/enforce": "privileged"})
    plan = p.plan(ts(status=status), forged, None, NOW)
    assert [type(w) for w in plan] == [p.Report, p.SetStatus]
    assert plan[0].event.reason == p.NAMESPACE_NOT_OURS
    assert "pod-security.kubernetes.io/enforce" in plan[0].event.message
    annotated = ns(uid="ns-forged")
    annotated["metadata"]["annotations"] = {"scheduler.alpha.kubernetes.io/node-selector": "x=y"}
    assert p.plan(ts(status=status), annotated, None, NOW)[0].event.reason == p.NAMESPACE_NOT_OURS


def test_our_recorded_namespace_may_carry_labels_its_team_added():
    team = ns(**{"pod-security.kubernetes.io/enforce": "restricted"})
    assert p.plan(ts(status=converged_status()), team, quota(), NOW) == []


def test_a_teamspace_and_its_namespace_name_each_other():
    assert p.namespace_of("a-b") == "team-a-b"
    assert p.teamspace_of("team-a-b") == "a-b"
    assert p.teamspace_of(p.namespace_of("x")) == "x"
    assert p.teamspace_of("team-") is None and p.teamspace_of("kube-system") is None
