"""Leader election against a real API server: three candidate processes on this machine
(tests/controller/leaderlib.py) share one coordination.k8s.io/v1 Lease on a throwaway test host.

What must hold: at any moment at most one candidate believes it leads (its fenced is_leader());
a killed leader is replaced once its lease expires; a leader frozen past its lease reports
not-leader the moment it resumes, and the Lease stays with its successor; a clean shutdown
releases the Lease; leaseTransitions counts the changes of holder.

The host is the session's (tests/controller/conftest.py). Waits are bounded (they only prevent
hanging); nothing here asserts a speed.
"""

from __future__ import annotations

import json
import re
import signal
import time

import pytest
from hostlib import Host, wait_for
from leaderlib import LEASE_SECONDS, Candidate, overlaps
from slowproxy import SlowProxy

NAMESPACE = "lease-tests"
WAIT = 30   # bound for a takeover; lease_seconds is 4


@pytest.fixture(scope="module")
def lease_host(host):
    if not host.exists("namespace", NAMESPACE):
        host.kubectl("create", "namespace", NAMESPACE)
    return host


@pytest.fixture
def lease_name(request):
    return re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:50].strip("-")


@pytest.fixture
def candidates(lease_host, lease_name, tmp_path):
    """A function starting n candidates on a fresh Lease; all are ended after the test."""
    started: list[Candidate] = []
    lease_host.kubectl("delete", "lease", lease_name, "-n", NAMESPACE, "--ignore-not-found")

    def start(n: int = 3, kubeconfig=None, timings=None) -> list[Candidate]:
        for i in range(n):
            started.append(Candidate(kubeconfig or lease_host.inst.kubeconfig, NAMESPACE,
                                     lease_name, f"cand-{len(started)}-{i}", tmp_path, timings))
        return started

    yield start
    for c in started:
        c.stop()
    for c in started:   # shown when the test failed
        print(f"--- {c.identity} (rc {c.proc.returncode})\n{c.log()[-3000:]}")


def lease(host: Host, name: str) -> dict:
    return host.get("lease", name, "-n", NAMESPACE)["spec"]


def the_leader(cands: list[Candidate], among=None) -> Candidate:
    """Wait (bounded) until exactly one of `among` (default: all) reports leading."""
    pool = cands if among is None else among

    def one():
        leading = [c for c in pool if c.leading_now()]
        return leading[0] if len(leading) == 1 else None

    return wait_for(one, timeout=WAIT, interval=0.1, what="exactly one candidate leading")


def handovers(cands: list[Candidate]) -> int:
    """Changes of leader identity in the order candidates reported becoming leader."""
    became = sorted((x["t"], c.identity) for c in cands for x in c.lines() if x.get("change") is True)
    names = [name for _, name in became]
    return sum(1 for a, b in zip(names, names[1:]) if a != b)


@pytest.mark.etcd_too
def test_three_candidates_exactly_one_leads(lease_host, lease_name, candidates):
    cands = candidates(3)
    leader = the_leader(cands)
    time.sleep(2 * LEASE_SECONDS)   # several renewals and many polls by the others
    assert overlaps(cands) == []
    assert [c.identity for c in cands if c.leading_now()] == [leader.identity]
    spec = lease(lease_host, lease_name)
    assert spec["holderIdentity"] == leader.identity
    assert spec["leaseDurationSeconds"] == LEASE_SECONDS
    assert spec["leaseTransitions"] == handovers(cands)
    assert all(c.proc.poll() is None for c in cands)


@pytest.mark.etcd_too
def test_killed_leader_is_replaced(lease_host, lease_name, candidates):
    cands = candidates(3)
    first = the_leader(cands)
    before = lease(lease_host, lease_name)["leaseTransitions"]
    first.signal(signal.SIGKILL)
    first.proc.wait(timeout=10)
    rest = [c for c in cands if c is not first]
    second = the_leader(cands, among=rest)
    assert overlaps(cands) == []
    spec = lease(lease_host, lease_name)
    assert spec["holderIdentity"] == second.identity
    assert spec["leaseTransitions"] == before + 1 == handovers(cands)
    # the survivors agree: the other one follows
    time.sleep(1)
    assert [c.identity for c in rest if c.leading_now()] == [second.identity]


