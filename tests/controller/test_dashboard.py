"""The Grafana dashboard's queries and the alert rules (monitoring/) on a real Prometheus.

Two controllers with leader election, as on two hosts, serve a test host's API server; a
Prometheus of this test's own (Debian's binary, testhost.prometheus) scrapes both every second.
After real work (TeamSpaces made, a quota edit set back, a TeamSpace deleted and archived, a
foreign namespace that makes every reconcile of its TeamSpace fail, a leader stopped and
replaced), every query of every panel, with the dashboard's variables filled in, must return
data, and the alerts, from alerts.yml with only their `for:` shortened, must fire exactly where
the run gives them cause: reconcile errors yes, no leader and a stuck queue never, controller
down once both processes are stopped.

CNPA_DASHBOARD_DATA=PATH also writes every panel's query_range answers over the run to PATH
(JSON) for bench/dashboard.py, which draws docs/dashboard.png from them.
"""

from __future__ import annotations

import json
import math
import os
import re
import time

import yaml
from ctllib import get_or_none, quota_hard, wait_ready
from hostlib import free_port, http_get, wait_for
from promlib import ALERTS, Prometheus, dashboard, dashboard_targets, substitute

from fixtures import teamspace
from testhost import prometheus

# The rules' own `for:` is minutes; here seconds, long enough that the takeover after a clean
# stop (the Lease released, a 0.5 s retry) is not "no leader", short enough for a test.
FOR = {"CnpaControllerDown": "3s", "CnpaNoLeader": "15s", "CnpaReconcileErrors": "2s",
       "CnpaWorkQueueNotDraining": "2s", "CnpaWorkerStuck": "2s"}
# Grafana's $__rate_interval is at least four scrape intervals; the scrapes here are 1 s apart.
RATE_INTERVAL = "10s"
STEP = 1.0


def _holder(host, namespace: str) -> str | None:
    lease = get_or_none(host, "lease", "cnpa-op", "-n", namespace) or {}
    return (lease.get("spec") or {}).get("holderIdentity")


