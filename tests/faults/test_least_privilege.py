"""The controller's identity can do its job and nothing more; its unit is sandboxed."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import time
from contextlib import contextmanager

import yaml
from faultlib import FIN, GROUP, LABEL, SA_KUBECONFIG, SA_USER, TS, wait_for
from hostlib import ROOT

from fixtures import teamspace

TOKEN_FILE = "/etc/cnpa-op/token"
ADMIN_KUBECONFIG = "/etc/rancher/k3s/k3s.yaml"


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
    """The same rules whichever mode is installed (this host runs the loop): the union of what a
    loop pass and the watch controller call, each verb one that some mode's code sends; nothing
    more."""
    status = "--subresource=status"  # (TS/status would name a TeamSpace called "status")
    team, system = ("-n", "team-alpha"), ("-n", "cnpa-system")
    allowed = [("list", TS), ("watch", TS), ("patch", TS), ("update", TS, status),
               ("list", "namespaces"), ("watch", "namespaces"), ("get", "namespaces"),
               ("create", "namespaces"), ("patch", "namespaces"),
               ("list", "resourcequotas", "-A"), ("watch", "resourcequotas", "-A"),
               ("create", "resourcequotas", *team), ("update", "resourcequotas", *team),
               ("patch", "resourcequotas", *team),
               ("create", "events", "-n", "default"), ("get", "events", "-n", "default"),
               ("patch", "events", "-n", "default"),
               # The Lease every writer holds, the leader's Events on it, the archive records.
               ("get", "leases/cnpa-op", *system), ("update", "leases/cnpa-op", *system),
               ("create", "leases", *system), ("create", "events", *system),
               ("create", "configmaps", *system), ("get", "configmaps", *system)]
    denied = [("get", "secrets", "-A"), ("list", "secrets", *system),
              ("update", "namespaces"), ("delete", "namespaces"),
              ("delete", TS), ("create", TS), ("update", TS), ("get", TS), ("patch", TS, status),
              ("get", "resourcequotas", *team), ("delete", "resourcequotas", *team),
              ("create", "events", "-n", "kube-system"), ("patch", "events", "-n", "kube-system"),
              ("list", "events", "-n", "default"), ("delete", "events", "-n", "default"),
              ("get", "leases/other", *system), ("update", "leases/other", *system),
              ("list", "leases", *system), ("watch", "leases", *system),
              ("delete", "leases/cnpa-op", *system), ("get", "leases/cnpa-op", "-n", "kube-system"),
              ("create", "leases", "-n", "kube-system"),
              ("list", "configmaps", *system), ("update", "configmaps", *system),
              ("delete", "configmaps", *system), ("create", "configmaps", "-n", "default"),
              ("get", "events", *system), ("patch", "events", *system),
              ("create", "pods", *team), ("get", "configmaps", "-n", "kube-system"),
              ("create", "serviceaccounts/token", *system),
              ("create", "clusterrolebindings"), ("impersonate", "users"), ("*", "*")]
    assert [a for a in allowed if not can_i(lab, *a)] == []
    assert [d for d in denied if can_i(lab, *d)] == []
    # Exactly these rules, so that nothing beyond the lists above hides in a wildcard or a kind
    # not asked about.
    rules = lab.get("clusterrole", "cnpa-op")["rules"]
    assert sorted((r["apiGroups"][0], r["resources"][0], sorted(r["verbs"])) for r in rules) == [
        ("", "namespaces", ["create", "get", "list", "patch", "watch"]),
        ("", "resourcequotas", ["create", "list", "patch", "update", "watch"]),
        ("platform.labhub.io", "teamspaces", ["list", "patch", "watch"]),
        ("platform.labhub.io", "teamspaces/finalizers", ["update"]),
        ("platform.labhub.io", "teamspaces/status", ["update"])]
    assert all(len(r["apiGroups"]) == len(r["resources"]) == 1 for r in rules), rules
    rules = lab.get("role", "cnpa-op-lease", "-n", "cnpa-system")["rules"]
    assert sorted((r["apiGroups"][0], r["resources"][0], r.get("resourceNames", []), sorted(r["verbs"]))
                  for r in rules) == [
        ("", "configmaps", [], ["create", "get"]), ("", "events", [], ["create"]),
        ("coordination.k8s.io", "leases", [], ["create"]),
        ("coordination.k8s.io", "leases", ["cnpa-op"], ["get", "update"])]
    # And for real, not only by review: the API server refuses.
    for args in (["get", "secrets", "-A"], ["delete", "namespace", "team-alpha", "--dry-run=server"]):
        proc = lab.kubectl("--kubeconfig", SA_KUBECONFIG, *args, check=False)
        assert proc.returncode != 0 and "forbidden" in proc.stderr.lower(), proc.stderr
    assert lab.exists("namespace", "team-alpha")


# -- what the verbs it holds may touch (ValidatingAdmissionPolicy) ----------------------------
def stub(kind: str, name: str, namespace: str | None = None, api: str = "v1") -> str:
    """What `kubectl patch -f -` needs to address an object (as reconcile.sh sends its patches)."""
    meta = {"name": name} | ({"namespace": namespace} if namespace else {})
    return json.dumps({"apiVersion": api, "kind": kind, "metadata": meta})


def as_controller(lab, *args: str, input_text: str | None = None):
    """A write as the controller's ServiceAccount, server-side dry run: admission runs in full,
    nothing is stored (on a host without the policy a real write would delete the victim)."""
    return lab.kubectl("--kubeconfig", SA_KUBECONFIG, *args, "--dry-run=server",
                       input_text=input_text, check=False)


def owner(name: str, uid: str = "00000000-0000-4000-8000-000000000001") -> dict:
    return {"apiVersion": f"{GROUP}/v1alpha1", "kind": "TeamSpace", "name": name, "uid": uid,
            "controller": True, "blockOwnerDeletion": True}


def denied_by_policy(proc) -> bool:
    return proc.returncode != 0 and "ValidatingAdmissionPolicy" in proc.stderr and "denied" in proc.stderr


def test_identity_cannot_delete_or_relabel_namespaces_it_does_not_own(lab):
    lab.kubectl("create", "namespace", "victim", check=False)
    lab.kubectl("create", "namespace", "team-victim", check=False)  # a team- name, not labelled
    attempts = {
        # An ownerReference to an owner that does not exist: the garbage collector would delete it.
        "victim ownerReference": ("victim", {"metadata": {"ownerReferences": [owner("victim")]}}),
        "kube-node-lease ownerReference":
            ("kube-node-lease", {"metadata": {"ownerReferences": [owner("lease")]}}),
        "victim relabelled": ("victim", {"metadata": {"labels": {
            "pod-security.kubernetes.io/enforce": "privileged"}}}),
        "team-victim taken over": ("team-victim", {"metadata": {
            "labels": {LABEL: "victim"}, "ownerReferences": [owner("victim")]}}),
        "team-alpha Pod Security relabelled": ("team-alpha", {"metadata": {"labels": {
            "pod-security.kubernetes.io/enforce": "privileged"}}}),
        "team-alpha annotated": ("team-alpha", {"metadata": {"annotations": {"x": "y"}}}),
        "team-alpha given to another TeamSpace": ("team-alpha", {"metadata": {
            "ownerReferences": [owner("beta")]}}),
    }
    allowed = [name for name, (ns, patch) in attempts.items()
               if not denied_by_policy(as_controller(lab, "patch", "-f", "-", "--type", "merge",
                                                     "-p", json.dumps(patch),
                                                     input_text=stub("Namespace", ns)))]
    assert allowed == []
    evil = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "evil"}}
    assert denied_by_policy(as_controller(lab, "create", "-f", "-", input_text=json.dumps(evil)))
    privileged = {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": "team-newone", "ownerReferences": [owner("newone")],
        "labels": {LABEL: "newone", "pod-security.kubernetes.io/enforce": "privileged"}}}
    assert denied_by_policy(as_controller(lab, "create", "-f", "-", input_text=json.dumps(privileged)))
    # What the controller does is still allowed: a namespace of its own, its ownerReference back.
    ours = {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": "team-newone", "labels": {LABEL: "newone"}, "ownerReferences": [owner("newone")]}}
    proc = as_controller(lab, "create", "-f", "-", input_text=json.dumps(ours))
    assert proc.returncode == 0, proc.stderr
    alpha_uid = lab.get(TS, "alpha")["metadata"]["uid"]
    proc = as_controller(lab, "patch", "-f", "-", "--type", "merge", "-p",
                         json.dumps({"metadata": {"ownerReferences": [owner("alpha", alpha_uid)]}}),
                         input_text=stub("Namespace", "team-alpha"))
    assert proc.returncode == 0, proc.stderr
    # The policy binds the controller only: an admin may still do all of it.
    lab.kubectl("label", "namespace", "victim", "pod-security.kubernetes.io/enforce=baseline",
                "--dry-run=server")
    for ns in ("victim", "kube-node-lease", "team-victim"):
        assert not lab.get("namespace", ns)["metadata"].get("ownerReferences")
    lab.kubectl("delete", "namespace", "victim", "team-victim", "--wait=false")


def test_identity_writes_quotas_only_as_team_quota_in_its_namespaces(lab):
    quota = {"apiVersion": "v1", "kind": "ResourceQuota",
             "metadata": {"name": "team-quota", "namespace": "kube-system"},
             "spec": {"hard": {"pods": "0"}}}
    assert denied_by_policy(as_controller(lab, "create", "-f", "-", input_text=json.dumps(quota)))
    other = quota | {"metadata": {"name": "other", "namespace": "team-alpha"}}
    assert denied_by_policy(as_controller(lab, "create", "-f", "-", input_text=json.dumps(other)))
    # A limit that is not its own, by either of the requests reconcile.sh sets limits back with
    # (a replace guarded by the resourceVersion; a merge patch).
    live = lab.get("resourcequota", "team-quota", "-n", "team-alpha")
    live["metadata"].pop("managedFields", None)
    for hard, allowed in [({"pods": "4", "requests.cpu": "1", "requests.memory": "1Ti"}, False),
                          ({"pods": "4", "requests.cpu": "1"}, True)]:
        proc = as_controller(lab, "replace", "-f", "-",
                             input_text=json.dumps(live | {"spec": {"hard": hard}}))
        assert (proc.returncode == 0) if allowed else denied_by_policy(proc), proc.stderr
        proc = as_controller(lab, "patch", "-f", "-", "--type", "merge",
                             "-p", json.dumps({"spec": {"hard": hard}}),
                             input_text=stub("ResourceQuota", "team-quota", "team-alpha"))
        assert (proc.returncode == 0) if allowed else denied_by_policy(proc), proc.stderr


def test_identity_changes_only_its_finalizer_on_teamspaces(lab):
    ts = stub("TeamSpace", "alpha", api=f"{GROUP}/v1alpha1")
    for kind, patch in [("merge", {"spec": {"pods": 50}}),
                        ("merge", {"metadata": {"labels": {"x": "y"}}}),
                        ("merge", {"metadata": {"ownerReferences": [owner("alpha")]}}),
                        ("json", [{"op": "add", "path": "/metadata/finalizers/-", "value": "evil/hold"}])]:
        proc = as_controller(lab, "patch", "-f", "-", "--type", kind, "-p", json.dumps(patch),
                             input_text=ts)
        assert denied_by_policy(proc), (patch, proc.stderr)
    # Its own finalizer, added and removed: allowed.
    lab.wait_converged("alpha")
    at = lab.get(TS, "alpha")["metadata"]["finalizers"].index(FIN)
    for patch in ([{"op": "add", "path": "/metadata/finalizers/-", "value": FIN}],
                  [{"op": "remove", "path": f"/metadata/finalizers/{at}"}]):
        proc = as_controller(lab, "patch", "-f", "-", "--type", "json", "-p", json.dumps(patch),
                             input_text=ts)
        assert proc.returncode == 0, proc.stderr


# -- what everybody else may do to TeamSpaces, their namespaces and records (issue 22) ---------
def as_user(lab, user: str, *args: str, input_text: str | None = None):
    """A write as another user (the admin impersonating them), server-side dry run."""
    return lab.kubectl(f"--as={user}", *args, "--dry-run=server", input_text=input_text, check=False)


def can(lab, user: str, *args: str) -> bool:
    return lab.kubectl("auth", "can-i", *args, f"--as={user}", check=False).stdout.strip() == "yes"


@contextmanager
def cluster_role_of(lab, user: str, role: str, rules: list[dict] | None = None):
    """user bound cluster-wide to ClusterRole role (made here from rules when given)."""
    name = f"cnpa-test-{user}"
    if rules is not None:
        lab.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                   "metadata": {"name": role}, "rules": rules})
    lab.kubectl("create", "clusterrolebinding", name, f"--clusterrole={role}", f"--user={user}",
                check=False)
    try:
        yield
    finally:
        lab.kubectl("delete", "clusterrolebinding", name, "--ignore-not-found")
        if rules is not None:
            lab.kubectl("delete", "clusterrole", role, "--ignore-not-found")


def strip_finalizer(lab) -> str:
    """A JSON patch that removes our finalizer from alpha (and only it)."""
    at = lab.get(TS, "alpha")["metadata"]["finalizers"].index(FIN)
    return json.dumps([{"op": "test", "path": f"/metadata/finalizers/{at}", "value": FIN},
                       {"op": "remove", "path": f"/metadata/finalizers/{at}"}])


def test_edit_may_change_teamspaces_but_not_delete_them_or_skip_their_archive(lab):
    """Deleting a TeamSpace deletes its namespace with everything in it: the aggregated edit role
    may create and change TeamSpaces, not delete them; admin (cluster-wide) may delete them; only
    the controller (and cluster admins) may remove the cleanup finalizer, so no deletion goes
    unarchived; an ownerReference (whose owner's deletion would delete it) is refused too."""
    lab.wait_converged("alpha")
    with cluster_role_of(lab, "ts-editor", "edit"), cluster_role_of(lab, "ts-admin", "admin"):
        wait_for(lambda: can(lab, "ts-editor", "patch", TS) and can(lab, "ts-admin", "delete", TS),
                 timeout=30, what="the aggregated roles in edit and admin")
        may = {verb: can(lab, "ts-editor", verb, TS)
               for verb in ("get", "list", "watch", "create", "update", "patch", "delete",
                            "deletecollection")}
        assert may == {"get": True, "list": True, "watch": True, "create": True, "update": True,
                       "patch": True, "delete": False, "deletecollection": False}
        assert can(lab, "ts-admin", "deletecollection", TS)
        # For real (dry runs): the editor creates and changes the spec, and cannot delete.
        new = teamspace("by-editor", 2)
        proc = as_user(lab, "ts-editor", "create", "-f", "-", input_text=json.dumps(new))
        assert proc.returncode == 0, proc.stderr
        proc = as_user(lab, "ts-editor", "patch", TS, "alpha", "--type", "merge", "-p", '{"spec":{"pods":7}}')
        assert proc.returncode == 0, proc.stderr
        proc = as_user(lab, "ts-editor", "delete", TS, "alpha")
        assert proc.returncode != 0 and "forbidden" in proc.stderr.lower(), proc.stderr
        proc = as_user(lab, "ts-admin", "delete", TS, "alpha")
        assert proc.returncode == 0, proc.stderr
        # Neither strips the cleanup finalizer, nor gives alpha an owner to be deleted with.
        for user in ("ts-editor", "ts-admin"):
            proc = as_user(lab, user, "patch", TS, "alpha", "--type", "json", "-p", strip_finalizer(lab))
            assert denied_by_policy(proc) and FIN in proc.stderr, (user, proc.stderr)
            proc = as_user(lab, user, "patch", TS, "alpha", "--type", "merge", "-p", json.dumps(
                {"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x",
                                                   "uid": "00000000-0000-4000-8000-000000000002"}]}}))
            assert denied_by_policy(proc), (user, proc.stderr)
    # A cluster admin (system:masters) still may (dry run).
    proc = lab.kubectl("patch", TS, "alpha", "--type", "json", "-p", strip_finalizer(lab), "--dry-run=server",
                       check=False)
    assert proc.returncode == 0, proc.stderr
    assert FIN in lab.get(TS, "alpha")["metadata"]["finalizers"]
    lab.wait_converged("alpha")


