"""Drive a running test host from tests: kubectl, systemctl and the audit log inside it.

Shared by the tiers that drive a host (a module of its own: test modules must not import
`conftest`, of which a pytest session has several).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from testhost import instance as instance_mod
from testhost.common import HostError
from testhost.instance import Instance

ROOT = Path(__file__).resolve().parents[1]


class Host:
    """A running test host, driven through nsenter (kubectl, systemctl inside it)."""

    def __init__(self, inst: Instance) -> None:
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



def compactions(host: Host) -> int:
    """host's API server's Compact calls to its datastore so far (0 before the first)."""
    out = host.sh("kubectl get --raw /metrics | grep '^grpc_client_handled_total{.*\"Compact\"'",
                  check=False).stdout
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in out.splitlines())


def kine_revisions(host: Host) -> tuple[int, int]:
    """(newest revision, compacted revision) of host's kine, read in its SQLite database
    (read-only). Compacted: every revision up to it is gone, which kine's compaction records as
    the prev_revision of its row compact_rev_key (kine's drivers/generic CompactRevSQL); it keeps
    its newest 1000 revisions whatever the API server asks for."""
    script = (
        "import sqlite3, sys\n"
        f"db = sqlite3.connect('file:{instance_mod.KINE_DB}?mode=ro', uri=True)\n"
        "one = lambda q: db.execute(q).fetchone()[0] or 0\n"
        "print(one('select max(id) from kine'),\n"
        "      one(\"select max(prev_revision) from kine where name = 'compact_rev_key'\"))\n")
    newest, compacted = host.inst.exec(["python3", "-c", script]).stdout.split()
    return int(newest), int(compacted)

def recap(text: str, name: str) -> dict[str, int]:
    """The counts (ok, changed, failed, ...) of host name's line in an ansible-playbook recap."""
    line = re.search(rf"^{re.escape(name)}\s*:\s*(.*)$", text, re.MULTILINE)
    assert line, f"no PLAY RECAP line for {name}"
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line.group(1))}


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


def free_port() -> int:
    """A TCP port free on loopback now. The test hosts share this machine's network namespace,
    so a port for a host's service (a controller's metrics, a Prometheus) is chosen here."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(port: int, path: str, timeout: float = 10) -> tuple[int, str]:
    """(status, body) of GET http://127.0.0.1:PORT/PATH; status 0 when nothing answers (yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError:
        return 0, ""


def merge_report(path: Path, data: dict) -> dict:
    """data's keys into the JSON object at path, beside the keys already there, under a lock: a
    report's tests may end in several xdist workers (host units of their own), each adding its
    own keys. Returns what the file now holds."""
    import fcntl

    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            earlier = json.loads(path.read_text())
        except (OSError, ValueError):
            earlier = {}
        merged = (earlier if isinstance(earlier, dict) else {}) | data
        path.write_text(json.dumps(merged, indent=2) + "\n")
    return merged


# A session's host, idle once its unit is done, kept an API server and often a controller running
# for the rest of the run (a fifth of a core for the loop controller's): the callbacks that destroy
# the hosts made for a unit, called by tests/conftest.py once the worker has run the unit's last
# test (pytest_runtest_teardown).
UNIT_ENDS: dict[str, list] = {}


def end_with_unit(unit: str | None, stop) -> None:
    """stop() once this worker has run unit's last test (tests/conftest.py's HOST_UNITS)."""
    if unit:
        UNIT_ENDS.setdefault(unit, []).append(stop)


@contextmanager
def session_host(name: str, reuse_var: str, datastore: str | None = None, unit: str | None = None,
                 **create_options) -> Iterator[Instance]:
    """A running host called name: a fresh one, destroyed at the end (or when unit, a key of
    tests/conftest.py's HOST_UNITS, is done); or, when the environment variable reuse_var is 1,
    the existing running one, left running.

    datastore: "kine" or "etcd" for a module that needs one; None takes the run's
    (CNPA_TESTHOST_DATASTORE, else testhost's default). create_options go to testhost's create
    (e.g. compaction_interval)."""
    inst = None
    if os.environ.get(reuse_var) == "1":
        try:
            inst = instance_mod.Instance.load(name)
        except HostError:
            inst = None
        if inst is not None and not inst.running():
            raise AssertionError(f"{reuse_var}=1 but {name} is not running")
        # Asked for (here or for the run): a reused host must store there. Otherwise the host
        # the developer left running is taken as it is.
        wanted = datastore or os.environ.get("CNPA_TESTHOST_DATASTORE")
        if inst is not None and wanted and inst.datastore() != wanted:
            raise AssertionError(f"{reuse_var}=1 but {name} stores in {inst.datastore()}, "
                                 f"not {wanted}")
    created = inst is None
    if created:
        instance_mod.destroy(name)  # a leftover of an interrupted run
        inst = instance_mod.create(name, datastore=datastore, **create_options)
        end_with_unit(unit, lambda: instance_mod.destroy(name))
    try:
        yield inst
    finally:
        if created:
            instance_mod.destroy(name)
