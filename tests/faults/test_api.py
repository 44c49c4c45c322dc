"""The TeamSpace API itself: the CRD bounds its input, shows its state, and who may use it."""

from __future__ import annotations

import json

import pytest
from faultlib import GROUP, TS, crd_without_bounds, wait_for

from fixtures import teamspace

VERSION = f"{GROUP}/v1alpha1"


def manifest(name: str, **spec) -> str:
    t = teamspace(name, 2)
    t["spec"].update(spec)
    return json.dumps(t)


def server_says(lab, name: str, **spec):
    """The API server's answer to creating this TeamSpace (dry run: nothing is stored)."""
    # --validate=false: the server's own answer (the CRD), not kubectl's pre-check.
    return lab.kubectl("create", "--dry-run=server", "--validate=false", "-f", "-",
                       input_text=manifest(name, **spec), check=False)


@pytest.mark.parametrize("cpu,why", [
    ("1" * 200 * 1024, "Too long"),     # 200 KiB: more than one argument may hold
    ("abc", "should match"),
    ("-1", "should match"),
    ("1.5.5", "should match"),
    ("5 m", "should match"),
])
def test_cpu_that_is_not_a_nonnegative_quantity_is_rejected(lab, cpu, why):
    proc = server_says(lab, "api-badcpu", cpu=cpu)
    assert proc.returncode != 0, f"accepted spec.cpu {cpu[:20]!r}"
    assert "spec.cpu" in proc.stderr and why in proc.stderr, proc.stderr[:2000]
    assert lab.ts_or_none("api-badcpu") is None


@pytest.mark.parametrize("cpu", ["1", "500m", "0.5", "2k", "500u", "100n", "5e-1", "1.5e0",
                                 "0.0005", "2Ki", "+1"])
def test_cpu_of_the_whole_quantity_grammar_is_accepted(lab, cpu):
    proc = server_says(lab, "api-goodcpu", cpu=cpu)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name", ["bad.dot", "a" * 59])
def test_name_that_cannot_make_a_namespace_is_rejected(lab, name):
    proc = server_says(lab, name)
    assert proc.returncode != 0, f"accepted name {name!r}"
    assert "DNS label of at most 58 characters" in proc.stderr, proc.stderr


def test_name_of_58_characters_is_accepted(lab):
    assert server_says(lab, "a" * 58).returncode == 0


def test_objects_made_before_the_bounds_can_still_be_updated(lab):
    """Ratcheting: the new rules stop new bad input, not the repair of old objects."""
    try:
        # The CRD as an older version of the role made it, then the role's CRD again.
        with crd_without_bounds(lab):
            wait_for(lambda: lab.kubectl("create", "-f", "-", check=False,
                                         input_text=manifest("old.dot", cpu="abc")).returncode == 0,
                     timeout=30, what="the unbounded CRD accepting old.dot")
        wait_for(lambda: server_says(lab, "new.dot").returncode != 0, timeout=30,
                 what="the bounded CRD in effect")
        # Unchanged bad fields do not block another change, and the object can go.
        lab.kubectl("patch", TS, "old.dot", "--type", "merge", "-p", '{"spec":{"pods":3}}')
        assert lab.get(TS, "old.dot")["spec"]["pods"] == 3
        proc = lab.kubectl("patch", TS, "old.dot", "--type", "merge", "-p", '{"spec":{"cpu":"xyz"}}',
                           check=False)
        assert proc.returncode != 0 and "spec.cpu" in proc.stderr, proc.stderr
    finally:
        lab.kubectl("apply", "-f", "/root/cnpa-op/crd.yaml")
        lab.delete(TS, "old.dot")
    lab.wait_gone(TS, "old.dot", timeout=60)


