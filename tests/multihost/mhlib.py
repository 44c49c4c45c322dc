"""Three test hosts on one API server: the multi-host tests' hosts, and what to ask them.

Test hosts share the machine's network namespace (testhost/instance.py), so hosts B and C reach
A's API server at A's loopback address and port. A runs the one control plane; B and C get A's
admin kubeconfig at the path the roles use (cnpa_kubeconfig, k3s's /etc/rancher/k3s/k3s.yaml,
which root's plain `kubectl` reads there too) and their own control plane is stopped and disabled
(it would burn CPU, and a B or C booted again must not start it).

The host driver (Host, wait_for, session_host's rules) is tests/hostlib.py's.
"""

from __future__ import annotations

import datetime
import json
import os
import random
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from hostlib import ROOT, Host, http_get, wait_for

from testhost import instance as instance_mod
from testhost.common import HostError
from testhost.instance import Instance

DEFAULT_NAMES = ("mhp-1", "mhp-2", "mhp-3")
ADMIN_KUBECONFIG = "/etc/rancher/k3s/k3s.yaml"
# The control plane of a test host (testhost/files/etc/systemd/system), dependants first; one of
# the two datastores is enabled (kine, the default, or etcd: testhost create --datastore).
CONTROL_PLANE = ("kube-controller-manager.service", "kube-apiserver.service", "kine.service",
                 "etcd.service")


def host_names(var: str = "CNPA_MULTIHOST_HOSTS", default: tuple[str, ...] | list[str] = ()) -> list[str]:
    names = [n.strip() for n in os.environ.get(var, ",".join(default or DEFAULT_NAMES)).split(",")
             if n.strip()]
    if len(names) != 3 or len(set(names)) != 3:
        raise AssertionError(f"{var} must name three different hosts, got {names}")
    return names


def _ports_recorded(name: str) -> bool:
    try:
        return bool(Instance.load(name).ports)
    except (HostError, ValueError, OSError):
        return False  # not written yet, or being replaced (rename) right now


def _create(names: list[str]) -> list[Instance]:
    """A fully (its API server ready), B and C only booted (their control plane is stopped
    afterwards), at the same time. B and C start once A's ports are recorded: each create picks
    free ports avoiding those of the instances recorded so far."""
    first, rest = names[0], names[1:]
    # Built or fetched first: on a cold cache that takes minutes, past the wait for A's ports.
    instance_mod.prepare()
    with ThreadPoolExecutor(max_workers=2) as pool:
        fut_a = pool.submit(instance_mod.create, first)
        wait_for(lambda: fut_a.done() or _ports_recorded(first), timeout=300,
                 what=f"{first}'s ports recorded")
        fut_rest = pool.submit(lambda: [instance_mod.create(n, wait=False) for n in rest])
        errors = []
        for fut in (fut_a, fut_rest):
            try:
                fut.result()
            except BaseException as exc:  # the caller destroys every host, then it is re-raised
                errors.append(exc)
    if errors:
        raise errors[0]
    insts = [Instance.load(n) for n in names]
    ports = [p for inst in insts for p in inst.ports.values()]
    if len(ports) != len(set(ports)):
        raise AssertionError(f"two test hosts got the same port: {[i.ports for i in insts]}")
    return insts


def join(follower: Host, server: Host) -> None:
    """Make follower a client of server's API server: its own control plane stopped for good,
    server's admin kubeconfig at the roles' path (root's kubectl follows it there)."""
    follower.sh(f"systemctl disable --now {' '.join(CONTROL_PLANE)}", timeout=90)
    admin = server.inst.kubeconfig.read_text()
    follower.sh(f"umask 077 && cat > {ADMIN_KUBECONFIG}.new && mv {ADMIN_KUBECONFIG}.new "
                f"{ADMIN_KUBECONFIG}", input_text=admin)
    follower.inst.kubeconfig.write_text(admin)
    follower.inst.kubeconfig.chmod(0o600)
    wait_for(lambda: follower.kubectl("get", "--raw", "/readyz", check=False).stdout == "ok",
             timeout=60, interval=0.5, what=f"{follower.inst.name} reaching {server.inst.name}'s API")


