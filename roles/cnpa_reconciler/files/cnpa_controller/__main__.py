"""python3 -m cnpa_controller: cnpa-op's long-running TeamSpace controller, or one pass (--once).

Watches TeamSpaces, their namespaces and quotas, and reconciles each TeamSpace whose objects
changed with the plan (plan.py) and the executor every pass uses (executor.py). Runs until
SIGTERM or SIGINT, then finishes the passes under way, gives up its Lease and exits 0.

Every setting is a flag and an environment variable (OPTIONS); they, the output and the exit
statuses are the --help text (parser()), which docs/architecture.md quotes (a test compares the
two). --help and --version need neither the API server nor the kubernetes client; nor do --once
and --plan (api.connect).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import socket
import sys
import threading
import uuid

from . import __version__, leader, logs
from .api import Api, KubeconfigError, TokenFile, connect, token_file_of
from .controller import (
    ARCHIVE,
    BASE_DIR,
    EXIT_CONFIG,
    SYSTEM_ARCHIVE_DIR,
    SYSTEM_BASE_DIR,
    Controller,
    Settings,
    default_archive_dir,
)

log = logging.getLogger("cnpa_controller")


class ConfigError(Exception):
    pass


# The least time a leader's write may take (lease - renew seconds; see read_config).
MIN_WRITE_SECONDS = 1.0
PASS, WATCH = "settings of a pass and of the controller", "settings of the long-running controller"
# Every setting: flag, environment variable, metavar, what it is (its --help line) and which
# mode reads it. The defaults quoted are the ones read_config() falls back to.
OPTIONS = (
    ("--kubeconfig", "KUBECONFIG", "PATH",
     "kubeconfig (default: ~/.kube/config, else the in-cluster config)", PASS),
    ("--base-dir", "CNPA_BASE_DIR", "DIR", f"base directory (default: {BASE_DIR})", PASS),
    ("--archive-dir", "CNPA_ARCHIVE_DIR", "DIR",
     f"archive directory, an absolute path (default: BASE_DIR/{ARCHIVE}; without --base-dir, "
     f"{SYSTEM_ARCHIVE_DIR} when this package is installed in {SYSTEM_BASE_DIR}, else "
     f"{BASE_DIR}/{ARCHIVE})", PASS),
    ("--request-timeout", "CNPA_REQUEST_TIMEOUT", "DURATION",
     f"per-request timeout, e.g. 10s, 500ms, 1m (default: {Settings.request_timeout:g}s)", PASS),
    ("--event-namespace", "CNPA_EVENT_NAMESPACE", "NAMESPACE",
     f"namespace of the Events recorded on TeamSpaces (default: {Settings.event_namespace})", PASS),
    ("--archive-namespace", "CNPA_ARCHIVE_NAMESPACE", "NAMESPACE",
     "also keep every archive record in the cluster, as ConfigMap archive-UID in this "
     "namespace, before the finalizer is released (default: off; with several controller "
     "hosts, a record then outlives the host that wrote it)", PASS),
    ("--workers", "CNPA_WORKERS", "N",
     f"TeamSpaces reconciled at the same time, 1-64 (default: {Settings.workers})", PASS),
    ("--list-page-size", "CNPA_LIST_PAGE_SIZE", "N",
     f"objects per page of a full list, 1-10000 (default: {Settings.list_page_size})", PASS),
    ("--log-format", "CNPA_LOG_FORMAT", "{" + ",".join(logs.FORMATS) + "}",
     "stderr's lines: text, or one JSON object per line (default: text)", PASS),
    ("--log-level", "CNPA_LOG_LEVEL", "{" + ",".join(logs.LEVELS) + "}",
     "the least level logged on stderr (default: info)", PASS),
    ("--resync-seconds", "CNPA_RESYNC_SECONDS", "SECONDS",
     "every TeamSpace is checked again this often, from the caches, 1-86400 "
     f"(default: {Settings.resync_seconds:g})", WATCH),
    ("--cache-stale-seconds", "CNPA_CACHE_STALE_SECONDS", "SECONDS",
     "/readyz fails once a cache's list or watch has failed for this long in a row, 5-3600 "
     f"(default: {Settings.cache_stale_seconds:g})", WATCH),
    ("--retry-max-seconds", "CNPA_RETRY_MAX_SECONDS", "SECONDS",
     "the longest wait before a failed TeamSpace is retried (the wait starts at 0.5 s and "
     "doubles) "
     f"(default: {Settings.retry_max_seconds:g})", WATCH),
    ("--watch-timeout-seconds", "CNPA_WATCH_TIMEOUT_SECONDS", "SECONDS",
     "server-side timeout of a watch before it is resumed, 10-3600, jittered up to twice that "
     f"(default: {Settings.watch_timeout_seconds})", WATCH),
    ("--leader-election", "CNPA_LEADER_ELECTION", None,
     "hold a coordination.k8s.io Lease and write only while holding it: the controller as long "
     "as it leads, a pass for its writes, after any other holder has stopped renewing it "
     "(variable: 1); or write as the only writer (0) (default: on)", PASS),
    ("--lease-namespace", "CNPA_LEASE_NAMESPACE", "NAMESPACE",
     f"namespace of the Lease (default: {leader.LEASE_NAMESPACE}, the role's; where it does not "
     "exist nobody can hold the Lease, and a pass writes without it)", PASS),
    ("--lease-name", "CNPA_LEASE_NAME", "NAME", f"name of the Lease (default: {leader.LEASE_NAME})",
     PASS),
    ("--lease-identity", "CNPA_LEASE_IDENTITY", "ID",
     "this process's identity in the Lease and its User-Agent, 1-128 of A-Z a-z 0-9 . _ - "
     "(default: HOSTNAME_RANDOM)", PASS),
    ("--lease-seconds", "CNPA_LEASE_SECONDS", "SECONDS",
     f"lease duration, whole seconds (default: {leader.LEASE_SECONDS})", PASS),
    ("--renew-seconds", "CNPA_RENEW_SECONDS", "SECONDS",
     "a leader that has not renewed for this long stops writing; at least "
     f"{MIN_WRITE_SECONDS:g} s less than --lease-seconds (default: {leader.RENEW_SECONDS})", PASS),
    ("--lease-retry-seconds", "CNPA_LEASE_RETRY_SECONDS", "SECONDS",
     f"the Lease is acquired or renewed this often; less than --renew-seconds "
     f"(default: {leader.RETRY_SECONDS})", PASS),
    ("--metrics-address", "CNPA_METRICS_ADDRESS", "HOST:PORT",
     "serve Prometheus metrics on /metrics there, and /healthz and /readyz (default: off; "
     "the role serves them on 127.0.0.1:9808)", WATCH),
    ("--metrics-textfile", "CNPA_METRICS_TEXTFILE", "PATH",
     "file for node_exporter's textfile collector (default: off)", WATCH),
    ("--metrics-textfile-seconds", "CNPA_METRICS_TEXTFILE_SECONDS", "SECONDS",
     f"how often that file is rewritten (default: {Settings.metrics_textfile_seconds:g})", WATCH),
)

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

Exit status of the controller: 0 stopped by a signal; 3 bad configuration (the message names
the flag or variable); 4 the archive directory is missing or was replaced (systemd restarts the
service, whose sandbox then binds the directory anew).
Exit status of --once and --plan, as reconcile.sh's: 0 converged or converging; 1 some
TeamSpace failed (named on stderr, retried next pass); 2 the API server could not be read
(nothing written); 3 bad configuration or internal error; 4 the archive directory is missing
or was replaced."""


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
    groups = {title: p.add_argument_group(title) for title in (PASS, WATCH)}
    for flag, var, metavar, text, group in OPTIONS:
        if metavar is None:
            groups[group].add_argument(flag, dest=var, action=argparse.BooleanOptionalAction,
                                       help=f"{text} [{var}]")
        else:
            groups[group].add_argument(flag, dest=var, metavar=metavar, help=f"{text} [{var}]")
    return p


