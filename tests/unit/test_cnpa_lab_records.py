"""cnpa_lab_records: which archive records are the lab's (by name and uid), on real files."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "cnpa_lab_records", ROOT / "roles/cnpa_lab/library/cnpa_lab_records.py")
records = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(records)

EVIDENCE = [{"file": "before.json", "teamspace": "alpha", "key": "uid"},
            {"file": "cleanup.json", "teamspace": "beta", "key": "uid"}]


def _write(path: Path, data) -> None:
    path.write_text(data if isinstance(data, str) else json.dumps(data))


def test_only_records_with_the_labs_name_and_uid_are_the_labs(tmp_path):
    base, archive = tmp_path, tmp_path / "archive"
    archive.mkdir()
    _write(base / "before.json", {"uid": "A1", "namespace_exists": False})
    _write(base / "cleanup.json", {"uid": "B1"})
    lab = {
        "alpha.json": {"name": "alpha", "uid": "A2", "pods": 4},     # the live alpha's
        "alpha.A1.json": {"name": "alpha", "uid": "A1", "pods": 4},  # the earlier lab alpha's
        "beta.json": {"name": "beta", "uid": "B1", "pods": 2},
    }
    foreign = {
        "zeta.json": {"name": "zeta", "uid": "Z", "pods": 1},
        "alpha.X.json": {"name": "alpha", "uid": "X", "pods": 1},    # another alpha
        "beta.B1.json": {"name": "beta", "uid": "B9", "pods": 1},    # file name and uid disagree
        "alpha.B1.json": {"name": "beta", "uid": "B1", "pods": 1},   # another name inside
        "beta.Y.json": "not json",
        "betamax.json": {"name": "betamax", "uid": "B1"},
        "alpha.A3.json": ["alpha", "A2"],
    }
    for name, data in {**lab, **foreign}.items():
        _write(archive / name, data)
    (archive / "beta.L.json").symlink_to(archive / "beta.json")

    uids = records.lab_uids(str(base), ["alpha", "beta"], EVIDENCE, {"alpha": "A2"})
    ours, others = records.classify(str(archive), uids)

    assert uids == {"alpha": ["A1", "A2"], "beta": ["B1"]}
    assert sorted(Path(r["path"]).name for r in ours) == sorted(lab)
    assert sorted(Path(p).name for p in others) == sorted(
        {"alpha.X.json", "beta.B1.json", "alpha.B1.json", "beta.Y.json", "alpha.A3.json", "beta.L.json"})


def test_without_evidence_or_live_uids_nothing_is_the_labs(tmp_path):
    archive = tmp_path / "archive"
    archive.mkdir()
    _write(archive / "alpha.json", {"name": "alpha", "uid": "A1"})
    _write(tmp_path / "before.json", "{broken")
    uids = records.lab_uids(str(tmp_path), ["alpha", "beta"], EVIDENCE, {})
    assert uids == {"alpha": [], "beta": []}
    assert records.classify(str(archive), uids) == ([], [str(archive / "alpha.json")])
    assert records.classify(str(tmp_path / "missing"), uids) == ([], [])


def test_names_outside_teamspaces_are_never_looked_at(tmp_path):
    archive = tmp_path / "archive"
    archive.mkdir()
    _write(archive / "zeta.json", {"name": "zeta", "uid": "Z"})
    uids = records.lab_uids(str(tmp_path), ["beta"], [], {"zeta": "Z", "beta": ["B1", ""]})
    assert uids == {"beta": ["B1"]}
    assert records.classify(str(archive), uids) == ([], [])
