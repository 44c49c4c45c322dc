"""Fixtures for tests that run against a real throwaway test host (python -m testhost).

The session creates a fresh host named by CNPA_TESTHOST_NAME (default: pytest-host) and
destroys it at the end. With CNPA_TESTHOST_REUSE=1 an existing running host of that name is
used and left running (handy while developing).

`lab_vm`: a Debian 12 host after a first lab run, shared by two modules (labvm.py).
"""

from __future__ import annotations

import os

import labvm
import pytest
from hostlib import Host, session_host


@pytest.fixture(scope="session")
def host():
    if os.geteuid() != 0:
        pytest.skip("the test host needs root")
    with session_host(os.environ.get("CNPA_TESTHOST_NAME", "pytest-host"),
                      "CNPA_TESTHOST_REUSE", unit="tests/host/") as inst:
        yield Host(inst)


@pytest.fixture(scope="session")
def lab_vm(tmp_path_factory):
    """The Debian 12 lab VM of test_debian12_client.py and test_lab_reset.py (labvm.py), after
    its first lab run; destroyed once the last of their tests on it is done."""
    if os.geteuid() != 0:
        pytest.skip("the test host needs root")
    with labvm.lab_vm(tmp_path_factory.mktemp("labvm")) as h:
        yield h
