"""What monitoring/ (the Grafana dashboard and the alert rules) sees of the controller as users
install it: cnpa-op.service in watch mode on three hosts, sandboxed (ProcSubset=pid among the
rest), as the controller's own ServiceAccount (a token on each host), each host's metrics on a
port of its own, one Lease (the session's
`cluster` fixture, conftest.py: playbooks/controller.yml once). Runs after
test_lab_three_hosts.py and before test_watch_faults.py, whose last test uninstalls (file order).

- Never blind while ready: `watch` taken out of the controller's ClusterRole for a minute turns
  every unit's /readyz false within the stale bound, naming the cache, while /healthz stays ok,
  and CnpaCachesStale fires; once it is back, they are ready again, and the TeamSpace created and
  the one deleted meanwhile are served and archived.
- Every series and label the dashboard's queries and the alert rules name is in each installed
  unit's own /metrics, after that unit has done the work that makes the labelled ones (it led,
  wrote, archived, failed a reconcile, had its watches broken).
- Every panel of the dashboard has data from a Prometheus of the test's own (Debian's binary,
  testhost.prometheus) scraping the three units every second, and the alerts (alerts.yml, only
  their `for:` shortened) fire exactly where the run gives them cause: reconcile errors on the
  leader, controller down for the units stopped, never no leader (across two takeovers), a queue
  not draining, a stuck worker or stale caches. CNPA_DASHBOARD_DATA=PATH also writes every
  panel's answers over the run to PATH for bench/dashboard.py (docs/dashboard.png).

In this order: a minute of refused watches leaves each process's caches at their longest backoff
(30 s, as client-go's reflector's: a watch that breaks within a minute of the last failure waits
that long), which test_watch_faults.py's watches-cut test would wait out if it came next (it took
30.6 s instead of about 1 s). The two tests after it stop and start every unit: the processes
test_watch_faults.py meets are new.

Measurements go to the session's report ($CNPA_MULTIHOST_REPORT), under "monitoring".
"""

from __future__ import annotations

import inspect
import json
import math
import os
import re
import threading
import time
from pathlib import Path

import mhlib
import yaml
from hostlib import Host, http_get, wait_for
from mhlib import GROUP, REPORT, TS, holder, host_of, unit
from promlib import ALERTS, Prometheus, dashboard, dashboard_targets, queries, scraped, substitute, unknown

from cnpa_controller.cache import Informer
from cnpa_controller.controller import Settings
from testhost import prometheus

# This module's TeamSpaces: mo<run>-.
PREFIX = f"mo{int(time.time()) % 46656:x}"
# The rules' own `for:` is minutes; here seconds: long enough that a takeover after a clean stop
# (the Lease released, taken at the next 2 s retry) is not "no leader", short enough for a test.
FOR = {"CnpaControllerDown": "3s", "CnpaNoLeader": "15s", "CnpaReconcileErrors": "2s",
       "CnpaWorkQueueNotDraining": "2s", "CnpaWorkerStuck": "2s", "CnpaCachesStale": "5s"}
# Grafana's $__rate_interval is at least four scrape intervals; the scrapes here are 1 s apart.
RATE_INTERVAL = "10s"
STEP = 1.0
# Seconds after a leader's unit stops until CnpaNoLeader is judged: its `for:` and a few rule
# evaluations.
NO_LEADER_JUDGED = 15 + 3
CLUSTER_ROLE = "cnpa-op"   # the role's cnpa_controller_sa_name
SA_USER = "system:serviceaccount:cnpa-system:cnpa-op"
# The longest wait of a cache between two failed lists or watches: once `watch` is back, each
# cache tries again within this.
BACKOFF_CAP = inspect.signature(Informer).parameters["backoff_cap"].default
OURS = {"app.kubernetes.io/managed-by": "cnpa-op"}   # the role's cnpa_controller_labels


def teamspace(name: str, pods: int = 2) -> dict:
    return {"apiVersion": f"{GROUP}/v1alpha1", "kind": "TeamSpace", "metadata": {"name": name},
            "spec": {"pods": pods}}


_ports: dict[str, int] = {}


