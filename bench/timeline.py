"""Where a test run's minutes went: each scheduling unit's first start and last end, in minutes
from the run's first test, from the timeline `python3 dev.py test` writes (tests/conftest.py).

    .venv/bin/python bench/timeline.py [.cache/test-logs/timeline.tsv]

Units are tests/conftest.py's HOST_UNITS (a module otherwise); the longest first. The run's
start is its first test's, after the virtualenv and collection: the minutes before it are not
counted here.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def units(lines: list[str]) -> dict[str, tuple[float, float, int]]:
    """unit -> (first start, last end, tests), in seconds since the epoch."""
    seen: dict[str, tuple[float, float, int]] = {}
    for line in lines:
        fields = line.rstrip("\n").split("\t")
        if len(fields) != 4:
            continue
        t, event, unit = float(fields[0]), fields[1], fields[2]
        start, end, n = seen.get(unit, (t, t, 0))
        seen[unit] = (min(start, t), max(end, t), n + (event == "end"))
    return seen


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else ROOT / ".cache" / "test-logs" / "timeline.tsv"
    seen = units(path.read_text().splitlines())
    if not seen:
        print(f"{path}: no test recorded")
        return 1
    t0 = min(start for start, _, _ in seen.values())
    t1 = max(end for _, end, _ in seen.values())
    print(f"{path}: {len(seen)} units, {(t1 - t0) / 60:.1f} min from the first test's start "
          "to the last one's end")
    print(f"{'from':>6} {'to':>6} {'min':>6} {'tests':>5}  unit")
    rows = sorted(seen.items(), key=lambda kv: kv[1][0] - kv[1][1])
    for unit, (start, end, n) in rows:
        if end - start < 60:
            continue
        print(f"{(start - t0) / 60:6.1f} {(end - t0) / 60:6.1f} {(end - start) / 60:6.1f} {n:5d}  {unit}")
    short = [u for u, (s, e, _) in seen.items() if e - s < 60]
    print(f"(and {len(short)} units of under a minute each)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
