"""cnpa_controller.metrics (prometheus_client, a registry per controller), the HTTP endpoints
(/metrics, /healthz, /readyz) and the textfile; cnpa_controller.health's pure parts."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cnpa_controller import health
from cnpa_controller.api import Api, ApiError, resource_of
from cnpa_controller.metrics import KNOWN, Metrics
from cnpa_controller.workqueue import WorkQueue

ROOT = Path(__file__).resolve().parents[2]


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(text: str, metric: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == metric and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def test_known_metrics_render_with_their_types_and_process_metrics():
    text = Metrics().render()
    found = families(text)
    for name, (kind, _help, _labels, _buckets) in KNOWN.items():
        family = name[:-len("_total")] if kind == "counter" and name.endswith("_total") else name
        if _labels and kind != "gauge":
            continue   # a labelled counter or histogram has no series until first used
        assert family in found, name
        assert found[family].type == kind
    assert sample(text, "cnpa_resyncs_total") == 0
    assert sample(text, "cnpa_build_info", python=sys.version.split()[0]) == 1
    assert "process_cpu_seconds_total" in text and "python_info" in text
    if hasattr(prometheus_client, "disable_created_metrics"):   # 0.17 on; Debian 12 has 0.16
        assert "_created" not in text


def test_a_controller_starts_its_reconcile_counters_at_zero(tmp_path):
    """An alert's increase() sees a first error only if the series existed before it."""
    import io
    from types import SimpleNamespace

    from cnpa_controller.config import Settings
    from cnpa_controller.controller import Controller

    m = Metrics()
    Controller(SimpleNamespace(), Settings(archive_dir=str(tmp_path)), metrics=m,
               out=io.StringIO())
    text = m.render()
    assert sample(text, "controller_runtime_reconcile_errors_total", controller="teamspace") == 0
    for result in ("success", "error"):
        assert sample(text, "controller_runtime_reconcile_total", controller="teamspace",
                      result=result) == 0
    assert "requeue_after" not in text
    # No election, no Lease: no leader series at all (client-go exports none either).
    assert sample(text, "leader_election_master_status") is None


def test_a_follower_reconciles_nothing_and_counts_what_it_left_apart(tmp_path):
    """controller-runtime's non-leaders do not reconcile: a follower's look at a TeamSpace is no
    reconcile (no controller_runtime_* or cnpa_reconciles_total sample), and one with something
    to write counts in cnpa_not_leader_total; once it leads, its reconciles count."""
    import io
    from types import SimpleNamespace

    import fixtures
    from cnpa_controller.config import Settings
    from cnpa_controller.controller import Controller

    leading = [False]

    class Elector:
        name = "cnpa-op"

        def __init__(self, on_change):
            pass

        def is_leader(self):
            return leading[0]

    m = Metrics()
    c = Controller(SimpleNamespace(), Settings(archive_dir=str(tmp_path)), metrics=m,
                   make_elector=Elector, out=io.StringIO())
    c.caches.teamspaces._store["a"] = fixtures.teamspace("a", 3, "1", uid="u-1", generation=1)
    for _ in range(3):
        c._reconciled(c.reconcile("a"), 0.01)
    c._reconciled(c.reconcile("gone"), 0.01)
    text = m.render()
    assert m.get("cnpa_not_leader_total") == 3
    assert sample(text, "controller_runtime_reconcile_total", controller="teamspace",
                  result="success") == 0
    assert sample(text, "controller_runtime_reconcile_time_seconds_count",
                  controller="teamspace") is None
    assert "cnpa_reconciles_total{" not in text
    assert sample(text, "leader_election_master_status", name="cnpa-op") == 0
    # At 0 before the first transition, so that increase() (the dashboard's "Leader transitions")
    # counts a process's first takeover: born at 1, it showed nothing on the installed units.
    assert sample(text, "cnpa_leader_transitions_total", name="cnpa-op") == 0
    leading[0] = True
    c._reconciled(c.reconcile("gone"), 0.01)
    assert m.get("controller_runtime_reconcile_total",
                 {"controller": "teamspace", "result": "success"}) == 1


def test_each_metrics_has_its_own_registry():
    a, b = Metrics(), Metrics()
    a.inc("cnpa_resyncs_total", by=3)
    assert a.get("cnpa_resyncs_total") == 3 and b.get("cnpa_resyncs_total") == 0


