#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Timed measurements on one Kubernetes object for the cnpa-op lab."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: cnpa_measure
short_description: Act on one Kubernetes object and measure how long until a condition holds
description:
  - Reads one object, optionally acts on it (delete it, or send a merge patch to it or to its
    C(status) subresource), then polls it until a condition holds and returns the elapsed time and
    what was observed.
  - The clock starts immediately before the action (or before the first read when there is no
    action), so the elapsed time measures the cluster, not Ansible's task overhead.
  - Every wait is bounded twice, by O(timeout) seconds and by O(max_polls) reads.
  - Used by the cnpa-op step playbooks for C(restore_seconds), C(blocked_seen) and the catch-up
    waits; connection options are those of the kubernetes.core modules.
version_added: "1.0.0"
author:
  - cnpa-op maintainers (@labhub)
options:
  api_version:
    description: API version of the object, as in kubernetes.core.k8s.
    type: str
    default: v1
  kind:
    description: Kind of the object (kind, plural name or short name).
    type: str
    required: true
  name:
    description: Name of the object.
    type: str
    required: true
  namespace:
    description: Namespace of the object, for namespaced kinds.
    type: str
  action:
    description:
      - What to do to the object before measuring.
      - C(none) only reads and waits.
      - C(delete) sends a delete request with O(propagation_policy) and a uid precondition (the
        object measured is the object deleted), without waiting for the object to go.
      - C(patch) sends O(patch) as a JSON merge patch, to O(subresource) when given.
    type: str
    choices: [none, delete, patch]
    default: none
  patch:
    description: The JSON merge patch body for O(action=patch).
    type: dict
  subresource:
    description: Send the patch to this subresource (for example C(status)).
    type: str
  propagation_policy:
    description: Propagation policy of the delete request.
    type: str
    choices: [Background, Foreground, Orphan]
    default: Background
  until:
    description:
      - The condition to wait for after the action.
      - C(read) does not wait, it reads once right after the action.
      - C(present) and C(absent) wait for the object to exist or to be gone.
      - C(uid_changed) waits until an object with the same name exists with a uid different
        from O(uid) (default, the uid read before the action).
      - C(field_present) waits until O(field) exists and is not null or empty.
      - C(field_equals) and C(field_differs) compare O(field) with O(value) as strings (so
        C(6) equals C("6")); a missing field never equals a value.
      - C(field_contains) waits until the list at O(field) contains O(value).
    type: str
    choices: [read, present, absent, uid_changed, field_present, field_equals, field_differs,
              field_contains]
    default: read
  uid:
    description: The uid to compare with for O(until=uid_changed).
    type: str
  field:
    description:
      - Path of the field to observe, as a dotted string (C(spec.hard.pods)) or, when a key
        itself contains dots, as a list of keys (C([spec, hard, requests.cpu])).
      - The observed value is returned as RV(value) for every O(until).
    type: raw
  value:
    description: The value to compare O(field) with.
    type: raw
  timeout:
    description: Maximum number of seconds to wait for the condition.
    type: float
    default: 60
  interval:
    description: Seconds between two reads while waiting.
    type: float
    default: 0.25
  max_polls:
    description: Maximum number of reads while waiting (default derived from O(timeout) and O(interval)).
    type: int
  fail_on_timeout:
    description: Fail when the condition does not hold in time; otherwise return RV(met=false).
    type: bool
    default: true
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
attributes:
  check_mode:
    description: Can run in check mode and return changed status prediction without modifying target.
    support: partial
    details: Without an action the module reads and waits as usual (read-only). With an action,
      nothing is sent and nothing is waited for; the result says what would have been done.
requirements:
  - python >= 3.6
  - kubernetes >= 24.2.0
  - the kubernetes.core collection
notes:
  - Timing resolution is O(interval); the elapsed time is measured with a monotonic clock.
"""

EXAMPLES = r"""
- name: Delete the quota and measure until it is back with a new uid
  cnpa_measure:
    kubeconfig: /etc/rancher/k3s/k3s.yaml
    kind: ResourceQuota
    namespace: team-alpha
    name: team-quota
    action: delete
    until: uid_changed
    timeout: 60
  register: restore

- name: Patch pods to 99 and wait until the controller changes it back
  cnpa_measure:
    kind: ResourceQuota
    namespace: team-alpha
    name: team-quota
    action: patch
    patch: {spec: {hard: {pods: "99"}}}
    until: field_differs
    field: spec.hard.pods
    value: "99"

- name: Delete a TeamSpace without waiting and read it right away
  cnpa_measure:
    api_version: platform.labhub.io/v1alpha1
    kind: TeamSpace
    name: beta
    action: delete
    until: read
  register: right_after

- name: Wait until observedGeneration catches up
  cnpa_measure:
    api_version: platform.labhub.io/v1alpha1
    kind: TeamSpace
    name: alpha
    until: field_equals
    field: status.observedGeneration
    value: 4
"""

RETURN = r"""
met:
  description: Whether the condition held before the time or poll limit.
  returned: always
  type: bool
