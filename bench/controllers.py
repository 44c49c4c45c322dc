"""The controllers under test, one small class each: start, stop, and what only that kind has
(a pass by hand for a loop; a process on this machine for kopf and the watch controller)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from bench.host import (
    ARCHIVE_NAMESPACE,
    BEFORE_DIR,
    BENCH_DIR,
    HA_LEASE,
    RESYNC_SECONDS,
    ROOT,
    WATCH_AGENT,
    WRITE_VERBS,
    BenchHost,
    wait,
)
from bench.method import PERIOD


class Loop:
    """A script run every PERIOD s by a systemd unit in the host: reconcile.sh, an earlier
    reconcile.sh (--reconcile-before), or the naive baseline."""

    event_driven = False

    def __init__(self, host: BenchHost, unit: str, script: str) -> None:
        self.host, self.unit, self.script = host, unit, script

    def start(self) -> None:
        self.host.sh(f"systemctl start {self.unit}")

    def stop(self) -> None:
        self.host.sh(f"systemctl stop {self.unit}", timeout=60)

    def probe_pass(self) -> dict:
        """One pass by hand with the unit's environment: wall, CPU, peak memory, requests."""
        env = " ".join(self.host.service_env().split())
        off = self.host.audit_offset()
        out = self.host.sh(f"env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "
                           f"{env} python3 {BENCH_DIR}/pass_probe.py {self.script}", timeout=900)
        res = json.loads(out.stdout.strip().splitlines()[-1])
        # kubectl's (the naive script, reconcile.sh before it ran the package) or the package's.
        res["requests"] = self.host.audit_since(off, ("kubectl", WATCH_AGENT))
        res["writes"] = sum(v for k, v in res["requests"].items() if k.split()[0] in WRITE_VERBS)
        # The loop runs a pass, then sleeps PERIOD: its share of a core while idle.
        res["cpu_pct"] = round(100 * res["cpu_s"] / (res["wall_s"] + PERIOD), 1)
        return res


def loop(host: BenchHost, ctl: str) -> Loop:
    if ctl == "naive":
        return Loop(host, "cnpa-naive", f"{BENCH_DIR}/naive_reconcile.sh")
    if ctl == "reconcile.sh-before":
        return Loop(host, "cnpa-before", f"{BEFORE_DIR}/reconcile.sh")
    return Loop(host, "cnpa-op", "/root/cnpa-op/reconcile.sh")


class Kopf:
    """bench/kopf_peer.py under `kopf run` on this machine, against the host's API server."""

    event_driven = True
    agent = "kopf"

    def __init__(self, host: BenchHost) -> None:
        self.host = host
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = dict(os.environ, KUBECONFIG=str(self.host.inst.kubeconfig),
                   CNPA_ARCHIVE_DIR="/tmp/cnpa-bench-kopf-archive")
        self.log = open("/tmp/cnpa-bench-kopf.log", "ab")  # noqa: SIM115 - child's stdout
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kopf", "run", "--standalone", "--all-namespaces", "--quiet",
             f"--liveness=http://127.0.0.1:{port}/healthz", str(ROOT / "bench/kopf_peer.py")],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

        def alive() -> bool:
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).status == 200
            except OSError:
                return False
        wait(alive, 60, "kopf liveness")
        time.sleep(2)  # watches established

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        self.log.close()

    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


class Watch:
    """`python3 -m cnpa_controller` processes on this machine (one, or the HA run's three)."""

    event_driven = True
    agent = WATCH_AGENT

    def __init__(self, host: BenchHost) -> None:
        self.host = host
        self.procs: dict[str, subprocess.Popen] = {}  # identity -> process
        self.synced: dict[str, float] = {}  # identity -> monotonic time its caches synced

    def start(self) -> None:
        self.start_one("bench-watch", fresh_archive=True)

    def stop(self) -> None:
        for identity in list(self.procs):
            self.stop_one(identity)

    def pid(self) -> int:
        return next(iter(self.procs.values())).pid

    def start_one(self, identity: str, lease: str = HA_LEASE, leader: bool = True,
                  extra_env: dict | None = None, fresh_archive: bool = False) -> None:
        """One process as installed in watch mode (leader election on, default resync and
        workers), with the admin kubeconfig: its requests are the admin user's in the audit log,
        told apart by the user agent cnpa-controller/IDENTITY. leader: wait until it leads (a
        Lease left by an earlier process that was stopped cleanly is released at once).
        fresh_archive: an empty archive directory, as the floor's: records of earlier runs under
        the same names made each deletion keep the earlier record too (a second durable write),
        so the delete row did more than the floor it is compared with."""
        archive = Path(f"/tmp/cnpa-bench-watch/{identity}/archive")
        if fresh_archive:
            shutil.rmtree(archive, ignore_errors=True)
        archive.mkdir(parents=True, exist_ok=True)  # it must exist (exit 4 otherwise)
        err = Path(f"/tmp/cnpa-bench-watch/{identity}/stderr.log")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
               "KUBECONFIG": str(self.host.inst.kubeconfig),
               "CNPA_ARCHIVE_DIR": str(archive), "CNPA_ARCHIVE_NAMESPACE": ARCHIVE_NAMESPACE,
               "CNPA_LEADER_ELECTION": "1",
               "CNPA_LEASE_NAME": lease, "CNPA_LEASE_IDENTITY": identity, **(extra_env or {})}
        with open(err.with_name("stdout.log"), "ab") as out, open(err, "wb") as errf:
            self.procs[identity] = subprocess.Popen(
                [sys.executable, "-m", "cnpa_controller"], cwd=ROOT, env=env,
                stdout=out, stderr=errf, stdin=subprocess.DEVNULL, start_new_session=True)
        proc = self.procs[identity]
        # Its resync timer starts when its caches have synced (at once: no TeamSpace yet), which
        # is before it leads: on a host without the Lease the first candidate makes it only once
        # it has been missing for a lease (leader.py), so timing from "became the leader" put
        # the predicted resync late and the idle window on the resync.
        wait(lambda: "caches synced" in err.read_text() or proc.poll() is not None, 90,
             f"watch controller {identity}: caches synced")
        self.synced[identity] = time.monotonic()
        news = "became the leader" if leader else "caches synced"
        wait(lambda: news in err.read_text() or proc.poll() is not None, 90,
             f"watch controller {identity}: {news}")
        if proc.poll() is not None:
            raise subprocess.SubprocessError(f"watch controller {identity} exited: {err.read_text()}")

    def stop_one(self, identity: str, kill: bool = False) -> None:
        """SIGTERM (it gives the Lease up) or, for the HA run, SIGKILL (it cannot)."""
        proc = self.procs.pop(identity, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def next_resync(self) -> float:
        """Monotonic time of the next resync (every RESYNC_SECONDS from the moment its caches
        synced)."""
        synced = next(iter(self.synced.values()))
        return synced + RESYNC_SECONDS * (1 + int((time.monotonic() - synced) // RESYNC_SECONDS))
