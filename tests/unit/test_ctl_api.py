"""connect(): the connection to the API server of every mode (api.py over http.client, the
kubeconfig read by kubeconfig.py without the kubernetes client), against real servers on
loopback: requests on kept connections, token files, kubeconfigs merged or refused; a watch
streamed line by line from a chunked response, its read timeout and its close from another
thread; TLS as a kubeconfig asks for it (CA, tls-server-name, insecure, client certificates); an
http:// proxy tunnelled through; exec credential plugins (token or client certificate, kept
until they expire, run again after a 401). What the kubernetes client gave the long-running
controller, it still has without it. Against a real API server: tests/controller."""

from __future__ import annotations

import base64
import datetime
import http.server
import json
import os
import selectors
import socket
import socketserver
import ssl
import sys
import threading
import time
from pathlib import Path

import pytest

from cnpa_controller.api import ApiError, connect
from cnpa_controller.kubeconfig import KubeconfigError, TokenFile, kubeconfig_entries

# -- a PKI of our own ------------------------------------------------------------------------


def _pem_pair(cert, key) -> tuple[bytes, bytes]:
    from cryptography.hazmat.primitives import serialization

    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


class PKI:
    """A CA, the server's certificate (for the name api.internal only, not for 127.0.0.1) and
    client certificates signed by the CA."""

    def __init__(self) -> None:
        from cryptography.hazmat.primitives.asymmetric import ec

        self._ec = ec
        self.ca_key = ec.generate_private_key(ec.SECP256R1())
        self.ca = self._cert("test-ca", self.ca_key, ca=True)
        self.ca_pem, _ = _pem_pair(self.ca, self.ca_key)
        self.server_pem = self.issue("api.internal", dns="api.internal")

    def _cert(self, cn: str, key, *, ca: bool = False, dns: str = "", issuer_key=None):
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.x509.oid import NameOID

        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
                   .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                                              "test-ca")]))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if dns:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(dns)]),
                                            critical=False)
        return builder.sign(issuer_key or key, hashes.SHA256())

    def issue(self, cn: str, dns: str = "") -> tuple[bytes, bytes]:
        key = self._ec.generate_private_key(self._ec.SECP256R1())
        return _pem_pair(self._cert(cn, key, dns=dns, issuer_key=self.ca_key), key)


@pytest.fixture(scope="module")
def pki():
    pytest.importorskip("cryptography")
    return PKI()


# -- servers -----------------------------------------------------------------------------------


