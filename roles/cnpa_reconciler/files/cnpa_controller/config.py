"""Every setting of a pass and of the long-running controller, its default, and how it is read.

The one place defaults are written: Settings and LeaseSettings hold them, OPTIONS is every flag
with its environment variable (and the --help line, which quotes the defaults), read_config()
reads the variables over the defaults and checks each (ConfigError names the flag or variable),
and the exit statuses and install paths every mode shares are here too. Every mode imports this
module; it imports nothing of the package but the request timeout's default (api) and the log
formats (logs). The role's defaults are checked against these by a unit test of the source repository.
"""

from __future__ import annotations

import os
import re
import socket
import uuid
from dataclasses import dataclass, field

from . import logs
from .api import DEFAULT_TIMEOUT

# Exit statuses of every mode (reconcile.sh adds 75, the lock, and 124, the deadline).
EXIT_OK = 0           # converged or converging; the controller: stopped by a signal
EXIT_FAILED = 1       # some TeamSpace failed, or the pass lost or may not read the Lease
EXIT_UNREADABLE = 2   # the API server could not be read: nothing written
EXIT_CONFIG = 3       # bad configuration or internal error
EXIT_ARCHIVE = 4      # the archive directory is missing or was replaced

# The lab's base directory (the lab's specification: /root/cnpa-op); the archive is ARCHIVE beneath it.
BASE_DIR = "/root/cnpa-op"
ARCHIVE = "archive"
# The role's system layout (cnpa_layout=system, the controller-only install): the code here, the
# records apart from it, where the FHS keeps a service's state.
SYSTEM_BASE_DIR = "/opt/cnpa-op"
SYSTEM_ARCHIVE_DIR = "/var/lib/cnpa-op/archive"
# The directory this package is installed in (reconcile.sh's, the unit's working directory).
INSTALLED_IN = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The Lease's defaults, the role's too: a leader that stops renewing is replaced about
# LEASE_SECONDS + RETRY_SECONDS later (the benchmark's "Leader lost"). The Lease lives in the
# role's namespace, so that every writer, installed or run by hand, takes turns on the same one;
# where that namespace does not exist, no controller can hold it (turn.PassTurn).
LEASE_NAMESPACE, LEASE_NAME = "cnpa-system", "cnpa-op"
LEASE_SECONDS, RENEW_SECONDS, RETRY_SECONDS = 10, 7, 2
# The least time a leader's write may take (lease - renew seconds; see read_config).
MIN_WRITE_SECONDS = 1.0
# What one pass may take (reconcile.sh's CNPA_PASS_DEADLINE default): --until makes no pass
# after max-passes times this.
PASS_SECONDS = 60


def default_archive_dir(base_dir: str = "", installed_in: str = INSTALLED_IN) -> str:
    """Where records go unless CNPA_ARCHIVE_DIR says: beneath CNPA_BASE_DIR when that is given;
    otherwise where the install this package belongs to keeps them, so that a pass run by hand
    archives where the installed unit does."""
    if base_dir:
        return os.path.join(base_dir, ARCHIVE)
    if installed_in == SYSTEM_BASE_DIR:
        return SYSTEM_ARCHIVE_DIR
    return os.path.join(BASE_DIR, ARCHIVE)


class ConfigError(Exception):
    pass


@dataclass(frozen=True)
class LeaseSettings:
    """The Lease every writer takes turns on, and this process's identity in it."""

    identity: str = ""
    namespace: str = LEASE_NAMESPACE
    name: str = LEASE_NAME
    lease_seconds: float = LEASE_SECONDS
    renew_seconds: float = RENEW_SECONDS
    retry_seconds: float = RETRY_SECONDS


