"""python3 -m cnpa_controller: cnpa-op's long-running TeamSpace controller.

Watches TeamSpaces, their namespaces and quotas, and reconciles each TeamSpace whose objects
changed with the plan (plan.py) and the executor every pass uses (executor.py). Runs until
SIGTERM or SIGINT, then finishes the passes under way, gives up its Lease and exits 0.

stdout (the journal): one line per write that went through ("teamspace NAME: WHAT"), as a pass
prints them. stderr: problems ("cnpa-op: TeamSpace NAME: MESSAGE") and the
controller's own news (caches synced, leadership, watches re-listed).

Environment (all optional; a pass, reconcile.sh's, reads the same):
  KUBECONFIG                  kubeconfig (default: ~/.kube/config, else in-cluster config)
  CNPA_BASE_DIR               base directory (default: /root/cnpa-op)
  CNPA_ARCHIVE_DIR            archive directory (default: $CNPA_BASE_DIR/archive; without
                              CNPA_BASE_DIR, /var/lib/cnpa-op/archive when this package is
                              installed in /opt/cnpa-op, else /root/cnpa-op/archive)
  CNPA_REQUEST_TIMEOUT        per-request timeout, e.g. 10s, 500ms, 1m (default: 10s)
  CNPA_EVENT_NAMESPACE        namespace of the Events recorded on TeamSpaces (default: default)
New with this controller:
  CNPA_ARCHIVE_NAMESPACE      also keep every archive record in the cluster, as ConfigMap
                              archive-UID in this namespace, before the finalizer is released
                              (default: off; with several controller hosts, a record then
                              outlives the host that wrote it)
  CNPA_RESYNC_SECONDS         every TeamSpace is re-checked this often, from the cache (default 300)
  CNPA_WORKERS                TeamSpaces reconciled at the same time (default 32, 1-64)
  CNPA_RETRY_MAX_SECONDS      cap of a failed TeamSpace's retry backoff (default 30; the backoff
                              starts at 0.5 s and doubles)
  CNPA_WATCH_TIMEOUT_SECONDS  server-side timeout of a watch before it is resumed (default 300,
                              jittered up to twice that)
  CNPA_LIST_PAGE_SIZE         objects per page of a full list (default 500)
  CNPA_LEADER_ELECTION        1: hold a coordination.k8s.io Lease, write only while leader;
                              0: this process is the only writer (default 1)
  CNPA_LEASE_NAMESPACE        namespace of the Lease (default: default; the role passes its own
                              namespace, cnpa-system, which a bare run cannot assume exists)
  CNPA_LEASE_NAME             name of the Lease (default: cnpa-op)
  CNPA_LEASE_IDENTITY         this process's identity in the Lease (default: HOSTNAME_RANDOM)
  CNPA_LEASE_SECONDS          lease duration (default 10)
  CNPA_RENEW_SECONDS          a leader that has not renewed for this long stops writing
                              (default 7; less than CNPA_LEASE_SECONDS)
  CNPA_LEASE_RETRY_SECONDS    interval of acquire/renew attempts (default 2; less than
                              CNPA_RENEW_SECONDS)
  CNPA_METRICS_ADDRESS        HOST:PORT to serve Prometheus metrics on /metrics, and /healthz
                              and /readyz (default: off)
  CNPA_METRICS_TEXTFILE       file for node_exporter's textfile collector, rewritten every
                              CNPA_METRICS_TEXTFILE_SECONDS (default 15) (default: off)

Exit status: 0 stopped by a signal; 3 bad configuration (the message names the variable);
4 the archive directory is missing or was replaced (as a pass: systemd restarts the
service, whose sandbox then binds the directory anew).

--once: one pass over every TeamSpace from a fresh list, with this controller's executor, no
leader election, then exit as reconcile.sh does (0 converged or converging, 1 some TeamSpace
failed, 2 the API server could not be read, 3 bad configuration or internal error, 4 the
archive directory is broken): what reconcile.sh runs, under its lock and deadline. --plan: that
pass's writes as JSON lines, nothing written. Neither imports the kubernetes client (api.connect).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import sys
import threading
import traceback
import uuid

from . import leader
from .api import Api, KubeconfigError, TokenFile, connect, token_file_of
from .controller import EXIT_CONFIG, Controller, Settings, default_archive_dir


class ConfigError(Exception):
    pass


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
           integer: bool = False) -> float:
    text = env.get(var, "")
    if text == "":
        return default
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        kind = "a whole number" if integer else "a number"
        raise ConfigError(f"{var}={text!r}: must be {kind} from {low:g} to {high:g}")
    return value


def namespace_name(env: dict, var: str, default: str) -> str:
    value = env.get(var) or default
    if len(value) > 63 or not _DNS_LABEL.fullmatch(value):
        raise ConfigError(f"{var}={value!r}: must be a namespace name (a DNS label)")
    return value


def read_config(env: dict) -> dict:
    """Every setting, checked; ConfigError names the first bad variable."""
    archive = env.get("CNPA_ARCHIVE_DIR") or default_archive_dir(env.get("CNPA_BASE_DIR") or "")
    if not os.path.isabs(archive):
        raise ConfigError(f"CNPA_ARCHIVE_DIR={archive!r}: must be an absolute path")
    d = Settings
    settings = Settings(
        archive_dir=archive,
        event_namespace=namespace_name(env, "CNPA_EVENT_NAMESPACE", d.event_namespace),
        archive_namespace=(namespace_name(env, "CNPA_ARCHIVE_NAMESPACE", "")
                           if env.get("CNPA_ARCHIVE_NAMESPACE") else ""),
        request_timeout=(duration("CNPA_REQUEST_TIMEOUT", env["CNPA_REQUEST_TIMEOUT"])
                         if env.get("CNPA_REQUEST_TIMEOUT") else d.request_timeout),
        resync_seconds=number(env, "CNPA_RESYNC_SECONDS", d.resync_seconds, 1, 86400),
        workers=int(number(env, "CNPA_WORKERS", d.workers, 1, 64, integer=True)),
        retry_max_seconds=number(env, "CNPA_RETRY_MAX_SECONDS", d.retry_max_seconds, 0.5, 3600),
        watch_timeout_seconds=int(number(env, "CNPA_WATCH_TIMEOUT_SECONDS",
                                         d.watch_timeout_seconds, 10, 3600, integer=True)),
        list_page_size=int(number(env, "CNPA_LIST_PAGE_SIZE", d.list_page_size, 1, 10000,
                                  integer=True)),
        metrics_textfile=env.get("CNPA_METRICS_TEXTFILE") or "",
        metrics_textfile_seconds=number(env, "CNPA_METRICS_TEXTFILE_SECONDS",
                                        d.metrics_textfile_seconds, 1, 3600),
    )
    election = env.get("CNPA_LEADER_ELECTION", "1")
    if election not in ("0", "1"):
        raise ConfigError(f"CNPA_LEADER_ELECTION={election!r}: must be 0 or 1")
    lease = {
        "namespace": namespace_name(env, "CNPA_LEASE_NAMESPACE", leader.LEASE_NAMESPACE),
        "name": env.get("CNPA_LEASE_NAME") or leader.LEASE_NAME,
        "identity": env.get("CNPA_LEASE_IDENTITY")
        or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}",
        # Whole seconds: the Lease's leaseDurationSeconds is an integer, and a fraction cut off
        # there would let another host take over before this one stops writing.
        "lease_seconds": number(env, "CNPA_LEASE_SECONDS", leader.LEASE_SECONDS, 2, 3600,
                                integer=True),
        "renew_seconds": number(env, "CNPA_RENEW_SECONDS", leader.RENEW_SECONDS, 1, 3600),
        "retry_seconds": number(env, "CNPA_LEASE_RETRY_SECONDS", leader.RETRY_SECONDS, 0.1, 3600),
    }
    # It is sent in the User-Agent header too: printable ASCII only, or every request fails.
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,128}", lease["identity"]):
        raise ConfigError(f"CNPA_LEASE_IDENTITY={lease['identity']!r}: must be 1-128 of "
                          "A-Z a-z 0-9 . _ -")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", lease["name"]) or len(lease["name"]) > 253:
        raise ConfigError(f"CNPA_LEASE_NAME={lease['name']!r}: must be an object name")
    if not lease["retry_seconds"] < lease["renew_seconds"] < lease["lease_seconds"]:
        raise ConfigError("CNPA_LEASE_RETRY_SECONDS < CNPA_RENEW_SECONDS < CNPA_LEASE_SECONDS must "
                          f"hold (got {lease['retry_seconds']:g}, {lease['renew_seconds']:g}, "
                          f"{lease['lease_seconds']:g})")
    metrics_address = None
    text = env.get("CNPA_METRICS_ADDRESS") or ""
    if text:
        host, _colon, port = text.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"CNPA_METRICS_ADDRESS={text!r}: must be HOST:PORT")
        metrics_address = (host.strip("[]"), int(port))
    if election == "1":
        settings.not_leader_retry_seconds = lease["retry_seconds"]
        # A write checked against the fence just before it lapses must land before another
        # host can take over (lease - renew seconds later), or it could land after that host's.
        settings.write_timeout = min(settings.request_timeout,
                                     lease["lease_seconds"] - lease["renew_seconds"])
    return {"settings": settings, "election": election == "1", "lease": lease,
            "metrics_address": metrics_address, "kubeconfig": env.get("KUBECONFIG") or ""}


def api_client(kubeconfig: str, pool_size: int):
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
            raise ConfigError(f"KUBECONFIG={path!r}: cannot load it: {exc}") from exc
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


def log_to_stderr() -> None:
    """The elector says who leads through `logging`; unconfigured, Python would drop its INFO
    lines (leader and transitions belong in the journal) and print its warnings without a prefix."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("cnpa-op: %(message)s"))
    root = logging.getLogger("cnpa_controller")
    if not root.handlers:  # main() may run more than once in one interpreter (tests)
        root.addHandler(handler)
    root.setLevel(logging.INFO)


