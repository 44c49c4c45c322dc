"""The monitoring files (monitoring/: the Grafana dashboard, the alert rules) read as the tests
need them, and a real Prometheus run on loopback for tests/multihost/test_monitoring_installed.py.

PromQL is read with a small tokenizer, not a full parser: enough to find the metric names, the
label matchers and the grouping labels of the expressions these files contain.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import yaml
from hostlib import free_port

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "monitoring/grafana-dashboard.json"
ALERTS = ROOT / "monitoring/alerts.yml"
ALERTS_TEST = ROOT / "monitoring/alerts_test.yml"
JOB = "cnpa-op"   # the scrape job alerts.yml selects

# Labels every scraped series gets from Prometheus, and the histogram's bucket bound.
TARGET_LABELS = {"job", "instance"}
KEYWORDS = {"and", "or", "unless", "bool", "offset"}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}

_TOKEN = re.compile(r'''(?P<str>"(?:[^"\\]|\\.)*")|(?P<brace>\{[^}]*\})|(?P<range>\[[^\]]*\])'''
                    r'''|(?P<num>\d+(?:\.\d+)?(?:e[+-]?\d+)?)|(?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)'''
                    r'''|(?P<space>\s+)|(?P<other>.)''')
_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"')


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_targets(board: dict | None = None) -> list[dict]:
    """Every query of every panel: {panel, title, ref, expr, legend, gridPos, unit, type}."""
    found = []
    for panel in (board or dashboard())["panels"]:
        for target in panel.get("targets", []):
            found.append({"panel": panel["id"], "title": panel["title"], "ref": target["refId"],
                          "expr": target["expr"], "legend": target.get("legendFormat", ""),
                          "gridPos": panel["gridPos"], "type": panel["type"],
                          "unit": panel.get("fieldConfig", {}).get("defaults", {}).get("unit")})
    return found


def alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"]
            for rule in group["rules"]]


def substitute(expr: str, *, job: str = JOB, instance: str = ".*",
               rate_interval: str = "1m") -> str:
    """The expression as Grafana sends it: its variables replaced by these values."""
    for name, value in (("__rate_interval", rate_interval), ("job", job),
                        ("instance", instance)):
        expr = expr.replace(f"${{{name}}}", value).replace(f"${name}", value)
    assert "$" not in expr, f"a variable this test does not know: {expr}"
    return expr


def parse(expr: str) -> tuple[list[tuple[str, set[str]]], set[str]]:
    """(the selectors as (metric name, matcher label names), the grouping labels) of expr."""
    tokens = [(m.lastgroup, m.group()) for m in _TOKEN.finditer(expr) if m.lastgroup != "space"]
    selectors: list[tuple[str, set[str]]] = []
    grouping: set[str] = set()
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        after = tokens[i + 1] if i + 1 < len(tokens) else ("", "")
        if kind == "ident" and text in GROUPING and after[1] == "(":
            j = i + 2
            while j < len(tokens) and tokens[j][1] != ")":
                if tokens[j][0] == "ident":
                    grouping.add(tokens[j][1])
                j += 1
            i = j + 1
            continue
        # An aggregation written `sum by (x) (...)` has its grouping before its parenthesis.
        if kind == "ident" and text not in KEYWORDS and after[1] != "(" \
                and after[1] not in GROUPING:
            labels = set(_MATCHER.findall(after[1])) if after[0] == "brace" else set()
            selectors.append((text, labels))
        i += 1
    return selectors, grouping


def queries() -> list[tuple[str, str, str]]:
    """(where, expression, legend) of every dashboard query, its variables filled in, and of every
    alert rule (no legend)."""
    return ([(f"panel {t['title']!r} {t['ref']}", substitute(t["expr"]), t["legend"])
             for t in dashboard_targets()]
            + [(f"alert {r['alert']}", r["expr"], "") for r in alert_rules()])


def unknown(expr: str, legend: str, series: dict[str, set[str]]) -> list[str]:
    """What expr and its legend name that series (name -> label names) does not have: a series
    name; a label one of its selectors matches on that this series lacks; a grouping or legend
    label that none of the expression's series has (Prometheus's job and instance aside)."""
    selectors, grouping = parse(expr)
    if not selectors:
        return [f"no metric found in {expr}"]
    out = []
    for name, labels in selectors:
        if name not in series:
            out.append(f"no series {name}")
        elif labels - series[name] - TARGET_LABELS:
            out.append(f"{name} has no label {sorted(labels - series[name] - TARGET_LABELS)}")
    known = set().union(*(series.get(name, set()) for name, _ in selectors)) | TARGET_LABELS
    legend_labels = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))
    if grouping - known:
        out.append(f"grouped by {sorted(grouping - known)}, not a label of {expr}")
    if legend_labels - known:
        out.append(f"legend names {sorted(legend_labels - known)}, not a label of {expr}")
    return out


def scraped(text: str) -> dict[str, set[str]]:
    """The series names of a /metrics answer, each with the label names its samples have."""
    from prometheus_client.parser import text_string_to_metric_families

    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


def exported() -> dict[str, set[str]]:
    """Every series name a running controller exports, with its label names (Prometheus's job and
    instance not included): rendered from a Controller's own registry, plus the labelled counters
    and histograms of metrics.KNOWN that have no series until first used; and Prometheus's up."""
    import io
    from types import SimpleNamespace

    from cnpa_controller.api import ApiError
    from cnpa_controller.config import Settings
    from cnpa_controller.controller import Controller
    from cnpa_controller.metrics import KNOWN, Metrics

    metrics = Metrics()
    c = Controller(SimpleNamespace(), Settings(archive_dir="/nonexistent"), metrics=metrics,
                   out=io.StringIO())
    # cnpa_watch_failures_total's series are born at a cache's first failure (its codes are not
    # known before): one failure here.
    c.caches.namespaces._failed(ApiError(403, "Forbidden", "watch"))
    names = scraped(metrics.render())
    names["up"] = set()
    for name, (kind, _help, labels, _buckets) in KNOWN.items():
        series = ([f"{name}_bucket", f"{name}_sum", f"{name}_count"] if kind == "histogram"
                  else [name])
        for s in series:
            names.setdefault(s, set()).update(labels)
        if kind == "histogram":
            names[f"{name}_bucket"].add("le")
    return names


