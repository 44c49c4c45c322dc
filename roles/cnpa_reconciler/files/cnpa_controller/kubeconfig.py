"""What a kubeconfig (or the in-cluster ServiceAccount) says about reaching the API server: the
one place either is read (resolve), for every mode, without the kubernetes client.

A Target is the current context's server and how to trust it (certificate-authority,
insecure-skip-tls-verify, tls-server-name, an http:// proxy-url), and the user's credentials as
client-go reads them: a client certificate, a tokenFile (read again when it changes and after a
401: TokenFile), a token, basic auth, or an exec plugin (client.authentication.k8s.io
ExecCredential: a token or a client certificate, kept until its expirationTimestamp and fetched
again after a 401: ExecCredential). Refused by name: auth-provider (deprecated, and removed from
kubectl), impersonation (as, as-groups, ...) and proxies other than http://.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import urlsplit

IN_CLUSTER = "/var/run/secrets/kubernetes.io/serviceaccount"
# What the kubernetes client or kubectl would send for these, and we do not.
REFUSED = ("auth-provider", "as", "as-groups", "as-uid", "as-user-extra")
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
# A plugin that has not answered in this long has failed (client-go waits without bound; a
# worker must not).
EXEC_TIMEOUT = 60.0


class KubeconfigError(ValueError):
    """A kubeconfig that cannot be read, or asks for what this package does not do."""


def _load_document(path: str) -> dict:
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    try:
        import yaml  # python3-yaml on Debian
    except ImportError:
        doc = _json_of(path, text)
    else:
        try:
            doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        except yaml.YAMLError as exc:
            raise KubeconfigError(f"{path}: not YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise KubeconfigError(f"{path}: not a kubeconfig (no mapping at the top)")
    return doc


def _json_of(path: str, text: str) -> Any:
    """Without PyYAML (a bare python3): a JSON kubeconfig as it is, a YAML one as kubectl (which
    the lab's host has) converts it."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        out = subprocess.run(["kubectl", "--kubeconfig", path, "config", "view", "--raw",
                              "-o", "json"], capture_output=True, text=True, timeout=30,
                             check=True).stdout
        return json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise KubeconfigError(f"{path}: reading YAML needs PyYAML (python3-yaml) or kubectl: "
                              f"{exc}") from None


def kubeconfig_entries(kubeconfig: str) -> tuple[dict, str, dict, str]:
    """The current context's cluster and user, and the directory of the file each came from
    (their relative paths are relative to it). KUBECONFIG may list several files, merged as
    kubectl merges them: the first file that names an entry or the current context wins, and a
    listed file that does not exist is skipped."""
    paths = [p for p in kubeconfig.split(os.pathsep) if p]
    docs = [(os.path.dirname(os.path.abspath(p)), _load_document(p)) for p in paths
            if len(paths) == 1 or os.path.exists(p)]
    current = next((d.get("current-context") for _path, d in docs if d.get("current-context")), "")
    if not current:
        raise KubeconfigError(f"{kubeconfig}: no current-context")

    def entry(section: str, name: str) -> tuple[dict, str]:
        for base, d in docs:
            for e in d.get(section) or []:
                if isinstance(e, dict) and e.get("name") == name:
                    return e.get(section[:-1]) or {}, base
        raise KubeconfigError(f"{kubeconfig}: no {section[:-1]} named {name!r}")

    context, _context_dir = entry("contexts", current)
    cluster, cluster_dir = entry("clusters", context.get("cluster", ""))
    user, user_dir = entry("users", context.get("user", "")) if context.get("user") else ({}, "")
    return cluster, cluster_dir, user, user_dir


class TokenFile:
    """Keeps a bearer token equal to the contents of a token file.

    The role's token unit rewrites the file before the token expires, so a long-running process
    must read it again. The file is looked at (stat) at most every `check_seconds`, read again
    when it changed, and at the next request after a 401 (stale()), as client-go's cached file
    token source does."""

    def __init__(self, path: str, check_seconds: float = 1.0, clock=time.monotonic) -> None:
        self.path = path
        self.check_seconds = check_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._next_check = float("-inf")
        self._seen: tuple | None = None
        self.token = ""
        self.reads = 0

    def stale(self) -> None:
        with self._lock:
            self._next_check, self._seen = float("-inf"), None

    def current(self) -> str:
        """The token ("" until the file has been read once)."""
        with self._lock:
            now = self._clock()
            if now < self._next_check:
                return self.token
            self._next_check = now + self.check_seconds
            try:
                st = os.stat(self.path)
                seen = (st.st_ino, st.st_mtime_ns, st.st_size)
                if seen == self._seen:
                    return self.token
                with open(self.path, encoding="utf-8") as fh:
                    token = fh.read().strip()
            except OSError:
                return self.token  # renewed by rename: a moment without the file keeps the token we have
            if token:
                self._seen = seen
                self.reads += 1
                self.token = token
            return self.token


