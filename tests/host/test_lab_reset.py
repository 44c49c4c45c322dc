"""A lab run touches only its own objects (issue 12): site.yml on a real throwaway host.

On the Debian 12 lab VM (conftest.py's `lab_vm`, labvm.py), shared with test_debian12_client.py:
foreign archive records were put in place there and the whole lab ran once. The tests run in
order, each on the state the one before left (four site.yml runs here, three of them stop at
step 1):

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
.cache/test-logs/labvm-<n>.log.
"""

from __future__ import annotations

import json

import pytest
from labvm import ARCHIVE, BASE, FOREIGN, TS, tail


@pytest.fixture(scope="module")
def lab(lab_vm):
    # The first run found nothing of the lab's to reset: it needed no consent (lab_vm ran it
    # without cnpa_lab_reset and checked that it passed).
    return lab_vm


def test_rerun_without_consent_changes_nothing_and_lists_what_it_would_remove(lab):
    before = lab.snapshot()
    alpha_uid = lab.obj(TS, "alpha")["metadata"]["uid"]
    ns_uid = lab.obj("namespace", "team-alpha")["metadata"]["uid"]
    beta_uid = json.loads(lab.sh(f"cat {BASE}/cleanup.json").stdout)["uid"]

    proc = lab.playbook("site.yml")

    out = proc.stdout
    assert proc.returncode != 0, "a re-run without cnpa_lab_reset went ahead:\n" + tail(proc)
    assert "cnpa_lab_reset=true" in out and "Nothing was changed" in out, tail(proc)
    # Exactly the lab's objects are listed ...
    for item in (f"TeamSpace alpha uid {alpha_uid}", "namespace team-alpha",
                 *(f"{BASE}/{f}" for f in ("before.json", "generation.json", "reconcile.json", "drift.json",
                                           "cleanup.json", "catchup.json", "report.json")),
                 f"{ARCHIVE}/beta.json"):
        assert item in out, f"{item!r} is not in the message:\n{tail(proc)}"
    # ... and nothing that is not: the foreign records, namespaces and TeamSpaces of others.
    for name in FOREIGN:
        assert name not in out, f"foreign {name} is listed for removal:\n{tail(proc)}"
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
    assert refused.returncode != 0, "a switch without consent went ahead:\n" + tail(refused)
    assert "cnpa_controller_mode_switch=true" in refused.stdout, tail(refused)
    assert lab.obj(TS, "alpha")["metadata"]["uid"] == old_alpha
    assert "reconcile.sh" in lab.sh("systemctl show -p ExecStart --value cnpa-op").stdout

    proc = lab.playbook("site.yml", "-e", "cnpa_lab_reset=true", "-e", "cnpa_controller_mode=watch",
                        "-e", "cnpa_controller_mode_switch=true")

    assert proc.returncode == 0, "the re-run with cnpa_lab_reset=true failed:\n" + tail(proc)
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
    assert verify.returncode == 0, "verify failed after the re-run:\n" + tail(verify)
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
    assert proc.returncode != 0, "verify passed with a wrong generation.json:\n" + tail(proc)
    for section in ("===== journalctl -u cnpa-op", "===== kubectl get teamspaces -o yaml",
                    "===== kubectl get events -A", f"===== {BASE}/generation.json",
                    "===== tail -n 100 /var/log/kubernetes/audit.log"):
        assert section in out, f"no diagnostics section {section!r}:\n" + tail(proc)
    assert "Check generation.json (step 2)" in out.split("===== tail -n 100")[-1], tail(proc)
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
    assert proc.returncode != 0, "the run went ahead beside a foreign team-beta:\n" + tail(proc)
    assert "Namespace team-beta" in out and "is not the lab's" in out, tail(proc)
    assert "not controlled by a TeamSpace beta" in out, tail(proc)
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
