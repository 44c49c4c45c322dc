"""A session-wide throwaway host with the controller installed, for the fault tests.

The host is named by CNPA_FAULTS_HOST (default pytest-faults) and destroyed at the end; with
CNPA_FAULTS_REUSE=1 an existing running host of that name is used and left running.
test_watchdog.py, which switches its host to the watch controller, has a host of its own
(CNPA_WATCHDOG_HOST, default pytest-watchdog) and is a scheduling unit of its own. The
controller is installed by tests/faults/install.yml (the project's roles), not re-implemented.
Each test records what it measured in `report`; the session writes it to
$CNPA_FAULTS_REPORT (default /tmp/cnpa-faults-report.json) for docs/faults.md.

Datastore: etcd, k3s's HA datastore. The lab, tests/controller and tests/multihost run on kine
(a single k3s server's SQLite), tests/controller's datastore-bound tests and molecule's lab on
etcd as well; the fault suite is the longest single-host suite, and running it on both would cost
CI about 15 minutes for faults of the controller and its unit, not of the datastore.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from faultlib import fault_host
from hostlib import merge_report


@pytest.fixture(scope="session")
def lab():
    if os.geteuid() != 0:
        pytest.skip("the test host needs root")
    with fault_host(os.environ.get("CNPA_FAULTS_HOST", "pytest-faults"), "CNPA_FAULTS_REUSE",
                    unit="tests/faults/") as h:
        yield h


@pytest.fixture(scope="session")
def report():
    data: dict = {}
    yield data
    path = Path(os.environ.get("CNPA_FAULTS_REPORT", "/tmp/cnpa-faults-report.json"))
    # Beside what the other worker's unit (test_watchdog.py's or the rest's) wrote there.
    data = merge_report(path, data)
    print(f"\nfault test measurements: {path}\n{json.dumps(data, indent=2)}")
