"""Chaos at N (issue 36): the watch controller on three hosts of this module's own (mhc-1..mhc-3,
CNPA_MULTIHOST_CHAOS_HOSTS; installed as conftest.py's `cluster` is: one API server on A, one
Lease, archive records also as ConfigMaps) while N TeamSpaces are created,
changed or deleted as fast as one client sends them (bench/bulk.py, IN_FLIGHT requests at a
time), and something breaks:

1. the leader's main process SIGKILLed once it has converged a quarter of N being created;
2. on kine, compaction forced while the controllers' watches are open: A's API server restarted
   with --etcd-compaction-interval=COMPACTION, a follower's host frozen, every TeamSpace edited
   and kine made to compact past the revision the frozen follower had seen, its connections
   cut, then thawed: its watches resume from a revision kine no longer holds. It then leads and
   serves the deletion of a tenth. The interval is put back (and the API server restarted) at
   the end, even on failure;
3. the rest deleted at once, and A's API server killed (SIGKILL; systemd starts it again) once
   a quarter of them is archived.

The three share one population of N TeamSpaces (PREFIX-NNNNN), in that order (file order): each
test makes what it needs of it first when run alone (-k). After each, bounded waits, then:
- nothing lost: every live TeamSpace Ready at its generation with its namespace and the quota its
  spec says (mhlib.problems); every deleted one gone, and its namespace gone;
- every deletion archived exactly once per uid: one archive ConfigMap per deleted uid, none for a
  live one; on disk, at most one host's archive holds a uid (mhlib.archive_files);
- one writer at a time by A's audit log (mhlib.one_writer).
Figures (N, times, relists) are never asserted; they go to $CNPA_MULTIHOST_REPORT under chaos_*
and docs/faults.md quotes them.

CNPA_CHAOS_N is N: SHORT_N when unset (CI's short form), 5000 for the long form
(docs/faults.md has the command). Every wait is bounded, and the bounds grow with N.
"""

from __future__ import annotations

import os
import threading
import time

import mhlib
import pytest
from hostlib import Host, compactions, kine_revisions, wait_for
from mhlib import (
    CPUS,
    Cluster,
    archive_files,
    controller_ready,
    controller_requests,
    epoch,
    holder,
    host_names,
    host_of,
    installed_cluster,
    metrics_of,
    one_writer,
    problems,
    rfc3339,
    snapshot_api,
    summed,
    three_hosts,
    unit,
    write_inventory,
    written_teamspaces,
)

from bench import bulk
from cnpa_controller.api import connect
from fixtures import teamspace

SHORT_N = 100
N = int(os.environ.get("CNPA_CHAOS_N", str(SHORT_N)))
PREFIX = f"ch{mhlib.RUN}-"
# Requests at a time: as fast as this one client goes on 2 cores (16 made 5,000 no faster than 8
# in the benchmark's runs, and more only queue in the API server).
IN_FLIGHT = 16
# A's --etcd-compaction-interval during the compaction test (the API server compacts what it saw
# at its previous compaction, so a revision is compacted within two intervals once kine holds
# 1,000 newer ones).
COMPACTION = "5s"
# The frozen follower stays frozen at most this long: its unit's watchdog (WatchdogSec=30) would
# kill it when thawed after 30 s without a ping, and its watches would not resume but start anew.
FREEZE_MAX = 20.0
FILLER = 1100  # ConfigMaps (see the compaction test's Frozen)
FREEZES = 3  # at most, each at most FREEZE_MAX
CONTROLLER = "systemctl kill -s SIGKILL --kill-whom=main cnpa-op"


# Seconds per TeamSpace in the bounds of the waits, only there to end a hang: a loaded machine
# (load 15-20 on 2 cores) answered 8-10 creates a second and converged 3 a second; the namespace
# controller deletes about one namespace a second whatever the load (its client's rate limit).
SEND_S, SETTLE_S, NAMESPACE_S = 0.5, 0.6, 3.0
# An API server started again lists every object into its watch caches before /readyz is ok, and
# the controllers list theirs again: tens of seconds at N = 5,000 on a loaded machine.
READY_S = 120 + N * 0.05


