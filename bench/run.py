"""Benchmark: reconcile cost versus the number of TeamSpaces (issue 5).

    sudo bench-venv/bin/python bench/run.py   # N = 1 ... 5,000; writes docs/benchmark.*

bench-venv: the project's .venv plus requirements-bench.txt's kopf and matplotlib (docs/benchmark.md
says how; the shared .venv stays as `dev.py setup` made it).

Creates its own throwaway test host (`python -m testhost`, instance "bench"), makes its audit log
record reads as well as writes (for the admin user only; the shared default policy file is not
touched, only the copy inside this host), installs the CRD and reconcile.sh from this repository
and runs cnpa-op.service rendered from roles/cnpa_controller. Then, for every N and for each
controller - reconcile.sh (the 3 s loop), the naive baseline (bench/naive_reconcile.sh, same unit),
the kopf peer (bench/kopf_peer.py, event-driven) and the watch controller (`python3 -m
cnpa_controller`, issue 13; like kopf run on this machine against the host's API server) - it
measures:

  converge   create N TeamSpaces, time until every one has its namespace (owned by it), its
             quota (pods as in the spec) and status.observedGeneration == generation;
  restore    delete one quota at a random moment of the loop, time until a new one exists;
  idle pass  the service stopped, one pass by hand with nothing to do: wall time, requests by
             verb from the audit log, writes, CPU time and peak memory (kopf: a 3 s idle window);
  work pass  the service stopped, every TeamSpace's spec.pods changed, one pass by hand.
  ready      create one more TeamSpace at a random moment, time until its status is written for
             its generation (status is the last write, after namespace and quota);
  idle       kopf and watch have no passes: requests, writes and CPU over an idle window.
  delete     last, the service running, every one of the N TeamSpaces deleted (8 requests in
             parallel, as created): time until all are archived, released and gone.
Two more rows that are not controllers:
  floor      the same TeamSpace creates and the same finalizer, namespace, quota and status writes
             (plan() of each created TeamSpace, sent as the watch controller's executor
             sends them) from one client with nothing to read or decide: the host's floor for
             "N new TeamSpaces converged"; then the N deletions, each followed at once by the
             writes the plan gives for it (archive record on disk and as a ConfigMap, finalizer
             released), by the watch controller's executor: the floor for "N deletions done";
  watch-ha   three watch controllers with leader election on one Lease; the leader is SIGKILLed,
             a TeamSpace's spec is changed right after: time until that change is reconciled.
Every run records the machine's load average (os.getloadavg, as `uptime` shows it) before and after.

Results: docs/benchmark.md (table + command), docs/benchmark.png (plot), bench/results.json.
Every wait is bounded in time and count; the host is destroyed at the end unless --keep.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # fixtures: the TeamSpaces every test builds

import jinja2  # noqa: E402  (ships with ansible-core, in requirements.txt)
import kubernetes  # noqa: E402
from fixtures import teamspace  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from cnpa_controller import Api, ApiError  # noqa: E402
from cnpa_controller.controller import Settings  # noqa: E402
from cnpa_controller.executor import Executor, request_of, written_key  # noqa: E402
from cnpa_controller.plan import plan  # noqa: E402
from testhost import instance as testhost  # noqa: E402

GROUP, VERSION, PLURAL = "platform.labhub.io", "v1alpha1", "teamspaces"
LABEL = f"{GROUP}/teamspace"
FINALIZER = f"{GROUP}/cleanup"
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}
HOST_KUBECONFIG = "/etc/rancher/k3s/k3s.yaml"
# The project's (dev.py makes .venv), else whichever is on PATH.
ANSIBLE_PLAYBOOK = next((str(p) for p in [ROOT / ".venv/bin/ansible-playbook"] if p.exists()),
                        shutil.which("ansible-playbook") or "ansible-playbook")
BENCH_DIR = "/root/cnpa-bench"  # inside the host: probe, naive script
PERIOD = 3.0
# Restore and ready polls: short against the event-driven targets (p50 0.1 s), a few dozen cheap
# GETs per second against a 2-core server.
POLL = 0.02
TAGS = {"reconcile.sh": "r", "reconcile.sh-before": "b", "naive": "n", "kopf": "k", "watch": "w",
        "floor": "f", "watch-ha": "h"}  # TeamSpace name prefixes
# --reconcile-before: an earlier reconcile.sh (with the files beside it) measured beside this one
# in the same run, installed here and run by a unit of its own.
BEFORE_DIR = "/root/cnpa-before"
PASS_SCRIPTS = ("reconcile.sh", "reconcile.sh-before")
EVENT_DRIVEN = ("kopf", "watch")  # processes on this machine: no passes, an idle window instead
IDLE_WINDOW = 20.0  # s; far shorter than the watch controller's resync (300 s): "between resyncs"
# Idle means the cluster too: after N new namespaces the controller-manager's service-account,
# root-CA and quota controllers write into each at 20 requests/s apiece (about 250 s at N = 5,000),
# and every quota status write is an event the controllers under test receive. The idle window
# starts once nobody but Lease holders has written for QUIET_FOR seconds (at most QUIET_BOUND).
QUIET_FOR, QUIET_BOUND = 10.0, 900.0
RESYNC_SECONDS = Settings.resync_seconds  # the watch controller's default, as installed
# From this N on, every row starts on a new test host instead of deleting the previous row's
# namespaces: the namespace controller takes tens of minutes for 5,000, and what it has not
# finished would load the next row.
FRESH_HOST_FROM = 1000
WATCH_AGENT = "cnpa-controller/"  # its user agent (cnpa-controller/IDENTITY), as the audit shows
HA_LEASE = "cnpa-op-bench"
# The watch controller keeps every archive record in the cluster too, as the role installs it
# (cnpa_controller_archive_configmaps); the floor's deletions write the same ConfigMaps.
ARCHIVE_NAMESPACE = "cnpa-bench-archive"
# The naive baseline takes minutes per pass at N = 200 (hours to converge 1,000). The 3 s loop fits
# up to about 1,000: at 5,000 its idle pass alone (3.5 s, issue 13) is longer than its sleep.
MAX_N = {"naive": 200, "reconcile.sh": 1000, "reconcile.sh-before": 1000}
FLOOR_IN_FLIGHT = 32  # see run_floor
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


def script_info(path: Path) -> dict:
    """Which script cnpa-op.service runs (installed by setup_host): path, sha256 prefix, commit."""
    commit = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%h %cI", "--", str(path)],
                            capture_output=True, text=True, check=False)
    return {"script": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()[:12],
            "last_commit": commit.stdout.strip()}


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.inst: testhost.Instance | None = None
        self.kopf_proc: subprocess.Popen | None = None
        self.watch_procs: dict[str, subprocess.Popen] = {}  # identity -> process
        self.watch_synced: dict[str, float] = {}  # identity -> monotonic time its caches synced
        self.host_used = False  # a row has run on this host
        self.throwaway = False  # this row's host is replaced after it: no cleanup
        self.results: dict = {"sizes": args.sizes, "trials": args.trials, "runs": []}

    # -- host --------------------------------------------------------------------------------
    def sh(self, script: str, timeout: float = 120, check: bool = True, stdin: str | None = None):
        assert self.inst is not None
        return self.inst.exec(["bash", "-c", script], check=check, timeout=timeout, input_text=stdin)

    def put(self, path: str, content: str, mode: str = "0644") -> None:
        self.sh(f"install -D -m {mode} /dev/stdin {path}", stdin=content)

    def create_host(self) -> None:
        name = self.args.instance
        try:
            inst = testhost.Instance.load(name)
            if inst.running() and self.args.reuse:
                log(f"reusing running host {name}")
                self.inst = inst
                return
            testhost.destroy(name)
        except Exception as exc:  # no such host yet
            if "no test host" not in str(exc):
                raise
        log(f"creating test host {name} ({self.args.datastore})")
        self.inst = testhost.create(name, wait=True, datastore=self.args.datastore)

    def setup_host(self) -> None:
        assert self.inst is not None
        versions = json.loads(self.sh("kubectl version -o json").stdout)
        store = self.inst.datastore()
        version = self.sh("etcd --version | head -1" if store == "etcd" else "kine --version").stdout
        server = {"kubernetes": versions["serverVersion"]["gitVersion"],
                  "kubectl": versions["clientVersion"]["gitVersion"],
                  "datastore": f"{store} {version.split(':')[-1].strip()}"}
        self.results.setdefault("servers", {})[store] = server
        log(f"server: {server}")
        log("audit policy: reads of the admin user too; restarting kube-apiserver")
        self.put("/etc/kubernetes/audit-policy.yaml", AUDIT_POLICY)
        self.sh("systemctl restart kube-apiserver")
        self.wait(lambda: self.sh("kubectl get --raw /readyz", check=False).returncode == 0, 90,
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
        self.install_script(Path(self.args.reconcile), "/root/cnpa-op")
        if self.args.reconcile_before:
            self.install_script(Path(self.args.reconcile_before), BEFORE_DIR)
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
        self.api = Api(api, timeout=30)  # plain-dict requests (the watch controller's client)
        self.custom = kubernetes.client.CustomObjectsApi(api)
        # A TeamSpace list right after the API server's restart and the CRD's creation can get
        # 429 "storage is (re)initializing" (seen on a quiet machine): wait until one answers.
        self.wait(self.teamspace_storage_ready, 60, "the TeamSpace storage ready")
        # a reused host may hold a previous run's controllers and objects: start from nothing
        self.sh("systemctl stop cnpa-op cnpa-naive cnpa-before", check=False)
        self.cleanup("")

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
        extra = {"cnpa_script": script, "cnpa_controller_mode": "loop",  # watch runs apart
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

    # -- helpers -----------------------------------------------------------------------------
    @staticmethod
    def wait(pred, timeout: float, what: str, interval: float = 0.25) -> float:
        t0 = time.monotonic()
        for _ in range(int(timeout / interval) + 1):
            if pred():
                return time.monotonic() - t0
            time.sleep(interval)
        raise TimeoutError(f"{what}: not within {timeout:.0f} s")

    def audit_offset(self) -> int:
        assert self.inst is not None
        return (self.inst.root / "var/log/kubernetes/audit.log").stat().st_size

    def audit_read(self, offset: int) -> tuple[list[dict], int]:
        """The audit log's whole lines from offset (watches' ResponseStarted lines left out), and
        the offset after them: a line still being written is read next time."""
        assert self.inst is not None
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
        st, m = t.get("status") or {}, t["metadata"]
        return st.get("observedGeneration") == m["generation"] and st.get("namespace") == f"team-{m['name']}"

    def converged(self, prefix: str, n: int) -> bool:
        ts = self.teamspaces(prefix)
        # The namespaces and quotas are listed only once every status is written (one list per
        # poll instead of three while the controller is still at work).
        if len(ts) != n or not all(self.status_done(t) for t in ts):
            return False
        nss = {ns["metadata"]["name"]: ns for ns in
               self.raw("/api/v1/namespaces", {"labelSelector": LABEL})["items"]}
        quotas = {q["metadata"]["namespace"]: q for q in self.raw(
            "/api/v1/resourcequotas", {"fieldSelector": "metadata.name=team-quota"})["items"]}
        for t in ts:
            m, nsname = t["metadata"], f"team-{t['metadata']['name']}"
            ns, q = nss.get(nsname), quotas.get(nsname)
            if ns is None or m["uid"] not in [o["uid"] for o in ns["metadata"].get("ownerReferences", [])]:
                return False
            if q is None or q["spec"].get("hard", {}).get("pods") != str(t["spec"]["pods"]):
                return False
        return True

    # -- controllers -------------------------------------------------------------------------
    def start(self, ctl: str) -> None:
        if ctl == "kopf":
            self.start_kopf()
        elif ctl == "watch":
            self.start_watch("bench-watch", fresh_archive=True)
        else:
            self.sh(f"systemctl start {self.unit_name(ctl)}")

    def stop(self, ctl: str) -> None:
        if ctl == "kopf":
            self.stop_kopf()
        elif ctl in ("watch", "watch-ha"):
            for identity in list(self.watch_procs):
                self.stop_watch(identity)
        elif ctl != "floor":
            self.sh(f"systemctl stop {self.unit_name(ctl)}", timeout=60)

    @staticmethod
    def unit_name(ctl: str) -> str:
        return {"naive": "cnpa-naive", "reconcile.sh-before": "cnpa-before"}.get(ctl, "cnpa-op")

    def start_kopf(self) -> None:
        assert self.inst is not None
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = dict(os.environ, KUBECONFIG=str(self.inst.kubeconfig),
                   CNPA_ARCHIVE_DIR="/tmp/cnpa-bench-kopf-archive")
        self.kopf_log = open("/tmp/cnpa-bench-kopf.log", "ab")  # noqa: SIM115 - child's stdout
        self.kopf_proc = subprocess.Popen(
            [sys.executable, "-m", "kopf", "run", "--standalone", "--all-namespaces", "--quiet",
             f"--liveness=http://127.0.0.1:{port}/healthz", str(ROOT / "bench/kopf_peer.py")],
            env=env, stdout=self.kopf_log, stderr=subprocess.STDOUT, start_new_session=True)

        def alive() -> bool:
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).status == 200
            except OSError:
                return False
        self.wait(alive, 60, "kopf liveness")
        time.sleep(2)  # watches established

    def stop_kopf(self) -> None:
        proc, self.kopf_proc = self.kopf_proc, None
        if proc is None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        self.kopf_log.close()

    def start_watch(self, identity: str, lease: str = HA_LEASE, leader: bool = True,
                    extra_env: dict | None = None, fresh_archive: bool = False) -> None:
        """`python3 -m cnpa_controller` as installed in watch mode (leader election on, default
        resync and workers), with the admin kubeconfig: its requests are the admin user's in the
        audit log, told apart by the user agent cnpa-controller/IDENTITY. leader: wait until it
        leads (a Lease left by an earlier process that was stopped cleanly is released at once).
        fresh_archive: an empty archive directory, as the floor's: records of earlier runs under
        the same names made each deletion keep the earlier record too (a second durable write),
        so the delete row did more than the floor it is compared with."""
        assert self.inst is not None
        archive = Path(f"/tmp/cnpa-bench-watch/{identity}/archive")
        if fresh_archive:
            shutil.rmtree(archive, ignore_errors=True)
        archive.mkdir(parents=True, exist_ok=True)  # it must exist (exit 4 otherwise)
        err = Path(f"/tmp/cnpa-bench-watch/{identity}/stderr.log")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "KUBECONFIG": str(self.inst.kubeconfig),
               "CNPA_ARCHIVE_DIR": str(archive), "CNPA_ARCHIVE_NAMESPACE": ARCHIVE_NAMESPACE,
               "CNPA_LEADER_ELECTION": "1",
               "CNPA_LEASE_NAME": lease, "CNPA_LEASE_IDENTITY": identity, **(extra_env or {})}
        with open(err.with_name("stdout.log"), "ab") as out, open(err, "wb") as errf:
            self.watch_procs[identity] = subprocess.Popen(
                [sys.executable, "-m", "cnpa_controller"], cwd=ROOT, env=env,
                stdout=out, stderr=errf, stdin=subprocess.DEVNULL, start_new_session=True)
        proc = self.watch_procs[identity]
        # Its resync timer starts when its caches have synced (at once: no TeamSpace yet), which
        # is before it leads: on a host without the Lease the first candidate makes it only once
        # it has been missing for a lease (leader.py), so timing from "became the leader" put
        # the predicted resync 15 s late and the idle window on the resync.
        self.wait(lambda: "caches synced" in err.read_text() or proc.poll() is not None, 90,
                  f"watch controller {identity}: caches synced")
        self.watch_synced[identity] = time.monotonic()
        news = "became the leader" if leader else "caches synced"
        self.wait(lambda: news in err.read_text() or proc.poll() is not None, 90,
                  f"watch controller {identity}: {news}")
        if proc.poll() is not None:
            raise subprocess.SubprocessError(f"watch controller {identity} exited: {err.read_text()}")

    def stop_watch(self, identity: str, kill: bool = False) -> None:
        """SIGTERM (it gives the Lease up) or, for the HA run, SIGKILL (it cannot)."""
        proc = self.watch_procs.pop(identity, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def peer_pid(self, ctl: str) -> int:
        proc = self.kopf_proc if ctl == "kopf" else next(iter(self.watch_procs.values()))
        assert proc is not None
        return proc.pid

    @staticmethod
    def usage(pid: int) -> tuple[float, float]:
        """(CPU seconds so far, peak RSS MiB) of a process on this machine."""
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        hwm = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if ln.startswith("VmHWM"))
        return cpu, int(hwm.split()[1]) / 1024

    # -- one controller at one N -------------------------------------------------------------
    def create_teamspaces(self, prefix: str, n: int) -> None:
        def one(i: int) -> None:
            self.api.request("POST", f"/apis/{GROUP}/{VERSION}/{PLURAL}", body=new_teamspace(prefix, i))
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, range(n)))

    def probe_pass(self, ctl: str) -> dict:
        script = {"naive": f"{BENCH_DIR}/naive_reconcile.sh",
                  "reconcile.sh-before": f"{BEFORE_DIR}/reconcile.sh"}.get(ctl, "/root/cnpa-op/reconcile.sh")
        env = " ".join(self.service_env().split())
        off = self.audit_offset()
        out = self.sh(f"env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "
                      f"{env} python3 {BENCH_DIR}/pass_probe.py {script}", timeout=900)
        res = json.loads(out.stdout.strip().splitlines()[-1])
        # kubectl's (the naive script, reconcile.sh before it ran the package) or the package's.
        res["requests"] = self.audit_since(off, ("kubectl", WATCH_AGENT))
        res["writes"] = sum(v for k, v in res["requests"].items() if k.split()[0] in WRITE_VERBS)
        # The loop runs a pass, then sleeps 3 s: its share of a core while idle.
        res["cpu_pct"] = round(100 * res["cpu_s"] / (res["wall_s"] + PERIOD), 1)
        return res

    def restore_trials(self, ctl: str, prefix: str, n: int, budget: float, bound: float) -> list[float]:
        rng = random.Random(n)
        latencies: list[float] = []
        t_end = time.monotonic() + budget
        for _ in range(self.args.trials):
            if time.monotonic() > t_end:
                break
            time.sleep(rng.uniform(0, PERIOD + 0.3))  # a random moment of the loop
            ns = f"team-{prefix}{rng.randrange(n):03d}"
            old = self.core.read_namespaced_resource_quota("team-quota", ns).metadata.uid
            t0 = time.monotonic()
            self.core.delete_namespaced_resource_quota("team-quota", ns)

            def back(ns=ns, old=old) -> bool:
                try:
                    return self.core.read_namespaced_resource_quota("team-quota", ns).metadata.uid != old
                except ApiException as exc:
                    if exc.status == 404:
                        return False
                    raise
            self.wait(back, bound, f"{ctl}: quota in {ns} restored", interval=POLL)
            latencies.append(round(time.monotonic() - t0, 3))
        return latencies

    def ready_trials(self, ctl: str, prefix: str, budget: float, bound: float) -> list[float]:
        """New TeamSpace -> its status written (Ready), one at a time at a random moment of the
        loop, polled every POLL s. prefix is not the run's (so converged() still counts N)."""
        rng = random.Random(len(prefix))
        latencies: list[float] = []
        t_end = time.monotonic() + budget
        for i in range(self.args.trials):
            if time.monotonic() > t_end:
                break
            time.sleep(rng.uniform(0, PERIOD + 0.3))
            t0 = time.monotonic()
            self.api.request("POST", f"/apis/{GROUP}/{VERSION}/{PLURAL}", body=new_teamspace(prefix, i))
            path = f"/apis/{GROUP}/{VERSION}/{PLURAL}/{prefix}{i:03d}"
            self.wait(lambda path=path: self.status_done(self.raw(path)), bound,
                      f"{ctl}: {path} ready", interval=POLL)
            latencies.append(round(time.monotonic() - t0, 3))
        return latencies

    def cleanup(self, prefix: str) -> None:
        """Remove the run's TeamSpaces without a controller (strip finalizers) and wait for the
        garbage collector to remove their namespaces, so the next run starts from nothing."""
        if self.throwaway:  # the next row starts on a new host (FRESH_HOST_FROM)
            return
        for t in self.teamspaces(prefix):
            name = t["metadata"]["name"]
            with contextlib.suppress(ApiException):
                self.custom.patch_cluster_custom_object(GROUP, VERSION, PLURAL, name,
                                                        {"metadata": {"finalizers": None}})
                self.custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        try:
            self.wait(lambda: not self.teamspaces(prefix) and not [
                ns for ns in self.raw("/api/v1/namespaces", {"labelSelector": LABEL})["items"]
                if ns["metadata"]["name"].startswith(f"team-{prefix}")], 900,
                "namespaces gone", interval=2)
        except TimeoutError as exc:
            log(f"warning: {exc}")

    def converge(self, ctl: str, prefix: str, n: int, res: dict, send=None) -> None:
        """N new TeamSpaces -> all converged; besides the time, what else the server did meanwhile:
        CPU of the control plane's processes and every user's writes (audit log)."""
        off, cpu0, t0 = self.audit_offset(), self.server_cpu(), time.monotonic()
        (send or self.create_teamspaces)(prefix, n)
        res["create_s"] = round(time.monotonic() - t0, 3)
        bound = 1200 if ctl == "naive" else 900
        # Poll less often at large N: each poll lists N TeamSpaces on the same 2 cores.
        self.wait(lambda: self.converged(prefix, n), bound, f"{ctl} N={n} converged",
                  interval=max(0.2, n / 2000))
        res["converge_s"] = round(time.monotonic() - t0, 3)
        cpu1 = self.server_cpu()
        res["converge_server_cpu_s"] = {k: round(cpu1[k] - cpu0.get(k, 0), 2) for k in cpu1}
        res["converge_writes_by_user"] = self.writes_by_user(off)

    def delete_all(self, ctl: str, prefix: str, n: int, send=None) -> dict:
        """N TeamSpaces deleted (8 requests in parallel, as they were created) -> every one
        archived, released and gone. Besides the time, the server's CPU and who wrote meanwhile."""
        off, cpu0, t0 = self.audit_offset(), self.server_cpu(), time.monotonic()

        def one(i: int) -> None:
            self.api.request("DELETE", f"/apis/{GROUP}/{VERSION}/{PLURAL}/{prefix}{i:03d}")

        if send is None:
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(one, range(n)))
        else:
            send(prefix, n)
        res = {"requests_s": round(time.monotonic() - t0, 3)}
        self.wait(lambda: not self.teamspaces(prefix), 900, f"{ctl} N={n}: every deletion done",
                  interval=max(0.2, n / 2000))
        res["delete_s"] = round(time.monotonic() - t0, 3)
        cpu1 = self.server_cpu()
        res["server_cpu_s"] = {k: round(cpu1[k] - cpu0.get(k, 0), 2) for k in cpu1}
        res["writes_by_user"] = self.writes_by_user(off)
        log(f"{ctl} N={n}: {n} deletions done in {res['delete_s']} s")
        return res

    def wait_quiet(self) -> dict:
        """Until nobody but Lease holders has written for QUIET_FOR s (bounded by QUIET_BOUND):
        how long that took and who wrote meanwhile (the audit log records every user's writes)."""
        t0 = time.monotonic()
        off, quiet_since, writes = self.audit_offset(), t0, {}
        for _ in range(int(QUIET_BOUND) + 1):
            if time.monotonic() - quiet_since >= QUIET_FOR:
                return {"waited_s": round(quiet_since - t0, 1), "writes_meanwhile": writes}
            time.sleep(1)
            events, off = self.audit_read(off)
            for ev in events:
                if ev.get("verb") in WRITE_VERBS and (ev.get("objectRef") or {}).get("resource") != "leases":
                    user = ev.get("user", {}).get("username", "?")
                    writes[user] = writes.get(user, 0) + 1
                    quiet_since = time.monotonic()
            if time.monotonic() - t0 > QUIET_BOUND:
                break
        raise TimeoutError(f"the cluster still writing after {QUIET_BOUND:.0f} s: {writes}")

    def next_resync(self) -> float:
        """Monotonic time of the watch controller's next resync (every RESYNC_SECONDS from the
        moment its caches synced)."""
        synced = next(iter(self.watch_synced.values()))
        return synced + RESYNC_SECONDS * (1 + int((time.monotonic() - synced) // RESYNC_SECONDS))

    def window(self, ctl: str, pid: int) -> dict:
        """The peer's requests and CPU over IDLE_WINDOW from now."""
        cpu0, _ = self.usage(pid)
        off = self.audit_offset()
        time.sleep(IDLE_WINDOW)
        cpu1, rss = self.usage(pid)
        reqs = self.audit_since(off, "kopf" if ctl == "kopf" else WATCH_AGENT, by_resource=True)
        return {"wall_s": None, "cpu_s": round(cpu1 - cpu0, 4), "maxrss_mib": round(rss, 1),
                "cpu_pct": round(100 * (cpu1 - cpu0) / IDLE_WINDOW, 2), "window_s": IDLE_WINDOW,
                "requests": reqs, "writes": sum(v for k, v in reqs.items() if k.split()[0] in WRITE_VERBS)}

    def idle_window(self, ctl: str, n: int) -> dict:
        """An event-driven peer with nothing to do, once the cluster is quiet: its requests and
        CPU over IDLE_WINDOW, between two of the watch controller's resyncs. For the watch
        controller from N = FRESH_HOST_FROM on, a second window holding a resync says what one
        costs (every TeamSpace planned again from the cache)."""
        pid = self.peer_pid(ctl)
        quiet = self.wait_quiet()
        log(f"{ctl} N={n}: cluster quiet after {quiet['waited_s']} s more ({quiet['writes_meanwhile']})")
        if ctl == "watch" and self.next_resync() < time.monotonic() + IDLE_WINDOW + 2:
            time.sleep(max(0.0, self.next_resync() - time.monotonic()) + 10)  # let it pass first
        res = {**self.window(ctl, pid), "quiet": quiet,
               "note": f"requests and CPU over a {IDLE_WINDOW:.0f} s idle window"}
        if ctl == "watch" and n >= FRESH_HOST_FROM:
            time.sleep(max(0.0, self.next_resync() - 2 - time.monotonic()))
            res["resync"] = self.window(ctl, pid)
            log(f"{ctl} N={n}: a window with a resync: {res['resync']}")
        return res

    def run_one(self, ctl: str, n: int) -> dict:
        if ctl == "floor":
            return self.run_floor(n)
        if ctl == "watch-ha":
            return self.run_ha(n)
        tag = TAGS[ctl]
        prefix = f"{tag}{n}-"
        res: dict = {"controller": ctl, "n": n}
        log(f"{ctl} N={n}: start")
        if ctl in PASS_SCRIPTS:
            res["script"] = script_info(Path(self.args.reconcile_before if ctl == "reconcile.sh-before"
                                             else self.args.reconcile))
        self.start(ctl)
        k0 = self.usage(self.peer_pid(ctl)) if ctl in EVENT_DRIVEN else None
        self.converge(ctl, prefix, n, res)
        if k0 is not None:
            res["converge_cpu_s"] = round(self.usage(self.peer_pid(ctl))[0] - k0[0], 3)
        log(f"{ctl} N={n}: converged in {res['converge_s']} s; restore trials")
        budget = 200 if ctl == "naive" else 150
        res["restore_s"] = self.restore_trials(ctl, prefix, n, budget, 300)
        if ctl != "naive":  # one naive pass at N = 200 takes minutes: no trials would fit
            res["ready_s"] = self.ready_trials(ctl, f"{tag}{n}n-", budget, 300)
        if ctl in EVENT_DRIVEN:
            res["idle"] = self.idle_window(ctl, n)
            res["delete"] = self.delete_all(ctl, prefix, n)
            self.stop(ctl)
        else:
            self.stop(ctl)
            reps = 1 if ctl == "naive" and n > 1 else (3 if ctl == "naive" else 5)
            idles = [self.probe_pass(ctl) for _ in range(reps)]
            best = dict(sorted(idles, key=lambda r: r["wall_s"])[len(idles) // 2])  # median
            best["wall_all_s"] = [r["wall_s"] for r in idles]
            best["writes_all"] = [r["writes"] for r in idles]
            res["idle"] = best
            # a pass with work to do: every TeamSpace's spec changed while the service is stopped
            for t in self.teamspaces(prefix):
                self.custom.patch_cluster_custom_object(GROUP, VERSION, PLURAL, t["metadata"]["name"],
                                                        {"spec": {"pods": 1 + (t["spec"]["pods"] % 50)}})
            res["work"] = self.probe_pass(ctl)
            res["work"]["converged_after"] = self.converged(prefix, n)
            if ctl in PASS_SCRIPTS:
                self.start(ctl)
                self.wait(lambda: self.converged(prefix, n), 300, f"{ctl} N={n} converged again")
                res["delete"] = self.delete_all(ctl, prefix, n)
                self.stop(ctl)
        log(f"{ctl} N={n}: {json.dumps({k: v for k, v in res.items() if k not in ('restore_s', 'ready_s')})}")
        self.cleanup(prefix)
        self.cleanup(f"{tag}{n}n-")
        return res

    def run_floor(self, n: int) -> dict:
        """The host's floor for N new TeamSpaces converged: what the watch controller writes for
        each (plan() of the TeamSpace as created: finalizer, namespace, quota, status),
        sent by one client as soon as each TeamSpace exists, with no list, watch or cache: no
        controller can do less. FLOOR_IN_FLIGHT TeamSpaces at a time: with the creating client's 8,
        a loaded machine made the floor wait on its own round trips (200 at N = 200 took 27 s, the
        watch controller 13 s), not on the server."""
        prefix = f"{TAGS['floor']}{n}-"
        res: dict = {"controller": "floor", "n": n, "in_flight": FLOOR_IN_FLIGHT}
        log(f"floor N={n}: start")
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        sent = {"requests": 0}

        def one(i: int) -> None:
            ts = self.api.request("POST", f"/apis/{GROUP}/{VERSION}/{PLURAL}",
                                  body=new_teamspace(prefix, i))
            written: dict = {}
            for w in plan(ts, None, None, now):
                method, path, ctype, body = request_of(w, written)
                out = self.api.request(method, path, body=body, content_type=ctype)
                written[written_key(method, path, body)] = (out["metadata"]["resourceVersion"],
                                                            out["metadata"]["uid"])
                sent["requests"] += 1

        def send(prefix: str, n: int) -> None:
            with ThreadPoolExecutor(FLOOR_IN_FLIGHT) as pool:
                list(pool.map(one, range(n)))
        self.converge("floor", prefix, n, res, send=send)
        res["writes_per_teamspace"] = round(sent["requests"] / n, 2)
        res["delete"] = self.delete_all("floor", prefix, n, send=self.floor_deletions)
        log(f"floor N={n}: {json.dumps(res)}")
        self.cleanup(prefix)
        return res

    def floor_deletions(self, prefix: str, n: int) -> None:
        """The floor of N deletions: each TeamSpace deleted and, as soon as the answer says it
        waits for our finalizer, the writes the plan gives for it (its archive record on this
        machine's disk, flushed, and in a ConfigMap; the finalizer released), sent by the watch
        controller's executor: nothing listed, watched or queued. FLOOR_IN_FLIGHT at a time."""
        archive = Path("/tmp/cnpa-bench-floor-archive")
        shutil.rmtree(archive, ignore_errors=True)
        archive.mkdir(parents=True)
        executor = Executor(self.api, archive_dir=str(archive), archive_namespace=ARCHIVE_NAMESPACE)

        def one(i: int) -> None:
            ts = self.api.request("DELETE", f"/apis/{GROUP}/{VERSION}/{PLURAL}/{prefix}{i:03d}")
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            result = executor.execute(ts, plan(ts, None, None, now), now)
            if result.failed:
                raise ApiError(0, "", f"floor deletion of {prefix}{i:03d}: {result.errors}")

        with ThreadPoolExecutor(FLOOR_IN_FLIGHT) as pool:
            list(pool.map(one, range(n)))

    def lease_holder(self) -> str:
        lease = self.api.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/default/leases/{HA_LEASE}")
        return lease["spec"].get("holderIdentity") or ""

    def run_ha(self, n: int) -> dict:
        """Three watch controllers on one Lease (--ha-timings: lease, renew, retry seconds; the
        unit's defaults are 15, 10, 2). A trial: SIGKILL the leader (it cannot give the Lease up),
        change one TeamSpace's spec at once, time until the change is reconciled (quota and
        status); then start the killed one again as a fresh candidate, so that three run for every
        trial."""
        prefix = f"{TAGS['watch-ha']}{n}-"
        lease_s, renew_s, retry_s = self.args.ha_timings.split(",")
        timings = {"CNPA_LEASE_SECONDS": lease_s, "CNPA_RENEW_SECONDS": renew_s,
                   "CNPA_LEASE_RETRY_SECONDS": retry_s}
        res: dict = {"controller": "watch-ha", "n": n, "lease": HA_LEASE, "candidates": 3,
                     "timings": {"lease_s": float(lease_s), "renew_s": float(renew_s),
                                 "retry_s": float(retry_s)}}
        log(f"watch-ha N={n}: start ({timings})")
        self.start_watch("bench-ha-1", extra_env=timings, fresh_archive=True)
        for i in (2, 3):
            self.start_watch(f"bench-ha-{i}", leader=False, extra_env=timings, fresh_archive=True)
        self.converge("watch-ha", prefix, n, res)
        rng = random.Random(n)
        latencies, takeovers = [], []
        for trial in range(min(self.args.trials, 5)):
            time.sleep(rng.uniform(0, 2.0))  # a random moment of the leader's renew cycle
            leader = self.lease_holder()
            name = f"{prefix}{rng.randrange(n):03d}"
            path = f"/apis/{GROUP}/{VERSION}/{PLURAL}/{name}"
            pods = 1 + (self.raw(path)["spec"]["pods"] % 50)
            t0 = time.monotonic()
            self.stop_watch(leader, kill=True)
            self.api.request("PATCH", path, body={"spec": {"pods": pods}},
                             content_type="application/merge-patch+json")

            def done(path=path, pods=pods) -> bool:
                ts = self.raw(path)
                if not self.status_done(ts):
                    return False
                q = self.raw(f"/api/v1/namespaces/team-{ts['metadata']['name']}/resourcequotas/team-quota")
                return q["spec"]["hard"]["pods"] == str(pods)
            self.wait(done, 120, f"watch-ha trial {trial}: change reconciled", interval=0.1)
            latencies.append(round(time.monotonic() - t0, 3))
            takeovers.append({"killed": leader, "new_leader": self.lease_holder()})
            log(f"watch-ha trial {trial}: {latencies[-1]} s ({takeovers[-1]})")
            self.start_watch(leader, leader=False, extra_env=timings)
        res["leader_lost_s"] = latencies
        res["takeovers"] = takeovers
        self.stop("watch-ha")
        self.cleanup(prefix)
        return res

    # -- main --------------------------------------------------------------------------------
    def run(self) -> None:
        self.create_host()
        try:
            self.setup_host()
            for ds, n, ctl in ((ds, n, ctl) for ds in self.args.datastores
                               for n in self.args.sizes for ctl in self.args.controllers):
                if n > MAX_N.get(ctl, n):
                    log(f"{ctl} N={n}: skipped (runs only up to N={MAX_N[ctl]})")
                    continue
                self.throwaway = n >= FRESH_HOST_FROM
                if ds != self.args.datastore or (self.throwaway and self.host_used):
                    self.args.datastore = ds
                    log(f"{ctl} N={n}: on a new test host ({ds})")
                    testhost.destroy(self.args.instance)
                    self.inst = testhost.create(self.args.instance, wait=True, datastore=ds)
                    self.setup_host()
                self.host_used = True
                # The machine is shared: the load beside every figure says how noisy it is.
                load0 = os.getloadavg()
                started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
                try:
                    res = self.run_one(ctl, n)
                except (TimeoutError, ApiException, ApiError, OSError,
                        subprocess.SubprocessError) as exc:
                    log(f"{ctl} N={n}: FAILED: {exc}")
                    res = {"controller": ctl, "n": n, "error": str(exc)}
                    with contextlib.suppress(Exception):
                        self.stop(ctl)
                    self.cleanup(f"{TAGS[ctl]}{n}-")
                    self.cleanup(f"{TAGS[ctl]}{n}n-")
                res["started"] = started
                res["datastore"] = self.args.datastore
                res["load"] = {"before": [round(x, 2) for x in load0],
                               "after": [round(x, 2) for x in os.getloadavg()]}
                self.results["runs"].append(res)
                self.save()
        finally:
            self.stop_kopf()
            for identity in list(self.watch_procs):
                self.stop_watch(identity)
            if not self.args.keep and self.inst is not None:
                testhost.destroy(self.args.instance)
        from report import write_report  # bench/report.py

        write_report(self.results, ROOT / "docs", " ".join(self.args.argv))

    def save(self) -> None:
        (ROOT / "bench/results.json").write_text(json.dumps(self.results, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1,10,50,200,1000,5000", help="numbers of TeamSpaces")
    parser.add_argument("--controllers", default="reconcile.sh,naive,kopf,watch,floor,watch-ha")
    parser.add_argument("--trials", type=int, default=20, help="quota restore trials per run")
    parser.add_argument("--instance", default="bench", help="test host name (created, destroyed)")
    parser.add_argument("--keep", action="store_true", help="keep the test host afterwards")
    parser.add_argument("--reuse", action="store_true", help="reuse a running host of that name")
    parser.add_argument("--reconcile", default=str(ROOT / "reconcile.sh"),
                        help="controller script to measure (default: this repository's)")
    parser.add_argument("--reconcile-before", default="", metavar="PATH",
                        help="an earlier reconcile.sh (e.g. in a git worktree of an earlier commit), "
                             "measured as controller reconcile.sh-before beside this one")
    parser.add_argument("--merge", action="store_true",
                        help="keep bench/results.json's runs of the other controllers and sizes")
    parser.add_argument("--ha-timings", default="15,10,2",
                        help="watch-ha: CNPA_LEASE_SECONDS,CNPA_RENEW_SECONDS,CNPA_LEASE_RETRY_SECONDS")
    parser.add_argument("--datastores", default="etcd",
                        help="where the host's API server stores, each in turn: etcd (k3s HA's; every "
                             "row before 2026-12-05) and/or kine (SQLite, a single k3s server's)")
    parser.add_argument("--report-only", action="store_true", help="rewrite docs from results.json")
    args = parser.parse_args(argv)
    args.argv = ["bench/run.py", *(argv if argv is not None else sys.argv[1:])]
    args.sizes = [int(x) for x in args.sizes.split(",")]
    args.controllers = args.controllers.split(",")
    args.datastores = args.datastores.split(",")
    if not set(args.datastores) <= set(testhost.DATASTORES):
        parser.error(f"--datastores: each of {', '.join(testhost.DATASTORES)}")
    args.datastore = args.datastores[0]
    sys.path.insert(0, str(ROOT / "bench"))
    if args.report_only:
        from report import write_report

        results = json.loads((ROOT / "bench/results.json").read_text())
        write_report(results, ROOT / "docs", results.get("command", ""))
        return 0
    if os.geteuid() != 0:
        print("run as root (the test host needs it)", file=sys.stderr)
        return 1
    bench = Bench(args)
    if args.merge and (ROOT / "bench/results.json").exists():
        old = json.loads((ROOT / "bench/results.json").read_text())
        redone = {(c, n, ds) for c in args.controllers for n in args.sizes for ds in args.datastores}
        timings = dict(zip(("lease_s", "renew_s", "retry_s"),
                           (float(x) for x in args.ha_timings.split(","))))
        # HA runs with other Lease timings are other rows: both stay.
        bench.results["runs"] = [r for r in old["runs"]
                                 if (r["controller"], r["n"], r.get("datastore", "etcd")) not in redone
                                 or (r["controller"] == "watch-ha" and r.get("timings") != timings)]
        bench.results["sizes"] = sorted(set(old["sizes"]) | set(args.sizes))
        bench.results["servers"] = old.get("servers") or (
            {"etcd": old["server"]} if old.get("server") else {})
        bench.results["earlier"] = [*old.get("earlier", []),
                                    {k: old.get(k) for k in ("command", "started")}]
    bench.results["command"] = " ".join(args.argv)
    bench.results["started"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    bench.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