USAGE = "usage: python3 -m cnpa_controller [--once | --plan]"


def main(env: dict | None = None, argv: list | tuple = ()) -> int:
    env = dict(os.environ if env is None else env)
    log_to_stderr()
    if len(argv) > 1 or (argv and argv[0] not in ("--once", "--plan")):
        print(f"cnpa-op: {USAGE}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        conf = read_config(env)
        settings = conf["settings"]
        # The audit log then tells which process sent a request (every host has the same user).
        user_agent = f"cnpa-controller/{conf['lease']['identity']}"
        if argv:
            # A pass needs no kubernetes client: its import alone costs more than an idle pass.
            api = connect(conf["kubeconfig"], timeout=settings.request_timeout,
                          user_agent=user_agent, env=env)
        else:
            client = api_client(conf["kubeconfig"], settings.workers + 8)
            client.user_agent = user_agent
    except (ConfigError, KubeconfigError) as exc:
        print(f"cnpa-op: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if argv:
        return one_pass(api, settings, plan_only=argv[0] == "--plan")
    # Only the long-running controller has metrics (prometheus_client: a pass starts faster).
    try:
        from .metrics import Metrics
    except ImportError as exc:
        print(f"cnpa-op: {exc}", file=sys.stderr)
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
            print(f"cnpa-op: CNPA_METRICS_ADDRESS: cannot serve there: {exc}", file=sys.stderr)
            return EXIT_CONFIG

    def on_signal(signum, frame):
        # Nothing else here: a handler that logged could wait forever on the print lock the
        # interrupted main thread holds. run() says that it stops.
        controller.stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return controller.run()


def one_pass(api, settings: Settings, *, plan_only: bool) -> int:
    """--once / --plan: one pass from a fresh list, no leader election (reconcile.sh's mode: the
    lab's one host, passes taking turns on a lock)."""
    from .controller import utc_now
    from .once import run_pass

    def say(name: str, what: str) -> None:
        print(f"teamspace {name}: {what}", flush=True)

    def log(msg: str) -> None:
        print(f"cnpa-op: {msg}", file=sys.stderr, flush=True)

    def plan_line(line: str) -> None:
        print(line)

    try:
        return run_pass(api, archive_dir=settings.archive_dir,
                        event_namespace=settings.event_namespace,
                        archive_namespace=settings.archive_namespace,
                        page_size=settings.list_page_size, request_timeout=settings.request_timeout,
                        workers=settings.workers, now=utc_now(), say=say, log=log,
                        plan_only=plan_line if plan_only else None)
    except Exception:
        log(f"internal error; pass aborted:\n{traceback.format_exc()}")
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main(argv=sys.argv[1:]))
