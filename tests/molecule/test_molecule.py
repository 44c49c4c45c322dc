"""`molecule test` of the two scenarios that make their own host.

default: a fresh host, site.yml, verify, site.yml again, verify, destroy. verify
(molecule/default/verify.yml) checks every evidence file against the live cluster and repeats
the lab grader's live checks.

controller: playbooks/controller.yml alone: check mode on the fresh host changes nothing, the
install, a second run changes nothing (molecule's idempotence), the controller serves a TeamSpace
and check mode on the installed host predicts no change (molecule/controller/verify.yml).

Each full log goes to .cache/test-logs/molecule[-SCENARIO].log.

Datastores: the default scenario's host stores in etcd (k3s HA's), the controller scenario's in
kine (a single k3s server's SQLite, the test host's default): the lab runs on kine in
tests/host/test_lab_reset.py and tests/multihost, so each datastore has the lab end to end.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _molecule_test(scenario: str, host: str, log_name: str, ephemeral: Path,
                   datastore: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("the test host needs root")
    logdir = ROOT / ".cache/test-logs"
    logdir.mkdir(parents=True, exist_ok=True)
    log = logdir / log_name
    env = dict(os.environ, PATH=f"{ROOT / '.venv/bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
               ANSIBLE_FORCE_COLOR="0", NO_COLOR="1", PY_COLORS="0",
               # A host and a molecule state of its own: a developer's `molecule converge`
               # in the same checkout must not share (or destroy) this run's host.
               CNPA_TESTHOST_NAME=host, CNPA_TESTHOST_DATASTORE=datastore,
               MOLECULE_EPHEMERAL_DIRECTORY=str(ephemeral))
    with open(log, "w") as fh:
        proc = subprocess.run(["molecule", "test", "-s", scenario], cwd=ROOT, env=env,
                              stdout=fh, stderr=subprocess.STDOUT, timeout=2400, check=False)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-150:])
    assert proc.returncode == 0, f"molecule test -s {scenario} failed; last lines of {log}:\n{tail}"
    # prerun: false (molecule.yml): no copy of this repository installed into ~/.ansible/collections.
    assert "Performing prerun" not in log.read_text(errors="replace")


def test_molecule_default_scenario(tmp_path):
    _molecule_test("default", "pytest-molecule", "molecule.log", tmp_path / "molecule", "etcd")


def test_molecule_controller_scenario(tmp_path):
    # The host's name can be changed (CNPA_MOLECULE_CONTROLLER_HOST) to keep within a prefix.
    _molecule_test("controller", os.environ.get("CNPA_MOLECULE_CONTROLLER_HOST", "pytest-mol-controller"),
                   "molecule-controller.log", tmp_path / "molecule", "kine")
