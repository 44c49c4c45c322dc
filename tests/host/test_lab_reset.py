"""A lab run touches only its own objects (issue 12): site.yml on a real throwaway host.

One host for this module (CNPA_RESET_HOST, default pytest-reset, destroyed at the end; with
CNPA_RESET_REUSE=1 a running host of that name is reused and left running). The module fixture
puts foreign archive records in place and runs the whole lab once; the tests then run in order,
each on the state the one before left (five site.yml runs in all, three of them stop at step 1):

- without cnpa_lab_reset, a run on a host where the lab ran stops before changing anything and
  lists exactly what it would remove;
- with cnpa_lab_reset=true the lab runs again, this time with the watch controller
  (cnpa_controller_mode=watch: the lab on one host with either controller, and the switch from
  one to the other, refused at step 1, before the reset, without cnpa_controller_mode_switch),
  and passes verify; the foreign records are byte for byte what they were before the first run
  (checked after both runs);
- a foreign team-beta (labelled like the lab's but not controlled by a TeamSpace, holding a
  ConfigMap) stops the run with a message naming it, and nothing is changed.

After every run the controller is active. The full ansible-playbook output of each run goes to
.cache/test-logs/lab_reset-<n>.log.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

import pytest
from hostlib import ROOT, Host, session_host

BASE = "/root/cnpa-op"
ARCHIVE = f"{BASE}/archive"
TS = "teamspaces.platform.labhub.io"
LOGS = ROOT / ".cache" / "test-logs"

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


class Lab(Host):
    """The module's host, with the lab run against it through its inventory."""

    runs = 0

    def playbook(self, playbook: str, *extra: str, timeout: float = 1800) -> subprocess.CompletedProcess:
        Lab.runs += 1
        env = dict(os.environ, ANSIBLE_FORCE_COLOR="0", NO_COLOR="1", ANSIBLE_NOCOLOR="1")
        proc = subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(self.inst.inventory),
                               playbook, *extra], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        LOGS.mkdir(parents=True, exist_ok=True)
        (LOGS / f"lab_reset-{Lab.runs}.log").write_text(proc.stdout + proc.stderr)
        return proc

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


def _tail(proc: subprocess.CompletedProcess) -> str:
    return (proc.stdout + proc.stderr)[-6000:]


@pytest.fixture(scope="module")
def lab():
    if os.geteuid() != 0:
        pytest.skip("the test host needs root")
    with session_host(os.environ.get("CNPA_RESET_HOST", "pytest-reset"), "CNPA_RESET_REUSE") as inst:
        h = Lab(inst)
        h.sh(f"mkdir -p {ARCHIVE}")
        for name, text in FOREIGN.items():
            h.sh(f"cat > {ARCHIVE}/{name}", input_text=text)
        h.expected = {n: hashlib.sha256(t.encode()).hexdigest() for n, t in FOREIGN.items()}
        assert h.foreign_bytes() == h.expected
        first = h.playbook("site.yml")
        assert first.returncode == 0, "the first lab run failed:\n" + _tail(first)
        assert h.controller_active()
        # A fresh host: nothing to reset, so no consent was needed. Checked by the test below.
        h.after_first = h.foreign_bytes()
        yield h


def test_rerun_without_consent_changes_nothing_and_lists_what_it_would_remove(lab):
    before = lab.snapshot()
    alpha_uid = lab.obj(TS, "alpha")["metadata"]["uid"]
    ns_uid = lab.obj("namespace", "team-alpha")["metadata"]["uid"]
    beta_uid = json.loads(lab.sh(f"cat {BASE}/cleanup.json").stdout)["uid"]

    proc = lab.playbook("site.yml")

    out = proc.stdout
    assert proc.returncode != 0, "a re-run without cnpa_lab_reset went ahead:\n" + _tail(proc)
    assert "cnpa_lab_reset=true" in out and "Nothing was changed" in out, _tail(proc)
    # Exactly the lab's objects are listed ...
    for item in (f"TeamSpace alpha uid {alpha_uid}", "namespace team-alpha",
                 *(f"{BASE}/{f}" for f in ("before.json", "generation.json", "reconcile.json", "drift.json",
                                           "cleanup.json", "catchup.json", "report.json")),
                 f"{ARCHIVE}/beta.json"):
        assert item in out, f"{item!r} is not in the message:\n{_tail(proc)}"
    # ... and nothing that is not: the foreign records, namespaces and TeamSpaces of others.
    for name in FOREIGN:
        assert name not in out, f"foreign {name} is listed for removal:\n{_tail(proc)}"
    assert "TeamSpace beta" not in out  # beta is gone since step 6; only its record is the lab's
    after = lab.snapshot()
    assert after == before, "a run without consent changed something"
    assert lab.controller_active()
    assert ns_uid == lab.obj("namespace", "team-alpha")["metadata"]["uid"]
    assert json.loads(lab.sh(f"cat {ARCHIVE}/beta.json").stdout)["uid"] == beta_uid


