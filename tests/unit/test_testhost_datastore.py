"""The test host's datastore option (testhost/instance.py): what create writes for the units, what
it refuses, what older checkouts can still read, and how tests choose one (tests/hostlib.py)."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

import pytest

from testhost import instance, rootfs
from testhost.common import HostError

UNITS = Path(instance.__file__).with_name("files") / "etc/systemd/system"
# A single k3s server's default datastore endpoint (k3s's own, with its SQLite options).
K3S_SQLITE = ("sqlite:///var/lib/rancher/k3s/server/db/state.db"
              "?_journal=WAL&cache=shared&_busy_timeout=30000&_txlock=immediate")
PORTS = {"kine": {"ssh": 20001, "apiserver": 20002, "kine": 20013, "kcm": 20004},
         "etcd": {"ssh": 20001, "apiserver": 20002, "etcd_client": 20003, "etcd_peer": 20005,
                  "kcm": 20004}}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(instance, "cache_dir", lambda: tmp_path)
    return tmp_path


def test_kine_is_the_default_and_the_environment_chooses_for_a_run(monkeypatch):
    monkeypatch.delenv("CNPA_TESTHOST_DATASTORE", raising=False)
    assert instance.default_datastore() == instance.DEFAULT_DATASTORE == "kine"
    monkeypatch.setenv("CNPA_TESTHOST_DATASTORE", "etcd")
    assert instance.default_datastore() == "etcd"
    monkeypatch.setenv("CNPA_TESTHOST_DATASTORE", "sqlite")
    with pytest.raises(HostError, match="CNPA_TESTHOST_DATASTORE="):
        instance.default_datastore()


@pytest.mark.parametrize(("options", "message"), [
    ({"datastore": "mysql"}, "choose one of kine, etcd"),
    ({"compaction_interval": "5 minutes"}, "Go duration"),
    ({"compaction_interval": "-1s"}, "Go duration"),
])
def test_create_refuses_a_bad_option_before_touching_anything(cache, options, message):
    with pytest.raises(HostError, match=message):
        instance.create("refused", **options)
    assert not (cache / "instances" / "refused").exists()


@pytest.mark.parametrize("datastore", instance.DATASTORES)
def test_every_setting_a_unit_reads_is_written(datastore):
    """The units of the datastore and the control plane read ${TESTHOST_...} from
    /etc/default/testhost; each one must be there, or systemd passes an empty string."""
    text = instance._settings(PORTS[datastore], datastore, "5m")
    written = dict(line.split("=", 1) for line in text.splitlines())
    units = [f"{datastore}.service", "kube-apiserver.service", "kube-controller-manager.service",
             "testhost-pki.service"]
    read = {name for unit in units
            for name in re.findall(r"\$\{(TESTHOST_\w+)\}", (UNITS / unit).read_text())}
    assert read <= set(written), read - set(written)
    assert written["TESTHOST_DATASTORE"] == datastore
    assert written["TESTHOST_ETCD_COMPACTION_INTERVAL"] == "5m"


def test_the_api_server_stores_in_the_chosen_datastore():
    kine = dict(line.split("=", 1) for line in instance._settings(PORTS["kine"], "kine", "10s")
                .splitlines())
    etcd = dict(line.split("=", 1) for line in instance._settings(PORTS["etcd"], "etcd", "5m")
                .splitlines())
    assert kine["TESTHOST_STORAGE_SERVERS"] == "http://127.0.0.1:20013"  # kine's port
    assert etcd["TESTHOST_STORAGE_SERVERS"] == "http://127.0.0.1:20003"  # etcd's client port
    assert kine["TESTHOST_ETCD_COMPACTION_INTERVAL"] == "10s"
    apiserver = (UNITS / "kube-apiserver.service").read_text()
    assert "--etcd-servers=${TESTHOST_STORAGE_SERVERS}" in apiserver
    assert "--etcd-compaction-interval=${TESTHOST_ETCD_COMPACTION_INTERVAL}" in apiserver


def test_kine_runs_as_on_a_single_k3s_server_with_no_metrics_port():
    unit = (UNITS / "kine.service").read_text()
    assert f'"--endpoint={K3S_SQLITE}"' in unit
    assert K3S_SQLITE.startswith(f"sqlite://{instance.KINE_DB}?")
    assert "--listen-address=127.0.0.1:${TESTHOST_KINE_PORT}" in unit
    assert "--metrics-bind-address=0" in unit  # else it listens on :8080 of the shared network
    assert "--compact-interval" not in unit  # kine's default: compaction left to the API server


def test_the_rootfs_enables_no_datastore(tmp_path):
    """create enables the chosen one; a rootfs enabling both would start etcd beside kine."""
    rootfs._customise(tmp_path)
    wants = {p.name for p in (tmp_path / "etc/systemd/system/multi-user.target.wants").iterdir()}
    assert {"kube-apiserver.service", "kube-controller-manager.service"} <= wants
    assert not wants & {"etcd.service", "kine.service"}


def test_ports_are_picked_for_the_datastore(cache):
    names = ("ssh", "apiserver", *instance.DATASTORE_PORTS["kine"], "kcm")
    ports = instance._free_ports(names)
    assert tuple(ports) == names
    assert len(set(ports.values())) == len(names)


def test_the_datastore_is_read_from_the_host_and_state_json_keeps_its_fields(cache):
    """state.json is shared with older checkouts, which load it with Instance(**fields): it gets no
    new field; the datastore is read from the host's own settings, like its suite."""
    new = instance.Instance(name="new", ports=PORTS["kine"])
    (new.root / "etc/default").mkdir(parents=True)
    (new.root / "etc/default/testhost").write_text(instance._settings(new.ports, "kine", "5m"))
    new.save()
    assert set(json.loads((new.dir / "state.json").read_text())) == {
        "name", "ports", "nspawn_pid", "pid1"}
    assert asdict(instance.Instance.load("new")) == asdict(new)
    assert new.datastore() == "kine"
    assert new.setting("TESTHOST_ETCD_COMPACTION_INTERVAL") == "5m"
    # A host made before the option existed: no TESTHOST_DATASTORE, and it ran etcd.
    old = instance.Instance(name="old", ports=PORTS["etcd"])
    (old.root / "etc/default").mkdir(parents=True)
    (old.root / "etc/default/testhost").write_text("TESTHOST_SSH_PORT=20001\n")
    assert old.datastore() == "etcd"
    assert instance.Instance(name="gone").datastore() == "etcd"  # no rootfs at all


