"""The controller's identity can do its job and nothing more; its unit is sandboxed."""

from __future__ import annotations

import re
import time

from faultlib import SA_KUBECONFIG, SA_USER, TS, wait_for


def can_i(lab, *args: str) -> bool:
    proc = lab.kubectl("--kubeconfig", SA_KUBECONFIG, "auth", "can-i", *args, check=False)
    return proc.stdout.strip() == "yes"


def test_service_uses_its_own_serviceaccount(lab):
    env = lab.service("Environment")
    assert f"KUBECONFIG={SA_KUBECONFIG}" in env
    assert lab.sh(f"stat -c %a {SA_KUBECONFIG}").stdout.strip() == "600"
    who = lab.kubectl("--kubeconfig", SA_KUBECONFIG, "auth", "can-i", "--list").stdout
    assert "teamspaces.platform.labhub.io" in who
    # The controller's writes are made as the ServiceAccount, not as the admin.
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 2))
    lab.kubectl("patch", TS, "alpha", "--type", "merge", "-p", '{"spec":{"pods":5}}')
    lab.wait_converged("alpha")
    writes = wait_for(lambda: lab.controller_writes(since), timeout=30, what="controller writes")
    assert {w["user"]["username"] for w in writes} == {SA_USER}
    lab.kubectl("patch", TS, "alpha", "--type", "merge", "-p", '{"spec":{"pods":4}}')
    lab.wait_converged("alpha")


def test_identity_holds_only_what_the_code_calls(lab):
    status = "--subresource=status"  # (TS/status would name a TeamSpace called "status")
    allowed = [("list", TS), ("patch", TS), ("update", TS, status), ("create", "namespaces"),
               ("patch", "namespaces"), ("list", "resourcequotas", "-A"),
               ("create", "resourcequotas", "-n", "team-alpha"),
               ("update", "resourcequotas", "-n", "team-alpha"), ("create", "events", "-n", "default")]
    denied = [("get", "secrets", "-A"), ("list", "secrets", "-n", "cnpa-system"),
              ("delete", "namespaces"), ("delete", TS), ("create", TS), ("update", TS), ("get", TS),
              ("patch", TS, status), ("patch", "resourcequotas", "-n", "team-alpha"),
              ("delete", "resourcequotas", "-n", "team-alpha"), ("create", "events", "-n", "kube-system"),
              ("create", "pods", "-n", "team-alpha"), ("get", "configmaps", "-n", "kube-system"),
              ("create", "clusterrolebindings"), ("impersonate", "users"), ("*", "*")]
    assert [a for a in allowed if not can_i(lab, *a)] == []
    assert [d for d in denied if can_i(lab, *d)] == []
    # And for real, not only by review: the API server refuses.
    for args in (["get", "secrets", "-A"], ["delete", "namespace", "team-alpha", "--dry-run=server"]):
        proc = lab.kubectl("--kubeconfig", SA_KUBECONFIG, *args, check=False)
        assert proc.returncode != 0 and "forbidden" in proc.stderr.lower(), proc.stderr
    assert lab.exists("namespace", "team-alpha")


def test_unit_is_sandboxed_and_the_job_still_works(lab, report):
    out = lab.sh("systemd-analyze security cnpa-op.service", check=False).stdout
    exposure = float(re.search(r"Overall exposure level for cnpa-op.service: ([0-9.]+)", out)[1])
    report["systemd_analyze_exposure"] = exposure
    assert exposure < 3.0, out
    for prop, value in [("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"),
                        ("PrivateTmp", "yes"), ("CapabilityBoundingSet", "")]:
        assert lab.service(prop) == value, prop
    # Read-only everywhere but the archive: the pass cannot write its own script or /etc.
    pid = lab.service("MainPID")
    probe = lab.sh(f"nsenter -t {pid} -m -- sh -c 'touch /root/cnpa-op/x /etc/x 2>&1; "
                   "touch /root/cnpa-op/archive/.probe && rm /root/cnpa-op/archive/.probe"
                   " && echo archive-ok'", check=False)
    assert probe.stdout.count("Read-only file system") == 2 and "archive-ok" in probe.stdout, probe


def test_variable_switches_back_to_the_admin_kubeconfig(lab):
    lab.playbook("-e", "cnpa_controller_least_privilege=false")
    try:
        assert "KUBECONFIG=/etc/rancher/k3s/k3s.yaml" in lab.service("Environment")
        lab.teamspace("admin-mode", pods=2)
        lab.wait_converged("admin-mode")
    finally:
        lab.playbook()
    assert f"KUBECONFIG={SA_KUBECONFIG}" in lab.service("Environment")
    lab.delete(TS, "admin-mode")
    lab.wait_gone(TS, "admin-mode")