class Server:
    """Answers GET and POST with {"path", "user"}: the Authorization header, or the client
    certificate's CN; records (path, user, client port). A watch (watch=1) is answered by
    `self.watch(handler)`; `statuses` are answered first, one per request."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.seen: list[tuple[str, str, int]] = []
        self.statuses: list[int] = []
        self.watch = None
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                self._answer()

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._answer()

            def _answer(self):
                user = self.headers.get("Authorization", "")
                if isinstance(self.connection, ssl.SSLSocket) and self.connection.getpeercert():
                    subject = dict(x[0] for x in self.connection.getpeercert()["subject"])
                    user = f"CN={subject['commonName']}"
                outer.seen.append((self.path, user, self.client_address[1]))
                if "watch=1" in self.path and outer.watch is not None:
                    outer.watch(self)
                    return
                status = outer.statuses.pop(0) if outer.statuses else 200
                body = json.dumps({"kind": "Status", "reason": "Unauthorized"} if status == 401
                                  else {"path": self.path, "user": user}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


@pytest.fixture
def tls_server(pki, tmp_path):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    (tmp_path / "server.pem").write_bytes(pki.server_pem[0] + pki.server_pem[1])
    ctx.load_cert_chain(tmp_path / "server.pem")
    ctx.load_verify_locations(cadata=pki.ca_pem.decode())
    ctx.verify_mode = ssl.CERT_OPTIONAL   # a client certificate, when one is sent, is checked
    s = Server(ctx)
    yield s
    s.close()


def kubeconfig(path: Path, cluster: dict, user: dict) -> str:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": cluster}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": user}]}))
    return str(path)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def yaml_kubeconfig(path, server: str, user: str) -> str:
    """A kubeconfig in YAML, the user given as YAML too."""
    path.write_text("apiVersion: v1\nkind: Config\ncurrent-context: c\n"
                    f"clusters: [{{name: c, cluster: {{server: '{server}'}}}}]\n"
                    "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
                    f"users: [{{name: u, user: {user}}}]\n")
    return str(path)



# -- requests, credentials, kubeconfigs ---------------------------------------------------------

def test_requests_share_a_kept_connection_and_send_the_token(server, tmp_path):
    api = connect(yaml_kubeconfig(tmp_path / "k", server.url, "{token: abc}"), user_agent="t/1")
    for i in range(5):
        assert api.request("GET", f"/api/{i}")["path"] == f"/api/{i}"
    assert api.request("POST", "/api/x", body={"a": 1})["path"] == "/api/x"
    assert {auth for _, auth, _ in server.seen} == {"Bearer abc"}
    assert len({port for _, _, port in server.seen}) == 1  # one connection, kept


def test_after_a_break_one_request_fails_not_one_per_kept_connection(server, tmp_path):
    """ss -K on the controller's sockets (or an API server gone) breaks every kept connection at
    once: the first request to find its connection broken drops the others, so the Lease's next
    renewal goes out on a new connection instead of on the next broken one."""
    api = connect(yaml_kubeconfig(tmp_path / "k", server.url, "{token: abc}"))
    start = threading.Barrier(4)

    def one(i: int) -> None:
        start.wait(5)
        api.request("GET", f"/api/{i}")
    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    kept = [conn for conn, _ in api.connection._idle]
    assert len(kept) >= 2, "the requests did not leave several kept connections"
    for conn in kept:
        conn.sock.shutdown(socket.SHUT_RDWR)   # as the kernel's abort leaves them
    with pytest.raises(ApiError):
        api.request("POST", "/api/lease", body={})  # a write is not sent again
    assert api.request("POST", "/api/lease", body={})["path"] == "/api/lease"
    assert api.request("GET", "/api/read")["path"] == "/api/read"


def test_a_renewed_token_file_is_read_again_after_a_401(server, tmp_path):
    token = tmp_path / "token"
    token.write_text("first\n")
    # A relative tokenFile is relative to the kubeconfig's directory.
    api = connect(yaml_kubeconfig(tmp_path / "k", server.url, "{tokenFile: token}"))
    api.connection.target.token_file.check_seconds = 3600  # only the 401 makes it look again
    api.request("GET", "/a")
    token.write_text("second\n")
    server.statuses = [401]
    with pytest.raises(ApiError) as err:
        api.request("GET", "/b")
    assert err.value.status == 401 and err.value.reason == "Unauthorized"
    api.request("GET", "/c")
    assert [auth for _, auth, _ in server.seen] == ["Bearer first", "Bearer first", "Bearer second"]


def test_a_token_file_wins_over_a_token_as_client_go_reads_a_kubeconfig(server, tmp_path):
    """Both in one user: the file (the renewed one) is used, as client-go and the long-running
    controller use it, so that a pass and the controller never hold different credentials."""
    (tmp_path / "token").write_text("from-file\n")
    api = connect(yaml_kubeconfig(tmp_path / "k", server.url, "{token: stale, tokenFile: token}"))
    api.request("GET", "/a")
    assert [auth for _, auth, _ in server.seen] == ["Bearer from-file"]


def test_no_server_is_status_0_not_a_hang(tmp_path):
    api = connect(yaml_kubeconfig(tmp_path / "k", "http://127.0.0.1:1", "{token: t}"), timeout=2)
    with pytest.raises(ApiError) as err:
        api.request("GET", "/api")
    assert err.value.status == 0 and "GET /api" in str(err.value)


def test_kubeconfig_files_merge_as_kubectl_merges_them(tmp_path):
    first = tmp_path / "a"
    first.write_text("current-context: c\ncontexts: [{name: c, context: {cluster: x, user: u}}]\n"
                     "users: [{name: u, user: {token: from-a}}]\n")
    second = tmp_path / "b"
    second.write_text("current-context: other\nclusters: [{name: x, cluster: {server: 'http://s'}}]\n"
                      "users: [{name: u, user: {token: from-b}}]\n")
    listed = os.pathsep.join([str(first), str(tmp_path / "missing"), str(second)])
    cluster, _, user, _ = kubeconfig_entries(listed)
    assert cluster == {"server": "http://s"} and user == {"token": "from-a"}


@pytest.mark.parametrize("user, named", [
    ("{auth-provider: {name: oidc}}", "auth-provider"),
    ("{as: admin, token: t}", "as"),
    ("{as-groups: [system:masters], token: t}", "as-groups"),
])
def test_credentials_it_cannot_send_are_refused_by_name(tmp_path, user, named):
    with pytest.raises(KubeconfigError, match=f"{named} in the current context is not supported"):
        connect(yaml_kubeconfig(tmp_path / "k", "https://127.0.0.1:6443", user))


@pytest.mark.parametrize("text, named", [
    ("current-context: nowhere\n", "no context named 'nowhere'"),
    ("[]\n", "not a kubeconfig"),
    ("contexts: []\n", "no current-context"),
])
def test_a_broken_kubeconfig_is_named(tmp_path, text, named):
    (tmp_path / "k").write_text(text)
    with pytest.raises(KubeconfigError, match=named):
        connect(str(tmp_path / "k"))


def test_a_token_file_is_followed_as_the_token_unit_renews_it(tmp_path):
    """Looked at at most once a second, read again only when it changed; missing for a moment,
    or empty, the last good token stays."""
    now = [0.0]
    path = tmp_path / "token"
    path.write_text("first\n")
    tokens = TokenFile(str(path), clock=lambda: now[0])
    assert tokens.current() == "first"
    (tmp_path / "token.new").write_text("second\n")
    os.replace(tmp_path / "token.new", path)
    assert tokens.current() == "first"   # within the second
    now[0] = 1.0
    assert tokens.current() == "second" and tokens.reads == 2
    for i in range(5):
        now[0] = 2.0 + i
        assert tokens.current() == "second"
    assert tokens.reads == 2   # unchanged: looked at, not read
    path.unlink()
    now[0] = 10.0
    assert tokens.current() == "second"
    path.write_text("")
    now[0] = 11.0
    assert tokens.current() == "second"


# -- watches -------------------------------------------------------------------------------------

def chunked(handler, pieces, pause=0.05, end=True):
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    for piece in pieces:
        handler.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        handler.wfile.flush()
        time.sleep(pause)
    if end:
        handler.wfile.write(b"0\r\n\r\n")
        handler.wfile.flush()


def test_a_watch_streams_its_events_line_by_line_as_they_come(server, tmp_path):
    events = [{"type": "ADDED", "object": {"metadata": {"name": f"n{i}"}}} for i in range(3)]
    data = b"".join(json.dumps(e).encode() + b"\n" for e in events) + b"\n"
    # Split at awkward places: inside an event, at its newline, an empty line.
    server.watch = lambda h: chunked(h, [data[:5], data[5:40], data[40:60], data[60:]])
    api = connect(kubeconfig(tmp_path / "k", {"server": server.url}, {"token": "t"}))
    got = list(api.watch("/api/v1/namespaces", {"resourceVersion": "7"}, 30))
    assert got == events
    path, user, port = server.seen[0]
    assert "watch=1" in path and "resourceVersion=7" in path and user == "Bearer t"
    # Ended as the server ends it: the connection is kept for the next request.
    api.request("GET", "/api")
    assert server.seen[1][2] == port


def test_a_watch_gone_silent_breaks_after_its_read_timeout(server, tmp_path):
    server.watch = lambda h: (chunked(h, [b'{"type":"BOOKMARK","object":{}}\n'], end=False),
                              time.sleep(5))
    api = connect(kubeconfig(tmp_path / "k", {"server": server.url}, {"token": "t"}))
    events = api.watch("/api/v1/namespaces", {}, 0.5)
    assert next(events)["type"] == "BOOKMARK"
    began = time.monotonic()
    with pytest.raises(ApiError) as err:
        next(events)
    assert err.value.status == 0 and "the watch broke" in str(err.value)
    assert time.monotonic() - began < 3


def test_a_watch_is_closed_from_another_thread_at_once(server, tmp_path):
    server.watch = lambda h: (chunked(h, [b'{"type":"ADDED","object":{}}\n'], end=False),
                              time.sleep(10))
    api = connect(kubeconfig(tmp_path / "k", {"server": server.url}, {"token": "t"}))
    events = api.watch("/api/v1/namespaces", {}, 60)
    got, ended = [], threading.Event()

    def read():
        got.extend(events)
        ended.set()

    threading.Thread(target=read, daemon=True).start()
    time.sleep(0.5)
    began = time.monotonic()
    events.close()
    assert ended.wait(5) and time.monotonic() - began < 2
    assert got == [{"type": "ADDED", "object": {}}]


def test_a_refused_watch_is_the_api_servers_answer(server, tmp_path):
    server.statuses = [410]
    api = connect(kubeconfig(tmp_path / "k", {"server": server.url}, {"token": "t"}))
    with pytest.raises(ApiError) as err:
        api.watch("/api/v1/namespaces", {"resourceVersion": "1"}, 30)
    assert err.value.status == 410


# -- TLS ---------------------------------------------------------------------------------------

def test_the_server_is_checked_against_the_ca_and_its_tls_server_name(pki, tls_server, tmp_path):
    cluster = {"server": tls_server.url, "certificate-authority-data": b64(pki.ca_pem)}
    # Its certificate names api.internal, not 127.0.0.1: refused without tls-server-name ...
    api = connect(kubeconfig(tmp_path / "a", cluster, {"token": "t"}))
    with pytest.raises(ApiError, match=r"CERTIFICATE_VERIFY_FAILED|match"):
        api.request("GET", "/api")
    # ... accepted with it; not with another CA; with insecure-skip-tls-verify, anything goes.
    api = connect(kubeconfig(tmp_path / "b", {**cluster, "tls-server-name": "api.internal"},
                             {"token": "t"}))
    assert api.request("GET", "/api")["user"] == "Bearer t"
    other = PKI()
    api = connect(kubeconfig(tmp_path / "c", {**cluster, "tls-server-name": "api.internal",
                                              "certificate-authority-data": b64(other.ca_pem)},
                             {"token": "t"}))
    with pytest.raises(ApiError, match="CERTIFICATE_VERIFY_FAILED"):
        api.request("GET", "/api")
    api = connect(kubeconfig(tmp_path / "d", {"server": tls_server.url,
                                              "insecure-skip-tls-verify": True}, {"token": "t"}))
    assert api.request("GET", "/api")["path"] == "/api"


def test_a_client_certificate_from_the_kubeconfig(pki, tls_server, tmp_path):
    cert, key = pki.issue("file-user")
    (tmp_path / "user.crt").write_bytes(cert)   # a file, relative to the kubeconfig
    api = connect(kubeconfig(tmp_path / "k", {"server": tls_server.url,
                                              "certificate-authority-data": b64(pki.ca_pem),
                                              "tls-server-name": "api.internal"},
                             {"client-certificate": "user.crt", "client-key-data": b64(key)}))
    assert api.request("GET", "/api")["user"] == "CN=file-user"


# -- a proxy -----------------------------------------------------------------------------------

def relay(a: socket.socket, b: socket.socket) -> None:
    """Bytes both ways until either side ends."""
    with selectors.DefaultSelector() as sel:
        sel.register(a, selectors.EVENT_READ, b)
        sel.register(b, selectors.EVENT_READ, a)
        while True:
            for key, _ in sel.select(timeout=30):
                data = key.fileobj.recv(65536)
                if not data:
                    return
                key.data.sendall(data)


class ConnectProxy:
    """An http:// proxy that tunnels CONNECT requests, recording each request line and its
    Proxy-Authorization."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        outer = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                line = self.rfile.readline().decode().strip()
                headers = {}
                while True:
                    h = self.rfile.readline().decode().strip()
                    if not h:
                        break
                    k, _, v = h.partition(":")
                    headers[k.strip().lower()] = v.strip()
                outer.seen.append((line, headers.get("proxy-authorization", "")))
                host, port = line.split()[1].rsplit(":", 1)
                upstream = socket.create_connection((host, int(port)))
                self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                self.wfile.flush()

                relay(self.connection, upstream)
                upstream.close()

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_an_http_proxy_is_tunnelled_through(pki, tls_server, tmp_path):
    proxy = ConnectProxy()
    try:
        url = proxy.url.replace("http://", "http://me:s%40cret@")
        api = connect(kubeconfig(tmp_path / "k", {"server": tls_server.url, "proxy-url": url,
                                                  "certificate-authority-data": b64(pki.ca_pem),
                                                  "tls-server-name": "api.internal"},
                                 {"token": "t"}))
        assert api.request("GET", "/api")["user"] == "Bearer t"
    finally:
        proxy.close()
    [(line, auth)] = proxy.seen
    assert line.startswith(f"CONNECT 127.0.0.1:{tls_server.port} HTTP/")
    assert auth == "Basic " + b64(b"me:s@cret")


