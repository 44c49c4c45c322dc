"""The watch controller on three hosts (one Lease, one API server) under faults (issue 13).

playbooks/controller.yml installs it on the three hosts of the `inventory` fixture (watch mode,
leader election, archive records also as ConfigMaps). Each test then breaks one thing while a
background workload keeps creating TeamSpaces, editing their quota spec and deleting some, and,
right at the fault, edits a probe TeamSpace: the change made while the leader is lost.
After each fault, bounded waits, then:
- nothing lost: every TeamSpace of these tests Ready with its namespace and exactly the quota its
  spec says, every creation and edit of the workload there;
- nothing duplicated: deleted TeamSpaces gone with their namespaces, exactly one archive ConfigMap
  per deleted uid (and none for a live one);
- one writer at a time, from A's audit log: every write of a controller process (userAgent
  cnpa-controller/IDENTITY) comes from the identity whose successful Lease write is the latest
  before it; so a write by X after Y's is preceded by X's takeover, and a killed, frozen or
  powered-off leader writes nothing after the takeover.
Takeover and reconcile times are printed and written to $CNPA_MULTIHOST_REPORT (default
/tmp/cnpa-multihost-report.json), never asserted: only bounds that stop a hang are.
Faults of the leader's host (freeze, power off) need the leader on B or C: A holds the API server.
Last, playbooks/uninstall.yml on the three hosts, on the state the faults left.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import time
from pathlib import Path

import mhlib
import pytest
from hostlib import ROOT, Host, wait_for
from mhlib import TS, Workload, holder, host_of, one_writer, unit

# Every TeamSpace of this module's run (other tests, and earlier runs on reused hosts, may share
# the hosts): wf<run>-.
PREFIX = f"wf{int(time.time()) % 46656:x}"
report: dict = {}


def epoch(rfc3339: str) -> float:
    return datetime.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def rfc3339(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Cluster:
    def __init__(self, hosts: list[Host], since: str) -> None:
        self.hosts, self.a, self.since = hosts, hosts[0], since
        env = unit(self.a, "Environment")
        self.archive_configmaps = "CNPA_ARCHIVE_NAMESPACE=" in env
        # The installed lease duration (the role's cnpa_controller_lease_seconds).
        self.lease_seconds = int(env.split("CNPA_LEASE_SECONDS=", 1)[1].split()[0])
        self.workloads: list[Workload] = []
        self.probes = 0

    def leader(self) -> tuple[Host, str]:
        ident = wait_for(lambda: holder(self.a), timeout=60, interval=0.5, what="a Lease holder")
        return host_of(ident, self.hosts), ident

    def lead_elsewhere_than(self, avoid: Host) -> tuple[Host, str]:
        """The leader, on another host than avoid: if avoid leads, its controller is stopped (it
        releases the Lease, another takes it) and started again as a follower."""
        host, ident = self.leader()
        if host is not avoid:
            return host, ident
        avoid.sh("systemctl stop cnpa-op")
        wait_for(lambda: holder(self.a) not in ("", ident), timeout=60, interval=0.5,
                 what="another host taking the released Lease")
        avoid.sh("systemctl start cnpa-op")
        return self.leader()

    def workload(self, name: str) -> Workload:
        wl = Workload(self.a, f"{PREFIX}-{name}", seed=len(self.workloads))
        self.workloads.append(wl)
        return wl

    def probe(self) -> tuple[str, int]:
        """A TeamSpace converged before the fault; returns its name and the next pods value."""
        self.probes += 1
        name = f"{PREFIX}-probe{self.probes}"
        self.a.apply({"apiVersion": f"{mhlib.GROUP}/v1alpha1", "kind": "TeamSpace",
                      "metadata": {"name": name}, "spec": {"pods": 3}})
        wait_for(lambda: self.probe_done(name, 3), timeout=60, interval=0.5,
                 what=f"{name} converged before the fault")
        return name, 4

    def probe_change(self, name: str, pods: int) -> float:
        self.a.kubectl("patch", TS, name, "--type", "merge", "-p", json.dumps({"spec": {"pods": pods}}))
        return time.time()

    def probe_done(self, name: str, pods: int) -> bool:
        proc = self.a.kubectl("get", "resourcequota", "team-quota", "-n", f"team-{name}", "-o",
                              "jsonpath={.spec.hard.pods}", check=False)
        if proc.returncode or proc.stdout != str(pods):
            return False
        t = json.loads(self.a.kubectl("get", TS, name, "-o", "json").stdout)
        return t.get("status", {}).get("observedGeneration") == t["metadata"]["generation"]

    def wait_probe(self, name: str, pods: int, since: float, *, timeout: float = 90) -> float:
        wait_for(lambda: self.probe_done(name, pods), timeout=timeout, interval=0.5,
                 what=f"the change of {name} made at the fault reconciled")
        return time.time() - since

    def requests(self) -> list[dict]:
        return mhlib.controller_requests(self.a)

    def check(self, what: str) -> dict:
        """Converged (bounded), then nothing lost or duplicated, one writer at a time."""
        seconds = mhlib.wait_clean(self.a, self.workloads, self.archive_configmaps, timeout=120,
                                   only=f"{PREFIX}-")
        violations, takeovers = one_writer(self.requests(), self.since)
        assert not violations, f"{what}: more than one writer: {violations[:10]}"
        ours = self.workloads
        out = {"converged_after_s": round(seconds, 1), "takeovers_so_far": len(takeovers),
               "workload_ops": sum(len(wl.ops) for wl in ours),
               "workload_failed_ops": sum(wl.failed for wl in ours),
               "deleted_so_far": sum(len(wl.deleted) for wl in ours)}
        return out

    def takeover_after(self, t_fault: float, old: str) -> tuple[float, str]:
        """Seconds from the fault to the first successful Lease write of another identity, and
        that identity (from the audit log: the API server's clock, this machine's)."""
        for e in self.requests():
            if mhlib.is_lease_write(e) and mhlib.ok(e) and e["identity"] != old \
                    and epoch(e["requestReceivedTimestamp"]) >= t_fault:
                return epoch(e["requestReceivedTimestamp"]) - t_fault, e["identity"]
        raise AssertionError(f"no takeover from {old} in the audit log")

    def after_takeover(self, old: str, t_takeover: float) -> list[str]:
        """What the old identity sent after the takeover other than failed Lease writes and
        Events about the Lease: must be nothing."""
        return [f"{e['requestReceivedTimestamp']} {e['verb']} {e['requestURI']} "
                f"({e.get('responseStatus', {}).get('code')})"
                for e in self.requests()
                if e["identity"] == old and epoch(e["requestReceivedTimestamp"]) >= t_takeover
                and not mhlib.is_election_news(e) and not (mhlib.is_lease_write(e) and not mhlib.ok(e))]


@pytest.fixture(scope="module")
def cluster(hosts, inventory):
    since = rfc3339(time.time())
    t0 = time.monotonic()
    env = dict(os.environ, PATH=f"{ROOT / '.venv/bin'}:/usr/bin:/bin", ANSIBLE_FORCE_COLOR="0")
    # CNPA_MULTIHOST_INSTALLED=1 (with CNPA_MULTIHOST_REUSE=1, while developing): hosts on which
    # this playbook ran already.
    if os.environ.get("CNPA_MULTIHOST_INSTALLED") != "1":
        proc = subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(inventory),
                               str(ROOT / "playbooks/controller.yml")],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
                              check=False)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    report["install_s"] = round(time.monotonic() - t0, 1)
    for h in hosts:
        wait_for(lambda h=h: unit(h, "ActiveState") == "active", timeout=60, interval=0.5,
                 what=f"cnpa-op active on {h.inst.name}")
    c = Cluster(hosts, since)
    assert c.archive_configmaps, "the unit does not set CNPA_ARCHIVE_NAMESPACE"
    c.leader()
    yield c
    path = Path(os.environ.get("CNPA_MULTIHOST_REPORT", "/tmp/cnpa-multihost-report.json"))
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nmulti-host fault measurements: {path}\n{json.dumps(report, indent=2)}")


def api_sockets(pids: list[int], port: int) -> set[str]:
    """Local addresses (IP:PORT) of the established connections of these processes to the API."""
    out = subprocess.run(["ss", "-Htnp", "state", "established", "dst", f"127.0.0.1:{port}"],
                         capture_output=True, text=True, check=True, timeout=10).stdout
    found = set()
    for line in out.splitlines():
        if any(f"pid={p}," in line for p in pids):
            found.add(line.split()[2])
    return found


def test_watches_cut(cluster):
    """(5) Every connection of the leader's controller to the API server (its three watches among
    them) destroyed at the socket (ss -K: the kernel aborts them as a reset would): it must notice,
    watch again, and serve the change made right after without waiting for its resync (300 s)."""
    c = cluster
    name, pods = c.probe()
    port = c.a.inst.ports["apiserver"]
    with c.workload("cut"):
        time.sleep(3)
        leader, ident = c.leader()
        pids = mhlib.unit_pids(leader.inst)
        before = api_sockets(pids, port)
        assert len(before) >= 3, f"{leader.inst.name}'s controller {pids}: connections {before}"
        for local in before:
            ip, lport = local.rsplit(":", 1)
            subprocess.run(["ss", "-K", "dst", f"127.0.0.1:{port}", "src", f"{ip}:{lport}"],
                           capture_output=True, check=True, timeout=10)
        t_fault = c.probe_change(name, pods)
        # The very sockets are gone (the cut happened), the same process lives on.
        assert not before & api_sockets(pids, port)
        reconciled = c.wait_probe(name, pods, t_fault)
        time.sleep(3)
    out = c.check("watches cut")
    assert mhlib.unit_pids(leader.inst) == pids, "the controller restarted instead of watching again"
    report["watches_cut"] = out | {"connections_cut": len(before), "leader_before": ident,
                                   "leader_after": holder(c.a),
                                   "change_reconciled_s": round(reconciled, 1)}
    print(report["watches_cut"])


def test_leader_killed(cluster):
    """(1) SIGKILL to the leader's controller process (systemd restarts it, as a new identity):
    another identity takes the Lease, and the dead one wrote nothing after that."""
    c = cluster
    name, pods = c.probe()
    with c.workload("kill"):
        time.sleep(3)
        leader, ident = c.leader()
        restarts = int(unit(leader, "NRestarts"))
        leader.sh("systemctl kill -s SIGKILL --kill-whom=main cnpa-op")
        t_fault = c.probe_change(name, pods)
        wait_for(lambda: holder(c.a) not in ("", ident), timeout=60, interval=0.5,
                 what=f"a takeover from {ident}")
        reconciled = c.wait_probe(name, pods, t_fault)
        time.sleep(3)
    out = c.check("leader killed")
    takeover, new = c.takeover_after(t_fault, ident)
    assert int(unit(leader, "NRestarts")) > restarts and unit(leader, "ActiveState") == "active"
    assert not c.after_takeover(ident, t_fault + takeover)
    report["leader_killed"] = out | {"leader": ident, "new_leader": new,
                                     "takeover_s": round(takeover, 1),
                                     "change_reconciled_s": round(reconciled, 1)}
    print(report["leader_killed"])


def test_api_server_restarted(cluster):
    """(4) A's kube-apiserver restarted while the workload runs (its requests fail meanwhile):
    everything converges, the change made once the API is back is served, one writer throughout."""
    c = cluster
    name, pods = c.probe()
    with c.workload("api"):
        time.sleep(3)
        _, ident = c.leader()
        t0 = time.time()
        c.a.sh("systemctl restart kube-apiserver", timeout=120)
        wait_for(lambda: c.a.kubectl("get", "--raw", "/readyz", check=False).stdout == "ok",
                 timeout=120, interval=0.5, what="A's API server ready again")
        t_back = c.probe_change(name, pods)
        reconciled = c.wait_probe(name, pods, t_back)
        time.sleep(3)
    out = c.check("API server restarted")
    report["api_server_restarted"] = out | {
        "api_away_s": round(t_back - t0, 1), "leader_before": ident, "leader_after": holder(c.a),
        "change_after_return_reconciled_s": round(reconciled, 1)}
    print(report["api_server_restarted"])


def test_leader_host_frozen(cluster):
    """(2) The leader's whole host frozen (cgroup.freeze) past the lease, then thawed: another
    takes over meanwhile; the same process, thawed, comes back as a follower and writes nothing
    (its fence lapsed while it was frozen)."""
    c = cluster
    name, pods = c.probe()
    leader, ident = c.lead_elsewhere_than(c.a)
    pid, restarts = unit(leader, "MainPID"), unit(leader, "NRestarts")
    with c.workload("freeze"):
        time.sleep(3)
        assert holder(c.a) == ident, "the leader changed before the fault"
        mhlib.freeze(leader.inst, True)
        try:
            t_fault = c.probe_change(name, pods)
            wait_for(lambda: holder(c.a) not in ("", ident), timeout=60, interval=0.5,
                     what=f"a takeover from the frozen {ident}")
            reconciled = c.wait_probe(name, pods, t_fault)
            # Frozen for longer than the lease, whatever the takeover took.
            time.sleep(max(0.0, t_fault + c.lease_seconds + 3 - time.time()))
        finally:
            mhlib.freeze(leader.inst, False)
        frozen = time.time() - t_fault
        time.sleep(8)  # a few of its retry periods (2 s) awake: time to write, were it to
    out = c.check("leader host frozen")
    takeover, new = c.takeover_after(t_fault, ident)
    assert (unit(leader, "MainPID"), unit(leader, "NRestarts")) == (pid, restarts), \
        "the frozen controller did not live on (restarted?)"
    assert holder(c.a) != ident, "the thawed controller took the Lease back"
    journal = leader.sh(f"journalctl -u cnpa-op --no-pager -o cat _PID={pid}").stdout
    assert "lost the leadership; not writing" in journal, journal[-2000:]
    late = c.after_takeover(ident, t_fault + takeover)
    assert not late, f"the thawed leader wrote after the takeover: {late}"
    report["leader_host_frozen"] = out | {
        "leader": ident, "new_leader": new, "frozen_s": round(frozen, 1),
        "takeover_s": round(takeover, 1), "change_reconciled_s": round(reconciled, 1)}
    print(report["leader_host_frozen"])


def test_leader_host_powered_off(cluster):
    """(3) The leader's host powered off hard (every process killed at once: a clean poweroff
    stops the service, which gives the Lease up, as systemctl stop does), later booted again:
    another takes over once the lease has run out; the host comes back with a new controller
    process, as a follower."""
    c = cluster
    name, pods = c.probe()
    leader, ident = c.lead_elsewhere_than(c.a)
    with c.workload("off"):
        time.sleep(3)
        assert holder(c.a) == ident, "the leader changed before the fault"
        t_fault = time.time()
        mhlib.power_off(leader.inst, hard=True)
        c.probe_change(name, pods)
        wait_for(lambda: holder(c.a) not in ("", ident), timeout=60, interval=0.5,
                 what=f"a takeover from the powered-off {ident}")
        reconciled = c.wait_probe(name, pods, t_fault)
        booted = mhlib.power_on(leader, c.a)
        wait_for(lambda: unit(leader, "ActiveState") == "active", timeout=90, interval=0.5,
                 what=f"cnpa-op active on {leader.inst.name} after boot")
        time.sleep(5)
    out = c.check("leader host powered off")
    takeover, new = c.takeover_after(t_fault, ident)
    assert not c.after_takeover(ident, t_fault + takeover)
    back = host_of(holder(c.a), c.hosts)
    journal = leader.sh("journalctl -b -u cnpa-op --no-pager -o cat").stdout
    assert "caches synced" in journal, journal[-2000:]
    report["leader_host_powered_off"] = out | {
        "leader": ident, "new_leader": new, "leader_after_boot": back.inst.name,
        "takeover_s": round(takeover, 1), "change_reconciled_s": round(reconciled, 1),
        "boot_to_api_s": round(booted, 1)}
    print(report["leader_host_powered_off"])


def test_uninstall_on_three_hosts(cluster, inventory):
    """Last, on the state the faults left: playbooks/uninstall.yml on the three hosts. The first
    host stops every host's controller, then archives and deletes every TeamSpace once (each
    live uid has exactly one record, on one host); every host's unit goes, and the CRD."""
    c = cluster
    live = {o["metadata"]["uid"]: o["metadata"]["name"] for o in c.a.get(TS)["items"]}
    assert live, "no TeamSpace left to uninstall"
    env = dict(os.environ, PATH=f"{ROOT / '.venv/bin'}:/usr/bin:/bin", ANSIBLE_FORCE_COLOR="0")
    proc = subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(inventory),
                           str(ROOT / "playbooks/uninstall.yml"),
                           "-e", "cnpa_controller_delete_teamspaces=true"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200, check=False)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
    assert not c.a.exists("crd", TS), "the CRD is still there"
    records: dict[str, list[str]] = {}
    for h in c.hosts:
        assert h.sh("test -e /etc/systemd/system/cnpa-op.service", check=False).returncode != 0, \
            f"cnpa-op.service is still on {h.inst.name}"
        uids = json.loads(h.sh(
            "python3 -c 'import glob, json; print(json.dumps([json.load(open(f)).get(\"uid\") "
            f"for f in glob.glob(\"{mhlib.ARCHIVE_DIR}/*.json\")]))'").stdout)
        for uid in uids:
            records.setdefault(uid, []).append(h.inst.name)
    wrong = {f"{name} {uid}": records.get(uid, []) for uid, name in live.items()
             if len(records.get(uid, [])) != 1}
    assert not wrong, f"TeamSpaces not archived exactly once (name uid: hosts with a record): {wrong}"
    print(f"\nuninstall on three hosts: {len(live)} TeamSpaces archived and deleted")
