"""The lab on a three-host inventory (issue 13): site.yml over real SSH on the `inventory` hosts.

On three hosts of its own (mhl-1..mhl-3; the other modules share mhp-*), a fresh cluster. site.yml
(steps 1-5, then the lead moved to another host, then steps 6-8) does the cluster work and
writes the evidence once, from the first host; reconcile.sh and
cnpa-op.service go on every host, in watch mode (the default on several hosts: one leads, over
the Lease); step 4 starts and step 7 stops and starts the controller on every host; step 6 keeps
beta's archive record on the first host beside the evidence, whichever host archived it. Then:
- molecule/default/verify.yml (the graders' checks, once from the first host) passes;
- the loop controller is refused on three hosts, even with consent to switch, and the
  controllers keep running;
- a re-run without cnpa_lab_reset stops before any change and names the lab's records on each
  host that holds one.
The full ansible-playbook output of each run goes to .cache/test-logs/lab3-<n>.log.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from hostlib import ROOT, Host, wait_for
from mhlib import holder, host_names, host_of, three_hosts, unit, write_inventory

BASE = "/root/cnpa-op"
EVIDENCE = ("before.json", "generation.json", "reconcile.json", "drift.json", "cleanup.json",
            "catchup.json", "report.json", "archive/beta.json")
LOGS = ROOT / ".cache" / "test-logs"
runs = 0
step6: dict[str, Host] = {}  # the host whose controller led during step 6
# The record of an earlier beta the lab did not make, left on the first host before step 6.
FOREIGN = {"teamspace": "beta", "uid": "0f0f0f0f-0000-4000-8000-00000000beta", "spec": {"pods": 1}}


def playbook(inventory, *args: str, timeout: float = 2400) -> subprocess.CompletedProcess:
    global runs
    runs += 1
    env = dict(os.environ, PATH=f"{ROOT / '.venv/bin'}:/usr/bin:/bin", ANSIBLE_FORCE_COLOR="0",
               NO_COLOR="1", ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(inventory), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)
    LOGS.mkdir(parents=True, exist_ok=True)
    (LOGS / f"lab3-{runs}.log").write_text(proc.stdout + proc.stderr)
    return proc


def tail(proc: subprocess.CompletedProcess) -> str:
    return (proc.stdout + proc.stderr)[-6000:]


def has(host: Host, path: str) -> bool:
    return host.sh(f"test -e {path}", check=False).returncode == 0


def held_elsewhere_than(host: Host) -> str:
    """The Lease's holder when it is another host's controller, else ""."""
    ident = holder(host)
    return "" if not ident or ident.startswith(f"{host.inst.name}_") else ident


def active_everywhere(hosts: list[Host]) -> bool:
    return all(unit(h, "ActiveState") == "active" for h in hosts)


@pytest.fixture(scope="module")
def hosts():
    """Three hosts of the lab's own (mhl-1..mhl-3, CNPA_MULTIHOST_LAB_HOSTS), not the session's
    (conftest.py): the lab needs a fresh cluster, and on hosts of its own it runs beside the
    modules that share the installed controllers (a scheduling unit of its own:
    tests/conftest.py's HOST_UNITS), instead of before them."""
    if os.geteuid() != 0:
        pytest.skip("the test hosts need root")
    with three_hosts(host_names("CNPA_MULTIHOST_LAB_HOSTS", ("mhl-1", "mhl-2", "mhl-3"))) as hs:
        yield hs


@pytest.fixture(scope="module")
def inventory(hosts, tmp_path_factory):
    return write_inventory(hosts, tmp_path_factory.mktemp("multihost-lab") / "inventory.ini")


@pytest.fixture(scope="module")
def lab(hosts, inventory):
    """site.yml in two parts, steps 1-5 and then 6-8, by their tags. Between the parts the lead
    moves off the first host (its controller stopped until another host holds the Lease, then
    started again), so that step 6's beta is archived on another host than the evidence's. A
    record of another beta waits on the first host where step 6 keeps the lab's copy."""
    a = hosts[0]
    proc = playbook(inventory, "site.yml", "--tags", "step1,step2,step3,step4,step5")
    assert proc.returncode == 0, "steps 1-5 on three hosts failed:\n" + tail(proc)
    a.sh("systemctl stop cnpa-op")  # a clean stop releases the Lease
    ident = wait_for(lambda: held_elsewhere_than(a), timeout=60, interval=0.5,
                     what="another host taking the Lease")
    a.sh("systemctl start cnpa-op")
    step6["leader"] = host_of(ident, hosts)
    a.sh(f"cat > {BASE}/archive/beta.json", input_text=json.dumps(FOREIGN))
    proc = playbook(inventory, "site.yml", "--tags", "step6,step7,step8")
    assert proc.returncode == 0, "steps 6-8 on three hosts failed:\n" + tail(proc)
    return hosts


def test_the_lab_passes_with_the_evidence_on_the_first_host_and_a_controller_on_each(lab, inventory):
    a, others = lab[0], lab[1:]
    for name in EVIDENCE:
        assert has(a, f"{BASE}/{name}"), f"{name} is not on the first host"
        for h in others:
            # The evidence is written once; beta's record may be on the host that archived it.
            if not name.startswith("archive/"):
                assert not has(h, f"{BASE}/{name}"), f"{name} was written on {h.inst.name} too"
    report = json.loads(a.sh(f"cat {BASE}/report.json").stdout)
    beta = json.loads(a.sh(f"cat {BASE}/archive/beta.json").stdout)
    assert beta["uid"] == report["archived"] == json.loads(a.sh(f"cat {BASE}/cleanup.json").stdout)["uid"]
    # Archived by the leader of step 6, another host: the first host holds step 6's copy.
    by = step6["leader"]
    assert by is not a
    assert json.loads(by.sh(f"cat {BASE}/archive/beta.json").stdout) == beta, f"{by.inst.name}: another beta"
    # The earlier beta's record that was there is kept beside it, as the controllers keep one.
    kept = f"{BASE}/archive/beta.{FOREIGN['uid']}.json"
    assert json.loads(a.sh(f"cat {kept}").stdout) == FOREIGN, "the other beta's record was not kept"
    for h in lab:
        assert unit(h, "ActiveState") == "active", f"cnpa-op is not running on {h.inst.name}"
        assert "cnpa_controller" in unit(h, "ExecStart"), f"{h.inst.name} does not run the watch controller"
    leader = host_of(wait_for(lambda: holder(a), timeout=60, interval=0.5, what="a Lease holder"), lab)
    print(f"\nleader after the lab: {leader.inst.name}")
    # Step 7 stopped every host's controller: while stopped nobody caught up.
    catchup = json.loads(a.sh(f"cat {BASE}/catchup.json").stdout)
    assert catchup["observed_while_stopped"] < catchup["generation"] == catchup["observed_after_start"]

    verify = playbook(inventory, "molecule/default/verify.yml")
    assert verify.returncode == 0, "verify failed on three hosts:\n" + tail(verify)


def test_the_loop_controller_is_refused_on_three_hosts(lab, inventory):
    before = [unit(h, "ExecStart") for h in lab]
    proc = playbook(inventory, "playbooks/04_controller.yml", "-e", "cnpa_controller_mode=loop",
                    "-e", "cnpa_controller_mode_switch=true")
    assert proc.returncode != 0, "loop mode on three hosts went ahead:\n" + tail(proc)
    assert "nothing would elect one of them" in proc.stdout, tail(proc)
    assert [unit(h, "ExecStart") for h in lab] == before, "a unit was changed"
    assert active_everywhere(lab), "a controller was left stopped"


def test_a_rerun_without_consent_names_the_records_on_each_host_and_changes_nothing(lab, inventory):
    a = lab[0]
    files = a.sh(f"cd {BASE} && sha256sum {' '.join(EVIDENCE)}").stdout
    on = [h.inst.name for h in lab if has(h, f"{BASE}/archive/beta.json")]
    proc = playbook(inventory, "site.yml")
    assert proc.returncode != 0, "a re-run without cnpa_lab_reset went ahead:\n" + tail(proc)
    assert "Nothing was changed" in proc.stdout and "cnpa_lab_reset=true" in proc.stdout, tail(proc)
    for name in on:
        assert f"{name}:{BASE}/archive/beta.json" in proc.stdout, f"{name}'s record unnamed:\n{tail(proc)}"
    assert a.sh(f"cd {BASE} && sha256sum {' '.join(EVIDENCE)}").stdout == files
    assert active_everywhere(lab), "a controller was left stopped"