def bound(base: float, per_item: float) -> float:
    """A wait's bound in seconds at this N."""
    return base + per_item * N


class Progress:
    """A thread-safe count of requests answered (bulk's progress callback)."""

    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            self.value += 1


class Population:
    """The module's N TeamSpaces, as mhlib.problems reads a Workload: live (name -> (uid, spec)),
    deleted (uid -> name) and uncertain (none: bulk retries every request until it is answered)."""

    def __init__(self, n: int) -> None:
        self.specs = {f"{PREFIX}{i:05d}": {"pods": 1 + i % 50, "cpu": CPUS[i % len(CPUS)]}
                      for i in range(n)}
        self.live: dict[str, tuple[str, dict]] = {}
        self.deleted: dict[str, str] = {}
        self.uncertain: dict[str, str | None] = {}

    def manifests(self) -> list[dict]:
        return [teamspace(name, spec["pods"], spec["cpu"]) for name, spec in self.specs.items()]


class Chaos:
    def __init__(self, cluster: Cluster) -> None:
        self.c = cluster
        self.a = cluster.a
        self.reconnect()
        self.pop = Population(N)

    def reconnect(self) -> None:
        """A's admin kubeconfig (on this machine): plain requests, not kubectl, and not a
        controller's user agent (its writes are not in controller_requests). Made again after
        each restart of the API server, whose end left every kept connection dead."""
        self.api = connect(str(self.a.inst.kubeconfig), timeout=30, user_agent="cnpa-chaos-test")

    def samples(self, hosts: list[Host] | None = None) -> dict[str, tuple[str, dict[str, float]]]:
        """host -> (the controller's main PID, its metrics) now, of every host or these (a
        frozen one answers nothing)."""
        return {h.inst.name: (unit(h, "MainPID"), metrics_of(h)) for h in hosts or self.c.hosts}

    @staticmethod
    def grown(before: dict, after: dict, name: str, **labels: str) -> dict[str, float]:
        """How much a counter grew on each host; a process started meanwhile (another MainPID)
        counts from its start, what its predecessor counted after `before` is not known."""
        out = {}
        for host, (pid, metrics) in after.items():
            old_pid, old = before[host]
            value = summed(metrics, name, **labels)
            out[host] = value - (summed(old, name, **labels) if pid == old_pid else 0)
        return out

    def ensure_converged(self) -> float:
        """The population's live TeamSpaces converged; the whole population created first when
        nothing of it exists yet (a test run alone). Seconds waited."""
        t0 = time.monotonic()
        if not self.pop.live and not self.pop.deleted:
            uids = bulk.create(self.api, self.pop.manifests(), in_flight=IN_FLIGHT,
                               retry_until=time.monotonic() + bound(120, SEND_S))
            self.pop.live = {name: (uid, self.pop.specs[name]) for name, uid in uids.items()}
        self.wait_converged()
        return time.monotonic() - t0

    def wait_converged(self) -> float:
        """Until every live TeamSpace of the population is converged (bulk.converged, polled less
        often at large N: each poll lists them all on the same 2 cores)."""
        t0 = time.monotonic()
        wait_for(lambda: bulk.converged(self.api, PREFIX, len(self.pop.live)),
                 timeout=bound(120, SETTLE_S), interval=max(1.0, N / 1000),
                 what=f"{len(self.pop.live)} TeamSpaces converged")
        return time.monotonic() - t0

    def wait_deleted(self, names: list[str], t0: float) -> tuple[float, float]:
        """Until every TeamSpace named is gone (archived and released), then until their
        namespaces are gone too (the namespace controller empties each first: about one a second
        on this machine). Seconds from t0 (time.monotonic()) to each."""
        gone = set(names)
        wait_for(lambda: not {t["metadata"]["name"] for t in bulk.teamspaces(self.api, PREFIX)} & gone,
                 timeout=bound(120, SETTLE_S), interval=max(0.5, N / 2000),
                 what=f"{len(names)} deletions archived and released")
        drained = time.monotonic() - t0
        namespaces = {f"team-{n}" for n in names}

        def namespaces_gone() -> bool:
            items = self.api.request("GET", "/api/v1/namespaces",
                                     query={"labelSelector": mhlib.LABEL})["items"]
            return not {ns["metadata"]["name"] for ns in items} & namespaces
        wait_for(namespaces_gone, timeout=bound(300, NAMESPACE_S), interval=max(2.0, N / 500),
                 what=f"the namespaces of {len(names)} deleted TeamSpaces gone")
        return drained, time.monotonic() - t0

    def settled(self) -> dict[str, tuple[str, dict[str, float]]]:
        """samples() once no controller has started a watch for 3 s (after the API server's
        restart, a watch may still wait out its backoff while /readyz already says ready)."""
        last = self.samples()

        def same() -> bool:
            nonlocal last
            time.sleep(3)
            now = self.samples()
            quiet = not any(self.grown(last, now, "cnpa_watch_restarts_total").values())
            last = now
            return quiet
        wait_for(same, timeout=120, interval=0, what="every controller's watches open and quiet")
        return last

    def check(self, what: str, since: str) -> tuple[list[dict], list]:
        """Nothing lost, every deletion archived exactly once, one writer since `since`. Returns
        the controllers' requests (read once: a long log at large N) and the takeovers."""
        requests = controller_requests(self.a)
        wrong = problems(snapshot_api(self.api), [self.pop], True, only=PREFIX,
                         finalized=written_teamspaces(self.a, requests))
        assert not wrong, f"{what}: {len(wrong)} wrong, e.g. {wrong[:20]}"
        files = archive_files(self.c.hosts)
        twice = {f"{name} {uid}": held for uid, name in self.pop.deleted.items()
                 if len([h for h, count in files.get(uid, {}).items() if count]) > 1
                 for held in [files[uid]]}
        assert not twice, f"{what}: archived on more than one host: {len(twice)}, e.g. " \
                          f"{dict(list(twice.items())[:10])}"
        violations, takeovers = one_writer(requests, since)
        assert not violations, f"{what}: more than one writer: {violations[:10]}"
        return requests, takeovers