def named(var: str, flags: dict) -> str:
    """How a message names a setting: by the flag that set it, else by its variable."""
    return flags.get(var, var)


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


_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)?")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def duration(var: str, text: str) -> float:
    """kubectl's --request-timeout form (earlier versions passed the variable to kubectl)."""
    m = _DURATION.fullmatch(text.strip())
    if not m or float(m.group(1)) == 0:
        raise ConfigError(f"{var}={text!r}: must be a positive duration such as 10s, 500ms or 1m")
    seconds = float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2) or "s"]
    if not 0.1 <= seconds <= 3600:
        raise ConfigError(f"{var}={text!r}: must be between 100ms and 1h")
    return seconds


def number(env: dict, var: str, default: float, low: float, high: float, *,
           integer: bool = False, name: str = "") -> float:
    text = env.get(var, "")
    if text == "":
        return default
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        kind = "a whole number" if integer else "a number"
        raise ConfigError(f"{name or var}={text!r}: must be {kind} from {low:g} to {high:g}")
    return value


def namespace_name(env: dict, var: str, default: str, name: str = "") -> str:
    value = env.get(var) or default
    if len(value) > 63 or not _DNS_LABEL.fullmatch(value):
        raise ConfigError(f"{name or var}={value!r}: must be a namespace name (a DNS label)")
    return value