@contextmanager
def three_hosts(names: list[str], reuse_var: str = "CNPA_MULTIHOST_REUSE") -> Iterator[list[Host]]:
    """Three running hosts on the first one's API server: fresh ones, destroyed at the end; or,
    when reuse_var is 1 and all three are running, those, left running."""
    reuse = os.environ.get(reuse_var) == "1"
    insts: list[Instance] | None = None
    if reuse:
        try:
            insts = [Instance.load(n) for n in names]
        except HostError:
            insts = None
        if insts is not None and not all(i.running() for i in insts):
            raise AssertionError(f"{reuse_var}=1 but not all of {names} are running")
    created = insts is None
    try:
        if created:
            for n in names:
                instance_mod.destroy(n)  # a leftover of an interrupted run
            insts = _create(names)
        hosts = [Host(i) for i in insts]
        for h in hosts[1:]:
            join(h, hosts[0])
        yield hosts
    finally:
        if created:
            # At the same time: each poweroff mostly waits (A's API server for its watches).
            with ThreadPoolExecutor(max_workers=3) as pool:
                for fut in [pool.submit(instance_mod.destroy, n) for n in names]:
                    fut.result()


def write_inventory(hosts: list[Host], path: Path) -> Path:
    """One INI inventory, group k3s, the three hosts over SSH (the lines testhost wrote for each);
    cnpa_kubeconfig is the roles' default path, valid on each for A's API server (join)."""
    lines = []
    for h in hosts:
        text = h.inst.inventory.read_text().splitlines()
        # (Each host's line gives its controller a metrics port of its own: testhost.)
        lines += [line for line in text[text.index("[k3s]") + 1:] if line.strip()]
    path.write_text("# Written by tests/multihost: three test hosts, one API server (the first's).\n"
                    "[k3s]\n" + "\n".join(lines) + "\n")
    return path


# -- faults of a whole host ---------------------------------------------------------------------
def _freeze_files(inst: Instance) -> list[Path]:
    return [root / inst.cgroup / "cgroup.freeze" for root in instance_mod.CGROUP_ROOTS
            if (root / inst.cgroup / "cgroup.freeze").exists()]


def freeze(inst: Instance, frozen: bool) -> None:
    """Freeze (or thaw) every process of the host: its cgroup (v2, with nspawn itself)."""
    files = _freeze_files(inst)
    if not files:
        raise AssertionError(f"{inst.name}: no cgroup.freeze under {instance_mod.CGROUP_ROOTS}")
    for f in files:
        f.write_text("1\n" if frozen else "0\n")
    events = files[0].with_name("cgroup.events")
    want = f"frozen {1 if frozen else 0}"
    wait_for(lambda: want in events.read_text().splitlines(), timeout=30, interval=0.1,
             what=f"{inst.name} {'frozen' if frozen else 'thawed'}")


def power_off(inst: Instance, *, hard: bool = False) -> None:
    """As `python3 -m testhost stop NAME` (a clean poweroff: services are stopped, so the
    controller gives its Lease up); hard: the plug pulled, every process of the host killed at
    once (cgroup.kill), nothing given up; then the same clean-up as testhost stop."""
    if hard:
        kills = [root / inst.cgroup / "cgroup.kill" for root in instance_mod.CGROUP_ROOTS
                 if (root / inst.cgroup / "cgroup.kill").exists()]
        if not kills:
            raise AssertionError(f"{inst.name}: no cgroup.kill under {instance_mod.CGROUP_ROOTS}")
        kills[0].write_text("1\n")
        events = kills[0].with_name("cgroup.events")
        wait_for(lambda: "populated 0" in events.read_text().splitlines(), timeout=30,
                 interval=0.1, what=f"every process of {inst.name} gone")
    inst.poweroff()


def power_on(host: Host, server: Host) -> float:
    """As `python3 -m testhost start NAME` without its wait for the host's own control plane
    (a follower has none: join disabled it); waits for sshd and server's API instead. Seconds."""
    t0 = time.monotonic()
    host.inst.boot()
    host.inst.save()
    wait_for(lambda: host.sh("systemctl is-active ssh.service", check=False).stdout.strip() == "active",
             timeout=60, interval=0.5, what=f"{host.inst.name}'s sshd")
    wait_for(lambda: host.kubectl("get", "--raw", "/readyz", check=False).stdout == "ok",
             timeout=60, interval=0.5, what=f"{host.inst.name} reaching {server.inst.name}'s API")
    return time.monotonic() - t0


def api_sockets(pids: list[int], port: int) -> set[str]:
    """Local addresses (IP:PORT) of the established connections of these processes to the API."""
    out = subprocess.run(["ss", "-Htnp", "state", "established", "dst", f"127.0.0.1:{port}"],
                         capture_output=True, text=True, check=True, timeout=10).stdout
    found = set()
    for line in out.splitlines():
        if any(f"pid={p}," in line for p in pids):
            found.add(line.split()[2])
    return found


