"""Write the Prometheus alerting rules for the long-running TeamSpace controller.

    python3 monitoring/generate.py [--selector SELECTOR] [--runbook-base URL] [-o FILE]

The way Prometheus monitoring mixins make their alerts fit a deployment: every expression selects
the controllers' series with SELECTOR (label matchers, default `job="cnpa-op"`: the scrape job of
their /metrics), and every alert's runbook_url is URL#<alert name in lower case>, an absolute
address of its runbook section (default: docs/operations.md of this collection installed under
/usr/share/ansible/collections, one of Ansible's default collection paths; give your own base
when your alert receivers read the runbooks elsewhere). Without -o the rules go to stdout.
monitoring/alerts.yml is this program's output with the defaults.

An alert is one entry of ALERTS. Its expression names the selector as %(selector)s; its summary
and description are Prometheus templates, written out as they are. Standard library and PyYAML
(which Ansible needs anyway) only.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap

import yaml

DEFAULT_SELECTOR = 'job="cnpa-op"'
DEFAULT_RUNBOOK_BASE = ("file:///usr/share/ansible/collections/ansible_collections/labhub/cnpa/"
                        "docs/operations.md")
GROUP = "cnpa-op"
WIDTH = 100

# Each alert: alert (its name; the runbook's anchor is the name in lower case), why (a comment on
# the rule in the output), expr (PromQL; %(selector)s for the selector), for, severity, summary
# and description (Prometheus templates).
ALERTS = [
    {
        "alert": "CnpaControllerDown",
        "why": "absent(): a target that vanished from service discovery (or a job renamed) has no "
               "up series at all, and `up == 0` alone would stay silent.",
        "expr": "up{%(selector)s} == 0 or absent(up{%(selector)s})",
        "for": "2m",
        "severity": "critical",
        "summary": "cnpa-op controller down: {{ $labels.job }} {{ $labels.instance }}",
        "description": "Prometheus has not scraped the controller's /metrics "
                       "{{ with $labels.instance }}on {{ . }} {{ end }}(job {{ $labels.job }}) for "
                       "2 minutes: the process is not running, or its metrics address is not "
                       "reachable.",
    },
    {
        "alert": "CnpaNoLeader",
        "why": "max by name: several controllers (one per host) elect one leader per Lease; a "
               "takeover takes a lease duration (10 s by default), far less than `for`.",
        "expr": "max by (job, name) (leader_election_master_status{%(selector)s}) == 0",
        "for": "1m",
        "severity": "critical",
        "summary": "no cnpa-op controller holds the Lease {{ $labels.name }}",
        "description": "Every controller of job {{ $labels.job }} that Prometheus scrapes reports "
                       "leader_election_master_status 0 for the Lease {{ $labels.name }} for 1 "
                       "minute: nobody writes, TeamSpaces are not served.",
    },
    {
        "alert": "CnpaReconcileErrors",
        "why": "Single errors are normal (a conflict, retried at once); errors in every 10-minute "
               "window for 15 minutes are a TeamSpace, or all of them, failing again and again.",
        "expr": "sum by (job, instance) "
                "(rate(controller_runtime_reconcile_errors_total{%(selector)s}[10m])) > 0",
        "for": "15m",
        "severity": "warning",
        "summary": "cnpa-op controller {{ $labels.instance }} keeps failing reconciles",
        "description": "Reconciles on {{ $labels.instance }} have failed in every 10-minute "
                       "window for 15 minutes ({{ $value | humanize }} per second now); each "
                       "failure is retried with backoff.",
    },
    {
        "alert": "CnpaWorkQueueNotDraining",
        "why": "Never empty and not shrinking: the workers do not keep up, or a name keeps coming "
               "back.",
        "expr": "min_over_time(workqueue_depth{%(selector)s}[10m]) > 0 "
                "and delta(workqueue_depth{%(selector)s}[10m]) >= 0",
        "for": "5m",
        "severity": "warning",
        "summary": "cnpa-op work queue {{ $labels.name }} on {{ $labels.instance }} is not "
                   "draining",
        "description": "The work queue on {{ $labels.instance }} has not been empty for 10 "
                       "minutes and has not shrunk (at least {{ $value }} names waiting "
                       "throughout).",
    },
    {
        "alert": "CnpaWorkerStuck",
        "why": "/healthz fails once a worker is on one name for longer than the wedge bound (145 s "
               "with the default request timeout) and systemd's watchdog then restarts the "
               "process; still stuck 5 minutes later means nothing restarted it.",
        "expr": "workqueue_longest_running_processor_seconds{%(selector)s} > 150",
        "for": "5m",
        "severity": "warning",
        "summary": "a cnpa-op worker on {{ $labels.instance }} is stuck",
        "description": "A worker on {{ $labels.instance }} has been on one TeamSpace for "
                       "{{ $value | humanizeDuration }}, past the wedge bound, and was not "
                       "restarted.",
    },
    {
        "alert": "CnpaCachesStale",
        "why": "/readyz fails once a cache's list or watch has been failing for "
               "CNPA_CACHE_STALE_SECONDS (30 s); an API server restart is over long before `for`. "
               "Still failing 5 minutes later is a lost permission or an API server that keeps "
               "refusing: the controller sees changes one relist late (up to 30 s), or not at all "
               "when its lists fail too.",
        "expr": "cnpa_cache_stale{%(selector)s} == 1",
        "for": "5m",
        "severity": "warning",
        "summary": "cnpa-op controller {{ $labels.instance }} cannot watch {{ $labels.resource }}",
        "description": "The cache of {{ $labels.resource }} on {{ $labels.instance }} has had its "
                       "list or watch failing for over 5 minutes: /readyz fails, and changes reach "
                       "the controller a relist late or not at all. cnpa_watch_failures_total by "
                       "code says why (403: a permission lost, <error>: no answer).",
    },
]


def rules(selector: str = DEFAULT_SELECTOR,
          runbook_base: str = DEFAULT_RUNBOOK_BASE) -> dict:
    """The rule file as Prometheus reads it."""
    return {"groups": [{"name": GROUP, "rules": [{
        "alert": a["alert"],
        "expr": a["expr"] % {"selector": selector},
        "for": a["for"],
        "labels": {"severity": a["severity"]},
        "annotations": {"summary": a["summary"], "description": a["description"],
                        "runbook_url": f"{runbook_base}#{a['alert'].lower()}"},
    } for a in ALERTS]}]}


def _scalar(value: str) -> str:
    """value as one YAML scalar on one line, quoted only where YAML needs it."""
    text = yaml.safe_dump(value, width=float("inf"), default_flow_style=True)
    return text.removesuffix("\n...\n").rstrip("\n")


def _wrap(text: str, width: int, **kw) -> list[str]:
    """textwrap.wrap, never breaking inside a Prometheus template action ({{ ... }})."""
    keep = re.sub(r"\{\{.*?\}\}", lambda m: m.group().replace(" ", "\0"), text)
    return [line.replace("\0", " ") for line in
            textwrap.wrap(keep, width, break_long_words=False, break_on_hyphens=False, **kw)]


def _block(key: str, value: str, indent: int) -> list[str]:
    """key: value, as a folded block where a line would be long or value has lines (a value
    without spaces, a URL, stays on its line: it cannot be folded)."""
    pad = " " * indent
    one = f"{pad}{key}: {_scalar(value)}"
    if "\n" not in value and (len(one) <= WIDTH or " " not in value):
        return [one]
    lines = []
    for paragraph in value.split("\n"):
        lines += _wrap(paragraph, WIDTH - indent - 2) or [""]
    style = "|-" if "\n" in value else ">-"
    return [f"{pad}{key}: {style}", *(f"{pad}  {line}" for line in lines)]


def render(selector: str = DEFAULT_SELECTOR, runbook_base: str = DEFAULT_RUNBOOK_BASE) -> str:
    """The rule file as text: rules() with a comment on each rule, checked to read back as
    rules()."""
    for a in ALERTS:
        assert " " not in a["alert"] and "\n" not in a["why"], a["alert"]
    document = rules(selector, runbook_base)
    out = [
        "---",
        "# Prometheus alerting rules for the long-running TeamSpace controller (python3 -m",
        "# cnpa_controller, cnpa_controller_mode=watch). Load this file with `rule_files:` in",
        "# prometheus.yml. Written by monitoring/generate.py; do not edit it, run that instead:",
        *_wrap(f"python3 monitoring/generate.py --selector '{selector}' --runbook-base "
               f"'{runbook_base}'", WIDTH - 4, initial_indent="#   ", subsequent_indent="#     "),
        "# The selector picks the controllers' series (the scrape job of their /metrics); each",
        "# runbook_url is the runbook base and the alert's name in lower case.",
        "groups:",
        f"  - name: {_scalar(GROUP)}",
        "    rules:",
    ]
    for n, (a, rule) in enumerate(zip(ALERTS, document["groups"][0]["rules"])):
        if n:
            out.append("")
        out.append(f"      - alert: {_scalar(rule['alert'])}")
        out += _wrap(a["why"], WIDTH - 10, initial_indent="        # ",
                     subsequent_indent="        # ")
        out += _block("expr", rule["expr"], 8)
        out.append(f"        for: {_scalar(rule['for'])}")
        out.append("        labels:")
        out.append(f"          severity: {_scalar(rule['labels']['severity'])}")
        out.append("        annotations:")
        for key, value in rule["annotations"].items():
            out += _block(key, value, 10)
    text = "\n".join(out) + "\n"
    if yaml.safe_load(text) != document:
        raise SystemExit("generate.py: the rules did not read back as written (a bug here)")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="generate.py", description="Write the alerting rules for the TeamSpace controller.",
        usage="python3 monitoring/generate.py [--selector SELECTOR] [--runbook-base URL] [-o FILE]")
    parser.add_argument("--selector", default=DEFAULT_SELECTOR,
                        help=f"label matchers of the controllers' series (default: {DEFAULT_SELECTOR})")
    parser.add_argument("--runbook-base", default=DEFAULT_RUNBOOK_BASE,
                        help="absolute URL of the runbooks, without #anchor "
                             f"(default: {DEFAULT_RUNBOOK_BASE})")
    parser.add_argument("-o", "--output", help="write the rules here instead of stdout")
    args = parser.parse_args(argv)
    if "://" not in args.runbook_base or "#" in args.runbook_base:
        parser.error("--runbook-base: an absolute URL (scheme://...) without a #fragment")
    if not args.selector.strip() or "{" in args.selector or "}" in args.selector:
        parser.error('--selector: label matchers without braces, e.g. job="cnpa-op"')
    text = render(args.selector, args.runbook_base)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
