"""Faults against the running controller on a real host. Each test is bounded in time (every wait
has a limit) and ends by asserting the end state; what it measured goes to `report`."""

from __future__ import annotations

import contextlib
import json
import os
import random
import time

from faultlib import ARCHIVE, FIN, LABEL, TS, wait_for

from fixtures import teamspace

SCRIPT = "/root/cnpa-op/reconcile.sh"


def active(lab) -> bool:
    return lab.sh("systemctl is-active cnpa-op", check=False).stdout.strip() == "active"


def no_half_made_objects(lab) -> None:
    """Every managed namespace belongs to a live TeamSpace (or is on its way out), holds exactly
    the one quota, and no temporary archive file is left behind."""
    live = {t["metadata"]["name"]: t["metadata"]["uid"] for t in lab.get(TS)["items"]}

    def standing() -> list[dict]:
        return [ns for ns in lab.get("namespaces", "-l", LABEL)["items"]
                if not ns["metadata"].get("deletionTimestamp")]

    # The garbage collector marks a gone TeamSpace's namespace a moment after the TeamSpace goes;
    # with two test workers on two cores it once took over 30 s (a bound against hanging only).
    with contextlib.suppress(AssertionError):
        wait_for(lambda: all(ns["metadata"]["labels"][LABEL] in live for ns in standing()),
                 timeout=90, interval=0.5, what="the garbage collector")
    for ns in standing():
        owner = ns["metadata"]["labels"][LABEL]
        assert owner in live, f"{ns['metadata']['name']} has no TeamSpace"
        refs = [r["uid"] for r in ns["metadata"]["ownerReferences"] if r.get("controller")]
        assert refs == [live[owner]]
        quotas = lab.get("resourcequotas", "-n", ns["metadata"]["name"])["items"]
        assert [q["metadata"]["name"] for q in quotas] == ["team-quota"]
    assert lab.sh(f"ls -A {ARCHIVE} | grep '^\\.' || true").stdout.strip() == ""


def test_api_server_stopped_30s(lab, report):
    since = lab.now()
    manifest = json.dumps(teamspace("outage", 3))
    lab.sh("systemctl stop kube-apiserver")
    try:
        # A user submits a TeamSpace during the outage; their client retries until the API
        # accepts it (bounded: 240 tries), so it lands the moment the API is back.
        lab.sh(f"printf '%s' '{manifest}' > /tmp/outage.json; setsid nohup bash -c 'for i in $(seq 240);"
               " do kubectl create -f /tmp/outage.json && exit 0; sleep 0.5; done' >/tmp/outage.log 2>&1 &")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert active(lab)
            time.sleep(3)
    finally:
        lab.sh("systemctl start kube-apiserver")
    t0 = time.monotonic()
    wait_for(lambda: lab.kubectl("get", "--raw", "/readyz", check=False).returncode == 0,
             timeout=120, what="API server ready")
    lab.wait_converged("outage", "alpha", timeout=120)
    report["api_outage_30s_recover_s"] = round(time.monotonic() - t0, 1)
    assert active(lab)
    journal = lab.journal(since)
    assert ("cannot list TeamSpaces, namespaces or quotas (API server unreachable or CRD missing?);"
            " pass aborted") in journal
    lab.delete(TS, "outage")
    lab.wait_gone(TS, "outage")


def test_sigkill_mid_pass_10_times(lab, report):
    seed = int(os.environ.get("CNPA_FAULTS_SEED", time.time()))
    rng = random.Random(seed)
    names = [f"kill-{i}" for i in range(6)]
    uids = {n: lab.teamspace(n, pods=2)["metadata"]["uid"] for n in names}
    # In place (finalizer included) before the kills, so kill-5's deletion must be archived.
    lab.wait_converged(*names)
    restarts0 = int(lab.service("NRestarts"))
    mid = 0
    for i in range(10):
        # Work for the pass to do: a spec change, and at kill 5 a deletion (archive + finalizer).
        lab.kubectl("patch", TS, names[i % 5], "--type", "merge", "-p",
                    json.dumps({"spec": {"pods": 10 + i}}))
        if i == 5:
            lab.delete(TS, "kill-5")
        wait_for(lambda: lab.sh(f"pgrep -f {SCRIPT}", check=False).returncode == 0, timeout=30,
                 interval=0.05, what="a pass running")
        time.sleep(rng.uniform(0, 0.6))
        out = lab.sh(f"pgrep -f {SCRIPT} >/dev/null && echo mid; systemctl kill -s SIGKILL cnpa-op").stdout
        mid += "mid" in out
        wait_for(lambda: active(lab), timeout=30, what="cnpa-op restarted")
    t0 = time.monotonic()
    lab.wait_converged(*names[:5], "alpha", timeout=120)
    lab.wait_gone(TS, "kill-5", timeout=60)
    report["sigkill_10x"] = {"seed": seed, "kills_mid_pass": mid,
                             "recover_after_last_kill_s": round(time.monotonic() - t0, 1)}
    assert mid >= 1, "no kill hit a running pass"
    assert int(lab.service("NRestarts")) >= restarts0 + 10
    assert lab.archive("kill-5") == {"name": "kill-5", "uid": uids["kill-5"], "pods": 2}
    no_half_made_objects(lab)
    for n in names[:5]:
        lab.delete(TS, n)
    for n in names[:5]:
        lab.wait_gone(TS, n)