def metrics_port(h: Host) -> int:
    """The host's metrics port (testhost's inventory line), checked once against what its
    installed unit serves on: the scrape is of that unit."""
    if h.inst.name not in _ports:
        port = h.inst.ports["metrics"]
        env = unit(h, "Environment").split()
        assert f"CNPA_METRICS_ADDRESS=127.0.0.1:{port}" in env, env
        _ports[h.inst.name] = port
    return _ports[h.inst.name]


def scrape(h: Host) -> str:
    status, text = http_get(metrics_port(h), "/metrics", timeout=5)
    assert status == 200, f"{h.inst.name}: /metrics answered {status}"
    return text


def sample(text: str, metric: str, **labels: str) -> float | None:
    """The value of the first sample of that name whose labels include these, if any."""
    for line in text.splitlines():
        found = re.match(r"^([a-zA-Z_:][\w:]*)(\{(.*)\})? (\S+)", line)
        if found and found.group(1) == metric:
            have = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', found.group(3) or ""))
            if labels.items() <= have.items():
                return float(found.group(4))
    return None


def served(admin: Host, name: str) -> bool:
    """Served: Ready True at its generation, its namespace and its quota there."""
    proc = admin.kubectl("get", TS, name, "-o", "json", check=False)
    if proc.returncode:
        return False
    t = json.loads(proc.stdout)
    st = t.get("status") or {}
    conditions = [c for c in st.get("conditions") or [] if c.get("type") == "Ready"]
    if st.get("observedGeneration") != t["metadata"]["generation"] \
            or [c.get("status") for c in conditions] != ["True"]:
        return False
    quota = admin.kubectl("get", "resourcequota", "team-quota", "-n", f"team-{name}", "-o",
                          "jsonpath={.spec.hard.pods}", check=False)
    return quota.returncode == 0 and quota.stdout == str(t["spec"]["pods"])


def gone(admin: Host, name: str) -> bool:
    return not admin.exists(TS, name)


def archive_records(admin: Host, uid: str) -> int:
    """Archive ConfigMaps of this uid (ConfigMap archive-UID in cnpa-system, our label)."""
    items = admin.get("configmaps", "-n", mhlib.LEASE_NS, "-l", mhlib.ARCHIVE_LABEL)["items"]
    return sum(1 for cm in items if cm["metadata"]["name"] == f"archive-{uid}")


def all_ready(hosts: list[Host]) -> bool:
    return all(http_get(metrics_port(h), "/readyz", timeout=5)[0] == 200 for h in hosts)


def start_units(hosts: list[Host]) -> None:
    for h in hosts:
        h.sh("systemctl start cnpa-op")
    wait_for(lambda: all_ready(hosts), timeout=90, interval=0.5,
             what=f"cnpa-op ready again on {[h.inst.name for h in hosts]}")


def _rules_with_short_for(path: Path) -> None:
    doc = yaml.safe_load(ALERTS.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule["for"] = FOR[rule["alert"]]
    path.write_text(yaml.safe_dump(doc))


def _prometheus(hosts: list[Host], workdir: Path) -> Prometheus:
    rules = workdir / "alerts.yml"
    _rules_with_short_for(rules)
    return Prometheus(prometheus.binaries() / "prometheus", workdir / "prometheus",
                      [f"127.0.0.1:{metrics_port(h)}" for h in hosts], [rules])


def _fired(prom: Prometheus, alert: str, start: float, end: float) -> list[dict]:
    """The series of ALERTS (Prometheus's record of its alerts) in state firing."""
    return prom.query_range(f'ALERTS{{alertname="{alert}", alertstate="firing"}}', start, end, STEP)


def _finite(result: list[dict]) -> bool:
    return any(not math.isnan(float(v)) for s in result for _, v in s["values"])


def _delete_foreign(admin: Host, name: str) -> None:
    admin.kubectl("delete", TS, name, "--wait=false", "--ignore-not-found")
    admin.kubectl("delete", "namespace", f"team-{name}", "--wait=false", "--ignore-not-found")


# -- 1. never blind while ready ------------------------------------------------------------------
class Probe:
    """A thread asking every unit's /healthz and /readyz every half second: (time, host, healthz
    status, readyz status, readyz body). Bounded: it stops after max_seconds on its own."""

    def __init__(self, hosts: list[Host], max_seconds: float = 400) -> None:
        self.ports = {h.inst.name: metrics_port(h) for h in hosts}
        self.samples: list[tuple[float, str, int, int, str]] = []
        self.max_seconds = max_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="probe")

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        t_end = time.monotonic() + self.max_seconds
        while not self._stop.is_set() and time.monotonic() < t_end:
            for name, port in self.ports.items():
                health = http_get(port, "/healthz", timeout=5)[0]
                status, body = http_get(port, "/readyz", timeout=5)
                self.samples.append((time.time(), name, health, status, body))
            self._stop.wait(0.5)

    def first(self, name: str, since: float, predicate) -> tuple[float, str] | None:
        """(time, readyz body) of the first sample of host name at or after since that fits."""
        for t, who, health, status, body in list(self.samples):
            if who == name and t >= since and predicate(health, status, body):
                return t, body
        return None


