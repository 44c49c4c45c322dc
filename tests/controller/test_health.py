"""The long-running controller's /metrics, /healthz and /readyz against a real API server.

Scrapes are parsed with prometheus_client's own parser. The wedged worker is a real one: the
archive record it must read before releasing a finalizer is a FIFO nobody writes, so the worker
blocks in open(2) as it would on a hung network file system, and no request timeout ends it.
"""

from __future__ import annotations

import os
import time

from ctllib import get_or_none, wait_ready
from hostlib import free_port, wait_for
from hostlib import http_get as get
from prometheus_client.parser import text_string_to_metric_families

from fixtures import teamspace


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    status, text = get(port, "/metrics")
    assert status == 200, text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def total(samples: dict, metric: str, **labels: str) -> float:
    """The sum of a metric's samples that carry these labels (any others summed over)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == metric and want <= ls)


def test_metrics_parse_and_the_histograms_move_under_load(host, start_controller):
    port = free_port()
    c = start_controller("metrics", CNPA_METRICS_ADDRESS=f"127.0.0.1:{port}")
    wait_for(lambda: get(port, "/readyz")[0] == 200, timeout=30, what="/readyz 200")
    assert get(port, "/healthz") == (200, "ok\n")
    before = scrape(port)
    assert total(before, "cnpa_build_info") == 1
    assert total(before, "process_resident_memory_bytes") > 0
    assert total(before, "cnpa_cache_synced") == 3
    # Leader election off: no Lease, so no leader series (client-go exports none either).
    assert not [n for n, _ls in before if n == "leader_election_master_status"]
    assert total(before, "cnpa_cache_stale") == 0
    assert total(before, "controller_runtime_active_workers") == 0

    names = [f"ctl-met-{i}" for i in range(6)]
    for name in names:
        host.apply(teamspace(name, pods=2))
    for name in names:
        wait_ready(host, name)
    after = scrape(port)

    def grew(metric: str, **labels: str) -> float:
        return total(after, metric, **labels) - total(before, metric, **labels)

    # Each new TeamSpace is reconciled more than once (created, then its own writes come back
    # through the watches); at least once each with writes.
    assert grew("controller_runtime_reconcile_time_seconds_count", controller="teamspace") >= 6
    assert grew("controller_runtime_reconcile_total", result="success") >= 6
    assert grew("cnpa_reconciles_total", result="written") >= 6
    assert grew("workqueue_adds_total", name="teamspace") >= 6
    assert grew("workqueue_queue_duration_seconds_count", name="teamspace") >= 6
    assert grew("workqueue_work_duration_seconds_count", name="teamspace") >= 6
    assert grew("cnpa_api_request_duration_seconds_count", verb="POST",
                resource="namespaces") >= 6
    # client-go's labels (verb, host): the namespace and the quota created, 2 per TeamSpace.
    assert grew("rest_client_request_duration_seconds_count", verb="POST") >= 12
    assert grew("rest_client_requests_total", code="201", method="POST") >= 6
    assert grew("cnpa_writes_total", step="quota", op="create") >= 6
    assert total(after, "cnpa_cache_objects", resource="teamspaces") >= 6
    assert total(after, "workqueue_depth") >= 0
    assert c.proc.poll() is None


def test_readyz_is_false_until_the_caches_have_synced(host, start_controller):
    port = free_port()
    host.sh("systemctl stop kube-apiserver", timeout=120)
    try:
        c = start_controller("unsynced", wait_synced=False,
                             CNPA_METRICS_ADDRESS=f"127.0.0.1:{port}")
        wait_for(lambda: get(port, "/healthz")[0] == 200, timeout=30,
                 what="/healthz served while the API server is down")
        # Several list attempts fail meanwhile; it stays alive and not ready.
        wait_for(lambda: c.err().count("list of TeamSpace failed") >= 2, timeout=60,
                 what="the list failing")
        status, body = get(port, "/readyz")
        assert status == 500 and "cache of TeamSpace not synced" in body, body
        assert get(port, "/healthz")[0] == 200
    finally:
        host.sh("systemctl start kube-apiserver", timeout=180)
    wait_for(lambda: get(port, "/readyz")[0] == 200, timeout=120, what="/readyz 200 after sync")
    assert "caches synced" in c.err()


def test_a_wedged_worker_makes_healthz_and_readyz_fail_until_it_is_free(host, start_controller,
                                                                       tmp_path):
    port = free_port()
    archive = tmp_path / "wedge" / "archive"
    archive.mkdir(parents=True)
    # A 2 s request timeout: the wedge bound is 2 x 7 steps x 2 s + 5 s (cnpa_controller.health).
    c = start_controller("wedge", CNPA_METRICS_ADDRESS=f"127.0.0.1:{port}",
                         CNPA_REQUEST_TIMEOUT="2s", CNPA_ARCHIVE_DIR=str(archive))
    host.apply(teamspace("ctl-wedge", pods=2))
    wait_ready(host, "ctl-wedge")
    fifo = archive / "ctl-wedge.json"
    os.mkfifo(fifo)
    host.kubectl("delete", "teamspace", "ctl-wedge", "--wait=false")
    wedged_at = time.monotonic()
    wait_for(lambda: get(port, "/healthz")[0] == 500, timeout=90, what="/healthz 500")
    stuck_for = time.monotonic() - wedged_at
    status, body = get(port, "/healthz")
    assert status == 500 and "worker-" in body and "stuck" in body, body
    assert get(port, "/readyz")[0] == 500
    assert total(scrape(port), "workqueue_longest_running_processor_seconds") > 25
    assert stuck_for > 25   # not before the bound
    # Free it: a writer for the FIFO (O_NONBLOCK succeeds only because the worker is reading).
    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    os.write(fd, b"{}\n")
    os.close(fd)
    wait_for(lambda: get(port, "/healthz")[0] == 200, timeout=30, what="/healthz 200 again")
    wait_for(lambda: get_or_none(host, "teamspace", "ctl-wedge") is None, timeout=60,
             what="TeamSpace ctl-wedge archived and gone")
    assert fifo.is_file()   # the record replaced the FIFO
    assert get(port, "/readyz")[0] == 200
    assert c.proc.poll() is None