@dataclass(frozen=True)
class Credential:
    """What an exec plugin returned: a token, or a client certificate and key (PEM)."""

    token: str = ""
    cert: bytes = b""
    key: bytes = b""
    expires: float | None = None   # Unix time; None: until a 401


def _unix_time(text: str) -> float:
    """An RFC 3339 time (expirationTimestamp) as Unix time."""
    text = text.strip().replace("Z", "+00:00").replace("z", "+00:00")
    if "." in text:   # fromisoformat before 3.11 takes exactly 3 or 6 digits of a fraction
        head, rest = text.split(".", 1)
        digits = len(rest) - len(rest.lstrip("0123456789"))
        text = f"{head}.{rest[:digits][:6].ljust(6, '0')}{rest[digits:]}"
    when = datetime.datetime.fromisoformat(text)
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()


class ExecCredential:
    """A kubeconfig user's exec plugin, run as client-go runs it: its command (a relative path
    is relative to the kubeconfig's directory, a bare name is looked up in PATH) with its args
    and env, KUBERNETES_EXEC_INFO naming the ExecCredential apiVersion, never interactive (there
    is no terminal), the cluster's settings included when it asks for them (provideClusterInfo).
    Its credential is kept until its expirationTimestamp (or a 401 with it: stale()), then
    fetched again; one run at a time."""

    def __init__(self, config: dict, cwd: str, cluster: dict, *, clock=time.time,
                 run: Callable[..., Any] = subprocess.run) -> None:
        if not config.get("command"):
            raise KubeconfigError("exec: no command")
        if config.get("apiVersion") not in EXEC_API_VERSIONS:
            raise KubeconfigError(f"exec: apiVersion {config.get('apiVersion')!r} is not one of "
                                  f"{', '.join(EXEC_API_VERSIONS)}")
        if config.get("interactiveMode") == "Always":
            raise KubeconfigError("exec: interactiveMode Always needs a terminal, and the "
                                  "controller has none")
        self.config, self.cwd, self.cluster = config, cwd, cluster
        self._clock, self._run = clock, run
        self._lock = threading.Lock()
        self._cached: Credential | None = None
        self.runs = 0

    def current(self) -> Credential:
        with self._lock:
            cached = self._cached
            if cached is None or (cached.expires is not None and self._clock() >= cached.expires):
                cached = self._cached = self._fetch()
            return cached

    def stale(self, used: Credential | None) -> None:
        """A request made with `used` was refused (401): the next request runs the plugin again,
        unless another has done so meanwhile."""
        with self._lock:
            if used is not None and used is self._cached:
                self._cached = None

    def _fetch(self) -> Credential:
        c = self.config
        api_version = c["apiVersion"]
        spec: dict = {"interactive": False}
        if c.get("provideClusterInfo"):
            spec["cluster"] = self.cluster
        env = dict(os.environ)
        env.update({str(e.get("name")): str(e.get("value", "")) for e in c.get("env") or []})
        env["KUBERNETES_EXEC_INFO"] = json.dumps({"apiVersion": api_version,
                                                  "kind": "ExecCredential", "spec": spec})
        command = str(c["command"])
        if os.sep in command and not os.path.isabs(command):
            command = os.path.join(self.cwd, command)   # as client-go resolves it; else $PATH
        argv = [command, *(str(a) for a in c.get("args") or [])]
        self.runs += 1
        try:
            proc = self._run(argv, env=env, stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=EXEC_TIMEOUT, check=False)
        except FileNotFoundError:
            hint = c.get("installHint") or ""
            raise KubeconfigError(f"exec: {argv[0]}: not found{'; ' + hint if hint else ''}") \
                from None
        except (OSError, subprocess.SubprocessError) as exc:
            raise KubeconfigError(f"exec: {argv[0]}: {exc}") from None
        if proc.returncode != 0:
            raise KubeconfigError(f"exec: {argv[0]} exited {proc.returncode}: "
                                  f"{(proc.stderr or '').strip()[:500]}")
        try:
            doc = json.loads(proc.stdout)
            status = doc["status"]
            if doc.get("apiVersion") != api_version or doc.get("kind") != "ExecCredential":
                raise KubeconfigError(f"exec: {argv[0]} answered {doc.get('kind')} "
                                      f"{doc.get('apiVersion')}, not ExecCredential {api_version}")
            cred = Credential(token=status.get("token") or "",
                              cert=(status.get("clientCertificateData") or "").encode(),
                              key=(status.get("clientKeyData") or "").encode(),
                              expires=(_unix_time(status["expirationTimestamp"])
                                       if status.get("expirationTimestamp") else None))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise KubeconfigError(f"exec: {argv[0]}: not an ExecCredential: {exc}") from None
        if bool(cred.cert) != bool(cred.key) or not (cred.token or cred.cert):
            raise KubeconfigError(f"exec: {argv[0]} returned neither a token nor a client "
                                  "certificate and its key")
        return cred