@dataclass
class Settings:
    """Every setting of a pass and of the long-running controller, with its default."""

    archive_dir: str
    event_namespace: str = "default"
    archive_namespace: str = ""  # "": records only on this host's disk
    # A name that found this process not leading is looked at again after this long (about a
    # renewal of the Lease: CNPA_LEASE_RETRY_SECONDS).
    not_leader_retry_seconds: float = 2.0
    request_timeout: float = DEFAULT_TIMEOUT
    # The executor's writes time out sooner with leader election (read_config): 0, request_timeout.
    write_timeout: float = 0.0
    resync_seconds: float = 300.0
    workers: int = 32
    retry_max_seconds: float = 30.0
    watch_timeout_seconds: int = 300
    # /readyz fails once a cache's list or watch has failed for this long in a row (cache.py).
    cache_stale_seconds: float = 30.0
    list_page_size: int = 500
    metrics_textfile: str = ""
    metrics_textfile_seconds: float = 15.0
    metrics_address: tuple[str, int] | None = None   # None: no HTTP endpoint
    kubeconfig: str = ""   # "": ~/.kube/config, else the in-cluster config (api.connect)
    election: bool = True   # False: write as the only writer, no Lease
    lease: LeaseSettings = field(default_factory=LeaseSettings)

    @property
    def user_agent(self) -> str:
        # The audit log then tells which process sent a request (every host has the same user).
        return f"cnpa-controller/{self.lease.identity}" if self.lease.identity else "cnpa-controller"

    @property
    def timeout(self) -> float:
        """Every request's timeout but the lists' and watches': the write timeout when set."""
        return self.write_timeout or self.request_timeout


PASS, WATCH = "settings of a pass and of the controller", "settings of the long-running controller"
_D = Settings
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
     f"per-request timeout, e.g. 10s, 500ms, 1m (default: {_D.request_timeout:g}s)", PASS),
    ("--event-namespace", "CNPA_EVENT_NAMESPACE", "NAMESPACE",
     f"namespace of the Events recorded on TeamSpaces (default: {_D.event_namespace})", PASS),
    ("--archive-namespace", "CNPA_ARCHIVE_NAMESPACE", "NAMESPACE",
     "also keep every archive record in the cluster, as ConfigMap archive-UID in this "
     "namespace, before the finalizer is released (default: off; with several controller "
     "hosts, a record then outlives the host that wrote it)", PASS),
    ("--workers", "CNPA_WORKERS", "N",
     f"TeamSpaces reconciled at the same time, 1-64 (default: {_D.workers})", PASS),
    ("--list-page-size", "CNPA_LIST_PAGE_SIZE", "N",
     f"objects per page of a full list, 1-10000 (default: {_D.list_page_size})", PASS),
    ("--log-format", "CNPA_LOG_FORMAT", "{" + ",".join(logs.FORMATS) + "}",
     "stderr's lines: text, or one JSON object per line (default: text)", PASS),
    ("--log-level", "CNPA_LOG_LEVEL", "{" + ",".join(logs.LEVELS) + "}",
     "the least level logged on stderr (default: info)", PASS),
    ("--resync-seconds", "CNPA_RESYNC_SECONDS", "SECONDS",
     "every TeamSpace is checked again this often, from the caches, 1-86400 "
     f"(default: {_D.resync_seconds:g})", WATCH),
    ("--cache-stale-seconds", "CNPA_CACHE_STALE_SECONDS", "SECONDS",
     "/readyz fails once a cache's list or watch has failed for this long in a row, 5-3600 "
     f"(default: {_D.cache_stale_seconds:g})", WATCH),
    ("--retry-max-seconds", "CNPA_RETRY_MAX_SECONDS", "SECONDS",
     "the longest wait before a failed TeamSpace is retried (the wait starts at 0.5 s and "
     "doubles) "
     f"(default: {_D.retry_max_seconds:g})", WATCH),
    ("--watch-timeout-seconds", "CNPA_WATCH_TIMEOUT_SECONDS", "SECONDS",
     "server-side timeout of a watch before it is resumed, 10-3600, jittered up to twice that "
     f"(default: {_D.watch_timeout_seconds})", WATCH),
    ("--leader-election", "CNPA_LEADER_ELECTION", None,
     "hold a coordination.k8s.io Lease and write only while holding it: the controller as long "
     "as it leads, a pass for its writes, after any other holder has stopped renewing it "
     "(variable: 1); or write as the only writer (0) (default: on)", PASS),
    ("--lease-namespace", "CNPA_LEASE_NAMESPACE", "NAMESPACE",
     f"namespace of the Lease (default: {LEASE_NAMESPACE}, the role's; where it does not "
     "exist nobody can hold the Lease, and a pass writes without it)", PASS),
    ("--lease-name", "CNPA_LEASE_NAME", "NAME", f"name of the Lease (default: {LEASE_NAME})",
     PASS),
    ("--lease-identity", "CNPA_LEASE_IDENTITY", "ID",
     "this process's identity in the Lease and its User-Agent, 1-128 of A-Z a-z 0-9 . _ - "
     "(default: HOSTNAME_RANDOM)", PASS),
    ("--lease-seconds", "CNPA_LEASE_SECONDS", "SECONDS",
     f"lease duration, whole seconds (default: {LEASE_SECONDS})", PASS),
    ("--renew-seconds", "CNPA_RENEW_SECONDS", "SECONDS",
     "a leader that has not renewed for this long stops writing; at least "
     f"{MIN_WRITE_SECONDS:g} s less than --lease-seconds (default: {RENEW_SECONDS})", PASS),
    ("--lease-retry-seconds", "CNPA_LEASE_RETRY_SECONDS", "SECONDS",
     f"the Lease is acquired or renewed this often; less than --renew-seconds "
     f"(default: {RETRY_SECONDS})", PASS),
    ("--metrics-address", "CNPA_METRICS_ADDRESS", "HOST:PORT",
     "serve Prometheus metrics on /metrics there, and /healthz and /readyz (default: off; "
     "the role serves them on 127.0.0.1:9808)", WATCH),
    ("--metrics-textfile", "CNPA_METRICS_TEXTFILE", "PATH",
     "file for node_exporter's textfile collector (default: off)", WATCH),
    ("--metrics-textfile-seconds", "CNPA_METRICS_TEXTFILE_SECONDS", "SECONDS",
     f"how often that file is rewritten (default: {_D.metrics_textfile_seconds:g})", WATCH),
)