@pytest.mark.parametrize("cluster", [{"server": "https://127.0.0.1:6443",
                                      "proxy-url": "socks5://127.0.0.1:1080"},
                                     {"server": "http://127.0.0.1:8080",
                                      "proxy-url": "http://127.0.0.1:3128"}])
def test_a_proxy_it_cannot_use_is_refused_by_name(tmp_path, cluster):
    with pytest.raises(KubeconfigError, match="proxy-url"):
        connect(kubeconfig(tmp_path / "k", cluster, {"token": "t"}))


# -- exec credential plugins ---------------------------------------------------------------------

PLUGIN = """#!{python}
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "runs"), "a") as fh:
    fh.write(os.environ["KUBERNETES_EXEC_INFO"] + "\\n")
answer = open(os.path.join(here, "answer")).read()
if answer.startswith("fail"):
    sys.stderr.write(answer)
    sys.exit(1)
sys.stdout.write(answer)
"""


def plugin(d: Path, **status) -> Path:
    """An exec plugin in d: it answers with d/answer (set by answer()) and records each run's
    KUBERNETES_EXEC_INFO in d/runs."""
    p = d / "plugin"
    p.write_text(PLUGIN.format(python=sys.executable))
    p.chmod(0o755)
    answer(d, **status)
    return p


