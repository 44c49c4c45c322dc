"""Fixtures for tests that run against a real throwaway test host (python -m testhost).

The session creates a fresh host named by CNPA_TESTHOST_NAME (default: pytest-host) and
destroys it at the end. With CNPA_TESTHOST_REUSE=1 an existing running host of that name is
used and left running (handy while developing).
"""

from __future__ import annotations

import os

import pytest
from hostlib import Host, session_host


@pytest.fixture(scope="session")
def host():
    if os.geteuid() != 0:
        pytest.skip("the test host needs root")
    with session_host(os.environ.get("CNPA_TESTHOST_NAME", "pytest-host"),
                      "CNPA_TESTHOST_REUSE", unit="tests/host/") as inst:
        yield Host(inst)