def test_only_the_controller_and_admins_may_give_a_namespace_a_teamspace_owner(lab):
    """Whoever may create namespaces must not make team-X (before the controller, or again after
    a deletion) look like TeamSpace X's own: an ownerReference to a TeamSpace is refused on create,
    and on update when added or changed; removing one (the garbage collector does) and changes
    that keep the owners as they are stay allowed. The controller and cluster admins may."""
    alpha_uid = lab.get(TS, "alpha")["metadata"]["uid"]
    forged = {"apiVersion": f"{GROUP}/v1alpha1", "kind": "TeamSpace", "name": "alpha", "uid": alpha_uid}
    rules = [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "create", "update", "patch"]}]
    with cluster_role_of(lab, "ns-maker", "cnpa-test-ns-maker", rules):
        wait_for(lambda: can(lab, "ns-maker", "create", "namespaces"), timeout=30, what="ns-maker's role")
        for ref in (forged | {"controller": True}, forged, forged | {"apiVersion": f"{GROUP}/v1"}):
            ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {
                "name": "team-forged", "labels": {LABEL: "forged"}, "ownerReferences": [ref]}}
            proc = as_user(lab, "ns-maker", "create", "-f", "-", input_text=json.dumps(ns))
            assert denied_by_policy(proc), (ref, proc.stderr)
        lab.kubectl("--as=ns-maker", "create", "namespace", "cnpa-test-plain")
        try:
            owned = {"metadata": {"ownerReferences": [forged | {"controller": True}]}}
            proc = as_user(lab, "ns-maker", "patch", "namespace", "cnpa-test-plain", "--type", "merge",
                           "-p", json.dumps(owned))
            assert denied_by_policy(proc), proc.stderr
        finally:
            lab.kubectl("delete", "namespace", "cnpa-test-plain", "--wait=false")
        # team-alpha is owned by alpha (the controller made it): its owner may not be changed,
        # may be removed, and other changes go through.
        owners = lab.get("namespace", "team-alpha")["metadata"]["ownerReferences"]
        changed = [r | {"controller": False} for r in owners]
        proc = as_user(lab, "ns-maker", "patch", "namespace", "team-alpha", "--type", "merge",
                       "-p", json.dumps({"metadata": {"ownerReferences": changed}}))
        assert denied_by_policy(proc), proc.stderr
        for patch in ({"metadata": {"labels": {"cnpa-test": "x"}}}, {"metadata": {"ownerReferences": None}}):
            proc = as_user(lab, "ns-maker", "patch", "namespace", "team-alpha", "--type", "merge",
                           "-p", json.dumps(patch))
            assert proc.returncode == 0, (patch, proc.stderr)
    # A cluster admin may (dry run).
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": "team-forged", "ownerReferences": [forged | {"controller": True}]}}
    proc = lab.kubectl("create", "-f", "-", "--dry-run=server", input_text=json.dumps(ns), check=False)
    assert proc.returncode == 0, proc.stderr
    lab.wait_converged("alpha")


