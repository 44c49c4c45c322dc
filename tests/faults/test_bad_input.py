"""Bad input: rejected by the API where the CRD can say so, otherwise a clear error (journal and
an Event on the TeamSpace), the other TeamSpaces unaffected, converging once the input is fixed."""

from __future__ import annotations

import json
import time

import pytest
from faultlib import TS, crd_without_bounds, wait_for

from fixtures import teamspace


@pytest.mark.parametrize("pods,message", [
    (0, "should be greater than or equal to 1"),
    (51, "should be less than or equal to 50"),
    ("four", "must be of type integer"),
])
def test_pods_out_of_range_or_not_a_number_is_rejected_by_the_api(lab, pods, message):
    manifest = teamspace("badpods", pods)
    # --validate=false: the API server's own answer (the CRD schema), not kubectl's pre-check.
    proc = lab.kubectl("create", "--validate=false", "-f", "-", input_text=json.dumps(manifest),
                       check=False)
    assert proc.returncode != 0
    assert "spec.pods" in proc.stderr and message in proc.stderr, proc.stderr
    assert lab.ts_or_none("badpods") is None


def _event(lab, name, reason):
    return [e for e in lab.events(name) if e["reason"] == reason]


def test_bad_teamspaces_are_reported_others_unaffected_and_fixed_input_converges(lab, report):
    # The CRD now refuses a bad name or cpu; the controller must still cope with objects made
    # before it did (or on a server without CEL): shown with the bounds taken off the live CRD.
    with crd_without_bounds(lab):
        _bad_teamspaces(lab, report)


def _bad_teamspaces(lab, report):
    since = lab.now()
    foreign = {"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": "team-x", "labels": {"owner": "someone-else"}}}
    lab.apply(foreign)
    foreign_rv = lab.get("namespace", "team-x")["metadata"]["resourceVersion"]
    for name, kw in [("bad.dot", {}), ("badcpu", {"cpu": "abc"}), ("x", {}), ("good", {"cpu": "250m"})]:
        lab.teamspace(name, pods=3, **kw)
    lab.wait_converged("good", "alpha")
    expect = {"bad.dot": ("InvalidName", "is not a valid DNS label"),
              "badcpu": ("InvalidCPU", 'spec.cpu "abc" is not a non-negative quantity'),
              "x": ("NamespaceNotOurs", "not managed by cnpa-op")}
    for name, (reason, text) in expect.items():
        [ev] = wait_for(lambda n=name, r=reason: _event(lab, n, r), timeout=30,
                        what=f"{reason} Event on {name}")
        assert ev["type"] == "Warning" and text in ev["message"], ev
        assert ev["involvedObject"]["uid"] == lab.get(TS, name)["metadata"]["uid"]
    journal = lab.journal(since)
    for name, (_, text) in expect.items():
        assert f"TeamSpace {name}: " in journal and text in journal
    # Not adopted, not modified; no status claiming what is not in place, Ready False instead.
    assert lab.get("namespace", "team-x")["metadata"]["resourceVersion"] == foreign_rv
    for name, (reason, _) in expect.items():
        status = lab.get(TS, name)["status"]
        assert "observedGeneration" not in status
        assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == \
            [("Ready", "False", reason)]
    # The errors persist pass after pass, but each is recorded once (bounded Events).
    time.sleep(7)
    for name, (reason, _) in expect.items():
        assert len(_event(lab, name, reason)) == 1
    assert lab.sh("systemctl is-active cnpa-op").stdout.strip() == "active"

    # Fix the input: every one of them converges.
    t0 = time.monotonic()
    lab.delete(TS, "bad.dot")
    lab.kubectl("patch", TS, "badcpu", "--type", "merge", "-p", '{"spec":{"cpu":"500m"}}')
    lab.delete("namespace", "team-x")
    lab.wait_gone(TS, "bad.dot")
    lab.wait_converged("badcpu", "x", "good", "alpha", timeout=120)
    report["bad_input_fixed_to_converged_s"] = round(time.monotonic() - t0, 1)
    assert lab.get("namespace", "team-x")["metadata"]["ownerReferences"][0]["uid"] == \
        lab.get(TS, "x")["metadata"]["uid"]

    # Converged: the running controller's passes write nothing at all (no Events either).
    settle = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() + 4))
    time.sleep(14)  # the first 4 s let passes in flight finish; then >= 3 passes
    assert lab.controller_writes(settle) == []
    for name in ("badcpu", "x", "good"):
        lab.delete(TS, name)
    for name in ("badcpu", "x", "good"):
        lab.wait_gone(TS, name)


def test_junk_quota_is_set_back_and_the_revert_is_recorded(lab, report):
    since = lab.now()
    lab.kubectl("patch", "resourcequota", "team-quota", "-n", "team-alpha", "--type", "merge", "-p",
                json.dumps({"spec": {"hard": {"pods": "1000", "requests.memory": "1Ti"}}}))
    t0 = time.monotonic()
    lab.wait_converged("alpha", timeout=60)
    report["junk_quota_reverted_s"] = round(time.monotonic() - t0, 1)
    wait_for(lambda: "teamspace alpha: quota team-quota set back to" in lab.journal(since),
             timeout=15, what="the revert in the journal")
    evs = wait_for(lambda: _event(lab, "alpha", "QuotaReverted"), timeout=15, what="QuotaReverted Event")
    assert any("1Ti" in e["message"] for e in evs)


def test_quota_recreated_with_scopes_is_reported_until_deleted(lab, report):
    # Scopes are immutable: the controller cannot patch them away and may not delete; it says so.
    quota = lab.get("resourcequota", "team-quota", "-n", "team-alpha")
    lab.kubectl("delete", "resourcequota", "team-quota", "-n", "team-alpha")
    lab.apply({"apiVersion": "v1", "kind": "ResourceQuota",
               "metadata": {"name": "team-quota", "namespace": "team-alpha"},
               "spec": {"hard": {"pods": "1000"}, "scopes": ["NotBestEffort"]}})
    [ev] = wait_for(lambda: _event(lab, "alpha", "QuotaScoped"), timeout=30, what="QuotaScoped Event")
    assert "delete it and it is recreated" in ev["message"]
    assert not lab.converged("alpha")
    t0 = time.monotonic()
    lab.kubectl("delete", "resourcequota", "team-quota", "-n", "team-alpha")
    lab.wait_converged("alpha", timeout=60)
    report["scoped_quota_deleted_to_converged_s"] = round(time.monotonic() - t0, 1)
    assert lab.get("resourcequota", "team-quota", "-n", "team-alpha")["metadata"]["uid"] != \
        quota["metadata"]["uid"]