elapsed:
  description: Seconds from just before the action (or the first read) to the read that met the
    condition (or the last read), rounded to milliseconds.
  returned: always
  type: float
  sample: 2.314
elapsed_ceil:
  description: RV(elapsed) rounded up to whole seconds.
  returned: always
  type: int
  sample: 3
polls:
  description: Number of reads made while waiting.
  returned: always
  type: int
exists:
  description: Whether the object existed at the last read.
  returned: always
  type: bool
observed:
  description: The object at the last read (null when it did not exist).
  returned: always
  type: dict
value:
  description: The value at O(field) in the last read (null when absent or no O(field)).
  returned: always
  type: raw
before:
  description: The object as read just before the action (null when it did not exist).
  returned: always
  type: dict
action_result:
  description: The API server's response to the action (the patched object, or the object as
    returned by the delete request, with its deletionTimestamp).
  returned: when an action was sent
  type: dict
"""

import math
import time

try:
    from ansible_collections.kubernetes.core.plugins.module_utils.args_common import (
        AUTH_ARG_SPEC,
    )
    from ansible_collections.kubernetes.core.plugins.module_utils.k8s.client import (
        get_api_client,
    )
    from ansible_collections.kubernetes.core.plugins.module_utils.k8s.core import (
        AnsibleK8SModule,
    )
    from ansible_collections.kubernetes.core.plugins.module_utils.k8s.exceptions import (
        CoreException,
    )
    HAS_K8S_CORE = True
except ImportError:  # pragma: no cover - reported by main()
    AUTH_ARG_SPEC = {}
    HAS_K8S_CORE = False

CONDITIONS = ("read", "present", "absent", "uid_changed", "field_present", "field_equals",
              "field_differs", "field_contains")


class MeasureError(Exception):
    """A measurement could not be made; the message says why."""


def parse_path(field):
    """Turn 'spec.hard.pods' or ['spec', 'hard', 'requests.cpu'] into a list of keys."""
    if field is None:
        return None
    if isinstance(field, (list, tuple)):
        keys = [str(k) for k in field]
    elif isinstance(field, str):
        keys = field.split(".")
    else:
        raise MeasureError("field must be a dotted string or a list of keys, got %r" % (field,))
    if not keys or any(k == "" for k in keys):
        raise MeasureError("field %r has an empty key" % (field,))
    return keys


_MISSING = object()


def get_field(obj, keys):
    """Value at keys in obj (dicts and list indexes), or _MISSING."""
    cur = obj
    for key in keys:
        if isinstance(cur, dict) and key in cur:
            cur = cur[key]
        elif isinstance(cur, list) and key.isdigit() and int(key) < len(cur):
            cur = cur[int(key)]
        else:
            return _MISSING
    return cur


def as_text(value):
    """Comparable text form: 6 and '6' compare equal, True is 'true' (as in JSON)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def make_condition(until, uid=None, keys=None, value=None):
    """Return a predicate on the observed object (a dict, or None when it does not exist)."""
    if until not in CONDITIONS:
        raise MeasureError("unknown condition %r" % (until,))
    if until.startswith("field_") and keys is None:
        raise MeasureError("until=%s needs field" % until)
    if until.startswith("field_") and until != "field_present" and value is None:
        raise MeasureError("until=%s needs value" % until)
    if until == "uid_changed" and not uid:
        raise MeasureError("until=uid_changed needs a uid (none given and no object before the action)")

    def check(obj):
        if until == "read":
            return True
        if until == "present":
            return obj is not None
        if until == "absent":
            return obj is None
        if obj is None:
            return False
        if until == "uid_changed":
            return obj.get("metadata", {}).get("uid") not in (None, uid)
        found = get_field(obj, keys)
        if until == "field_present":
            return found is not _MISSING and found not in (None, {}, [], "")
        if until == "field_contains":
            return isinstance(found, list) and as_text(value) in [as_text(v) for v in found]
        if found is _MISSING:
            return until == "field_differs"
        if until == "field_equals":
            return as_text(found) == as_text(value)
        return as_text(found) != as_text(value)

    return check


def poll(read, condition, timeout, interval, max_polls=None, start=None,
         clock=time.monotonic, sleep=time.sleep):
    """Read until condition holds, at most `timeout` seconds after `start` and `max_polls` reads.

    Returns (met, last_observed, elapsed_seconds, polls). The first read happens at once.
    """
    if timeout < 0 or interval <= 0:
        raise MeasureError("timeout must be >= 0 and interval > 0")
    if max_polls is None:
        max_polls = math.ceil(timeout / interval) + 2
    if max_polls < 1:
        raise MeasureError("max_polls must be >= 1")
    start = clock() if start is None else start
    polls = 0
    while True:
        obj = read()
        polls += 1
        elapsed = clock() - start
        if condition(obj):
            return True, obj, elapsed, polls
        if polls >= max_polls or elapsed >= timeout:
            return False, obj, elapsed, polls
        sleep(min(interval, max(timeout - elapsed, 0)))