def test_counters_gauges_histograms_with_labels():
    m = Metrics()
    m.inc("cnpa_writes_total", {"step": "quota", "op": "replace"})
    m.inc("cnpa_writes_total", {"op": "replace", "step": "quota"}, by=2)   # label order is irrelevant
    m.set("cnpa_last_successful_sync_timestamp_seconds", 1764858000.25)
    for seconds in (0.003, 0.2, 7):
        m.observe("controller_runtime_reconcile_time_seconds", seconds, {"controller": "teamspace"})
    text = m.render()
    assert sample(text, "cnpa_writes_total", step="quota", op="replace") == 3
    assert sample(text, "cnpa_last_successful_sync_timestamp_seconds") == 1764858000.25
    assert sample(text, "controller_runtime_reconcile_time_seconds_count") == 3
    assert sample(text, "controller_runtime_reconcile_time_seconds_bucket", le="0.25") == 2
    with pytest.raises(ValueError):
        m.inc("cnpa_last_successful_sync_timestamp_seconds")   # a gauge


def test_a_label_value_with_quotes_and_newlines_survives_the_format():
    m = Metrics()
    nasty = 'say "no"\\then\nnewline'
    m.inc("cnpa_errors_total", {"reason": nasty})
    assert sample(m.render(), "cnpa_errors_total", reason=nasty) == 1


def test_counting_from_many_threads_loses_nothing():
    m = Metrics()

    def work():
        for _ in range(2000):
            m.inc("cnpa_reconciles_total", {"result": "converged"})

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert m.get("cnpa_reconciles_total", {"result": "converged"}) == 16000


def test_api_requests_are_counted_by_code_and_timed_by_resource():
    class Answer:
        def __init__(self, status):
            self.status = status

        def read(self):
            return b"{}"

        def release_conn(self):
            pass

    class Connection:
        host = "https://127.0.0.1:6443"

        def headers(self):
            return {}

        def send(self, method, url, body, headers, timeout):
            if "/leases/" in url:
                raise TimeoutError("no answer")
            return Answer(404 if url.endswith("/missing") else 200)

        def unauthorized(self):
            pass

    m = Metrics()
    api = Api(connection=Connection())
    api.observe = m.request
    api.request("GET", "/apis/platform.labhub.io/v1alpha1/teamspaces/a")
    with pytest.raises(ApiError):
        api.request("GET", "/api/v1/namespaces/missing")
    with pytest.raises(ApiError):
        api.request("PUT", "/apis/coordination.k8s.io/v1/namespaces/cnpa-system/leases/cnpa-op")
    text = m.render()
    assert sample(text, "rest_client_requests_total", code="200", method="GET",
                  host="127.0.0.1:6443") == 1
    assert sample(text, "rest_client_requests_total", code="404", method="GET") == 1
    assert sample(text, "rest_client_requests_total", code="<error>", method="PUT") == 1
    # client-go's labels: {verb, host}; by resource under our own name.
    assert sample(text, "rest_client_request_duration_seconds_count", verb="GET",
                  host="127.0.0.1:6443") == 2
    assert "resource=" not in "".join(line for line in text.splitlines()
                                      if line.startswith("rest_client_"))
    assert sample(text, "cnpa_api_request_duration_seconds_count", verb="GET",
                  resource="teamspaces") == 1
    assert sample(text, "cnpa_api_request_duration_seconds_count", verb="PUT",
                  resource="leases") == 1


@pytest.mark.parametrize(("path", "resource"), [
    ("/apis/platform.labhub.io/v1alpha1/teamspaces", "teamspaces"),
    ("/apis/platform.labhub.io/v1alpha1/teamspaces/a/status?x=1", "teamspaces"),
    ("/api/v1/namespaces", "namespaces"),
    ("/api/v1/namespaces/team-a", "namespaces"),
    ("/api/v1/namespaces/team-a/resourcequotas/team-quota", "resourcequotas"),
    ("/api/v1/namespaces/default/events", "events"),
    ("/api/v1/resourcequotas?fieldSelector=metadata.name%3Dteam-quota", "resourcequotas"),
    ("/version", "other"),
])
def test_the_resource_of_a_request_path(path, resource):
    assert resource_of(path) == resource


def test_queue_metrics_time_the_wait_and_the_work():
    now = [100.0]
    m = Metrics()
    q = WorkQueue(clock=lambda: now[0], metrics=m.queue())
    m.watch(queue=q)
    q.add("a")
    q.add("a")   # de-duplicated: one add
    q.add("b")
    now[0] += 2
    assert q.get() == "a"
    assert sample(m.render(), "workqueue_depth", name="teamspace") == 1
    now[0] += 3
    assert q.longest_running() == 3
    assert sample(m.render(), "workqueue_longest_running_processor_seconds") == 3
    q.retry("a")
    q.done("a")
    text = m.render()
    assert sample(text, "workqueue_adds_total", name="teamspace") == 2
    assert sample(text, "workqueue_retries_total", name="teamspace") == 1
    assert sample(text, "workqueue_queue_duration_seconds_sum") == 2
    assert sample(text, "workqueue_work_duration_seconds_sum") == 3
    assert sample(text, "cnpa_queue_timers") == 1
    assert q.longest_running() == 0


