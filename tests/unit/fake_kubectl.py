#!/usr/bin/env python3
"""A tiny stand-in for kubectl, enough for reconcile.sh's unit tests.

Like kubectl, a write names one object or many (`create|replace|patch -f` with a List, `patch
TYPE NAME...`; the patch as -p or --patch-file) and goes on after one fails. State lives in
$FAKE_KUBE_STATE (JSON: teamspaces, namespaces, quotas keyed by name/namespace, events keyed by name).
Every request is appended to $FAKE_KUBE_LOG as one JSON line {"verb", "resource", "name"} so the
tests can count list and write requests the way the API server's audit log would.
$FAKE_KUBE_DOWN=1 makes every request fail like an unreachable API server.
$FAKE_KUBE_CALLS, if set, gets one line per kubectl process ("VERB TYPE").
$FAKE_KUBE_AFTER_LIST, a JSON merge patch of the state, is applied right after the TeamSpaces are
listed: another client writing between reconcile.sh's read and its writes.
"""

from __future__ import annotations

import copy
import fcntl
import json
import os
import sys
from urllib.parse import parse_qs, urlsplit

TS = "teamspaces.v1alpha1.platform.labhub.io"


def load() -> dict:
    with open(os.environ["FAKE_KUBE_STATE"], encoding="utf-8") as fh:
        return json.load(fh)


def save(state: dict) -> None:
    # Atomic: reconcile.sh runs its lists concurrently, a reader must never see half a file.
    tmp = os.environ["FAKE_KUBE_STATE"] + f".{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(state, fh)
    os.replace(tmp, os.environ["FAKE_KUBE_STATE"])


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
            # A missing member tests equal to null, as in the API server.
            actual = parent[int(key)] if isinstance(parent, list) else parent.get(key)
            if actual != op["value"]:
                # What kubectl prints for a failed test op: a 422 naming neither object nor path.
                raise Failed("(Invalid): the server rejected our request due to an error in our request")
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


