"""The long-running controller's metrics, with prometheus_client, and its HTTP endpoints.

Only the long-running controller imports this module (a pass, reconcile.sh's, never does: the
import costs more than an idle pass). Every Metrics has a registry of its own, so that several
controllers in one process (tests) do not share series.

Read them either way:
- a Prometheus scrape of http://HOST:PORT/metrics (serve(), CNPA_METRICS_ADDRESS), which serves
  /healthz and /readyz beside it (health.py), or
- node_exporter's textfile collector: write_textfile(DIR/cnpa-op.prom), replaced atomically.

The names are controller-runtime's and client-go's where they measure the same thing, so that
dashboards and alerts made for Go controllers fit; cnpa_* for the rest. docs/operations.md has
the table; KNOWN below is the list.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
import threading
import time
from typing import Any, Callable
from urllib.parse import urlsplit

try:
    import prometheus_client
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
except ImportError as exc:  # __main__ turns this into exit status 3 and this message
    raise ImportError(
        "the Python package prometheus_client is not installed for this interpreter "
        f"({sys.executable}); the long-running controller needs it (Debian: "
        "python3-prometheus-client; pip: prometheus-client; docs/target.md)") from exc

CONTROLLER = "teamspace"   # controller-runtime's controller label
QUEUE = "teamspace"        # client-go's work queue name label

# controller-runtime's buckets for reconcile time, client-go's for queue and work durations
# (ExponentialBuckets(10e-9, 10, 10)) and for request latency.
RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5,
                     0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5,
                     6, 7, 8, 9, 10, 15, 20, 25, 30, 40, 50, 60)
QUEUE_BUCKETS = tuple(1e-8 * 10 ** i for i in range(10))
REQUEST_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)

# name -> (type, help, label names, histogram buckets)
KNOWN: dict[str, tuple[str, str, tuple[str, ...], tuple[float, ...]]] = {
    "controller_runtime_reconcile_total": (
        "counter", "Reconciles of the leader (or of the only writer), by result: success, "
        "error.", ("controller", "result"), ()),
    "controller_runtime_reconcile_errors_total": (
        "counter", "Reconciles that failed and are retried with backoff.", ("controller",), ()),
    "controller_runtime_reconcile_time_seconds": (
        "histogram", "Time of one reconcile of one TeamSpace.", ("controller",), RECONCILE_BUCKETS),
    "controller_runtime_max_concurrent_reconciles": (
        "gauge", "Workers (CNPA_WORKERS).", ("controller",), ()),
    "workqueue_adds_total": ("counter", "Names added to the work queue.", ("name",), ()),
    "workqueue_retries_total": (
        "counter", "Names queued again after a failure (with backoff).", ("name",), ()),
    "workqueue_queue_duration_seconds": (
        "histogram", "Time a name waited in the queue before a worker took it.", ("name",),
        QUEUE_BUCKETS),
    "workqueue_work_duration_seconds": (
        "histogram", "Time a worker spent on a name taken from the queue.", ("name",),
        QUEUE_BUCKETS),
    "rest_client_requests_total": (
        "counter", "API requests, by status code (<error>: no answer), method and host.",
        ("code", "method", "host"), ()),
    "rest_client_request_duration_seconds": (
        "histogram", "API request latency until the answer's headers, by verb and host "
        "(client-go's labels).", ("verb", "host"), REQUEST_BUCKETS),
    "cnpa_api_request_duration_seconds": (
        "histogram", "API request latency until the answer's headers, by verb and resource.",
        ("verb", "resource"), REQUEST_BUCKETS),
    "leader_election_master_status": (
        "gauge", "1 while this process holds the Lease and may write, else 0.", ("name",), ()),
    "cnpa_leader_transitions_total": (
        "counter", "Times this process became or stopped being the leader.", ("name",), ()),
    "cnpa_resyncs_total": ("counter", "Resyncs, each queueing every cached TeamSpace.", (), ()),
    "cnpa_reconciles_total": (
        "counter", "TeamSpaces reconciled by the leader (or the only writer), by result: "
        "converged, written, problem, failed.", ("result",), ()),
    "cnpa_not_leader_total": (
        "counter", "TeamSpaces with something to write that this process left alone because "
        "it does not lead (looked at again once it does; not reconciles).", (), ()),
    "cnpa_writes_total": ("counter", "API writes sent, by plan step and operation.",
                          ("step", "op"), ()),
    "cnpa_errors_total": ("counter", "Failures, by reason.", ("reason",), ()),
    "cnpa_last_successful_sync_timestamp_seconds": (
        "gauge", "Unix time of the caches' sync or of the last TeamSpace reconciled without "
        "failure.", (), ()),
    "cnpa_build_info": ("gauge", "Always 1; the controller's version and Python's.",
                        ("version", "python"), ()),
}

_KINDS = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}


def _version() -> str:
    return str(getattr(sys.modules.get(__package__ or ""), "__version__", "") or "unknown")


class _Collected:
    """Series read when scraped from the objects that hold the numbers (the caches, the queue),
    instead of copied into gauges after every change."""

    def __init__(self) -> None:
        self.caches: Any = None
        self.queue: Any = None

    def describe(self) -> list:
        return []

    def collect(self):
        if self.caches is not None:
            restarts = CounterMetricFamily(
                "cnpa_watch_restarts", "Watches started again after the first (resumed after "
                "the server ended one, or after a break).", labels=["resource"])
            relists = CounterMetricFamily(
                "cnpa_relists", "Full lists after the first (a watch's resourceVersion expired, "
                "or a list failed).", labels=["resource"])
            objects = GaugeMetricFamily("cnpa_cache_objects", "Objects in each cache.",
                                        labels=["resource"])
            synced = GaugeMetricFamily("cnpa_cache_synced", "1 once the cache has been listed.",
                                       labels=["resource"])
            stale = GaugeMetricFamily(
                "cnpa_cache_stale", "1 while the cache's list or watch has failed for longer "
                "than CNPA_CACHE_STALE_SECONDS in a row (/readyz fails then).", labels=["resource"])
            failures = CounterMetricFamily(
                "cnpa_watch_failures", "Lists and watches of the caches that failed, by HTTP "
                "status (<error>: no answer; 410: expired, listed again).",
                labels=["resource", "code"])
            for informer in self.caches.all:
                resource = informer.path.rsplit("/", 1)[-1]
                restarts.add_metric([resource], max(0, informer.watches - 1))
                relists.add_metric([resource], max(0, informer.relists - 1))
                objects.add_metric([resource], len(informer))
                synced.add_metric([resource], 1 if informer.synced.is_set() else 0)
                stale.add_metric([resource], 1 if informer.stale() else 0)
                for code, count in sorted(dict(informer.failures).items()):
                    failures.add_metric([resource, code], count)
            yield from (restarts, relists, objects, synced, stale, failures)
        if self.queue is not None:
            depth = GaugeMetricFamily("workqueue_depth", "Names waiting in the work queue.",
                                      labels=["name"])
            depth.add_metric([QUEUE], len(self.queue))
            longest = GaugeMetricFamily(
                "workqueue_longest_running_processor_seconds",
                "How long the longest-running worker has been on its current name.",
                labels=["name"])
            longest.add_metric([QUEUE], self.queue.longest_running())
            unfinished = GaugeMetricFamily(
                "workqueue_unfinished_work_seconds",
                "Seconds of work in progress not yet observed by work_duration (the sum over the "
                "names being processed); large values mean stuck workers.", labels=["name"])
            unfinished.add_metric([QUEUE], self.queue.unfinished())
            active = GaugeMetricFamily("controller_runtime_active_workers",
                                       "Workers reconciling a TeamSpace now.",
                                       labels=["controller"])
            active.add_metric([CONTROLLER], self.queue.active())
            timers = GaugeMetricFamily(
                "cnpa_queue_timers", "Delayed retries pending, superseded ones included (a count "
                "that grows with uptime is a leak).")
            timers.add_metric([], self.queue.timers())
            yield from (depth, longest, unfinished, active, timers)


class ProcessMetrics:
    """prometheus_client's process_* series, read from /proc/self only.

    The installed unit runs with ProcSubset=pid, which hides /proc/stat; prometheus_client's
    ProcessCollector needs its boot time (btime) and, without it, yields nothing at all, so the
    dashboard's CPU, memory and file descriptor panels were empty on every real install. The
    start time is taken from CLOCK_BOOTTIME instead, the clock /proc/self/stat's starttime counts
    on; everything else comes from /proc/self as before."""

    PROC = "/proc/self"

    def __init__(self, proc: str = PROC) -> None:
        self.proc = proc
        self.ticks = os.sysconf("SC_CLK_TCK")
        self.pagesize = os.sysconf("SC_PAGE_SIZE")

    def describe(self) -> list:
        return []

    def collect(self):
        try:
            with open(os.path.join(self.proc, "stat"), "rb") as fh:
                # The fields after the command, which may itself hold spaces and parentheses.
                fields = fh.read().rsplit(b")", 1)[-1].split()
        except OSError:
            return
        # fields[0] is the state (field 3 of proc(5)): field N is fields[N - 3].
        utime, stime = int(fields[11]), int(fields[12])
        started_ticks, vsize, rss_pages = int(fields[19]), int(fields[20]), int(fields[21])
        booted = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
        yield GaugeMetricFamily("process_virtual_memory_bytes", "Virtual memory size in bytes.",
                                value=float(vsize))
        yield GaugeMetricFamily("process_resident_memory_bytes", "Resident memory size in bytes.",
                                value=float(rss_pages * self.pagesize))
        yield GaugeMetricFamily("process_start_time_seconds",
                                "Start time of the process since unix epoch in seconds.",
                                value=booted + started_ticks / self.ticks)
        yield CounterMetricFamily("process_cpu_seconds_total",
                                  "Total user and system CPU time spent in seconds.",
                                  value=(utime + stime) / self.ticks)
        try:
            yield GaugeMetricFamily("process_open_fds", "Number of open file descriptors.",
                                    value=float(len(os.listdir(os.path.join(self.proc, "fd")))))
            with open(os.path.join(self.proc, "limits"), "rb") as fh:
                for line in fh:
                    if line.startswith(b"Max open files"):
                        yield GaugeMetricFamily("process_max_fds",
                                                "Maximum number of open file descriptors.",
                                                value=float(line.split()[3]))
        except OSError:
            pass


class QueueMetrics:
    """client-go's work queue metrics, as WorkQueue reports them."""

    def __init__(self, metrics: Metrics, name: str) -> None:
        self._adds = metrics.metric("workqueue_adds_total").labels(name)
        self._retries = metrics.metric("workqueue_retries_total").labels(name)
        self._waited = metrics.metric("workqueue_queue_duration_seconds").labels(name)
        self._worked = metrics.metric("workqueue_work_duration_seconds").labels(name)

    def added(self) -> None:
        self._adds.inc()

    def retried(self) -> None:
        self._retries.inc()

    def taken(self, waited: float) -> None:
        self._waited.observe(waited)

    def done(self, worked: float) -> None:
        self._worked.observe(worked)


