"""The one way the controller talks to the API server: `Api`, plain HTTP requests with JSON in
and out, a watch's events as they come, one error type (`ApiError`) and one default timeout. The
caches, the executor and the elector all send through it, in every mode.

connect() reads the kubeconfig once (kubeconfig.resolve: the current context, or the in-cluster
ServiceAccount) and makes the connection: the standard library's http.client, kept-alive
connections for the next request, TLS as the kubeconfig says (its CA or none, tls-server-name, a
client certificate, an exec plugin's certificate), an http:// proxy tunnelled through, and the
credentials (token, basic, a token file or an exec plugin's token, each fetched again after a
401). No kubernetes client: its import alone costs more than a whole idle pass over a few
hundred TeamSpaces (the benchmark's figures), and none of its models were used.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import ssl
import threading
import time
from typing import Any
from urllib.parse import quote, unquote, urlencode, urlsplit

from .kubeconfig import Credential, KubeconfigError, Target, resolve

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


class _Response:
    """An http.client response and the connection it came on (returned to the idle ones once
    read, unless the server closes it), with the credential it was sent with."""

    def __init__(self, connection: _Connection, conn: http.client.HTTPConnection,
                 resp: http.client.HTTPResponse, credential: Credential | None) -> None:
        self._connection, self._conn, self._resp = connection, conn, resp
        self.status = resp.status
        self.credential = credential

    def read(self) -> bytes:
        return self._resp.read()

    def read1(self, n: int) -> bytes:
        return self._resp.read1(n)

    def read_timeout(self, seconds: float) -> None:
        if self._conn is not None and self._conn.sock is not None:
            self._conn.sock.settimeout(seconds)

    def abort(self) -> None:
        """Break the connection, from any thread: a read blocked on it returns at once."""
        conn = self._conn
        sock = conn.sock if conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def drop_idle(self) -> None:
        self._connection.drop_idle()

    def release_conn(self) -> None:
        if self._conn is None:
            return
        conn, self._conn = self._conn, None
        if self._resp.isclosed() and not self._resp.will_close:
            self._connection.put(conn)
        else:
            conn.close()


class _HTTPS(http.client.HTTPSConnection):
    """Checks the server's certificate against tls-server-name when the kubeconfig gives one (the
    name it is reached by, or the proxy's tunnel target, otherwise)."""

    server_name = ""

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._context.wrap_socket(
            self.sock, server_hostname=self.server_name or self._tunnel_host or self.host)


