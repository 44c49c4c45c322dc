"""cnpa-op's long-running TeamSpace controller (run as `python3 -m cnpa_controller`).

Watch-fed caches of TeamSpaces, their namespaces and quotas (cache.py) queue the names of the
TeamSpaces whose objects changed (workqueue.py); workers reconcile each with the plan reconcile.sh
uses (cnpa_plan.plan, one implementation of what to write) and send its writes (executor.py);
controller.py wires them, __main__.py reads the configuration.

This module holds the one piece they all share, the elector too: `Api`, plain HTTP requests to
the API server with JSON in and out, and its one error type. It uses the `kubernetes` client's
configuration and connection pool (kubeconfig, TLS, credentials) but none of its generated
models or request helpers: their signatures changed between the client versions this runs with
(>= 24.2.0; `ApiClient.call_api` lost its path and query parameters in 35), and decoding
thousands of objects into models is slow.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any
from urllib.parse import quote, urlencode

# A request that has no timeout of its own gets this one (seconds): a hung API server must not
# hang a worker or a watch forever.
DEFAULT_TIMEOUT = 10.0


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


def token_file_of(kubeconfig: str) -> str:
    """The tokenFile named by the current context's user of a kubeconfig ("" if none), as an
    absolute path (a relative one is relative to the kubeconfig's directory, as kubectl reads it)."""
    import yaml  # the kubernetes client's own dependency

    with open(kubeconfig, encoding="utf-8") as fh:
        doc = yaml.safe_load(fh) or {}
    context = next((c.get("context") or {} for c in doc.get("contexts") or []
                    if c.get("name") == doc.get("current-context")), {})
    user = next((u.get("user") or {} for u in doc.get("users") or []
                 if u.get("name") == context.get("user")), {})
    path = user.get("tokenFile") or ""
    return os.path.join(os.path.dirname(os.path.abspath(kubeconfig)), path) if path else ""


class TokenFile:
    """Keeps a client configuration's bearer token equal to the contents of a token file.

    The `kubernetes` client reads a kubeconfig's tokenFile once, when the kubeconfig is loaded
    (its refresh hook reloads only exec and auth-provider credentials), but the role's token unit
    rewrites the file before the token expires: a long-running process must read it again. Used
    as the configuration's refresh_api_key_hook, which the client calls before every request: the
    file is looked at (stat) at most every `check_seconds`, read again when it changed, and at the
    next request after a 401 (stale()), as client-go's cached file token source does."""

    def __init__(self, path: str, check_seconds: float = 1.0, clock=time.monotonic) -> None:
        self.path = path
        self.check_seconds = check_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._next_check = float("-inf")
        self._seen: tuple | None = None
        self.reads = 0

    def stale(self) -> None:
        with self._lock:
            self._next_check, self._seen = float("-inf"), None

    def __call__(self, cfg: Any) -> None:
        with self._lock:
            now = self._clock()
            if now < self._next_check:
                return
            self._next_check = now + self.check_seconds
            try:
                st = os.stat(self.path)
                seen = (st.st_ino, st.st_mtime_ns, st.st_size)
                if seen == self._seen:
                    return
                with open(self.path, encoding="utf-8") as fh:
                    token = fh.read().strip()
            except OSError:
                return  # renewed by rename: a moment without the file keeps the token we have
            if not token:
                return
            self._seen = seen
            self.reads += 1
            # The key the loader used: "BearerToken" from client 35 on, "authorization" before.
            key = next((k for k in ("BearerToken", "authorization") if k in cfg.api_key),
                       "BearerToken")
            cfg.api_key[key] = f"Bearer {token}"


class Api:
    """Requests to one API server through a configured `kubernetes.client.ApiClient`."""

    def __init__(self, api_client: Any, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.client = api_client
        self.timeout = timeout

    def _headers(self, content_type: str | None) -> dict:
        headers = {"Accept": "application/json"}
        headers.update(getattr(self.client, "default_headers", None) or {})
        cfg = self.client.configuration
        # Credentials as the client itself would send them (a bearer token, refreshed by the
        # configuration's hook: TokenFile's re-read of a token file); client certificates are in
        # the pool already.
        for auth in (cfg.auth_settings() or {}).values():
            if auth.get("in") == "header" and auth.get("value"):
                headers[auth["key"]] = auth["value"]
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def open(self, method: str, path: str, *, query: dict | None = None, body: Any = None,
             content_type: str | None = None, timeout: Any = None):
        """Send a request; the urllib3 response, its body not read yet (the caller reads or
        streams it and must release it). Raises ApiError for status >= 400 and for no answer."""
        url = self.client.configuration.host.rstrip("/") + path
        if query:
            url += "?" + urlencode({k: v for k, v in query.items() if v is not None})
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            content_type = content_type or "application/json"
        try:
            resp = self.client.rest_client.pool_manager.request(
                method, url, body=data, headers=self._headers(content_type),
                preload_content=False, retries=False,
                timeout=self.timeout if timeout is None else timeout)
        except Exception as exc:  # urllib3's errors: no connection, timeout, TLS
            raise ApiError(0, "", f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        if resp.status >= 400:
            try:
                data = resp.read()
            except Exception:
                data = b""
            finally:
                resp.release_conn()
            if resp.status == 401:
                # Expired or revoked: the next request reads the token file again at once.
                stale = getattr(self.client.configuration.refresh_api_key_hook, "stale", None)
                if stale is not None:
                    stale()
            raise _status_error(resp.status, data)
        return resp

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
