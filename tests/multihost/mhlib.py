"""Three test hosts on one API server: the multi-host tests' hosts, and what to ask them.

Test hosts share the machine's network namespace (testhost/instance.py), so hosts B and C reach
A's API server at A's loopback address and port. A runs the one control plane; B and C get A's
admin kubeconfig at the path the roles use (cnpa_kubeconfig, k3s's /etc/rancher/k3s/k3s.yaml,
which root's plain `kubectl` reads there too) and their own control plane is stopped and disabled
(it would burn CPU, and a B or C booted again must not start it).

The host driver (Host, wait_for, session_host's rules) is tests/hostlib.py's.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from hostlib import Host, wait_for

from testhost import instance as instance_mod
from testhost.common import HostError
from testhost.instance import Instance

DEFAULT_NAMES = ("mhp-1", "mhp-2", "mhp-3")
ADMIN_KUBECONFIG = "/etc/rancher/k3s/k3s.yaml"
# The control plane of a test host (testhost/files/etc/systemd/system), dependants first.
CONTROL_PLANE = ("kube-controller-manager.service", "kube-apiserver.service", "etcd.service")


def host_names(var: str = "CNPA_MULTIHOST_HOSTS") -> list[str]:
    names = [n.strip() for n in os.environ.get(var, ",".join(DEFAULT_NAMES)).split(",") if n.strip()]
    if len(names) != 3 or len(set(names)) != 3:
        raise AssertionError(f"{var} must name three different hosts, got {names}")
    return names


def _ports_recorded(name: str) -> bool:
    try:
        return bool(Instance.load(name).ports)
    except (HostError, ValueError, OSError):
        return False  # not written yet, or being replaced (rename) right now


def _create(names: list[str]) -> list[Instance]:
    """A fully (its API server ready), B and C only booted (their control plane is stopped
    afterwards), at the same time. B and C start once A's ports are recorded: each create picks
    free ports avoiding those of the instances recorded so far."""
    first, rest = names[0], names[1:]
    with ThreadPoolExecutor(max_workers=2) as pool:
        fut_a = pool.submit(instance_mod.create, first)
        wait_for(lambda: fut_a.done() or _ports_recorded(first), timeout=300,
                 what=f"{first}'s ports recorded")
        fut_rest = pool.submit(lambda: [instance_mod.create(n, wait=False) for n in rest])
        errors = []
        for fut in (fut_a, fut_rest):
            try:
                fut.result()
            except BaseException as exc:  # the caller destroys every host, then it is re-raised
                errors.append(exc)
    if errors:
        raise errors[0]
    insts = [Instance.load(n) for n in names]
    ports = [p for inst in insts for p in inst.ports.values()]
    if len(ports) != len(set(ports)):
        raise AssertionError(f"two test hosts got the same port: {[i.ports for i in insts]}")
    return insts


def join(follower: Host, server: Host) -> None:
    """Make follower a client of server's API server: its own control plane stopped for good,
    server's admin kubeconfig at the roles' path (root's kubectl follows it there)."""
    follower.sh(f"systemctl disable --now {' '.join(CONTROL_PLANE)}", timeout=90)
    admin = server.inst.kubeconfig.read_text()
    follower.sh(f"umask 077 && cat > {ADMIN_KUBECONFIG}.new && mv {ADMIN_KUBECONFIG}.new "
                f"{ADMIN_KUBECONFIG}", input_text=admin)
    follower.inst.kubeconfig.write_text(admin)
    follower.inst.kubeconfig.chmod(0o600)
    wait_for(lambda: follower.kubectl("get", "--raw", "/readyz", check=False).stdout == "ok",
             timeout=60, interval=0.5, what=f"{follower.inst.name} reaching {server.inst.name}'s API")


@contextmanager
def three_hosts(names: list[str], reuse_var: str = "CNPA_MULTIHOST_REUSE") -> Iterator[list[Host]]:
    """Three running hosts on the first one's API server: fresh ones, destroyed at the end; or,
    when reuse_var is 1 and all three are running, those, left running."""
    reuse = os.environ.get(reuse_var) == "1"
    insts: list[Instance] | None = None
    if reuse:
        try:
            insts = [Instance.load(n) for n in names]
        except HostError:
            insts = None
        if insts is not None and not all(i.running() for i in insts):
            raise AssertionError(f"{reuse_var}=1 but not all of {names} are running")
    created = insts is None
    try:
        if created:
            for n in names:
                instance_mod.destroy(n)  # a leftover of an interrupted run
            insts = _create(names)
        hosts = [Host(i) for i in insts]
        for h in hosts[1:]:
            join(h, hosts[0])
        yield hosts
    finally:
        if created:
            for n in names:
                instance_mod.destroy(n)


def write_inventory(hosts: list[Host], path: Path) -> Path:
    """One INI inventory, group k3s, the three hosts over SSH (the lines testhost wrote for each);
    cnpa_kubeconfig is the roles' default path, valid on each for A's API server (join)."""
    lines = []
    for h in hosts:
        text = h.inst.inventory.read_text().splitlines()
        lines += [line for line in text[text.index("[k3s]") + 1:] if line.strip()]
    path.write_text("# Written by tests/multihost: three test hosts, one API server (the first's).\n"
                    "[k3s]\n" + "\n".join(lines) + "\n")
    return path


# -- faults of a whole host ---------------------------------------------------------------------
def _freeze_files(inst: Instance) -> list[Path]:
    return [root / inst.cgroup / "cgroup.freeze" for root in instance_mod.CGROUP_ROOTS
            if (root / inst.cgroup / "cgroup.freeze").exists()]


def freeze(inst: Instance, frozen: bool) -> None:
    """Freeze (or thaw) every process of the host: its cgroup (v2, with nspawn itself)."""
    files = _freeze_files(inst)
    if not files:
        raise AssertionError(f"{inst.name}: no cgroup.freeze under {instance_mod.CGROUP_ROOTS}")
    for f in files:
        f.write_text("1\n" if frozen else "0\n")
    events = files[0].with_name("cgroup.events")
    want = f"frozen {1 if frozen else 0}"
    wait_for(lambda: want in events.read_text().splitlines(), timeout=30, interval=0.1,
             what=f"{inst.name} {'frozen' if frozen else 'thawed'}")


def power_off(inst: Instance) -> None:
    """As `python3 -m testhost stop NAME`."""
    inst.poweroff()


def power_on(host: Host, server: Host) -> float:
    """As `python3 -m testhost start NAME` without its wait for the host's own control plane
    (a follower has none: join disabled it); waits for sshd and server's API instead. Seconds."""
    t0 = time.monotonic()
    host.inst.boot()
    host.inst.save()
    wait_for(lambda: host.sh("systemctl is-active ssh.service", check=False).stdout.strip() == "active",
             timeout=60, interval=0.5, what=f"{host.inst.name}'s sshd")
    wait_for(lambda: host.kubectl("get", "--raw", "/readyz", check=False).stdout == "ok",
             timeout=60, interval=0.5, what=f"{host.inst.name} reaching {server.inst.name}'s API")
    return time.monotonic() - t0


def lease(host: Host, namespace: str = "cnpa-system", name: str = "cnpa-op") -> dict | None:
    proc = host.kubectl("get", "lease", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None
