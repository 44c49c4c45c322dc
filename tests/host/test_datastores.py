"""The API server's two datastores side by side: kine on SQLite, as a single k3s server stores
(testhost's default), and etcd, as k3s HA stores.

Each datastore gets a host of its own made here (pytest-kine, then pytest-etcd; one at a time),
with the API server's compaction interval shortened to COMPACTION so that compaction happens
within the test. CNPA_DATASTORE_REUSE=1 reuses running hosts of those names, left running.
What differs between the two is in test_compaction_expires_old_resource_versions.
"""

from __future__ import annotations

import base64
import json
import os
import uuid

import pytest
from hostlib import Host, compactions, session_host, wait_for

from testhost import instance as instance_mod

COMPACTION_SECONDS = 5
COMPACTION = f"{COMPACTION_SECONDS}s"  # the API server's --etcd-compaction-interval on both hosts
# kine compacts no revision among the newest 1000 (its --compact-min-retain default), whatever the
# API server asks for.
KINE_RETAINS = 1000


@pytest.fixture(scope="module", params=instance_mod.DATASTORES)
def store(request):
    if os.geteuid() != 0:
        pytest.skip("the test host needs root")
    with session_host(f"pytest-{request.param}", "CNPA_DATASTORE_REUSE", datastore=request.param,
                      compaction_interval=COMPACTION) as inst:
        yield Host(inst)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _ready(host: Host) -> bool:
    return host.kubectl("get", "--raw", "/readyz", check=False, timeout=10).stdout == "ok"


def _rv(host: Host, *what: str) -> int:
    return int(host.get(*what)["metadata"]["resourceVersion"])


def _sqlite(host: Host, key: str) -> dict:
    """kine's database read inside the host (read-only): the rows of one key, the bytes in use."""
    script = (
        "import json, os, sqlite3, sys\n"
        f"path = {instance_mod.KINE_DB!r}\n"
        "db = sqlite3.connect(f'file:{path}?mode=ro', uri=True)\n"
        "one = lambda q, *a: db.execute(q, a).fetchone()[0]\n"
        "used = (one('pragma page_count') - one('pragma freelist_count')) * one('pragma page_size')\n"
        "print(json.dumps({'rows': one('select count(*) from kine where name = ?', sys.argv[1]),\n"
        "                  'used': used, 'file': os.path.getsize(path)}))\n")
    return json.loads(host.inst.exec(["python3", "-c", script, key]).stdout)


def _in_etcd(host: Host, key: str) -> int:
    """How many keys named key etcd holds, asked through its own JSON gateway."""
    body = json.dumps({"key": base64.b64encode(key.encode()).decode(), "count_only": True})
    out = host.sh(f". /etc/default/testhost && curl -sf -X POST "
                  f"http://127.0.0.1:$TESTHOST_ETCD_CLIENT_PORT/v3/kv/range -d '{body}'").stdout
    return int(json.loads(out).get("count", 0))


def _after_compactions(host: Host, count: int) -> None:
    """Wait for count more Compact calls. The API server's call k compacts to the revision that
    call k-1 saw: two calls after a write, that write's revision is asked to be compacted."""
    first = compactions(host)
    wait_for(lambda: compactions(host) >= first + count, timeout=count * COMPACTION_SECONDS + 60,
             interval=1, what=f"{count} compactions by the API server")


def _watch_from(host: Host, path: str, rv: int) -> dict:
    """The first event of a one-second watch on path from resourceVersion rv ({} if none came)."""
    out = host.kubectl("get", "--raw", f"{path}?watch=1&resourceVersion={rv}&timeoutSeconds=1").stdout
    return json.loads(out.splitlines()[0]) if out.strip() else {}


def _expired(event: dict) -> bool:
    return event.get("type") == "ERROR" and event["object"]["code"] == 410


def _continue(host: Host, token: str) -> str:
    """What the API server says to the next page of a list ("" when it serves it)."""
    proc = host.kubectl("get", "--raw",
                        f"/api/v1/namespaces/default/configmaps?limit=1&continue={token}", check=False)
    return "" if proc.returncode == 0 else proc.stderr


def test_the_api_server_stores_in_its_datastore_only(store):
    datastore = store.inst.datastore()
    assert store.inst.info()["datastore"] == datastore
    assert _ready(store)
    other = next(d for d in instance_mod.DATASTORES if d != datastore)
    assert store.sh(f"systemctl is-active {datastore}").stdout.strip() == "active"
    assert store.sh(f"systemctl is-active {other}", check=False).stdout.strip() == "inactive"
    assert store.sh(f"pgrep -x {other}", check=False).returncode == 1  # not running at all
    port = store.inst.ports["kine" if datastore == "kine" else "etcd_client"]
    apiserver = store.sh("tr '\\0' ' ' < /proc/$(systemctl show -p MainPID --value "
                         "kube-apiserver)/cmdline").stdout
    assert f"--etcd-servers=http://127.0.0.1:{port} " in apiserver
    assert f"--etcd-compaction-interval={COMPACTION} " in apiserver


