"""Helpers of the fault tests: the lab installed on a throwaway host, and what to ask it.

The host driver (Host, wait_for) is tests/hostlib.py's.
"""

from __future__ import annotations

import json
import subprocess
import time
from contextlib import contextmanager

from hostlib import ROOT, Host, session_host, wait_for

from fixtures import cpu, teamspace

GROUP = "platform.labhub.io"
TS = f"teamspaces.{GROUP}"
FIN = f"{GROUP}/cleanup"
LABEL = f"{GROUP}/teamspace"
ARCHIVE = "/root/cnpa-op/archive"
SA_USER = "system:serviceaccount:cnpa-system:cnpa-op"
SA_KUBECONFIG = "/etc/cnpa-op/kubeconfig"

class Lab(Host):
    """The test host with the controller installed (cnpa-op.service running)."""

    def __init__(self, inst, inventory: str) -> None:
        super().__init__(inst)
        self.inventory = inventory

    def playbook(self, *extra: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", self.inventory,
                               str(ROOT / "tests" / "faults" / "install.yml"), *extra],
                              cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
        if check:
            assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        return proc

    # -- TeamSpaces -------------------------------------------------------------------------
    def teamspace(self, name: str, pods: int = 4, cpu: str | None = None) -> dict:
        self.apply(teamspace(name, pods, cpu))
        return self.get(TS, name)

    def ts_or_none(self, name: str) -> dict | None:
        proc = self.kubectl("get", TS, name, "-o", "json", check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    def delete(self, *args: str) -> None:
        self.kubectl("delete", *args, "--wait=false", "--ignore-not-found")

    def converged(self, name: str) -> bool:
        """Everything the controller owes TeamSpace `name`, in place, and its status saying so."""
        t = self.ts_or_none(name)
        if t is None or t["metadata"].get("deletionTimestamp"):
            return False
        ns_name = f"team-{name}"
        fins = t["metadata"].get("finalizers", [])
        st = t.get("status", {})
        if fins.count(FIN) != 1 or st.get("observedGeneration") != t["metadata"]["generation"] \
                or st.get("namespace") != ns_name:
            return False
        ns = self.kubectl("get", "namespace", ns_name, "-o", "json", check=False)
        q = self.kubectl("get", "resourcequota", "team-quota", "-n", ns_name, "-o", "json",
                         check=False)
        if ns.returncode or q.returncode:
            return False
        ns, q = json.loads(ns.stdout), json.loads(q.stdout)
        owners = [r for r in ns["metadata"].get("ownerReferences", []) if r.get("controller")]
        hard = q["spec"].get("hard", {})
        return (ns["metadata"].get("labels", {}).get(LABEL) == name
                and not ns["metadata"].get("deletionTimestamp")
                and [r["uid"] for r in owners] == [t["metadata"]["uid"]]
                and set(hard) == {"pods", "requests.cpu"}
                and hard["pods"] == str(t["spec"]["pods"])
                and cpu(hard["requests.cpu"]) == cpu(t["spec"].get("cpu", "1"))
                and not q["spec"].get("scopes") and not q["spec"].get("scopeSelector"))

    def wait_converged(self, *names: str, timeout: float = 90) -> float:
        t0 = time.monotonic()
        for name in names:
            wait_for(lambda n=name: self.converged(n), timeout=timeout, interval=0.5,
                     what=f"TeamSpace {name} converged")
        return time.monotonic() - t0

    def wait_gone(self, *args: str, timeout: float = 90) -> float:
        t0 = time.monotonic()
        wait_for(lambda: not self.exists(*args), timeout=timeout, interval=0.5,
                 what=f"{' '.join(args)} gone")
        return time.monotonic() - t0

    def archive(self, name: str) -> dict | None:
        proc = self.sh(f"cat {ARCHIVE}/{name}.json", check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    # -- what the controller said ------------------------------------------------------------
    def now(self) -> int:
        return int(self.sh("date +%s").stdout)

    def journal(self, since: int) -> str:
        return self.sh(f"journalctl -u cnpa-op --no-pager -o cat --since @{since}").stdout

    def events(self, name: str) -> list[dict]:
        return self.get("events", "-n", "default",
                        "--field-selector", f"involvedObject.name={name}")["items"]

    def controller_writes(self, since_ts: str) -> list[dict]:
        """Write requests the controller's ServiceAccount made at or after an RFC 3339 time."""
        return [e for e in self.audit_lines()
                if e.get("user", {}).get("username") == SA_USER
                and e.get("verb") in ("create", "update", "patch", "delete")
                and e.get("stage", "ResponseComplete") == "ResponseComplete"
                and e.get("requestReceivedTimestamp", "") >= since_ts]

    def service(self, prop: str) -> str:
        return self.sh(f"systemctl show -p {prop} --value cnpa-op").stdout.strip()


CRD_FILE = "/root/cnpa-op/crd.yaml"


@contextmanager
def crd_without_bounds(lab: Lab):
    """The live CRD without its bounds on metadata.name and spec.cpu (as on a server, or an
    older CRD, that does not check them), so that the controller can be shown what the API
    server would otherwise refuse; the CRD as installed (crd.yaml) is re-applied afterwards."""
    crd = lab.get("crd", f"{TS}")
    root = "/spec/versions/0/schema/openAPIV3Schema"
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    cpu = schema["properties"]["spec"]["properties"]["cpu"]
    ops = [{"op": "remove", "path": f"{root}/x-kubernetes-validations"}] \
        if "x-kubernetes-validations" in schema else []
    ops += [{"op": "remove", "path": f"{root}/properties/spec/properties/cpu/{key}"}
            for key in ("maxLength", "pattern", "x-kubernetes-validations") if key in cpu]
    if ops:
        lab.kubectl("patch", "crd", TS, "--type", "json", "-p", json.dumps(ops))
    try:
        # A CRD's new schema takes a moment to reach the handler: wait until it is in force.
        wait_for(lambda: _server_accepts_unbounded(lab), timeout=30,
                 what="the API server accepting a TeamSpace without the CRD's bounds")
        yield
    finally:
        lab.kubectl("apply", "-f", CRD_FILE)
        lab.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{TS}")
        wait_for(lambda: not _server_accepts_unbounded(lab), timeout=30,
                 what="the CRD's bounds in force again")


def _server_accepts_unbounded(lab: Lab) -> bool:
    """Whether the API server would create a TeamSpace with a bad name and cpu (dry run)."""
    probe = teamspace("bounds.probe", 1, "abc")
    return lab.kubectl("create", "--dry-run=server", "--validate=false", "-f", "-",
                       input_text=json.dumps(probe), check=False).returncode == 0


@contextmanager
def fault_host(name: str, reuse_var: str, unit: str):
    """A host (etcd) with the loop controller installed by install.yml and TeamSpace alpha
    converged: the session's (conftest.py's `lab`), or test_watchdog.py's own."""
    with session_host(name, reuse_var, datastore="etcd", unit=unit) as inst:
        h = Lab(inst, str(inst.dir / "inventory.ini"))
        # The loop, which the fault tests expect (the default on a fresh host of one); a reused
        # host may have been left in watch mode by test_watchdog.py: switched back.
        h.playbook("-e", "cnpa_controller_mode=loop", "-e", "cnpa_controller_mode_switch=true")
        h.teamspace("alpha", pods=4)
        h.wait_converged("alpha")
        yield h
