"""Fixtures for tests on three real test hosts sharing one API server (issue 13).

`hosts`: three running hostlib.Host, named by CNPA_MULTIHOST_HOSTS (comma separated, default
mhp-1,mhp-2,mhp-3). The first ("A") runs the one API server; B and C use it through A's admin
kubeconfig at the roles' cnpa_kubeconfig path, their own control plane stopped (mhlib.join).
Fresh hosts, destroyed at the end; with CNPA_MULTIHOST_REUSE=1 three running hosts of those names
are used and left running (handy while developing).
`inventory`: an INI inventory whose group k3s holds the three hosts over real SSH.
`cluster`: playbooks/controller.yml installed on the three (watch mode, leader election, archive
records also as ConfigMaps), once for every module that asks for it (mhlib.installed_cluster);
the first module to ask installs it. Two modules have three hosts of their own (their module's
`hosts`) and run beside the others, each a scheduling unit (tests/conftest.py's HOST_UNITS):
test_lab_three_hosts.py (mhl-*), which needs a fresh cluster, and test_watch_chaos.py (mhc-*),
whose N TeamSpaces and compactions would otherwise add their minutes to the shared hosts' unit,
the longest of the run.
At the end the figures go to $CNPA_MULTIHOST_REPORT (mhlib.write_report).

Datastore: the test host's default, kine (SQLite; CNPA_TESTHOST_DATASTORE chooses another). k3s
runs HA on an external SQL datastore through kine as well as on embedded etcd; etcd is covered
by tests/controller, tests/faults and molecule's lab, and a second run of these three hosts'
suites (about 20 minutes) would not fit CI's time.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mhlib import host_names, installed_cluster, three_hosts, write_inventory


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
    with installed_cluster(hosts, inventory) as c:
        yield c
