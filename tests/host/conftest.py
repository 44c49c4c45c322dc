"""Fixtures for tests that run against a real throwaway test host (python -m testhost).

The session creates a fresh host named by CNPA_TESTHOST_NAME (default: pytest-host) and
destroys it at the end. With CNPA_TESTHOST_REUSE=1 an existing running host of that name is
used and left running (handy while developing).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from testhost import instance as instance_mod  # noqa: E402
from testhost.common import HostError  # noqa: E402


class Host:
    """A running test host, driven through nsenter (kubectl, systemctl inside it)."""

    def __init__(self, inst: instance_mod.Instance) -> None:
        self.inst = inst

    def sh(self, script: str, *, check: bool = True, timeout: float = 120,
           input_text: str | None = None) -> subprocess.CompletedProcess:
        return self.inst.exec(["bash", "-c", script], check=check, timeout=timeout,
                              input_text=input_text)

    def kubectl(self, *args: str, check: bool = True, input_text: str | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess:
        return self.inst.exec(["kubectl", *args], check=check, input_text=input_text,
                              timeout=timeout)

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def apply(self, manifest: dict) -> None:
        self.kubectl("apply", "-f", "-", input_text=json.dumps(manifest))

    def exists(self, *args: str) -> bool:
        return self.kubectl("get", *args, check=False).returncode == 0

    def audit_lines(self) -> list[dict]:
        text = self.sh("cat /var/log/kubernetes/audit.log").stdout
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def wait_for(predicate, *, timeout: float, interval: float = 0.25, what: str = "condition"):
    """Poll predicate until it returns a truthy value; bounded in time."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


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