def positional(args: list) -> list:
    """Arguments that are not flags nor flag values (kubectl VERB TYPE NAME...)."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg.startswith("-"):
            skip = "=" not in arg and arg in ("-p", "-n", "-o", "-f", "-l", "--type", "--subresource",
                                               "--field-selector", "--patch-file")
        else:
            out.append(arg)
    return out


KINDS = {"Namespace": "namespaces", "ResourceQuota": "resourcequotas", "Event": "events",
         "TeamSpace": TS}


def where(state: dict, resource: str, obj_meta: dict) -> tuple[dict, str]:
    """The store and key of an object, by its resource and metadata."""
    if resource == TS:
        return state["teamspaces"], obj_meta["name"]
    if resource in ("namespaces", "namespace"):
        return state["namespaces"], obj_meta["name"]
    if resource == "events":
        return state.setdefault("events", {}), obj_meta["name"]
    return state["quotas"], obj_meta["namespace"]


def read_objects(path: str) -> list:
    """The objects of `-f PATH` (- for stdin): one object or a List."""
    if path == "-":
        doc = json.loads(sys.stdin.read())
    else:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    read_objects.last = doc["items"] if doc.get("kind") == "List" else [doc]
    return read_objects.last


def store_or_delete(store: dict, key: str, obj: dict) -> None:
    if obj["metadata"].get("deletionTimestamp") and not obj["metadata"].get("finalizers"):
        del store[key]
    else:
        store[key] = obj


class Failed(Exception):
    pass


def create(state: dict, obj: dict) -> dict:
    resource = KINDS[obj["kind"]]
    store, key = where(state, resource, obj["metadata"])
    if resource == "resourcequotas" and key not in state["namespaces"]:
        raise Failed(f'error when creating "STDIN": namespaces "{key}" not found')
    if key in store:
        raise Failed(f'(AlreadyExists): error when creating "STDIN": {resource} '
                     f'"{obj["metadata"]["name"]}" already exists')
    record("create", resource, obj["metadata"]["name"])
    obj = copy.deepcopy(obj)
    obj["metadata"]["uid"] = f"uid-{resource}-{key}-{state.get('rv', 100)}"
    bump(state, obj)
    store[key] = obj
    return obj


def replace(state: dict, obj: dict, sub: str | None) -> dict:
    resource = KINDS[obj["kind"]]
    store, key = where(state, resource, obj["metadata"])
    name = obj["metadata"]["name"]
    if key not in store:
        raise Failed(f'error when replacing "STDIN": {resource} "{name}" not found')
    old = store[key]
    # No resourceVersion: an unconditional update (the uid, when given, must still match).
    if obj["metadata"].get("uid") not in (None, old["metadata"].get("uid")):
        raise Failed(f'(Conflict): error when replacing "STDIN": Operation cannot be fulfilled on '
                     f'{resource} "{name}": Precondition failed: UID in precondition')
    if "resourceVersion" in obj["metadata"] and \
            obj["metadata"]["resourceVersion"] != old["metadata"]["resourceVersion"]:
        raise Failed(f'(Conflict): error when replacing "STDIN": Operation cannot be fulfilled on '
                     f'{resource} "{name}": the object has been modified; please apply your '
                     "changes to the latest version and try again")
    record("update", resource + ("/status" if sub else ""), name)
    new = copy.deepcopy(old)
    if sub == "status":
        new["status"] = obj.get("status")
    else:
        new = copy.deepcopy(obj)
        for field in ("uid", "deletionTimestamp"):
            if field in old["metadata"]:
                new["metadata"][field] = old["metadata"][field]
        new.pop("status", None)
        if "status" in old:
            new["status"] = old["status"]
    bump(state, new)
    store_or_delete(store, key, new)
    return new


def patch(state: dict, resource: str, name: str, namespace: str | None, kind: str, body) -> dict:
    store, key = where(state, resource, {"name": name, "namespace": namespace})
    if key not in store:
        raise Failed(f'{resource} "{name}" not found')
    old = store[key]
    if kind == "json":
        new = json_patch(old, body)
    else:
        want_rv = body.get("metadata", {}).get("resourceVersion")
        if want_rv is not None and want_rv != old["metadata"]["resourceVersion"]:
            raise Failed(f'Operation cannot be fulfilled on {resource} "{name}": the object has '
                         "been modified")
        new = merge(old, body)
        new.pop("status", None) if "status" not in old else new.__setitem__("status", old["status"])
    record("patch", resource, name)
    if new == old:
        return old
    bump(state, new)
    store_or_delete(store, key, new)
    return new


def where_kind(obj: dict, args: list) -> str:
    """The resource of a written object (test fixtures may leave out the kind)."""
    if obj.get("kind") in KINDS:
        return KINDS[obj["kind"]]
    if "-f" in args or any(a.startswith("-f=") for a in args):
        return KINDS[read_objects.last[0]["kind"]]
    return positional(args[1:])[0]


RAW = {"/apis/platform.labhub.io/v1alpha1/teamspaces": TS, "/api/v1/namespaces": "namespaces",
       "/api/v1/resourcequotas": "resourcequotas"}


def raw_to_get(args: list) -> list:
    """`get --raw PATH?QUERY` (how reconcile.sh lists) as the `get TYPE -l LABEL` it stands for."""
    url = urlsplit(opt(args, "--raw"))
    query = parse_qs(url.query)
    out = ["get", RAW[url.path], "-o", "json"]
    if "labelSelector" in query:
        out += ["-l", query["labelSelector"][0]]
    return out


def main(argv: list) -> None:
    args = [a for a in argv if not a.startswith("--request-timeout")]
    if args[:1] == ["get"] and opt(args, "--raw"):
        args = raw_to_get(args)
    if os.environ.get("FAKE_KUBE_DOWN") == "1":
        fail("The connection to the server 127.0.0.1:6443 was refused", 1)
    if os.environ.get("FAKE_KUBE_CALLS"):
        with open(os.environ["FAKE_KUBE_CALLS"], "a", encoding="utf-8") as fh:
            fh.write(" ".join([args[0], *positional(args[1:])[:1]]) + "\n")
    state = load()
    verb = args[0]
    if verb == "get":
        resource = args[1]
        record("list", resource)
        if resource == TS:
            items = list(state["teamspaces"].values())
            if os.environ.get("FAKE_KUBE_AFTER_LIST"):
                # Another client writes right after the TeamSpaces were read (a race, on demand).
                save(merge(state, json.loads(os.environ["FAKE_KUBE_AFTER_LIST"])))
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
    # Writes go on after an object fails, like kubectl: each error on stderr, exit status 1.
    sub = opt(args, "--subresource")
    if verb in ("create", "replace"):
        objs = read_objects(opt(args, "-f"))
        todo = [(lambda o=o: create(state, o)) if verb == "create"
                else (lambda o=o: replace(state, o, sub)) for o in objs]
    elif verb == "patch" and any(a.startswith("--validate") for a in args):
        fail("unknown flag: --validate", 1)  # as kubectl: patch has no such flag
    elif verb == "patch" and not sub:  # status is replaced, never patched
        if opt(args, "-f"):
            objs = read_objects(opt(args, "-f"))
            targets = [(KINDS[o["kind"]], o["metadata"]["name"], o["metadata"].get("namespace"))
                       for o in objs]
        else:
            resource, *names = positional(args[1:])
            targets = [(resource, n, opt(args, "-n")) for n in names]
        if opt(args, "--patch-file"):
            with open(opt(args, "--patch-file"), encoding="utf-8") as fh:
                body = json.load(fh)
        else:
            body = json.loads(opt(args, "-p"))
        todo = [(lambda r=r, n=n, ns=ns: patch(state, r, n, ns, opt(args, "--type"), body))
                for r, n, ns in targets]
    else:
        fail(f"fake kubectl: unsupported {argv}", 3)
    failed = False
    for write in todo:
        try:
            obj = write()
        except Failed as err:
            print(f"Error from server {err}", file=sys.stderr)
            failed = True
            continue
        if opt(args, "-o") == "json":
            # The API server always answers with the kind, even if the test's object lacks it.
            kind = {v: k for k, v in KINDS.items()}[where_kind(obj, args)]
            print(json.dumps({"kind": kind, **obj}))
        else:
            print(f"{KINDS.get(obj.get('kind'), 'object')}/{obj['metadata']['name']} written")
    save(state)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    # One fake call at a time: reconcile.sh sends large groups of writes from several kubectl
    # processes at once, and each call reads, changes and saves the whole state.
    with open(os.environ["FAKE_KUBE_STATE"] + ".lock", "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        main(sys.argv[1:])
