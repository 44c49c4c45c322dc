"""The target's kubernetes client (roles/cnpa, docs/target.md), over SSH on real hosts.

kubernetes.core warns on every task ("kubernetes<24.2.0 is not supported or tested") when the
target's interpreter has an older client, as Debian 12's python3-kubernetes (22.6.0) is.

- A Debian 12 (bookworm) host with that package installed: `--check` changes nothing; the whole
  lab passes over SSH without the warning; the role then changes nothing on a second run and the
  k8s tasks run with the pinned client from the virtualenv (>= 24.2.0) while the system's
  package stays as it was.
- The default (trixie) host: the distro's client (30.1.0) is new enough, so the role keeps the
  system interpreter and makes no virtualenv.

Logs: .cache/test-logs/debian12-*.log. CNPA_BOOKWORM_HOST names the bookworm host (default
pytest-bookworm); it is always made fresh and destroyed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from hostlib import ROOT, Host, recap

from testhost import instance as instance_mod

MIN_VERSION = (24, 2, 0)
WARNING = re.compile(r"kubernetes<[0-9.]+ is not supported")
VENV_PYTHON = "/opt/cnpa-op/venv/bin/python"
PROBE = "import kubernetes; print(kubernetes.__version__)"
LOGS = ROOT / ".cache/test-logs"

# The role alone, then what Ansible's interpreter on the target is and what a k8s task says.
ROLE_PLAYBOOK = """\
- name: The role cnpa alone, then a k8s task
  hosts: k3s
  gather_facts: false
  environment:
    K8S_AUTH_KUBECONFIG: "{{ cnpa_kubeconfig }}"
  roles:
    - role: cnpa
  tasks:
    - name: Read the python facts with the interpreter now in use
      ansible.builtin.setup:
        gather_subset: [python]
    - name: Read a namespace with kubernetes.core
      kubernetes.core.k8s_info:
        api_version: v1
        kind: Namespace
        name: kube-system
      register: probe
    - name: Report to the test
      ansible.builtin.copy:
        dest: "{{ report }}"
        mode: "0644"
        content: >-
          {{ {'client': cnpa_python_client, 'executable': ansible_facts.python.executable,
              'k8s_warnings': probe.warnings | default([]),
              'k8s_found': probe.resources | default([]) | length} | to_json }}
      delegate_to: localhost
      check_mode: false
      changed_when: false  # the test's file, not the host
"""


def version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def playbook(inst, playbook_path: Path | str, log: Path, *args: str,
             timeout: float = 600) -> str:
    """Run ansible-playbook against the host over SSH; return its output, failing on rc != 0."""
    LOGS.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="0", NO_COLOR="1", PY_COLORS="0")
    with open(log, "w") as fh:
        proc = subprocess.run(
            [str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(inst.inventory),
             str(playbook_path), *args],
            cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout, check=False)
    text = log.read_text(errors="replace")
    tail = "\n".join(text.splitlines()[-80:])
    assert proc.returncode == 0, f"ansible-playbook {playbook_path} failed; end of {log}:\n{tail}"
    return text


def run_role(inst, tmp_path: Path, log_name: str, *args: str) -> tuple[str, dict]:
    play = tmp_path / "role.yml"
    play.write_text(ROLE_PLAYBOOK)
    report = tmp_path / "report.json"
    report.unlink(missing_ok=True)
    text = playbook(inst, play, LOGS / log_name, "-e", f"report={report}", *args)
    return text, json.loads(report.read_text())


def client_version(h: Host, python: str) -> str:
    proc = h.sh(f"{python} -c '{PROBE}'", check=False)
    return proc.stdout.strip() if proc.returncode == 0 else ""


@pytest.fixture(scope="module")
def bookworm():
    if os.geteuid() != 0:
        pytest.skip("the test host needs root")
    name = os.environ.get("CNPA_BOOKWORM_HOST", "pytest-bookworm")
    instance_mod.destroy(name)  # a leftover of an interrupted run
    inst = instance_mod.create(name, suite="bookworm")
    yield inst
    instance_mod.destroy(name)


def test_lab_on_debian12_runs_k8s_tasks_with_a_supported_client(bookworm, tmp_path):
    inst, h = bookworm, Host(bookworm)
    assert h.sh(". /etc/os-release && echo $VERSION_ID").stdout.strip() == "12"
    # The case of the issue: Debian 12's own client is installed and too old.
    h.sh("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
         "--no-install-recommends python3-kubernetes", timeout=600)
    system = client_version(h, "/usr/bin/python3")
    assert system and version(system) < MIN_VERSION, system

    # --check installs nothing on the target.
    run_role(inst, tmp_path, "debian12-check.log", "--check")
    assert h.sh(f"test -e {VENV_PYTHON}", check=False).returncode != 0

    text = playbook(inst, "site.yml", LOGS / "debian12-site.log", "-e", "cnpa_lab_reset=true",
                    timeout=1800)
    assert recap(text, inst.name)["failed"] == 0
    assert not WARNING.findall(text), f"kubernetes client warnings: {WARNING.findall(text)[:3]}"
    report = json.loads(h.sh("cat /root/cnpa-op/report.json").stdout)
    assert report, "site.yml wrote no report.json"

    # A second run of the role: nothing to do; a k8s task runs with the virtualenv's client.
    text, seen = run_role(inst, tmp_path, "debian12-role.log")
    assert recap(text, inst.name)["changed"] == 0, "the role changed something on a second run"
    assert seen["executable"] == VENV_PYTHON
    assert seen["client"]["interpreter"] == VENV_PYTHON and seen["client"]["source"] == "venv"
    assert version(seen["client"]["version"]) >= MIN_VERSION
    assert client_version(h, VENV_PYTHON) == seen["client"]["version"]
    assert seen["k8s_found"] == 1 and seen["k8s_warnings"] == []
    assert not WARNING.findall(text)
    # The system's package is left as it was.
    assert client_version(h, "/usr/bin/python3") == system


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
