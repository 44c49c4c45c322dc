"""Under pytest-xdist, keep the tests that share a throwaway host in one worker.

What the tests import: cnpa_controller, testhost and fixtures from the virtualenv that `python3
dev.py setup` makes (its cnpa-op.pth names the package's directory and the repository root, as
an editable install would); hostlib and promlib from tests/, and each directory's own helpers
(ctllib, faultlib, mhlib) from that directory, which pytest puts on the path beside the
conftest.py it finds there."""

from __future__ import annotations

import pytest

# `dev.py test` runs pytest-xdist workers (-n, CNPA_TEST_WORKERS; --dist loadscope). The host tests
# mostly wait on their hosts (Ansible runs, API server restarts, timed faults), so two of them side
# by side take little more than the longer one. Tests that share a session host must run in one
# worker, in order: each directory's host is made once per worker, and two workers making
# "pytest-host" would fight over it. A module with hosts of its own (named for it) is a unit of its
# own, so that it can run beside its directory's others. These are the work units, with the minutes
# each took in the last measured run (docs/figures.md), run longest first; every other module
# (unit tests, linters) is a unit of its own, after them, and serves as filler (below).
# (Not --dist loadgroup: pytest-xdist 3.8 marks its groups in item._nodeid, which pytest 9 no
# longer reads, so every test became a group of its own.)
# Minutes after the control plane's build, from the cold clean-clone run of 2026-12-07 12:48 UTC
# (bench/timeline.py on its .cache/test-logs/timeline.tsv, the build's wait of about 9 minutes
# taken off the three units that waited for it).
UPGRADE = "tests/collection/test_collection.py::test_an_upgrade_from_the_previous_release"
HOST_UNITS = {
    "tests/multihost/": 26,
    "tests/host/": 21,
    "tests/faults/": 16,
    "tests/molecule/test_molecule.py::test_molecule_default": 14,
    "tests/host/test_lab_reset.py": 14,  # with the Debian 12 client's lab (tests/host/labvm.py)
    UPGRADE: 12,
    "tests/controller/": 9,
    "tests/multihost/test_lab_three_hosts.py": 9,
    "tests/multihost/test_watch_chaos.py": 6,
    "tests/collection/": 5,
    "tests/molecule/test_molecule.py::test_molecule_controller": 5,
    "tests/faults/test_watchdog.py": 5,
    "tests/host/test_datastores.py": 2,
}
# Tests that belong to another prefix's unit: the lowest Ansible's install runs on the upgrade
# test's host, after it (tests/collection/test_collection.py's upgrade_host).
JOINED = {
    "tests/collection/test_collection.py::test_the_lowest_ansible_core_and_kubernetes_core_install": UPGRADE,
    # On the Debian 12 lab VM that test_lab_reset.py goes on with (tests/host/labvm.py): first.
    "tests/host/test_debian12_client.py::test_lab_on_debian12": "tests/host/test_lab_reset.py",
    # On the session's host of tests/host (its conftest.py's `host`), not the Debian 12 host.
    "tests/host/test_debian12_client.py::test_default_host_keeps_a_new_enough_distro_client": "tests/host/",
}
SHARED_HOSTS = sorted(HOST_UNITS, key=HOST_UNITS.get, reverse=True)


def _unit_of(nodeid: str) -> str:
    """The host unit a test belongs to (the longest prefix that names it), else its module."""
    joined = [prefix for prefix in JOINED if nodeid.startswith(prefix)]
    if joined:
        return JOINED[joined[0]]
    units = [prefix for prefix in HOST_UNITS if nodeid.startswith(prefix)]
    return max(units, key=len) if units else nodeid.rsplit("::", 1)[0]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Once this worker has run the last test of a host unit, its session hosts go
    (hostlib.end_with_unit): no later test of the worker uses them, and at the end of the session
    the fixtures find them gone."""
    yield
    unit = _unit_of(item.nodeid)
    if nextitem is None or _unit_of(nextitem.nodeid) == unit:
        return
    import hostlib

    for stop in hostlib.UNIT_ENDS.pop(unit, []):
        try:
            stop()
        except Exception as exc:  # the session's teardown destroys it again
            print(f"\n{unit}: destroying its hosts failed: {exc}")


def pytest_collection_modifyitems(config, items):
    if not hasattr(config, "workerinput"):
        return
    # The scheduler queues units in collection order (--no-loadscope-reorder): the long ones first.
    rank = {prefix: i for i, prefix in enumerate(SHARED_HOSTS)}
    items.sort(key=lambda item: rank.get(_unit_of(item.nodeid), len(SHARED_HOSTS)))


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class SharedHostScheduling(LoadScopeScheduling):
        """A worker holds back the last test it was sent until it gets another (pytest needs the
        next item), so xdist sends the next unit while two tests of the current one are pending:
        a host unit taken that way is bound to a worker minutes before the worker is free (the
        soak and the uninstall of tests/multihost, say), while the other worker may free up first
        and idle at the end. Instead, while a worker still has tests of a host unit pending, it
        is sent a module of unit tests or linters (seconds each); the next host unit, longest
        first, goes to whichever worker is really done with its last one."""

        def _split_scope(self, nodeid: str) -> str:
            return _unit_of(nodeid)

        def _assign_work_unit(self, node) -> None:
            busy = any(scope in SHARED_HOSTS and not all(unit.values())
                       for scope, unit in self.assigned_work.get(node, {}).items())
            if busy:
                filler = next((scope for scope in self.workqueue if scope not in SHARED_HOSTS), None)
                if filler is not None:
                    self.workqueue.move_to_end(filler, last=False)
            super()._assign_work_unit(node)

    return SharedHostScheduling(config, log)


# Where a run's minutes went: each test's start and end, by the clock of the process that reports
# them (xdist's controller under dev.py test), into $CNPA_TEST_TIMELINE when it is set (dev.py
# sets it to .cache/test-logs/timeline.tsv); docs/figures.md's per-unit minutes come from it.
def _timeline(event: str, nodeid: str) -> None:
    import os
    import time

    path = os.environ.get("CNPA_TEST_TIMELINE")
    if path and "PYTEST_XDIST_WORKER" not in os.environ:
        with open(path, "a") as out:
            out.write(f"{time.time():.1f}\t{event}\t{_unit_of(nodeid)}\t{nodeid}\n")


def pytest_runtest_logstart(nodeid, location):
    _timeline("start", nodeid)


def pytest_runtest_logfinish(nodeid, location):
    _timeline("end", nodeid)
