"""hostlib.merge_report: two workers' keys end up side by side in one report file."""

from __future__ import annotations

import json

from hostlib import merge_report


def test_keys_of_two_writers_are_kept_and_a_key_written_again_is_replaced(tmp_path):
    path = tmp_path / "report.json"
    merge_report(path, {"soak": 1, "install_s": {"mhp-1": 5}})
    merged = merge_report(path, {"chaos": 2, "soak": 3})
    assert merged == {"soak": 3, "install_s": {"mhp-1": 5}, "chaos": 2}
    assert json.loads(path.read_text()) == merged


def test_a_file_that_is_not_a_json_object_is_started_again(tmp_path):
    path = tmp_path / "report.json"
    path.write_text("[1, 2")
    assert merge_report(path, {"a": 1}) == {"a": 1}
