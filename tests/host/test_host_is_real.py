"""The test host behaves like a real Kubernetes host, because it is one.

Each test states an API-server, controller-manager or systemd property the lab relies on and
checks it against the live host. Names are unique per test so the order does not matter.
"""

from __future__ import annotations

import json
import subprocess
import uuid

from hostlib import ROOT, wait_for

from testhost import build

GROUP = "hosttest.cnpa.io"


def _crd(host) -> None:
    if host.exists("crd", f"gadgets.{GROUP}"):
        return
    host.apply({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"gadgets.{GROUP}"},
        "spec": {
            "group": GROUP, "scope": "Cluster",
            "names": {"kind": "Gadget", "plural": "gadgets", "singular": "gadget"},
            "versions": [{
                "name": "v1", "served": True, "storage": True,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
                    "status": {"type": "object",
                               "properties": {"observedGeneration": {"type": "integer"}}},
                }}},
            }],
        },
    })
    host.kubectl("wait", "--for=condition=Established", f"crd/gadgets.{GROUP}", "--timeout=30s")


def _gadget(host, name: str, **meta) -> dict:
    _crd(host)
    host.apply({"apiVersion": f"{GROUP}/v1", "kind": "Gadget",
                "metadata": {"name": name, **meta}, "spec": {"size": 1}})
    return host.get("gadget", name)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def test_status_through_main_endpoint_is_dropped(host):
    name = _name("drop")
    before = _gadget(host, name)
    out = host.kubectl("patch", "gadget", name, "--type=merge",
                       "-p", '{"status":{"observedGeneration":7}}').stdout
    after = host.get("gadget", name)
    # The server drops the status and kubectl says so: nothing was written.
    assert out.strip() == f"gadget.{GROUP}/{name} patched (no change)"
    assert after.get("status") is None
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    # The status subresource is the way in.
    host.kubectl("patch", "gadget", name, "--subresource=status", "--type=merge",
                 "-p", '{"status":{"observedGeneration":7}}')
    assert host.get("gadget", name)["status"] == {"observedGeneration": 7}
    assert host.get("gadget", name)["metadata"]["generation"] == before["metadata"]["generation"]


def test_generation_moves_on_spec_not_on_labels(host):
    name = _name("gen")
    gen0 = _gadget(host, name)["metadata"]["generation"]
    host.kubectl("label", "gadget", name, "owner=platform")
    labelled = host.get("gadget", name)
    assert labelled["metadata"]["generation"] == gen0
    assert labelled["metadata"]["labels"]["owner"] == "platform"
    host.kubectl("patch", "gadget", name, "--type=merge", "-p", '{"spec":{"size":6}}')
    assert host.get("gadget", name)["metadata"]["generation"] == gen0 + 1


def test_garbage_collector_deletes_owned_namespace(host):
    name = _name("owner")
    owner = _gadget(host, name)
    ns = f"gc-{name}"
    host.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": ns, "ownerReferences": [{
            "apiVersion": f"{GROUP}/v1", "kind": "Gadget", "name": name,
            "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]}})
    host.kubectl("delete", "gadget", name, "--wait=false")
    wait_for(lambda: not host.exists("namespace", ns), timeout=90, interval=0.5,
             what=f"namespace {ns} to be garbage-collected")


def test_finalizer_holds_deletion(host):
    name = _name("fin")
    created = _gadget(host, name, finalizers=["example.io/hold"])
    host.kubectl("delete", "gadget", name, "--wait=false")
    held = host.get("gadget", name)
    assert held["metadata"]["deletionTimestamp"]
    assert held["metadata"]["finalizers"] == ["example.io/hold"]
    # Setting deletionTimestamp is a change a controller must act on: generation moves too.
    assert held["metadata"]["generation"] == created["metadata"]["generation"] + 1
    host.kubectl("patch", "gadget", name, "--type=json",
                 "-p", '[{"op":"remove","path":"/metadata/finalizers/0"}]')
    wait_for(lambda: not host.exists("gadget", name), timeout=30, what=f"{name} to go")


