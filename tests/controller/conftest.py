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
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ctllib import ControllerProcess, install_crd
from hostlib import Host, session_host

# Every test runs against both datastores, one host after the other: kine (SQLite, a single k3s
# server's) and etcd (k3s HA's). They differ where a long-running controller is delicate: when a
# resourceVersion or continue token expires (kine keeps its newest 1000 revisions through a
# compaction, etcd none). CNPA_CONTROLLER_DATASTORES=kine (or etcd) runs one of them.
DATASTORES = [d for d in os.environ.get("CNPA_CONTROLLER_DATASTORES", "kine,etcd").split(",") if d]


@pytest.fixture(scope="session", params=DATASTORES)
def host(request):
    if os.geteuid() != 0:
        pytest.skip("the test host needs root")
    name = f"{os.environ.get('CNPA_CONTROLLER_HOST', 'ctl-pytest')}-{request.param}"
    # A compaction every 10 s (the API server's default is 5 min): what expires, expires here.
    with session_host(name, "CNPA_CONTROLLER_REUSE", datastore=request.param,
                      compaction_interval="10s") as inst:
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