def test_status_keeps_the_conditions_and_namespace_uid(lab):
    """The status schema holds what the controller writes (unknown fields would be pruned)."""
    status = {"status": {"namespaceUID": "0f6c3c1e-0000-4000-8000-000000000001", "conditions": [
        {"type": "Ready", "status": "True", "reason": "Reconciled", "message": "ok",
         "observedGeneration": 1, "lastTransitionTime": "2026-12-03T00:00:00Z"}]}}
    proc = lab.kubectl("patch", TS, "alpha", "--subresource=status", "--type", "merge",
                       "-p", json.dumps(status), "--dry-run=server", "-o", "json")
    got = json.loads(proc.stdout)["status"]
    assert got["namespaceUID"] == status["status"]["namespaceUID"]
    assert got["conditions"] == status["status"]["conditions"]
    bad = {"status": {"conditions": [{"type": "Ready", "status": "True",
                                      "lastTransitionTime": "yesterday"}]}}
    proc = lab.kubectl("patch", TS, "alpha", "--subresource=status", "--type", "merge",
                       "-p", json.dumps(bad), "--dry-run=server", check=False)
    assert proc.returncode != 0 and "lastTransitionTime" in proc.stderr, proc.stderr


def test_kubectl_get_shows_pods_cpu_namespace_ready_and_age(lab):
    lab.wait_converged("alpha")
    out = lab.kubectl("get", TS, "alpha").stdout.splitlines()
    assert out[0].split() == ["NAME", "PODS", "CPU", "NAMESPACE", "READY", "AGE"], out
    alpha = lab.get(TS, "alpha")
    row = out[1].split()
    assert row[:4] == ["alpha", str(alpha["spec"]["pods"]), alpha["spec"]["cpu"], "team-alpha"], out
    ready = [c["status"] for c in alpha.get("status", {}).get("conditions", []) if c["type"] == "Ready"]
    if ready:  # written by the controller (the column is empty until it does)
        assert row[4] == ready[0], out


def _can(lab, user: str, verb: str, *rest: str) -> bool:
    proc = lab.kubectl("auth", "can-i", verb, *rest, "--as", user, check=False)
    return proc.stdout.strip() == "yes"


def test_view_and_edit_roles_cover_teamspaces(lab):
    """The aggregated roles: view may read TeamSpaces; edit (and admin) may also create and change
    them; deleting them takes admin (test_least_privilege.py)."""
    bindings = {"api-viewer": "view", "api-editor": "edit"}
    for user, role in bindings.items():
        lab.kubectl("create", "clusterrolebinding", f"cnpa-test-{user}", f"--clusterrole={role}",
                    f"--user={user}", check=False)
    try:
        wait_for(lambda: _can(lab, "api-viewer", "list", TS) and _can(lab, "api-editor", "create", TS),
                 timeout=30, what="the aggregated roles in view and edit")
        assert _can(lab, "api-viewer", "get", TS) and _can(lab, "api-viewer", "watch", TS)
        assert not _can(lab, "api-viewer", "create", TS)
        assert not _can(lab, "api-viewer", "delete", TS)
        assert not _can(lab, "api-viewer", "update", TS, "--subresource=status")
        for verb in ("get", "list", "create", "patch"):
            assert _can(lab, "api-editor", verb, TS), verb
        assert not _can(lab, "api-editor", "delete", TS)
        assert not _can(lab, "api-editor", "update", TS, "--subresource=status")
        # And for real: the viewer lists, the editor creates (server-side dry run).
        listed = lab.kubectl("get", TS, "--as", "api-viewer", "-o", "name").stdout
        assert f"teamspace.{GROUP}/alpha" in listed
        lab.kubectl("create", "--dry-run=server", "--as", "api-editor", "-f", "-",
                    input_text=manifest("api-by-editor"))
        proc = lab.kubectl("create", "--dry-run=server", "--as", "api-viewer", "-f", "-",
                           input_text=manifest("api-by-viewer"), check=False)
        assert proc.returncode != 0 and "forbidden" in proc.stderr.lower(), proc.stderr
    finally:
        for user in bindings:
            lab.kubectl("delete", "clusterrolebinding", f"cnpa-test-{user}", "--ignore-not-found")