def measure(params, api, check_mode=False, clock=time.monotonic, sleep=time.sleep):
    """The module's logic, independent of Ansible and of the Kubernetes client.

    `api` provides get() -> dict|None, delete(uid, propagation_policy) -> dict and
    patch(body, subresource) -> dict.
    """
    action = params.get("action") or "none"
    until = params.get("until") or "read"
    keys = parse_path(params.get("field"))
    if action == "patch" and not params.get("patch"):
        raise MeasureError("action=patch needs patch")
    before = api.get()
    if action != "none" and before is None:
        raise MeasureError("cannot %s %s: it does not exist" % (action, params.get("name")))
    uid = params.get("uid") or (before or {}).get("metadata", {}).get("uid")
    condition = make_condition(until, uid=uid, keys=keys, value=params.get("value"))
    result = {"changed": False, "before": before}

    if check_mode and action != "none":
        result.update(changed=True, met=False, elapsed=0.0, elapsed_ceil=0, polls=0,
                      exists=True, observed=before, value=None,
                      msg="check mode: would %s and wait until %s" % (action, until))
        return result

    start = clock()
    if action == "delete":
        result["action_result"] = api.delete(uid, params.get("propagation_policy") or "Background")
        result["changed"] = True
    elif action == "patch":
        result["action_result"] = api.patch(params["patch"], params.get("subresource"))
        result["changed"] = True

    met, obj, elapsed, polls = poll(api.get, condition, float(params.get("timeout", 60)),
                                    float(params.get("interval", 0.25)), params.get("max_polls"),
                                    start=start, clock=clock, sleep=sleep)
    value = None
    if keys is not None and obj is not None:
        found = get_field(obj, keys)
        value = None if found is _MISSING else found
    result.update(met=met, observed=obj, exists=obj is not None, value=value, polls=polls,
                  elapsed=round(elapsed, 3), elapsed_ceil=math.ceil(round(elapsed, 3)))
    return result


class KubeApi:
    """get/delete/patch of one object through kubernetes.core's client."""

    def __init__(self, client, params):
        self.client = client
        self.resource = client.resource(params["kind"], params["api_version"])
        self.name = params["name"]
        self.namespace = params.get("namespace")

    def get(self):
        from kubernetes.dynamic.exceptions import NotFoundError

        try:
            return self.client.get(self.resource, name=self.name, namespace=self.namespace).to_dict()
        except NotFoundError:
            return None

    def delete(self, uid, propagation_policy):
        body = {"propagationPolicy": propagation_policy}
        if uid:
            body["preconditions"] = {"uid": uid}
        res = self.client.delete(self.resource, name=self.name, namespace=self.namespace, body=body)
        return res.to_dict() if hasattr(res, "to_dict") else res

    def patch(self, body, subresource=None):
        resource = self.resource
        if subresource:
            if subresource not in resource.subresources:
                raise MeasureError("%s has no subresource %s" % (resource.kind, subresource))
            resource = resource.subresources[subresource]
        res = self.client.patch(resource, body, name=self.name, namespace=self.namespace,
                                content_type="application/merge-patch+json")
        return res.to_dict()


def argument_spec():
    spec = dict(AUTH_ARG_SPEC)
    spec.update(
        api_version=dict(type="str", default="v1"),
        kind=dict(type="str", required=True),
        name=dict(type="str", required=True),
        namespace=dict(type="str"),
        action=dict(type="str", default="none", choices=["none", "delete", "patch"]),
        patch=dict(type="dict"),
        subresource=dict(type="str"),
        propagation_policy=dict(type="str", default="Background",
                                choices=["Background", "Foreground", "Orphan"]),
        until=dict(type="str", default="read", choices=list(CONDITIONS)),
        uid=dict(type="str"),
        field=dict(type="raw"),
        value=dict(type="raw"),
        timeout=dict(type="float", default=60),
        interval=dict(type="float", default=0.25),
        max_polls=dict(type="int"),
        fail_on_timeout=dict(type="bool", default=True),
    )
    return spec


def main():  # pragma: no cover - exercised on a real cluster by the step playbooks
    if not HAS_K8S_CORE:
        from ansible.module_utils.basic import AnsibleModule

        AnsibleModule(argument_spec={}, bypass_checks=True).fail_json(
            msg="cnpa_measure needs the kubernetes.core collection (module_utils)")
    module = AnsibleK8SModule(argument_spec=argument_spec(), supports_check_mode=True)
    from kubernetes.dynamic.exceptions import DynamicApiError

    try:
        client = get_api_client(module)
        result = measure(module.params, KubeApi(client, module.params), module.check_mode)
    except MeasureError as exc:
        module.fail_json(msg=str(exc))
    except DynamicApiError as exc:
        module.fail_json(msg="API request failed: %s" % (exc.body or exc.reason), status=exc.status)
    except CoreException as exc:
        module.fail_from_exception(exc)
    skipped = module.check_mode and result["changed"]
    if not result["met"] and module.params["fail_on_timeout"] and not skipped:
        result["msg"] = "%s %s: condition %s not met after %.1f s (%d reads)" % (
            module.params["kind"], module.params["name"], module.params["until"],
            result["elapsed"], result["polls"])
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
