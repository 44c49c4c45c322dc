"""The user docs (README.md, docs/*.md) give one set of figures and no internal bookkeeping.

Times in minutes for the tests, the lab and the builds live on docs/figures.md, each with its
date and command; another page that gives one could contradict it (it did: the suite's time was
given three ways). So any other page's sentence that names one of those and gives minutes fails,
and the README must link to the figures page. docs/benchmark.md keeps its own figures.
Internal issue numbers and "in progress" mean nothing to a reader of the docs and go stale."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "docs" / "figures.md"
OWN_FIGURES = {FIGURES, ROOT / "docs" / "benchmark.md"}
USER_DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])

# What a sentence is about: the tests, the lab, a build, a test host.
SUBJECT = re.compile(r"dev\.py|\.ci/run|pytest|\bsuite\b|\blab\b|\bbuil[dt]|\btests?\b|"
                     r"test host|molecule|site\.yml|debootstrap|rootfs|\bCI\b|how long|"
                     r"first time|\bcold\b|\bwarm\b", re.IGNORECASE)
# A measured time in minutes ("47 min 05 s", "9 min", "10.6 min", "3-5 min", "12 minutes"); not a
# period ("every 5 minutes").
MINUTES = re.compile(r"(?<!every )\b\d+(?:[.,]\d+)?(?:\s*[-\u2013]\s*\d+(?:[.,]\d+)?)?\s*"
                     r"(?:min|minutes?)\b", re.IGNORECASE)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def sentences(text: str) -> list[str]:
    """Each table row, list item and sentence of the prose; fenced blocks (quoted output and
    commands) left out."""
    text = FENCE.sub("", text)
    out = []
    for block in re.split(r"\n\s*\n", text):
        for part in re.split(r"\n(?=\s*(?:>\s*)?(?:\||- |\d+\. ))", block):
            out += re.split(r"(?<=[.;])\s+(?=[A-Z(`*])", " ".join(part.split()))
    return out


def timed_claims(text: str) -> list[str]:
    """The sentences that give a time in minutes for the tests, the lab or a build. Minutes
    inside `code` are quoted messages or settings, not claims of the page."""
    return [s for s in sentences(text)
            if SUBJECT.search(s) and MINUTES.search(INLINE_CODE.sub("", s))]


@pytest.mark.parametrize("doc", [d for d in USER_DOCS if d not in OWN_FIGURES], ids=_rel)
def test_no_page_but_figures_gives_times_of_tests_lab_or_builds(doc):
    claims = timed_claims(doc.read_text())
    assert not claims, (f"{_rel(doc)} gives times that belong on docs/figures.md (with date and "
                        "command), so they cannot contradict it; link there instead:\n  "
                        + "\n  ".join(claims))


def test_figures_page_has_a_date_and_command_for_each_figure():
    rows = [line for line in FIGURES.read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| measurement")]
    assert len(rows) >= 4
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        assert len(cells) == 4, row
        _measurement, figure, date, command = cells
        assert re.search(r"\d", figure), row
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}(; \d{4}-\d{2}-\d{2})*", date), row
        assert command, row


@pytest.mark.parametrize("measurement", [
    "`python3 dev.py test`, clean clone, warm caches",
    "`python3 dev.py test`, cold (fresh machine, builds included)",
    "`python3 dev.py lab`, first time on a fresh machine",
    "`python3 dev.py lab` again, cache warm, on a new test host",
])
def test_figures_page_has_one_row_for_each_measurement_of_the_two_commands(measurement):
    # The figures themselves are written only there, not here.
    rows = [line for line in FIGURES.read_text().splitlines() if line.startswith(f"| {measurement} |")]
    assert len(rows) == 1, (measurement, rows)


def test_readme_links_to_the_figures_page():
    assert "](docs/figures.md)" in (ROOT / "README.md").read_text()


INTERNAL = re.compile(r"\bissues?\s+\d+|\bissue\s+\d+|(?<![\w&/])#\d+\b|\bin progress\b|"
                      r"\bnext issue", re.IGNORECASE)


@pytest.mark.parametrize("doc", USER_DOCS, ids=_rel)
def test_no_internal_issue_numbers_or_in_progress(doc):
    hits = [f"{n}: {line.strip()[:120]}" for n, line in enumerate(doc.read_text().splitlines(), 1)
            if INTERNAL.search(INLINE_CODE.sub("", line))]
    assert not hits, f"{_rel(doc)} speaks of internal issues or work in progress:\n  " + \
        "\n  ".join(hits)


@pytest.mark.parametrize("text,found", [
    ("`python3 dev.py test` takes 61 min on 2 cores.", True),
    ("The suite ran for 12 minutes.", True),
    ("The first build takes 9-10 min.", True),
    ("A resync re-checks everything every 5 minutes.", False),
    ("`go build … did not finish within 75 min`: the machine is overloaded.", False),
    ("The tests: [figures](docs/figures.md).", False),
    ("```\nthe lab took 7 min\n```\n", False),
    ("| **How long** | first time 11 min 43 s | again 44 min 20 s |", True),
])
def test_timed_claims_finds_what_it_should(text, found):
    assert bool(timed_claims(text)) is found