def listen_address(var: str, text: str) -> tuple[str, int]:
    """HOST:PORT to serve on: an IPv4 address or name, or an IPv6 address in brackets
    ([::1]:9808; metrics.serve listens on IPv6 then)."""
    host, _colon, port = text.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if bracketed:
        host = host[1:-1]
    if (not host or not port.isdigit() or not 0 < int(port) < 65536
            or (":" in host and not bracketed)):
        raise ConfigError(f"{var}={text!r}: must be HOST:PORT, an IPv6 address in brackets "
                          "([::1]:9808)")
    if bracketed:
        try:
            socket.inet_pton(socket.AF_INET6, host)
        except OSError:
            raise ConfigError(f"{var}={text!r}: {host!r} is not an IPv6 address") from None
    return host, int(port)


def read_config(env: dict, flags: dict | None = None) -> dict:
    """Every setting, checked; ConfigError names the first bad one: its flag if flags (variable
    -> flag) says a flag set it, else its variable."""
    flags = flags or {}

    def name(var: str) -> str:
        return named(var, flags)

    def num(var: str, default: float, low: float, high: float, integer: bool = False) -> float:
        return number(env, var, default, low, high, integer=integer, name=name(var))

    def namespace(var: str, default: str) -> str:
        return namespace_name(env, var, default, name=name(var))

    archive = env.get("CNPA_ARCHIVE_DIR") or default_archive_dir(env.get("CNPA_BASE_DIR") or "")
    if not os.path.isabs(archive):
        raise ConfigError(f"{name('CNPA_ARCHIVE_DIR')}={archive!r}: must be an absolute path")
    d = Settings
    settings = Settings(
        archive_dir=archive,
        event_namespace=namespace("CNPA_EVENT_NAMESPACE", d.event_namespace),
        archive_namespace=(namespace("CNPA_ARCHIVE_NAMESPACE", "")
                           if env.get("CNPA_ARCHIVE_NAMESPACE") else ""),
        request_timeout=(duration(name("CNPA_REQUEST_TIMEOUT"), env["CNPA_REQUEST_TIMEOUT"])
                         if env.get("CNPA_REQUEST_TIMEOUT") else d.request_timeout),
        resync_seconds=num("CNPA_RESYNC_SECONDS", d.resync_seconds, 1, 86400),
        workers=int(num("CNPA_WORKERS", d.workers, 1, 64, integer=True)),
        retry_max_seconds=num("CNPA_RETRY_MAX_SECONDS", d.retry_max_seconds, 0.5, 3600),
        cache_stale_seconds=num("CNPA_CACHE_STALE_SECONDS", d.cache_stale_seconds, 5, 3600),
        watch_timeout_seconds=int(num("CNPA_WATCH_TIMEOUT_SECONDS", d.watch_timeout_seconds, 10,
                                      3600, integer=True)),
        list_page_size=int(num("CNPA_LIST_PAGE_SIZE", d.list_page_size, 1, 10000, integer=True)),
        metrics_textfile=env.get("CNPA_METRICS_TEXTFILE") or "",
        metrics_textfile_seconds=num("CNPA_METRICS_TEXTFILE_SECONDS", d.metrics_textfile_seconds,
                                     1, 3600),
    )
    election = env.get("CNPA_LEADER_ELECTION", "1")
    if election not in ("0", "1"):
        raise ConfigError(f"CNPA_LEADER_ELECTION={election!r}: must be 0 or 1")
    lease = {
        "namespace": namespace("CNPA_LEASE_NAMESPACE", leader.LEASE_NAMESPACE),
        "name": env.get("CNPA_LEASE_NAME") or leader.LEASE_NAME,
        "identity": env.get("CNPA_LEASE_IDENTITY")
        or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}",
        # Whole seconds: the Lease's leaseDurationSeconds is an integer, and a fraction cut off
        # there would let another host take over before this one stops writing.
        "lease_seconds": num("CNPA_LEASE_SECONDS", leader.LEASE_SECONDS, 2, 3600, integer=True),
        "renew_seconds": num("CNPA_RENEW_SECONDS", leader.RENEW_SECONDS, 1, 3600),
        "retry_seconds": num("CNPA_LEASE_RETRY_SECONDS", leader.RETRY_SECONDS, 0.1, 3600),
    }
    # It is sent in the User-Agent header too: printable ASCII only, or every request fails.
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,128}", lease["identity"]):
        raise ConfigError(f"{name('CNPA_LEASE_IDENTITY')}={lease['identity']!r}: must be 1-128 of "
                          "A-Z a-z 0-9 . _ -")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", lease["name"]) or len(lease["name"]) > 253:
        raise ConfigError(f"{name('CNPA_LEASE_NAME')}={lease['name']!r}: must be an object name")
    if not lease["retry_seconds"] < lease["renew_seconds"] < lease["lease_seconds"]:
        raise ConfigError(f"{name('CNPA_LEASE_RETRY_SECONDS')} < {name('CNPA_RENEW_SECONDS')} < "
                          f"{name('CNPA_LEASE_SECONDS')} must hold (got {lease['retry_seconds']:g}, "
                          f"{lease['renew_seconds']:g}, {lease['lease_seconds']:g})")
    # A write checked against the fence just before it lapses is sent with lease - renew seconds
    # to land (the write timeout below): less than MIN_WRITE_SECONDS passes validation only to
    # fail every write of a leader whose API server is a few hundred milliseconds away.
    if lease["lease_seconds"] - lease["renew_seconds"] < MIN_WRITE_SECONDS:
        raise ConfigError(f"{name('CNPA_LEASE_SECONDS')} - {name('CNPA_RENEW_SECONDS')} must be at "
                          f"least {MIN_WRITE_SECONDS:g} s: it is how long a leader's write may take "
                          f"(got {lease['lease_seconds']:g} - {lease['renew_seconds']:g})")
    metrics_address = None
    text = env.get("CNPA_METRICS_ADDRESS") or ""
    if text:
        metrics_address = listen_address(name("CNPA_METRICS_ADDRESS"), text)
    if election == "1":
        settings.not_leader_retry_seconds = lease["retry_seconds"]
        # A write checked against the fence just before it lapses must land before another
        # host can take over (lease - renew seconds later), or it could land after that host's.
        settings.write_timeout = min(settings.request_timeout,
                                     lease["lease_seconds"] - lease["renew_seconds"])
    return {"settings": settings, "election": election == "1", "lease": lease,
            "metrics_address": metrics_address, "kubeconfig": env.get("KUBECONFIG") or ""}


