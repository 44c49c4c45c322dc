"""Benchmark: reconcile cost versus the number of TeamSpaces.

    sudo bench-venv/bin/python bench/run.py   # N = 1 ... 5,000; writes docs/benchmark.*

bench-venv: the project's .venv plus requirements-bench.txt's kopf and matplotlib (docs/benchmark.md
says how; the shared .venv stays as `dev.py setup` made it).

Creates its own throwaway test host (`python -m testhost`, instance "bench"), makes its audit log
record reads as well as writes (for the admin user only; the shared default policy file is not
touched, only the copy inside this host), installs the CRD and reconcile.sh from this repository
and runs cnpa-op.service rendered from roles/cnpa_controller. Then, for every N and for each
controller - reconcile.sh (the 3 s loop), the naive baseline (bench/naive_reconcile.sh, same unit),
the kopf peer (bench/kopf_peer.py, event-driven) and the watch controller (`python3 -m
cnpa_controller`; like kopf run on this machine against the host's API server) - it
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
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import controllers, measure
from bench.host import (
    ARCHIVE_NAMESPACE,
    EVENT_DRIVEN,
    GROUP,
    HA_LEASE,
    PASS_SCRIPTS,
    PLURAL,
    ROOT,
    TAGS,
    VERSION,
    ApiException,
    BenchHost,
    log,
    new_teamspace,
    testhost,
    wait,
)
from bench.method import FLOOR_IN_FLIGHT, FRESH_HOST_FROM, HA_TIMINGS, MAX_N
from cnpa_controller import ApiError
from cnpa_controller.executor import Executor, request_of, written_key
from cnpa_controller.plan import plan


def script_info(path: Path) -> dict:
    """Which script cnpa-op.service runs (installed by setup_host): path, sha256 prefix, commit."""
    commit = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%h %cI", "--", str(path)],
                            capture_output=True, text=True, check=False)
    return {"script": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()[:12],
            "last_commit": commit.stdout.strip()}


class Bench:
    """The run: every datastore, N and controller in turn, each row's results saved as it ends."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.host: BenchHost | None = None
        self.watch: controllers.Watch | None = None
        self.kopf: controllers.Kopf | None = None
        self.host_used = False  # a row has run on this host
        self.throwaway = False  # this row's host is replaced after it: no cleanup
        self.results: dict = {"sizes": args.sizes, "trials": args.trials, "runs": []}

    def new_host(self, fresh: bool) -> None:
        if fresh:
            testhost.destroy(self.args.instance)
        self.host = BenchHost.create(self.args.instance, self.args.datastore,
                                     self.args.reuse and not fresh)
        before = Path(self.args.reconcile_before) if self.args.reconcile_before else None
        server = self.host.setup(Path(self.args.reconcile), before)
        self.results.setdefault("servers", {})[self.host.inst.datastore()] = server
        self.watch, self.kopf = controllers.Watch(self.host), controllers.Kopf(self.host)

    def controller(self, ctl: str):
        if ctl == "kopf":
            return self.kopf
        if ctl in ("watch", "watch-ha"):
            return self.watch
        return controllers.loop(self.host, ctl)

    def cleanup(self, prefix: str) -> None:
        if not self.throwaway:  # the next row starts on a new host (FRESH_HOST_FROM)
            self.host.cleanup(prefix)

    def run_one(self, ctl: str, n: int) -> dict:
        if ctl == "floor":
            return self.run_floor(n)
        if ctl == "watch-ha":
            return self.run_ha(n)
        host, peer = self.host, self.controller(ctl)
        tag = TAGS[ctl]
        prefix = f"{tag}{n}-"
        res: dict = {"controller": ctl, "n": n}
        log(f"{ctl} N={n}: start")
        if ctl in PASS_SCRIPTS:
            res["script"] = script_info(Path(self.args.reconcile_before if ctl == "reconcile.sh-before"
                                             else self.args.reconcile))
        peer.start()
        k0 = measure.usage(peer.pid()) if ctl in EVENT_DRIVEN else None
        measure.converge(host, ctl, prefix, n, res)
        if k0 is not None:
            res["converge_cpu_s"] = round(measure.usage(peer.pid())[0] - k0[0], 3)
        log(f"{ctl} N={n}: converged in {res['converge_s']} s; restore trials")
        budget = 200 if ctl == "naive" else 150
        res["restore_s"] = measure.restore_trials(host, ctl, prefix, n, self.args.trials, budget, 300)
        if ctl != "naive":  # one naive pass at N = 200 takes minutes: no trials would fit
            res["ready_s"] = measure.ready_trials(host, ctl, f"{tag}{n}n-", self.args.trials,
                                                  budget, 300)
        if ctl in EVENT_DRIVEN:
            res["idle"] = measure.idle_window(host, ctl, peer, n, FRESH_HOST_FROM)
            res["delete"] = measure.delete_all(host, ctl, prefix, n)
            peer.stop()
        else:
            peer.stop()
            reps = 1 if ctl == "naive" and n > 1 else (3 if ctl == "naive" else 5)
            idles = [peer.probe_pass() for _ in range(reps)]
            best = dict(sorted(idles, key=lambda r: r["wall_s"])[len(idles) // 2])  # median
            best["wall_all_s"] = [r["wall_s"] for r in idles]
            best["writes_all"] = [r["writes"] for r in idles]
            res["idle"] = best
            # a pass with work to do: every TeamSpace's spec changed while the service is stopped
            for t in host.teamspaces(prefix):
                host.custom.patch_cluster_custom_object(GROUP, VERSION, PLURAL, t["metadata"]["name"],
                                                        {"spec": {"pods": 1 + (t["spec"]["pods"] % 50)}})
            res["work"] = peer.probe_pass()
            res["work"]["converged_after"] = host.converged(prefix, n)
            if ctl in PASS_SCRIPTS:
                peer.start()
                wait(lambda: host.converged(prefix, n), 300, f"{ctl} N={n} converged again")
                res["delete"] = measure.delete_all(host, ctl, prefix, n)
                peer.stop()
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
        api = self.host.api

        def one(i: int) -> None:
            ts = api.request("POST", f"/apis/{GROUP}/{VERSION}/{PLURAL}",
                                  body=new_teamspace(prefix, i))
            written: dict = {}
            for w in plan(ts, None, None, now):
                method, path, ctype, body = request_of(w, written)
                out = api.request(method, path, body=body, content_type=ctype)
                written[written_key(method, path, body)] = (out["metadata"]["resourceVersion"],
                                                            out["metadata"]["uid"])
                sent["requests"] += 1

        def send(prefix: str, n: int) -> None:
            with ThreadPoolExecutor(FLOOR_IN_FLIGHT) as pool:
                list(pool.map(one, range(n)))
        measure.converge(self.host, "floor", prefix, n, res, send=send)
        res["writes_per_teamspace"] = round(sent["requests"] / n, 2)
        res["delete"] = measure.delete_all(self.host, "floor", prefix, n, send=self.floor_deletions)
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
        api = self.host.api
        executor = Executor(api, archive_dir=str(archive), archive_namespace=ARCHIVE_NAMESPACE)

        def one(i: int) -> None:
            ts = api.request("DELETE", f"/apis/{GROUP}/{VERSION}/{PLURAL}/{prefix}{i:03d}")
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            result = executor.execute(ts, plan(ts, None, None, now), now)
            if result.failed:
                raise ApiError(0, "", f"floor deletion of {prefix}{i:03d}: {result.errors}")

        with ThreadPoolExecutor(FLOOR_IN_FLIGHT) as pool:
            list(pool.map(one, range(n)))

    def lease_holder(self) -> str:
        lease = self.host.api.request(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/default/leases/{HA_LEASE}")
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
        host, watch = self.host, self.watch
        watch.start_one("bench-ha-1", extra_env=timings, fresh_archive=True)
        for i in (2, 3):
            watch.start_one(f"bench-ha-{i}", leader=False, extra_env=timings, fresh_archive=True)
        measure.converge(host, "watch-ha", prefix, n, res)
        rng = random.Random(n)
        latencies, takeovers = [], []
        for trial in range(min(self.args.trials, 5)):
            time.sleep(rng.uniform(0, 2.0))  # a random moment of the leader's renew cycle
            leader = self.lease_holder()
            name = f"{prefix}{rng.randrange(n):03d}"
            path = f"/apis/{GROUP}/{VERSION}/{PLURAL}/{name}"
            pods = 1 + (host.raw(path)["spec"]["pods"] % 50)
            t0 = time.monotonic()
            watch.stop_one(leader, kill=True)
            host.api.request("PATCH", path, body={"spec": {"pods": pods}},
                             content_type="application/merge-patch+json")

            def done(path=path, pods=pods) -> bool:
                ts = host.raw(path)
                if not host.status_done(ts):
                    return False
                q = host.raw(f"/api/v1/namespaces/team-{ts['metadata']['name']}/resourcequotas/team-quota")
                return q["spec"]["hard"]["pods"] == str(pods)
            wait(done, 120, f"watch-ha trial {trial}: change reconciled", interval=0.1)
            latencies.append(round(time.monotonic() - t0, 3))
            takeovers.append({"killed": leader, "new_leader": self.lease_holder()})
            log(f"watch-ha trial {trial}: {latencies[-1]} s ({takeovers[-1]})")
            watch.start_one(leader, leader=False, extra_env=timings)
        res["leader_lost_s"] = latencies
        res["takeovers"] = takeovers
        watch.stop()
        self.cleanup(prefix)
        return res

    def run(self) -> None:
        try:
            self.new_host(fresh=False)
            for ds, n, ctl in ((ds, n, ctl) for ds in self.args.datastores
                               for n in self.args.sizes for ctl in self.args.controllers):
                if n > MAX_N.get(ctl, n):
                    log(f"{ctl} N={n}: skipped (runs only up to N={MAX_N[ctl]})")
                    continue
                self.throwaway = n >= FRESH_HOST_FROM
                if ds != self.args.datastore or (self.throwaway and self.host_used):
                    self.args.datastore = ds
                    log(f"{ctl} N={n}: on a new test host ({ds})")
                    self.new_host(fresh=True)
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
                        if ctl != "floor":
                            self.controller(ctl).stop()
                    self.cleanup(f"{TAGS[ctl]}{n}-")
                    self.cleanup(f"{TAGS[ctl]}{n}n-")
                res["started"] = started
                res["datastore"] = self.args.datastore
                res["load"] = {"before": [round(x, 2) for x in load0],
                               "after": [round(x, 2) for x in os.getloadavg()]}
                self.results["runs"].append(res)
                self.save()
        finally:
            for peer in (self.kopf, self.watch):
                if peer is not None:
                    peer.stop()
            if not self.args.keep and self.host is not None:
                testhost.destroy(self.args.instance)
        from bench.report import write_report

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
    parser.add_argument("--ha-timings", default=",".join(f"{t:g}" for t in HA_TIMINGS.values()),
                        help="watch-ha: CNPA_LEASE_SECONDS,CNPA_RENEW_SECONDS,CNPA_LEASE_RETRY_SECONDS "
                             "(default: the program's)")
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
    if args.report_only:
        from bench.report import write_report

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
