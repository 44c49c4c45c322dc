"""The controller mode is the cluster's (roles/cnpa_controller/tasks/mode_decide.yml), run by
ansible-playbook on made-up records: which mode a play installs, which hosts the record names
afterwards, and every refusal, with the hosts of a --limit run as the play's hosts. No cluster:
the decision takes what mode.yml read (the record ConfigMap, or the units of an install older
than the record: the role's own template, rendered in each mode) as its input, and makes no
request. The two rendered units also show that both modes are given the same Lease."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "cnpa_controller"
LABELS = {"app.kubernetes.io/managed-by": "cnpa-op"}
HOSTS = ("h1", "h2", "h3")
LEASE = {"CNPA_LEASE_NAMESPACE": "cnpa-system", "CNPA_LEASE_NAME": "cnpa-op", "CNPA_LEASE_SECONDS": "10",
         "CNPA_RENEW_SECONDS": "7", "CNPA_LEASE_RETRY_SECONDS": "2"}


def record(mode: str, hosts: str, labels: dict | None = None) -> dict:
    """What mode.yml's k8s_info registers when the record is there."""
    return {"resources": [{"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": "cnpa-op-mode", "namespace": "cnpa-system",
                                        "labels": LABELS if labels is None else labels},
                           "data": {"mode": mode, "hosts": hosts}}]}


NO_RECORD = {"resources": []}


def units(**by_host: str | None) -> dict:
    """What mode.yml's slurp loop registers: per host the unit the role renders in that mode
    (filled in by the fixture), None for no unit."""
    return {"results": [{"item": h, "unit": mode} if mode else
                        {"item": h, "failed": True, "msg": "file not found"}
                        for h, mode in by_host.items()]}


# name: (play hosts, record read, units read, mode asked per host, extra variables)
SCENARIOS = {
    "first install on one host": (["h1"], NO_RECORD, units(h1=None), {}, {}),
    "first install on three hosts": (list(HOSTS), NO_RECORD, units(h1=None, h2=None, h3=None), {}, {}),
    "first install asked for loop": (["h1"], NO_RECORD, units(h1=None), {"h1": "loop"}, {}),
    "--limit to one host of a watch install": (["h1"], record("watch", "h1 h2 h3"), {}, {}, {}),
    "--limit to a new host": (["h3"], record("watch", "h1 h2"), {}, {}, {}),
    "--limit to a new host of a loop install": (["h2"], record("loop", "h1"), {}, {}, {}),
    "switch without consent": (["h1"], record("loop", "h1"), {}, {"h1": "watch"}, {}),
    "switch with consent": (["h1"], record("loop", "h1"), {}, {"h1": "watch"},
                            {"cnpa_controller_mode_switch": True}),
    "--limit switch without consent": (["h1"], record("watch", "h1 h2 h3"), {}, {"h1": "loop"}, {}),
    "--limit switch with consent": (["h1"], record("watch", "h1 h2 h3"), {}, {"h1": "loop"},
                                    {"cnpa_controller_mode_switch": True}),
    "switch to loop on three hosts": (list(HOSTS), record("watch", "h1 h2 h3"), {},
                                      dict.fromkeys(HOSTS, "loop"),
                                      {"cnpa_controller_mode_switch": True}),
    "switch to loop on three hosts, on purpose": (
        list(HOSTS), record("watch", "h1 h2 h3"), {}, dict.fromkeys(HOSTS, "loop"),
        {"cnpa_controller_mode_switch": True, "cnpa_controller_loop_on_several_hosts": True}),
    "the recorded mode asked for": (["h1"], record("watch", "h1 h2"), {}, {"h1": "watch"}, {}),
    "different modes asked": (["h1", "h2"], NO_RECORD, units(h1=None, h2=None),
                              {"h1": "loop", "h2": "watch"}, {}),
    "no record, --limit to a host with the watch unit": (["h1"], NO_RECORD, units(h1="watch"), {}, {}),
    "no record, the loop unit asked for watch": (["h1"], NO_RECORD, units(h1="loop"),
                                                {"h1": "watch"}, {}),
    "no record, units of both modes": (["h1", "h2"], NO_RECORD, units(h1="loop", h2="watch"),
                                       {}, {}),
    "no record, units of both modes, one chosen": (["h1", "h2"], NO_RECORD,
                                                   units(h1="loop", h2="watch"),
                                                   dict.fromkeys(("h1", "h2"), "watch"),
                                                   {"cnpa_controller_mode_switch": True}),
    "a record not labelled ours": (["h1"], record("watch", "h1", labels={}), {}, {}, {}),
    "a record without hosts": (["h1"], record("watch", " "), {}, {}, {}),
}