def test_archive_records_cannot_be_forged(lab):
    """ConfigMaps archive-<uid> (or labelled as a record) in cnpa-system are made by the
    controller only: not even a cluster admin creates one (it may delete one, or the policy);
    other ConfigMaps there are not affected. (Watch mode, where the controller makes them, in
    molecule/controller/verify.yml: the controller's own, and that none can be changed.)"""
    record = {"apiVersion": "v1", "kind": "ConfigMap", "immutable": True, "metadata": {
        "name": "archive-00000000-0000-4000-8000-000000000003", "namespace": "cnpa-system",
        "labels": {"app.kubernetes.io/managed-by": "cnpa-op",
                   "platform.labhub.io/archived-teamspace": "gone"}},
        "data": {"gone.json": '{"name": "gone", "uid": "00000000-0000-4000-8000-000000000003", "pods": 1}\n'}}
    labelled = record | {"metadata": record["metadata"] | {"name": "other-name"}}
    for cm in (record, labelled):
        proc = lab.kubectl("create", "-f", "-", "--dry-run=server", input_text=json.dumps(cm), check=False)
        assert denied_by_policy(proc), proc.stderr
    rules = [{"apiGroups": [""], "resources": ["configmaps"],
              "verbs": ["create", "update", "patch", "delete"]}]
    with cluster_role_of(lab, "cm-writer", "cnpa-test-cm-writer", rules):
        wait_for(lambda: can(lab, "cm-writer", "create", "configmaps", "-n", "cnpa-system"), timeout=30,
                 what="cm-writer's role")
        proc = as_user(lab, "cm-writer", "create", "-f", "-", input_text=json.dumps(record))
        assert denied_by_policy(proc), proc.stderr
        proc = as_user(lab, "cm-writer", "create", "configmap", "notes", "-n", "cnpa-system")
        assert proc.returncode == 0, proc.stderr


