#!/usr/bin/env python3
"""A tiny stand-in for kubectl, enough for reconcile.sh's unit tests.

State lives in $FAKE_KUBE_STATE (JSON: teamspaces, namespaces, quotas keyed by name/namespace,
events keyed by name).
Every request is appended to $FAKE_KUBE_LOG as one JSON line {"verb", "resource", "name"} so the
tests can count list and write requests the way the API server's audit log would.
$FAKE_KUBE_DOWN=1 makes every request fail like an unreachable API server.
"""

from __future__ import annotations

import copy
import json
import os
import sys

TS = "teamspaces.v1alpha1.platform.labhub.io"


def load() -> dict:
    with open(os.environ["FAKE_KUBE_STATE"], encoding="utf-8") as fh:
        return json.load(fh)


def save(state: dict) -> None:
    with open(os.environ["FAKE_KUBE_STATE"], "w", encoding="utf-8") as fh:
        json.dump(state, fh)


def record(verb: str, resource: str, name: str = "") -> None:
    with open(os.environ["FAKE_KUBE_LOG"], "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"verb": verb, "resource": resource, "name": name}) + "\n")


def bump(state: dict, obj: dict) -> None:
    state["rv"] = state.get("rv", 100) + 1
    obj["metadata"]["resourceVersion"] = str(state["rv"])


def fail(msg: str, code: int = 1) -> None:
    print(f"Error from server: {msg}", file=sys.stderr)
    sys.exit(code)


def merge(target, patch):
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge(out.get(key), value)
    return out


def _walk(doc, path: str):
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]
    parent = doc
    for part in parts[:-1]:
        parent = parent[int(part)] if isinstance(parent, list) else parent[part]
    return parent, parts[-1]


def json_patch(doc: dict, ops: list) -> dict:
    doc = copy.deepcopy(doc)
    for op in ops:
        parent, key = _walk(doc, op["path"])
        if op["op"] == "test":
            actual = parent[int(key)] if isinstance(parent, list) else parent.get(key, KeyError)
            if actual != op["value"]:
                fail(f"the server rejected our request: testing value {op['path']} failed", 1)
        elif op["op"] == "add":
            if isinstance(parent, list):
                parent.insert(len(parent) if key == "-" else int(key), op["value"])
            else:
                parent[key] = op["value"]
        elif op["op"] == "remove":
            if isinstance(parent, list):
                parent.pop(int(key))
            else:
                del parent[key]
    return doc


def opt(args: list, name: str, default=None):
    for i, arg in enumerate(args):
        if arg == name:
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return default


def main(argv: list) -> None:
    args = [a for a in argv if not a.startswith("--request-timeout")]
    if os.environ.get("FAKE_KUBE_DOWN") == "1":
        fail("The connection to the server 127.0.0.1:6443 was refused", 1)
    state = load()
    verb = args[0]
    if verb == "get":
        resource = args[1]
        record("list", resource)
        if resource == TS:
            items = list(state["teamspaces"].values())
        elif resource == "events":
            items = list(state.get("events", {}).values())
            if (opt(args, "-o") or "").startswith("jsonpath="):
                # reconcile.sh asks only for the names, one per line
                print("".join(e["metadata"]["name"] + "\n" for e in items), end="")
                return
        elif resource == "namespaces":
            label = opt(args, "-l")
            items = [n for n in state["namespaces"].values()
                     if label in n["metadata"].get("labels", {})]
        else:
            items = list(state["quotas"].values())
        print(json.dumps({"items": items}))
        return
    if verb == "create":
        obj = json.loads(sys.stdin.read())
        if obj["kind"] == "Namespace":
            store, key, resource = state["namespaces"], obj["metadata"]["name"], "namespaces"
        elif obj["kind"] == "Event":
            store, key, resource = state.setdefault("events", {}), obj["metadata"]["name"], "events"
        else:
            store, key, resource = state["quotas"], obj["metadata"]["namespace"], "resourcequotas"
            if key not in state["namespaces"]:
                fail(f'namespaces "{key}" not found')
        if key in store:
            fail(f'(AlreadyExists): {resource} "{obj["metadata"]["name"]}" already exists')
        record("create", resource, obj["metadata"]["name"])
        obj["metadata"]["uid"] = f"uid-{resource}-{key}-{state.get('rv', 100)}"
        bump(state, obj)
        store[key] = obj
        save(state)
        print(f"{resource}/{obj['metadata']['name']} created")
        return
    if verb == "patch":
        resource, name = args[1], args[2]
        body = json.loads(opt(args, "-p"))
        kind = opt(args, "--type")
        if resource == TS:
            store, key = state["teamspaces"], name
        elif resource == "namespace":
            store, key = state["namespaces"], name
        else:
            store, key = state["quotas"], opt(args, "-n")
        if key not in store:
            fail(f'{resource} "{name}" not found')
        old = store[key]
        sub = opt(args, "--subresource")
        if sub == "status":
            new = copy.deepcopy(old)
            new["status"] = merge(old.get("status"), body.get("status"))
        elif kind == "json":
            new = json_patch(old, body)
        else:
            want_rv = body.get("metadata", {}).get("resourceVersion")
            if want_rv is not None and want_rv != old["metadata"]["resourceVersion"]:
                fail("Operation cannot be fulfilled: the object has been modified")
            new = merge(old, body)
            new.pop("status", None) if "status" not in old else new.__setitem__("status", old["status"])
        record("patch", resource + ("/status" if sub else ""), name)
        if new == old:
            print(f"{resource}/{name} patched (no change)")
            return
        bump(state, new)
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            del store[key]
        else:
            store[key] = new
        save(state)
        print(f"{resource}/{name} patched")
        return
    fail(f"fake kubectl: unsupported {argv}", 3)


if __name__ == "__main__":
    main(sys.argv[1:])
