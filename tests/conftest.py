"""Make the repository (testhost) and tests/ (hostlib) importable from every test directory."""

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
for path in (TESTS.parent, TESTS):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


# Under pytest-xdist (`dev.py test` runs two workers, --dist loadgroup), the tests that share a
# throwaway host must run in one worker, in order: each directory's session host is made once per
# worker, and two workers making "pytest-host" would fight over it. Everything else (unit tests,
# linters) may go to either worker.
GROUPS = {"host": "tests/host/", "controller": "tests/controller/", "faults": "tests/faults/",
          "molecule-default": "tests/molecule/test_molecule.py::test_molecule_default",
          "molecule-controller": "tests/molecule/test_molecule.py::test_molecule_controller"}


# tryfirst: xdist's own hook turns the marks into its groups, so they must be there before it runs.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    if not hasattr(config, "workerinput"):
        return
    for item in items:
        for group, prefix in GROUPS.items():
            if item.nodeid.startswith(prefix):
                item.add_marker(pytest.mark.xdist_group(group))
    # xdist hands out the largest groups first, then single tests in collection order: the
    # molecule scenarios (one long test each) go before the many short ones, so that each worker
    # takes a long group while the other still runs one.
    items.sort(key=lambda item: 0 if item.nodeid.startswith("tests/molecule/") else 1)