def _rules_without_watch(rules: list[dict]) -> list[dict]:
    return [{**r, "verbs": [v for v in r["verbs"] if v != "watch"]} for r in rules]


def _replace_rules(admin: Host, uid: str, rules: list[dict]) -> None:
    """Replace the ClusterRole's rules, guarded: it must be ours (label, uid) and unchanged since
    read (its resourceVersion, which `kubectl replace` sends)."""
    role = admin.get("clusterrole", CLUSTER_ROLE)
    meta = role["metadata"]
    assert meta["uid"] == uid and OURS.items() <= (meta.get("labels") or {}).items(), meta
    role["rules"] = rules
    admin.kubectl("replace", "-f", "-", input_text=json.dumps(role))


def _restore_rules(admin: Host, uid: str, rules: list[dict]) -> None:
    """Put the rules back as the role applies them: server-side, as field manager cnpa-op (which
    a replace by the admin had taken them from). Put back by a replace, they would stay the
    admin's, and the role's next run would report a change taking them back."""
    role = admin.get("clusterrole", CLUSTER_ROLE)
    meta = role["metadata"]
    assert meta["uid"] == uid and OURS.items() <= (meta.get("labels") or {}).items(), meta
    applied = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": CLUSTER_ROLE, "labels": meta["labels"]}, "rules": rules}
    admin.kubectl("apply", "--server-side", "--field-manager=cnpa-op", "--force-conflicts",
                  "-f", "-", input_text=json.dumps(applied))


def _can_watch(admin: Host) -> bool:
    proc = admin.kubectl("auth", "can-i", "watch", f"teamspaces.{GROUP}", f"--as={SA_USER}",
                         check=False)
    return proc.stdout.strip() == "yes"


