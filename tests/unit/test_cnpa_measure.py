"""Unit tests for library/cnpa_measure.py: conditions, bounded polling, timing, check mode."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "cnpa_measure", Path(__file__).resolve().parents[2] / "library" / "cnpa_measure.py")
m = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(m)


class FakeClock:
    """A clock that only moves when the code sleeps or an API call 'takes' time."""

    def __init__(self):
        self.now = 100.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds


class FakeApi:
    """Serves a scripted sequence of observations; each get() costs `cost` seconds."""

    def __init__(self, clock, before, after=(), cost=0.0):
        self.clock = clock
        self.before = before
        self.after = list(after)
        self.cost = cost
        self.calls = []

    def get(self):
        self.calls.append("get")
        self.clock.now += self.cost
        if self.calls.count("get") == 1:
            return self.before
        return self.after.pop(0) if len(self.after) > 1 else (self.after[0] if self.after else self.before)

    def delete(self, uid, policy):
        self.calls.append(("delete", uid, policy))
        return {"metadata": {"uid": uid, "deletionTimestamp": "now"}}

    def patch(self, body, subresource):
        self.calls.append(("patch", body, subresource))
        return {"patched": body, "subresource": subresource}


def obj(uid="u1", **extra):
    o = {"metadata": {"name": "x", "uid": uid}}
    o.update(extra)
    return o


def run(params, api, clock, check_mode=False):
    base = {"name": "x", "kind": "K", "timeout": 10, "interval": 1}
    base.update(params)
    return m.measure(base, api, check_mode=check_mode, clock=clock, sleep=clock.sleep)


# --- pure helpers -----------------------------------------------------------------------------

def test_parse_path_dotted_and_list():
    assert m.parse_path("spec.hard.pods") == ["spec", "hard", "pods"]
    assert m.parse_path(["spec", "hard", "requests.cpu"]) == ["spec", "hard", "requests.cpu"]
    assert m.parse_path(None) is None
    with pytest.raises(m.MeasureError):
        m.parse_path("spec..pods")
    with pytest.raises(m.MeasureError):
        m.parse_path(5)


def test_get_field_walks_dicts_and_lists():
    o = {"a": {"b": [10, {"c": "x"}]}}
    assert m.get_field(o, ["a", "b", "1", "c"]) == "x"
    assert m.get_field(o, ["a", "b", "0"]) == 10
    assert m.get_field(o, ["a", "b", "2"]) is m._MISSING
    assert m.get_field(o, ["a", "z"]) is m._MISSING
    assert m.get_field(o, ["a", "b", "0", "q"]) is m._MISSING


def test_as_text_makes_json_scalars_comparable():
    assert m.as_text(6) == m.as_text("6") == m.as_text(6.0)
    assert m.as_text(True) == "true"
    assert m.as_text(0.5) == "0.5"


@pytest.mark.parametrize("until,kw,observed,expected", [
    ("read", {}, None, True),
    ("present", {}, None, False),
    ("present", {}, obj(), True),
    ("absent", {}, None, True),
    ("absent", {}, obj(), False),
    ("uid_changed", {"uid": "u1"}, obj("u1"), False),
    ("uid_changed", {"uid": "u1"}, obj("u2"), True),
    ("uid_changed", {"uid": "u1"}, None, False),
    ("field_equals", {"keys": ["spec", "n"], "value": "6"}, obj(spec={"n": 6}), True),
    ("field_equals", {"keys": ["spec", "n"], "value": 6}, obj(spec={"n": "99"}), False),
    ("field_equals", {"keys": ["spec", "n"], "value": 6}, obj(), False),
    ("field_equals", {"keys": ["spec", "n"], "value": 6}, None, False),
    ("field_differs", {"keys": ["spec", "n"], "value": "99"}, obj(spec={"n": "99"}), False),
    ("field_differs", {"keys": ["spec", "n"], "value": "99"}, obj(spec={"n": "6"}), True),
    ("field_differs", {"keys": ["spec", "n"], "value": "99"}, obj(), True),
    ("field_contains", {"keys": ["metadata", "finalizers"], "value": "f"},
     obj(), False),
    ("field_present", {"keys": ["status", "hard"]}, obj(), False),
    ("field_present", {"keys": ["status", "hard"]}, obj(status={"hard": {}}), False),
    ("field_present", {"keys": ["status", "hard"]}, obj(status={"hard": {"pods": "4"}}), True),
    ("field_contains", {"keys": ["metadata", "finalizers"], "value": "f"},
     {"metadata": {"finalizers": ["a", "f"]}}, True),
])
def test_conditions(until, kw, observed, expected):
    assert m.make_condition(until, **kw)(observed) is expected


@pytest.mark.parametrize("until,kw", [("field_equals", {"value": 1}),
                                      ("field_equals", {"keys": ["a"]}),
                                      ("uid_changed", {}), ("bogus", {})])
def test_conditions_reject_missing_arguments(until, kw):
    with pytest.raises(m.MeasureError):
        m.make_condition(until, **kw)


# --- polling ---------------------------------------------------------------------------------

def test_poll_stops_as_soon_as_the_condition_holds():
    clock = FakeClock()
    seen = iter([1, 2, 3, 4])
    met, last, elapsed, polls = m.poll(lambda: next(seen), lambda v: v == 3, timeout=10,
                                       interval=0.5, clock=clock, sleep=clock.sleep)
    assert (met, last, polls) == (True, 3, 3)
    assert elapsed == pytest.approx(1.0)


def test_poll_is_bounded_by_time():
    clock = FakeClock()
    met, _, elapsed, polls = m.poll(lambda: None, lambda v: False, timeout=2, interval=0.5,
                                    max_polls=1000, clock=clock, sleep=clock.sleep)
    assert not met
    assert elapsed == pytest.approx(2.0)
    assert polls == 5
    assert sum(clock.sleeps) <= 2.0 + 1e-9  # never sleeps past the deadline


def test_poll_is_bounded_by_count_even_if_time_stands_still():
    clock = FakeClock()
    reads = []
    met, _, _, polls = m.poll(lambda: reads.append(1), lambda v: False, timeout=3600,
                              interval=1, max_polls=7, clock=clock, sleep=lambda s: None)
    assert not met and polls == 7 and len(reads) == 7


def test_poll_default_poll_limit_follows_timeout_and_interval():
    clock = FakeClock()
    _, _, _, polls = m.poll(lambda: None, lambda v: False, timeout=3, interval=1,
                            clock=clock, sleep=lambda s: None)
    assert polls == 5  # ceil(3/1) + 2


@pytest.mark.parametrize("timeout,interval,max_polls", [(-1, 1, None), (1, 0, None), (1, 1, 0)])
def test_poll_rejects_unbounded_settings(timeout, interval, max_polls):
    with pytest.raises(m.MeasureError):
        m.poll(lambda: None, lambda v: True, timeout, interval, max_polls)


# --- measure ---------------------------------------------------------------------------------

def test_delete_then_wait_for_new_uid_uses_the_uid_read_before():
    clock = FakeClock()
    api = FakeApi(clock, obj("old"), after=[None, None, obj("new")], cost=0.25)
    res = run({"action": "delete", "until": "uid_changed"}, api, clock)
    assert api.calls[1] == ("delete", "old", "Background")
    assert res["met"] and res["changed"]
    assert res["observed"]["metadata"]["uid"] == "new"
    assert res["before"]["metadata"]["uid"] == "old"
    # clock starts after the first read (0.25 s) and before the delete; three reads, two sleeps
    assert res["elapsed"] == pytest.approx(3 * 0.25 + 2 * 1.0)
    assert res["elapsed_ceil"] == 3
    assert res["polls"] == 3


def test_read_right_after_delete_sees_the_deletion_timestamp():
    clock = FakeClock()
    blocked = obj("b", metadata={"uid": "b", "deletionTimestamp": "t"})
    api = FakeApi(clock, obj("b"), after=[blocked])
    res = run({"action": "delete", "until": "read"}, api, clock)
    assert res["met"] and res["exists"] and res["polls"] == 1
    assert res["observed"]["metadata"]["deletionTimestamp"] == "t"


def test_patch_to_subresource_and_field_value_is_returned():
    clock = FakeClock()
    api = FakeApi(clock, obj(spec={"hard": {"pods": "6"}}),
                  after=[obj(spec={"hard": {"pods": "99"}}), obj(spec={"hard": {"pods": "6"}})])
    res = run({"action": "patch", "patch": {"spec": {"hard": {"pods": "99"}}},
               "until": "field_differs", "field": "spec.hard.pods", "value": "99"}, api, clock)
    assert api.calls[1] == ("patch", {"spec": {"hard": {"pods": "99"}}}, None)
    assert res["met"] and res["value"] == "6" and res["polls"] == 2
    res = run({"action": "patch", "patch": {"status": {}}, "subresource": "status"},
              FakeApi(clock, obj()), clock)
    assert res["action_result"]["subresource"] == "status"


def test_timeout_is_reported_not_hidden():
    clock = FakeClock()
    api = FakeApi(clock, obj("old"))
    res = run({"until": "uid_changed", "uid": "old", "timeout": 3}, api, clock)
    assert res["met"] is False and res["elapsed"] == pytest.approx(3.0)
    assert res["changed"] is False


def test_check_mode_sends_nothing_when_there_is_an_action():
    clock = FakeClock()
    api = FakeApi(clock, obj())
    res = run({"action": "delete", "until": "absent"}, api, clock, check_mode=True)
    assert res["changed"] is True and "would delete" in res["msg"]
    assert api.calls == ["get"]


def test_check_mode_still_reads_without_an_action():
    clock = FakeClock()
    api = FakeApi(clock, None, after=[obj()])
    res = run({"until": "present"}, api, clock, check_mode=True)
    assert res["met"] and res["changed"] is False


def test_action_on_a_missing_object_fails_clearly():
    clock = FakeClock()
    with pytest.raises(m.MeasureError, match="does not exist"):
        run({"action": "delete"}, FakeApi(clock, None), clock)
    with pytest.raises(m.MeasureError, match="needs patch"):
        run({"action": "patch"}, FakeApi(clock, obj()), clock)


def test_argument_spec_matches_documentation():
    import yaml

    doc = yaml.safe_load(m.DOCUMENTATION)["options"]
    spec = m.argument_spec()
    for name, opts in doc.items():
        assert name in spec, name
        assert spec[name].get("default") == opts.get("default"), name
        assert spec[name].get("choices") == opts.get("choices"), name
        assert bool(spec[name].get("required")) == bool(opts.get("required")), name
