"""The controller's metrics, in the Prometheus text exposition format 0.0.4.

Read them either way (no client library needed on the host):
- a Prometheus scrape of http://HOST:PORT/metrics (Metrics.serve), or
- node_exporter's textfile collector: Metrics.write_textfile(DIR/cnpa_op.prom), replaced atomically
  so the collector never reads half a file.

What the controller exports:

- cnpa_passes_total (counter): resyncs, each queueing every cached TeamSpace.
- cnpa_reconciles_total{result} (counter): TeamSpaces reconciled, by result: converged (nothing
  to write), written, problem (written, with a problem reported), failed (retried), not_leader
  (something to write, but another process leads).
- cnpa_writes_total{step,op} (counter): API writes sent, by plan step (finalizer, namespace,
  quota, status, ...) and operation (create, patch, replace, delete, ...).
- cnpa_errors_total{reason} (counter): failures, by reason (the plan's and the executor's Event
  reasons, api, conflict, ...).
- cnpa_queue_depth (gauge): TeamSpaces waiting in the work queue.
- cnpa_queue_timers (gauge): delayed retries pending (at most one that counts per TeamSpace, plus
  superseded ones until they are due; a count that grows with uptime is a leak).
- cnpa_last_successful_sync_timestamp_seconds (gauge): Unix time of the caches' sync or of the
  last TeamSpace reconciled without failure.
- cnpa_leader (gauge): 1 while this process holds the Lease and may write, else 0.

Names not in this list may be used too (inc() makes a counter, set() a gauge) and are rendered
without help text; the unlabelled ones above are rendered as 0 until first set.
"""

from __future__ import annotations

import http.server
import math
import os
import re
import tempfile
import threading

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

# name -> (type, help, label names)
KNOWN: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "cnpa_passes_total": ("counter", "Resyncs, each queueing every cached TeamSpace.", ()),
    "cnpa_reconciles_total": ("counter", "TeamSpaces reconciled, by result.", ("result",)),
    "cnpa_writes_total": ("counter", "API writes sent, by plan step and operation.", ("step", "op")),
    "cnpa_errors_total": ("counter", "Failures, by reason.", ("reason",)),
    "cnpa_queue_depth": ("gauge", "TeamSpaces waiting in the work queue.", ()),
    "cnpa_queue_timers": ("gauge", "Delayed retries pending, superseded ones included.", ()),
    "cnpa_last_successful_sync_timestamp_seconds": (
        "gauge", "Unix time of the caches' sync or of the last TeamSpace reconciled without failure.", ()),
    "cnpa_leader": ("gauge", "1 while this process holds the Lease and may write, else 0.", ()),
}


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2 ** 53:
        return str(int(value))
    return repr(float(value))


class Metrics:
    """Counters and gauges with labels, safe to update from several threads."""

    def __init__(self, known: dict[str, tuple[str, str, tuple[str, ...]]] | None = None) -> None:
        self._lock = threading.Lock()
        self._types: dict[str, str] = {}
        self._help: dict[str, str] = {}
        self._samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        for name, (kind, text, labels) in (KNOWN if known is None else known).items():
            self._declare(name, kind, text)
            if not labels:
                self._samples[name][()] = 0.0

    def _declare(self, name: str, kind: str, text: str = "") -> None:
        if not NAME.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        self._types[name] = kind
        self._help[name] = text
        self._samples.setdefault(name, {})

    def _key(self, name: str, labels: dict | None, kind: str) -> tuple[tuple[str, str], ...]:
        if name not in self._types:
            self._declare(name, kind)
        elif self._types[name] != kind:
            raise ValueError(f"{name} is a {self._types[name]}, not a {kind}")
        key = tuple(sorted((str(k), str(v)) for k, v in (labels or {}).items()))
        for label, _value in key:
            if not LABEL.match(label) or label.startswith("__"):
                raise ValueError(f"invalid label name {label!r} on {name}")
        return key

    def inc(self, name: str, labels: dict | None = None, by: float = 1) -> None:
        if by < 0:
            raise ValueError(f"counter {name} cannot decrease")
        with self._lock:
            key = self._key(name, labels, "counter")
            self._samples[name][key] = self._samples[name].get(key, 0.0) + by

    def set(self, name: str, value: float, labels: dict | None = None) -> None:
        with self._lock:
            key = self._key(name, labels, "gauge")
            self._samples[name][key] = float(value)

    def get(self, name: str, labels: dict | None = None) -> float | None:
        key = tuple(sorted((str(k), str(v)) for k, v in (labels or {}).items()))
        with self._lock:
            return self._samples.get(name, {}).get(key)

    def render(self) -> str:
        lines: list[str] = []
        with self._lock:
            for name in sorted(self._types):
                if self._help[name]:
                    lines.append(f"# HELP {name} {escape_help(self._help[name])}")
                lines.append(f"# TYPE {name} {self._types[name]}")
                for key, value in sorted(self._samples[name].items()):
                    labels = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in key)
                    lines.append(f"{name}{{{labels}}} {format_value(value)}" if labels
                                 else f"{name} {format_value(value)}")
        return "\n".join(lines) + "\n"

    def serve(self, host: str, port: int) -> http.server.ThreadingHTTPServer:
        """Serve GET /metrics on host:port from a daemon thread; returns the server (its
        server_address has the port when 0 was asked; shutdown() stops it)."""
        metrics = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404, "only /metrics is served here")
                    return
                body = metrics.render().encode("utf-8")
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format, *args) -> None:  # a scrape every few seconds is not news
                pass

        server = http.server.ThreadingHTTPServer((host, port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
        return server

    def write_textfile(self, path: str | os.PathLike) -> None:
        """Write render() to path atomically: a temporary file in the same directory, fsynced,
        renamed over path, then the directory fsynced. The temporary name does not end in .prom,
        so node_exporter's textfile collector never reads it."""
        path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(self.render())
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, 0o644)  # node_exporter usually runs as another user
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