def test_never_blind_while_ready(cluster, tmp_path):
    """`watch` taken out of the ClusterRole cnpa-op for about a minute (as the admin; put back
    exactly as it was, even on failure). An RBAC change reaches a watch only when it is made
    again, and the open ones last until their server-side timeout (5 min or more), so every
    unit's connections to the API server are cut right after, as an API server restart or a
    network blip would: each watch made again is refused (403). Within the stale bound (the
    program's default, which the role installs) every unit's /readyz answers 500 naming the
    stale cache, /healthz stays 200, cnpa_cache_stale is 1, cnpa_watch_failures_total{code="403"}
    counts, and CnpaCachesStale fires. Right after the cut a TeamSpace is created and another
    deleted. Once `watch` is back: every unit ready again within a backoff, and by then the new
    TeamSpace served (namespace, quota, Ready) and the deleted one archived (exactly one archive
    ConfigMap for its uid); the times say whether the list that follows each refused watch
    served them while `watch` was away."""
    c = cluster
    a = c.a
    bound = Settings.cache_stale_seconds
    for h in c.hosts:
        assert "CNPA_CACHE_STALE_SECONDS=" not in unit(h, "Environment")
    role = a.get("clusterrole", CLUSTER_ROLE)
    uid, rules = role["metadata"]["uid"], role["rules"]
    assert OURS.items() <= (role["metadata"].get("labels") or {}).items(), role["metadata"]
    assert any("watch" in r["verbs"] for r in rules), rules
    old, new = f"{PREFIX}-nold", f"{PREFIX}-nnew"
    a.apply(teamspace(old))
    wait_for(lambda: served(a, old), timeout=60, interval=0.5, what=f"{old} served")
    old_uid = a.get(TS, old)["metadata"]["uid"]
    wait_for(lambda: all_ready(c.hosts), timeout=60, interval=0.5, what="every unit ready")
    prom = _prometheus(c.hosts, tmp_path)
    out: dict = {"stale_bound_s": bound}
    done: dict[str, float] = {}

    def changes_done() -> bool:
        now = time.time()
        if "served" not in done and served(a, new):
            done["served"] = now
        if "archived" not in done and gone(a, old):
            done["archived"] = now
        return len(done) == 2

    try:
        prom.start()
        wait_for(lambda: len(prom.query('up{job="cnpa-op"} == 1')) == 3, timeout=30,
                 what="the three units scraped")
        with Probe(c.hosts) as probe:
            try:
                _replace_rules(a, uid, _rules_without_watch(rules))
                t_removed = time.time()
                wait_for(lambda: not _can_watch(a), timeout=30, interval=0.2,
                         what="watch refused to the controller's identity")
                t_cut = time.time()
                assert mhlib.cut_api_connections(c.hosts, a.inst.ports["apiserver"]) >= 9
                a.apply(teamspace(new))
                a.kubectl("delete", TS, old, "--wait=false")

                def stale_everywhere() -> bool:
                    changes_done()   # (timed from the start: the leader may serve them at once)
                    return all(probe.first(h.inst.name, t_cut, lambda _h, s, b: s == 500 and
                                           "stale" in b) for h in c.hosts)
                wait_for(stale_everywhere, timeout=bound + 30, interval=0.5,
                         what="every unit's /readyz failing on a stale cache")
                for h in c.hosts:
                    t, body = probe.first(h.inst.name, t_cut, lambda _h, s, b: s == 500)
                    assert "stale" in body and "403" in body, f"{h.inst.name}: {body}"
                    out.setdefault("readyz_false_after_s", {})[h.inst.name] = round(t - t_cut, 1)
                    # Ready until the bound has passed: one refused watch is not yet blindness.
                    assert t - t_removed >= bound - 1, \
                        f"{h.inst.name} unready {t - t_removed:.1f} s after watch was taken away"
                    text = scrape(h)
                    for resource in ("teamspaces", "namespaces", "resourcequotas"):
                        assert sample(text, "cnpa_cache_stale", resource=resource) == 1, \
                            (h.inst.name, resource)
                        assert (sample(text, "cnpa_watch_failures_total", resource=resource,
                                       code="403") or 0) >= 1, (h.inst.name, resource)

                def stale_alert_everywhere() -> bool:
                    changes_done()
                    return len({s["metric"]["instance"] for s in _fired(
                        prom, "CnpaCachesStale", t_cut, time.time())}) == 3
                wait_for(stale_alert_everywhere, timeout=60, interval=1,
                         what="CnpaCachesStale firing for every unit")
                # Held for about a minute in all, watching for the changes made meanwhile.
                while time.time() < t_removed + 60:
                    changes_done()
                    time.sleep(1)
            finally:
                _restore_rules(a, uid, rules)
            t_back = time.time()
            out["watch_removed_s"] = round(t_back - t_removed, 1)
            assert a.get("clusterrole", CLUSTER_ROLE)["rules"] == rules
            wait_for(lambda: _can_watch(a), timeout=30, interval=0.2,
                     what="watch allowed again")
            wait_for(lambda: all(probe.first(h.inst.name, t_back, lambda _h, s, _b: s == 200)
                                 for h in c.hosts), timeout=BACKOFF_CAP + 15, interval=0.5,
                     what="every unit ready again")
            for h in c.hosts:
                t, _ = probe.first(h.inst.name, t_back, lambda _h, s, _b: s == 200)
                out.setdefault("readyz_true_after_s", {})[h.inst.name] = round(t - t_back, 1)
            wait_for(changes_done, timeout=max(5.0, t_back + BACKOFF_CAP + 15 - time.time()),
                     interval=0.5, what=f"{new} served and {old} archived and gone")
            # Seconds from the change (made right after the cut) until served; a refused watch
            # is followed by a list, as client-go's reflector does, so this may come before
            # watch is back.
            out["new_served_after_s"] = round(done["served"] - t_cut, 1)
            out["old_archived_after_s"] = round(done["archived"] - t_cut, 1)
            out["served_before_watch_back"] = max(done.values()) < t_back
            assert archive_records(a, old_uid) == 1
            healthz = {(who, status) for _t, who, status, _s, _b in probe.samples}
            assert healthz == {(h.inst.name, 200) for h in c.hosts}, healthz
        for h in c.hosts:
            text = scrape(h)
            assert all(sample(text, "cnpa_cache_stale", resource=r) == 0
                       for r in ("teamspaces", "namespaces", "resourcequotas")), h.inst.name
    finally:
        prom.stop()
    REPORT.setdefault("monitoring", {})["never_blind"] = out
    print(f"never blind while ready: {out}")