def test_rerun_with_consent_in_watch_mode_resets_only_the_lab_and_passes(lab):
    old_alpha = lab.obj(TS, "alpha")["metadata"]["uid"]
    old_beta = json.loads(lab.sh(f"cat {BASE}/cleanup.json").stdout)["uid"]

    # Without consent the switch is refused before step 1 resets anything.
    refused = lab.playbook("site.yml", "-e", "cnpa_lab_reset=true", "-e", "cnpa_controller_mode=watch")
    assert refused.returncode != 0, "a switch without consent went ahead:\n" + _tail(refused)
    assert "cnpa_controller_mode_switch=true" in refused.stdout, _tail(refused)
    assert lab.obj(TS, "alpha")["metadata"]["uid"] == old_alpha
    assert "reconcile.sh" in lab.sh("systemctl show -p ExecStart --value cnpa-op").stdout

    proc = lab.playbook("site.yml", "-e", "cnpa_lab_reset=true", "-e", "cnpa_controller_mode=watch",
                        "-e", "cnpa_controller_mode_switch=true")

    assert proc.returncode == 0, "the re-run with cnpa_lab_reset=true failed:\n" + _tail(proc)
    assert lab.controller_active()
    assert "cnpa_controller" in lab.sh("systemctl show -p ExecStart --value cnpa-op").stdout
    assert lab.after_first == lab.expected, "the first run changed foreign archive records"
    assert lab.foreign_bytes() == lab.expected, "the re-run changed foreign archive records"
    new_alpha = lab.obj(TS, "alpha")["metadata"]["uid"]
    assert new_alpha != old_alpha, "alpha was not made anew"
    # The old alpha was archived by the controller itself before its finalizer went (never a
    # bare finalizer removal); its record was then removed as the lab's, like the old beta's.
    journal = lab.sh("journalctl -u cnpa-op --no-pager -o cat").stdout
    assert f"teamspace alpha: archived to {ARCHIVE}/alpha.json" in journal, journal[-3000:]
    archive = set(lab.sh(f"ls -A {ARCHIVE}").stdout.split())
    assert archive == set(FOREIGN) | {"beta.json"}, f"archive holds {sorted(archive)}"
    assert json.loads(lab.sh(f"cat {ARCHIVE}/beta.json").stdout)["uid"] != old_beta
    verify = lab.playbook("molecule/default/verify.yml", "-e", "cnpa_controller_mode=watch")
    assert verify.returncode == 0, "verify failed after the re-run:\n" + _tail(verify)
    assert lab.controller_active()


def test_a_failed_verify_prints_the_diagnostics_and_the_check(lab):
    """verify.yml's rescue: a check that fails prints what to look at (journal, TeamSpaces,
    Events, evidence, audit log), then fails with the check's own message."""
    good = lab.sh(f"cat {BASE}/generation.json").stdout
    bad = json.loads(good)
    bad["gen_after_spec"] = bad["gen_initial"]  # as if the spec change had not moved generation
    lab.sh(f"cat > {BASE}/generation.json", input_text=json.dumps(bad))
    try:
        proc = lab.playbook("molecule/default/verify.yml")
    finally:
        lab.sh(f"cat > {BASE}/generation.json", input_text=good)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, "verify passed with a wrong generation.json:\n" + _tail(proc)
    for section in ("===== journalctl -u cnpa-op", "===== kubectl get teamspaces -o yaml",
                    "===== kubectl get events -A", f"===== {BASE}/generation.json",
                    "===== tail -n 100 /var/log/kubernetes/audit.log"):
        assert section in out, f"no diagnostics section {section!r}:\n" + _tail(proc)
    assert "Check generation.json (step 2)" in out.split("===== tail -n 100")[-1], _tail(proc)
    assert lab.controller_active()


def test_foreign_team_beta_stops_the_run_untouched(lab):
    # Labelled like the lab's namespace, but no TeamSpace controls it: somebody else's.
    lab.apply({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": "team-beta", "labels": {"platform.labhub.io/teamspace": "beta"}}})
    lab.kubectl("-n", "team-beta", "create", "configmap", "precious", "--from-literal=answer=42")
    ns = lab.obj("namespace", "team-beta")
    cm = lab.obj("configmap", "precious", "-n", "team-beta")
    before = lab.snapshot()

    proc = lab.playbook("site.yml", "-e", "cnpa_lab_reset=true")

    out = proc.stdout
    assert proc.returncode != 0, "the run went ahead beside a foreign team-beta:\n" + _tail(proc)
    assert "Namespace team-beta" in out and "is not the lab's" in out, _tail(proc)
    assert "not controlled by a TeamSpace beta" in out, _tail(proc)
    ns_after = lab.obj("namespace", "team-beta")
    cm_after = lab.obj("configmap", "precious", "-n", "team-beta")
    assert ns_after is not None and cm_after is not None, "the foreign namespace or its data is gone"
    assert (ns_after["metadata"]["uid"], ns_after["metadata"]["resourceVersion"]) == \
        (ns["metadata"]["uid"], ns["metadata"]["resourceVersion"])
    assert ns_after["metadata"].get("deletionTimestamp") is None
    assert cm_after["metadata"]["resourceVersion"] == cm["metadata"]["resourceVersion"]
    assert cm_after["data"] == {"answer": "42"}
    assert lab.snapshot() == before, "the run changed the lab's objects before stopping"
    assert lab.controller_active()
