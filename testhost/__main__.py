"""python -m testhost: build, create, stop/start, inspect and destroy throwaway k3s-style hosts."""

from __future__ import annotations

import argparse
import json
import sys
import time

from . import build as build_mod
from . import instance as inst_mod
from . import rootfs
from .common import HostError, log, require_root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testhost", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build", help="build (or reuse) the cached control-plane binaries and kine")
    sub.add_parser("prepare", help="fill the whole cache a test run uses (the builds, both "
                   "suites' rootfs, Prometheus), the downloads beside the compiles")
    p = sub.add_parser("rootfs", help="build (or reuse) the cached rootfs tarball")
    p.add_argument("--suite", choices=rootfs.SUITES, default=rootfs.SUITE,
                   help=f"Debian release of the rootfs (default {rootfs.SUITE})")
    p = sub.add_parser("create", help="create and boot a host, wait until the API is ready")
    p.add_argument("name")
    p.add_argument("--suite", choices=rootfs.SUITES, default=rootfs.SUITE,
                   help=f"Debian release of its rootfs (default {rootfs.SUITE})")
    p.add_argument("--datastore", choices=inst_mod.DATASTORES, default=None,
                   help="where the API server stores: kine (SQLite, a single k3s server's "
                   "default) or etcd (k3s HA's); default $CNPA_TESTHOST_DATASTORE, else "
                   f"{inst_mod.DEFAULT_DATASTORE}")
    p.add_argument("--compaction-interval", default=inst_mod.COMPACTION_INTERVAL,
                   metavar="DURATION", help="kube-apiserver's --etcd-compaction-interval "
                   f"(default {inst_mod.COMPACTION_INTERVAL}, the API server's own)")
    p.add_argument("--no-wait", action="store_true", help="return once systemd has booted")
    p = sub.add_parser("destroy", help="power off and remove a host, check nothing is left")
    p.add_argument("name")
    p.add_argument("--keep-files", action="store_true", help="keep the instance directory")
    p = sub.add_parser("stop", help="power off, keep the host's files (start boots it again)")
    p.add_argument("name")
    p = sub.add_parser("start", help="boot a stopped host again and wait until ready")
    p.add_argument("name")
    p = sub.add_parser("info", help="print a host's connection details as JSON")
    p.add_argument("name")
    p = sub.add_parser("exec", help="run a command inside a host (nsenter)")
    p.add_argument("name")
    p.add_argument("command", nargs=argparse.REMAINDER)
    sub.add_parser("list", help="list hosts")
    args = parser.parse_args(argv)
    try:
        require_root()
        if args.cmd == "build":
            print(build_mod.build())
            print(build_mod.build_kine())
        elif args.cmd == "prepare":
            from .prepare import prepare

            prepare()
        elif args.cmd == "rootfs":
            print(rootfs.ensure(args.suite))
        elif args.cmd == "create":
            t0 = time.monotonic()
            inst = inst_mod.create(args.name, wait=not args.no_wait, suite=args.suite,
                                   datastore=args.datastore,
                                   compaction_interval=args.compaction_interval)
            print(json.dumps(inst.info() | {"create_seconds": round(time.monotonic() - t0, 1)},
                             indent=2))
        elif args.cmd == "destroy":
            inst_mod.destroy(args.name, keep_files=args.keep_files)
        elif args.cmd == "stop":
            inst_mod.Instance.load(args.name).poweroff()
        elif args.cmd == "start":
            inst = inst_mod.Instance.load(args.name)
            inst.boot()
            inst.wait_ready()
            inst.save()
        elif args.cmd == "info":
            print(json.dumps(inst_mod.Instance.load(args.name).info(), indent=2))
        elif args.cmd == "exec":
            cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
            proc = inst_mod.Instance.load(args.name).exec(cmd, check=False, timeout=600)
            sys.stdout.write(proc.stdout)
            sys.stderr.write(proc.stderr)
            return proc.returncode
        elif args.cmd == "list":
            for state in sorted(inst_mod.instances_dir().glob("*/state.json")):
                inst = inst_mod.Instance.load(state.parent.name)
                print(f"{inst.name}\t{'running' if inst.running() else 'stopped'}\t"
                      f"ssh={inst.ports.get('ssh')}\tapi={inst.ports.get('apiserver')}\t"
                      f"datastore={inst.datastore()}")
    except HostError as exc:
        log(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
