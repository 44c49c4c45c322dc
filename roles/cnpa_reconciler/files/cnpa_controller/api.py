"""The one way the controller talks to the API server: `Api`, plain HTTP requests with JSON in
and out, one error type (`ApiError`) and one default timeout. The caches, the executor and the
elector all send through it.

One request function over either of two connections:
- `Api(api_client)`, the long-running controller's: a configured `kubernetes.client.ApiClient`
  supplies the kubeconfig (exec and auth-provider credentials, in-cluster config) and urllib3's
  pool, whose responses a watch streams. None of its generated models or request helpers are
  used: their signatures changed between the client versions this runs with (>= 24.2.0;
  `ApiClient.call_api` lost its path and query parameters in 35), and decoding thousands of
  objects into models is slow.
- `connect(kubeconfig)`, a pass's (`--once`, which reconcile.sh runs): the standard library's
  http.client and a kubeconfig read here. Importing the kubernetes client would cost more than a
  whole idle pass over a few hundred TeamSpaces (docs/benchmark.md). It takes the credentials a
  kubeconfig holds itself (certificates, token, tokenFile, basic); exec and auth-provider plugins
  are refused by name.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import threading
import time
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

# A request that has no timeout of its own gets this one (seconds): a hung API server must not
# hang a worker or a watch forever.
DEFAULT_TIMEOUT = 10.0
JSON_PATCH, MERGE_PATCH = "application/json-patch+json", "application/merge-patch+json"


class ApiError(Exception):
    """A request the API server refused (status >= 400) or that never got an answer (status 0)."""

    def __init__(self, status: int, reason: str, message: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}" if status else message)
        self.status = status
        self.reason = reason  # the Status object's reason (Conflict, AlreadyExists, Expired, ...)
        self.message = message


def _status_error(status: int, data: bytes) -> ApiError:
    try:
        doc = json.loads(data)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and doc.get("kind") == "Status":
        return ApiError(status, str(doc.get("reason") or ""), str(doc.get("message") or ""))
    return ApiError(status, "", data[:500].decode("utf-8", "replace").strip() or f"HTTP {status}")


def resource_of(path: str) -> str:
    """The resource a request path names (teamspaces, namespaces, leases, ...): the label of the
    request latency metric, which must not carry object names (one series per object)."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if parts[:1] == ["api"]:
        rest = parts[2:]
    elif parts[:1] == ["apis"]:
        rest = parts[3:]
    else:
        return "other"
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]   # a namespaced resource; namespaces/NAME alone is the namespace itself
    return rest[0] if rest else "other"


def path_of(obj: dict, *, collection: bool = False, subresource: str = "") -> str:
    """The URL path of an object (or of its collection) from its apiVersion, kind and metadata.
    Only the kinds this controller touches are known: a new kind must be added here on purpose."""
    meta = obj.get("metadata") or {}
    kind = obj.get("kind")
    plural = {"TeamSpace": "teamspaces", "Namespace": "namespaces",
              "ResourceQuota": "resourcequotas", "Event": "events", "Lease": "leases",
              "ConfigMap": "configmaps"}.get(kind)
    if plural is None:
        raise ValueError(f"no API path known for kind {kind!r}")
    api_version = obj.get("apiVersion") or "v1"
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    ns = meta.get("namespace")
    if ns and kind != "Namespace":
        base += f"/namespaces/{quote(ns, safe='')}"
    path = f"{base}/{plural}"
    if not collection:
        path += f"/{quote(meta['name'], safe='')}"
        if subresource:
            path += f"/{subresource}"
    return path


class KubeconfigError(ValueError):
    """A kubeconfig that cannot be read, or asks for what connect() does not do."""


def _load_document(path: str) -> dict:
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    try:
        import yaml  # the kubernetes client's own dependency, python3-yaml on Debian
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
    import subprocess

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