def cut(sockets: set[str], port: int) -> None:
    """Destroy these connections to the API (local IP:PORT each) at the socket (ss -K,
    SOCK_DESTROY: the kernel aborts them as a reset would; the process notices at its next read
    or write, even one frozen meanwhile)."""
    for local in sockets:
        ip, lport = local.rsplit(":", 1)
        subprocess.run(["ss", "-K", "dst", f"127.0.0.1:{port}", "src", f"{ip}:{lport}"],
                       capture_output=True, check=True, timeout=10)


def lease(host: Host, namespace: str = "cnpa-system", name: str = "cnpa-op") -> dict | None:
    proc = host.kubectl("get", "lease", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


# -- the controller on three hosts ----------------------------------------------------------------
GROUP = "platform.labhub.io"
TS = f"teamspaces.{GROUP}"
FIN = f"{GROUP}/cleanup"
LABEL = f"{GROUP}/teamspace"
ARCHIVE_LABEL = f"{GROUP}/archived-teamspace"
# playbooks/controller.yml's layout (cnpa_layout=system).
ARCHIVE_DIR = "/var/lib/cnpa-op/archive"
LEASE_NS, LEASE_NAME = "cnpa-system", "cnpa-op"
AGENT = "cnpa-controller/"
WRITES = ("create", "update", "patch", "delete", "deletecollection")


def holder(admin: Host) -> str:
    """The Lease's holderIdentity ("" when free or missing)."""
    got = lease(admin, LEASE_NS, LEASE_NAME)
    return ((got or {}).get("spec") or {}).get("holderIdentity") or ""


def host_of(identity: str, hosts: list[Host]) -> Host:
    """The host whose controller has this identity (HOSTNAME_RANDOM, cnpa_controller/__main__.py)."""
    name = identity.rsplit("_", 1)[0]
    found = [h for h in hosts if h.inst.name == name]
    assert found, f"Lease holder {identity!r} is none of {[h.inst.name for h in hosts]}"
    return found[0]


def unit(host: Host, prop: str) -> str:
    return host.sh(f"systemctl show -p {prop} --value cnpa-op").stdout.strip()


def unit_pids(inst: Instance) -> list[int]:
    """cnpa-op.service's processes as the machine numbers them (its cgroup inside the host's)."""
    pids: set[int] = set()
    for root in instance_mod.CGROUP_ROOTS:
        procs = root / inst.cgroup / "payload/system.slice/cnpa-op.service/cgroup.procs"
        if procs.exists():
            pids.update(int(p) for p in procs.read_text().split())
    return sorted(pids)


def metrics_of(host: Host) -> dict[str, float]:
    """The installed controller's /metrics on host, served on the loopback port its inventory line
    gives it (cnpa_controller_metrics_address): 'name{label="value",...}' -> value, labels sorted."""
    from prometheus_client.parser import text_string_to_metric_families

    status, text = http_get(host.inst.ports["metrics"], "/metrics")
    assert status == 200, f"{host.inst.name}'s controller /metrics answered {status}"
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def summed(metrics: dict[str, float], name: str, **labels: str) -> float:
    """The sum of a metric's series that carry these labels."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(v for k, v in metrics.items()
               if k.split("{", 1)[0] == name and all(w in k for w in want))


def controller_ready(host: Host) -> bool:
    """The installed controller's /readyz answers 200 (its caches synced and not stale)."""
    return http_get(host.inst.ports["metrics"], "/readyz")[0] == 200


# -- the audit log: who wrote, and when -----------------------------------------------------------
# testhost's kube-apiserver.service writes it (--audit-log-path), one line per write request, and
# rotates it at 200 MB (--audit-log-maxsize) into audit-TIME.log beside it: thousands of
# TeamSpaces (test_watch_chaos.py's long form) fill more than one file.
AUDIT_LOG = "var/log/kubernetes/audit.log"
# What the checks read of a line; the rest (user, sourceIPs, annotations, stage times) is dropped
# as each line is read, so memory grows with the controllers' writes, not with the log.
_AUDIT_KEYS = ("verb", "requestURI", "requestReceivedTimestamp", "objectRef", "responseStatus",
               "userAgent")


def audit_files(admin: Host) -> list[Path]:
    """admin's audit log files, oldest first: the rotated ones (named by the time they were
    rotated, so their names sort by time), then the current one. Read in the host's rootfs on
    this machine: a test host is a directory here."""
    current = admin.inst.root / AUDIT_LOG
    return [*sorted(current.parent.glob("audit-*.log")), current]


def controller_requests(admin: Host, since: str = "") -> list[dict]:
    """Write requests of any controller process (userAgent cnpa-controller/IDENTITY) at or after
    an RFC 3339 time, in the order the API server received them. Streamed: a line is decoded
    only when it names a controller's user agent, and only _AUDIT_KEYS are kept."""
    needle = f'"userAgent":"{AGENT}'.encode()
    out = []
    for path in audit_files(admin):
        try:
            fh = open(path, "rb")  # noqa: SIM115 - closed below; rotated away meanwhile: skipped
        except FileNotFoundError:
            continue
        with fh:
            for line in fh:
                if needle not in line:
                    continue
                try:
                    e = json.loads(line)
                except ValueError:
                    continue  # the line the API server is writing right now
                agent = e.get("userAgent", "")
                if (agent.startswith(AGENT) and e.get("verb") in WRITES
                        and e.get("requestReceivedTimestamp", "") >= since):
                    e = {k: e[k] for k in _AUDIT_KEYS if k in e}
                    e["identity"] = agent[len(AGENT):].split(" ", 1)[0]
                    out.append(e)
    return sorted(out, key=lambda e: e["requestReceivedTimestamp"])


def written_teamspaces(admin: Host, requests: list[dict] | None = None) -> set[str]:
    """Names of the TeamSpaces any controller process wrote successfully (audit log, or
    controller_requests() already read)."""
    return {e["objectRef"]["name"]
            for e in (controller_requests(admin) if requests is None else requests)
            if e.get("objectRef", {}).get("resource") == "teamspaces" and ok(e)}


def is_lease_write(e: dict) -> bool:
    ref = e.get("objectRef", {})
    return ref.get("resource") == "leases" and ref.get("namespace") == LEASE_NS \
        and ref.get("name") == LEASE_NAME


def ok(e: dict) -> bool:
    return 200 <= e.get("responseStatus", {}).get("code", 0) < 300


def is_election_news(e: dict) -> bool:
    """An Event about the Lease (`became leader`/`stopped leading`, leader.lease_event): written by
    whoever changes role, leader or not; not a reconcile write."""
    ref = e.get("objectRef", {})
    return ref.get("resource") == "events" and ref.get("namespace") == LEASE_NS


def one_writer(requests: list[dict], since: str = "") -> tuple[list[str], list[tuple[str, str, str]]]:
    """(violations, takeovers) from `since` on (the Lease writes before it tell who held it then).
    Every reconcile write (attempted, whatever its answer) must come from the identity whose
    successful Lease write is the latest before it: a write by X after a write by Y is then
    preceded by X's takeover, and a deposed leader (killed, frozen, powered off) writes nothing
    once another has taken the Lease. takeovers: (time, from, to)."""
    current, violations, takeovers = "", [], []
    for e in requests:
        ident, when = e["identity"], e["requestReceivedTimestamp"]
        if when < since and not is_lease_write(e):
            continue
        if is_lease_write(e):
            if ok(e):
                if ident != current and when >= since:
                    takeovers.append((when, current, ident))
                current = ident
        elif not is_election_news(e) and ident != current:
            ref = e.get("objectRef", {})
            violations.append(f"{when} {ident} {e['verb']} {ref.get('resource')}/"
                              f"{ref.get('namespace', '')}/{ref.get('name', '')} "
                              f"({e.get('responseStatus', {}).get('code')}) while {current or 'nobody'} "
                              "held the Lease")
    return violations, takeovers


# -- a workload of TeamSpaces, and what must hold after it ------------------------------------------
CPUS = ("1", "500m", "2", "250m")


class Workload:
    """A background thread that, through the admin kubeconfig, keeps creating TeamSpaces named
    PREFIX-N, editing their quota spec and deleting some; bounded in operations and time. It
    remembers what it did: `live` (name -> uid, spec) and `deleted` (uid -> name). A request that
    failed (the API server away) may or may not have happened: that name goes to `uncertain` and
    is left alone; the checks then read the truth from the API server."""

    def __init__(self, admin: Host, prefix: str, *, interval: float = 0.6, max_ops: int = 300,
                 max_seconds: float = 240, keep: int = 6, seed: int = 13) -> None:
        self.admin, self.prefix, self.interval = admin, prefix, interval
        self.max_ops, self.max_seconds, self.keep = max_ops, max_seconds, keep
        self.rng = random.Random(seed)
        self.live: dict[str, tuple[str, dict]] = {}
        self.deleted: dict[str, str] = {}
        self.uncertain: dict[str, str | None] = {}  # name -> uid if known
        self.ops: list[tuple[float, str, str]] = []  # (time.time(), op, name)
        self.failed = 0
        self._n = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                                      name=f"workload-{prefix}")

    def __enter__(self) -> Workload:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "the workload did not stop within 60 s"

    def _run(self) -> None:
        t_end = time.monotonic() + self.max_seconds
        for _ in range(self.max_ops):
            if self._stop.is_set() or time.monotonic() > t_end:
                return
            try:
                self.step()
            except Exception as exc:  # the thread goes on; counted
                self.failed += 1
                if self.failed <= 3:  # the API server away fails every one alike
                    print(f"workload {self.prefix}: {str(exc)[:300]}")
            self._stop.wait(self.interval)

    def _spec(self) -> dict:
        return {"pods": self.rng.randint(1, 40), "cpu": self.rng.choice(CPUS)}

    def step(self) -> None:
        roll = self.rng.random()
        if len(self.live) < self.keep // 2 or (roll < 0.35 and len(self.live) < self.keep):
            self.create()
        elif roll < 0.8 and self.live:
            self.edit(self.rng.choice(sorted(self.live)))
        elif self.live:
            self.delete(self.rng.choice(sorted(self.live)))

    def create(self) -> None:
        name, spec = f"{self.prefix}-{self._n}", self._spec()
        self._n += 1
        body = {"apiVersion": f"{GROUP}/v1alpha1", "kind": "TeamSpace", "metadata": {"name": name},
                "spec": spec}
        proc = self.admin.kubectl("create", "-o", "json", "-f", "-", input_text=json.dumps(body),
                                  check=False, timeout=20)
        self.ops.append((time.time(), "create", name))
        if proc.returncode:
            self.uncertain[name] = None
            raise AssertionError(f"create {name}: {proc.stderr.strip()}")
        self.live[name] = (json.loads(proc.stdout)["metadata"]["uid"], spec)

    def edit(self, name: str) -> None:
        uid, _ = self.live[name]
        spec = self._spec()
        proc = self.admin.kubectl("patch", TS, name, "--type", "merge", "-p",
                                  json.dumps({"spec": spec}), check=False, timeout=20)
        self.ops.append((time.time(), "edit", name))
        if proc.returncode:
            del self.live[name]
            self.uncertain[name] = uid
            raise AssertionError(f"edit {name}: {proc.stderr.strip()}")
        self.live[name] = (uid, spec)

    def delete(self, name: str) -> None:
        uid, _ = self.live.pop(name)
        proc = self.admin.kubectl("delete", TS, name, "--wait=false", check=False, timeout=20)
        self.ops.append((time.time(), "delete", name))
        if proc.returncode:
            self.uncertain[name] = uid
            raise AssertionError(f"delete {name}: {proc.stderr.strip()}")
        self.deleted[uid] = name


