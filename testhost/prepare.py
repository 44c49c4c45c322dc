"""Fill the cache a test run uses before its tests ask for it: `python -m testhost prepare`.

On a fresh machine the first test host waits for the control plane's and kine's builds (Go,
CPU-bound, about 12 minutes on two cores) and then for the rootfs tarballs (debootstrap, mostly
downloads). Asked for one after the other by the tests, the downloads add to the compiles;
here every piece runs at once, in threads: the downloads beside the compiles, and kine's compile
beside the control plane's (it fills the core a link step leaves idle). Each piece takes the same
lock the tests' own requests take, so a test that needs one meanwhile waits for it instead of
making it twice (build._cached, rootfs.ensure, prometheus.binaries). `python3 dev.py test`
starts this in the background while the unit tests and linters run.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from . import build, prometheus, rootfs
from .common import HostError, log
from .progress import elapsed_text


def prepare(suites: tuple[str, ...] = rootfs.SUITES) -> None:
    """Every cached piece, made once; raises HostError naming each piece that failed (after
    every other piece is done)."""
    pieces: list[tuple[str, Callable[[], object]]] = [
        *((f"rootfs {suite}", lambda suite=suite: rootfs.ensure(suite)) for suite in suites),
        ("prometheus", prometheus.binaries),
        ("kine", build.build_kine),
        ("control plane", build.build),
    ]
    failed: dict[str, str] = {}
    t0 = time.monotonic()

    def make(what: str, fn: Callable[[], object]) -> None:
        try:
            fn()
            log(f"prepare: {what} ready after {elapsed_text(time.monotonic() - t0)}")
        except Exception as exc:  # reported below, with the others
            failed[what] = str(exc)

    threads = [threading.Thread(target=make, args=piece, name=f"prepare {piece[0]}")
               for piece in pieces]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise HostError("prepare: " + "; ".join(f"{what}: {why}" for what, why in failed.items()))