# -- its token ---------------------------------------------------------------------------------
def jwt_claims(token: str) -> dict:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def test_token_expires_and_is_renewed(lab):
    kubeconfig = lab.sh(f"cat {SA_KUBECONFIG}").stdout
    assert f"tokenFile: {TOKEN_FILE}" in kubeconfig and "token:" not in kubeconfig
    assert lab.sh(f"stat -c %a {TOKEN_FILE}").stdout.strip() == "600"
    token = lab.sh(f"cat {TOKEN_FILE}").stdout.strip()
    claims = jwt_claims(token)
    now = time.time()
    assert claims["sub"] == SA_USER
    assert now < claims["exp"] <= now + 24 * 3600 + 60, claims
    # No token that never expires: no service-account-token Secret for it.
    secrets = lab.get("secrets", "-n", "cnpa-system")["items"]
    assert [s["metadata"]["name"] for s in secrets
            if s["type"] == "kubernetes.io/service-account-token"] == []
    assert "cnpa-op-token.timer" in lab.sh("systemctl list-timers --no-pager").stdout
    # The timer's unit renews it; the controller goes on with the new one.
    time.sleep(1.1)  # a new iat
    lab.sh("systemctl start cnpa-op-token.service")
    renewed = lab.sh(f"cat {TOKEN_FILE}").stdout.strip()
    assert renewed != token and jwt_claims(renewed)["iat"] > claims["iat"]
    assert lab.sh(f"stat -c %a {TOKEN_FILE}").stdout.strip() == "600"
    assert can_i(lab, "list", TS)
    lab.kubectl("patch", TS, "alpha", "--type", "merge", "-p", '{"spec":{"pods":6}}')
    lab.wait_converged("alpha")
    lab.kubectl("patch", TS, "alpha", "--type", "merge", "-p", '{"spec":{"pods":4}}')
    lab.wait_converged("alpha")


