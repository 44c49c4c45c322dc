"""monitoring/: the alert rules checked and unit-tested by promtool (Debian's, unpacked by
testhost.prometheus), and the dashboard's and the rules' PromQL naming only series, labels and
variables that exist. tests/multihost/test_monitoring_installed.py asks a real Prometheus the same
queries, and diffs the same names against the scrape of the installed units.
The rule file is monitoring/generate.py's output with its defaults; with other options it is
still a valid rule file that selects what it was asked to."""

from __future__ import annotations

import re
import runpy
import subprocess
import sys

import pytest
from promlib import (
    ALERTS,
    ALERTS_TEST,
    alert_rules,
    dashboard,
    exported,
    parse,
    queries,
    unknown,
)

from testhost import prometheus


@pytest.fixture(scope="module")
def promtool():
    return prometheus.binaries() / "promtool"


def test_the_alert_rules_are_valid(promtool):
    proc = subprocess.run([str(promtool), "check", "rules", str(ALERTS)], capture_output=True,
                          text=True, check=False, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in proc.stdout


def test_each_alert_fires_when_it_should_and_only_then(promtool):
    proc = subprocess.run([str(promtool), "test", "rules", ALERTS_TEST.name], capture_output=True,
                          text=True, check=False, timeout=60, cwd=ALERTS_TEST.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tested = set(re.findall(r"alertname: (\w+)", ALERTS_TEST.read_text()))
    assert tested == {rule["alert"] for rule in alert_rules()}


GENERATE = ALERTS.parent / "generate.py"


@pytest.fixture(scope="module")
def generator():
    return runpy.run_path(str(GENERATE))


def test_the_rule_file_is_the_generator_s_output_with_its_defaults(generator):
    assert ALERTS.read_text() == generator["render"](), \
        "monitoring/alerts.yml is stale: python3 monitoring/generate.py -o monitoring/alerts.yml"


def test_each_alert_has_for_severity_annotations_and_a_runbook_in_the_docs(generator):
    from promlib import ROOT
    operations = (ROOT / "docs/operations.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.*)$", operations, re.MULTILINE)}
    base = generator["DEFAULT_RUNBOOK_BASE"]
    # The default base is the runbooks' page as the collection installs it (an absolute URL; the
    # tarball carries that page: tests/unit/test_collection_tarball.py).
    assert base.startswith("file:///") and base.endswith("/ansible_collections/labhub/cnpa/"
                                                         "docs/operations.md"), base
    for rule in alert_rules():
        assert rule.get("for"), rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"])
        page, anchor = rule["annotations"]["runbook_url"].split("#")
        assert page == base and anchor in anchors, rule["annotations"]


def test_another_selector_and_runbook_base_make_valid_rules_that_use_them(promtool, tmp_path):
    out = tmp_path / "alerts.yml"
    selector = 'namespace="platform", service=~"cnpa-op.*"'
    proc = subprocess.run([sys.executable, str(GENERATE), "--selector", selector,
                           "--runbook-base", "https://wiki.example.org/cnpa/runbooks", "-o", str(out)],
                          capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    check = subprocess.run([str(promtool), "check", "rules", str(out)], capture_output=True,
                           text=True, check=False, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    import yaml
    rules = [r for g in yaml.safe_load(out.read_text())["groups"] for r in g["rules"]]
    assert [r["alert"] for r in rules] == [r["alert"] for r in alert_rules()]
    for rule in rules:
        assert 'job="cnpa-op"' not in rule["expr"], rule["expr"]
        for name, _labels in parse(rule["expr"])[0]:
            assert re.search(re.escape(name) + r"\{" + re.escape(selector) + r"\}", rule["expr"]), \
                (name, rule["expr"])
        assert rule["annotations"]["runbook_url"] == \
            f"https://wiki.example.org/cnpa/runbooks#{rule['alert'].lower()}"


@pytest.mark.parametrize("argv", [
    ["--runbook-base", "docs/operations.md"],          # relative: useless in a notification
    ["--runbook-base", "https://wiki.example.org/x#y"],  # the anchor is the alert's
    ["--selector", '{job="x"}'],                       # matchers go inside the braces
    ["--selector", ""],
])
def test_the_generator_refuses_what_would_make_bad_rules(argv):
    proc = subprocess.run([sys.executable, str(GENERATE), *argv], capture_output=True, text=True,
                          check=False, timeout=60)
    assert proc.returncode == 2 and "generate.py: error:" in proc.stderr, proc.stderr


@pytest.mark.parametrize(("where", "expr", "legend"), queries(), ids=[w for w, _, _ in queries()])
def test_every_series_and_label_used_is_one_the_controller_exports(where, expr, legend):
    problems = unknown(expr, legend, exported())
    assert not problems, f"{where}: {problems}"


def test_the_name_check_catches_a_misspelt_series_and_label():
    series = exported()
    [(name, labels)], grouping = parse(
        'sum by (verbb) (rate(rest_client_request_total{job="$job", kode="200"}[5m]))')
    assert name not in series and (labels, grouping) == ({"job", "kode"}, {"verbb"})
    assert unknown('sum by (verbb) (rate(rest_client_requests_total{job="x", kode="200"}[5m]))',
                   "{{verb}} {{method}}", series) == [
        "rest_client_requests_total has no label ['kode']",
        "grouped by ['verbb'], not a label of sum by (verbb) "
        "(rate(rest_client_requests_total{job=\"x\", kode=\"200\"}[5m]))",
        "legend names ['verb'], not a label of sum by (verbb) "
        "(rate(rest_client_requests_total{job=\"x\", kode=\"200\"}[5m]))"]
    assert unknown("process_open_fds", "", {"up": set()}) == ["no series process_open_fds"]


def test_the_dashboard_is_a_grafana_dashboard_with_its_variables():
    board = dashboard()
    assert board["schemaVersion"] >= 36   # Grafana 9.1 on: what 10 and 11 import unchanged
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert "label_values(" in variables["job"]["definition"]
    assert "$job" in variables["instance"]["definition"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"] and panel.get("description"), panel["title"]
        for target in panel["targets"]:
            # Every query follows the variables: a dashboard showing another job's series
            # beside this one's would mislead.
            for name, labels in parse(target["expr"])[0]:
                assert {"job", "instance"} <= labels, (panel["title"], name)


def test_the_panels_tile_the_grid_without_overlapping():
    taken: dict[tuple[int, int], str] = {}
    for panel in dashboard()["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in taken, (panel["title"], taken[(x, y)])
                taken[(x, y)] = panel["title"]
    rows = {y for _, y in taken}
    assert rows == set(range(max(rows) + 1)), "an empty band between panels"