def cpu_value(q: str) -> float:
    return float(q[:-1]) / 1000 if q.endswith("m") else float(q)


def snapshot(admin: Host) -> dict:
    """TeamSpaces, namespaces, quotas and archive ConfigMaps, two requests."""
    items = json.loads(admin.kubectl("get", f"{TS},namespaces,resourcequotas", "-A", "-o", "json",
                                     timeout=30).stdout)["items"]
    cms = json.loads(admin.kubectl("get", "configmaps", "-n", LEASE_NS, "-l", ARCHIVE_LABEL, "-o",
                                   "json", timeout=30).stdout)["items"]
    by_kind: dict[str, list] = {"TeamSpace": [], "Namespace": [], "ResourceQuota": []}
    for item in items:
        by_kind.setdefault(item["kind"], []).append(item)
    return {"teamspaces": by_kind["TeamSpace"], "namespaces": by_kind["Namespace"],
            "quotas": by_kind["ResourceQuota"], "archives": cms}


def snapshot_api(api) -> dict:
    """snapshot() through an Api (cnpa_controller's, e.g. bench/bulk.py's admin client): plain
    dicts, no kubectl, for thousands of TeamSpaces. Each kind in one list (no pages: a continue
    token can expire between pages where compaction is frequent)."""
    def items(path: str, **query: str) -> list:
        return api.request("GET", path, query=query or None)["items"]
    return {"teamspaces": items(f"/apis/{GROUP}/v1alpha1/teamspaces"),
            "namespaces": items("/api/v1/namespaces"),
            "quotas": items("/api/v1/resourcequotas"),
            "archives": items(f"/api/v1/namespaces/{LEASE_NS}/configmaps",
                              labelSelector=ARCHIVE_LABEL)}