@pytest.mark.etcd_too
def test_frozen_leader_stops_acting_the_moment_it_resumes(lease_host, lease_name, candidates):
    cands = candidates(3)
    frozen = the_leader(cands)
    before = lease(lease_host, lease_name)["leaseTransitions"]
    frozen.signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    rest = [c for c in cands if c is not frozen]
    successor = the_leader(cands, among=rest)
    # frozen for longer than the lease, whatever the takeover took
    time.sleep(max(0.0, stopped_at + LEASE_SECONDS + 1 - time.monotonic()))
    resumed_at = time.monotonic()
    frozen.signal(signal.SIGCONT)

    def after_resume():
        samples = [s for s in frozen.samples() if s[0] >= resumed_at]
        return samples if len(samples) >= 40 else None   # about 2 s of its samples

    samples = wait_for(after_resume, timeout=WAIT, what="samples of the resumed candidate")
    assert samples[0][1] is False, "the resumed process believed it led before re-reading the Lease"
    assert not any(leading for _, leading in samples)
    changes = [x["change"] for x in frozen.lines() if "change" in x]
    assert changes[:2] == [True, False]
    assert overlaps(cands) == []
    spec = lease(lease_host, lease_name)
    assert spec["holderIdentity"] == successor.identity
    assert spec["leaseTransitions"] == before + 1 == handovers(cands)
    assert "stopped leading on lease" in frozen.log()


@pytest.mark.etcd_too
def test_clean_shutdown_releases_the_lease(lease_host, lease_name, candidates):
    cands = candidates(3)
    first = the_leader(cands)
    rest = [c for c in cands if c is not first]
    before = lease(lease_host, lease_name)["leaseTransitions"]
    # Freeze the followers so that the released record stays there to be read.
    for c in rest:
        c.signal(signal.SIGSTOP)
    first.signal(signal.SIGTERM)
    assert first.proc.wait(timeout=WAIT) == 0
    assert any(x.get("released") for x in first.lines())
    spec = lease(lease_host, lease_name)
    assert not spec.get("holderIdentity")
    assert spec["leaseDurationSeconds"] == 1
    assert spec["leaseTransitions"] == before
    for c in rest:
        c.signal(signal.SIGCONT)
    second = the_leader(cands, among=rest)
    assert overlaps(cands) == []
    spec = lease(lease_host, lease_name)
    assert spec["holderIdentity"] == second.identity
    assert spec["leaseTransitions"] == before + 1 == handovers(cands)


def test_transition_event_is_recorded_on_the_lease(lease_host, lease_name):
    from cnpa_controller.api import connect
    from cnpa_controller.leader import lease_event

    # a new Lease (new uid) each run, so that Events of an earlier run do not count
    lease_host.kubectl("delete", "lease", lease_name, "-n", NAMESPACE, "--ignore-not-found")
    lease_host.apply({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                      "metadata": {"name": lease_name, "namespace": NAMESPACE}, "spec": {}})
    uid = lease_host.get("lease", lease_name, "-n", NAMESPACE)["metadata"]["uid"]
    api = connect(str(lease_host.inst.kubeconfig))
    assert lease_event(api, NAMESPACE, lease_name, "cand-x", True, uid=uid)
    assert lease_event(api, NAMESPACE, lease_name, "cand-x", False, uid=uid)
    events = json.loads(lease_host.kubectl(
        "get", "events", "-n", NAMESPACE, "-o", "json",
        "--field-selector", f"involvedObject.kind=Lease,involvedObject.name={lease_name}").stdout)["items"]
    got = sorted((e["reason"], e["message"], e["type"]) for e in events
                 if e["involvedObject"].get("uid") == uid)
    assert got == [("LeaderElection", "cand-x became leader", "Normal"),
                   ("LeaderElection", "cand-x stopped leading", "Normal")]


def test_a_slow_api_server_does_not_cost_the_lead(lease_host, lease_name, candidates, tmp_path):
    """Every request answered 2.5 s late (a proxy on loopback holds each one back), with the
    role's Lease timings (10/7/2 s): every renewal succeeds, so the leader never stops leading.
    (Reading the Lease before each renewal made one 2 + 2 x 2.5 s = 7 s apart: the fence lapsed.)"""
    admin = lease_host.inst.kubeconfig.read_text()
    server = re.search(r"server: https://127\.0\.0\.1:(\d+)", admin)
    with SlowProxy(("127.0.0.1", int(server[1])), delay=2.5) as proxy:
        slow = tmp_path / "kubeconfig-slow"
        slow.write_text(admin.replace(server[0], f"server: https://127.0.0.1:{proxy.port}"))
        cands = candidates(2, kubeconfig=slow, timings=(10, 7, 2))
        leader = wait_for(lambda: next((c for c in cands if c.leading_now()), None), timeout=60,
                          interval=0.2, what="a leader through the slow proxy")
        since = time.monotonic()
        time.sleep(60)
        samples = [lead for t, lead in leader.samples() if t >= since]
        assert len(samples) > 600 and all(samples), \
            f"the leader stopped leading {samples.count(False)} of {len(samples)} samples"
        assert [x["change"] for x in leader.lines() if "change" in x] == [True]
        assert overlaps(cands) == []
        assert "no renewal succeeded" not in leader.log()
