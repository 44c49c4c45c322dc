"""Fixtures shared by the unit tests."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


class SmallDisk:
    """A real file system of 16 KiB (tmpfs) that a test fills up: writes then fail with ENOSPC
    as on a full disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.filler = path / "filler"

    def fill(self) -> None:
        with open(self.filler, "ab", buffering=0) as fh:
            for _ in range(64):
                try:
                    fh.write(b"x" * 4096)
                except OSError:
                    return
        raise AssertionError(f"{self.path} did not fill up")

    def free(self) -> None:
        self.filler.unlink()


@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    path = tmp_path / "small"
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k,mode=0755", "cnpa-small-disk",
                    str(path)], check=True)
    try:
        yield SmallDisk(path)
    finally:
        subprocess.run(["umount", str(path)], check=True)