# -- 2. every series monitoring/ names, on each installed unit -----------------------------------
def _diff(text: str) -> list[str]:
    # `up` is Prometheus's own, not the target's.
    series = scraped(text) | {"up": set()}
    return [f"{where}: {problem}" for where, expr, legend in queries()
            for problem in unknown(expr, legend, series)]


def test_every_series_monitoring_names_is_on_each_installed_unit(cluster):
    """Each unit in turn is made the only one running (the others stopped: each gives the Lease
    up), so that it leads and does the work whose series are born at first use: a TeamSpace
    created (namespace, quota, status writes) and deleted (its archive record), one whose
    namespace somebody else made (a failed reconcile, cnpa_errors_total{reason}), and its watches
    broken at the socket (cnpa_watch_failures_total). Then its /metrics must have every series
    and label the dashboard and the alerts name; process_* among them, which the sandbox's
    ProcSubset=pid hid from prometheus_client's own collector."""
    c = cluster
    a = c.a
    for h in c.hosts:
        assert (unit(h, "ProcSubset"), unit(h, "ProtectProc")) == ("pid", "invisible"), \
            f"{h.inst.name}: not the sandboxed unit the role installs"
    foreign = f"{PREFIX}-foreign"
    a.kubectl("create", "namespace", f"team-{foreign}")
    a.apply(teamspace(foreign))
    running, seconds = list(c.hosts), {}
    try:
        for i, h in enumerate(c.hosts):
            t0 = time.monotonic()
            if h not in running:
                start_units([h])
                running.append(h)
            for o in [o for o in running if o is not h]:
                o.sh("systemctl stop cnpa-op")   # a leader gives the Lease up
                running.remove(o)
            wait_for(lambda h=h: holder(a) and host_of(holder(a), c.hosts) is h, timeout=60,
                     interval=0.5, what=f"{h.inst.name} leading")
            name = f"{PREFIX}-s{i}"
            a.apply(teamspace(name))
            wait_for(lambda name=name: served(a, name), timeout=60, interval=0.5,
                     what=f"{name} served by {h.inst.name}")
            a.kubectl("delete", TS, name, "--wait=false")
            wait_for(lambda name=name: gone(a, name), timeout=60, interval=0.5,
                     what=f"{name} archived and gone")
            assert mhlib.cut_api_connections([h], a.inst.ports["apiserver"]) >= 3

            def complete(h=h) -> bool:
                text = scrape(h)
                return not _diff(text) and sample(
                    text, "cnpa_errors_total", reason="NamespaceNotOurs") is not None
            try:
                wait_for(complete, timeout=30, interval=1, what=f"{h.inst.name}'s series")
            except AssertionError:
                pass   # the assertions below say what is missing
            text = scrape(h)
            assert not _diff(text), f"{h.inst.name}'s /metrics lacks what monitoring/ names: " \
                f"{_diff(text)}"
            assert sample(text, "cnpa_errors_total", reason="NamespaceNotOurs"), h.inst.name
            seconds[h.inst.name] = round(time.monotonic() - t0, 1)
    finally:
        _delete_foreign(a, foreign)
        start_units([h for h in c.hosts if h not in running])
    REPORT.setdefault("monitoring", {})["series_per_unit_s"] = seconds
    print(f"each unit led, worked and had every series: {seconds}")


