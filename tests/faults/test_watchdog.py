"""systemd's watchdog restarts a frozen or wedged watch controller (cnpa_controller_mode=watch).

First, the switch itself: the cluster records the loop this host runs, and a run asking for watch
without cnpa_controller_mode_switch is refused before it changes anything (also in check mode, and
for an install older than the record, known by its unit). Then the host's unit is switched once,
with that consent, for this module, to the long-running controller with a short WatchdogSec and
JSON logs, and back to the loop the other fault tests expect when any of them runs after this
module in the session (in file order none does: the session's host is destroyed instead, and a
reused host gets the loop again from the session's install, tests/faults/conftest.py). SIGSTOP
freezes the whole process, its main loop too; a worker stuck past the wedge bound makes the main
loop stop feeding: either way no WATCHDOG=1 reaches systemd, which kills the service and starts it
again.
"""

from __future__ import annotations

import json
import time

import pytest
from faultlib import ARCHIVE
from hostlib import free_port, http_get, recap, wait_for

WATCHDOG_SEC = 5
SWITCH = ("-e", "cnpa_controller_mode_switch=true")
RECORD = ("configmap", "cnpa-op-mode", "-n", "cnpa-system")


def status(port: int, path: str) -> int:
    return http_get(port, path, timeout=5)[0]


def fault_tests_follow(request) -> bool:
    """Whether a test of this directory (the loop controller's) runs after this module."""
    items = request.session.items
    last = max(i for i, item in enumerate(items) if item.path == request.path)
    return any(item.path.parent == request.path.parent for item in items[last + 1:])


def installed(lab) -> dict:
    """What a refused run must leave as it is: the unit, the ClusterRole, the mode record, the
    running controller."""
    role = lab.get("clusterrole", "cnpa-op")
    record = lab.kubectl("get", *RECORD, "-o", "json", check=False)
    return {"unit": lab.sh("cat /etc/systemd/system/cnpa-op.service").stdout,
            "clusterrole": (role["metadata"]["resourceVersion"], role["rules"]),
            "record": record.returncode == 0 and json.loads(record.stdout)["metadata"]["resourceVersion"],
            "controller": (lab.service("MainPID"), lab.service("NRestarts"))}


def test_a_switch_without_consent_is_refused_before_any_change(lab, report):
    """The loop host, asked for watch without cnpa_controller_mode_switch: the run stops before it
    changes anything, naming the variable and what runs where. In check mode too, and with the
    record gone (an install older than it), by the unit the host runs."""
    name = lab.inst.name
    # The fault tests before this one leave drift the roles ahead of cnpa_controller in the play
    # repair (an archive directory made unwritable, say): a run in the recorded mode first, so
    # that the refused run's changed=0 is about the refusal alone.
    lab.playbook()
    assert lab.get(*RECORD)["data"] == {"mode": "loop", "hosts": name}
    assert lab.service("Type") == "simple"
    before = installed(lab)
    t0 = time.monotonic()
    proc = lab.playbook("-e", "cnpa_controller_mode=watch", check=False)
    report["switch_refused_s"] = round(time.monotonic() - t0, 1)
    out = " ".join(proc.stdout.split())
    assert proc.returncode != 0, out[-3000:]
    assert f"cnpa_controller_mode=watch would switch the controller of this cluster, where {name} runs loop" \
        in out and "-e cnpa_controller_mode_switch=true" in out, out[-3000:]
    assert recap(proc.stdout, name)["changed"] == 0, out[-3000:]
    assert installed(lab) == before, "the refused run changed something"

    uid = lab.get(*RECORD)["metadata"]["uid"]
    lab.kubectl("delete", *RECORD, "--wait=true")
    try:
        proc = lab.playbook("-e", "cnpa_controller_mode=watch", "--check", check=False)
        out = " ".join(proc.stdout.split())
        assert proc.returncode != 0, out[-3000:]
        assert f"where {name} runs loop (the units installed, by an install made before the mode was " \
            "recorded)" in out, out[-3000:]
        assert installed(lab) == before | {"record": False}
    finally:
        lab.playbook()  # the loop again, recorded anew (from its unit)
    assert lab.get(*RECORD)["metadata"]["uid"] != uid
    assert lab.get(*RECORD)["data"] == {"mode": "loop", "hosts": name}
    assert installed(lab)["unit"] == before["unit"]


@pytest.fixture(scope="module")
def watch_unit(lab, request):
    """(metrics port, install time): the unit in watch mode, installed once for both tests (an
    install.yml run takes minutes on a loaded machine). It also shows the role's log variables
    reaching the unit (json: see the first test's end)."""
    port = free_port()
    started = lab.now()
    lab.playbook("-e", "cnpa_controller_mode=watch", *SWITCH,
                 "-e", f"cnpa_controller_watchdog_sec={WATCHDOG_SEC}",
                 "-e", f"cnpa_controller_metrics_address=127.0.0.1:{port}",
                 "-e", "cnpa_controller_log_format=json")
    yield port, started
    if fault_tests_follow(request):
        lab.playbook("-e", "cnpa_controller_mode=loop", *SWITCH)  # the loop again, for the other fault tests


