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
    """A watch as Api.watch gives it: the given events, then the end (or the failure given)."""

    def __init__(self, events, fail=None):
        self.events = list(events)
        self.fail = fail
        self.closed = False

    def __iter__(self):
        yield from self.events
        if self.fail:
            raise self.fail

    def close(self):
        self.closed = True


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

    def watch(self, path, query, timeout, *, connect_timeout=None):
        assert timeout > query["timeoutSeconds"] and connect_timeout
        self.calls.append(("watch", dict(query)))
        if not self.watches:
            self.stop.set()
            raise ApiError(0, "", "no more")
        w = self.watches.pop(0)
        if isinstance(w, Exception):
            raise w
        return w


# A watch that ends normally: a bookmark, then the server's timeout.
BOOKMARK = Stream([{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "20"}}}])


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
    lists = [q for k, q in api.calls if k == "list"]
    assert [q["continue"] for q in lists] == [None, "p2", None]
    # Then one list in one piece (paging again could expire again and again).
    assert "limit" in lists[0] and "limit" not in lists[2]
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
def test_a_watch_the_server_fails_or_refuses_lists_again(code):
    """As client-go's reflector: what changed while the watch failed reached no watch."""
    api = FakeApi(
        pages=[{None: {"metadata": {"resourceVersion": "10"}, "items": []}},
               {None: {"metadata": {"resourceVersion": "12"}, "items": [obj("team-b", 11)]}}],
        watches=[Stream([{"type": "ERROR", "object": {"kind": "Status", "code": code}}]), BOOKMARK])
    inf, _ = run_informer(api)
    assert inf.relists == 2 and inf.list_keys() == ["team-b"]
    assert [q["resourceVersion"] for k, q in api.calls if k == "watch"][:2] == ["10", "12"]
    assert inf.failures == {str(code): 1}


def test_a_watch_without_an_answer_or_told_to_slow_down_resumes_without_listing():
    api = FakeApi(
        pages=[{None: {"metadata": {"resourceVersion": "10"}, "items": []}}],
        watches=[ApiError(0, "", "connection refused"),
                 Stream([{"type": "ERROR", "object": {"kind": "Status", "code": 429}}]), BOOKMARK])
    inf, _ = run_informer(api)
    assert inf.relists == 1
    assert [q["resourceVersion"] for k, q in api.calls if k == "watch"][:3] == ["10", "10", "10"]
    assert inf.failures == {"<error>": 1, "429": 1}


def test_a_watch_that_ends_at_once_with_nothing_is_a_failure_not_a_spin():
    inf = Informer(None, "Namespace", "/x")
    inf.api = type("A", (), {"watch": lambda self, *a, **k: Stream([])})()
    with pytest.raises(ApiError, match="ended at once"):
        inf.watch(threading.Event())
    inf.api = type("A", (), {"watch": lambda self, *a, **k: Stream(
        [{"type": "ADDED", "object": obj("team-a", 3)}])})()
    inf.watch(threading.Event())  # an event came: an ordinary end
    assert inf.list_keys() == ["team-a"]


def test_a_relist_keeps_what_our_writes_put_there_after_its_snapshot():
    api = FakeApi(pages=[{None: {"metadata": {"resourceVersion": "40"},
                                 "items": [obj("team-a", 35)]}}], watches=[])
    inf = Informer(api, "Namespace", "/x")
    inf.resource_version = "30"
    inf.observe(obj("team-new", 50))   # our write, after the list's snapshot
    inf.observe(obj("team-a", 45))     # our write to team-a, newer than the list's copy
    inf._store["team-old"] = obj("team-old", 20)   # deleted before the snapshot
    inf.relist()
    assert sorted(inf.list_keys()) == ["team-a", "team-new"]
    assert inf.get("team-a")["metadata"]["resourceVersion"] == "45"


def test_an_answer_older_than_the_watch_does_not_bring_an_object_back():
    inf = Informer(None, "Namespace", "/x")
    inf.resource_version = "100"
    inf.observe(obj("team-gone", 90))  # the watch is past 90 and has no team-gone: deleted
    assert inf.get("team-gone") is None
    inf.observe(obj("team-new", 110))
    assert inf.get("team-new") is not None


def test_opaque_resource_versions_follow_the_watch():
    inf = Informer(None, "Namespace", "/x")
    for rv in ("a1", "b7", "c3"):
        inf._event({"type": "MODIFIED", "object": obj("team-a", rv)})
    assert inf.get("team-a")["metadata"]["resourceVersion"] == "c3"


def test_a_cache_whose_watch_keeps_failing_turns_stale_though_lists_succeed():
    """A lost watch permission: every list works, every watch is refused. Stale once that has
    lasted stale_seconds; relists do not end it, a watch that stays open or brings news does."""
    now = [0.0]
    inf = Informer(None, "Namespace", "/x", stale_seconds=30, clock=lambda: now[0])
    assert inf.stale() == 0
    inf._failed(ApiError(403, "Forbidden", "watch is forbidden"))
    now[0] = 20
    inf._failed(ApiError(403, "Forbidden", "watch is forbidden"))  # after a relist that worked
    assert inf.stale() == 0
    now[0] = 31
    assert inf.stale() == 31 and "forbidden" in inf.last_error
    inf._watching(True)   # opened, and ended at once by the server: no news
    now[0] = 31.5
    inf._watching(False)
    assert inf.stale() == 31.5
    inf._watching(True)   # a watch that stays open works, quiet or not
    now[0] = 33
    assert inf.stale() == 0
    inf._watching(False)
    inf._failed(ApiError(0, "", "connection refused"))
    now[0] = 70
    assert inf.stale() == 37
    inf._heard()          # an event or a bookmark
    assert inf.stale() == 0
    assert inf.failures == {"403": 2, "<error>": 1}


def test_a_refused_watch_is_counted_and_listed_again_every_time():
    api = FakeApi(
        pages=[{None: {"metadata": {"resourceVersion": str(10 + i)}, "items": []}}
               for i in range(4)],
        watches=[ApiError(403, "Forbidden", "no watch")] * 3 + [BOOKMARK])
    inf, _ = run_informer(api)
    assert inf.failures == {"403": 3} and inf.relists == 4