def test_systemd_restart_always_and_stop(host):
    unit = "/etc/systemd/system/restart-probe.service"
    host.sh(f"printf '[Service]\\nExecStart=/bin/sleep 1000\\nRestart=always\\nRestartSec=1\\n'"
            f" > {unit} && systemctl daemon-reload && systemctl start restart-probe")

    def main_pid() -> int:
        return int(host.sh("systemctl show -p MainPID --value restart-probe").stdout)

    first = wait_for(main_pid, timeout=10, what="restart-probe to run")
    host.sh(f"kill -9 {first}")
    second = wait_for(lambda: (p := main_pid()) not in (0, first) and p, timeout=15,
                      what="systemd to restart the killed service")
    assert second != first
    host.sh("systemctl stop restart-probe")
    assert host.sh("systemctl is-active restart-probe", check=False).stdout.strip() == "inactive"
    host.sh(f"rm {unit} && systemctl daemon-reload")


def test_data_survives_api_server_restart(host):
    name = _name("keep")
    host.kubectl("create", "configmap", name, "--from-literal=k=v")
    host.sh("systemctl stop kube-apiserver")
    assert host.kubectl("get", "configmap", name, check=False, timeout=30).returncode != 0
    host.sh("systemctl start kube-apiserver")
    wait_for(lambda: host.kubectl("get", "--raw", "/readyz", check=False).stdout == "ok",
             timeout=60, interval=0.5, what="kube-apiserver to be ready again")
    assert host.get("configmap", name)["data"] == {"k": "v"}


def test_audit_log_counts_a_write(host):
    name = _name("audit")

    def writes() -> list[dict]:
        return [e for e in host.audit_lines()
                if e.get("objectRef", {}).get("name") == name and e["user"]["username"] == "admin"]

    assert writes() == []
    host.kubectl("create", "configmap", name, "--from-literal=k=v")
    host.kubectl("get", "configmap", name)  # reads are not recorded
    events = wait_for(writes, timeout=10, what="the audit event")
    assert [e["verb"] for e in events] == ["create"]


def test_plain_kubectl_and_lab_tools_as_root(host):
    # The lab VM's contract: kubectl without KUBECONFIG, jq, python3, systemctl.
    out = host.sh("kubectl get ns default -o json | jq -r .metadata.name && "
                  "python3 -c 'print(1)' && systemctl is-system-running").stdout.split()
    assert out[:2] == ["default", "1"]
    assert out[2] in ("running", "degraded")
    assert host.sh("test -s /etc/rancher/k3s/k3s.yaml").returncode == 0


