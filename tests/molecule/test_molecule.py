"""`molecule test`: a fresh host, site.yml, verify, site.yml again, verify, destroy.

verify (molecule/default/verify.yml) checks every evidence file against the live cluster and
repeats the lab grader's live checks. The full log goes to .cache/test-logs/molecule.log.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_molecule_default_scenario(tmp_path):
    if os.geteuid() != 0:
        import pytest

        pytest.skip("the test host needs root")
    logdir = ROOT / ".cache/test-logs"
    logdir.mkdir(parents=True, exist_ok=True)
    log = logdir / "molecule.log"
    env = dict(os.environ, PATH=f"{ROOT / '.venv/bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
               ANSIBLE_FORCE_COLOR="0", NO_COLOR="1", PY_COLORS="0",
               # A host and a molecule state of its own: a developer's `molecule converge`
               # in the same checkout must not share (or destroy) this run's host.
               CNPA_TESTHOST_NAME="pytest-molecule",
               MOLECULE_EPHEMERAL_DIRECTORY=str(tmp_path / "molecule"))
    with open(log, "w") as fh:
        proc = subprocess.run(["molecule", "test", "-s", "default"], cwd=ROOT, env=env,
                              stdout=fh, stderr=subprocess.STDOUT, timeout=2400, check=False)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-150:])
    assert proc.returncode == 0, f"molecule test failed; last lines of {log}:\n{tail}"
