"""Run `python3 -m cnpa_controller` on the control node against a test host's API server.

The test host shares the machine's network namespace, so the server address in its admin
kubeconfig (https://127.0.0.1:PORT) is reachable from here. (A module of its own, not conftest:
test modules must not import conftest; tests/controller/test_leader.py may use it too.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hostlib import Host, wait_for

ROOT = Path(__file__).resolve().parents[2]
CRD_TEMPLATE = ROOT / "roles/cnpa_crd/templates/crd.yaml.j2"


def install_crd(host: Host) -> None:
    """The role's CRD as the role renders it (its only template expression is the
    ansible_managed comment on the first line), applied with the host's admin kubeconfig."""
    text = CRD_TEMPLATE.read_text()
    body = "\n".join(line for line in text.splitlines() if "{{" not in line) + "\n"
    assert "{{" not in body and "{%" not in body, "the CRD template gained Jinja: render it"
    host.kubectl("apply", "-f", "-", input_text=body)
    host.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                 "crd/teamspaces.platform.labhub.io")


class ControllerProcess:
    """One controller process; its stdout (writes) and stderr (problems, news) go to files."""

    def __init__(self, host: Host, workdir: Path, **env: str) -> None:
        self.host = host
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.archive = workdir / "archive"
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "KUBECONFIG": str(host.inst.kubeconfig),
            "CNPA_ARCHIVE_DIR": str(self.archive),
            "CNPA_LEADER_ELECTION": "0",
            # An hour: what these tests see comes from the watches, not from a resync.
            "CNPA_RESYNC_SECONDS": "3600",
            "CNPA_RETRY_MAX_SECONDS": "2",
            **env,
        }
        self.proc: subprocess.Popen | None = None
        self.out_path = workdir / "stdout.log"
        self.err_path = workdir / "stderr.log"

    def start(self, wait_synced: bool = True) -> ControllerProcess:
        with open(self.out_path, "ab") as out, open(self.err_path, "ab") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "cnpa_controller"], cwd=ROOT,
                                         env=self.env, stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL)
        if wait_synced:
            wait_for(lambda: "caches synced" in self.err() or self.proc.poll() is not None,
                     timeout=60, what="the controller's caches to sync")
            assert self.proc.poll() is None, f"the controller exited:\n{self.err()}"
        return self

    def once(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """One pass (`--once`, or `--plan`), run to its end with this process's settings."""
        return subprocess.run([sys.executable, "-m", "cnpa_controller", *(args or ("--once",))],
                              cwd=ROOT, env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def reconcile(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """One pass through reconcile.sh (its lock and deadline around `--once`), as the lab runs
        it, from this checkout (the package beside the script)."""
        env = {**self.env, "CNPA_PYTHON": sys.executable,
               "CNPA_LOCK_FILE": str(self.workdir / "pass.lock")}
        return subprocess.run([str(ROOT / "reconcile.sh"), *args], cwd=self.workdir, env=env,
                              capture_output=True, text=True, timeout=timeout, check=False)

    def out(self) -> str:
        return self.out_path.read_text() if self.out_path.exists() else ""

    def err(self) -> str:
        return self.err_path.read_text() if self.err_path.exists() else ""

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self, timeout: float = 60) -> int | None:
        """SIGTERM, then wait (bounded); SIGKILL only if it did not stop."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"the controller ignored SIGTERM for {timeout} s") from None


def get_or_none(host: Host, *args: str) -> dict | None:
    proc = host.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def ready(host: Host, name: str) -> dict | None:
    """The TeamSpace once its Ready condition is True for its current generation."""
    t = get_or_none(host, "teamspace", name)
    if t is None:
        return None
    status = t.get("status") or {}
    cond = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
    if cond.get("status") == "True" and status.get("observedGeneration") == t["metadata"]["generation"]:
        return t
    return None


def wait_ready(host: Host, name: str, timeout: float = 90) -> dict:
    return wait_for(lambda: ready(host, name), timeout=timeout, what=f"TeamSpace {name} Ready")


def quota_hard(host: Host, name: str) -> dict | None:
    q = get_or_none(host, "resourcequota", "team-quota", "-n", f"team-{name}")
    return None if q is None else q["spec"].get("hard")


def events(host: Host, name: str, reason: str) -> list:
    doc = host.get("events", "-n", "default",
                   "--field-selector", f"involvedObject.name={name},reason={reason}")
    return doc.get("items") or []


def restart_apiserver(host: Host) -> None:
    host.sh("systemctl restart kube-apiserver", timeout=180)
    deadline = time.monotonic() + 120
    while host.kubectl("get", "--raw", "/readyz", check=False).returncode != 0:
        assert time.monotonic() < deadline, "kube-apiserver not ready 120 s after its restart"
        time.sleep(0.5)
