"""cnpa_release and cnpa_archive_migrate (plugins/modules), run as Ansible runs them
(the module's main with its arguments as JSON) on real directories; and the two facts the
release switch relies on, with a real python3 and bash: a process started in `current` keeps
importing its own release after the switch, and reconcile.sh resolves `current` once a pass."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "plugins" / "modules"
SCRIPT = ROOT / "roles" / "cnpa_reconciler" / "files" / "reconcile.sh"
PACKAGE_INIT = ROOT / "roles" / "cnpa_reconciler" / "files" / "cnpa_controller" / "__init__.py"


def module(name: str, check: bool = False, **args) -> dict:
    """Run a module of the role's library as Ansible does: its arguments on stdin, JSON out."""
    payload = {"ANSIBLE_MODULE_ARGS": {**args, "_ansible_check_mode": check}}
    proc = subprocess.run([sys.executable, str(LIBRARY / f"{name}.py")], input=json.dumps(payload),
                          capture_output=True, text=True, timeout=60, check=False)
    out = json.loads(proc.stdout)
    out["rc"] = proc.returncode
    return out


def release(base: Path, name: str) -> Path:
    """A complete release directory as the role makes it: the files, then .cnpa-release."""
    d = base / "releases" / name
    (d / "cnpa_controller").mkdir(parents=True)
    (d / "reconcile.sh").write_text(SCRIPT.read_text())
    (d / "cnpa_controller" / "__init__.py").write_text(PACKAGE_INIT.read_text())
    (d / ".cnpa-release").write_text(json.dumps({"release": name}))
    return d


def tree(base: Path) -> dict:
    """Every path under base: a link's target, or 'dir'/'file'."""
    out = {}
    for p in sorted(base.rglob("*")):
        rel = str(p.relative_to(base))
        out[rel] = os.readlink(p) if p.is_symlink() else "dir" if p.is_dir() else "file"
    return out


def test_a_release_becomes_current_with_one_link_and_the_one_it_replaces_stays_previous(tmp_path):
    release(tmp_path, "aaa")
    got = module("cnpa_release", base_dir=str(tmp_path), release="aaa")
    assert got["changed"] and got["current"] == "aaa" and got["previous"] is None, got
    assert os.readlink(tmp_path / "current") == "releases/aaa"
    assert not (tmp_path / "previous").exists()
    again = module("cnpa_release", base_dir=str(tmp_path), release="aaa")
    assert not again["changed"], again

    release(tmp_path, "bbb")
    before = tree(tmp_path)
    predicted = module("cnpa_release", check=True, base_dir=str(tmp_path), release="bbb")
    assert predicted["changed"] and predicted["current"] == "bbb" and predicted["previous"] == "aaa"
    assert tree(tmp_path) == before  # check mode changes nothing
    got = module("cnpa_release", base_dir=str(tmp_path), release="bbb")
    assert (got["changed"], got["current"], got["previous"], got["removed"]) == (True, "bbb", "aaa", [])
    assert os.readlink(tmp_path / "current") == "releases/bbb"
    assert os.readlink(tmp_path / "previous") == "releases/aaa"
    assert not (tmp_path / ".current.tmp").exists()


def test_only_current_and_previous_stay_and_only_our_releases_go(tmp_path):
    for name in ("r1", "r2", "r3"):
        release(tmp_path, name)
        module("cnpa_release", base_dir=str(tmp_path), release=name)
    # r1 went when r3 came (r2 is previous); a directory without our mark, or whose mark names
    # another release, is not ours and stays.
    assert sorted(os.listdir(tmp_path / "releases")) == ["r2", "r3"]
    (tmp_path / "releases" / "theirs").mkdir()
    fake = release(tmp_path, "copied")
    (fake / ".cnpa-release").write_text(json.dumps({"release": "elsewhere"}))
    release(tmp_path, "r4")
    got = module("cnpa_release", base_dir=str(tmp_path), release="r4")
    assert got["removed"] == [str(tmp_path / "releases" / "r2")], got
    assert sorted(got["foreign"]) == [str(tmp_path / "releases" / n) for n in ("copied", "theirs")]
    assert sorted(os.listdir(tmp_path / "releases")) == ["copied", "r3", "r4", "theirs"]


def test_no_switch_to_an_incomplete_release_nor_over_something_not_ours(tmp_path):
    d = release(tmp_path, "half")
    (d / ".cnpa-release").unlink()
    got = module("cnpa_release", base_dir=str(tmp_path), release="half")
    assert got["rc"] != 0 and "no complete release" in got["msg"], got
    assert not (tmp_path / "current").exists()
    release(tmp_path, "whole")
    (tmp_path / "current").mkdir()
    got = module("cnpa_release", base_dir=str(tmp_path), release="whole")
    assert got["rc"] != 0 and "current is not cnpa-op's link" in got["msg"], got
    assert (tmp_path / "current").is_dir() and not (tmp_path / "current").is_symlink()


