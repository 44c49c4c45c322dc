"""stderr's lines carry their time (UTC) and level, as text or JSON; stdout's write lines are the
pass's text in text mode and JSON objects of the same fields in JSON mode."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cnpa_controller import logs
from cnpa_controller.logs import about
from fixtures import unreachable_kubeconfig

ROOT = Path(__file__).resolve().parents[2]
TEXT_LINE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR) cnpa-op: .*")


@pytest.fixture
def logged():
    """What logs.setup() writes, into a string; the process's logging as it was afterwards."""
    root, ours = logging.getLogger(), logging.getLogger("cnpa_controller")
    handlers, levels, fmt = list(root.handlers), (root.level, ours.level), logs._format
    stream = io.StringIO()

    def setup(fmt: str = "text", level: str = "info") -> io.StringIO:
        logs.setup(fmt, level, stream)
        return stream

    yield setup
    root.handlers[:] = handlers
    root.setLevel(levels[0])
    ours.setLevel(levels[1])
    logs._format = fmt


def test_text_lines_have_time_and_level_on_every_line(logged):
    stream = logged()
    log = logging.getLogger("cnpa_controller.executor")
    log.warning("TeamSpace a: quota x", extra=about("a"))
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("TeamSpace a: internal error, retrying:")
    lines = stream.getvalue().splitlines()
    assert lines[0].endswith(" WARNING cnpa-op: TeamSpace a: quota x")
    assert len(lines) > 3 and all(TEXT_LINE.fullmatch(line) for line in lines), lines
    assert lines[-1].endswith("cnpa-op: ValueError: boom")


def test_json_lines_are_one_object_each_with_the_teamspace(logged):
    stream = logged("json")
    log = logging.getLogger("cnpa_controller.executor")
    log.warning("TeamSpace a: quota x\nsecond line", extra=about("a"))
    logging.getLogger("cnpa_controller").info("caches synced")
    first, second = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", first.pop("time"))
    assert first == {"level": "warning", "logger": "cnpa_controller.executor",
                     "msg": "TeamSpace a: quota x\nsecond line", "teamspace": "a"}
    assert second["msg"] == "caches synced" and "teamspace" not in second


@pytest.mark.parametrize(("level", "seen"), [
    ("debug", ["d", "i", "w", "e"]), ("info", ["i", "w", "e"]), ("warning", ["w", "e"]),
    ("error", ["e"]),
])
def test_the_level_is_the_least_logged(logged, level, seen):
    stream = logged("json", level)
    log = logging.getLogger("cnpa_controller.cache")
    log.debug("d")
    log.info("i")
    log.warning("w")
    log.error("e")
    assert [json.loads(line)["msg"] for line in stream.getvalue().splitlines()] == seen


def test_a_library_s_warnings_get_the_prefix_and_its_debug_stays_out(logged):
    stream = logged("text", "debug")
    logging.getLogger("urllib3.connectionpool").debug("https://api:6443 \"GET /api HTTP/1.1\" 200")
    logging.getLogger("urllib3.connectionpool").warning("Connection pool is full")
    assert TEXT_LINE.fullmatch(stream.getvalue().strip())
    assert "Connection pool is full" in stream.getvalue()


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_pass_that_cannot_read_the_api_says_so_in_one_line(tmp_path, fmt):
    """The lab's loop runs a pass every 3 s: one line, with the words the tests and the docs
    quote, and nothing on stdout (its lines are writes)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CNPA_", "KUBECONFIG"))}
    env.update(KUBECONFIG=str(unreachable_kubeconfig(tmp_path)), CNPA_ARCHIVE_DIR=str(tmp_path / "archive"),
               CNPA_REQUEST_TIMEOUT="2s", CNPA_LOG_FORMAT=fmt)
    proc = subprocess.run([sys.executable, "-m", "cnpa_controller", "--once"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    [line] = proc.stderr.splitlines()
    wanted = ("cannot list TeamSpaces, namespaces or quotas (API server unreachable or CRD missing?); "
              "pass aborted, nothing written: ")
    if fmt == "json":
        entry = json.loads(line)
        assert entry["level"] == "error" and entry["msg"].startswith(wanted), entry
    else:
        assert TEXT_LINE.fullmatch(line) and f" ERROR cnpa-op: {wanted}" in line, line


@pytest.mark.parametrize(("env", "named"), [
    ({"CNPA_LOG_FORMAT": "xml"}, "CNPA_LOG_FORMAT"),
    ({"CNPA_LOG_LEVEL": "loud"}, "CNPA_LOG_LEVEL"),
])
def test_bad_log_settings_exit_3_named_in_a_text_line(env, named):
    full = {k: v for k, v in os.environ.items() if not k.startswith(("CNPA_", "KUBECONFIG"))}
    full.update({"KUBECONFIG": "/nonexistent/kubeconfig", **env})
    proc = subprocess.run([sys.executable, "-m", "cnpa_controller", "--once"], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    [line] = proc.stderr.splitlines()
    assert TEXT_LINE.fullmatch(line) and named in line, line


def test_write_lines_are_the_pass_s_text_or_one_json_object(logged):
    logged("text")
    assert logs.write_line("a", "quota team-quota created") == "teamspace a: quota team-quota created"
    logged("json")
    entry = json.loads(logs.write_line("a", "quota team-quota created"))
    assert entry["msg"] == "teamspace a: quota team-quota created" and entry["teamspace"] == "a"
    assert entry["level"] == "info" and entry["logger"] == "cnpa_controller.write"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", entry["time"])
