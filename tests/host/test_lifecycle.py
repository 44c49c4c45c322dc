"""A second host beside the session's: power off and boot again, then destroy leaves nothing."""

from __future__ import annotations

import os

import pytest
from hostlib import Host, wait_for

from testhost import instance as instance_mod


@pytest.fixture
def second_host():
    if os.geteuid() != 0:
        pytest.skip("the test host needs root")
    name = "pytest-life"
    instance_mod.destroy(name)
    inst = instance_mod.create(name)
    yield inst
    instance_mod.destroy(name)


def test_reboot_keeps_state_and_destroy_leaves_nothing(host, second_host):
    inst = second_host
    # Two hosts at once: their ports must not collide.
    assert not set(inst.ports.values()) & set(host.inst.ports.values())
    h = Host(inst)
    h.kubectl("create", "configmap", "survivor", "--from-literal=k=v")
    h.sh("printf '[Service]\\nExecStart=/bin/sleep 1000\\n[Install]\\nWantedBy=multi-user.target\\n'"
         " > /etc/systemd/system/probe.service && systemctl enable --now probe")

    inst.poweroff()
    assert not inst.running()
    assert inst.leftovers() == []

    inst.boot()
    inst.wait_ready()
    assert h.get("configmap", "survivor")["data"] == {"k": "v"}
    wait_for(lambda: h.sh("systemctl is-active probe", check=False).stdout.strip() == "active",
             timeout=30, what="the enabled unit to come back after boot")
    # The first-boot PKI is not made again: the admin kubeconfig still works (checked above).

    instance_mod.destroy(inst.name)
    assert inst.leftovers() == []
    assert not inst.dir.exists()
