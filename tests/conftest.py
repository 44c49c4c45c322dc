"""Make the repository (testhost) and tests/ (hostlib) importable from every test directory; under
pytest-xdist, keep the tests that share a throwaway host in one worker."""

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
for path in (TESTS.parent, TESTS):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

# `dev.py test` runs two pytest-xdist workers (-n 2 --dist loadscope). The host tests mostly wait on
# their hosts (Ansible runs, API server restarts, timed faults), so two of them side by side take
# little more than the longer one. Tests that share a session host must run in one worker, in
# order: each directory's host is made once per worker, and two workers making "pytest-host" would
# fight over it. These are the work units, longest first (a worker takes the next unit when it
# is nearly done): every other module (unit tests, linters) is a unit of its own, after them.
# (Not --dist loadgroup: pytest-xdist 3.8 marks its groups in item._nodeid, which pytest 9 no
# longer reads, so every test became a group of its own.)
SHARED_HOSTS = ["tests/multihost/", "tests/molecule/test_molecule.py::test_molecule_default",
                "tests/host/", "tests/faults/", "tests/molecule/test_molecule.py::test_molecule_controller",
                "tests/collection/", "tests/controller/"]


def _unit_of(nodeid: str) -> str:
    for prefix in SHARED_HOSTS:
        if nodeid.startswith(prefix):
            return prefix
    return nodeid.rsplit("::", 1)[0]


def pytest_collection_modifyitems(config, items):
    if not hasattr(config, "workerinput"):
        return
    # The scheduler queues units in collection order (--no-loadscope-reorder): the long ones first.
    rank = {prefix: i for i, prefix in enumerate(SHARED_HOSTS)}
    items.sort(key=lambda item: rank.get(_unit_of(item.nodeid), len(SHARED_HOSTS)))


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class SharedHostScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit_of(nodeid)

    return SharedHostScheduling(config, log)
