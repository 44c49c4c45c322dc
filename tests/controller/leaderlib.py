"""Candidates for tests/controller/test_leader.py: processes on this machine, each running one
cnpa_controller.leader.Elector against a test host's API server and recording what it believes.

Run as a script, this module IS one candidate:
    python leaderlib.py KUBECONFIG NAMESPACE LEASE IDENTITY OUT [LEASE,RENEW,RETRY]
It samples elector.is_leader() every SAMPLE seconds and appends one JSON line per sample to OUT,
{"t": ..., "leader": bool}, plus {"t": ..., "change": bool} for each on_change call. Every "t" is
CLOCK_MONOTONIC, which all processes of the machine share, so the samples of several candidates
are on one time line. SIGTERM is a clean shutdown: stop, release(), {"released": true}, exit 0.

CNPA_LEASE_PYTHON names the interpreter of the candidates (default: the test's own), to run them
with another Python. Imported, it gives the test the Candidate handle
and the checks on those records.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LEASE_SECONDS, RENEW_SECONDS, RETRY_SECONDS = 4, 3, 0.5
SAMPLE = 0.05
# Another interpreter for the candidates (the package runs on Python 3.9 and later).
PYTHON = os.environ.get("CNPA_LEASE_PYTHON") or sys.executable


# -- the candidate process ------------------------------------------------------------------------

def main(argv: list[str]) -> int:
    import logging

    from cnpa_controller.api import connect
    from cnpa_controller.leader import Elector

    kubeconfig, namespace, lease, identity, out_path = argv[:5]
    lease_s, renew_s, retry_s = (map(float, argv[5].split(",")) if len(argv) > 5
                                 else (LEASE_SECONDS, RENEW_SECONDS, RETRY_SECONDS))
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(threadName)s %(message)s")
    with open(out_path, "a", buffering=1, encoding="utf-8") as out:
        lock = threading.Lock()

        def record(**fields) -> None:
            with lock:
                out.write(json.dumps({"t": time.monotonic(), **fields}) + "\n")

        api = connect(kubeconfig)
        elector = Elector(api, namespace, lease, identity, lease_seconds=lease_s,
                          renew_seconds=renew_s, retry_seconds=retry_s,
                          on_change=lambda leading: record(change=leading))
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        thread = threading.Thread(target=elector.run, args=(stop,), name="elector", daemon=True)
        thread.start()
        record(started=True, pid=os.getpid())
        while not stop.is_set():
            t = time.monotonic()
            record(t=t, leader=elector.is_leader())
            stop.wait(SAMPLE)
        thread.join(30)
        elector.release()
        record(released=True)
        return 0


# -- the test's side ------------------------------------------------------------------------------

class Candidate:
    """One candidate process started by the test (and only ever signalled by its PID)."""

    def __init__(self, kubeconfig: Path, namespace: str, lease: str, identity: str, workdir: Path,
                 timings: tuple[float, float, float] | None = None):
        self.identity = identity
        self.out = workdir / f"{identity}.jsonl"
        self.err = workdir / f"{identity}.log"
        extra = [",".join(f"{t:g}" for t in timings)] if timings else []
        with open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                [PYTHON, __file__, str(kubeconfig), namespace, lease, identity, str(self.out),
                 *extra],
                stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True)

    def lines(self) -> list[dict]:
        if not self.out.exists():
            return []
        text = self.out.read_text()
        # the last line may be half written while we read
        return [json.loads(line) for line in text.splitlines() if line.endswith("}")]

    def samples(self) -> list[tuple[float, bool]]:
        return [(x["t"], x["leader"]) for x in self.lines() if "leader" in x]

    def leading_now(self) -> bool:
        """Its last sample says leader, and is recent: a killed or frozen process samples no more.
        (Recent: well under lease_seconds, with room for a busy machine's scheduling delays.)"""
        samples = self.samples()
        return (bool(samples) and samples[-1][1] and self.proc.poll() is None
                and time.monotonic() - samples[-1][0] < 2.5)

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        """Best-effort end of the process (resumed first, in case a test froze it)."""
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def log(self) -> str:
        return self.err.read_text() if self.err.exists() else ""


def leading_intervals(samples: list[tuple[float, bool]]) -> list[tuple[float, float]]:
    """[first, last] sample time of each run of consecutive samples reporting leader."""
    intervals, start, last = [], None, None
    for t, leading in samples:
        if leading:
            if start is None:
                start = t
            last = t
        elif start is not None:
            intervals.append((start, last))
            start = None
    if start is not None:
        intervals.append((start, last))
    return intervals


def overlaps(candidates: list[Candidate]) -> list[str]:
    """Every pair of moments at which two candidates both reported leading (empty: never)."""
    found = []
    spans = [(c.identity, span) for c in candidates for span in leading_intervals(c.samples())]
    for i, (a, (a0, a1)) in enumerate(spans):
        for b, (b0, b1) in spans[i + 1:]:
            if a != b and a0 <= b1 and b0 <= a1:
                found.append(f"{a} led {a0:.3f}..{a1:.3f} and {b} led {b0:.3f}..{b1:.3f}")
    return found


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
