"""python3 -m cnpa_controller: cnpa-op's long-running TeamSpace controller, or one pass (--once).

Watches TeamSpaces, their namespaces and quotas, and reconciles each TeamSpace whose objects
changed with the plan (plan.py) and the executor every pass uses (executor.py). Runs until
SIGTERM or SIGINT, then finishes the passes under way, gives up its Lease and exits 0.

Every setting is a flag and an environment variable (config.OPTIONS, read by
config.read_config); they, the output and the exit statuses are the --help text (parser()),
which docs/architecture.md quotes (a test compares the two). --help and --version need no
API server. No mode needs the kubernetes client (api.connect).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading

from . import __version__, leader, logs
from .api import connect
from .config import (
    EXIT_CONFIG,
    EXIT_OK,
    EXIT_UNREADABLE,
    OPTIONS,
    PASS,
    PASS_SECONDS,
    WATCH,
    ConfigError,
    Settings,
    log_options,
    named,
    read_config,
)
from .controller import Controller
from .kubeconfig import KubeconfigError
from .once import PAUSE_SECONDS, UNTIL, run_pass, run_until
from .plan import FINALIZER, utc_now
from .turn import PassTurn

# --until's bound when --max-passes is not given (the role's cnpa_controller_uninstall_passes).
MAX_PASSES = 20

log = logging.getLogger("cnpa_controller")


DESCRIPTION = """\
cnpa-op's TeamSpace controller. Without --once or --plan: watches TeamSpaces, their namespaces
and quotas and reconciles each TeamSpace whose objects changed, until SIGTERM or SIGINT (then it
finishes the passes under way, gives up its Lease and exits 0)."""

EPILOG = """\
Every flag has an environment variable, named in brackets; a flag given wins over its variable.

stdout: one line per write that went through ("teamspace NAME: WHAT"); with --plan, the planned
writes as JSON lines instead. stderr: problems ("TeamSpace NAME: MESSAGE") and the controller's
news (caches synced, leadership, watches re-listed), each line "TIME LEVEL cnpa-op: MESSAGE"
(time in UTC). With --log-format json every line of both is one JSON object: time, level,
logger, msg, and teamspace when the line is about one (a write's msg is its text line).
With --until the passes' write lines go to stderr too, and stdout is one JSON line once the
passes end: {"passes": N, "last_exit": the last pass's exit status, "left": [the names still
waiting], "teamspaces": [{"name", "uid", "deleting": true|false, "finalizers": [...]}, ...]}.

Exit status of the controller: 0 stopped by a signal; 3 bad configuration (the message names
the flag or variable); 4 the archive directory is missing or was replaced (systemd restarts the
service, whose sandbox then binds the directory anew).
Exit status of --once and --plan, as reconcile.sh's: 0 converged or converging; 1 some
TeamSpace failed (named on stderr, retried next pass); 2 the API server could not be read
(nothing written); 3 bad configuration or internal error; 4 the archive directory is missing
or was replaced.
Exit status of --once --until: 0 the JSON line printed (whatever "left" names); 2 the
TeamSpaces could not be listed after a pass (nothing printed); 3 bad configuration."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        # argparse's status 2 means "the API server could not be read" to reconcile.sh's callers.
        self.print_usage(sys.stderr)
        self.exit(EXIT_CONFIG, f"{self.prog}: error: {message}\n")


def parser() -> Parser:
    # A fixed width: the help is the same on every terminal, and so is the docs' copy of it.
    p = Parser(prog="python3 -m cnpa_controller", description=DESCRIPTION, epilog=EPILOG,
               allow_abbrev=False, formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(
                   prog, width=100, max_help_position=38))
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true",
                      help="one pass over every TeamSpace from a fresh list, its writes made in "
                      "a turn on the Lease, then exit (what reconcile.sh runs, under its lock and "
                      "deadline)")
    mode.add_argument("--plan", action="store_true",
                      help="that pass's writes as JSON lines on stdout; nothing written")
    p.add_argument("--until", choices=UNTIL,
                   help=f"with --once: passes {PAUSE_SECONDS:g} s apart until no TeamSpace holds "
                   f"the finalizer {FINALIZER} (released) or every TeamSpace not being deleted "
                   f"holds it (finalized), at most --max-passes of them, none begun after "
                   f"--max-passes x {PASS_SECONDS} s; then one JSON line on stdout, the passes' "
                   "write lines on stderr")
    p.add_argument("--max-passes", metavar="N", type=_passes,
                   help=f"the most passes --until makes, 1-1000 (default: {MAX_PASSES})")
    groups = {title: p.add_argument_group(title) for title in (PASS, WATCH)}
    for flag, var, metavar, text, group in OPTIONS:
        if metavar is None:
            groups[group].add_argument(flag, dest=var, action=argparse.BooleanOptionalAction,
                                       help=f"{text} [{var}]")
        else:
            groups[group].add_argument(flag, dest=var, metavar=metavar, help=f"{text} [{var}]")
    return p