def api_client(kubeconfig: str, pool_size: int, name: str = "KUBECONFIG"):
    try:
        from kubernetes import client, config
    except ImportError as exc:
        raise ConfigError(f"the kubernetes Python client is not installed ({exc})") from exc

    cfg = client.Configuration()
    path = kubeconfig or os.path.expanduser("~/.kube/config")
    if kubeconfig or os.path.exists(path) or not os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            config.load_kube_config(config_file=path, client_configuration=cfg)
            token_file = token_file_of(path)
        except Exception as exc:
            raise ConfigError(f"{name}={path!r}: cannot load it: {exc}") from exc
        if token_file:
            # The token is renewed into this file (the role's token timer): read it again when
            # it changes, or the process is locked out once the first token expires.
            cfg.refresh_api_key_hook = TokenFile(token_file)
    else:
        # (The in-cluster loader re-reads its mounted token every minute by itself.)
        config.load_incluster_config(client_configuration=cfg)
    # Three watches, the workers and the Lease each hold a connection.
    cfg.connection_pool_maxsize = pool_size
    return client.ApiClient(cfg)


def log_options(env: dict, flags: dict | None = None) -> tuple[str, str]:
    """--log-format and --log-level, checked before the rest: the rest's errors are logged."""
    flags = flags or {}
    fmt = env.get("CNPA_LOG_FORMAT") or "text"
    if fmt not in logs.FORMATS:
        raise ConfigError(f"{named('CNPA_LOG_FORMAT', flags)}={fmt!r}: must be one of "
                          f"{', '.join(logs.FORMATS)}")
    level = (env.get("CNPA_LOG_LEVEL") or "info").lower()
    if level not in logs.LEVELS:
        raise ConfigError(f"{named('CNPA_LOG_LEVEL', flags)}={level!r}: must be one of "
                          f"{', '.join(logs.LEVELS)}")
    return fmt, level