def test_session_host_creates_on_the_datastore_a_module_asks_for(monkeypatch):
    import hostlib

    made, destroyed = [], []
    monkeypatch.setattr(hostlib.instance_mod, "destroy", destroyed.append)
    monkeypatch.setattr(hostlib.instance_mod, "create",
                        lambda name, **kw: made.append((name, kw)) or instance.Instance(name=name))
    with hostlib.session_host("h", "NO_SUCH_REUSE_VAR", datastore="etcd",
                              compaction_interval="10s") as inst:
        assert inst.name == "h"
    assert made == [("h", {"datastore": "etcd", "compaction_interval": "10s"})]
    assert destroyed == ["h", "h"]  # a leftover first, then the host itself


def test_a_reused_host_on_another_datastore_is_refused(monkeypatch):
    import hostlib

    running = instance.Instance(name="h")
    monkeypatch.setenv("REUSE_H", "1")
    monkeypatch.setattr(hostlib.instance_mod.Instance, "load", classmethod(lambda cls, n: running))
    monkeypatch.setattr(instance.Instance, "running", lambda self: True)
    monkeypatch.setattr(instance.Instance, "datastore", lambda self: "etcd")
    with pytest.raises(AssertionError, match="stores in etcd, not kine"), \
            hostlib.session_host("h", "REUSE_H", datastore="kine"):
        pass
    with hostlib.session_host("h", "REUSE_H", datastore="etcd") as inst:
        assert inst is running