def _passes(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1000:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a whole number from 1 to 1000")
    return int(text)


def parse(argv: list) -> argparse.Namespace:
    """The command line, its combinations checked (SystemExit as argparse's, EXIT_CONFIG)."""
    p = parser()
    args = p.parse_args(argv)
    if args.until and not args.once:
        p.error("--until needs --once")
    if args.max_passes is not None and not args.until:
        p.error("--max-passes needs --until")
    return args


def from_flags(args: argparse.Namespace, env: dict) -> dict:
    """The flags given, laid over env (as the variables' text); returns variable -> flag of each,
    so that a message about the setting names what was given."""
    flags = {}
    for flag, var, _metavar, _text, _group in OPTIONS:
        value = getattr(args, var)
        if value is not None:
            env[var] = ("1" if value else "0") if isinstance(value, bool) else value
            flags[var] = flag
    return flags


def main(env: dict | None = None, argv: list | tuple = ()) -> int:
    env = dict(os.environ if env is None else env)
    try:
        args = parse(list(argv))
    except SystemExit as exc:  # --help, --version: 0; a bad flag: EXIT_CONFIG (Parser.error)
        return exc.code
    flags = from_flags(args, env)
    try:
        logs.setup(*log_options(env, flags))
    except ConfigError as exc:
        logs.setup()
        log.error("%s", exc)
        return EXIT_CONFIG
    kubeconfig = named("KUBECONFIG", flags)
    try:
        settings = read_config(env, flags)
        # A pass's writes are fenced by the Lease as the controller's are: the same timeout. The
        # workers, three watches and the Lease each hold a connection.
        api = connect(settings.kubeconfig, timeout=settings.timeout,
                      user_agent=settings.user_agent, env=env, pool=settings.workers + 8)
    except ConfigError as exc:
        log.error("%s", exc)
        return EXIT_CONFIG
    except KubeconfigError as exc:
        log.error("%s: %s", kubeconfig, exc)
        return EXIT_CONFIG
    if args.until:
        return passes_until(api, settings, args.until, args.max_passes or MAX_PASSES)
    if args.once or args.plan:
        return one_pass(api, settings, plan_only=args.plan)
    # Only the long-running controller has metrics (prometheus_client: a pass starts faster).
    try:
        from .metrics import Metrics
    except ImportError as exc:
        log.error("%s", exc)
        return EXIT_CONFIG

    metrics = Metrics()

    make_elector = None
    if settings.election:
        lease = settings.lease

        def make_elector(on_change):
            elector = None

            def changed(leading: bool) -> None:
                on_change(leading)
                # Who leads is news for people too (`kubectl describe lease`). Sent from a thread
                # of its own: the elector's thread must not wait on it to renew.
                threading.Thread(target=leader.lease_event, daemon=True, name="lease-event",
                                 args=(api, lease.namespace, lease.name, lease.identity, leading),
                                 kwargs={"uid": elector.lease_uid if elector else ""}).start()

            elector = leader.Elector.of(api, lease, on_change=changed)
            return elector

    controller = Controller(api, settings, make_elector=make_elector, metrics=metrics)
    if settings.metrics_address:
        try:
            metrics.serve(*settings.metrics_address,
                          checks={"/healthz": controller.healthz, "/readyz": controller.readyz})
        except OSError as exc:
            log.error("%s: cannot serve there: %s", named("CNPA_METRICS_ADDRESS", flags), exc)
            return EXIT_CONFIG

    def on_signal(signum, frame):
        # Nothing else here: a handler that logged could wait forever on the log handler's lock
        # the interrupted main thread holds. run() says that it stops.
        controller.stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return controller.run()


def one_pass(api, settings: Settings, *, plan_only: bool, out=None) -> int:
    """--once / --plan: one pass from a fresh list (reconcile.sh's mode: passes on one host take
    turns on a lock). With leader election the pass takes its turn on the Lease before it writes;
    without, it writes as the only writer."""
    def say(name: str, what: str) -> None:
        print(logs.write_line(name, what), file=out or sys.stdout, flush=True)

    def plan_line(line: str) -> None:
        print(line)

    turn = None
    if settings.election and not plan_only:
        turn = PassTurn(api, settings.lease)
    try:
        return run_pass(api, settings, now=utc_now(), say=say, turn=turn,
                        plan_only=plan_line if plan_only else None)
    except Exception:
        log.exception("internal error; pass aborted:")
        return EXIT_CONFIG


def passes_until(api, settings: Settings, until: str, max_passes: int) -> int:
    """--once --until: passes until the TeamSpaces are what `until` waits for (once.run_until),
    then what they are as one JSON line on stdout; each pass's write lines go to stderr."""
    try:
        outcome = run_until(api, settings, until=until, max_passes=max_passes,
                            one_pass=lambda: one_pass(api, settings, plan_only=False,
                                                      out=sys.stderr))
    except Exception:
        log.exception("internal error; passes aborted:")
        return EXIT_CONFIG
    if outcome is None:
        return EXIT_UNREADABLE
    print(json.dumps(outcome, separators=(",", ":"), ensure_ascii=False), flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(argv=sys.argv[1:]))
