"""Fixtures of the long-running controller's tests: a real test host, the CRD installed, and
`python3 -m cnpa_controller` run on this (control) node against the host's API server.

The host is named by CNPA_CONTROLLER_HOST (default ctl-pytest) and destroyed at the end; with
CNPA_CONTROLLER_REUSE=1 an existing running host of that name is used and left running. The
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


@pytest.fixture(scope="session")
def host():
    if os.geteuid() != 0:
        pytest.skip("the test host needs root")
    with session_host(os.environ.get("CNPA_CONTROLLER_HOST", "ctl-pytest"),
                      "CNPA_CONTROLLER_REUSE") as inst:
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
