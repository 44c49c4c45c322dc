"""Waiting for a long subprocess without going silent.

A newcomer's first `python3 dev.py lab` spends minutes in `go mod download`, `go build` and
debootstrap; a terminal that prints nothing for that long looks hung and gets interrupted. So
every wait for a child process says, at least every `every` seconds, how long it has been running
and (when the caller can tell) how far it got.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

# The longest silence while a child runs. The promise to users is "a line at least every minute";
# half of that leaves room for a slow detail() and a loaded machine.
EVERY = 30.0


def elapsed_text(seconds: float) -> str:
    """'42s', '3m07s', '1h02m03s': short enough for a progress line, exact to the second."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s"


def wait(proc: subprocess.Popen, *, step: str, say: Callable[[str], None],
         detail: Callable[[], str] | None = None, every: float = EVERY,
         timeout: float | None = None,
         clock: Callable[[], float] = time.monotonic) -> tuple[str | bytes | None, str | bytes | None]:
    """Wait for proc and return what communicate() returns (its stdout and stderr when piped).

    While it runs, call say("<step>: <elapsed> running[: <detail()>]") every `every` seconds.
    detail() may fail (a log file not written yet): the line is said without it. Past `timeout`
    seconds the process is killed and subprocess.TimeoutExpired raised; its output is drained
    first, so the kill cannot leave it blocked on a full pipe."""
    t0 = clock()
    while True:
        wait_for = every
        if timeout is not None:
            wait_for = max(0.0, min(every, timeout - (clock() - t0)))
        try:
            return proc.communicate(timeout=wait_for)
        except subprocess.TimeoutExpired:
            pass
        elapsed = clock() - t0
        if timeout is not None and elapsed >= timeout:
            proc.kill()
            proc.communicate()
            raise subprocess.TimeoutExpired(proc.args, timeout)
        line = f"{step}: {elapsed_text(elapsed)} running"
        if detail is not None:
            try:
                line += f": {detail()}"
            except Exception:
                pass  # a progress detail must never break the wait it decorates
        say(line)