def _depth(port: int) -> float | None:
    status, text = http_get(port, "/metrics", timeout=5)
    if status != 200:
        return None
    found = re.search(r'^workqueue_depth\{name="teamspace"\} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else None


def _rules_with_short_for(path) -> None:
    doc = yaml.safe_load(ALERTS.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule["for"] = FOR[rule["alert"]]
    path.write_text(yaml.safe_dump(doc))


def _fired(prom: Prometheus, alert: str, start: float, end: float) -> list[dict]:
    """The series of ALERTS (Prometheus's record of its alerts) in state firing."""
    return prom.query_range(f'ALERTS{{alertname="{alert}", alertstate="firing"}}', start, end, STEP)


def _finite(result: list[dict]) -> bool:
    return any(not math.isnan(float(v)) for s in result for _, v in s["values"])


def test_every_panel_has_data_and_the_alerts_fire_where_they_should(host, start_controller,
                                                                   tmp_path):
    ns = "dash-election"
    if not host.exists("namespace", ns):
        host.kubectl("create", "namespace", ns)
    election = {"CNPA_LEADER_ELECTION": "1", "CNPA_LEASE_NAMESPACE": ns, "CNPA_LEASE_SECONDS": "4",
                "CNPA_RENEW_SECONDS": "3", "CNPA_LEASE_RETRY_SECONDS": "0.5"}
    ports = {"dash-a": free_port(), "dash-b": free_port()}
    controllers = {who: start_controller(who, CNPA_LEASE_IDENTITY=who,
                                         CNPA_METRICS_ADDRESS=f"127.0.0.1:{port}", **election)
                   for who, port in ports.items()}
    holder = wait_for(lambda: _holder(host, ns), timeout=60, what="a Lease holder")

    # The new leader queues every TeamSpace the shared host has; Prometheus starts once that is
    # done, so that a queue busy from the first scrape on is not the not-draining alert's case.
    wait_for(lambda: _depth(ports[holder]) == 0, timeout=60, what="the leader's queue empty")

    rules = tmp_path / "alerts.yml"
    _rules_with_short_for(rules)
    prom = Prometheus(prometheus.binaries() / "prometheus", tmp_path / "prometheus",
                      [f"127.0.0.1:{port}" for port in ports.values()], [rules])
    try:
        prom.start()
        start = time.time()
        wait_for(lambda: len(prom.query('up{job="cnpa-op"} == 1')) == 2, timeout=30,
                 what="both controllers scraped")
        # Until its first scrapes a new Prometheus has no `up` at all: with a `for:` of seconds,
        # the absent() half of CnpaControllerDown may fire then. The alerts are judged from the
        # next rule evaluations on.
        judged_from = time.time() + 2

        # One TeamSpace first, scraped, then five: a labelled counter is born at its first
        # increment, which rate() cannot count; the five later ones it can.
        host.apply(teamspace("dash-0", pods=2))
        wait_ready(host, "dash-0")
        wait_for(lambda: prom.query('cnpa_writes_total{step="quota", op="create"}'), timeout=30,
                 what="the first quota write scraped")
        names = [f"dash-{i}" for i in range(1, 6)]
        for name in names:
            host.apply(teamspace(name, pods=2))
        for name in names:
            wait_ready(host, name)
        host.kubectl("patch", "resourcequota", "team-quota", "-n", "team-dash-0", "--type",
                     "merge", "-p", json.dumps({"spec": {"hard": {"pods": "9"}}}))
        wait_for(lambda: quota_hard(host, "dash-0") == {"pods": "2", "requests.cpu": "1"},
                 timeout=60, what="the quota set back")
        host.kubectl("delete", "teamspace", "dash-5", "--wait=false")
        wait_for(lambda: get_or_none(host, "teamspace", "dash-5") is None, timeout=60,
                 what="TeamSpace dash-5 archived and gone")
        # A namespace somebody else made: each reconcile of its TeamSpace fails and is retried.
        if not host.exists("namespace", "team-dash-foreign"):
            host.kubectl("create", "namespace", "team-dash-foreign")
        host.apply(teamspace("dash-foreign", pods=2))
        wait_for(lambda: "CnpaReconcileErrors" in prom.alerts(), timeout=60,
                 what="CnpaReconcileErrors pending or firing")
        wait_for(lambda: _fired(prom, "CnpaReconcileErrors", judged_from, time.time()),
                 timeout=30, what="CnpaReconcileErrors firing")
        [errors] = _fired(prom, "CnpaReconcileErrors", judged_from, time.time())
        assert errors["metric"]["instance"] == f"127.0.0.1:{ports[holder]}"
        host.kubectl("delete", "teamspace", "dash-foreign", "--wait=false")
        host.kubectl("delete", "namespace", "team-dash-foreign", "--wait=false")
        wait_for(lambda: get_or_none(host, "teamspace", "dash-foreign") is None, timeout=60,
                 what="TeamSpace dash-foreign gone")

        # The leader stops (SIGTERM releases the Lease); the other takes over and serves.
        assert controllers[holder].stop() == 0
        successor = next(who for who in ports if who != holder)
        wait_for(lambda: _holder(host, ns) == successor, timeout=60,
                 what=f"{successor} holding the Lease")
        host.apply(teamspace("dash-after", pods=2))
        wait_ready(host, "dash-after")
        stopped = f"127.0.0.1:{ports[holder]}"
        down = wait_for(lambda: _fired(prom, "CnpaControllerDown", judged_from, time.time()),
                        timeout=30, what="CnpaControllerDown firing for the stopped leader")
        running_until = time.time()
        assert [s["metric"].get("instance") for s in down] == [stopped], down
        for alert in ("CnpaNoLeader", "CnpaWorkQueueNotDraining", "CnpaWorkerStuck"):
            assert not _fired(prom, alert, judged_from, running_until), alert

        results = {}
        for t in dashboard_targets():
            expr = substitute(t["expr"], rate_interval=RATE_INTERVAL)
            result = prom.query_range(expr, start, running_until, STEP)
            where = f"panel {t['title']!r} {t['ref']}: {expr}"
            assert _finite(result), f"{where}: no data"
            for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", t["legend"]):
                assert all(label in s["metric"] for s in result), f"{where}: no label {label}"
            results[(t["panel"], t["ref"])] = result

        def peak(title: str, **labels: str) -> float:
            found = [float(v) for t in dashboard_targets() if t["title"] == title
                     for s in results[(t["panel"], t["ref"])]
                     if labels.items() <= s["metric"].items() for _, v in s["values"]]
            return max((v for v in found if not math.isnan(v)), default=0.0)

        assert peak("Reconciles by result", result="success") > 0
        assert peak("Reconciles by result", result="error") > 0
        assert peak("Failures by reason", reason="NamespaceNotOurs") > 0
        assert peak("Writes by step", step="quota", op="create") > 0
        # One archive record: its counter is born at 1, which rate() cannot count (no earlier
        # sample), but the series is there.
        assert any(s["metric"].get("step") == "archive" for t in dashboard_targets()
                   if t["title"] == "Writes by step" for s in results[(t["panel"], t["ref"])])
        assert peak("Leader (Lease)", instance=f"127.0.0.1:{ports[successor]}") == 1
        assert peak("Cached objects", resource="teamspaces") >= 6

        # Both stopped: the controller-down alert fires for the second one too.
        assert controllers[successor].stop() == 0
        wait_for(lambda: len(_fired(prom, "CnpaControllerDown", judged_from, time.time())) == 2,
                 timeout=30, what="CnpaControllerDown firing for both instances")
        end = time.time()

        if os.environ.get("CNPA_DASHBOARD_DATA"):
            _write_picture_data(prom, start, end)
    finally:
        prom.stop()


def _write_picture_data(prom: Prometheus, start: float, end: float) -> None:
    """Every panel and its queries' answers over the whole run, for bench/dashboard.py."""
    panels = []
    for panel in dashboard()["panels"]:
        entry = {k: panel.get(k) for k in ("id", "type", "title", "gridPos")}
        entry["unit"] = (panel.get("fieldConfig") or {}).get("defaults", {}).get("unit")
        entry["targets"] = [
            {"ref": t["refId"], "legend": t.get("legendFormat", ""), "expr": t["expr"],
             "result": prom.query_range(substitute(t["expr"], rate_interval=RATE_INTERVAL),
                                        start, end, STEP)}
            for t in panel.get("targets", [])]
        panels.append(entry)
    alerts = {name: prom.query_range(f'ALERTS{{alertname="{name}"}}', start, end, STEP)
              for name in FOR}
    data = {"start": start, "end": end, "step": STEP, "rate_interval": RATE_INTERVAL,
            "panels": panels, "alerts": alerts}
    with open(os.environ["CNPA_DASHBOARD_DATA"], "w") as fh:
        json.dump(data, fh)