# -- the cluster's CA in its kubeconfig (issue 22, item 10) ------------------------------------
def kubeconfig_ca(text: str) -> str:
    return yaml.safe_load(text)["clusters"][0]["cluster"].get("certificate-authority-data", "")


def test_install_takes_the_cluster_ca_from_the_admin_kubeconfig(lab, report):
    """A controller-manager without the root-CA publisher leaves no kube-system/kube-root-ca.crt:
    the install takes the CA from the admin kubeconfig, and with none there either it fails at
    once, saying what is missing."""
    admin = yaml.safe_load(lab.sh(f"cat {ADMIN_KUBECONFIG}").stdout)
    ca = admin["clusters"][0]["cluster"]["certificate-authority-data"]
    lab.sh("systemctl stop kube-controller-manager")
    try:
        lab.kubectl("delete", "configmap", "kube-root-ca.crt", "-n", "kube-system")
        t0 = time.monotonic()
        lab.playbook()
        report["install_without_root_ca_configmap_s"] = round(time.monotonic() - t0, 1)
        assert kubeconfig_ca(lab.sh(f"cat {SA_KUBECONFIG}").stdout) == ca
        cluster = admin["clusters"][0]["cluster"]
        # Neither: the install stops before it changes anything, and says what to do.
        neither = admin | {"clusters": [{"name": admin["clusters"][0]["name"], "cluster": {
            "server": cluster["server"], "insecure-skip-tls-verify": True}}]}
        lab.sh("mkdir -p /root/cnpa-test-ca && cat > /root/cnpa-test-ca/neither.yaml",
               input_text=yaml.safe_dump(neither))
        t0 = time.monotonic()
        proc = lab.playbook("-e", "cnpa_kubeconfig=/root/cnpa-test-ca/neither.yaml", check=False)
        report["install_without_any_ca_fails_after_s"] = round(time.monotonic() - t0, 1)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and re.search(r" changed=0 ", out), out[-3000:]
        assert "kube-root-ca.crt" in out and "certificate-authority" in out, out[-3000:]
        assert "Unknown error" not in out and "RETRYING" not in out, out[-3000:]
    finally:
        lab.sh("rm -rf /root/cnpa-test-ca; systemctl start kube-controller-manager")
        wait_for(lambda: lab.exists("configmap", "kube-root-ca.crt", "-n", "kube-system"), timeout=60,
                 what="the root-CA publisher's ConfigMap again")
    assert f"KUBECONFIG={SA_KUBECONFIG}" in lab.service("Environment")
    lab.wait_converged("alpha")