def token_file_of(kubeconfig: str) -> str:
    """The tokenFile named by the current context's user of a kubeconfig ("" if none), as an
    absolute path (a relative one is relative to the kubeconfig's directory, as kubectl reads it)."""
    _cluster, _cluster_dir, user, base = kubeconfig_entries(kubeconfig)
    path = user.get("tokenFile") or ""
    return os.path.join(base, path) if path else ""


class TokenFile:
    """Keeps a bearer token equal to the contents of a token file.

    The role's token unit rewrites the file before the token expires, so a long-running process
    must read it again (the `kubernetes` client reads a kubeconfig's tokenFile once, when the
    kubeconfig is loaded; its refresh hook reloads only exec and auth-provider credentials). The
    file is looked at (stat) at most every `check_seconds`, read again when it changed, and at the
    next request after a 401 (stale()), as client-go's cached file token source does. As the
    client configuration's refresh_api_key_hook (called before every request) it keeps the
    configuration's key up to date; connect()'s connection asks current()."""

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

    def __call__(self, cfg: Any) -> None:
        token = self.current()
        if token:
            # The key the loader used: "BearerToken" from client 35 on, "authorization" before.
            key = next((k for k in ("BearerToken", "authorization") if k in cfg.api_key),
                       "BearerToken")
            cfg.api_key[key] = f"Bearer {token}"


class _ClientConnection:
    """The long-running controller's: a configured `kubernetes.client.ApiClient`."""

    def __init__(self, api_client: Any) -> None:
        self.client = api_client
        self.host = api_client.configuration.host.rstrip("/")

    def headers(self) -> dict:
        headers = dict(getattr(self.client, "default_headers", None) or {})
        # Credentials as the client itself would send them (a bearer token, refreshed by the
        # configuration's hook: TokenFile's re-read of a token file); client certificates are in
        # the pool already.
        for auth in (self.client.configuration.auth_settings() or {}).values():
            if auth.get("in") == "header" and auth.get("value"):
                headers[auth["key"]] = auth["value"]
        return headers

    def send(self, method: str, url: str, body: bytes | None, headers: dict, timeout: Any):
        return self.client.rest_client.pool_manager.request(
            method, url, body=body, headers=headers, preload_content=False, retries=False,
            timeout=timeout)

    def unauthorized(self) -> None:
        stale = getattr(self.client.configuration.refresh_api_key_hook, "stale", None)
        if stale is not None:
            stale()


class _Response:
    """An http.client response with the two urllib3 methods Api uses."""

    def __init__(self, connection: _Connection, conn: http.client.HTTPConnection,
                 resp: http.client.HTTPResponse) -> None:
        self._connection, self._conn, self._resp = connection, conn, resp
        self.status = resp.status

    def read(self) -> bytes:
        return self._resp.read()

    def release_conn(self) -> None:
        if self._conn is None:
            return
        conn, self._conn = self._conn, None
        if self._resp.isclosed() and not self._resp.will_close:
            self._connection.put(conn)
        else:
            conn.close()


