"""A Debian 12 lab VM, shared by test_debian12_client.py and test_lab_reset.py (conftest.py's
`lab_vm`): one host and one lab run for both instead of a host and a lab each.

What a lab VM may hold before the lab first runs there, and then that first run:
- Debian 12 (bookworm) with its own python3-kubernetes, 22.6.0, too old for kubernetes.core
  (the role must then run its k8s tasks with the pinned client of a virtualenv);
- the role `cnpa` alone in check mode (it must install nothing);
- records in the lab's archive that are not the lab's (FOREIGN: another name, the lab's names
  with other uids, a file that is no record);
- site.yml, without cnpa_lab_reset: nothing of the lab's is there to reset, so no consent is
  needed.
The fixture checks only that these happened; the two modules assert what they are about on the
outputs kept here (`system_client`, `check_left_venv`, `first`) and on the host.

Every ansible-playbook output goes to .cache/test-logs (labvm-<n>.log, debian12-*.log).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hostlib import ROOT, Host, session_host

BASE = "/root/cnpa-op"
ARCHIVE = f"{BASE}/archive"
TS = "teamspaces.platform.labhub.io"
LOGS = ROOT / ".cache" / "test-logs"
# The unit of tests/conftest.py both modules' tests on this host belong to.
UNIT = "tests/host/test_lab_reset.py"

# Records of TeamSpaces the lab did not make: another name, and the lab's names with uids that
# are not the lab's. Odd bytes on purpose (no newline, spacing, a key the controller never
# writes): "untouched" means these exact bytes.
FOREIGN = {
    "zeta.json": '{"name": "zeta", "uid": "0b1c2d3e-0000-4000-8000-00000000zeta", "pods": 3}',
    "alpha.11111111-2222-4333-8444-555555555555.json":
        '{"name":"alpha","uid":"11111111-2222-4333-8444-555555555555","pods":1,"note":"not the lab\'s"}\n',
    "beta.66666666-7777-4888-8999-000000000000.json":
        '{\n  "name": "beta",\n  "uid": "66666666-7777-4888-8999-000000000000",\n  "pods": 2\n}\n',
    "notes.txt": "kept by someone else\n",
}

# kubernetes.core warns on every task ("kubernetes<24.2.0 is not supported or tested") when the
# target's interpreter has an older client.
MIN_VERSION = (24, 2, 0)
WARNING = re.compile(r"kubernetes<[0-9.]+ is not supported")
VENV_PYTHON = "/opt/cnpa-op/venv/bin/python"
PROBE = "import kubernetes; print(kubernetes.__version__)"

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


def client_version(h: Host, python: str) -> str:
    proc = h.sh(f"{python} -c '{PROBE}'", check=False)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def playbook(inst, playbook_path: Path | str, log: Path, *args: str,
             timeout: float = 1800) -> subprocess.CompletedProcess:
    """ansible-playbook against the host over SSH, from the project's directory; its output in
    the process returned and in log."""
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="0", NO_COLOR="1", ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(inst.inventory),
                           str(playbook_path), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)
    LOGS.mkdir(parents=True, exist_ok=True)
    log.write_text(proc.stdout + proc.stderr)
    return proc


def run_role(inst, tmp_path: Path, log_name: str, *args: str) -> tuple[str, dict]:
    """ROLE_PLAYBOOK against the host: its output and its report."""
    play = tmp_path / "role.yml"
    play.write_text(ROLE_PLAYBOOK)
    report = tmp_path / "report.json"
    report.unlink(missing_ok=True)
    proc = playbook(inst, play, LOGS / log_name, "-e", f"report={report}", *args, timeout=600)
    assert proc.returncode == 0, f"the role's playbook failed; end of {LOGS / log_name}:\n{tail(proc)}"
    return proc.stdout + proc.stderr, json.loads(report.read_text())


class LabVM(Host):
    """The shared host, with the lab run against it through its inventory."""

    runs = 0

    def playbook(self, path: str, *extra: str) -> subprocess.CompletedProcess:
        LabVM.runs += 1
        return playbook(self.inst, path, LOGS / f"labvm-{LabVM.runs}.log", *extra)

    def controller_active(self) -> bool:
        return self.sh("systemctl is-active cnpa-op", check=False).stdout.strip() == "active"

    def files(self) -> dict[str, str]:
        """sha256 of every file under the lab's directory (evidence, archive, scripts)."""
        out = self.sh(f"cd {BASE} && find . -type f -print0 | sort -z | xargs -0r sha256sum").stdout
        return {line.split(None, 1)[1]: line.split(None, 1)[0] for line in out.splitlines()}

    def foreign_bytes(self) -> dict[str, str]:
        return {name: hashlib.sha256(self.sh(f"cat {ARCHIVE}/{name}").stdout.encode()).hexdigest()
                for name in FOREIGN if self.sh(f"test -f {ARCHIVE}/{name}", check=False).returncode == 0}

    def obj(self, *args: str) -> dict | None:
        proc = self.kubectl("get", *args, "-o", "json", check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    def snapshot(self) -> dict:
        """What a run that changes nothing must leave as it is."""
        snap: dict = {"files": self.files()}
        for args in ([TS, "alpha"], [TS, "beta"], ["namespace", "team-alpha"], ["namespace", "team-beta"],
                     ["resourcequota", "team-quota", "-n", "team-alpha"]):
            o = self.obj(*args)
            snap[" ".join(args)] = o and (o["metadata"]["uid"], o["metadata"]["resourceVersion"])
        snap["controller"] = self.sh("systemctl show -p ActiveState -p MainPID cnpa-op").stdout
        return snap


def tail(proc: subprocess.CompletedProcess) -> str:
    return (proc.stdout + proc.stderr)[-6000:]


@contextmanager
def lab_vm(tmp_path: Path) -> Iterator[LabVM]:
    """The host (CNPA_LABVM_HOST, default pytest-labvm; with CNPA_LABVM_REUSE=1 a running host of
    that name is taken as it is and left running) after the steps of the module docstring."""
    with session_host(os.environ.get("CNPA_LABVM_HOST", "pytest-labvm"), "CNPA_LABVM_REUSE",
                      unit=UNIT, suite="bookworm") as inst:
        h = LabVM(inst)
        h.sh("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
             "--no-install-recommends python3-kubernetes", timeout=600)
        h.system_client = client_version(h, "/usr/bin/python3")
        run_role(inst, tmp_path, "debian12-check.log", "--check")
        h.check_left_venv = h.sh(f"test -e {VENV_PYTHON}", check=False).returncode == 0
        h.sh(f"mkdir -p {ARCHIVE}")
        for name, text in FOREIGN.items():
            h.sh(f"cat > {ARCHIVE}/{name}", input_text=text)
        h.expected = {n: hashlib.sha256(t.encode()).hexdigest() for n, t in FOREIGN.items()}
        assert h.foreign_bytes() == h.expected
        h.first = h.playbook("site.yml")
        assert h.first.returncode == 0, "the first lab run failed:\n" + tail(h.first)
        assert h.controller_active()
        h.after_first = h.foreign_bytes()
        yield h