def test_http_endpoints_serve_metrics_and_health_checks():
    m = Metrics()
    problems: list[str] = ["cache of TeamSpace not synced"]
    server = m.serve("127.0.0.1", 0, checks={"/healthz": lambda: [], "/readyz": lambda: problems})
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        m.inc("cnpa_resyncs_total")
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            assert sample(resp.read().decode(), "cnpa_resyncs_total") == 1
        with urllib.request.urlopen(f"{base}/healthz", timeout=10) as resp:
            assert resp.read() == b"ok\n"
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{base}/readyz", timeout=10)
        assert err.value.code == 500 and b"not synced" in err.value.read()
        problems.clear()
        with urllib.request.urlopen(f"{base}/readyz", timeout=10) as resp:
            assert resp.status == 200
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{base}/", timeout=10)
        assert err.value.code == 404
    finally:
        server.shutdown()
        server.server_close()


def test_textfile_is_replaced_whole_and_readable_by_node_exporter(tmp_path: Path):
    target = tmp_path / "cnpa-op.prom"
    m = Metrics()
    old = os.umask(0o077)   # the service's
    try:
        m.inc("cnpa_resyncs_total", by=4)
        m.write_textfile(target)
        first = target.stat().st_ino
        m.inc("cnpa_resyncs_total")
        m.write_textfile(str(target))
    finally:
        os.umask(old)
    assert sample(target.read_text(), "cnpa_resyncs_total") == 5
    assert oct(target.stat().st_mode & 0o777) == "0o644"
    # Replaced by rename, never rewritten in place: a reader keeps a whole older version.
    assert target.stat().st_ino != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnpa-op.prom"]


def test_textfile_failure_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch):
    target = tmp_path / "cnpa-op.prom"
    m = Metrics()
    m.write_textfile(target)
    before = target.read_text()
    monkeypatch.setattr("cnpa_controller.metrics.os.replace",
                        lambda src, dst: (_ for _ in ()).throw(OSError("disk trouble")))
    m.inc("cnpa_resyncs_total")
    with pytest.raises(OSError):
        m.write_textfile(target)
    assert target.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnpa-op.prom"]


def test_without_prometheus_client_the_controller_exits_3_naming_the_package(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CNPA_", "KUBECONFIG"))}
    env.update(KUBECONFIG=str(kubeconfig), CNPA_ARCHIVE_DIR=str(tmp_path / "archive"))
    # None in sys.modules makes `import prometheus_client` fail as if it were not installed.
    code = ("import sys; sys.modules['prometheus_client'] = None; "
            "from cnpa_controller.__main__ import main; sys.exit(main())")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert "prometheus_client" in proc.stderr and "python3-prometheus-client" in proc.stderr
    assert "Traceback" not in proc.stderr


# -- health.py ---------------------------------------------------------------------------------

def test_heartbeats_name_the_loops_silent_for_too_long():
    now = [0.0]
    beats = health.Heartbeats(clock=lambda: now[0])
    beats.beat("main")
    beats.beat("worker-0")
    now[0] = 30
    beats.beat("main")
    assert beats.stale(20) == [("worker-0", 30)]
    beats.forget("worker-0")
    assert beats.stale(20) == []


def test_the_wedge_bound_grows_with_the_request_timeout():
    assert health.wedge_bound(10, 7) == 2 * 7 * 10 + health.WEDGE_MARGIN
    assert health.wedge_bound(1, 7) < health.wedge_bound(10, 7)


def test_notify_sends_one_datagram_to_the_notify_socket(tmp_path):
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(path)
        assert health.notify("WATCHDOG=1", {"NOTIFY_SOCKET": path})
        assert server.recv(100) == b"WATCHDOG=1"
    assert not health.notify("READY=1", {})
    assert not health.notify("READY=1", {"NOTIFY_SOCKET": str(tmp_path / "none")})


def test_the_watchdog_period_is_systemds_for_this_process_only():
    assert health.watchdog_seconds({"WATCHDOG_USEC": "30000000"}) == 30
    other = str(os.getpid() + 1)   # meant for another process (systemd's WATCHDOG_PID)
    assert health.watchdog_seconds({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": other}) == 0
    assert health.watchdog_seconds({}) == 0
    assert health.tick_seconds(2) == 0.5 and health.tick_seconds(0) == 1


def test_a_pass_never_imports_prometheus_client():
    # What --once and --plan load (reconcile.sh runs a pass every few seconds; the import costs).
    code = ("import sys, cnpa_controller.__main__, cnpa_controller.once; "
            "print('prometheus_client' in sys.modules, 'kubernetes' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=True)
    assert proc.stdout.split() == ["False", "False"]