def test_power_off_and_boot(lab, report):
    lab.kubectl("patch", TS, "alpha", "--type", "merge", "-p", '{"spec":{"pods":7}}')
    lab.sh("systemctl stop cnpa-op")  # the change must be picked up after the boot, not before
    lab.inst.poweroff()
    assert not lab.inst.running()
    t0 = time.monotonic()
    lab.inst.boot()
    lab.inst.wait_ready()
    assert lab.sh("systemctl is-enabled cnpa-op").stdout.strip() == "enabled"
    lab.wait_converged("alpha", timeout=120)
    report["power_cycle_boot_to_converged_s"] = round(time.monotonic() - t0, 1)
    assert active(lab)
    lab.kubectl("patch", TS, "alpha", "--type", "merge", "-p", '{"spec":{"pods":4}}')
    lab.wait_converged("alpha")


def test_teamspace_deleted_while_controller_stopped(lab, report):
    uid = lab.teamspace("ghost", pods=2)["metadata"]["uid"]
    lab.wait_converged("ghost")
    lab.sh("systemctl stop cnpa-op")
    try:
        lab.delete(TS, "ghost")
        time.sleep(5)
        t = lab.ts_or_none("ghost")
        assert t and t["metadata"].get("deletionTimestamp") and FIN in t["metadata"]["finalizers"]
        assert lab.archive("ghost") is None or lab.archive("ghost")["uid"] != uid
    finally:
        lab.sh("systemctl start cnpa-op")
    t0 = time.monotonic()
    lab.wait_gone(TS, "ghost", timeout=60)
    report["deleted_while_stopped_start_to_gone_s"] = round(time.monotonic() - t0, 1)
    assert lab.archive("ghost") == {"name": "ghost", "uid": uid, "pods": 2}
    lab.wait_gone("namespace", "team-ghost", timeout=120)


def test_archive_directory_not_writable(lab, report):
    uid = lab.teamspace("locked", pods=3)["metadata"]["uid"]
    lab.wait_converged("locked")
    since = lab.now()
    # The service runs without CAP_DAC_OVERRIDE (sandbox), so 0555 stops it like any user.
    lab.sh(f"chmod 0555 {ARCHIVE}")
    try:
        lab.delete(TS, "locked")
        wait_for(lambda: "TeamSpace locked: cannot write" in lab.journal(since), timeout=30,
                 what="the archive error in the journal")
        [ev] = wait_for(lambda: [e for e in lab.events("locked") if e["reason"] == "ArchiveFailed"],
                        timeout=30, what="ArchiveFailed Event")
        assert ev["involvedObject"]["uid"] == uid and "keeping the finalizer" in ev["message"]
        time.sleep(4)  # more passes fail the same way: still one Event (bounded)
        assert len([e for e in lab.events("locked") if e["reason"] == "ArchiveFailed"]) == 1
        t = lab.ts_or_none("locked")
        assert t and t["metadata"]["finalizers"] == [FIN]
        assert lab.archive("locked") is None
    finally:
        lab.sh(f"chmod 0755 {ARCHIVE}")
    t0 = time.monotonic()
    lab.wait_gone(TS, "locked", timeout=60)
    report["archive_unwritable_fixed_to_gone_s"] = round(time.monotonic() - t0, 1)
    assert lab.archive("locked") == {"name": "locked", "uid": uid, "pods": 3}


def _watch_versions(text: str) -> list[dict]:
    dec, i, out = json.JSONDecoder(), 0, []
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return out
        obj, i = dec.raw_decode(text, i)
        out.append(obj)