def named(var: str, flags: dict) -> str:
    """How a message names a setting: by the flag that set it, else by its variable."""
    return flags.get(var, var)


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


class _Reader:
    """The variables of env, each checked as it is read; a message names the flag that set one
    (flags: variable -> flag), else the variable."""

    def __init__(self, env: dict, flags: dict) -> None:
        self.env, self.flags = env, flags

    def name(self, var: str) -> str:
        return named(var, self.flags)

    def num(self, var: str, default: float, low: float, high: float, integer: bool = False) -> float:
        return number(self.env, var, default, low, high, integer=integer, name=self.name(var))

    def namespace(self, var: str, default: str) -> str:
        return namespace_name(self.env, var, default, name=self.name(var))


def _lease(r: _Reader) -> LeaseSettings:
    env, name = r.env, r.name
    lease = LeaseSettings(
        namespace=r.namespace("CNPA_LEASE_NAMESPACE", LEASE_NAMESPACE),
        name=env.get("CNPA_LEASE_NAME") or LEASE_NAME,
        identity=env.get("CNPA_LEASE_IDENTITY") or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}",
        # Whole seconds: the Lease's leaseDurationSeconds is an integer, and a fraction cut off
        # there would let another host take over before this one stops writing.
        lease_seconds=r.num("CNPA_LEASE_SECONDS", LEASE_SECONDS, 2, 3600, integer=True),
        renew_seconds=r.num("CNPA_RENEW_SECONDS", RENEW_SECONDS, 1, 3600),
        retry_seconds=r.num("CNPA_LEASE_RETRY_SECONDS", RETRY_SECONDS, 0.1, 3600),
    )
    # It is sent in the User-Agent header too: printable ASCII only, or every request fails.
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,128}", lease.identity):
        raise ConfigError(f"{name('CNPA_LEASE_IDENTITY')}={lease.identity!r}: must be 1-128 of "
                          "A-Z a-z 0-9 . _ -")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", lease.name) or len(lease.name) > 253:
        raise ConfigError(f"{name('CNPA_LEASE_NAME')}={lease.name!r}: must be an object name")
    if not lease.retry_seconds < lease.renew_seconds < lease.lease_seconds:
        raise ConfigError(f"{name('CNPA_LEASE_RETRY_SECONDS')} < {name('CNPA_RENEW_SECONDS')} < "
                          f"{name('CNPA_LEASE_SECONDS')} must hold (got {lease.retry_seconds:g}, "
                          f"{lease.renew_seconds:g}, {lease.lease_seconds:g})")
    # A write checked against the fence just before it lapses is sent with lease - renew seconds
    # to land (the write timeout below): less than MIN_WRITE_SECONDS passes validation only to
    # fail every write of a leader whose API server is a few hundred milliseconds away.
    if lease.lease_seconds - lease.renew_seconds < MIN_WRITE_SECONDS:
        raise ConfigError(f"{name('CNPA_LEASE_SECONDS')} - {name('CNPA_RENEW_SECONDS')} must be at "
                          f"least {MIN_WRITE_SECONDS:g} s: it is how long a leader's write may take "
                          f"(got {lease.lease_seconds:g} - {lease.renew_seconds:g})")
    return lease


