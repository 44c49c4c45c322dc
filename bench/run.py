"""Benchmark: reconcile cost versus the number of TeamSpaces (issue 5).

    sudo .venv/bin/python bench/run.py            # N = 1, 10, 50, 200; writes docs/benchmark.*

Creates its own throwaway test host (`python -m testhost`, instance "bench"), makes its audit log
record reads as well as writes (for the admin user only; the shared default policy file is not
touched, only the copy inside this host), installs the CRD and reconcile.sh from this repository
and runs cnpa-op.service rendered from roles/cnpa_controller. Then, for every N and for each of
three controllers - reconcile.sh, the naive baseline (bench/naive_reconcile.sh, same unit) and the
kopf peer (bench/kopf_peer.py, event-driven) - it measures:

  converge   create N TeamSpaces, time until every one has its namespace (owned by it), its
             quota (pods as in the spec) and status.observedGeneration == generation;
  restore    delete one quota at a random moment of the loop, time until a new one exists;
  idle pass  the service stopped, one pass by hand with nothing to do: wall time, requests by
             verb from the audit log, writes, CPU time and peak memory (kopf: a 3 s idle window);
  work pass  the service stopped, every TeamSpace's spec.pods changed, one pass by hand.

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
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jinja2  # noqa: E402  (ships with ansible-core, in requirements.txt)
import kubernetes  # noqa: E402
import yaml  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from testhost import instance as testhost  # noqa: E402

GROUP, VERSION, PLURAL = "platform.labhub.io", "v1alpha1", "teamspaces"
LABEL = f"{GROUP}/teamspace"
FINALIZER = f"{GROUP}/cleanup"
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}
HOST_KUBECONFIG = "/etc/rancher/k3s/k3s.yaml"
BENCH_DIR = "/root/cnpa-bench"  # inside the host: probe, naive script
PERIOD = 3.0
TAGS = {"reconcile.sh": "r", "naive": "n", "kopf": "k"}  # TeamSpace name prefixes

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
        log(f"creating test host {name}")
        self.inst = testhost.create(name, wait=True)

    def setup_host(self) -> None:
        assert self.inst is not None
        versions = json.loads(self.sh("kubectl version -o json").stdout)
        etcd = self.sh("etcd --version | head -1").stdout.split(":")[-1].strip()
        self.results["server"] = {"kubernetes": versions["serverVersion"]["gitVersion"],
                                  "kubectl": versions["clientVersion"]["gitVersion"], "etcd": etcd}
        log(f"server: {self.results['server']}")
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
        self.put("/root/cnpa-op/reconcile.sh", Path(self.args.reconcile).read_text(), "0755")
        plan = Path(self.args.reconcile).with_name("cnpa_plan.py")  # its plan module, if it has one
        if plan.exists():
            self.put("/root/cnpa-op/cnpa_plan.py", plan.read_text())
        self.put(f"{BENCH_DIR}/naive_reconcile.sh", (ROOT / "bench/naive_reconcile.sh").read_text(),
                 "0755")
        self.put(f"{BENCH_DIR}/pass_probe.py", (ROOT / "bench/pass_probe.py").read_text())
        self.put("/etc/systemd/system/cnpa-op.service", self.unit("/root/cnpa-op/reconcile.sh"))
        self.put("/etc/systemd/system/cnpa-naive.service",
                 self.unit(f"{BENCH_DIR}/naive_reconcile.sh"))
        self.sh("systemctl daemon-reload")
        kubernetes.config.load_kube_config(config_file=str(self.inst.kubeconfig))
        cfg = kubernetes.client.Configuration.get_default_copy()
        cfg.connection_pool_maxsize = 16
        api = kubernetes.client.ApiClient(cfg)
        self.core = kubernetes.client.CoreV1Api(api)
        self.custom = kubernetes.client.CustomObjectsApi(api)
        # a reused host may hold a previous run's controllers and objects: start from nothing
        self.sh("systemctl stop cnpa-op cnpa-naive", check=False)
        self.cleanup("")

    def unit(self, script: str) -> str:
        """cnpa-op.service exactly as roles/cnpa_controller renders it (role defaults)."""
        tpl = ROOT / "roles/cnpa_controller/templates/cnpa-op.service.j2"
        values: dict = {"ansible_managed": "rendered by bench/run.py"}
        for f in ("roles/cnpa/defaults/main.yml", "roles/cnpa_controller/defaults/main.yml"):
            p = ROOT / f
            if p.exists():
                values.update(yaml.safe_load(p.read_text()) or {})
        values.setdefault("cnpa_controller_period", 3)
        values.setdefault("cnpa_controller_restart_sec", 1)
        values["cnpa_kubeconfig"] = values.get("cnpa_kubeconfig", HOST_KUBECONFIG)
        for _ in range(3):  # defaults refer to each other ("{{ cnpa_base_dir }}/archive")
            values = {k: jinja2.Template(v).render(values) if isinstance(v, str) else v
                      for k, v in values.items()}
        values["cnpa_script"] = script
        # The role's least-privilege ServiceAccount kubeconfig is made by the role; the benchmark
        # runs the unit with the admin kubeconfig (its requests are the admin user's in the audit).
        values["cnpa_controller_unit_kubeconfig"] = HOST_KUBECONFIG
        values["cnpa_controller_least_privilege"] = False
        if not tpl.exists():  # the spec's unit, if the role is not there
            return ("[Service]\nEnvironment=KUBECONFIG=/etc/rancher/k3s/k3s.yaml\n"
                    f"ExecStart=/bin/bash -c 'while true; do {script}; sleep 3; done'\n"
                    "Restart=always\n")
        env = jinja2.Environment()
        env.filters["bool"] = lambda v: str(v).lower() in ("1", "true", "yes", "on")
        return env.from_string(tpl.read_text()).render(values)

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

    def audit_since(self, offset: int, agent: str) -> dict:
        """Requests of the admin user whose user agent starts with `agent`, by verb."""
        assert self.inst is not None
        time.sleep(0.5)  # let the API server flush the last lines
        with open(self.inst.root / "var/log/kubernetes/audit.log", "rb") as fh:
            fh.seek(offset)
            lines = fh.read().splitlines()
        verbs: dict[str, int] = {}
        for line in lines:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("user", {}).get("username") != "admin" or ev.get("stage") == "ResponseStarted":
                continue
            if not ev.get("userAgent", "").startswith(agent):
                continue
            ref = ev.get("objectRef", {})
            uri = ev.get("requestURI", "")
            if ref.get("resource"):
                key = ev["verb"]
            else:  # kubectl's own reads: API discovery (/api, /apis/...) and OpenAPI schemas
                key = f"{ev['verb']} ({'openapi' if uri.startswith('/openapi') else 'discovery'})"
            verbs[key] = verbs.get(key, 0) + 1
        return dict(sorted(verbs.items()))

    def teamspaces(self, prefix: str) -> list[dict]:
        items = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]
        return [t for t in items if t["metadata"]["name"].startswith(prefix)]

    def converged(self, prefix: str, n: int) -> bool:
        ts = self.teamspaces(prefix)
        nss = {ns.metadata.name: ns for ns in self.core.list_namespace(label_selector=LABEL).items}
        quotas = {q.metadata.namespace: q for q in self.core.list_resource_quota_for_all_namespaces(
            field_selector="metadata.name=team-quota").items}
        if len(ts) != n:
            return False
        for t in ts:
            m, nsname = t["metadata"], f"team-{t['metadata']['name']}"
            st = t.get("status") or {}
            ns, q = nss.get(nsname), quotas.get(nsname)
            if st.get("observedGeneration") != m["generation"] or st.get("namespace") != nsname:
                return False
            if ns is None or m["uid"] not in [o.uid for o in ns.metadata.owner_references or []]:
                return False
            if q is None or (q.spec.hard or {}).get("pods") != str(t["spec"]["pods"]):
                return False
        return True

    # -- controllers -------------------------------------------------------------------------
    def start(self, ctl: str) -> None:
        if ctl == "kopf":
            self.start_kopf()
            return
        self.sh(f"systemctl start {self.unit_name(ctl)}")

    def stop(self, ctl: str) -> None:
        if ctl == "kopf":
            self.stop_kopf()
        else:
            self.sh(f"systemctl stop {self.unit_name(ctl)}", timeout=60)

    @staticmethod
    def unit_name(ctl: str) -> str:
        return "cnpa-naive" if ctl == "naive" else "cnpa-op"

    def start_kopf(self) -> None:
        assert self.inst is not None
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = dict(os.environ, KUBECONFIG=str(self.inst.kubeconfig),
                   CNPA_ARCHIVE_DIR="/tmp/cnpa-bench-kopf-archive")
        self.kopf_log = open("/tmp/cnpa-bench-kopf.log", "ab")  # noqa: SIM115 - child's stdout
        self.kopf_proc = subprocess.Popen(
            [str(ROOT / ".venv/bin/kopf"), "run", "--standalone", "--all-namespaces", "--quiet",
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

    def kopf_usage(self) -> tuple[float, float]:
        """(CPU seconds so far, peak RSS MiB) of the kopf process."""
        assert self.kopf_proc is not None
        pid = self.kopf_proc.pid
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        hwm = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if ln.startswith("VmHWM"))
        return cpu, int(hwm.split()[1]) / 1024

    # -- one controller at one N -------------------------------------------------------------
    def create_teamspaces(self, prefix: str, n: int) -> None:
        def one(i: int) -> None:
            self.custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "TeamSpace",
                "metadata": {"name": f"{prefix}{i:03d}"},
                "spec": {"pods": 1 + i % 50, "cpu": "500m" if i % 2 else "1"}})
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, range(n)))

    def probe_pass(self, ctl: str) -> dict:
        script = f"{BENCH_DIR}/naive_reconcile.sh" if ctl == "naive" else "/root/cnpa-op/reconcile.sh"
        env = " ".join(self.service_env().split())
        off = self.audit_offset()
        out = self.sh(f"env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "
                      f"{env} python3 {BENCH_DIR}/pass_probe.py {script}", timeout=900)
        res = json.loads(out.stdout.strip().splitlines()[-1])
        res["requests"] = self.audit_since(off, "kubectl")
        res["writes"] = sum(v for k, v in res["requests"].items() if k.split()[0] in WRITE_VERBS)
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
            self.wait(back, bound, f"{ctl}: quota in {ns} restored", interval=0.05)
            latencies.append(round(time.monotonic() - t0, 3))
        return latencies

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
            self.wait(lambda: not self.teamspaces(prefix) and not [
                ns for ns in self.core.list_namespace(label_selector=LABEL).items], 300,
                "namespaces gone", interval=1)
        except TimeoutError as exc:
            log(f"warning: {exc}")

    def run_one(self, ctl: str, n: int) -> dict:
        tag = TAGS[ctl]
        prefix = f"{tag}{n}-"
        res: dict = {"controller": ctl, "n": n}
        log(f"{ctl} N={n}: start")
        if ctl == "reconcile.sh":
            res["script"] = script_info(Path(self.args.reconcile))
        self.start(ctl)
        k0 = self.kopf_usage() if ctl == "kopf" else None
        t0 = time.monotonic()
        self.create_teamspaces(prefix, n)
        res["create_s"] = round(time.monotonic() - t0, 3)
        bound = 1200 if ctl == "naive" else 300
        self.wait(lambda: self.converged(prefix, n), bound, f"{ctl} N={n} converged", interval=0.2)
        res["converge_s"] = round(time.monotonic() - t0, 3)
        if k0 is not None:
            k1 = self.kopf_usage()
            res["converge_cpu_s"] = round(k1[0] - k0[0], 3)
        log(f"{ctl} N={n}: converged in {res['converge_s']} s; restore trials")
        budget = 200 if ctl == "naive" else 150
        res["restore_s"] = self.restore_trials(ctl, prefix, n, budget, bound)
        if ctl == "kopf":
            cpu0, _ = self.kopf_usage()
            off = self.audit_offset()
            time.sleep(PERIOD)
            cpu1, rss = self.kopf_usage()
            reqs = self.audit_since(off, "kopf")
            res["idle"] = {"wall_s": None, "cpu_s": round(cpu1 - cpu0, 4), "maxrss_mib": round(rss, 1),
                           "requests": reqs, "writes": sum(v for k, v in reqs.items()
                                                           if k.split()[0] in WRITE_VERBS),
                           "note": f"requests and CPU over a {PERIOD:.0f} s idle window"}
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
        log(f"{ctl} N={n}: {json.dumps({k: v for k, v in res.items() if k != 'restore_s'})}")
        self.cleanup(prefix)
        return res

    # -- main --------------------------------------------------------------------------------
    def run(self) -> None:
        self.create_host()
        try:
            self.setup_host()
            for n in self.args.sizes:
                for ctl in self.args.controllers:
                    try:
                        self.results["runs"].append(self.run_one(ctl, n))
                    except (TimeoutError, ApiException, subprocess.SubprocessError) as exc:
                        log(f"{ctl} N={n}: FAILED: {exc}")
                        self.results["runs"].append({"controller": ctl, "n": n, "error": str(exc)})
                        with contextlib.suppress(Exception):
                            self.stop(ctl)
                        self.cleanup(f"{TAGS[ctl]}{n}-")
                    self.save()
        finally:
            self.stop_kopf()
            if not self.args.keep and self.inst is not None:
                testhost.destroy(self.args.instance)
        from report import write_report  # bench/report.py

        write_report(self.results, ROOT / "docs", " ".join(self.args.argv))

    def save(self) -> None:
        (ROOT / "bench/results.json").write_text(json.dumps(self.results, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1,10,50,200", help="numbers of TeamSpaces")
    parser.add_argument("--controllers", default="reconcile.sh,naive,kopf")
    parser.add_argument("--trials", type=int, default=20, help="quota restore trials per run")
    parser.add_argument("--instance", default="bench", help="test host name (created, destroyed)")
    parser.add_argument("--keep", action="store_true", help="keep the test host afterwards")
    parser.add_argument("--reuse", action="store_true", help="reuse a running host of that name")
    parser.add_argument("--reconcile", default=str(ROOT / "reconcile.sh"),
                        help="controller script to measure (default: this repository's)")
    parser.add_argument("--merge", action="store_true",
                        help="keep bench/results.json's runs of the other controllers")
    parser.add_argument("--report-only", action="store_true", help="rewrite docs from results.json")
    args = parser.parse_args(argv)
    args.argv = ["bench/run.py", *(argv if argv is not None else sys.argv[1:])]
    args.sizes = [int(x) for x in args.sizes.split(",")]
    args.controllers = args.controllers.split(",")
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
        bench.results["runs"] = [r for r in old["runs"] if r["controller"] not in args.controllers]
        bench.results["sizes"] = sorted(set(old["sizes"]) | set(args.sizes))
        bench.results["earlier"] = [*old.get("earlier", []),
                                    {k: old.get(k) for k in ("command", "started")}]
    bench.results["command"] = " ".join(args.argv)
    bench.results["started"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    bench.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