def test_a_frozen_watch_controller_is_killed_by_the_watchdog_and_restarted(lab, report, watch_unit):
    port, started = watch_unit
    pid = 0
    try:
        # Switched with consent, and recorded so: the next run without a mode keeps it.
        assert lab.get(*RECORD)["data"] == {"mode": "watch", "hosts": lab.inst.name}
        assert lab.service("Environment").count("CNPA_LOG_FORMAT=json") == 1
        assert lab.service("Type") == "notify"
        assert lab.service("WatchdogUSec") == f"{WATCHDOG_SEC}s"
        wait_for(lambda: status(port, "/readyz") == 200, timeout=90, what="/readyz 200")
        assert status(port, "/healthz") == 200
        # Fed while healthy: running for several watchdog periods without a restart.
        restarts = int(lab.service("NRestarts"))
        pid = int(lab.service("MainPID"))
        time.sleep(3 * WATCHDOG_SEC)
        assert (int(lab.service("NRestarts")), int(lab.service("MainPID"))) == (restarts, pid)

        since = lab.now()
        lab.sh(f"kill -STOP {pid}")
        frozen = time.monotonic()
        wait_for(lambda: int(lab.service("MainPID")) not in (0, pid), timeout=60, interval=0.5,
                 what="cnpa-op started again")
        report["watchdog_restart_s"] = round(time.monotonic() - frozen, 1)
        assert int(lab.service("NRestarts")) == restarts + 1
        assert "Watchdog timeout" in lab.sh(
            f"journalctl -u cnpa-op --no-pager --since @{since}").stdout
        pid = 0
        wait_for(lambda: status(port, "/readyz") == 200, timeout=90, what="/readyz 200 again")
        lab.teamspace("met-watchdog", pods=2)
        lab.wait_converged("met-watchdog", timeout=90)

        # Only the controller's own lines (not systemd's about the unit): in json every line,
        # stderr's and stdout's one line per write alike, is a JSON object with a level (the
        # journal mixes the two streams); a write's carries its text line as msg.
        lines = lab.sh("journalctl _SYSTEMD_UNIT=cnpa-op.service --no-pager -o cat "
                       f"--since @{started}").stdout.splitlines()
        assert [line for line in lines if not line.startswith("{")] == [], lines
        logged = [json.loads(line) for line in lines]
        assert logged and all(entry["level"] and entry["msg"] for entry in logged), lines
        assert any(entry["logger"] == "cnpa_controller.write" and entry.get("teamspace") == "met-watchdog"
                   and entry["msg"].startswith("teamspace met-watchdog: ") for entry in logged), lines
    finally:
        if pid:
            lab.sh(f"kill -CONT {pid}", check=False)
        lab.delete("teamspace", "met-watchdog")


# The wedge bound follows the request timeout (cnpa_controller.health: 2 x 7 steps x timeout + 5 s):
# 2 s makes it 33 s instead of the role's 145 s. A drop-in of the test's own, removed at the end.
DROPIN = "/etc/systemd/system/cnpa-op.service.d/test-request-timeout.conf"


def test_a_wedged_worker_fails_readyz_and_the_watchdog_restarts_the_unit(lab, report, watch_unit):
    """A worker stuck in one TeamSpace past the wedge bound (the archive's read of an earlier
    record blocks in open(2) on a FIFO): /readyz turns 500, the main loop stops feeding the
    watchdog, and systemd kills and restarts the service, whose new process archives the
    deletion."""
    port = watch_unit[0]
    name, fifo = "met-wedge", f"{ARCHIVE}/met-wedge.json"
    try:
        lab.sh(f"mkdir -p {DROPIN.rsplit('/', 1)[0]} && "
               f"printf '[Service]\\nEnvironment=CNPA_REQUEST_TIMEOUT=2s\\n' > {DROPIN} && "
               "systemctl daemon-reload && systemctl restart cnpa-op")
        wait_for(lambda: status(port, "/readyz") == 200, timeout=90, what="/readyz 200")
        uid = lab.teamspace(name, pods=2)["metadata"]["uid"]
        lab.wait_converged(name, timeout=90)
        restarts, pid = int(lab.service("NRestarts")), int(lab.service("MainPID"))
        since = lab.now()

        lab.sh(f"rm -f {fifo} && mkfifo {fifo}")
        lab.delete("teamspace", name)
        wedged = time.monotonic()
        wait_for(lambda: status(port, "/readyz") == 500, timeout=90, interval=0.5,
                 what="/readyz 500 with the worker stuck")
        report["wedge_readyz_false_s"] = round(time.monotonic() - wedged, 1)
        assert int(lab.service("MainPID")) == pid   # not restarted before the bound
        wait_for(lambda: int(lab.service("MainPID")) not in (0, pid), timeout=60, interval=0.5,
                 what="cnpa-op killed by the watchdog and started again")
        report["wedge_restart_s"] = round(time.monotonic() - wedged, 1)
        # Before the new process reaches the deletion, most likely; if it opened the FIFO first,
        # the watchdog restarts it once more and the one after finds no FIFO.
        lab.sh(f"rm -f {fifo}")
        assert int(lab.service("NRestarts")) >= restarts + 1
        assert "Watchdog timeout" in lab.sh(
            f"journalctl -u cnpa-op --no-pager --since @{since}").stdout
        lab.wait_gone("teamspace", name, timeout=150)
        assert lab.archive(name) == {"name": name, "uid": uid, "pods": 2}
        wait_for(lambda: status(port, "/readyz") == 200, timeout=90, what="/readyz 200 again")
    finally:
        lab.sh(f"rm -f {fifo} {DROPIN} && systemctl daemon-reload && systemctl restart cnpa-op",
               check=False)
        lab.delete("teamspace", name)