def read_config(env: dict, flags: dict | None = None) -> Settings:
    """Every setting, checked; ConfigError names the first bad one: its flag if flags (variable
    -> flag) says a flag set it, else its variable."""
    r = _Reader(env, flags or {})
    name, num, namespace = r.name, r.num, r.namespace
    archive = env.get("CNPA_ARCHIVE_DIR") or default_archive_dir(env.get("CNPA_BASE_DIR") or "")
    if not os.path.isabs(archive):
        raise ConfigError(f"{name('CNPA_ARCHIVE_DIR')}={archive!r}: must be an absolute path")
    election = env.get("CNPA_LEADER_ELECTION", "1")
    if election not in ("0", "1"):
        raise ConfigError(f"CNPA_LEADER_ELECTION={election!r}: must be 0 or 1")
    text = env.get("CNPA_METRICS_ADDRESS") or ""
    settings = Settings(
        archive_dir=archive,
        event_namespace=namespace("CNPA_EVENT_NAMESPACE", _D.event_namespace),
        archive_namespace=(namespace("CNPA_ARCHIVE_NAMESPACE", "")
                           if env.get("CNPA_ARCHIVE_NAMESPACE") else ""),
        request_timeout=(duration(name("CNPA_REQUEST_TIMEOUT"), env["CNPA_REQUEST_TIMEOUT"])
                         if env.get("CNPA_REQUEST_TIMEOUT") else _D.request_timeout),
        resync_seconds=num("CNPA_RESYNC_SECONDS", _D.resync_seconds, 1, 86400),
        workers=int(num("CNPA_WORKERS", _D.workers, 1, 64, integer=True)),
        retry_max_seconds=num("CNPA_RETRY_MAX_SECONDS", _D.retry_max_seconds, 0.5, 3600),
        cache_stale_seconds=num("CNPA_CACHE_STALE_SECONDS", _D.cache_stale_seconds, 5, 3600),
        watch_timeout_seconds=int(num("CNPA_WATCH_TIMEOUT_SECONDS", _D.watch_timeout_seconds, 10,
                                      3600, integer=True)),
        list_page_size=int(num("CNPA_LIST_PAGE_SIZE", _D.list_page_size, 1, 10000, integer=True)),
        metrics_textfile=env.get("CNPA_METRICS_TEXTFILE") or "",
        metrics_textfile_seconds=num("CNPA_METRICS_TEXTFILE_SECONDS", _D.metrics_textfile_seconds,
                                     1, 3600),
        metrics_address=listen_address(name("CNPA_METRICS_ADDRESS"), text) if text else None,
        kubeconfig=env.get("KUBECONFIG") or "",
        election=election == "1",
        lease=_lease(r),
    )
    if settings.election:
        lease = settings.lease
        settings.not_leader_retry_seconds = lease.retry_seconds
        # A write checked against the fence just before it lapses must land before another
        # host can take over (lease - renew seconds later), or it could land after that host's.
        settings.write_timeout = min(settings.request_timeout,
                                     lease.lease_seconds - lease.renew_seconds)
    return settings


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
