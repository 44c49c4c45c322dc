"""systemd's watchdog restarts a frozen watch controller (cnpa_controller_mode=watch).

The host's unit is switched to the long-running controller with a short WatchdogSec, and back to
the loop the other fault tests expect when any of them runs after this one in the session (in
file order none does: the session's host is destroyed instead, and a reused host gets the loop
again from the session's install, tests/faults/conftest.py). SIGSTOP freezes the whole process,
its main loop too: no WATCHDOG=1 reaches systemd, which kills the service and starts it again.
"""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request

from hostlib import wait_for

WATCHDOG_SEC = 5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status(port: int, path: str) -> int:
    """The test host shares this machine's network namespace: its loopback is ours."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


def fault_tests_follow(request) -> bool:
    """Whether a test of this directory (the loop controller's) runs after this one."""
    items = request.session.items
    later = items[items.index(request.node) + 1:]
    return any(item.path.parent == request.node.path.parent for item in later)


def test_a_frozen_watch_controller_is_killed_by_the_watchdog_and_restarted(lab, report, request):
    port = free_port()
    lab.playbook("-e", "cnpa_controller_mode=watch", "-e", f"cnpa_controller_watchdog_sec={WATCHDOG_SEC}",
                 "-e", f"cnpa_controller_metrics_address=127.0.0.1:{port}")
    pid = 0
    try:
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
    finally:
        if pid:
            lab.sh(f"kill -CONT {pid}", check=False)
        lab.delete("teamspace", "met-watchdog")
        if fault_tests_follow(request):
            lab.playbook()   # the loop controller again, for the other fault tests
