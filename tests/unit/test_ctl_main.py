"""python3 -m cnpa_controller refuses bad configuration with a clear message and exit status 3."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cnpa_controller.__main__ import ConfigError, duration, read_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("env", "named"), [
    ({"CNPA_WORKERS": "0"}, "CNPA_WORKERS"),
    ({"CNPA_WORKERS": "two"}, "CNPA_WORKERS"),
    ({"CNPA_REQUEST_TIMEOUT": "soon"}, "CNPA_REQUEST_TIMEOUT"),
    ({"CNPA_RESYNC_SECONDS": "-5"}, "CNPA_RESYNC_SECONDS"),
    ({"CNPA_EVENT_NAMESPACE": "Not_A_Namespace"}, "CNPA_EVENT_NAMESPACE"),
    ({"CNPA_ARCHIVE_DIR": "relative/dir"}, "CNPA_ARCHIVE_DIR"),
    ({"CNPA_LEADER_ELECTION": "yes"}, "CNPA_LEADER_ELECTION"),
    ({"CNPA_RENEW_SECONDS": "20"}, "CNPA_RENEW_SECONDS"),
    ({"CNPA_METRICS_ADDRESS": "nowhere"}, "CNPA_METRICS_ADDRESS"),
    ({"KUBECONFIG": "/nonexistent/kubeconfig"}, "KUBECONFIG"),
])
def test_bad_values_exit_3_naming_the_variable(env, named):
    full = {k: v for k, v in os.environ.items() if not k.startswith(("CNPA_", "KUBECONFIG"))}
    full.update({"KUBECONFIG": "/nonexistent/kubeconfig", **env})
    proc = subprocess.run([sys.executable, "-m", "cnpa_controller"], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert named in proc.stderr


def test_defaults_are_reconcile_sh_s():
    conf = read_config({})
    s = conf["settings"]
    assert (s.archive_dir, s.event_namespace, s.request_timeout) == \
        ("/root/cnpa-op/archive", "default", 10.0)
    assert read_config({"CNPA_BASE_DIR": "/b"})["settings"].archive_dir == "/b/archive"
    assert conf["election"] and conf["metrics_address"] is None


def test_durations_as_kubectl_takes_them():
    assert duration("X", "10s") == 10 and duration("X", "500ms") == 0.5
    assert duration("X", "1m") == 60 and duration("X", "7") == 7
    with pytest.raises(ConfigError):
        duration("X", "0s")
