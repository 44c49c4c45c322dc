"""Fixtures for tests on three real test hosts sharing one API server (issue 13).

`hosts`: three running hostlib.Host, named by CNPA_MULTIHOST_HOSTS (comma separated, default
mhp-1,mhp-2,mhp-3). The first ("A") runs the one API server; B and C use it through A's admin
kubeconfig at the roles' cnpa_kubeconfig path, their own control plane stopped (mhlib.join).
Fresh hosts, destroyed at the end; with CNPA_MULTIHOST_REUSE=1 three running hosts of those names
are used and left running (handy while developing).
`inventory`: an INI inventory whose group k3s holds the three hosts over real SSH.
`cluster`: playbooks/controller.yml installed on the three (watch mode, leader election, archive
records also as ConfigMaps), once for every module that asks for it (mhlib.Cluster); the first
module to ask installs it. test_lab_three_hosts.py, which needs a fresh cluster, has three hosts
of its own (mhl-*, its module's `hosts`), and runs beside the others.
At the end of the session the modules' figures go to $CNPA_MULTIHOST_REPORT (mhlib.write_report).

Datastore: the test host's default, kine (SQLite; CNPA_TESTHOST_DATASTORE chooses another). k3s
runs HA on an external SQL datastore through kine as well as on embedded etcd; etcd is covered
by tests/controller, tests/faults and molecule's lab, and a second run of these three hosts'
suites (about 20 minutes) would not fit CI's time.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from hostlib import wait_for
from mhlib import (
    REPORT,
    Cluster,
    host_names,
    install,
    rfc3339,
    three_hosts,
    unit,
    write_inventory,
    write_report,
)


@pytest.fixture(scope="session")
def hosts():
    if os.geteuid() != 0:
        pytest.skip("the test hosts need root")
    with three_hosts(host_names()) as hs:
        yield hs


@pytest.fixture(scope="session")
def inventory(hosts, tmp_path_factory) -> Path:
    return write_inventory(hosts, tmp_path_factory.mktemp("multihost") / "inventory.ini")


@pytest.fixture(scope="session")
def cluster(hosts, inventory):
    since = rfc3339(time.time())
    t0 = time.monotonic()
    # CNPA_MULTIHOST_INSTALLED=1 (with CNPA_MULTIHOST_REUSE=1, while developing): hosts on which
    # this playbook ran already.
    if os.environ.get("CNPA_MULTIHOST_INSTALLED") != "1":
        install(inventory)
    REPORT["install_s"] = round(time.monotonic() - t0, 1)
    for h in hosts:
        wait_for(lambda h=h: unit(h, "ActiveState") == "active", timeout=60, interval=0.5,
                 what=f"cnpa-op active on {h.inst.name}")
    c = Cluster(hosts, since)
    assert c.archive_configmaps, "the unit does not set CNPA_ARCHIVE_NAMESPACE"
    c.leader()
    yield c
    path = write_report()
    print(f"\nmulti-host measurements: {path}\n{json.dumps(REPORT, indent=2)}")