class Metrics:
    """The controller's series in a registry of their own, safe to update from several threads."""

    def __init__(self) -> None:
        if hasattr(prometheus_client, "disable_created_metrics"):
            # Not an instance setting: the *_created series would double every counter and
            # histogram; no dashboard of these metrics reads them.
            prometheus_client.disable_created_metrics()
        self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        self._metrics: dict[str, Any] = {}
        for name, (kind, text, labels, buckets) in KNOWN.items():
            self._declare(name, kind, text, labels, buckets)
        self._metrics["cnpa_build_info"].labels(_version(), platform.python_version()).set(1)
        self._collected = _Collected()
        self.registry.register(self._collected)
        self.registry.register(ProcessMetrics())
        prometheus_client.PlatformCollector(registry=self.registry)

    def _declare(self, name: str, kind: str, text: str, labels: tuple[str, ...],
                 buckets: tuple[float, ...] = ()) -> Any:
        options: dict[str, Any] = {"buckets": buckets} if buckets else {}
        metric = _KINDS[kind](name, text, labels, registry=self.registry, **options)
        self._metrics[name] = metric
        return metric

    def metric(self, name: str, kind: str = "counter", labels: tuple[str, ...] = ()) -> Any:
        """The prometheus_client metric of that name; one not in KNOWN is made on first use."""
        with self._lock:
            metric = self._metrics.get(name)
            if metric is None:
                metric = self._declare(name, kind, "", labels)
        return metric

    def _child(self, name: str, kind: str, labels: dict | None) -> Any:
        labels = {str(k): str(v) for k, v in (labels or {}).items()}
        metric = self.metric(name, kind, tuple(sorted(labels)))
        if metric._type != kind:
            raise ValueError(f"{name} is a {metric._type}, not a {kind}")
        return metric.labels(**labels) if labels else metric

    # -- updates (the methods controller.NoMetrics has too) ------------------------------------
    def inc(self, name: str, labels: dict | None = None, by: float = 1) -> None:
        self._child(name, "counter", labels).inc(by)

    def set(self, name: str, value: float, labels: dict | None = None) -> None:
        self._child(name, "gauge", labels).set(value)

    def observe(self, name: str, value: float, labels: dict | None = None) -> None:
        self._child(name, "histogram", labels).observe(value)

    def queue(self, name: str = QUEUE) -> QueueMetrics:
        return QueueMetrics(self, name)

    def watch(self, *, caches: Any = None, queue: Any = None) -> None:
        """Read these objects' own numbers when scraped (see _Collected)."""
        self._collected.caches = caches if caches is not None else self._collected.caches
        self._collected.queue = queue if queue is not None else self._collected.queue

    def request(self, host: str, method: str, resource: str, code: str, seconds: float) -> None:
        """One API request (api.Api.observe): client-go's rest_client metrics."""
        self._metrics["rest_client_requests_total"].labels(code, method, host_of(host)).inc()
        self._metrics["rest_client_request_duration_seconds"].labels(method, host_of(host)).observe(
            seconds)
        self._metrics["cnpa_api_request_duration_seconds"].labels(method, resource).observe(seconds)

    # -- reading -----------------------------------------------------------------------------
    def get(self, name: str, labels: dict | None = None) -> float | None:
        """A sample's value as exposed (a counter's name ends in _total), None if absent."""
        return self.registry.get_sample_value(name, {str(k): str(v)
                                                     for k, v in (labels or {}).items()})

    def render(self) -> str:
        return prometheus_client.generate_latest(self.registry).decode("utf-8")

    def serve(self, host: str, port: int,
              checks: dict[str, Callable[[], list[str]]] | None = None):
        """Serve GET /metrics, and each path of `checks` (/healthz, /readyz: 200 "ok" when the
        check returns no problem, else 500 and the problems), on host:port from a daemon thread;
        returns the server (server_address has the port when 0 was asked; shutdown() stops it)."""
        import http.server

        from prometheus_client.exposition import choose_encoder

        metrics, checks = self, dict(checks or {})

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    encoder, content_type = choose_encoder(self.headers.get("Accept"))
                    self._answer(200, content_type, encoder(metrics.registry))
                elif path in checks:
                    try:
                        problems = checks[path]()
                    except Exception as exc:  # a check that breaks says so, as a failure
                        problems = [f"check failed: {type(exc).__name__}: {exc}"]
                    body = "".join(f"{p}\n" for p in problems) if problems else "ok\n"
                    self._answer(500 if problems else 200, "text/plain; charset=utf-8",
                                 body.encode())
                else:
                    self.send_error(404, f"served here: /metrics {' '.join(sorted(checks))}")

            def _answer(self, status: int, content_type: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format, *args) -> None:  # a scrape every few seconds is not news
                pass

        class Server(http.server.ThreadingHTTPServer):
            # An IPv6 address ([::1]:PORT) needs a socket of that family: the default is IPv4.
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        server = Server((host, port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
        return server

    def write_textfile(self, path: str | os.PathLike) -> None:
        """Replace path with the current metrics, atomically (node_exporter never reads half a
        file). write_to_textfile renames its own temporary file over ours, whose name does not end
        in .prom (the collector skips it); ours is made readable by all before it replaces path,
        because the service's umask is 077 and node_exporter usually runs as another user."""
        path = os.fspath(path)
        directory, base = os.path.split(os.path.abspath(path))
        tmp = os.path.join(directory, f".{base}.tmp")
        try:
            prometheus_client.write_to_textfile(tmp, self.registry)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise


def host_of(url: str) -> str:
    """client-go's host label: the API server's host:port."""
    return urlsplit(url).netloc or url
