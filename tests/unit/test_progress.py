"""testhost.progress and testhost.common.run: a long child process is never silent.

Real child processes (python3 -c), short periods: each test takes about a second."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from testhost import common, progress
from testhost.common import HostError

PY = sys.executable


def _spawn(code: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([PY, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)


class Said(list):
    """say() that records each line with the time it was said."""

    def __call__(self, line: str) -> None:
        self.append((time.monotonic(), line))

    @property
    def lines(self) -> list[str]:
        return [line for _, line in self]


@pytest.mark.parametrize("seconds,text", [
    (0, "0s"), (59.9, "59s"), (60, "1m00s"), (187, "3m07s"), (3599, "59m59s"), (3723, "1h02m03s")])
def test_elapsed_text(seconds, text):
    assert progress.elapsed_text(seconds) == text


def test_a_long_child_gets_a_line_every_period_with_its_detail():
    said = Said()
    calls = []

    def detail() -> str:
        calls.append(1)
        return f"{len(calls)} packages"

    t0 = time.monotonic()
    proc = _spawn("import time; time.sleep(1.3); print('done')")
    out, err = progress.wait(proc, step="go build x", say=said, detail=detail, every=0.25)
    assert (out, err, proc.returncode) == ("done\n", "", 0)
    # 1.3 s at 0.25 s: five lines (a sixth may race the exit), each naming the step and detail.
    assert 4 <= len(said) <= 6, said.lines
    assert said.lines[0] == "go build x: 0s running: 1 packages"
    assert all(line.startswith("go build x: ") and line.endswith(f"{i + 1} packages")
               for i, line in enumerate(said.lines))
    # Never silent for longer than the period (plus scheduling slack).
    stamps = [t0] + [t for t, _ in said]
    assert max(b - a for a, b in zip(stamps, stamps[1:])) < 0.25 + 0.2


def test_a_quick_child_says_nothing():
    said = Said()
    out, _ = progress.wait(_spawn("print('hi')"), step="quick", say=said, every=5)
    assert out == "hi\n"
    assert said == []


def test_a_failing_detail_does_not_break_the_wait():
    said = Said()

    def detail() -> str:
        raise FileNotFoundError("log not written yet")

    proc = _spawn("import time, sys; time.sleep(0.6); sys.exit(3)")
    progress.wait(proc, step="tidy", say=said, detail=detail, every=0.2)
    assert proc.returncode == 3
    assert said.lines and all(line.startswith("tidy: ") and line.endswith("running")
                              for line in said.lines)


def test_output_larger_than_a_pipe_is_drained_while_waiting():
    # 4 MB through stdout and stderr while progress lines go out: a wait that did not read the
    # pipes would block the child forever on a full pipe (64 KB).
    code = ("import sys, time\n"
            "for _ in range(64):\n"
            "    sys.stdout.write('o' * 32768); sys.stderr.write('e' * 32768); time.sleep(0.01)\n")
    said = Said()
    out, err = progress.wait(_spawn(code), step="big", say=said, every=0.1, timeout=30)
    assert (len(out), len(err)) == (64 * 32768, 64 * 32768)


def test_timeout_kills_the_child_and_raises():
    said = Said()
    proc = _spawn("import time; time.sleep(60)")
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        progress.wait(proc, step="hang", say=said, every=0.2, timeout=0.7)
    assert time.monotonic() - t0 < 5
    assert proc.poll() is not None  # killed and reaped, not left running
    assert 2 <= len(said) <= 4, said.lines


def test_run_logs_progress_to_a_logfile_step(tmp_path, monkeypatch):
    said = Said()
    monkeypatch.setattr(common, "log", said)
    monkeypatch.setattr(common, "PROGRESS_SECONDS", 0.2)
    logfile = tmp_path / "build.log"
    common.run([PY, "-c", "import time; print('compiled a'); time.sleep(0.9); print('compiled b')"],
               step="go build demo", logfile=logfile, progress=lambda: "2 of 9 packages")
    assert logfile.read_text() == "compiled a\ncompiled b\n"
    assert len(said) >= 3, said.lines
    assert all(line.startswith("go build demo: ") and line.endswith(": 2 of 9 packages")
               for line in said.lines)


def test_run_without_logfile_is_not_silent_either_and_returns_stdout(monkeypatch):
    said = Said()
    monkeypatch.setattr(common, "log", said)
    monkeypatch.setattr(common, "PROGRESS_SECONDS", 0.2)
    out = common.run([PY, "-c", "import time; time.sleep(0.7); print('{\"Version\": \"v1\"}')"],
                     step="go mod download", quiet=True)
    assert out == '{"Version": "v1"}\n'
    assert said.lines and all(line.startswith("go mod download: ") for line in said.lines)


def test_run_turns_a_timeout_and_a_failure_into_host_errors(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "log", Said())
    monkeypatch.setattr(common, "PROGRESS_SECONDS", 0.2)
    logfile = tmp_path / "tidy.log"
    with pytest.raises(HostError, match=r"go mod tidy did not finish within .*its log: .*tidy\.log"):
        common.run([PY, "-c", "import time; time.sleep(60)"], step="go mod tidy", logfile=logfile,
                   timeout=0.5)
    with pytest.raises(HostError, match=r"(?s)go list failed \(exit 1\).*no such package"):
        common.run([PY, "-c", "import sys; sys.exit('no such package')"], step="go list")
