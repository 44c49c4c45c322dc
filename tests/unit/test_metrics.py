"""cnpa_controller.metrics: the text exposition format 0.0.4, the HTTP endpoint, the textfile."""

from __future__ import annotations

import os
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from cnpa_controller import metrics as metrics_mod
from cnpa_controller.metrics import Metrics

DOCUMENTED = ("cnpa_passes_total", "cnpa_reconciles_total", "cnpa_writes_total", "cnpa_errors_total",
              "cnpa_queue_depth", "cnpa_queue_timers", "cnpa_last_successful_sync_timestamp_seconds",
              "cnpa_leader")


def parse(text: str) -> dict:
    """A strict reader of the format: {(name, frozenset(labels)): value}, with HELP/TYPE checks."""
    samples, types = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            assert name not in types, f"second TYPE line for {name}"
            types[name] = kind
            continue
        if line.startswith("# HELP "):
            continue
        assert line and not line.startswith("#"), line
        head, value = line.rsplit(" ", 1)
        if "{" in head:
            name, rest = head.split("{", 1)
            assert rest.endswith("}")
            labels, i, body = {}, 0, rest[:-1]
            while i < len(body):
                eq = body.index("=", i)
                key = body[i:eq]
                assert body[eq + 1] == '"'
                j, val = eq + 2, []
                while body[j] != '"':
                    if body[j] == "\\":
                        val.append({"\\": "\\", '"': '"', "n": "\n"}[body[j + 1]])
                        j += 2
                    else:
                        val.append(body[j])
                        j += 1
                labels[key] = "".join(val)
                i = j + 1
                if i < len(body):
                    assert body[i] == ","
                    i += 1
        else:
            name, labels = head, {}
        assert name in types, f"sample {name} before its TYPE line"
        samples[(name, frozenset(labels.items()))] = float(value)
    return samples


def test_documented_metrics_render_with_help_type_and_zero():
    text = Metrics().render()
    for name in DOCUMENTED:
        assert f"# HELP {name} " in text
        kind = "counter" if name.endswith("_total") else "gauge"
        assert f"# TYPE {name} {kind}\n" in text
        assert name in metrics_mod.__doc__
    samples = parse(text)
    assert samples[("cnpa_leader", frozenset())] == 0
    assert samples[("cnpa_passes_total", frozenset())] == 0
    # labelled metrics have no sample until one is counted: no invented label values
    assert not [k for k in samples if k[0] == "cnpa_writes_total"]


def test_counters_and_gauges_with_labels():
    m = Metrics()
    m.inc("cnpa_writes_total", {"step": "quota", "op": "replace"})
    m.inc("cnpa_writes_total", {"op": "replace", "step": "quota"}, by=2)   # label order is irrelevant
    m.inc("cnpa_writes_total", {"step": "namespace", "op": "create"})
    m.inc("cnpa_passes_total")
    m.set("cnpa_queue_depth", 17)
    m.set("cnpa_queue_depth", 5)
    m.set("cnpa_last_successful_sync_timestamp_seconds", 1764858000.25)
    m.set("cnpa_leader", 1)
    samples = parse(m.render())
    assert samples[("cnpa_writes_total", frozenset({"step": "quota", "op": "replace"}.items()))] == 3
    assert samples[("cnpa_writes_total", frozenset({"step": "namespace", "op": "create"}.items()))] == 1
    assert samples[("cnpa_passes_total", frozenset())] == 1
    assert samples[("cnpa_queue_depth", frozenset())] == 5
    assert samples[("cnpa_last_successful_sync_timestamp_seconds", frozenset())] == 1764858000.25
    assert samples[("cnpa_leader", frozenset())] == 1
    assert "cnpa_queue_depth 5\n" in m.render()


def test_label_values_are_escaped():
    m = Metrics()
    nasty = 'say "no"\\then\nnewline'
    m.inc("cnpa_errors_total", {"reason": nasty})
    text = m.render()
    assert 'cnpa_errors_total{reason="say \\"no\\"\\\\then\\nnewline"} 1\n' in text
    assert parse(text)[("cnpa_errors_total", frozenset({"reason": nasty}.items()))] == 1
    assert len(text.splitlines()) == len(Metrics().render().splitlines()) + 1


def test_help_is_escaped_and_special_values():
    m = Metrics(known={"x_seconds": ("gauge", "a\\b\nc", ())})
    m.set("y", float("inf"))
    m.set("z", float("nan"))
    m.set("w", -0.5)
    text = m.render()
    assert "# HELP x_seconds a\\\\b\\nc\n" in text
    assert "y +Inf\n" in text and "z NaN\n" in text and "w -0.5\n" in text


def test_misuse_is_refused():
    m = Metrics()
    with pytest.raises(ValueError):
        m.inc("cnpa_queue_depth")          # a gauge
    with pytest.raises(ValueError):
        m.set("cnpa_passes_total", 3)      # a counter
    with pytest.raises(ValueError):
        m.inc("cnpa_passes_total", by=-1)  # counters never go down
    with pytest.raises(ValueError):
        m.inc("bad-name")
    with pytest.raises(ValueError):
        m.inc("cnpa_errors_total", {"bad-label": "x"})


def test_concurrent_increments_are_not_lost():
    m = Metrics()

    def work():
        for _ in range(20000):
            m.inc("cnpa_reconciles_total")

    # Switch threads as often as possible so that an unlocked read-add-write loses updates.
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        sys.setswitchinterval(old)
    assert m.get("cnpa_reconciles_total") == 80000


def test_http_endpoint_serves_metrics_only():
    m = Metrics()
    m.set("cnpa_leader", 1)
    server = m.serve("127.0.0.1", 0)
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
            body = resp.read().decode()
        assert "cnpa_leader 1\n" in body
        m.set("cnpa_leader", 0)   # each scrape renders the current values
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            assert "cnpa_leader 0\n" in resp.read().decode()
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10)
        assert err.value.code == 404
    finally:
        server.shutdown()
        server.server_close()


def test_textfile_is_written_atomically(tmp_path: Path, monkeypatch):
    target = tmp_path / "cnpa_op.prom"
    m = Metrics()
    m.inc("cnpa_passes_total", by=4)
    m.write_textfile(target)
    assert target.read_text() == m.render()
    assert oct(target.stat().st_mode & 0o777) == "0o644"

    # The file is replaced by rename, never rewritten in place: a reader holding the old file
    # keeps a whole old version, and the collector never sees a partial one.
    old_inode = target.stat().st_ino
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(metrics_mod.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    m.inc("cnpa_passes_total")
    m.write_textfile(str(target))
    assert target.stat().st_ino != old_inode
    assert "cnpa_passes_total 5\n" in target.read_text()
    assert len(synced) == 2   # the data, then the directory entry
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnpa_op.prom"]   # no temporary left


def test_textfile_failure_leaves_old_file_and_no_temporary(tmp_path: Path, monkeypatch):
    target = tmp_path / "cnpa_op.prom"
    m = Metrics()
    m.write_textfile(target)
    before = target.read_text()

    def broken_replace(src, dst):
        raise OSError("disk trouble")

    monkeypatch.setattr(metrics_mod.os, "replace", broken_replace)
    m.inc("cnpa_passes_total")
    with pytest.raises(OSError):
        m.write_textfile(target)
    assert target.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnpa_op.prom"]