def test_a_write_lands_in_the_datastore(store):
    name = _name("stored")
    key = f"/registry/configmaps/default/{name}"
    if store.inst.datastore() == "kine":
        before = _sqlite(store, key)
        # 256 KiB that SQLite cannot share with anything: it must take new pages.
        store.sh(f"head -c 196608 /dev/urandom | base64 -w0 > /tmp/{name} && "
                 f"kubectl create configmap {name} --from-file=blob=/tmp/{name} >/dev/null")
        after = _sqlite(store, key)
        assert (before["rows"], after["rows"]) == (0, 1)
        assert after["used"] - before["used"] >= 256 * 1024, (before, after)
        assert after["file"] > 0
    else:
        store.kubectl("create", "configmap", name, "--from-literal=k=v")
        assert _in_etcd(store, key) == 1
        assert store.sh(f"test -e {instance_mod.KINE_DB}", check=False).returncode == 1


def test_a_write_survives_an_api_server_restart_and_a_power_off(store):
    name = _name("kept")
    store.kubectl("create", "configmap", name, "--from-literal=k=v")
    store.sh("systemctl restart kube-apiserver", timeout=90)
    wait_for(lambda: _ready(store), timeout=90, interval=0.5, what="kube-apiserver ready again")
    assert store.get("configmap", name)["data"] == {"k": "v"}
    store.inst.poweroff()
    assert not store.inst.running()
    store.inst.boot()
    store.inst.wait_ready()
    assert store.get("configmap", name)["data"] == {"k": "v"}
    assert store.sh(f"systemctl is-active {store.inst.datastore()}").stdout.strip() == "active"


def test_compaction_expires_old_resource_versions(store):
    """A resourceVersion older than the datastore's compaction is gone (410 Expired) wherever the
    request reaches the datastore: a watch of events (which the API server does not cache) and a
    list's continue token. A watch of a cached resource (configmaps, as TeamSpaces) from the same
    resourceVersion is still served from the API server's watch cache.

    etcd compacts to the revision the API server asks for; kine keeps its newest 1000 revisions
    whatever it asks, so on kine an old resourceVersion expires only after 1000 more writes."""
    name = _name("old")
    store.kubectl("create", "configmap", name, "--from-literal=k=v")
    old = _rv(store, "configmap", name)
    for i in range(3):  # revisions after old; and more than one page of configmaps
        store.kubectl("create", "configmap", f"{name}-{i}", "--from-literal=k=v")
    store.kubectl("create", "-f", "-", input_text=json.dumps({  # for a watch of events to see
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": "default"},
        "involvedObject": {"kind": "ConfigMap", "name": name, "namespace": "default"},
        "reason": "Probe", "message": "after the old version", "type": "Normal"}))
    page = store.kubectl("get", "--raw", "/api/v1/namespaces/default/configmaps?limit=1").stdout
    token = json.loads(page)["metadata"]["continue"]
    _after_compactions(store, 2)  # the API server asks for a compaction past old and token

    if store.inst.datastore() == "kine":
        # Asked to compact past old, kine has not: it keeps its newest 1000 revisions.
        assert _watch_from(store, "/api/v1/events", old)["object"]["metadata"]["name"] == name
        assert "too old" not in _continue(store, token)
        ns = _name("writes")
        store.kubectl("create", "namespace", ns)
        items = [{"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": f"w{i}", "namespace": ns}} for i in range(KINE_RETAINS + 50)]
        store.kubectl("create", "-f", "-", timeout=300,
                      input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
        _after_compactions(store, 2)

    event = wait_for(lambda: (e := _watch_from(store, "/api/v1/events", old)) and _expired(e) and e,
                     timeout=60, interval=1, what="a watch of events from the old version to expire")
    assert event["object"]["reason"] == "Expired"
    # The API server's cache of list snapshots lets go of compacted ones within 15 s.
    message = wait_for(lambda: _continue(store, token), timeout=60, interval=1,
                       what="the continue token to expire")
    assert "The provided continue parameter is too old" in message
    cached = _watch_from(store, "/api/v1/namespaces/default/configmaps", old)
    assert not _expired(cached)
    assert int(cached["object"]["metadata"]["resourceVersion"]) > old
