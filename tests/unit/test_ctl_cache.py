"""The controller's caches against a scripted API: object -> TeamSpace name, paginated relist,
watch resumed from its resourceVersion, relist on 410 Gone, our own writes never regressed."""

from __future__ import annotations

import json
import threading

import pytest

from cnpa_controller import ApiError
from cnpa_controller.cache import (
    Caches,
    Informer,
    teamspace_of_namespace,
    teamspace_of_quota,
    teamspace_of_teamspace,
)


def obj(name, rv, namespace=None, kind="Namespace"):
    meta = {"name": name, "resourceVersion": str(rv)}
    if namespace:
        meta["namespace"] = namespace
    return {"kind": kind, "apiVersion": "v1", "metadata": meta}


def test_objects_map_to_the_teamspace_they_concern():
    assert teamspace_of_teamspace(obj("x", 1, kind="TeamSpace")) == "x"
    assert teamspace_of_namespace(obj("team-x", 1)) == "x"
    assert teamspace_of_namespace(obj("team-a-b", 1)) == "a-b"
    assert teamspace_of_namespace(obj("team-", 1)) is None
    assert teamspace_of_namespace(obj("kube-system", 1)) is None
    assert teamspace_of_quota(obj("team-quota", 1, "team-x", "ResourceQuota")) == "x"
    assert teamspace_of_quota(obj("other", 1, "team-x", "ResourceQuota")) is None
    assert teamspace_of_quota(obj("team-quota", 1, "default", "ResourceQuota")) is None


class Stream:
    """A watch response: the given events, split at awkward places, then the end."""

    def __init__(self, events, fail=None):
        data = b"".join(json.dumps(e).encode() + b"\n" for e in events)
        self.chunks = [data[i:i + 7] for i in range(0, len(data), 7)]
        self.fail = fail

    def stream(self, amt, decode_content=True):
        yield from self.chunks
        if self.fail:
            raise self.fail

    def release_conn(self):
        pass


class FakeApi:
    def __init__(self, pages, watches):
        self.pages = pages  # continue token -> page, per list call: a list of such dicts
        self.watches = watches  # one entry per watch call: Stream or ApiError
        self.calls = []

    def request(self, method, path, *, query=None, timeout=None, **kw):
        self.calls.append(("list", dict(query)))
        lists = self.pages[0]
        page = lists[query.get("continue")]
        if isinstance(page, ApiError):
            self.pages.pop(0)
            raise page
        if page.get("metadata", {}).get("continue") is None:
            self.pages.pop(0)
        return json.loads(json.dumps(page))

    def open(self, method, path, *, query=None, timeout=None, **kw):
        self.calls.append(("watch", dict(query)))
        if not self.watches:
            self.stop.set()
            raise ApiError(0, "", "no more")
        w = self.watches.pop(0)
        if isinstance(w, Exception):
            raise w
        return w


def run_informer(api, **kw):
    stop = threading.Event()
    api.stop = stop
    seen = []
    inf = Informer(api, "Namespace", "/api/v1/namespaces", label_selector="l",
                   on_change=lambda o: seen.append(o["metadata"]["name"]), backoff_cap=0.01, **kw)
    t = threading.Thread(target=inf.run, args=(stop,))
    t.start()
    t.join(20)
    assert not t.is_alive()
    return inf, seen


def test_list_is_paginated_then_watch_resumes_from_the_last_version():
    api = FakeApi(
        pages=[{None: {"metadata": {"continue": "p2"}, "items": [obj("team-a", 5)]},
                "p2": {"metadata": {"resourceVersion": "10"}, "items": [obj("team-b", 6)]}}],
        watches=[Stream([{"type": "ADDED", "object": obj("team-c", 11)},
                         {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}}]),
                 Stream([{"type": "DELETED", "object": obj("team-a", 16)}],
                        fail=ConnectionError("cut")),
                 Stream([])])
    inf, seen = run_informer(api, page_size=1)
    lists = [q for kind, q in api.calls if kind == "list"]
    watches = [q for kind, q in api.calls if kind == "watch"]
    assert [q["continue"] for q in lists] == [None, "p2"]
    assert all(q["limit"] == 1 and q["labelSelector"] == "l" for q in lists)
    # First watch from the list's version; the next from the bookmark; after the broken
    # stream, from the last event: never a relist for an ordinary break.
    assert [q["resourceVersion"] for q in watches[:3]] == ["10", "15", "16"]
    assert all(q["allowWatchBookmarks"] == "true" and q["timeoutSeconds"] > 0 for q in watches)
    assert seen == ["team-a", "team-b", "team-c", "team-a"]
    assert sorted(inf.list_keys()) == ["team-b", "team-c"]
    assert inf.relists == 1