def answer(d: Path, api_version="client.authentication.k8s.io/v1", **status) -> None:
    (d / "answer").write_text(json.dumps({"apiVersion": api_version, "kind": "ExecCredential",
                                          "status": status}))


def runs(d: Path) -> list[dict]:
    path = d / "runs"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def exec_user(**extra) -> dict:
    # Relative to the kubeconfig's directory, as client-go resolves a command with a slash.
    return {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "./plugin",
                     "interactiveMode": "Never", **extra}}


def test_an_exec_plugins_token_is_kept_until_it_expires(server, tmp_path):
    later = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1))
    plugin(tmp_path, token="one", expirationTimestamp=later.strftime("%Y-%m-%dT%H:%M:%SZ"))
    api = connect(kubeconfig(tmp_path / "k", {"server": server.url},
                             exec_user(env=[{"name": "REGION", "value": "x"}])))
    for _ in range(3):
        assert api.request("GET", "/api")["user"] == "Bearer one"
    assert len(runs(tmp_path)) == 1
    [info] = runs(tmp_path)
    assert info == {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                    "spec": {"interactive": False}}
    # Expired (as the process's clock sees it): run again.
    answer(tmp_path, token="two")
    api.connection.target.exec._clock = lambda: later.timestamp() + 1
    assert api.request("GET", "/api")["user"] == "Bearer two"
    assert len(runs(tmp_path)) == 2


