"""connect(): the connection to the API server of every mode (http.client, a kubeconfig read
without the kubernetes client), against a real HTTP server on loopback. TLS, proxies, exec
plugins and watches: tests/unit/test_ctl_transport.py; against a real API server:
tests/controller."""

from __future__ import annotations

import http.server
import json
import os
import threading

import pytest

from cnpa_controller.api import ApiError, connect
from cnpa_controller.kubeconfig import KubeconfigError, TokenFile, kubeconfig_entries


class Server:
    """Answers every request with the next status in `statuses` (200 when none is left) and
    records the Authorization header and the connection each request came on."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, int]] = []
        self.statuses: list[int] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the API server

            def do_GET(self):
                self._answer()

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._answer()

            def _answer(self):
                outer.seen.append((self.path, self.headers.get("Authorization", ""),
                                   self.client_address[1]))
                status = outer.statuses.pop(0) if outer.statuses else 200
                body = json.dumps({"kind": "Status", "reason": "Unauthorized"} if status == 401
                                  else {"path": self.path}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


def kubeconfig(path, server: str, user: str) -> str:
    path.write_text("apiVersion: v1\nkind: Config\ncurrent-context: c\n"
                    f"clusters: [{{name: c, cluster: {{server: '{server}'}}}}]\n"
                    "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
                    f"users: [{{name: u, user: {user}}}]\n")
    return str(path)


def test_requests_share_a_kept_connection_and_send_the_token(server, tmp_path):
    api = connect(kubeconfig(tmp_path / "k", server.url, "{token: abc}"), user_agent="t/1")
    for i in range(5):
        assert api.request("GET", f"/api/{i}") == {"path": f"/api/{i}"}
    assert api.request("POST", "/api/x", body={"a": 1}) == {"path": "/api/x"}
    assert {auth for _, auth, _ in server.seen} == {"Bearer abc"}
    assert len({port for _, _, port in server.seen}) == 1  # one connection, kept


def test_a_renewed_token_file_is_read_again_after_a_401(server, tmp_path):
    token = tmp_path / "token"
    token.write_text("first\n")
    # A relative tokenFile is relative to the kubeconfig's directory.
    api = connect(kubeconfig(tmp_path / "k", server.url, "{tokenFile: token}"))
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
    api = connect(kubeconfig(tmp_path / "k", server.url, "{token: stale, tokenFile: token}"))
    api.request("GET", "/a")
    assert [auth for _, auth, _ in server.seen] == ["Bearer from-file"]


def test_no_server_is_status_0_not_a_hang(tmp_path):
    api = connect(kubeconfig(tmp_path / "k", "http://127.0.0.1:1", "{token: t}"), timeout=2)
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
        connect(kubeconfig(tmp_path / "k", "https://127.0.0.1:6443", user))


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