def earlier_install(base: Path) -> None:
    """What versions before releases installed: the script and the package beside it."""
    base.mkdir(parents=True, exist_ok=True)
    (base / "reconcile.sh").write_text(SCRIPT.read_text())
    (base / "cnpa_controller").mkdir()
    (base / "cnpa_controller" / "__init__.py").write_text(PACKAGE_INIT.read_text())
    (base / "cnpa_controller" / "plan.py").write_text("")
    (base / "cnpa_plan.py").write_text('"""What the TeamSpace controller writes."""\n')


def test_earlier_code_goes_once_a_release_is_current_and_never_records_or_evidence(tmp_path):
    earlier_install(tmp_path)
    (tmp_path / "archive").mkdir()
    (tmp_path / "archive" / "beta.json").write_text('{"name":"beta","uid":"u","pods":2}\n')
    (tmp_path / "report.json").write_text("{}")
    # No release yet: the earlier package is the one reconcile.sh runs; it stays.
    got = module("cnpa_release", base_dir=str(tmp_path), state="earlier_absent")
    assert not got["changed"] and (tmp_path / "cnpa_controller").is_dir(), got
    release(tmp_path, "r1")
    module("cnpa_release", base_dir=str(tmp_path), release="r1")
    predicted = module("cnpa_release", check=True, base_dir=str(tmp_path), state="earlier_absent")
    assert predicted["changed"] and (tmp_path / "cnpa_controller").is_dir()
    got = module("cnpa_release", base_dir=str(tmp_path), state="earlier_absent")
    assert sorted(got["removed"]) == [str(tmp_path / "cnpa_controller"), str(tmp_path / "cnpa_plan.py")]
    assert (tmp_path / "reconcile.sh").is_file() and (tmp_path / "current").is_symlink()
    assert not module("cnpa_release", base_dir=str(tmp_path), state="earlier_absent")["changed"]

    got = module("cnpa_release", base_dir=str(tmp_path), state="absent")
    assert got["changed"], got
    assert tree(tmp_path) == {"archive": "dir", "archive/beta.json": "file", "report.json": "file"}
    assert not module("cnpa_release", base_dir=str(tmp_path), state="absent")["changed"]


def test_what_is_not_ours_is_left_where_our_code_would_be(tmp_path):
    (tmp_path / "reconcile.sh").write_text("#!/bin/sh\necho somebody else's\n")
    (tmp_path / "cnpa_controller").mkdir()
    (tmp_path / "cnpa_controller" / "__init__.py").write_text('"""another package"""\n')
    (tmp_path / "current").symlink_to("/usr")
    got = module("cnpa_release", base_dir=str(tmp_path), state="absent")
    assert not got["changed"], got
    names = ("reconcile.sh", "cnpa_controller", "current")
    assert sorted(got["foreign"]) == sorted(str(tmp_path / n) for n in names)
    assert sorted(os.listdir(tmp_path)) == ["cnpa_controller", "current", "reconcile.sh"]


def test_code_is_removed_only_while_no_pass_holds_the_lock(tmp_path):
    release(tmp_path, "r1")
    module("cnpa_release", base_dir=str(tmp_path), release="r1")
    lock = tmp_path / "run" / "pass.lock"
    lock.parent.mkdir()
    # A pass holds the lock (reconcile.sh's flock) for 2 s: the removal waits for it.
    holder = subprocess.Popen(["flock", str(lock), "sleep", "2"])
    try:
        deadline = time.monotonic() + 5
        while not lock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        started = time.monotonic()
        got = module("cnpa_release", base_dir=str(tmp_path), state="absent", lock_file=str(lock))
        waited = time.monotonic() - started
    finally:
        holder.wait(timeout=10)
    assert got["changed"] and waited >= 1.0, (got, waited)
    # Held for longer than the bound: nothing removed, and a warning says why.
    release(tmp_path, "r2")
    module("cnpa_release", base_dir=str(tmp_path), release="r2")
    holder = subprocess.Popen(["flock", str(lock), "sleep", "5"])
    try:
        time.sleep(0.5)
        got = module("cnpa_release", base_dir=str(tmp_path), state="absent", lock_file=str(lock),
                     lock_timeout=1)
    finally:
        holder.wait(timeout=10)
    assert got["removed"] == [] and (tmp_path / "releases" / "r2").is_dir(), got
    assert "not removed this time" in json.dumps(got.get("warnings", []))