def problems(snap: dict, workloads: list[Workload], archive_configmaps: bool,
             only: str = "", finalized: set[str] | None = None) -> list[str]:
    """Everything that is not as it must be once the controller has caught up (empty: all well).
    Nothing lost: every live TeamSpace Ready with its namespace and exactly the quota its spec
    says, and every creation and edit of the workloads there. Nothing duplicated: deleted ones
    gone with their namespaces, one archive ConfigMap per deleted uid and none for a live one.
    only: look at TeamSpaces whose name starts with it (other tests may share the hosts).
    finalized: names of the TeamSpaces a controller wrote to (so they carried our finalizer; a
    TeamSpace created and deleted while no controller led never had it: nothing to archive).
    None: at most one archive ConfigMap per deleted uid, not necessarily one."""
    out: list[str] = []
    live = {t["metadata"]["name"]: t for t in snap["teamspaces"]
            if t["metadata"]["name"].startswith(only)}
    uids = {t["metadata"]["uid"]: t for t in snap["teamspaces"]}
    namespaces = {n["metadata"]["name"]: n for n in snap["namespaces"]}
    quotas: dict[str, list] = {}
    for q in snap["quotas"]:
        quotas.setdefault(q["metadata"]["namespace"], []).append(q)
    # Namespaces by the uids of their owners, once: thousands of deleted uids each scanning
    # thousands of namespaces took minutes.
    owned_by: dict[str, list[str]] = {}
    for n in snap["namespaces"]:
        for uid in {r.get("uid") for r in n["metadata"].get("ownerReferences", [])}:
            owned_by.setdefault(uid, []).append(n["metadata"]["name"])
    for name, t in sorted(live.items()):
        meta, st = t["metadata"], t.get("status") or {}
        if meta.get("deletionTimestamp"):
            out.append(f"{name}: deletion not finished")
            continue
        ready = [c for c in st.get("conditions") or [] if c.get("type") == "Ready"]
        if meta.get("finalizers", []).count(FIN) != 1:
            out.append(f"{name}: finalizers {meta.get('finalizers')}")
        if st.get("observedGeneration") != meta["generation"] or [c.get("status") for c in ready] != ["True"]:
            out.append(f"{name}: not Ready at generation {meta['generation']} (status {st})")
        ns = namespaces.get(f"team-{name}")
        owners = [r["uid"] for r in (ns or {}).get("metadata", {}).get("ownerReferences", [])
                  if r.get("controller")]
        if ns is None or owners != [meta["uid"]] or ns["metadata"].get("deletionTimestamp") \
                or ns["metadata"].get("labels", {}).get(LABEL) != name:
            out.append(f"{name}: namespace team-{name} missing or not its own ({owners})")
            continue
        qs = quotas.get(f"team-{name}", [])
        hard = qs[0]["spec"].get("hard", {}) if len(qs) == 1 else {}
        want = t.get("spec") or {}
        if [q["metadata"]["name"] for q in qs] != ["team-quota"] or set(hard) != {"pods", "requests.cpu"} \
                or hard["pods"] != str(want.get("pods")) \
                or cpu_value(hard["requests.cpu"]) != cpu_value(want.get("cpu", "1")):
            out.append(f"{name}: quotas {[(q['metadata']['name'], q['spec'].get('hard')) for q in qs]} "
                       f"for spec {want}")
    archived: dict[str, list] = {}
    for cm in snap["archives"]:
        uid = cm["metadata"]["name"].removeprefix("archive-")
        archived.setdefault(uid, []).append(cm["metadata"]["labels"].get(ARCHIVE_LABEL))
        if uid in uids:
            out.append(f"archive record {cm['metadata']['name']} for live TeamSpace "
                       f"{uids[uid]['metadata']['name']}")
    for wl in workloads:
        for name, (uid, spec) in sorted(wl.live.items()):
            t = live.get(name)
            if t is None or t["metadata"]["uid"] != uid:
                out.append(f"{name} ({uid}) lost")
            elif {k: t["spec"].get(k) for k in spec} != spec:
                out.append(f"{name}: spec {t['spec']}, the workload last set {spec}")
        gone = dict(wl.deleted)
        gone.update({uid: name for name, uid in wl.uncertain.items() if uid and uid not in uids})
        for uid, name in sorted(gone.items()):
            if uid in uids:
                out.append(f"{name} ({uid}) deleted but still there")
            owned = owned_by.get(uid, [])
            if owned:
                out.append(f"{name} ({uid}) deleted but its namespace {owned} is still there")
            records = archived.get(uid, [])
            if archive_configmaps and (records not in ([], [name]) or (
                    finalized is not None and (name in finalized) != (records == [name]))):
                out.append(f"{name} ({uid}) deleted: archive ConfigMaps {records} "
                           f"(a controller wrote it: {None if finalized is None else name in finalized})")
    return out