class Prometheus:
    """A Prometheus of the test's own on 127.0.0.1 (a free port, its TSDB in a temporary
    directory), scraping the given targets every second as job JOB and evaluating rule_files
    every second; stopped by its PID."""

    def __init__(self, binary: Path, workdir: Path, targets: list[str],
                 rule_files: list[Path] = ()) -> None:
        self.binary, self.workdir = binary, workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                       "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": targets}]}],
        }))
        self.log = workdir / "prometheus.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30) -> Prometheus:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [str(self.binary), f"--config.file={self.config}",
                 f"--storage.tsdb.path={self.workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}",
                 "--storage.tsdb.retention.time=1d"],
                cwd=self.workdir, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not self._ready():
            assert self.proc.poll() is None, f"prometheus exited:\n{self.log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"prometheus not ready in {timeout} s"
            time.sleep(0.2)
        return self

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def api(self, path: str, **params: str | float) -> dict | list:
        """An answer of the HTTP API's data; an error answer fails the test with its text."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as err:
            raise AssertionError(f"{path} {params}: {err.code} {err.read().decode()}") from None
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        return self.api("query_range", query=expr, start=start, end=end, step=step)["result"]

    def alerts(self) -> dict[str, set[str]]:
        """Alert name -> the states its alerts are in (pending, firing)."""
        states: dict[str, set[str]] = {}
        for alert in self.api("alerts")["alerts"]:
            states.setdefault(alert["labels"]["alertname"], set()).add(alert["state"])
        return states

    def stop(self, timeout: float = 30) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