def main(env: dict | None = None, argv: list | tuple = ()) -> int:
    env = dict(os.environ if env is None else env)
    try:
        args = parser().parse_args(list(argv))
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
        conf = read_config(env, flags)
        settings = conf["settings"]
        # The audit log then tells which process sent a request (every host has the same user).
        user_agent = f"cnpa-controller/{conf['lease']['identity']}"
        if args.once or args.plan:
            # A pass needs no kubernetes client: its import alone costs more than an idle pass.
            # A pass's writes are fenced by the Lease as the controller's are: the same timeout.
            api = connect(conf["kubeconfig"],
                          timeout=settings.write_timeout or settings.request_timeout,
                          user_agent=user_agent, env=env)
        else:
            client = api_client(conf["kubeconfig"], settings.workers + 8, name=kubeconfig)
            client.user_agent = user_agent
    except ConfigError as exc:
        log.error("%s", exc)
        return EXIT_CONFIG
    except KubeconfigError as exc:
        log.error("%s: %s", kubeconfig, exc)
        return EXIT_CONFIG
    if args.once or args.plan:
        return one_pass(api, settings, conf["lease"] if conf["election"] else None,
                        plan_only=args.plan)
    # Only the long-running controller has metrics (prometheus_client: a pass starts faster).
    try:
        from .metrics import Metrics
    except ImportError as exc:
        log.error("%s", exc)
        return EXIT_CONFIG

    api = Api(client, timeout=settings.write_timeout or settings.request_timeout)
    metrics = Metrics()

    make_elector = None
    if conf["election"]:
        lease = conf["lease"]

        def make_elector(on_change):
            elector = None

            def changed(leading: bool) -> None:
                on_change(leading)
                # Who leads is news for people too (`kubectl describe lease`). Sent from a thread
                # of its own: the elector's thread must not wait on it to renew.
                threading.Thread(target=leader.lease_event, daemon=True, name="lease-event",
                                 args=(api, lease["namespace"], lease["name"], lease["identity"],
                                       leading),
                                 kwargs={"uid": elector.lease_uid if elector else ""}).start()

            elector = leader.Elector(api, lease["namespace"], lease["name"], lease["identity"],
                                     lease_seconds=lease["lease_seconds"],
                                     renew_seconds=lease["renew_seconds"],
                                     retry_seconds=lease["retry_seconds"], on_change=changed)
            return elector

    controller = Controller(api, settings, make_elector=make_elector, metrics=metrics)
    if conf["metrics_address"]:
        try:
            metrics.serve(*conf["metrics_address"],
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


def one_pass(api, settings: Settings, lease: dict | None, *, plan_only: bool) -> int:
    """--once / --plan: one pass from a fresh list (reconcile.sh's mode: passes on one host take
    turns on a lock). lease: the Lease the pass takes its turn on before it writes (None with
    --no-leader-election: it writes as the only writer)."""
    from .controller import utc_now
    from .once import run_pass

    def say(name: str, what: str) -> None:
        print(logs.write_line(name, what), flush=True)

    def plan_line(line: str) -> None:
        print(line)

    turn = None
    if lease is not None and not plan_only:
        turn = leader.PassTurn(api, lease["namespace"], lease["name"], lease["identity"],
                               lease_seconds=lease["lease_seconds"],
                               renew_seconds=lease["renew_seconds"],
                               retry_seconds=lease["retry_seconds"])
    try:
        return run_pass(api, settings, now=utc_now(), say=say, turn=turn,
                        plan_only=plan_line if plan_only else None)
    except Exception:
        log.exception("internal error; pass aborted:")
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main(argv=sys.argv[1:]))