@pytest.fixture(scope="module")
def hosts():
    """Three hosts of this module's own: on the shared ones (conftest.py) its minutes came after
    the other modules', on the longest unit of the run; here it is a unit of its own
    (tests/conftest.py's HOST_UNITS), in another worker."""
    if os.geteuid() != 0:
        pytest.skip("the test hosts need root")
    with three_hosts(host_names("CNPA_MULTIHOST_CHAOS_HOSTS", ("mhc-1", "mhc-2", "mhc-3"))) as hs:
        yield hs


@pytest.fixture(scope="module")
def inventory(hosts, tmp_path_factory):
    return write_inventory(hosts, tmp_path_factory.mktemp("multihost-chaos") / "inventory.ini")


@pytest.fixture(scope="module")
def cluster(hosts, inventory):
    with installed_cluster(hosts, inventory) as c:
        yield c


@pytest.fixture(scope="module")
def chaos(cluster):
    ch = Chaos(cluster)
    yield ch
    # What a failed test left of the population is deleted (archived by the controllers), so the
    # next module does not start among thousands of TeamSpaces; their namespaces are not waited for.
    left = [t["metadata"]["name"] for t in bulk.teamspaces(ch.api, PREFIX)]
    if left:
        print(f"deleting {len(left)} TeamSpaces a failed test left")
        bulk.delete(ch.api, left, in_flight=IN_FLIGHT, retry_until=time.monotonic() + 120)
        wait_for(lambda: not bulk.teamspaces(ch.api, PREFIX), timeout=bound(120, SETTLE_S),
                 interval=2, what=f"the {len(left)} TeamSpaces a failed test left gone")


