"""Fixtures of the long-running controller's tests: a real test host, the CRD installed, and
`python3 -m cnpa_controller` run on this (control) node against the host's API server.

The hosts are named CNPA_CONTROLLER_HOST-DATASTORE (default ctl-pytest-kine, ctl-pytest-etcd)
and destroyed at the end; with CNPA_CONTROLLER_REUSE=1 existing running hosts of those names
are used and left running. The
controller is started with leader election off (CNPA_LEADER_ELECTION=0) and a resync of an hour,
so that whatever these tests see it do was brought by its watches.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ctllib import ControllerProcess, install_crd
from hostlib import Host, session_host

# Every test runs against kine (SQLite through kine, a single k3s server's datastore). The tests
# marked `etcd_too` run against etcd (k3s HA's) as well, on a second host after the first: those
# whose outcome the datastore decides. They differ where a long-running controller is delicate:
# when a resourceVersion or continue token expires (kine keeps its newest 1000 revisions through
# a compaction, etcd none: the watch resumed or relisted after an API-server restart, the paged
# list whose continue token expired), and in the compare-and-swap of concurrent writers of one
# object (the Lease's candidates, the counted Event's patch with the resourceVersion it read).
# The rest (archive files, exit statuses, metrics, token files, one-pass runs) does the same
# requests whatever stores them: tests/host/test_datastores.py shows both store and serve them,
# and tests/faults runs on etcd. CNPA_CONTROLLER_DATASTORES=kine (or etcd) runs one host: on
# etcd alone, only the marked tests.
DATASTORES = [d for d in os.environ.get("CNPA_CONTROLLER_DATASTORES", "kine,etcd").split(",") if d]


def pytest_configure(config):
    config.addinivalue_line("markers", "etcd_too: run against etcd as well as kine "
                            "(tests/controller/conftest.py says which and why)")


def pytest_collection_modifyitems(config, items):
    """On etcd, only the tests marked etcd_too (this hook sees every directory's items)."""
    here = Path(__file__).resolve().parent
    keep, dropped = [], []
    for item in items:
        on_etcd = getattr(item, "callspec", None) is not None and item.callspec.params.get("host") == "etcd"
        if on_etcd and item.path.is_relative_to(here) and item.get_closest_marker("etcd_too") is None:
            dropped.append(item)
        else:
            keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture(scope="session", params=DATASTORES)
def host(request):
    if os.geteuid() != 0:
        pytest.skip("the test host needs root")
    name = f"{os.environ.get('CNPA_CONTROLLER_HOST', 'ctl-pytest')}-{request.param}"
    # A compaction every 10 s (the API server's default is 5 min): what expires, expires here.
    with session_host(name, "CNPA_CONTROLLER_REUSE", datastore=request.param,
                      unit="tests/controller/", compaction_interval="10s") as inst:
        h = Host(inst)
        install_crd(h)
        yield h


@pytest.fixture
def start_controller(host, tmp_path):
    """start_controller(**env) -> a running ControllerProcess; all are stopped at the end."""
    started: list[ControllerProcess] = []

    def start(workdir: str = "controller", wait_synced: bool = True, **env: str):
        c = ControllerProcess(host, tmp_path / workdir, **env)
        started.append(c)
        return c.start(wait_synced=wait_synced)

    yield start
    for c in started:
        c.stop()


@pytest.fixture
def controller(start_controller):
    return start_controller()