def _ansible(host, *args: str) -> subprocess.CompletedProcess:
    """An ad-hoc `ansible` run against the host over SSH, outside the project's directory (no
    ansible.cfg of ours); fails the test unless it exits 0."""
    proc = subprocess.run(
        [str(ROOT / ".venv/bin/ansible"), "-i", str(host.inst.inventory), "k3s", *args],
        capture_output=True, text=True, timeout=120, check=False,
        cwd="/", env={"PATH": f"{ROOT / '.venv/bin'}:/usr/bin:/bin", "HOME": "/root"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_ansible_reaches_it_over_ssh(host):
    proc = _ansible(host, "-m", "setup", "-a", "filter=ansible_service_mgr", "-o")
    facts = json.loads(proc.stdout.split("=>", 1)[1])
    assert facts["ansible_facts"]["ansible_service_mgr"] == "systemd"


def test_module_runs_reuse_their_bytecode(host):
    """testhost's AnsiballZ bytecode cache (testhost/files/.../cnpa_testhost_pyc.py) is in use:
    a module run stores what it compiled, the next run of the same module stores nothing new."""
    def ping() -> list[str]:
        _ansible(host, "-m", "ping")
        return host.sh("ls /var/cache/cnpa-testhost-pyc").stdout.split()

    first = ping()
    assert len(first) >= 20, first  # ansible.module_utils.basic and what it imports
    assert ping() == first


def test_strict_tls_clients_accept_the_certificates(host):
    # Python >= 3.13 verifies with VERIFY_X509_STRICT, as the kubernetes client on a lab VM
    # would; k3s's certificates pass it, so the test host's must too.
    script = (
        "import json, ssl, sys, urllib.request\n"
        "assert sys.version_info >= (3, 13), sys.version\n"
        "ctx = ssl.create_default_context(cafile='/etc/kubernetes/pki/ca.crt')\n"
        "assert ctx.verify_flags & ssl.VERIFY_X509_STRICT\n"
        "ctx.load_cert_chain('/etc/kubernetes/pki/admin.crt', '/etc/kubernetes/pki/admin.key')\n"
        f"url = 'https://127.0.0.1:{host.inst.ports['apiserver']}/api/v1/namespaces/default'\n"
        "print(json.load(urllib.request.urlopen(url, context=ctx))['metadata']['name'])\n")
    assert host.inst.exec(["python3", "-c", script]).stdout.strip() == "default"


def test_client_and_server_are_the_built_release(host):
    # As on k3s, the kubectl inside the host is the server's own version.
    versions = json.loads(host.kubectl("version", "-o", "json").stdout)
    assert versions["clientVersion"]["gitVersion"] == build.version()
    assert versions["serverVersion"]["gitVersion"] == build.version()


def test_validating_admission_policy_denies(host):
    name = _name("vap")
    label = f"hosttest-{name}"
    host.apply({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {"failurePolicy": "Fail",
                 "matchConstraints": {"resourceRules": [{
                     "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                     "resources": ["configmaps"]}]},
                 "validations": [{"expression": "object.metadata.name.startsWith('allowed-')",
                                  "message": f"{name}: only allowed-* names"}]}})
    host.apply({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchLabels": {"hosttest": label}}}}})
    ns = f"ns-{name}"
    host.kubectl("create", "namespace", ns)
    host.kubectl("label", "namespace", ns, f"hosttest={label}")

    def denied():
        # The policy takes effect once the API server has compiled it (about a second).
        proc = host.kubectl("create", "configmap", f"denied-{name}", "-n", ns, check=False)
        if proc.returncode == 0:
            host.kubectl("delete", "configmap", f"denied-{name}", "-n", ns)
            return None
        return proc.stderr

    message = wait_for(denied, timeout=30, interval=0.5, what="the policy to deny a create")
    assert f"{name}: only allowed-* names" in message
    assert "ValidatingAdmissionPolicy" in message
    host.kubectl("create", "configmap", f"allowed-{name}", "-n", ns)
    host.kubectl("delete", "namespace", ns, "--wait=false")
    host.kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", name)


def test_crd_validation_rules_in_cel(host):
    _crd(host)
    name = f"celgadgets.{GROUP}"
    if not host.exists("crd", name):
        host.apply({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": name},
            "spec": {"group": GROUP, "scope": "Cluster",
                     "names": {"kind": "CelGadget", "plural": "celgadgets"},
                     "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                         "openAPIV3Schema": {"type": "object", "properties": {"spec": {
                             "type": "object", "properties": {"cpu": {"type": "string"}},
                             "x-kubernetes-validations": [{
                                 "rule": "isQuantity(self.cpu) && "
                                         "quantity(self.cpu).isLessThan(quantity('2'))",
                                 "message": "cpu must be a quantity below 2"}]}}}}}]}})
        host.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=30s")
    ok, bad = _name("cel"), _name("cel")
    host.apply({"apiVersion": f"{GROUP}/v1", "kind": "CelGadget", "metadata": {"name": ok},
                "spec": {"cpu": "1500m"}})
    proc = host.kubectl("apply", "-f", "-", check=False, input_text=json.dumps({
        "apiVersion": f"{GROUP}/v1", "kind": "CelGadget", "metadata": {"name": bad},
        "spec": {"cpu": "3"}}))
    assert proc.returncode != 0
    assert "cpu must be a quantity below 2" in proc.stderr


def test_service_account_tokens_are_issued(host):
    # TokenRequest (what `kubectl create token` calls) and a token the API server accepts.
    sa = _name("sa")
    host.kubectl("create", "serviceaccount", sa)
    token = host.kubectl("create", "token", sa, "--duration=10m").stdout.strip()
    assert token.count(".") == 2
    # Only the token: the admin kubeconfig's client certificate would authenticate first.
    who = json.loads(host.kubectl(
        "--kubeconfig=/dev/null", f"--server=https://127.0.0.1:{host.inst.ports['apiserver']}",
        "--certificate-authority=/etc/kubernetes/pki/ca.crt", f"--token={token}",
        "auth", "whoami", "-o", "json").stdout)
    assert who["status"]["userInfo"]["username"] == f"system:serviceaccount:default:{sa}"
