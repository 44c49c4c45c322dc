"""The target's kubernetes client (roles/cnpa, docs/target.md), over SSH on real hosts.

kubernetes.core warns on every task ("kubernetes<24.2.0 is not supported or tested") when the
target's interpreter has an older client, as Debian 12's python3-kubernetes (22.6.0) is.

- The Debian 12 lab VM (conftest.py's `lab_vm`, labvm.py, shared with test_lab_reset.py): with
  that package installed, the role's `--check` installed nothing; the whole lab passed over SSH
  without the warning; the role then changes nothing on a second run and the k8s tasks run with
  the pinned client from the virtualenv (>= 24.2.0) while the system's package stays as it was.
- The default (trixie) host: the distro's client (30.1.0) is new enough, so the role keeps the
  system interpreter and makes no virtualenv.

Logs: .cache/test-logs/debian12-*.log, labvm-1.log (the lab's run), trixie-role*.log.
"""

from __future__ import annotations

import json

from hostlib import recap
from labvm import MIN_VERSION, VENV_PYTHON, WARNING, client_version, run_role, version


def test_lab_on_debian12_runs_k8s_tasks_with_a_supported_client(lab_vm, tmp_path):
    h = lab_vm
    assert h.sh(". /etc/os-release && echo $VERSION_ID").stdout.strip() == "12"
    # The case of the issue: Debian 12's own client is installed and too old.
    assert h.system_client and version(h.system_client) < MIN_VERSION, h.system_client
    # --check installed nothing on the target (run before the lab, by lab_vm).
    assert not h.check_left_venv, "the role in check mode made the virtualenv"

    text = h.first.stdout + h.first.stderr
    assert recap(text, h.inst.name)["failed"] == 0
    assert not WARNING.findall(text), f"kubernetes client warnings: {WARNING.findall(text)[:3]}"
    report = json.loads(h.sh("cat /root/cnpa-op/report.json").stdout)
    assert report, "site.yml wrote no report.json"

    # A second run of the role: nothing to do; a k8s task runs with the virtualenv's client.
    text, seen = run_role(h.inst, tmp_path, "debian12-role.log")
    assert recap(text, h.inst.name)["changed"] == 0, "the role changed something on a second run"
    assert seen["executable"] == VENV_PYTHON
    assert seen["client"]["interpreter"] == VENV_PYTHON and seen["client"]["source"] == "venv"
    assert version(seen["client"]["version"]) >= MIN_VERSION
    assert client_version(h, VENV_PYTHON) == seen["client"]["version"]
    assert seen["k8s_found"] == 1 and seen["k8s_warnings"] == []
    assert not WARNING.findall(text)
    # The system's package is left as it was.
    assert client_version(h, "/usr/bin/python3") == h.system_client


def test_default_host_keeps_a_new_enough_distro_client(host, tmp_path):
    inst = host.inst
    text, seen = run_role(inst, tmp_path, "trixie-role.log")
    assert seen["client"]["source"] in ("interpreter", "distro"), seen
    # The interpreter Ansible discovered (/usr/bin/python3.13 on trixie), no virtualenv.
    assert seen["client"]["interpreter"] == seen["executable"]
    assert seen["executable"].startswith("/usr/bin/python3"), seen
    assert version(seen["client"]["version"]) >= MIN_VERSION
    assert client_version(host, "/usr/bin/python3") == seen["client"]["version"]
    assert seen["k8s_found"] == 1 and seen["k8s_warnings"] == []
    assert not WARNING.findall(text)
    assert host.sh("test -e /opt/cnpa-op/venv", check=False).returncode != 0, "a virtualenv was made"

    text, seen = run_role(inst, tmp_path, "trixie-role-again.log")
    assert recap(text, inst.name)["changed"] == 0, "the role changed something on a second run"
    assert seen["client"]["source"] == "interpreter"
