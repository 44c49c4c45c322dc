"""bench/timeline.py: a unit's span is its first test's start to its last test's end."""

from __future__ import annotations

from bench import timeline


def test_a_unit_spans_its_first_start_to_its_last_end_and_counts_its_tests():
    lines = [
        "100.0\tstart\ttests/host/\ttests/host/test_a.py::t1",
        "160.0\tend\ttests/host/\ttests/host/test_a.py::t1",
        "130.0\tstart\ttests/unit/test_x.py\ttests/unit/test_x.py::u",
        "131.0\tend\ttests/unit/test_x.py\ttests/unit/test_x.py::u",
        "160.5\tstart\ttests/host/\ttests/host/test_b.py::t2",
        "400.0\tend\ttests/host/\ttests/host/test_b.py::t2",
        "not a line of the timeline",
    ]
    assert timeline.units(lines) == {"tests/host/": (100.0, 400.0, 2),
                                     "tests/unit/test_x.py": (130.0, 131.0, 1)}