REPORT = {"mode": "{{ cnpa_controller_effective_mode }}", "hosts": "{{ cnpa_controller_mode_hosts }}",
          "lease": "{{ cnpa_controller_pass_lease_env }}",
          "everywhere": "{{ ansible_play_hosts_all | map('extract', hostvars) "
                        "| map(attribute='cnpa_controller_effective_mode') | unique | list }}"}


def play(name: str, hosts, read, units_read, asked, extra) -> dict:
    decide = {"name": "Run mode_decide.yml",
              "ansible.builtin.include_tasks": str(ROLE / "tasks" / "mode_decide.yml"),
              "vars": {"cnpa_controller_mode_read": read, "cnpa_controller_mode_units": units_read, **extra}}
    asking = f"{{{{ {json.dumps(asked)}[inventory_hostname] | default('') }}}}"
    return {
        "name": name, "hosts": ",".join(hosts), "gather_facts": False,
        "vars_files": [str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml")],
        "tasks": [
            {"name": "Ask for a mode", "ansible.builtin.set_fact": {"cnpa_controller_mode": asking}},
            {"name": "Decide", "block": [
                decide,
                {"name": "Report", "run_once": True, "ansible.builtin.debug": {"msg": REPORT}},
            ], "rescue": [
                # On every host: a failure run once fails each, and a host not rescued would be left
                # out of the plays that follow (only some are given the failed result).
                {"name": "Report", "ansible.builtin.debug": {"msg": {
                    "refused": "{{ ansible_failed_result.msg | default('') }}"}}},
            ]},
        ],
    }


def playbook(work: Path, plays: list) -> dict:
    """ansible-playbook on the local hosts h1-h3; its JSON report."""
    python = f"ansible_connection=local ansible_python_interpreter={sys.executable}"
    (work / "inventory.ini").write_text("".join(f"{h} {python}\n" for h in HOSTS))
    (work / "plays.yml").write_text(yaml.safe_dump(plays, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_LOCAL_TEMP=str(work / "tmp"))
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", "inventory.ini",
                           "plays.yml"], cwd=work, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, str]:
    """mode -> cnpa-op.service as the role's template renders it in that mode (defaults)."""
    work = tmp_path_factory.mktemp("units")
    playbook(work, [{
        "name": "Render the unit in each mode", "hosts": "h1", "gather_facts": False,
        "vars_files": [str(ROOT / "roles" / "cnpa" / "defaults" / "main.yml"),
                       str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml")],
        "vars": {"cnpa_python_client": {"interpreter": "/opt/cnpa-op/venv/bin/python3"},
                 "cnpa_controller_unit_kubeconfig": "/etc/cnpa-op/kubeconfig",
                 "cnpa_controller_api_local": True},
        "tasks": [{"name": "Render", "ansible.builtin.template": {
            "src": str(ROLE / "templates" / "cnpa-op.service.j2"),
            "dest": str(work / "{{ cnpa_controller_effective_mode }}.service"), "mode": "0644"},
            "vars": {"cnpa_controller_effective_mode": "{{ item }}"}, "loop": ["loop", "watch"]}]}])
    return {mode: (work / f"{mode}.service").read_text() for mode in ("loop", "watch")}


def test_both_modes_units_are_given_the_same_lease(rendered):
    for mode, text in rendered.items():
        lease = dict(line.removeprefix("Environment=").split("=", 1) for line in text.splitlines()
                     if line.startswith(("Environment=CNPA_LEASE", "Environment=CNPA_RENEW")))
        assert lease == LEASE, mode
    assert "-m cnpa_controller" in rendered["watch"] and "reconcile.sh" in rendered["loop"]


@pytest.fixture(scope="module")
def decided(tmp_path_factory, rendered) -> dict:
    """scenario name -> what its play's Report printed."""
    plays = []
    for name, (hosts, read, units_read, asked, extra) in SCENARIOS.items():
        for r in units_read.get("results", []):
            if "unit" in r:
                r["content"] = base64.b64encode(rendered[r.pop("unit")].encode()).decode()
        plays.append(play(name, hosts, read, units_read, asked, extra))
    out = {}
    for p in playbook(tmp_path_factory.mktemp("mode"), plays)["plays"]:
        reports = [t for t in p["tasks"] if t["task"]["name"] == "Report"
                   and not all(r.get("skipped") for r in t["hosts"].values())]
        assert len(reports) == 1, p["play"]["name"]
        answers = [r["msg"] for r in reports[0]["hosts"].values() if r["msg"] != {"refused": ""}]
        assert answers and all(a == answers[0] for a in answers), (p["play"]["name"], answers)
        out[p["play"]["name"]] = answers[0]
    assert set(out) == set(SCENARIOS)
    return out


def refused(decided, name: str) -> str:
    assert "refused" in decided[name], f"{name}: not refused: {decided[name]}"
    return " ".join(decided[name]["refused"].split())


def test_a_first_install_takes_watch_on_several_hosts_and_loop_on_one(decided):
    assert decided["first install on one host"]["mode"] == "loop"
    assert decided["first install on one host"]["hosts"] == ["h1"]
    assert decided["first install on three hosts"] == decided["first install on three hosts"] | {
        "mode": "watch", "hosts": list(HOSTS), "everywhere": ["watch"]}
    assert decided["first install asked for loop"]["mode"] == "loop"


def test_a_limited_run_keeps_the_recorded_mode_and_adds_its_hosts(decided):
    """The operator's case: a watch install on three hosts re-run with --limit h1 and no mode
    variable stays watch (not loop, as a play of one host would have chosen), and the record keeps
    every host; a new host joins the recorded mode, whatever its play's size."""
    assert decided["--limit to one host of a watch install"] | {"lease": None} == {
        "mode": "watch", "hosts": list(HOSTS), "everywhere": ["watch"], "lease": None}
    assert decided["--limit to a new host"]["mode"] == "watch"
    assert decided["--limit to a new host"]["hosts"] == list(HOSTS)
    assert decided["the recorded mode asked for"]["mode"] == "watch"
    assert decided["no record, --limit to a host with the watch unit"]["mode"] == "watch"


def test_a_switch_needs_consent_and_every_recorded_host(decided):
    msg = refused(decided, "switch without consent")
    assert "cnpa_controller_mode=watch would switch" in msg and "h1 runs loop" in msg, msg
    assert "-e cnpa_controller_mode_switch=true" in msg and "Nothing has been changed" in msg, msg
    assert "To keep the controller as it is, ask for -e cnpa_controller_mode=loop," in msg, msg
    assert decided["switch with consent"] | {"lease": None} == {
        "mode": "watch", "hosts": ["h1"], "everywhere": ["watch"], "lease": None}
    msg = refused(decided, "--limit switch without consent")
    assert "h1, h2, h3 run watch" in msg and "cnpa_controller_mode_switch=true" in msg, msg
    msg = refused(decided, "--limit switch with consent")
    assert "leaves out h2, h3" in msg, msg
    msg = refused(decided, "no record, the loop unit asked for watch")
    assert "h1 runs loop" in msg and "made before the mode was recorded" in msg, msg


def test_loop_on_several_hosts_counts_the_recorded_ones(decided):
    msg = refused(decided, "--limit to a new host of a loop install")
    assert "loop on 2 hosts (h1, h2" in msg and "nothing would elect one of them" in msg, msg
    assert "cnpa_controller_loop_on_several_hosts=true" in msg, msg
    assert "nothing would elect one of them" in refused(decided, "switch to loop on three hosts")
    assert decided["switch to loop on three hosts, on purpose"]["mode"] == "loop"


def test_one_kind_of_controller_per_cluster(decided):
    msg = refused(decided, "different modes asked")
    assert "differs between the hosts" in msg and "h1: loop" in msg and "h2: watch" in msg, msg
    msg = refused(decided, "no record, units of both modes")
    assert "h1 runs loop; h2 runs watch" in msg and "cnpa_controller_mode_switch=true" in msg, msg
    assert decided["no record, units of both modes, one chosen"]["mode"] == "watch"


def test_a_configmap_that_is_not_our_record_is_refused(decided):
    msg = refused(decided, "a record not labelled ours")
    assert "lacks the label app.kubernetes.io/managed-by=cnpa-op" in msg, msg
    assert "hosts (inventory names" in refused(decided, "a record without hosts")


def test_passes_by_hand_get_the_lease_of_the_unit(decided):
    lease = decided["first install on one host"]["lease"]
    assert {name: str(value) for name, value in lease.items()} == LEASE
