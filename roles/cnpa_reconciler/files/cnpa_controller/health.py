"""Liveness, readiness and systemd's watchdog for the long-running controller.

/healthz (liveness): the process runs and none of its loops is stuck. Each worker touches its
heartbeat every time round its loop (at least once a second while the queue is empty) and the
main loop touches its own every tick, so a heartbeat older than the wedge bound means that
thread is stuck: in one reconcile (a request that outlived its timeout, a file that never opens,
a lock never released). The bound follows from the request timeout: a reconcile sends a write
per plan step that has something to do, an Event where it finds a problem (the archive step a
read as well), each bounded by the request timeout; wedge_bound() allows two requests per step,
plus WEDGE_MARGIN for the archive's fsyncs, more than a healthy worker takes.

/readyz (readiness): live, every cache has synced (the workers run), and, with leader election,
the elector's loop went round recently: a leader, or a follower able to take over.

The systemd watchdog (WatchdogSec=) is fed from the main loop with WATCHDOG=1 only while /healthz
would answer 200: a wedged controller stops feeding it and systemd kills and restarts it.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Callable

# Seconds added to the wedge bound for what no request timeout bounds (the archive's fsyncs).
WEDGE_MARGIN = 5.0


def wedge_bound(request_timeout: float, steps: int) -> float:
    """Seconds after which a worker still busy with one TeamSpace counts as wedged."""
    return 2 * steps * request_timeout + WEDGE_MARGIN


class Heartbeats:
    """The last time each loop went round, by the loop's name."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._beats: dict[str, float] = {}

    def beat(self, who: str) -> None:
        with self._lock:
            self._beats[who] = self._clock()

    def forget(self, who: str) -> None:
        with self._lock:
            self._beats.pop(who, None)

    def stale(self, bound: float) -> list[tuple[str, float]]:
        """(name, seconds since its last beat) of every loop silent for longer than bound."""
        now = self._clock()
        with self._lock:
            beats = list(self._beats.items())
        return sorted((who, now - at) for who, at in beats if now - at > bound)


def watchdog_seconds(env: dict | None = None) -> float:
    """systemd's watchdog period for this process (WatchdogSec=), 0 when there is none."""
    env = os.environ if env is None else env
    usec = env.get("WATCHDOG_USEC", "")
    pid = env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or (pid and pid != str(os.getpid())):
        return 0.0
    return int(usec) / 1e6


def notify(message: str, env: dict | None = None) -> bool:
    """sd_notify(3) without libsystemd: one datagram to $NOTIFY_SOCKET. False when there is no
    such socket (not started by systemd with Type=notify or a watchdog) or sending failed."""
    env = os.environ if env is None else env
    address = env.get("NOTIFY_SOCKET", "")
    if not address or address[0] not in "/@":
        return False
    if address[0] == "@":
        address = "\0" + address[1:]   # an abstract socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError:
        return False
    return True


def tick_seconds(watchdog: float) -> float:
    """The main loop's period: a second, or often enough that a delayed tick or a lost datagram
    still keeps the watchdog fed (systemd's advice: half the period; a quarter here)."""
    return min(1.0, watchdog / 4) if watchdog > 0 else 1.0