class _Connection:
    """A pass's: requests over http.client, with credentials read from a kubeconfig, keeping
    idle connections for the next request (a pass sends thousands to one server)."""

    def __init__(self, host: str, context: ssl.SSLContext | None, headers: dict,
                 token_file: TokenFile | None = None, max_idle: int = 64) -> None:
        self.host = host.rstrip("/")
        parts = urlsplit(self.host)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise KubeconfigError(f"server {host!r}: must be an https:// (or http://) URL")
        self._https = parts.scheme == "https"
        self._hostname, self._port = parts.hostname, parts.port
        self._prefix = parts.path
        self._context = context
        self._headers = headers
        self._token_file = token_file
        self._idle: list[http.client.HTTPConnection] = []
        self._max_idle = max_idle
        self._lock = threading.Lock()

    def headers(self) -> dict:
        headers = dict(self._headers)
        if self._token_file is not None and self._token_file.current():
            headers["Authorization"] = f"Bearer {self._token_file.current()}"
        return headers

    def put(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < self._max_idle:
                self._idle.append(conn)
                return
        conn.close()

    def _get(self, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            if self._https:
                conn = http.client.HTTPSConnection(self._hostname, self._port, timeout=timeout,
                                                   context=self._context)
            else:
                conn = http.client.HTTPConnection(self._hostname, self._port, timeout=timeout)
            return conn, False
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn, True

    def send(self, method: str, url: str, body: bytes | None, headers: dict, timeout: Any):
        target = url[len(self.host):]
        timeout = float(timeout)
        for attempt in (1, 2):
            conn, reused = self._get(timeout)
            try:
                conn.request(method, self._prefix + target, body=body, headers=headers)
                return _Response(self, conn, conn.getresponse())
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                conn.close()
                # A kept connection the server closed meanwhile: a read is sent again on a new
                # one. A write is not (the server may have done it): it fails, the pass retries.
                if not (reused and method == "GET" and attempt == 1):
                    raise
            except BaseException:
                conn.close()
                raise
        raise AssertionError("unreachable")

    def unauthorized(self) -> None:
        if self._token_file is not None:
            self._token_file.stale()


def _client_certificate(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """ssl loads a certificate and key only from a file: an anonymous in-memory one, so the
    key is never written to disk."""
    fd = os.memfd_create("cnpa-client-cert", os.MFD_CLOEXEC)
    try:
        os.write(fd, cert + b"\n" + key)
        context.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


# What the kubernetes client or kubectl would run or send for these, connect() cannot.
_PLUGINS = ("exec", "auth-provider", "as", "as-groups", "as-uid", "as-user-extra")
_IN_CLUSTER = "/var/run/secrets/kubernetes.io/serviceaccount"


def connect(kubeconfig: str = "", *, timeout: float = DEFAULT_TIMEOUT, user_agent: str = "",
            env: dict | None = None) -> Api:
    """An Api over http.client for the current context of a kubeconfig (KUBECONFIG's list of
    files, or ~/.kube/config, or the in-cluster ServiceAccount as the kubernetes client falls back
    to it). Raises KubeconfigError naming what is wrong."""
    import base64

    env = os.environ if env is None else env
    default = os.path.expanduser("~/.kube/config")
    if not kubeconfig and not os.path.exists(default) and env.get("KUBERNETES_SERVICE_HOST"):
        host = f"https://{env['KUBERNETES_SERVICE_HOST']}:{env.get('KUBERNETES_SERVICE_PORT', '443')}"
        cluster, user = {"server": host, "certificate-authority": f"{_IN_CLUSTER}/ca.crt"}, \
            {"tokenFile": f"{_IN_CLUSTER}/token"}
        cluster_dir = user_dir = "/"
    else:
        try:
            cluster, cluster_dir, user, user_dir = kubeconfig_entries(kubeconfig or default)
        except OSError as exc:
            raise KubeconfigError(f"{kubeconfig or default}: {exc.strerror}") from None
    plugins = [k for k in _PLUGINS if user.get(k)] + \
        [k for k in ("tls-server-name", "proxy-url") if cluster.get(k)]
    if plugins:
        raise KubeconfigError(f"{kubeconfig or default}: {', '.join(plugins)} in the current "
                              "context is not supported here; the long-running controller "
                              "(python3 -m cnpa_controller) reads it")

    def data(entry: dict, key: str, base: str) -> bytes | None:
        try:
            if entry.get(f"{key}-data"):
                return base64.b64decode(entry[f"{key}-data"])
            if entry.get(key):
                with open(os.path.join(base, entry[key]), "rb") as fh:
                    return fh.read()
        except (OSError, ValueError) as exc:
            raise KubeconfigError(f"{kubeconfig or default}: {key}: {exc}") from None
        return None

    context = None
    if str(cluster.get("server", "")).startswith("https://"):
        context = ssl.create_default_context()
        if cluster.get("insecure-skip-tls-verify"):
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        else:
            ca = data(cluster, "certificate-authority", cluster_dir)
            if ca is not None:
                context = ssl.create_default_context(cadata=ca.decode("ascii", "replace"))
        cert, key = data(user, "client-certificate", user_dir), data(user, "client-key", user_dir)
        if cert and key:
            try:
                _client_certificate(context, cert, key)
            except ssl.SSLError as exc:
                raise KubeconfigError(f"{kubeconfig or default}: client certificate: {exc}") \
                    from None
    headers = {"User-Agent": user_agent or "cnpa-controller"}
    token_file = None
    # tokenFile before token, as client-go reads a kubeconfig: the long-running controller
    # (through the kubernetes client and TokenFile) and a pass must use the same credentials.
    if user.get("tokenFile"):
        token_file = TokenFile(os.path.join(user_dir, user["tokenFile"]))
    elif user.get("token"):
        headers["Authorization"] = f"Bearer {user['token']}"
    elif user.get("username"):
        pair = f"{user['username']}:{user.get('password', '')}".encode()
        headers["Authorization"] = f"Basic {base64.b64encode(pair).decode()}"
    return Api(timeout=timeout,
               connection=_Connection(str(cluster.get("server", "")), context, headers, token_file))


class Api:
    """Requests to one API server: through a configured `kubernetes.client.ApiClient`, or the
    connection connect() makes."""

    def __init__(self, api_client: Any = None, timeout: float = DEFAULT_TIMEOUT, *,
                 connection: Any = None) -> None:
        self.connection = connection or _ClientConnection(api_client)
        self.timeout = timeout
        # observe(host, method, resource, code, seconds) after every request: the long-running
        # controller's metrics (metrics.Metrics.request); a pass has none.
        self.observe: Any = None

    def open(self, method: str, path: str, *, query: dict | None = None, body: Any = None,
             content_type: str | None = None, timeout: Any = None):
        """Send a request; the response, its body not read yet (the caller reads or streams it
        and must release it). Raises ApiError for status >= 400 and for no answer."""
        url = self.connection.host + path
        if query:
            url += "?" + urlencode({k: v for k, v in query.items() if v is not None})
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            content_type = content_type or "application/json"
        headers = {"Accept": "application/json", **self.connection.headers()}
        if content_type:
            headers["Content-Type"] = content_type
        began = time.monotonic()
        try:
            resp = self.connection.send(method, url, data, headers,
                                        self.timeout if timeout is None else timeout)
        except Exception as exc:  # no connection, timeout, TLS
            self._observed(method, path, "<error>", began)
            raise ApiError(0, "", f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        self._observed(method, path, str(resp.status), began)
        if resp.status >= 400:
            try:
                data = resp.read()
            except Exception:
                data = b""
            finally:
                resp.release_conn()
            if resp.status == 401:
                # Expired or revoked: the next request reads the token file again at once.
                self.connection.unauthorized()
            raise _status_error(resp.status, data)
        return resp

    def _observed(self, method: str, path: str, code: str, began: float) -> None:
        if self.observe is not None:
            self.observe(self.connection.host, method, resource_of(path), code,
                         time.monotonic() - began)

    def request(self, method: str, path: str, *, query: dict | None = None, body: Any = None,
                content_type: str | None = None, timeout: Any = None) -> dict:
        """Send a request and return the decoded JSON answer."""
        resp = self.open(method, path, query=query, body=body, content_type=content_type,
                         timeout=timeout)
        try:
            data = resp.read()
        except Exception as exc:
            raise ApiError(0, "", f"{method} {path}: reading the answer: {exc}") from exc
        finally:
            resp.release_conn()
        try:
            return json.loads(data) if data else {}
        except ValueError as exc:
            raise ApiError(0, "", f"{method} {path}: the answer is not JSON") from exc
