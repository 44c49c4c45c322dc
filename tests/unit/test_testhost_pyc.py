"""The test hosts' bytecode cache for AnsiballZ zips (testhost/files/.../cnpa_testhost_pyc.py):
the second import of a zipped module loads the first one's code under its own filename, a changed
source compiles anew, and a directory others may write is not trusted."""

from __future__ import annotations

import marshal
import os
import types
import zipfile
import zipimport
from pathlib import Path

import pytest

HOOK = (Path(__file__).parents[2] / "testhost/files/usr/lib/python3/dist-packages"
        / "cnpa_testhost_pyc.py")


def _install_hook(cache: Path) -> types.ModuleType:
    """The hook's module with its cache at `cache`, loaded without writing bytecode beside it
    (the rootfs would ship it); loading it runs its _install()."""
    module = types.ModuleType("cnpa_testhost_pyc")
    module.__file__ = str(HOOK)
    source = HOOK.read_text().replace('CACHE = "/var/cache/cnpa-testhost-pyc"',
                                      f'CACHE = "{cache}"')
    exec(compile(source, str(HOOK), "exec"), module.__dict__)
    return module


@pytest.fixture
def hook(tmp_path, monkeypatch):
    """The hook installed with its cache in tmp_path; zipimport's own compile step is put back
    afterwards."""
    monkeypatch.setattr(zipimport, "_compile_source", zipimport._compile_source)
    (tmp_path / "cache").mkdir(mode=0o755)
    return _install_hook(tmp_path / "cache")


def _zip(path: Path, body: str) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("zipped_mod.py", body)
    return path


def _load(zip_path: Path):
    code = zipimport.zipimporter(str(zip_path)).get_code("zipped_mod")
    ns: dict = {}
    exec(code, ns)
    return code, ns


def _cached(tmp_path: Path) -> list[str]:
    return sorted(os.listdir(tmp_path / "cache"))


def test_second_zip_loads_the_first_ones_code_under_its_own_name(hook, tmp_path):
    body = "def where():\n    return where.__code__.co_filename\nVALUE = 1\n"
    first, _ = _load(_zip(tmp_path / "a.zip", body))
    assert first.co_filename.startswith(str(tmp_path / "a.zip"))
    assert len(_cached(tmp_path)) == 1
    second, ns = _load(_zip(tmp_path / "b.zip", body))
    assert len(_cached(tmp_path)) == 1
    assert ns["VALUE"] == 1
    assert second.co_filename.startswith(str(tmp_path / "b.zip"))
    assert ns["where"]().startswith(str(tmp_path / "b.zip"))  # nested code renamed too


def test_the_cache_is_read(hook, tmp_path):
    """Another code under the source's key is what the second import runs: proof that it read
    the cache rather than compiling again."""
    _load(_zip(tmp_path / "a.zip", "VALUE = 1\n"))
    entry = tmp_path / "cache" / _cached(tmp_path)[0]
    entry.write_bytes(marshal.dumps(compile("VALUE = 99\n", "x", "exec")))
    _, ns = _load(_zip(tmp_path / "b.zip", "VALUE = 1\n"))
    assert ns["VALUE"] == 99


def test_changed_source_compiles_anew(hook, tmp_path):
    _load(_zip(tmp_path / "a.zip", "VALUE = 1\n"))
    _, ns = _load(_zip(tmp_path / "b.zip", "VALUE = 2\n"))
    assert ns["VALUE"] == 2
    assert len(_cached(tmp_path)) == 2


def test_a_corrupt_entry_falls_back_to_compiling(hook, tmp_path):
    _load(_zip(tmp_path / "a.zip", "VALUE = 3\n"))
    entry = tmp_path / "cache" / _cached(tmp_path)[0]
    entry.write_bytes(b"\x00not marshal")
    _, ns = _load(_zip(tmp_path / "b.zip", "VALUE = 3\n"))
    assert ns["VALUE"] == 3


def test_a_directory_others_may_write_is_not_trusted(tmp_path, monkeypatch):
    monkeypatch.setattr(zipimport, "_compile_source", zipimport._compile_source)
    before = zipimport._compile_source
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache").chmod(0o777)
    _install_hook(tmp_path / "cache")
    assert zipimport._compile_source is before


def test_the_pth_imports_the_hook():
    pth = HOOK.with_suffix(".pth").read_text().split()
    assert pth == ["import", "cnpa_testhost_pyc"]