def test_gone_relists_and_hands_over_only_what_changed():
    api = FakeApi(
        pages=[{None: {"metadata": {"resourceVersion": "10"},
                       "items": [obj("team-a", 5), obj("team-b", 6)]}},
               {None: {"metadata": {"resourceVersion": "30"},
                       "items": [obj("team-a", 5), obj("team-c", 25)]}}],
        watches=[Stream([{"type": "ERROR", "object": {"kind": "Status", "code": 410,
                                                      "message": "too old resource version"}}]),
                 Stream([])])
    inf, seen = run_informer(api)
    assert inf.relists == 2
    assert sorted(inf.list_keys()) == ["team-a", "team-c"]
    # The second list: team-c is new, team-b is gone; team-a did not change.
    assert seen[2:] == ["team-c", "team-b"]
    watches = [q for kind, q in api.calls if kind == "watch"]
    assert watches[1]["resourceVersion"] == "30"


def test_a_watch_request_answered_410_relists():
    api = FakeApi(
        pages=[{None: {"metadata": {"resourceVersion": "10"}, "items": []}},
               {None: {"metadata": {"resourceVersion": "20"}, "items": [obj("team-z", 20)]}}],
        watches=[ApiError(410, "Expired", "too old"), Stream([])])
    inf, seen = run_informer(api)
    assert inf.relists == 2 and seen == ["team-z"]


def test_an_expired_continue_token_restarts_the_list():
    api = FakeApi(
        pages=[{None: {"metadata": {"continue": "p2"}, "items": [obj("team-a", 5)]},
                "p2": ApiError(410, "Expired", "continue token expired")},
               {None: {"metadata": {"resourceVersion": "40"}, "items": [obj("team-b", 6)]}}],
        watches=[Stream([])])
    inf, _ = run_informer(api, page_size=1)
    assert [q["continue"] for k, q in api.calls if k == "list"] == [None, "p2", None]
    assert sorted(inf.list_keys()) == ["team-b"] and inf.relists == 1


def test_our_own_write_is_not_replaced_by_an_older_event():
    inf = Informer(None, "Namespace", "/x")
    inf.observe(obj("team-a", 20))
    inf._event({"type": "MODIFIED", "object": obj("team-a", 12)})
    assert inf.get("team-a")["metadata"]["resourceVersion"] == "20"
    inf._event({"type": "MODIFIED", "object": obj("team-a", 21)})
    assert inf.get("team-a")["metadata"]["resourceVersion"] == "21"
    inf.observe(obj("team-a", 19))
    assert inf.get("team-a")["metadata"]["resourceVersion"] == "21"
    inf._event({"type": "DELETED", "object": obj("team-a", 22)})
    assert inf.get("team-a") is None
    # The answer to our write taken in after the watch reported the deletion: stays deleted.
    inf.observe(obj("team-a", 21))
    assert inf.get("team-a") is None
    gone = obj("x", 30, kind="TeamSpace")
    gone["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z", finalizers=[])
    inf.observe(gone)  # the answer to the release of its last finalizer
    assert inf.get("x") is None


def test_caches_select_as_reconcile_sh_lists_and_queue_names():
    queued = []
    caches = Caches(None, queued.append)
    assert caches.namespaces.selectors["labelSelector"] == "platform.labhub.io/teamspace"
    assert caches.quotas.selectors["fieldSelector"] == "metadata.name=team-quota"
    assert caches.teamspaces.selectors == {"labelSelector": None, "fieldSelector": None}
    caches.quotas._event({"type": "ADDED", "object": obj("team-quota", 3, "team-x", "ResourceQuota")})
    caches.namespaces._event({"type": "ADDED", "object": obj("team-x", 4)})
    caches.teamspaces._event({"type": "ADDED", "object": obj("x", 5, kind="TeamSpace")})
    caches.namespaces._event({"type": "ADDED", "object": obj("elsewhere", 6)})
    assert queued == ["x", "x", "x"]
    ts, ns, quota = caches.state("x")
    assert (ts["metadata"]["name"], ns["metadata"]["name"], quota["metadata"]["namespace"]) == \
        ("x", "team-x", "team-x")


@pytest.mark.parametrize("code", [500, 403])
def test_a_watch_error_event_other_than_gone_resumes_without_relist(code):
    api = FakeApi(
        pages=[{None: {"metadata": {"resourceVersion": "10"}, "items": []}}],
        watches=[Stream([{"type": "ERROR", "object": {"kind": "Status", "code": code}}]),
                 Stream([])])
    inf, _ = run_informer(api)
    assert inf.relists == 1
    assert [q["resourceVersion"] for k, q in api.calls if k == "watch"][:2] == ["10", "10"]