def started() -> tuple[float, str]:
    t0 = time.time()
    return t0, rfc3339(t0)


def test_leader_killed_while_n_converge(chaos):
    """N TeamSpaces created as fast as the client goes; once the leader has converged a quarter of
    them (its status writes), SIGKILL to its main process (it cannot give the Lease up): another
    takes over once the lease has run out, the N converge, and the killed identity wrote nothing
    after."""
    c, pop = chaos.c, chaos.pop
    assert not pop.live and not pop.deleted, "the population exists already"
    t0, since = started()
    leader, ident = c.leader()
    restarts = int(unit(leader, "NRestarts"))
    before = chaos.samples()
    answered, result, errors = Progress(), {}, []

    def send() -> None:
        try:
            result.update(bulk.create(chaos.api, pop.manifests(), in_flight=IN_FLIGHT,
                                      retry_until=time.monotonic() + bound(120, SEND_S),
                                      progress=answered))
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    sender = threading.Thread(target=send, name="chaos-create", daemon=True)
    sender.start()
    statuses0 = summed(metrics_of(leader), "cnpa_writes_total", step="status")
    wait_for(lambda: summed(metrics_of(leader), "cnpa_writes_total", step="status") - statuses0
             >= max(1, N // 4), timeout=bound(60, SEND_S), interval=0.05,
             what=f"{ident} converging {max(1, N // 4)} TeamSpaces")
    leader.sh(CONTROLLER)
    t_kill, at_kill = time.time(), answered.value
    sender.join(bound(120, SEND_S))
    assert not sender.is_alive() and not errors, errors
    created_s = time.time() - t0
    pop.live = {name: (uid, pop.specs[name]) for name, uid in result.items()}
    wait_for(lambda: holder(c.a) not in ("", ident), timeout=60, interval=0.5,
             what=f"a takeover from {ident}")
    chaos.wait_converged()
    converged_s = time.time() - t0
    after = chaos.samples()

    requests, takeovers = chaos.check("leader killed while N converge", since)
    takeover, new = c.takeover_after(t_kill, ident, requests)
    late = c.after_takeover(ident, t_kill + takeover, requests)
    assert not late, f"the killed leader wrote after the takeover: {late[:10]}"
    assert int(unit(leader, "NRestarts")) > restarts and unit(leader, "ActiveState") == "active"
    # Mid-way: the killed leader had converged some of them and its successor did the rest.
    status = [e for e in requests if e["requestReceivedTimestamp"] >= since and mhlib.ok(e)
              and e.get("objectRef", {}).get("subresource") == "status"
              and e["objectRef"].get("name", "").startswith(PREFIX)]
    by_killed = sum(e["identity"] == ident for e in status)
    by_new = sum(e["identity"] == new for e in status)
    assert by_killed and by_new, f"statuses written: {by_killed} by {ident}, {by_new} by {new}"
    mhlib.REPORT["chaos_leader_killed"] = {
        "n": N, "in_flight": IN_FLIGHT, "creates_s": round(created_s, 1),
        "creates_answered_at_kill": at_kill, "converged_s": round(converged_s, 1),
        "killed": ident, "new_leader": new, "takeover_s": round(takeover, 1),
        "statuses_by_killed": by_killed, "statuses_by_new_leader": by_new,
        "takeovers": len(takeovers),
        "relists": chaos.grown(before, after, "cnpa_relists_total"),
        "load": [round(x, 2) for x in os.getloadavg()]}
    print(mhlib.REPORT["chaos_leader_killed"])


def set_compaction(a: Host, interval: str) -> None:
    """A's API server's --etcd-compaction-interval (testhost's setting in /etc/default/testhost,
    which its unit reads), the API server restarted with it and ready."""
    a.sh(f"sed -i 's/^TESTHOST_ETCD_COMPACTION_INTERVAL=.*/TESTHOST_ETCD_COMPACTION_INTERVAL={interval}/' "
         "/etc/default/testhost && systemctl restart kube-apiserver", timeout=120)
    wait_for(lambda: a.kubectl("get", "--raw", "/readyz", check=False).stdout == "ok",
             timeout=READY_S, interval=0.5, what="A's API server ready again")
    cmdline = a.sh("tr '\\0' ' ' < /proc/$(systemctl show -p MainPID --value kube-apiserver)/cmdline").stdout
    assert f"--etcd-compaction-interval={interval} " in cmdline, cmdline[:2000]


def all_ready(c: Cluster) -> None:
    wait_for(lambda: all(controller_ready(h) for h in c.hosts), timeout=READY_S, interval=0.5,
             what="every controller's /readyz 200")


class Frozen:
    """One freeze of the follower: made to resume from a revision kine compacted away, or not."""

    def __init__(self, chaos: Chaos, follower: Host, scratch: str, attempt: int) -> None:
        self.chaos, self.follower, self.scratch, self.attempt = chaos, follower, scratch, attempt
        self.a = chaos.a

    def run(self) -> bool:
        """FILLER ConfigMaps made in the scratch namespace (before the freeze: they take as long
        as the machine's load makes them); every controller's watches open and quiet; the
        follower frozen at kine's revision rev0, the filler deleted in one request; once kine has
        compacted past rev0 (within FREEZE_MAX), the follower's connections cut. Thawed either
        way. True when it was cut past a compaction."""
        chaos, a, follower = self.chaos, self.a, self.follower
        bulk.send_all(lambda i: chaos.api.request(
            "POST", f"/api/v1/namespaces/{self.scratch}/configmaps",
            body={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"r{self.attempt}-{i}"}}),
            [str(i) for i in range(FILLER)], IN_FLIGHT)
        self.before = chaos.settled()
        self.compactions0 = compactions(a)
        mhlib.freeze(follower.inst, True)
        t_frozen = time.monotonic()
        try:
            self.rev0, self.compacted0 = kine_revisions(a)
            # Kine compacts nothing among its newest 1,000 revisions, and TeamSpace edits bring
            # 3-4 each, at 10-40 a second when the machine is loaded: too few within the freeze.
            # The filler deleted in one request (deletecollection) is FILLER revisions, as fast
            # as kine writes them. Sent in the background: on a loaded machine it outlasts the
            # request timeout.
            deleter = threading.Thread(target=self.delete_filler, name="chaos-filler", daemon=True)
            deleter.start()
            try:
                wait_for(lambda: kine_revisions(a)[1] > self.rev0, timeout=FREEZE_MAX - 2,
                         interval=0.5, what="kine's compaction")
                past = True
            except AssertionError:
                past = False
            self.newest, self.compacted = kine_revisions(a)
            self.during = chaos.samples([h for h in chaos.c.hosts if h is not follower])
            if past:
                # What the frozen follower saw is at most rev0, and kine holds nothing up to
                # compacted any more: its watches must resume from a revision that is gone.
                sockets = mhlib.api_sockets(mhlib.unit_pids(follower.inst),
                                            a.inst.ports["apiserver"])
                assert len(sockets) >= 3, f"{follower.inst.name}'s connections: {sockets}"
                mhlib.cut(sockets, a.inst.ports["apiserver"])
        finally:
            mhlib.freeze(follower.inst, False)
            self.frozen_s = time.monotonic() - t_frozen
        deleter.join(120)
        print(f"kine: revision {self.rev0} at the freeze, compacted {self.compacted0} -> "
              f"{self.compacted} (newest {self.newest}) within {self.frozen_s:.1f} s frozen")
        return past

    def delete_filler(self) -> None:
        try:
            self.chaos.api.request("DELETE", f"/api/v1/namespaces/{self.scratch}/configmaps",
                                   timeout=120)
        except Exception as exc:  # seen in the figures: kine's revisions say what it did
            print(f"deleting the filler: {exc}")


