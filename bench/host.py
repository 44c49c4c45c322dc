"""The benchmark's test host: made and set up as the role would install the controllers under
test, its audit log (what each controller asked the API server), and the cluster read as plain
dicts."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import jinja2  # (ships with ansible-core, in requirements.txt)
import kubernetes
from kubernetes.client.rest import ApiException

from bench import bulk
from bench.method import FLOOR_IN_FLIGHT
from cnpa_controller import Api, ApiError
from cnpa_controller.api import connect
from cnpa_controller.config import Settings
from cnpa_controller.plan import API_VERSION, GROUP, LABEL
from fixtures import teamspace
from testhost import instance as testhost

ROOT = Path(__file__).resolve().parents[1]

VERSION, PLURAL = API_VERSION.split("/")[1], "teamspaces"
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}
HOST_KUBECONFIG = "/etc/rancher/k3s/k3s.yaml"
# The project's (dev.py makes .venv), else whichever is on PATH.
ANSIBLE_PLAYBOOK = next((str(p) for p in [ROOT / ".venv/bin/ansible-playbook"] if p.exists()),
                        shutil.which("ansible-playbook") or "ansible-playbook")
BENCH_DIR = "/root/cnpa-bench"  # inside the host: probe, naive script
TAGS = {"reconcile.sh": "r", "reconcile.sh-before": "b", "naive": "n", "kopf": "k", "watch": "w",
        "floor": "f", "watch-ha": "h"}  # TeamSpace name prefixes
# --reconcile-before: an earlier reconcile.sh (with the files beside it) measured beside this one
# in the same run, installed here and run by a unit of its own.
BEFORE_DIR = "/root/cnpa-before"
PASS_SCRIPTS = ("reconcile.sh", "reconcile.sh-before")
EVENT_DRIVEN = ("kopf", "watch")  # processes on this machine: no passes, an idle window instead
RESYNC_SECONDS = Settings.resync_seconds  # the watch controller's default, as installed
WATCH_AGENT = "cnpa-controller/"  # its user agent (cnpa-controller/IDENTITY), as the audit shows
HA_LEASE = "cnpa-op-bench"
# The watch controller keeps every archive record in the cluster too, as the role installs it
# (cnpa_controller_archive_configmaps); the floor's deletions write the same ConfigMaps.
ARCHIVE_NAMESPACE = "cnpa-bench-archive"
# The control plane's processes inside the host, whose CPU time over a converge says what bounds it.
SERVER_UNITS = ("kube-apiserver", "etcd", "kine", "kube-controller-manager")

# The bench host's audit policy: every request of the admin user (kubectl, the benchmark, kopf),
# writes of everyone else - the default policy's lines stay as they are.
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    users: ["admin"]
  - level: Metadata
    verbs: ["create", "update", "patch", "delete", "deletecollection"]
  - level: None
"""



def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def new_teamspace(prefix: str, i: int) -> dict:
    return teamspace(f"{prefix}{i:03d}", 1 + i % 50, "500m" if i % 2 else "1")


def wait(pred, timeout: float, what: str, interval: float = 0.25) -> float:
    """Until pred() holds (bounded in time and count): how long that took."""
    t0 = time.monotonic()
    for _ in range(int(timeout / interval) + 1):
        if pred():
            return time.monotonic() - t0
        time.sleep(interval)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