def test_foreign_finalizer_churn_50_times(lab, report):
    keep, foreign = "example.com/keep", "example.com/foreign"
    lab.wait_converged("alpha")
    assert lab.get(TS, "alpha")["metadata"]["finalizers"] == [FIN]
    lab.kubectl("patch", TS, "alpha", "--type", "json", "-p",
                json.dumps([{"op": "add", "path": "/metadata/finalizers/-", "value": keep}]))
    # Every version of alpha, as a watch sees it (bounded by timeout; stopped by its PID below).
    lab.sh(f"rm -f /tmp/watch.json; setsid nohup timeout 300 kubectl get {TS} alpha --watch -o json"
           " > /tmp/watch.json 2>/dev/null & echo $! > /tmp/watch.pid")
    time.sleep(1)
    windows = []  # (rv when added, rv when removed) of the foreign finalizer
    for i in range(50):
        added = lab.kubectl("patch", TS, "alpha", "--type", "json",
                            "-o", "jsonpath={.metadata.resourceVersion}",
                            "-p", json.dumps([{"op": "add", "path": "/metadata/finalizers/-",
                                               "value": foreign}])).stdout
        if i % 10 == 5:
            # Also take ours away now and then: the controller re-adds it while we edit too.
            fins = lab.get(TS, "alpha")["metadata"]["finalizers"]
            lab.kubectl("patch", TS, "alpha", "--type", "json", "-p", json.dumps(
                [{"op": "test", "path": f"/metadata/finalizers/{fins.index(FIN)}", "value": FIN},
                 {"op": "remove", "path": f"/metadata/finalizers/{fins.index(FIN)}"}]), check=False)
        time.sleep(random.uniform(0, 0.4))
        for _ in range(20):  # a concurrent edit moves indexes: re-read and retry (bounded)
            fins = lab.get(TS, "alpha")["metadata"]["finalizers"]
            idx = fins.index(foreign)
            proc = lab.kubectl("patch", TS, "alpha", "--type", "json", "-o",
                               "jsonpath={.metadata.resourceVersion}", "-p", json.dumps(
                                   [{"op": "test", "path": f"/metadata/finalizers/{idx}", "value": foreign},
                                    {"op": "remove", "path": f"/metadata/finalizers/{idx}"}]), check=False)
            if proc.returncode == 0:
                windows.append((int(added), int(proc.stdout)))
                break
        else:
            raise AssertionError("could not remove our foreign finalizer in 20 tries")
    lab.wait_converged("alpha")
    time.sleep(1)
    lab.sh("kill -TERM $(cat /tmp/watch.pid) 2>/dev/null || true")
    versions = _watch_versions(lab.sh("cat /tmp/watch.json").stdout)
    assert len(versions) >= 100
    for v in versions:
        fins, rv = v["metadata"].get("finalizers", []), int(v["metadata"]["resourceVersion"])
        assert fins.count(FIN) <= 1, fins
        assert keep in fins, f"foreign finalizer lost at rv {rv}: {fins}"
        for a, r in windows:
            if a <= rv < r:
                assert foreign in fins, f"foreign finalizer lost at rv {rv}: {fins}"
    final = lab.get(TS, "alpha")["metadata"]["finalizers"]
    assert sorted(final) == sorted([keep, FIN])
    report["foreign_finalizer_churn"] = {"iterations": 50, "versions_checked": len(versions),
                                         "ours_removed_and_readded": 5}
    idx = final.index(keep)
    lab.kubectl("patch", TS, "alpha", "--type", "json", "-p", json.dumps(
        [{"op": "test", "path": f"/metadata/finalizers/{idx}", "value": keep},
         {"op": "remove", "path": f"/metadata/finalizers/{idx}"}]))


def test_delete_and_recreate_while_old_namespace_terminates(lab, report):
    old_uid = lab.teamspace("phoenix", pods=2)["metadata"]["uid"]
    lab.wait_converged("phoenix")
    # Something in the namespace with a finalizer of its own keeps it Terminating.
    lab.apply({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "hold", "namespace": "team-phoenix", "finalizers": ["example.com/hold"]}})
    lab.delete(TS, "phoenix")
    lab.wait_gone(TS, "phoenix")
    wait_for(lambda: lab.get("namespace", "team-phoenix")["metadata"].get("deletionTimestamp"),
             timeout=60, what="team-phoenix terminating")
    new_uid = lab.teamspace("phoenix", pods=5)["metadata"]["uid"]
    assert new_uid != old_uid
    wait_for(lambda: [e for e in lab.events("phoenix") if e["reason"] == "NamespaceTerminating"
                      and e["involvedObject"]["uid"] == new_uid],
             timeout=30, what="NamespaceTerminating Event")
    ns = lab.get("namespace", "team-phoenix")
    assert [r["uid"] for r in ns["metadata"]["ownerReferences"]] == [old_uid]  # not adopted
    status = lab.get(TS, "phoenix").get("status", {})
    assert "observedGeneration" not in status  # never claims what is not in place
    assert [(c["status"], c["reason"]) for c in status["conditions"]] == [("False", "NamespaceTerminating")]
    t0 = time.monotonic()
    lab.kubectl("patch", "configmap", "hold", "-n", "team-phoenix", "--type", "json",
                "-p", '[{"op":"remove","path":"/metadata/finalizers"}]')
    lab.wait_converged("phoenix", timeout=120)
    report["recreate_while_terminating_release_to_converged_s"] = round(time.monotonic() - t0, 1)
    ns = lab.get("namespace", "team-phoenix")
    assert [r["uid"] for r in ns["metadata"]["ownerReferences"]] == [new_uid]
    assert lab.archive("phoenix")["uid"] == old_uid
    lab.delete(TS, "phoenix")
    lab.wait_gone(TS, "phoenix")
