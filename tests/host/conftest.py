"""Fixtures for tests that run against a real throwaway test host (python -m testhost).

The session creates a fresh host named by CNPA_TESTHOST_NAME (default: pytest-host) and
destroys it at the end. With CNPA_TESTHOST_REUSE=1 an existing running host of that name is
used and left running (handy while developing).
"""

from __future__ import annotations

import os

import pytest
from hostlib import Host

from testhost import instance as instance_mod
from testhost.common import HostError


@pytest.fixture(scope="session")
def host():
    if os.geteuid() != 0:
        pytest.skip("the test host needs root")
    name = os.environ.get("CNPA_TESTHOST_NAME", "pytest-host")
    reuse = os.environ.get("CNPA_TESTHOST_REUSE") == "1"
    inst = None
    if reuse:
        try:
            inst = instance_mod.Instance.load(name)
        except HostError:
            inst = None
        if inst is not None and not inst.running():
            raise AssertionError(f"CNPA_TESTHOST_REUSE=1 but {name} is not running")
    created = inst is None
    if created:
        instance_mod.destroy(name)  # a leftover of an interrupted run
        inst = instance_mod.create(name)
    yield Host(inst)
    if created:
        instance_mod.destroy(name)
