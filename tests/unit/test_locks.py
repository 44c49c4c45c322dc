"""The lock files dev.py installs agree with the requirement files they are compiled from."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pins(path: Path) -> dict[str, str]:
    """name -> version of every `name==version` line (requirement files and lock files)."""
    found = re.findall(r"^([A-Za-z0-9_.-]+)==([^\s\\;]+)", path.read_text(), flags=re.M)
    return {name.lower().replace("_", "-"): version for name, version in found}


def test_locks_pin_what_the_requirement_files_ask_for():
    for txt, lock in (("requirements.txt", "requirements.lock"),
                      ("requirements-dev.txt", "requirements-dev.lock")):
        wanted = pins(ROOT / txt)
        if txt == "requirements-dev.txt":
            wanted |= pins(ROOT / "requirements.txt")
        locked = pins(ROOT / lock)
        stale = {n: (v, locked.get(n)) for n, v in wanted.items() if locked.get(n) != v}
        assert not stale, f"{lock} is stale (wanted, locked): {stale}; re-compile it (README)"


def test_every_locked_package_has_a_hash():
    for lock in ("requirements.lock", "requirements-dev.lock"):
        blocks = re.split(r"\n(?=[A-Za-z0-9_.-]+==)", (ROOT / lock).read_text())
        for block in blocks[1:]:
            assert "--hash=sha256:" in block, f"{lock}: no hash for {block.split()[0]}"


def test_the_dev_lock_keeps_the_lab_lock_pins():
    # A venv made from requirements-dev.lock serves `dev.py lab` too (dev.py's REQUIREMENTS).
    lab, dev = pins(ROOT / "requirements.lock"), pins(ROOT / "requirements-dev.lock")
    differ = {n: (v, dev.get(n)) for n, v in lab.items() if dev.get(n) != v}
    assert not differ, f"requirements-dev.lock differs from requirements.lock: {differ}"