def wait_clean(admin: Host, workloads: list[Workload], archive_configmaps: bool, *,
               timeout: float = 120, only: str = "") -> float:
    """Seconds until problems() is empty (polled every second); fails with the last problems."""
    t0 = time.monotonic()
    last: list[str] = []

    def clean() -> bool:
        nonlocal last
        last = problems(snapshot(admin), workloads, archive_configmaps, only)
        return not last

    try:
        wait_for(clean, timeout=timeout, interval=1, what="the controller to catch up")
        # Then once more, strictly: archive ConfigMaps precede a finalizer's release, so the
        # converged state holds every one it will ever have.
        last = problems(snapshot(admin), workloads, archive_configmaps, only,
                        finalized=written_teamspaces(admin))
        assert not last
    except AssertionError as exc:
        raise AssertionError(f"{exc}; still wrong: {last[:20]}") from None
    return time.monotonic() - t0


_UID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def archive_files(hosts: list[Host]) -> dict[str, dict[str, int]]:
    """uid -> {host: how many of its archive files (reconcile.sh's and the executor's NAME.json /
    NAME.UID.json, and a record kept aside) hold that uid}, for every uid any running host's
    archive holds. Read in each host's rootfs on this machine, every file once."""
    out: dict[str, dict[str, int]] = {}
    for h in hosts:
        if not h.inst.running():
            continue
        for f in (h.inst.root / ARCHIVE_DIR.lstrip("/")).glob("*.json"):
            try:
                uids = set(_UID.findall(f.read_bytes()))
            except FileNotFoundError:
                continue  # replaced meanwhile (temporary file renamed)
            for uid in uids:
                held = out.setdefault(uid.decode(), {})
                held[h.inst.name] = held.get(h.inst.name, 0) + 1
    return out