def _client_certificate(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """ssl loads a certificate and key only from a file: an anonymous in-memory one, so the
    key is never written to disk."""
    fd = os.memfd_create("cnpa-client-cert", os.MFD_CLOEXEC)
    try:
        os.write(fd, cert + b"\n" + key)
        context.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


class _Connection:
    """Requests over http.client to the Target's server, keeping up to `max_idle` idle
    connections for the next request (the workers, the watches and the Lease each hold one)."""

    def __init__(self, target: Target, user_agent: str = "", max_idle: int = 64) -> None:
        self.target = target
        self.host = target.server.rstrip("/")
        parts = urlsplit(self.host)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise KubeconfigError(f"{target.source}: server {target.server!r}: must be an "
                                  "https:// (or http://) URL")
        self._https = parts.scheme == "https"
        self._hostname, self._port = parts.hostname, parts.port
        self._prefix = parts.path
        self._headers = {"User-Agent": user_agent or "cnpa-controller"}
        if target.authorization:
            self._headers["Authorization"] = target.authorization
        self._idle: list[tuple[http.client.HTTPConnection, ssl.SSLContext | None]] = []
        self._max_idle = max_idle
        self._lock = threading.Lock()
        self._cert: bytes | None = None
        self._context = self._tls(None) if self._https else None

    def _tls(self, credential: Credential | None) -> ssl.SSLContext:
        """The TLS settings for requests sent with this credential: made anew when an exec
        plugin's certificate changes (connections made with the old one are not reused)."""
        t = self.target
        if t.insecure:
            context = ssl.create_default_context()
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        else:
            context = ssl.create_default_context(
                cadata=t.ca.decode("ascii", "replace") if t.ca else None)
        cert, key = (credential.cert, credential.key) if credential and credential.cert \
            else (t.cert, t.key)
        if cert and key:
            try:
                _client_certificate(context, cert, key)
            except ssl.SSLError as exc:
                raise KubeconfigError(f"{t.source}: client certificate: {exc}") from None
        self._cert = cert
        return context

    def _auth(self) -> tuple[dict, Credential | None, ssl.SSLContext | None]:
        headers = dict(self._headers)
        t, credential = self.target, None
        token = t.token_file.current() if t.token_file is not None else ""
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if t.exec is not None:
            credential = t.exec.current()
            # A token or basic auth given in the kubeconfig wins, as in client-go.
            if credential.token and "Authorization" not in headers:
                headers["Authorization"] = f"Bearer {credential.token}"
        with self._lock:
            if self._https and credential is not None and credential.cert \
                    and credential.cert != self._cert:
                self._context = self._tls(credential)
            return headers, credential, self._context

    def put(self, conn: http.client.HTTPConnection) -> None:
        context = getattr(conn, "_context", None)
        with self._lock:
            if len(self._idle) < self._max_idle and context is self._context:
                self._idle.append((conn, context))
                return
        conn.close()

    def drop_idle(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for kept in idle:
            kept[0].close()

    def _new(self, timeout: float, context: ssl.SSLContext | None) -> http.client.HTTPConnection:
        proxy = urlsplit(self.target.proxy) if self.target.proxy else None
        host, port = (proxy.hostname, proxy.port or 80) if proxy else (self._hostname, self._port)
        if self._https:
            conn: http.client.HTTPConnection = _HTTPS(host, port, timeout=timeout, context=context)
            conn.server_name = self.target.server_name
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
        if proxy:
            tunnel = {}
            if proxy.username:
                pair = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}".encode()
                tunnel["Proxy-Authorization"] = f"Basic {base64.b64encode(pair).decode()}"
            conn.set_tunnel(self._hostname, self._port or 443, headers=tunnel)
        return conn

    def _get(self, timeout: float, context: ssl.SSLContext | None
             ) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            while self._idle:
                conn, made_with = self._idle.pop()
                if made_with is context:
                    break
                conn.close()
            else:
                conn = None
        if conn is None:
            return self._new(timeout, context), False
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn, True

    def send(self, method: str, target: str, body: bytes | None, headers: dict,
             timeout: float) -> _Response:
        auth, credential, context = self._auth()
        headers = {**auth, **headers}
        for attempt in (1, 2):
            conn, reused = self._get(float(timeout), context)
            try:
                conn.request(method, self._prefix + target, body=body, headers=headers)
                return _Response(self, conn, conn.getresponse(), credential)
            except (http.client.RemoteDisconnected, ConnectionError, ssl.SSLEOFError):
                conn.close()
                if reused:
                    # What broke this kept connection (an API server restarted, the network cut)
                    # broke the others kept beside it: each would fail one more request.
                    self.drop_idle()
                # A kept connection the server closed meanwhile: a read is sent again on a new
                # one. A write is not (the server may have done it): it fails, the pass retries.
                if not (reused and method == "GET" and attempt == 1):
                    raise
            except BaseException:
                conn.close()
                raise
        raise AssertionError("unreachable")

    def unauthorized(self, resp: _Response) -> None:
        """A request was refused (401): the next one reads the token file or runs the exec
        plugin again."""
        if self.target.token_file is not None:
            self.target.token_file.stale()
        if self.target.exec is not None:
            self.target.exec.stale(resp.credential)


class Watch:
    """The events of one watch (dicts), as the API server sends them: a chunked response read
    line by line, each line one event. Ends when the server ends the watch; a break is ApiError
    (status 0). close() ends it, from any thread (at shutdown: a read under way returns at once,
    and the reading thread lets the connection go)."""

    def __init__(self, resp: _Response, what: str) -> None:
        self._resp, self._what = resp, what
        self._buf = b""
        self._lines: list[bytes] = []
        self._lock = threading.Lock()
        self._closed = self._reading = False

    def __iter__(self) -> Watch:
        return self

    def __next__(self) -> dict:
        while not self._lines:
            with self._lock:
                if self._closed:
                    self._end()
                self._reading = True
            try:
                chunk = self._resp.read1(65536)
            except (OSError, ValueError, http.client.HTTPException) as exc:
                if self._closed:
                    self._end()
                self._resp.release_conn()
                if isinstance(exc, ConnectionError):
                    # Broken under us, not ended by the server (see _Connection.send).
                    self._resp.drop_idle()
                raise ApiError(0, "", f"{self._what}: the watch broke: "
                                      f"{type(exc).__name__}: {exc}") from exc
            finally:
                with self._lock:
                    self._reading = False
            if not chunk:
                self._end()
            *lines, self._buf = (self._buf + chunk).split(b"\n")
            self._lines = [line for line in lines if line.strip()][::-1]
        line = self._lines.pop()
        try:
            return json.loads(line)
        except ValueError:
            self._resp.release_conn()
            raise ApiError(0, "", f"{self._what}: not an event: {line[:200]!r}") from None

    def _end(self):
        self._resp.release_conn()
        raise StopIteration

    def close(self) -> None:
        with self._lock:
            self._closed = True
            reading = self._reading
        self._resp.abort()
        if not reading:
            self._resp.release_conn()


def connect(kubeconfig: str = "", *, timeout: float = DEFAULT_TIMEOUT, user_agent: str = "",
            env: dict | None = None, pool: int = 64) -> Api:
    """An Api for the current context of a kubeconfig (kubeconfig.resolve), keeping up to `pool`
    idle connections. Raises KubeconfigError naming what is wrong."""
    return Api(_Connection(resolve(kubeconfig, env), user_agent, max_idle=pool), timeout=timeout)


class Api:
    """Requests to one API server over the connection connect() makes."""

    def __init__(self, connection: Any, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.connection = connection
        self.timeout = timeout
        # observe(host, method, resource, code, seconds) after every request: the long-running
        # controller's metrics (metrics.Metrics.request); a pass has none.
        self.observe: Any = None

    def open(self, method: str, path: str, *, query: dict | None = None, body: Any = None,
             content_type: str | None = None, timeout: float | None = None) -> _Response:
        """Send a request; the response, its body not read yet (the caller reads or streams it
        and must release it). Raises ApiError for status >= 400 and for no answer."""
        target = path
        if query:
            target += "?" + urlencode({k: v for k, v in query.items() if v is not None})
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            content_type = content_type or "application/json"
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        began = time.monotonic()
        try:
            resp = self.connection.send(method, target, data, headers,
                                        self.timeout if timeout is None else timeout)
        except Exception as exc:  # no connection, timeout, TLS, a credential plugin that failed
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
                # Expired or revoked: the next request reads the token file or runs the plugin.
                self.connection.unauthorized(resp)
            raise _status_error(resp.status, data)
        return resp

    def _observed(self, method: str, path: str, code: str, began: float) -> None:
        if self.observe is not None:
            self.observe(self.connection.host, method, resource_of(path), code,
                         time.monotonic() - began)

    def request(self, method: str, path: str, *, query: dict | None = None, body: Any = None,
                content_type: str | None = None, timeout: float | None = None) -> dict:
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

    def watch(self, path: str, query: dict, timeout: float, *,
              connect_timeout: float | None = None) -> Watch:
        """A watch of path (query: its selectors, resourceVersion, timeoutSeconds, ...): its
        events, each a dict, as they come. timeout: the longest silence on the connection once
        it is open (longer than the server's timeoutSeconds, so that a connection gone silent is
        noticed); connect_timeout: the request's until its answer begins."""
        resp = self.open("GET", path, query={**query, "watch": "1"}, timeout=connect_timeout)
        resp.read_timeout(timeout)
        return Watch(resp, f"watch {path}")
