"""Fixtures for tests on three real test hosts sharing one API server (issue 13).

`hosts`: three running hostlib.Host, named by CNPA_MULTIHOST_HOSTS (comma separated, default
mhp-1,mhp-2,mhp-3). The first ("A") runs the one API server; B and C use it through A's admin
kubeconfig at the roles' cnpa_kubeconfig path, their own control plane stopped (mhlib.join).
Fresh hosts, destroyed at the end; with CNPA_MULTIHOST_REUSE=1 three running hosts of those names
are used and left running (handy while developing).
`inventory`: an INI inventory whose group k3s holds the three hosts over real SSH.

Datastore: the test host's default, kine (SQLite; CNPA_TESTHOST_DATASTORE chooses another). k3s
runs HA on an external SQL datastore through kine as well as on embedded etcd; etcd is covered
by tests/controller, tests/faults and molecule's lab, and a second run of these three hosts'
suites (about 20 minutes) would not fit CI's time.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mhlib import host_names, three_hosts, write_inventory


@pytest.fixture(scope="session")
def hosts():
    if os.geteuid() != 0:
        pytest.skip("the test hosts need root")
    with three_hosts(host_names()) as hs:
        yield hs


@pytest.fixture(scope="session")
def inventory(hosts, tmp_path_factory) -> Path:
    return write_inventory(hosts, tmp_path_factory.mktemp("multihost") / "inventory.ini")