# -- what the sandbox can read ---------------------------------------------------------------
def test_sandbox_cannot_read_admin_credentials(lab):
    pid = lab.service("MainPID")
    # As the service runs: root without any capability, in its mount namespace.
    nocaps = f"nsenter -t {pid} -m -- setpriv --bounding-set=-all --inh-caps=-all --"
    for path in (ADMIN_KUBECONFIG, "/etc/kubernetes/pki/ca.key", "/etc/kubernetes/pki/sa.key"):
        proc = lab.sh(f"{nocaps} cat {path}", check=False)
        assert proc.returncode != 0 and "PRIVATE KEY" not in proc.stdout \
            and "client-key-data" not in proc.stdout, (path, proc.stdout[:200])
    # Not even root with every capability in that namespace finds them: the paths are masked.
    proc = lab.sh(f"nsenter -t {pid} -m -- sh -c 'cat {ADMIN_KUBECONFIG}; ls /etc/kubernetes/pki'",
                  check=False)
    assert "client-key-data" not in proc.stdout and "ca.key" not in proc.stdout, proc.stdout[:200]
    # What it needs is there.
    proc = lab.sh(f"{nocaps} sh -c 'cat {SA_KUBECONFIG} {TOKEN_FILE} >/dev/null && echo readable'")
    assert "readable" in proc.stdout
    assert lab.service("Environment").count("CNPA_LOCK_FILE=/run/cnpa-op/pass.lock") == 1


def test_install_output_shows_no_key_or_token(lab):
    """`ansible-playbook -v` of the install prints no client key, admin kubeconfig or token."""
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-v", "-i", lab.inventory,
                           str(ROOT / "tests" / "faults" / "install.yml")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    admin = lab.sh(f"cat {ADMIN_KUBECONFIG}").stdout
    key = re.search(r"client-key-data: (\S+)", admin)[1]
    # The controller's token, wherever this version of the role keeps it (a file, or a Secret).
    token = lab.sh(f"cat {TOKEN_FILE} 2>/dev/null || kubectl get secret -n cnpa-system cnpa-op-token"
                   " -o jsonpath='{.data.token}' | base64 -d", check=False).stdout.strip()
    assert token.startswith("eyJ"), "no token found to look for"
    leaks = {"client-key-data": "client-key-data" in out, "client key": key[:40] in out,
             "admin kubeconfig (base64)": base64.b64encode(admin.encode()).decode()[:60] in out,
             "token": token[-40:] in out, "a JWT": "eyJhbGciOi" in out}
    assert [what for what, leaked in leaks.items() if leaked] == []


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
