"""Command line: python -m testhost build|rootfs|create|destroy|status."""

from __future__ import annotations

import argparse
import sys

from . import build as build_mod
from .common import HostError, require_root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testhost", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build", help="build (or reuse) the cached control-plane binaries")
    args = parser.parse_args(argv)
    try:
        require_root()
        if args.cmd == "build":
            print(build_mod.build())
    except HostError as exc:
        print(f"testhost: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