@dataclass
class Target:
    """Where the API server is and how to reach it, as the kubeconfig says."""

    source: str   # the kubeconfig (or the in-cluster directory): how messages name it
    server: str
    ca: bytes | None = None
    insecure: bool = False
    server_name: str = ""   # tls-server-name: the name its certificate is checked against
    proxy: str = ""   # an http:// proxy the connection tunnels through (CONNECT)
    cert: bytes | None = None
    key: bytes | None = None
    authorization: str = ""   # a fixed Authorization header (token, basic)
    token_file: TokenFile | None = None
    exec: ExecCredential | None = None


def resolve(kubeconfig: str = "", env: dict | None = None) -> Target:
    """The Target of the current context of a kubeconfig (KUBECONFIG's list of files, or
    ~/.kube/config, or the in-cluster ServiceAccount when neither exists and the process runs in
    a pod, as the kubernetes client falls back to it). Raises KubeconfigError naming what is
    wrong."""
    env = os.environ if env is None else env
    default = os.path.expanduser("~/.kube/config")
    source = kubeconfig or default
    if not kubeconfig and not os.path.exists(default) and env.get("KUBERNETES_SERVICE_HOST"):
        source = IN_CLUSTER
        host = f"https://{env['KUBERNETES_SERVICE_HOST']}:{env.get('KUBERNETES_SERVICE_PORT', '443')}"
        cluster, user = {"server": host, "certificate-authority": f"{IN_CLUSTER}/ca.crt"}, \
            {"tokenFile": f"{IN_CLUSTER}/token"}
        cluster_dir = user_dir = "/"
    else:
        try:
            cluster, cluster_dir, user, user_dir = kubeconfig_entries(source)
        except OSError as exc:
            raise KubeconfigError(f"{source}: {exc.strerror}") from None
    refused = [k for k in REFUSED if user.get(k)]
    if refused:
        raise KubeconfigError(f"{source}: {', '.join(refused)} in the current context is not "
                              "supported")

    def data(entry: dict, key: str, base: str) -> bytes | None:
        try:
            if entry.get(f"{key}-data"):
                return base64.b64decode(entry[f"{key}-data"])
            if entry.get(key):
                with open(os.path.join(base, entry[key]), "rb") as fh:
                    return fh.read()
        except (OSError, ValueError) as exc:
            raise KubeconfigError(f"{source}: {key}: {exc}") from None
        return None

    server = str(cluster.get("server", ""))
    proxy = str(cluster.get("proxy-url") or "")
    if proxy and not (urlsplit(proxy).scheme == "http" and server.startswith("https://")):
        raise KubeconfigError(f"{source}: proxy-url {proxy!r}: only an http:// proxy to an "
                              "https:// server is supported")
    target = Target(source=source, server=server, insecure=bool(cluster.get("insecure-skip-tls-verify")),
                    server_name=str(cluster.get("tls-server-name") or ""), proxy=proxy,
                    ca=data(cluster, "certificate-authority", cluster_dir),
                    cert=data(user, "client-certificate", user_dir),
                    key=data(user, "client-key", user_dir))
    # tokenFile before token, as client-go reads a kubeconfig.
    if user.get("tokenFile"):
        target.token_file = TokenFile(os.path.join(user_dir, user["tokenFile"]))
    elif user.get("token"):
        target.authorization = f"Bearer {user['token']}"
    elif user.get("username"):
        pair = f"{user['username']}:{user.get('password', '')}".encode()
        target.authorization = f"Basic {base64.b64encode(pair).decode()}"
    if user.get("exec"):
        info = {"server": server, "insecure-skip-tls-verify": target.insecure,
                "tls-server-name": target.server_name or None, "proxy-url": proxy or None,
                "certificate-authority-data": base64.b64encode(target.ca).decode()
                if target.ca else None}
        for ext in cluster.get("extensions") or []:
            if isinstance(ext, dict) and ext.get("name") == "client.authentication.k8s.io/exec":
                info["config"] = ext.get("extension")
        try:
            target.exec = ExecCredential(user["exec"], user_dir,
                                         {k: v for k, v in info.items() if v is not None})
        except KubeconfigError as exc:
            raise KubeconfigError(f"{source}: {exc}") from None
    return target