def test_compaction_while_watches_are_open(chaos):
    """On kine (the test hosts' default, a single k3s server's datastore), A's API server asks for
    a compaction every COMPACTION. While every controller's watches are open, every TeamSpace is
    edited and kine compacts past the revision a frozen follower last saw (kine keeps its newest
    1,000 revisions whatever it is asked: FILLER more are written at once): the other two keep
    their watches open throughout (no watch started again). The follower's connections are cut
    while it is frozen, so thawed it resumes its watches from a revision kine no longer holds: the
    API server serves it from its watch cache or answers 410 (then it lists again). Either way it
    loses nothing: made the only candidate, it leads and serves the deletion of a tenth."""
    c, pop, a = chaos.c, chaos.pop, chaos.a
    if a.inst.datastore() != "kine":
        pytest.skip(f"{a.inst.name} stores in {a.inst.datastore()}; this test is about kine")
    original = a.inst.setting("TESTHOST_ETCD_COMPACTION_INTERVAL")
    assert original, "no TESTHOST_ETCD_COMPACTION_INTERVAL in A's /etc/default/testhost"
    chaos.ensure_converged()
    stopped: list[Host] = []
    scratch = f"{PREFIX}revisions"
    try:
        set_compaction(a, COMPACTION)
        chaos.reconnect()
        all_ready(c)
        since = rfc3339(time.time())
        leader, _ = c.leader()
        follower = next(h for h in c.hosts[1:] if h is not leader)  # A holds the API server
        chaos.api.request("POST", "/api/v1/namespaces", body={
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": scratch}})
        # Changes the controllers see while their watches are open: every TeamSpace's pods, in
        # the background (at N = 5,000 that outlasts the freeze).
        for name, (uid, spec) in list(pop.live.items()):
            pop.live[name] = (uid, dict(spec, pods=1 + spec["pods"] % 50))
        edited, edits = len(pop.live), []

        def edit() -> None:
            try:
                bulk.send_all(lambda name: chaos.api.request(
                    "PATCH", f"{bulk.TEAMSPACES}/{name}",
                    body={"spec": {"pods": pop.live[name][1]["pods"]}},
                    content_type="application/merge-patch+json"), list(pop.live), IN_FLIGHT)
            except BaseException as exc:  # re-raised below, in the test's thread
                edits.append(exc)
        editor = threading.Thread(target=edit, name="chaos-edit", daemon=True)
        editor.start()
        # A loaded machine may write too slowly for one freeze: then the follower is thawed
        # before its watchdog would restart it, and frozen again.
        freezes = []
        for attempt in range(FREEZES):
            freezes.append(Frozen(chaos, follower, scratch, attempt))
            if freezes[-1].run():
                break
        f = freezes[-1]
        assert f.compacted > f.rev0, (
            f"kine did not compact past the frozen follower's revision within {FREEZE_MAX:.0f} s, "
            f"{len(freezes)} times: {[(x.rev0, x.compacted0, x.compacted, x.newest) for x in freezes]}")
        kept_open = chaos.grown(f.before, f.during, "cnpa_watch_restarts_total")
        assert not any(kept_open.values()), f"watches started again during the compaction: {kept_open}"
        wait_for(lambda: min(chaos.grown(f.before, chaos.samples(), "cnpa_watch_restarts_total",
                                         resource=r)[follower.inst.name]
                             for r in ("teamspaces", "namespaces", "resourcequotas")) >= 1,
                 timeout=60, interval=0.5, what=f"{follower.inst.name}'s three watches resumed")
        editor.join(bound(120, SETTLE_S))
        assert not editor.is_alive() and not edits, edits
        chaos.wait_converged()
        all_ready(c)
        resumed = chaos.samples()

        # The follower whose watches resumed from a compacted revision leads, and serves the
        # deletion of a tenth from its caches.
        for h in c.hosts:
            if h is not follower:
                h.sh("systemctl stop cnpa-op")  # gives the Lease up if it holds it
                stopped.append(h)
        wait_for(lambda: holder(a).rsplit("_", 1)[0] == follower.inst.name, timeout=60,
                 interval=0.5, what=f"{follower.inst.name} holding the Lease")
        tenth = sorted(pop.live)[-max(1, N // 10):]
        t_delete = time.monotonic()
        bulk.delete(chaos.api, tenth, in_flight=IN_FLIGHT, retry_until=time.monotonic() + 120)
        for name in tenth:
            uid, _ = pop.live.pop(name)
            pop.deleted[uid] = name
        drained, namespaces_gone = chaos.wait_deleted(tenth, t_delete)
        for h in stopped:
            h.sh("systemctl start cnpa-op")
        stopped = []
        all_ready(c)
        after = chaos.samples()
        requests, takeovers = chaos.check("compaction while watches are open", since)
        deleted_by = {e["identity"].rsplit("_", 1)[0] for e in requests
                      if e["requestReceivedTimestamp"] >= since and mhlib.ok(e)
                      and e["verb"] == "create" and e.get("objectRef", {}).get("resource") == "configmaps"
                      and e["objectRef"].get("name", "").removeprefix("archive-") in pop.deleted}
        assert deleted_by == {follower.inst.name}, f"archived by {deleted_by}"
        mhlib.REPORT["chaos_compaction"] = {
            "n": N, "compaction_interval": COMPACTION, "follower": follower.inst.name,
            "freezes": len(freezes), "frozen_s": round(f.frozen_s, 1), "edits": edited,
            "filler_configmaps_deleted": FILLER,
            "revision_at_freeze": f.rev0, "compacted_before": f.compacted0,
            "compacted_at_cut": f.compacted, "newest_at_cut": f.newest,
            "api_server_compactions_while_frozen": compactions(a) - f.compactions0,
            "watch_restarts_of_the_others_while_frozen": kept_open,
            "follower_on_resume": {
                k: chaos.grown(f.before, resumed, f"cnpa_{k}_total")[follower.inst.name]
                for k in ("watch_restarts", "relists")} | {
                "watch_failures_410": chaos.grown(f.before, resumed, "cnpa_watch_failures_total",
                                                  code="410")[follower.inst.name]},
            "deleted_by_follower": len(tenth), "drained_s": round(drained, 1),
            "namespaces_gone_s": round(namespaces_gone, 1), "takeovers": len(takeovers),
            "relists": chaos.grown(f.before, after, "cnpa_relists_total"),
            "load": [round(x, 2) for x in os.getloadavg()], "started": since}
    finally:
        for h in stopped:
            h.sh("systemctl start cnpa-op")
        set_compaction(a, original)
        chaos.reconnect()
        a.kubectl("delete", "namespace", scratch, "--ignore-not-found", "--wait=false")
    all_ready(c)
    print(mhlib.REPORT["chaos_compaction"])


def test_api_server_restarted_during_mass_deletion(chaos):
    """Every TeamSpace of the population (N converged) deleted as fast as the client goes; once a
    quarter of the deletions is archived, A's kube-apiserver killed and started again by systemd
    (the requests that fail meanwhile are sent again once it is back): every deletion is archived
    exactly once and released, every namespace goes, one writer throughout, also if the lease ran
    out meanwhile."""
    c, pop, a = chaos.c, chaos.pop, chaos.a
    chaos.ensure_converged()
    names = sorted(pop.live)
    before = chaos.settled()
    t0, since = started()
    m0 = time.monotonic()
    answered, errors = Progress(), []

    def archived() -> float:
        return sum(chaos.grown(before, chaos.samples(), "cnpa_writes_total", step="archive",
                               op="configmap").values())

    def send() -> None:
        try:
            bulk.delete(chaos.api, names, in_flight=IN_FLIGHT,
                        retry_until=time.monotonic() + bound(300, SEND_S), progress=answered)
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    # The hard way: SIGTERM (systemctl restart) kept it serving 4 s, in which a drain of 100
    # finished, interrupted by nothing. Killed, its requests in flight die unanswered (some
    # done, some not), and systemd starts it again (Restart=always, RestartSec=2).
    def main_pid() -> str:
        return a.sh("systemctl show -p MainPID --value kube-apiserver").stdout.strip()
    # Read before the drain, and the count after the kill: from the quarter to the kill only the
    # kill runs. (With a read and a metrics scrape between them, on a loaded machine the drain of
    # 100 once finished before the kill: 44 archived before it, none after.)
    pid = main_pid()
    sender = threading.Thread(target=send, name="chaos-delete", daemon=True)
    sender.start()
    wait_for(lambda: archived() >= max(1, len(names) // 4), timeout=bound(60, SEND_S),
             interval=0.1, what=f"{len(names) // 4} deletions archived")
    t_restart = time.time()
    a.sh("systemctl kill -s SIGKILL kube-apiserver")
    archived_at_restart = archived()
    wait_for(lambda: main_pid() not in ("0", pid), timeout=60, interval=0.2,
             what="A's kube-apiserver started again by systemd")
    t_new = time.time()  # from here on, whatever the API server receives, the new one does
    wait_for(lambda: a.kubectl("get", "--raw", "/readyz", check=False).stdout == "ok",
             timeout=READY_S, interval=0.5, what="A's API server ready again")
    t_back = time.time()
    chaos.reconnect()
    sender.join(bound(300, SEND_S))
    assert not sender.is_alive() and not errors, errors
    requests_s = time.time() - t0
    for name in names:
        uid, _ = pop.live.pop(name)
        pop.deleted[uid] = name
    drained, namespaces_gone = chaos.wait_deleted(names, m0)
    after = chaos.samples()
    requests, takeovers = chaos.check("API server restarted during a mass deletion", since)
    # The restart fell inside the drain: records were archived before it and after it (the new
    # API server serves requests before its /readyz says ok).
    uids = set(pop.deleted)
    records = [epoch(e["requestReceivedTimestamp"]) for e in requests
               if e["verb"] == "create" and mhlib.ok(e)
               and e.get("objectRef", {}).get("resource") == "configmaps"
               and e["objectRef"].get("name", "").removeprefix("archive-") in uids]
    early = sum(t < t_restart for t in records)
    late = sum(t >= t_new for t in records)
    assert early and late, f"archived before the restart: {early}, after: {late}"
    # A create whose answer the kill swallowed is sent again and answered AlreadyExists; the
    # executor then reads the record and finds it the same.
    again = sum(1 for e in requests if e["verb"] == "create"
                and e.get("objectRef", {}).get("resource") == "configmaps"
                and e["objectRef"].get("name", "").removeprefix("archive-") in uids
                and e.get("responseStatus", {}).get("code") == 409)
    mhlib.REPORT["chaos_api_restart"] = {
        "n": len(names), "in_flight": IN_FLIGHT, "delete_requests_s": round(requests_s, 1),
        "archived_at_restart": archived_at_restart, "archived_before_restart": early,
        "archived_after_restart": late, "archive_creates_already_there": again,
        "api_away_s": round(t_back - t_restart, 1),
        "drained_s": round(drained, 1),
        "namespaces_gone_s": round(namespaces_gone, 1),
        "leader_after": host_of(holder(a), c.hosts).inst.name, "takeovers": len(takeovers),
        "relists": chaos.grown(before, after, "cnpa_relists_total"),
        "watch_failures_410": chaos.grown(before, after, "cnpa_watch_failures_total", code="410"),
        "load": [round(x, 2) for x in os.getloadavg()], "started": since}
    print(mhlib.REPORT["chaos_api_restart"])