# -- 3. the dashboard and the alerts on a real Prometheus --------------------------------------
def _depth(h: Host) -> float | None:
    return sample(scrape(h), "workqueue_depth", name="teamspace")


def test_every_panel_has_data_and_the_alerts_fire_where_they_should(cluster, tmp_path):
    """After real work on the installed units (TeamSpaces made, a quota edit set back, one
    deleted and archived, one whose namespace somebody else made so that each reconcile of it
    fails, every unit's watches broken twice, the leader's unit stopped and another taking over),
    every query of every panel, with the dashboard's variables filled in, returns data with the
    labels its legend names; then a second unit is stopped."""
    c = cluster
    a = c.a
    ports = {h.inst.name: metrics_port(h) for h in c.hosts}
    leader, ident = c.leader()
    # The leader queues every TeamSpace when it takes over; Prometheus starts once that is done,
    # so that a queue busy from the first scrape on is not the not-draining alert's case.
    wait_for(lambda: all(_depth(h) == 0 for h in c.hosts), timeout=60, what="the queues empty")
    prom = _prometheus(c.hosts, tmp_path)
    stopped: list[Host] = []
    names = [f"{PREFIX}-d{i}" for i in range(6)]
    foreign = f"{PREFIX}-dforeign"
    try:
        prom.start()
        start = time.time()
        wait_for(lambda: len(prom.query('up{job="cnpa-op"} == 1')) == 3, timeout=30,
                 what="the three units scraped")
        # Until its first scrapes a new Prometheus has no `up` at all: with a `for:` of seconds,
        # the absent() half of CnpaControllerDown may fire then. The alerts are judged from the
        # next rule evaluations on.
        judged_from = time.time() + 2

        # One TeamSpace first, scraped, then five: a labelled counter is born at its first
        # increment, which rate() cannot count; the five later ones it can.
        a.apply(teamspace(names[0]))
        wait_for(lambda: served(a, names[0]), timeout=60, interval=0.5, what=f"{names[0]} served")
        wait_for(lambda: prom.query('cnpa_writes_total{step="quota", op="create"}'), timeout=30,
                 what="the first quota write scraped")
        for name in names[1:]:
            a.apply(teamspace(name))
        for name in names[1:]:
            wait_for(lambda name=name: served(a, name), timeout=60, interval=0.5,
                     what=f"{name} served")
        a.kubectl("patch", "resourcequota", "team-quota", "-n", f"team-{names[0]}", "--type",
                  "merge", "-p", json.dumps({"spec": {"hard": {"pods": "9"}}}))
        wait_for(lambda: served(a, names[0]), timeout=60, interval=0.5, what="the quota set back")
        a.kubectl("delete", TS, names[5], "--wait=false")
        wait_for(lambda: gone(a, names[5]), timeout=60, interval=0.5,
                 what=f"{names[5]} archived and gone")
        # A namespace somebody else made: each reconcile of its TeamSpace fails and is retried.
        a.kubectl("create", "namespace", f"team-{foreign}")
        a.apply(teamspace(foreign))
        wait_for(lambda: "CnpaReconcileErrors" in prom.alerts(), timeout=60,
                 what="CnpaReconcileErrors pending or firing")
        wait_for(lambda: _fired(prom, "CnpaReconcileErrors", judged_from, time.time()),
                 timeout=30, what="CnpaReconcileErrors firing")
        [errors] = _fired(prom, "CnpaReconcileErrors", judged_from, time.time())
        assert errors["metric"]["instance"] == f"127.0.0.1:{ports[leader.inst.name]}"
        _delete_foreign(a, foreign)
        wait_for(lambda: gone(a, foreign), timeout=60, interval=0.5, what=f"{foreign} gone")

        # A real watch failure on every unit, twice (a counter born at 1 has no increase until
        # its second): their connections to the API server cut, watches resumed.
        api_port = a.inst.ports["apiserver"]
        for _ in range(2):
            assert mhlib.cut_api_connections(c.hosts, api_port) >= 9
            time.sleep(3)
        wait_for(lambda: len(prom.query(
            'increase(cnpa_watch_failures_total{code="<error>"}[30s]) > 0')) == 9
            and all_ready(c.hosts), timeout=30, interval=0.5,
            what="a watch failure counted on every unit for each of its caches, all ready")

        # The leader's unit stops (SIGTERM releases the Lease); another takes over and serves.
        # Judged for longer than CnpaNoLeader's `for:` after the stop, so that a takeover that
        # left the Lease unheld would have fired it.
        leader.sh("systemctl stop cnpa-op")
        stopped.append(leader)
        t_stop = time.time()
        new = wait_for(lambda: holder(a) not in ("", ident) and holder(a), timeout=60,
                       interval=0.5, what="another unit holding the Lease")
        successor = host_of(new, c.hosts)
        a.apply(teamspace(f"{PREFIX}-dafter"))
        wait_for(lambda: served(a, f"{PREFIX}-dafter"), timeout=60, interval=0.5,
                 what="a TeamSpace served by the successor")
        down = wait_for(lambda: _fired(prom, "CnpaControllerDown", judged_from, time.time()),
                        timeout=30, what="CnpaControllerDown firing for the stopped leader")
        assert [s["metric"].get("instance") for s in down] == \
            [f"127.0.0.1:{ports[leader.inst.name]}"], down
        time.sleep(max(0.0, t_stop + NO_LEADER_JUDGED - time.time()))
        running_until = time.time()
        for alert in ("CnpaNoLeader", "CnpaWorkQueueNotDraining", "CnpaWorkerStuck",
                      "CnpaCachesStale"):
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
        assert peak("Leader (Lease)", instance=f"127.0.0.1:{ports[successor.inst.name]}") == 1
        assert peak("Leader transitions", instance=f"127.0.0.1:{ports[successor.inst.name]}") > 0
        assert peak("Cached objects", resource="teamspaces") >= 6
        for resource in ("teamspaces", "namespaces", "resourcequotas"):
            assert peak("Watch restarts, relists and failures", resource=resource,
                        code="<error>") > 0, resource

        # The successor's unit stops too (a second takeover, by the last unit running):
        # controller down fires for both stopped units, never for the running one.
        successor.sh("systemctl stop cnpa-op")
        stopped.append(successor)
        t_stop = time.time()
        last = next(h for h in c.hosts if h not in stopped)
        wait_for(lambda: holder(a) and host_of(holder(a), c.hosts) is last, timeout=60,
                 interval=0.5, what=f"{last.inst.name} holding the Lease")
        a.apply(teamspace(f"{PREFIX}-dlast"))
        wait_for(lambda: served(a, f"{PREFIX}-dlast"), timeout=60, interval=0.5,
                 what="a TeamSpace served by the last unit running")
        wait_for(lambda: len(_fired(prom, "CnpaControllerDown", judged_from, time.time())) == 2,
                 timeout=30, what="CnpaControllerDown firing for both stopped units")
        time.sleep(max(0.0, t_stop + NO_LEADER_JUDGED - time.time()))
        end = time.time()
        fired = _fired(prom, "CnpaControllerDown", judged_from, end)
        assert sorted(s["metric"].get("instance") for s in fired) == \
            sorted(f"127.0.0.1:{ports[h.inst.name]}" for h in stopped), fired
        assert not _fired(prom, "CnpaNoLeader", judged_from, end)

        if os.environ.get("CNPA_DASHBOARD_DATA"):
            _write_picture_data(prom, start, end)
    finally:
        prom.stop()
        _delete_foreign(a, foreign)
        start_units(stopped)
    REPORT.setdefault("monitoring", {})["dashboard_run_s"] = round(end - start, 1)


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