def test_a_401_runs_the_exec_plugin_again_once(server, tmp_path):
    plugin(tmp_path, token="revoked")
    api = connect(kubeconfig(tmp_path / "k", {"server": server.url}, exec_user()))
    server.statuses = [401]
    with pytest.raises(ApiError) as err:
        api.request("GET", "/a")
    assert err.value.status == 401
    answer(tmp_path, token="fresh")
    assert api.request("GET", "/b")["user"] == "Bearer fresh"
    assert api.request("GET", "/c")["user"] == "Bearer fresh"
    assert len(runs(tmp_path)) == 2


def test_the_cluster_is_told_to_a_plugin_that_asks(server, tmp_path):
    plugin(tmp_path, token="t")
    cluster = {"server": server.url, "extensions": [
        {"name": "client.authentication.k8s.io/exec", "extension": {"audience": "cnpa"}}]}
    api = connect(kubeconfig(tmp_path / "k", cluster, exec_user(provideClusterInfo=True)))
    api.request("GET", "/api")
    [info] = runs(tmp_path)
    assert info["spec"]["cluster"] == {"server": server.url, "insecure-skip-tls-verify": False,
                                       "config": {"audience": "cnpa"}}


def test_an_exec_plugins_client_certificate_and_its_renewal(pki, tls_server, tmp_path):
    first, second = pki.issue("exec-user-1"), pki.issue("exec-user-2")
    soon = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
    plugin(tmp_path, clientCertificateData=first[0].decode(), clientKeyData=first[1].decode(),
           expirationTimestamp=soon.isoformat())
    api = connect(kubeconfig(tmp_path / "k", {"server": tls_server.url,
                                              "certificate-authority-data": b64(pki.ca_pem),
                                              "tls-server-name": "api.internal"}, exec_user()))
    assert api.request("GET", "/api")["user"] == "CN=exec-user-1"
    answer(tmp_path, clientCertificateData=second[0].decode(), clientKeyData=second[1].decode())
    api.connection.target.exec._clock = lambda: soon.timestamp() + 1
    # A connection made with the first certificate is not reused for the second.
    assert api.request("GET", "/api")["user"] == "CN=exec-user-2"
    assert tls_server.seen[0][2] != tls_server.seen[1][2]


