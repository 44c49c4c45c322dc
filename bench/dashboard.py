"""docs/dashboard.png: the Grafana dashboard's panels, laid out as the dashboard lays them out,
drawn with matplotlib from a real Prometheus's answers to the dashboard's own queries.

There is no Grafana to screenshot here (neither Debian nor PyPI packages it), and the classic
web UI of Debian's Prometheus 2.42 graphs one query at a time; so the answers come from the run
of tests/multihost/test_monitoring_installed.py's dashboard test, which scrapes the controller as
playbooks/controller.yml installs it on three test hosts and writes the answers when asked:

    CNPA_DASHBOARD_DATA=/tmp/dashboard-run.json .venv/bin/pytest -q \\
        tests/multihost/test_monitoring_installed.py -k panel
    bench-venv/bin/python bench/dashboard.py /tmp/dashboard-run.json docs/dashboard.png

(bench-venv: a virtualenv with requirements-bench.txt, which has matplotlib; docs/benchmark.md.)
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from pathlib import Path

GRID_COLUMNS = 24
UNIT_HEIGHT_IN = 0.30   # Grafana's grid row is 30 px, its width about 1600 px: 100 dpi
FIG_WIDTH_IN = 16.0
UNITS = {"s": "seconds", "ops": "per second", "reqps": "requests/s", "bytes": "bytes",
         "percentunit": "CPU (1 = one core)", "short": ""}


def legend(fmt: str, metric: dict) -> str:
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt or "")
    return text.strip() or json.dumps(metric)


def value_text(value: float, unit: str | None) -> str:
    if math.isnan(value):
        return "NaN"
    if unit == "s":
        return f"{value:.1f} s" if value < 120 else f"{value / 60:.1f} min"
    if unit == "bytes":
        return f"{value / 2 ** 20:.0f} MiB"
    return f"{value:g}"


def draw(data: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    panels = data["panels"]
    alert_rows = 5
    height_units = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels) + 1 + alert_rows
    header_in = 1.0
    fig_h = height_units * UNIT_HEIGHT_IN + header_in
    fig = plt.figure(figsize=(FIG_WIDTH_IN, fig_h), dpi=100)
    start = data["start"]
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(start))
    fig.text(0.01, 1 - 0.25 / fig_h, "cnpa-op: TeamSpace controller (monitoring/grafana-dashboard.json)",
             fontsize=15, weight="bold", va="top")
    fig.text(0.01, 1 - 0.5 / fig_h,
             f"The dashboard's queries answered by a real Prometheus 2.42 (Debian) scraping the "
             f"installed cnpa-op.service of three test hosts every second during "
             f"tests/multihost/test_monitoring_installed.py, {when}; "
             f"$__rate_interval = {data['rate_interval']}.\nDrawn with matplotlib from the "
             "answers: not a Grafana screenshot. Stat panels show the last value, after two of "
             "the three units were stopped at the end of the run.", fontsize=9, va="top",
             color="0.3")

    def box(grid: dict) -> list[float]:
        left = grid["x"] / GRID_COLUMNS
        width = grid["w"] / GRID_COLUMNS
        top_in = header_in + grid["y"] * UNIT_HEIGHT_IN
        height_in = grid["h"] * UNIT_HEIGHT_IN
        return [left + 0.035, 1 - (top_in + height_in) / fig_h + 0.35 / fig_h,
                width - 0.045, (height_in - 0.75) / fig_h]

    for panel in panels:
        grid = panel["gridPos"]
        if panel["type"] == "row":
            fig.text(0.01, 1 - (header_in + grid["y"] * UNIT_HEIGHT_IN + 0.2) / fig_h,
                     panel["title"], fontsize=12, weight="bold", va="center", color="tab:blue")
            continue
        ax = fig.add_axes(box(grid))
        ax.set_title(panel["title"], fontsize=9, loc="left")
        series = [(legend(t["legend"], s["metric"]),
                   [(float(t_) - start, float(v)) for t_, v in s["values"]])
                  for t in panel["targets"] for s in t["result"]]
        if panel["type"] == "stat":
            ax.axis("off")
            lines = [f"{name}: {value_text(points[-1][1], panel['unit'])}"
                     for name, points in series if points]
            ax.text(0.02, 0.5, "\n".join(lines) or "no data", fontsize=9, va="center",
                    family="monospace", transform=ax.transAxes,
                    color="tab:green" if lines else "tab:red")
            continue
        for name, points in series:
            ax.plot([p[0] for p in points], [p[1] for p in points], linewidth=1, label=name)
        ax.tick_params(labelsize=7)
        ax.set_xlim(0, data["end"] - start)
        ax.set_ylabel(UNITS.get(panel["unit"] or "", ""), fontsize=7)
        if panel["unit"] == "bytes":
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 2 ** 20:.1f} MiB"))
            ax.set_ylabel("")
        if series:
            ax.legend(fontsize=6, loc="upper left", ncol=2 if len(series) > 4 else 1,
                      framealpha=0.7)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", transform=ax.transAxes, color="tab:red")
    top = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    left, bottom, width, height = box({"x": 0, "y": top, "w": GRID_COLUMNS, "h": alert_rows})
    ax = fig.add_axes([left + 0.06, bottom, width - 0.06, height])   # room for the names
    ax.set_title("Alerts (Prometheus's ALERTS series; rules of monitoring/alerts.yml with a "
                 "shorter for:)", fontsize=9, loc="left")
    names = sorted(data["alerts"])
    for row, name in enumerate(names):
        for s in data["alerts"][name]:
            state = s["metric"].get("alertstate")
            xs = [float(t_) - start for t_, _ in s["values"]]
            ax.scatter(xs, [row] * len(xs), s=6, marker="s",
                       color="tab:red" if state == "firing" else "tab:orange",
                       label=f"{state}")
    ax.set_yticks(range(len(names)), [n.removeprefix("Cnpa") for n in names], fontsize=7)
    ax.set_ylim(-0.5, len(names) - 0.5)
    ax.set_xlim(0, data["end"] - start)
    ax.set_xlabel("seconds since Prometheus started", fontsize=7)
    ax.tick_params(labelsize=7)
    handles = {h.get_label(): h for h in ax.collections}
    if handles:
        ax.legend(handles.values(), handles.keys(), fontsize=6, loc="upper left")
    fig.savefig(out, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=Path, help="the JSON test_monitoring_installed.py wrote")
    parser.add_argument("out", type=Path, help="the PNG to write (docs/dashboard.png)")
    args = parser.parse_args()
    draw(json.loads(args.data.read_text()), args.out)


if __name__ == "__main__":
    main()