class BenchHost:
    """One test host (testhost), with the CRD, the scripts under test and their units."""

    def __init__(self, inst: testhost.Instance) -> None:
        self.inst = inst
        self.api: Api | None = None

    @classmethod
    def create(cls, name: str, datastore: str, reuse: bool) -> BenchHost:
        try:
            inst = testhost.Instance.load(name)
            if inst.running() and reuse:
                log(f"reusing running host {name}")
                return cls(inst)
            testhost.destroy(name)
        except Exception as exc:  # no such host yet
            if "no test host" not in str(exc):
                raise
        log(f"creating test host {name} ({datastore})")
        return cls(testhost.create(name, wait=True, datastore=datastore))

    def setup(self, reconcile: Path, reconcile_before: Path | None) -> dict:
        """Audit, CRD, scripts and units in place, clients made: the server's versions."""
        versions = json.loads(self.sh("kubectl version -o json").stdout)
        store = self.inst.datastore()
        version = self.sh("etcd --version | head -1" if store == "etcd" else "kine --version").stdout
        server = {"kubernetes": versions["serverVersion"]["gitVersion"],
                  "kubectl": versions["clientVersion"]["gitVersion"],
                  "datastore": f"{store} {version.split(':')[-1].strip()}"}
        log(f"server: {server}")
        log("audit policy: reads of the admin user too; restarting kube-apiserver")
        self.put("/etc/kubernetes/audit-policy.yaml", AUDIT_POLICY)
        self.sh("systemctl restart kube-apiserver")
        wait(lambda: self.sh("kubectl get --raw /readyz", check=False).returncode == 0, 90,
                  "kube-apiserver ready")
        crd = jinja2.Template((ROOT / "roles/cnpa_crd/templates/crd.yaml.j2").read_text()).render(
            ansible_managed="rendered by bench/run.py")
        self.put("/root/cnpa-op/crd.yaml", crd)
        self.sh("kubectl apply -f /root/cnpa-op/crd.yaml && kubectl wait --for=condition=Established"
                " --timeout=60s crd/teamspaces.platform.labhub.io", timeout=90)
        # reconcile.sh's python3 reads the kubeconfig with PyYAML, which the role makes sure of
        # (python3-yaml); without it a pass would ask kubectl to convert the file.
        self.sh("python3 -c 'import yaml' 2>/dev/null || { apt-get update -qq && "
                "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-yaml; }", timeout=600)
        self.install_script(reconcile, "/root/cnpa-op")
        if reconcile_before:
            self.install_script(reconcile_before, BEFORE_DIR)
            self.put("/etc/systemd/system/cnpa-before.service",
                     self.unit(f"{BEFORE_DIR}/reconcile.sh"))
        self.put(f"{BENCH_DIR}/naive_reconcile.sh", (ROOT / "bench/naive_reconcile.sh").read_text(),
                 "0755")
        self.put(f"{BENCH_DIR}/pass_probe.py", (ROOT / "bench/pass_probe.py").read_text())
        self.sh(f"kubectl get namespace {ARCHIVE_NAMESPACE} || kubectl create namespace {ARCHIVE_NAMESPACE}")
        self.put("/etc/systemd/system/cnpa-op.service", self.unit("/root/cnpa-op/reconcile.sh"))
        self.put("/etc/systemd/system/cnpa-naive.service",
                 self.unit(f"{BENCH_DIR}/naive_reconcile.sh"))
        self.sh("systemctl daemon-reload")
        kubernetes.config.load_kube_config(config_file=str(self.inst.kubeconfig))
        cfg = kubernetes.client.Configuration.get_default_copy()
        cfg.connection_pool_maxsize = FLOOR_IN_FLIGHT + 8
        api = kubernetes.client.ApiClient(cfg)
        self.core = kubernetes.client.CoreV1Api(api)
        # Plain-dict requests on the controllers' own transport.
        self.api = connect(str(self.inst.kubeconfig), timeout=30, pool=FLOOR_IN_FLIGHT + 8)
        self.custom = kubernetes.client.CustomObjectsApi(api)
        # A TeamSpace list right after the API server's restart and the CRD's creation can get
        # 429 "storage is (re)initializing" (seen on a quiet machine): wait until one answers.
        wait(self.teamspace_storage_ready, 60, "the TeamSpace storage ready")
        # a reused host may hold a previous run's controllers and objects: start from nothing
        self.sh("systemctl stop cnpa-op cnpa-naive cnpa-before", check=False)
        self.cleanup("")
        return server

    def sh(self, script: str, timeout: float = 120, check: bool = True, stdin: str | None = None):
        return self.inst.exec(["bash", "-c", script], check=check, timeout=timeout, input_text=stdin)

    def put(self, path: str, content: str, mode: str = "0644") -> None:
        self.sh(f"install -D -m {mode} /dev/stdin {path}", stdin=content)

    def install_script(self, script: Path, where: str) -> None:
        """reconcile.sh and what the role installs beside it (the plan module, the package,
        compiled as the role compiles it), those it has: earlier versions had fewer."""
        self.put(f"{where}/reconcile.sh", script.read_text(), "0755")
        if script.with_name("cnpa_plan.py").exists():
            self.put(f"{where}/cnpa_plan.py", script.with_name("cnpa_plan.py").read_text())
        package = script.with_name("cnpa_controller")
        if package.is_dir():
            self.sh(f"rm -rf {where}/cnpa_controller")
            for f in sorted(package.glob("*.py")):
                self.put(f"{where}/cnpa_controller/{f.name}", f.read_text())
            self.sh(f"python3 -m compileall -q {where}")

    def teamspace_storage_ready(self) -> bool:
        try:
            self.raw(f"/apis/{GROUP}/{VERSION}/{PLURAL}", {"limit": "1"})
        except ApiError as exc:
            if exc.status == 429:
                return False
            raise
        return True

    def unit(self, script: str) -> str:
        """cnpa-op.service as roles/cnpa_controller renders it: by Ansible (bench/render_unit.yml,
        the role's defaults and template), with what the role would learn from this host."""
        # The lab's layout: the benchmark installs the script under /root/cnpa-op.
        extra = {"cnpa_layout": "lab", "cnpa_script": script,
                 "cnpa_controller_mode": "loop",  # watch runs apart
                 "cnpa_kubeconfig": HOST_KUBECONFIG, "cnpa_controller_api_local": True,
                 # The admin kubeconfig, not the role's ServiceAccount: the requests of the
                 # controller under test are then the admin user's in the audit log.
                 "cnpa_controller_unit_kubeconfig": HOST_KUBECONFIG,
                 "cnpa_controller_least_privilege": False}
        with tempfile.TemporaryDirectory() as d:
            extra["cnpa_bench_unit"] = f"{d}/cnpa-op.service"
            proc = subprocess.run([ANSIBLE_PLAYBOOK, "-i", "localhost,", "bench/render_unit.yml",
                                   "-e", json.dumps(extra)], cwd=ROOT, capture_output=True,
                                  text=True, timeout=300, check=False)
            if proc.returncode:
                raise RuntimeError(f"rendering the unit failed: {proc.stdout[-2000:]}{proc.stderr}")
            return Path(extra["cnpa_bench_unit"]).read_text()

    def service_env(self) -> str:
        """The environment cnpa-op.service gives reconcile.sh (read from the unit)."""
        out = self.sh("systemctl show -p Environment --value cnpa-op.service").stdout.strip()
        return out or f"KUBECONFIG={HOST_KUBECONFIG}"

    def audit_offset(self) -> int:
        return (self.inst.root / "var/log/kubernetes/audit.log").stat().st_size

    def audit_read(self, offset: int) -> tuple[list[dict], int]:
        """The audit log's whole lines from offset (watches' ResponseStarted lines left out), and
        the offset after them: a line still being written is read next time."""
        with open(self.inst.root / "var/log/kubernetes/audit.log", "rb") as fh:
            fh.seek(offset)
            data = fh.read()
        data = data[:data.rfind(b"\n") + 1]
        out = []
        for line in data.splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return [ev for ev in out if ev.get("stage") != "ResponseStarted"], offset + len(data)

    def audit_lines(self, offset: int) -> list[dict]:
        time.sleep(0.5)  # let the API server flush the last lines
        return self.audit_read(offset)[0]

    def writes_by_user(self, offset: int) -> dict:
        """Writes since offset by user: who else wrote while N TeamSpaces converged (the
        controller-manager's ServiceAccount and kube-root-ca.crt ConfigMap in every namespace)."""
        users: dict[str, int] = {}
        for ev in self.audit_lines(offset):
            if ev.get("verb") in WRITE_VERBS:
                user = ev.get("user", {}).get("username", "?")
                if user == "admin":  # the benchmark, the controller under test: told by user agent
                    user += f" ({ev.get('userAgent', '').split('/')[0]})"
                users[user] = users.get(user, 0) + 1
        return dict(sorted(users.items(), key=lambda kv: -kv[1]))

    def server_cpu(self) -> dict:
        """CPU seconds so far of the host's control plane processes (from /proc inside the host)."""
        script = "; ".join(
            f"p=$(systemctl show -p MainPID --value {u}); echo {u} $(cut -d')' -f2- /proc/$p/stat)"
            for u in SERVER_UNITS)
        out: dict[str, float] = {}
        tick = os.sysconf("SC_CLK_TCK")
        for line in self.sh(script, check=False).stdout.splitlines():
            f = line.split()
            if len(f) > 13:  # fields after the name: state is [1], utime [12], stime [13]
                out[f[0]] = (int(f[12]) + int(f[13])) / tick
        return out

    def audit_since(self, offset: int, agent: str | tuple, by_resource: bool = False) -> dict:
        """Requests of the admin user whose user agent starts with `agent`, by verb (and resource,
        so that the watch controller's Lease renewals show as such)."""
        verbs: dict[str, int] = {}
        for ev in self.audit_lines(offset):
            if ev.get("user", {}).get("username") != "admin":
                continue
            if not ev.get("userAgent", "").startswith(agent):
                continue
            ref = ev.get("objectRef", {})
            uri = ev.get("requestURI", "")
            if ref.get("resource"):
                key = f"{ev['verb']} {ref['resource']}" if by_resource else ev["verb"]
            else:  # kubectl's own reads: API discovery (/api, /apis/...) and OpenAPI schemas
                key = f"{ev['verb']} ({'openapi' if uri.startswith('/openapi') else 'discovery'})"
            verbs[key] = verbs.get(key, 0) + 1
        return dict(sorted(verbs.items()))

    def raw(self, path: str, query: dict | None = None) -> dict:
        """GET as a plain dict: model objects cost seconds of this machine's CPU at N = 1,000+,
        taken from the controller under test."""
        return self.api.request("GET", path, query=query)

    def teamspaces(self, prefix: str) -> list[dict]:
        items = self.raw(f"/apis/{GROUP}/{VERSION}/{PLURAL}")["items"]
        return [t for t in items if t["metadata"]["name"].startswith(prefix)]

    @staticmethod
    def status_done(t: dict) -> bool:
        """Status written for the current generation: the last write of a TeamSpace's pass."""
        return bulk.status_done(t)

    def converged(self, prefix: str, n: int) -> bool:
        return bulk.converged(self.api, prefix, n)

    def create_teamspaces(self, prefix: str, n: int) -> None:
        bulk.create(self.api, [new_teamspace(prefix, i) for i in range(n)])

    def cleanup(self, prefix: str) -> None:
        """Remove the run's TeamSpaces without a controller (strip finalizers) and wait for the
        garbage collector to remove their namespaces, so the next run starts from nothing."""
        for t in self.teamspaces(prefix):
            name = t["metadata"]["name"]
            with contextlib.suppress(ApiException):
                self.custom.patch_cluster_custom_object(GROUP, VERSION, PLURAL, name,
                                                        {"metadata": {"finalizers": None}})
                self.custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        try:
            wait(lambda: not self.teamspaces(prefix) and not [
                ns for ns in self.raw("/api/v1/namespaces", {"labelSelector": LABEL})["items"]
                if ns["metadata"]["name"].startswith(f"team-{prefix}")], 900,
                "namespaces gone", interval=2)
        except TimeoutError as exc:
            log(f"warning: {exc}")
