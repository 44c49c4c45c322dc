"""Test hosts only: a bytecode cache for what Ansible's modules import from their AnsiballZ zip.

Each module run ships its code and ansible.module_utils (kubernetes.core's too) in a zip that
Python imports with zipimport, which never keeps bytecode: every run compiles the same 60 to 80
files again: 0.07-0.1 s of CPU per module run (a plain module's run is 0.21 s without the
cache, 0.14 s with it; a CI run makes some 6,000 module runs; docs/figures.md). Here
zipimport's compile step first looks in a cache keyed by the interpreter's magic number and the
source's SHA-256, so the code that runs is the code shipped (a changed file is another key); only
the compiling is saved.

Loaded by cnpa_testhost_pyc.pth at every Python start on a test host; nothing else changes. An
error anywhere falls back to compiling, so it can slow an import but never fail one. The cache
is trusted only while its directory is root's and writable by no one else (root's modules load
from it). Hosts the roles install on do not have this; their modules run the same bytes.
"""

import marshal
import os
import sys
import zipimport

CACHE = "/var/cache/cnpa-testhost-pyc"


def _renamed(code, filename):
    """The cached code with the filename of this import (tracebacks name the zip in use)."""
    if code.co_filename == filename:
        return code
    consts = tuple(_renamed(c, filename) if isinstance(c, type(code)) else c
                   for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _trusted(path):
    try:
        st = os.stat(path)
    except OSError:
        return False
    return st.st_uid == 0 and not st.st_mode & 0o022


def _install():
    compile_source = getattr(zipimport, "_compile_source", None)
    magic = getattr(sys.modules.get("_frozen_importlib_external"), "MAGIC_NUMBER", None)
    if compile_source is None or magic is None or not _trusted(CACHE):
        return

    def cached_compile(pathname, source):
        try:
            import hashlib

            path = os.path.join(CACHE, hashlib.sha256(magic + b"\0" + source).hexdigest())
            try:
                with open(path, "rb") as f:
                    return _renamed(marshal.load(f), pathname)
            except FileNotFoundError:
                pass
            code = compile_source(pathname, source)
            tmp = f"{path}.{os.getpid()}.tmp"
            try:
                with open(tmp, "wb") as f:
                    marshal.dump(code, f)
                os.replace(tmp, path)
            except OSError:  # not root, or a full disk: this run compiles, the next may store
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
            return code
        except Exception:  # the cache must never fail an import
            return compile_source(pathname, source)

    zipimport._compile_source = cached_compile


_install()