@pytest.mark.parametrize(("status", "said"), [
    ({"token": ""}, "neither a token nor a client certificate"),
    ({"clientCertificateData": "x"}, "neither a token nor a client certificate"),
])
def test_a_plugin_answer_without_a_credential_fails_the_request_naming_it(server, tmp_path,
                                                                          status, said):
    plugin(tmp_path, **status)
    api = connect(kubeconfig(tmp_path / "k", {"server": server.url}, exec_user()))
    with pytest.raises(ApiError, match=said) as err:
        api.request("GET", "/api")
    assert err.value.status == 0 and server.seen == []


def test_a_failing_plugin_fails_the_request_with_its_words(server, tmp_path):
    plugin(tmp_path)
    (tmp_path / "answer").write_text("fail: the token service is down")
    api = connect(kubeconfig(tmp_path / "k", {"server": server.url}, exec_user()))
    with pytest.raises(ApiError, match="exited 1: fail: the token service is down"):
        api.request("GET", "/api")
    answer(tmp_path, api_version="client.authentication.k8s.io/v1beta1", token="t")
    with pytest.raises(ApiError, match=r"not ExecCredential client\.authentication\.k8s\.io/v1"):
        api.request("GET", "/api")


@pytest.mark.parametrize(("extra", "said"), [
    ({"apiVersion": "client.authentication.k8s.io/v1alpha1"}, "apiVersion"),
    ({"interactiveMode": "Always"}, "interactiveMode Always"),
    ({"command": ""}, "no command"),
])
def test_an_exec_config_it_cannot_run_is_refused_naming_it(tmp_path, extra, said):
    with pytest.raises(KubeconfigError, match=said):
        connect(kubeconfig(tmp_path / "k", {"server": "https://127.0.0.1:6443"},
                           exec_user(**extra)))