def test_a_running_process_keeps_importing_the_release_it_started_in(tmp_path):
    """The watch unit's WorkingDirectory is BASE/current: `python3 -m` puts the resolved directory
    first on sys.path, so a module imported after the switch still comes from its release."""
    for name in ("a", "b"):
        pkg = tmp_path / "releases" / name / "pk"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "lazy.py").write_text(f"V = {name!r}\n")
        (pkg / "__main__.py").write_text(
            "import sys, time\nprint(sys.path[0], flush=True)\ntime.sleep(1.5)\n"
            "from . import lazy\nprint(lazy.V)\n")
    (tmp_path / "current").symlink_to("releases/a")
    proc = subprocess.Popen([sys.executable, "-m", "pk"], cwd=tmp_path / "current",
                            env={"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path)},
                            stdout=subprocess.PIPE, text=True)
    first = proc.stdout.readline().strip()
    (tmp_path / ".current.tmp").symlink_to("releases/b")
    os.replace(tmp_path / ".current.tmp", tmp_path / "current")
    rest, _ = proc.communicate(timeout=30)
    assert first == str(tmp_path / "releases" / "a")
    assert rest.strip() == "a"


@pytest.mark.parametrize("layout", ["release", "flat"])
def test_reconcile_sh_imports_the_release_current_names_or_the_package_beside_it(tmp_path, layout):
    """The lab's reconcile.sh (a regular file) and an earlier version's layout both run whole."""
    base = tmp_path / "base"
    if layout == "release":
        for name in ("a", "b"):
            pkg = release(base, name) / "cnpa_controller"
            (pkg / "__init__.py").write_text(f"raise SystemExit('loaded {name}')\n")
        (base / "current").symlink_to("releases/b")
        (base / "cnpa_controller").mkdir()  # an earlier version's leftover is not imported
        (base / "cnpa_controller" / "__init__.py").write_text("raise SystemExit('loaded flat')\n")
    else:
        base.mkdir()
        (base / "cnpa_controller").mkdir()
        (base / "cnpa_controller" / "__init__.py").write_text("raise SystemExit('loaded flat')\n")
    (base / "reconcile.sh").write_text(SCRIPT.read_text())
    (base / "reconcile.sh").chmod(0o755)
    proc = subprocess.run([str(base / "reconcile.sh"), "--plan"], capture_output=True, text=True,
                          timeout=60, check=False, env={"PATH": os.environ["PATH"]})
    assert ("loaded b" if layout == "release" else "loaded flat") in proc.stderr, proc.stderr


# -- cnpa_archive_migrate ------------------------------------------------------------------------
def record(d: Path, file: str, name: str, uid: str, pods: int = 2) -> str:
    text = json.dumps({"name": name, "uid": uid, "pods": pods}, separators=(",", ":")) + "\n"
    (d / file).write_text(text)
    return text


def test_migration_keeps_an_earlier_record_of_the_same_name_as_name_uid(tmp_path):
    src, dest = tmp_path / "lab", tmp_path / "system"
    src.mkdir()
    dest.mkdir()
    old = record(src, "gone.json", "gone", "old-uid")
    new = record(dest, "gone.json", "gone", "new-uid", pods=3)
    only = record(src, "only.json", "only", "o1")
    kept_before = record(src, "only.o0.json", "only", "o0")
    same = record(src, "same.json", "same", "s1")
    (dest / "same.json").write_text(same)
    # The same deletion recorded by both (another format): nothing to copy.
    record(src, "twice.json", "twice", "t1")
    (dest / "twice.json").write_text('{"name": "twice", "uid": "t1", "pods": 2}')
    long = "x" * 220
    long_old = record(src, f"{long}.json", long, "l-old")
    record(dest, f"{long}.json", long, "l-new")
    before = tree(tmp_path)

    predicted = module("cnpa_archive_migrate", check=True, src=str(src), dest=str(dest))
    assert predicted["changed"] and tree(tmp_path) == before
    got = module("cnpa_archive_migrate", src=str(src), dest=str(dest))
    assert got["changed"] and got["conflicts"] == [], got
    assert sorted(got["copied"]) == ["only.json", "only.o0.json"]
    assert sorted((k["from"], k["as"]) for k in got["kept"]) == \
        sorted([("gone.json", "gone.old-uid.json"), (f"{long}.json", "l-old.json")])
    assert (dest / "gone.json").read_text() == new
    assert (dest / "gone.old-uid.json").read_text() == old
    assert (dest / "only.json").read_text() == only
    assert (dest / "only.o0.json").read_text() == kept_before
    assert (dest / "l-old.json").read_text() == long_old
    assert (src / "gone.json").read_text() == old  # the source stays
    assert not [p for p in os.listdir(dest) if p.startswith(".")]
    again = module("cnpa_archive_migrate", src=str(src), dest=str(dest))
    assert not again["changed"] and again["conflicts"] == [], again


def test_migration_never_overwrites_a_record_with_other_content(tmp_path):
    src, dest = tmp_path / "lab", tmp_path / "system"
    src.mkdir()
    dest.mkdir()
    record(src, "a.json", "a", "a-old")
    mine = record(dest, "a.json", "a", "a-new")
    squatter = (dest / "a.a-old.json")
    squatter.write_text("not the record\n")
    (src / "b.json").write_text("not json")
    theirs = record(dest, "b.json", "b", "b1")
    got = module("cnpa_archive_migrate", src=str(src), dest=str(dest))
    assert not got["changed"], got
    assert sorted(c["file"] for c in got["conflicts"]) == ["a.json", "b.json"]
    assert (dest / "a.json").read_text() == mine and squatter.read_text() == "not the record\n"
    assert (dest / "b.json").read_text() == theirs
    assert len(got["warnings"]) == 2, got
    # Nothing to do without an earlier archive.
    assert not module("cnpa_archive_migrate", src=str(tmp_path / "none"), dest=str(dest))["changed"]