def file_records(hosts: list[Host], uid: str) -> dict[str, int]:
    """How many archive files on each running host record this uid."""
    held = archive_files(hosts).get(uid, {})
    return {h.inst.name: held.get(h.inst.name, 0) for h in hosts if h.inst.running()}


# -- the controller installed on the three hosts, once per session ----------------------------------
# Every module of this directory shares one install (conftest.py's session fixture `cluster`).
# This session's run, for names: modules prefix their TeamSpaces with it.
RUN = f"{int(time.time()) % 46656:x}"
# test_watch_faults.py's and test_monitoring_installed.py's TeamSpaces.
PREFIX = f"wf{RUN}"
# The figures the modules measure, never asserted: written to $CNPA_MULTIHOST_REPORT (default
# /tmp/cnpa-multihost-report.json) at the end of the session, one key per test.
REPORT: dict = {}
TOKEN_SECONDS, TOKEN_RENEW = 600, 120
METRICS = "/var/lib/cnpa-op-metrics/cnpa-op.prom"
INSTALL = ["-e", f"cnpa_controller_token_duration={TOKEN_SECONDS}",
           "-e", f"cnpa_controller_token_renew={TOKEN_RENEW}",
           "-e", f"cnpa_controller_metrics_textfile={METRICS}"]


def install(inventory: Path, *extra: str) -> None:
    env = dict(os.environ, PATH=f"{ROOT / '.venv/bin'}:/usr/bin:/bin", ANSIBLE_FORCE_COLOR="0")
    proc = subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(inventory),
                           str(ROOT / "playbooks/controller.yml"), *INSTALL, *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def epoch(rfc3339: str) -> float:
    return datetime.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def rfc3339(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Cluster:
    """The three hosts with the controller installed, what test_watch_faults.py's faults need of
    them. prefix: that module's TeamSpaces (workloads, probes), wf<run>- (other tests, and earlier
    runs on reused hosts, may share the hosts)."""

    def __init__(self, hosts: list[Host], since: str, prefix: str = f"wf{RUN}") -> None:
        self.hosts, self.a, self.since, self.prefix = hosts, hosts[0], since, prefix
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

    def workload(self, name: str, **bounds) -> Workload:
        wl = Workload(self.a, f"{self.prefix}-{name}", seed=len(self.workloads), **bounds)
        self.workloads.append(wl)
        return wl

    def probe(self) -> tuple[str, int]:
        """A TeamSpace converged before the fault; returns its name and the next pods value."""
        self.probes += 1
        name = f"{self.prefix}-probe{self.probes}"
        self.a.apply({"apiVersion": f"{GROUP}/v1alpha1", "kind": "TeamSpace",
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
        return controller_requests(self.a)

    def check(self, what: str) -> dict:
        """Converged (bounded), then nothing lost or duplicated, one writer at a time."""
        seconds = wait_clean(self.a, self.workloads, self.archive_configmaps, timeout=120,
                             only=f"{self.prefix}-")
        violations, takeovers = one_writer(self.requests(), self.since)
        assert not violations, f"{what}: more than one writer: {violations[:10]}"
        ours = self.workloads
        out = {"converged_after_s": round(seconds, 1), "takeovers_so_far": len(takeovers),
               "workload_ops": sum(len(wl.ops) for wl in ours),
               "workload_failed_ops": sum(wl.failed for wl in ours),
               "deleted_so_far": sum(len(wl.deleted) for wl in ours)}
        return out

    def takeover_after(self, t_fault: float, old: str,
                       requests: list[dict] | None = None) -> tuple[float, str]:
        """Seconds from the fault to the first successful Lease write of another identity, and
        that identity (from the audit log: the API server's clock, this machine's). requests:
        controller_requests() already read (thousands of TeamSpaces make a long log)."""
        for e in self.requests() if requests is None else requests:
            if is_lease_write(e) and ok(e) and e["identity"] != old \
                    and epoch(e["requestReceivedTimestamp"]) >= t_fault:
                return epoch(e["requestReceivedTimestamp"]) - t_fault, e["identity"]
        raise AssertionError(f"no takeover from {old} in the audit log")

    def after_takeover(self, old: str, t_takeover: float,
                       requests: list[dict] | None = None) -> list[str]:
        """What the old identity sent after the takeover other than failed Lease writes and
        Events about the Lease: must be nothing."""
        return [f"{e['requestReceivedTimestamp']} {e['verb']} {e['requestURI']} "
                f"({e.get('responseStatus', {}).get('code')})"
                for e in (self.requests() if requests is None else requests)
                if e["identity"] == old and epoch(e["requestReceivedTimestamp"]) >= t_takeover
                and not is_election_news(e) and not (is_lease_write(e) and not ok(e))]


def cut_api_connections(hosts: list[Host], port: int) -> int:
    """Destroy every established connection of these hosts' cnpa-op units to the API server on
    127.0.0.1:port (found by the unit's cgroup, nothing else touched): their watches break. How
    many were cut."""
    n = 0
    for h in hosts:
        sockets = api_sockets(unit_pids(h.inst), port)
        cut(sockets, port)
        n += len(sockets)
    return n


def write_report() -> Path:
    """REPORT's keys into $CNPA_MULTIHOST_REPORT, beside the keys already there: the host sets
    (mhp-*, the chaos module's mhc-*) end in different workers, and each adds its own tests'."""
    import fcntl

    path = Path(os.environ.get("CNPA_MULTIHOST_REPORT", "/tmp/cnpa-multihost-report.json"))
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            report = {}
        report = (report if isinstance(report, dict) else {}) | REPORT
        path.write_text(json.dumps(report, indent=2) + "\n")
    return path


@contextmanager
def installed_cluster(hosts: list[Host], inventory: Path) -> Iterator[Cluster]:
    """playbooks/controller.yml installed on the three hosts (unless CNPA_MULTIHOST_INSTALLED=1,
    with CNPA_MULTIHOST_REUSE=1 while developing: hosts on which it ran already), the leader
    known; the report written at the end."""
    since = rfc3339(time.time())
    t0 = time.monotonic()
    if os.environ.get("CNPA_MULTIHOST_INSTALLED") != "1":
        install(inventory)
    REPORT.setdefault("install_s", {})[hosts[0].inst.name] = round(time.monotonic() - t0, 1)
    for h in hosts:
        wait_for(lambda h=h: unit(h, "ActiveState") == "active", timeout=60, interval=0.5,
                 what=f"cnpa-op active on {h.inst.name}")
    c = Cluster(hosts, since)
    assert c.archive_configmaps, "the unit does not set CNPA_ARCHIVE_NAMESPACE"
    c.leader()
    yield c
    path = write_report()
    print(f"\nmulti-host measurements: {path}\n{json.dumps(REPORT, indent=2)}")
