"""Every linter the project promises, each a test: ruff, yamllint, ansible-lint, shellcheck, and
antsibull-changelog on the collection's changelog fragments."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv/bin"
SHELL_SCRIPTS = ["reconcile.sh", ".ci/run", "testhost/files/usr/local/sbin/testhost-pki"]


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False,
                          timeout=600)


@pytest.mark.parametrize("cmd", [
    pytest.param(["ruff", "check", "."], id="ruff"),
    pytest.param(["yamllint", "--strict", "."], id="yamllint"),
    pytest.param(["ansible-lint", "--profile", "production", "--strict"], id="ansible-lint"),
    pytest.param(["shellcheck", "--severity=style", *SHELL_SCRIPTS], id="shellcheck"),
    pytest.param(["antsibull-changelog", "lint"], id="changelog"),
])
def test_lint_clean(cmd):
    proc = _run(cmd)
    assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stdout}\n{proc.stderr}"
