"""Thousands of TeamSpaces created or deleted as fast as one client can send them, and the test of
N converged: shared by the benchmark and the multi-host chaos tests
(tests/multihost/test_watch_chaos.py).

Plain requests through cnpa_controller's Api (JSON in, dicts out): the kubernetes client's models
cost seconds of this machine's CPU per thousand objects, taken from the API server and the
controllers under test. One kubectl per object would be slower still (about 0.1 s each).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from bench.method import CLIENT_IN_FLIGHT
from cnpa_controller import Api, ApiError
from cnpa_controller.plan import API_VERSION, LABEL

TEAMSPACES = f"/apis/{API_VERSION}/teamspaces"
IN_FLIGHT = CLIENT_IN_FLIGHT  # requests at a time: the benchmark's, as its published rows were measured
# Answers that say the request did not happen and may be sent again once the server is back: no
# answer at all (a restarting API server refuses connections), too many requests, unavailable.
RETRIABLE = (0, 429, 500, 502, 503, 504)


def send_all(one: Callable[[str], object], keys: list[str], in_flight: int = IN_FLIGHT) -> list:
    """one(key) for every key, in_flight at a time; the answers in the order of keys. The first
    exception is raised once every request has been sent."""
    with ThreadPoolExecutor(in_flight) as pool:
        return list(pool.map(one, keys))


def _retrying(request: Callable[[], object], until: float | None, what: str,
              done: Callable[[ApiError], object | None]):
    """request() until it is answered. An ApiError that done() turns into a result ends it too;
    a retriable one (RETRIABLE) is sent again after a growing pause while time.monotonic() <
    until (None: never). Anything else is raised."""
    pause = 0.2
    while True:
        try:
            return request()
        except ApiError as exc:
            result = done(exc)
            if result is not None:
                return result
            if until is None or exc.status not in RETRIABLE or time.monotonic() > until:
                raise AssertionError(f"{what}: {exc}") from exc
        time.sleep(pause)
        pause = min(2.0, pause * 2)


def create(api: Api, manifests: list[dict], *, in_flight: int = IN_FLIGHT,
           retry_until: float | None = None,
           progress: Callable[[], None] = lambda: None) -> dict[str, str]:
    """Create every TeamSpace; name -> uid. One that already exists (AlreadyExists: created by an
    earlier try whose answer was lost, or before) is read back for its uid. retry_until: see
    _retrying. progress() after each one."""
    by_name = {m["metadata"]["name"]: m for m in manifests}

    def one(name: str) -> str:
        def exists(exc: ApiError) -> dict | None:
            if exc.reason == "AlreadyExists":
                return _retrying(lambda: api.request("GET", f"{TEAMSPACES}/{name}"), retry_until,
                                 f"get {name}", lambda _exc: None)
            return None
        obj = _retrying(lambda: api.request("POST", TEAMSPACES, body=by_name[name]), retry_until,
                        f"create {name}", exists)
        progress()
        return obj["metadata"]["uid"]

    names = list(by_name)
    return dict(zip(names, send_all(one, names, in_flight)))


def delete(api: Api, names: list[str], *, in_flight: int = IN_FLIGHT,
           retry_until: float | None = None,
           progress: Callable[[], None] = lambda: None) -> None:
    """Delete every TeamSpace named (it waits for its finalizer; this does not). One already gone
    (NotFound: deleted by an earlier try whose answer was lost, and released since) counts as
    deleted. retry_until: see _retrying. progress() after each one."""
    def one(name: str) -> None:
        _retrying(lambda: api.request("DELETE", f"{TEAMSPACES}/{name}"), retry_until,
                  f"delete {name}", lambda exc: {} if exc.status == 404 else None)
        progress()

    send_all(one, names, in_flight)


def teamspaces(api: Api, prefix: str) -> list[dict]:
    items = api.request("GET", TEAMSPACES)["items"]
    return [t for t in items if t["metadata"]["name"].startswith(prefix)]


def status_done(t: dict) -> bool:
    """Status written for the current generation: the last write of a TeamSpace's pass."""
    st, m = t.get("status") or {}, t["metadata"]
    return st.get("observedGeneration") == m["generation"] and st.get("namespace") == f"team-{m['name']}"


def converged(api: Api, prefix: str, n: int) -> bool:
    """The n TeamSpaces named prefix... each with its namespace (owned by it), its quota (pods as
    in its spec) and its status written for its generation."""
    ts = teamspaces(api, prefix)
    # The namespaces and quotas are listed only once every status is written (one list per
    # poll instead of three while the controller is still at work).
    if len(ts) != n or not all(status_done(t) for t in ts):
        return False
    nss = {ns["metadata"]["name"]: ns for ns in
           api.request("GET", "/api/v1/namespaces", query={"labelSelector": LABEL})["items"]}
    quotas = {q["metadata"]["namespace"]: q for q in api.request(
        "GET", "/api/v1/resourcequotas", query={"fieldSelector": "metadata.name=team-quota"})["items"]}
    for t in ts:
        m, nsname = t["metadata"], f"team-{t['metadata']['name']}"
        ns, q = nss.get(nsname), quotas.get(nsname)
        if ns is None or m["uid"] not in [o["uid"] for o in ns["metadata"].get("ownerReferences", [])]:
            return False
        if q is None or q["spec"].get("hard", {}).get("pods") != str(t["spec"]["pods"]):
            return False
    return True
