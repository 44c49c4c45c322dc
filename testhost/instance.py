"""One test host: an unpacked rootfs booted under systemd-nspawn with systemd as PID 1.

Layout of an instance (under <cache>/instances/<name>/): rootfs/, state.json, ssh key pair,
known_hosts, kubeconfig (copied out after first boot), inventory.ini, console.log.

The instance shares the machine's network namespace, so every port it listens on (sshd, its
datastore, kube-apiserver, kube-controller-manager) is picked free on 127.0.0.1 at create time and
recorded.

The API server stores in one of two datastores, chosen at create time (DATASTORES).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import build, rootfs
from .common import HostError, apt_install, cache_dir, log, run

# Where the API server stores, as the k3s the lab's users run stores: "kine" is kine on SQLite,
# a single k3s server's default datastore; "etcd" is etcd, which k3s HA embeds.
DATASTORES = ("kine", "etcd")
# The default is kine because the lab is made for a k3s VM, a single server, which keeps its
# cluster in SQLite through kine; etcd stands for the HA k3s some platform teams run.
# CNPA_TESTHOST_DATASTORE chooses for a whole run.
DEFAULT_DATASTORE = "kine"
DATASTORE_PORTS = {"kine": ("kine",), "etcd": ("etcd_client", "etcd_peer")}
# kine's database inside the host, where a single k3s server has it (files/.../kine.service).
KINE_DB = "/var/lib/rancher/k3s/server/db/state.db"
# kube-apiserver's own default for --etcd-compaction-interval; with kine (whose own compaction is
# off) it is what compacts the datastore. "0" turns compaction off.
COMPACTION_INTERVAL = "5m"
_GO_DURATION = re.compile(r"0|(\d+(\.\d+)?(ns|us|ms|s|m|h))+")
CGROUP_ROOTS = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup/systemd"))
BOOT_TIMEOUT = 60.0
READY_TIMEOUT = 180.0
POWEROFF_TIMEOUT = 45.0


@dataclass
class Instance:
    name: str
    ports: dict[str, int] = field(default_factory=dict)
    nspawn_pid: int = 0
    pid1: int = 0

    # -- paths ------------------------------------------------------------------------------
    @property
    def dir(self) -> Path:
        return instances_dir() / self.name

    @property
    def root(self) -> Path:
        return self.dir / "rootfs"

    @property
    def key(self) -> Path:
        return self.dir / "id_ed25519"

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def inventory(self) -> Path:
        return self.dir / "inventory.ini"

    @property
    def cgroup(self) -> str:
        return f"cnpa-testhost-{self.name}"

    # -- state ------------------------------------------------------------------------------
    def save(self) -> None:
        tmp = self.dir / "state.json.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.rename(self.dir / "state.json")

    @classmethod
    def load(cls, name: str) -> Instance:
        path = instances_dir() / name / "state.json"
        if not path.exists():
            raise HostError(f"no test host named {name!r} (no {path})")
        return cls(**json.loads(path.read_text()))

    def info(self) -> dict:
        return {
            "name": self.name, "running": self.running(), "dir": str(self.dir),
            "rootfs": str(self.root), "ports": self.ports, "ssh_host": "127.0.0.1",
            "ssh_port": self.ports.get("ssh"), "ssh_user": "root", "ssh_key": str(self.key),
            "known_hosts": str(self.dir / "known_hosts"), "kubeconfig": str(self.kubeconfig),
            "inventory": str(self.inventory), "nspawn_pid": self.nspawn_pid, "pid1": self.pid1,
            "suite": self.suite(), "datastore": self.datastore(),
            "compaction_interval": self.setting("TESTHOST_ETCD_COMPACTION_INTERVAL"),
        }

    def suite(self) -> str:
        """The Debian release of its rootfs, read from the rootfs itself: state.json stays as
        older checkouts (sharing the instances directory) can load it."""
        try:
            text = (self.root / "etc/os-release").read_text()
        except OSError:
            return ""
        return next((line.split("=", 1)[1].strip('"') for line in text.splitlines()
                     if line.startswith("VERSION_CODENAME=")), "")

    def datastore(self) -> str:
        """Where its API server stores (DATASTORES), read from the host's own settings like
        suite(); a host made before datastores could be chosen has none written and ran etcd."""
        return self.setting("TESTHOST_DATASTORE") or "etcd"

    def setting(self, key: str) -> str:
        """A value of the host's /etc/default/testhost (which its units read), or ""."""
        try:
            text = (self.root / "etc/default/testhost").read_text()
        except OSError:
            return ""
        return next((line.split("=", 1)[1] for line in text.splitlines()
                     if line.startswith(f"{key}=")), "")

    def running(self) -> bool:
        return bool(self.pid1) and _alive(self.pid1) and _alive(self.nspawn_pid)

    # -- inside the host ----------------------------------------------------------------------
    def exec(self, cmd: list[str], *, check: bool = True, timeout: float = 60.0,
             input_text: str | None = None) -> subprocess.CompletedProcess:
        if not self.running():
            raise HostError(f"test host {self.name} is not running")
        proc = subprocess.run(
            ["nsenter", "-t", str(self.pid1), "-a", "--", "env", "-i",
             "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root",
             *cmd], capture_output=True, text=True, timeout=timeout, input=input_text,
            stdin=None if input_text is not None else subprocess.DEVNULL, check=False)
        if check and proc.returncode != 0:
            raise HostError(f"in {self.name}: {' '.join(cmd)} exited {proc.returncode}: "
                            f"{proc.stderr.strip() or proc.stdout.strip()}")
        return proc

    # -- lifecycle ----------------------------------------------------------------------------
    def boot(self) -> None:
        if self.running():
            raise HostError(f"test host {self.name} is already running (pid {self.pid1})")
        self._release_cgroups()
        cgroups = [root / self.cgroup for root in CGROUP_ROOTS if root.is_dir()]
        for cg in cgroups:
            cg.mkdir(exist_ok=True)

        def _enter_own_cgroup() -> None:
            # Each nspawn in a cgroup of its own: with --keep-unit it makes payload/ and
            # supervisor/ below its current cgroup, which two instances must not share.
            for cg in cgroups:
                (cg / "cgroup.procs").write_text(str(os.getpid()))

        console = open(self.dir / "console.log", "ab")  # noqa: SIM115 - handed to the child
        log(f"booting {self.name} (systemd-nspawn, systemd as PID 1)")
        proc = subprocess.Popen(
            ["systemd-nspawn", "-D", str(self.root), "-b", "-M", self.name, "--register=no",
             "--keep-unit", "--console=read-only", "--resolv-conf=copy-host",
             "--timezone=off", "--link-journal=no"],
            stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_enter_own_cgroup)
        console.close()
        self.nspawn_pid = proc.pid
        self.pid1 = 0
        self.save()
        deadline = time.monotonic() + BOOT_TIMEOUT
        while not self.pid1:
            if proc.poll() is not None:
                raise HostError(f"systemd-nspawn exited {proc.returncode}; see {self.dir}/console.log")
            if time.monotonic() > deadline:
                raise HostError(f"container PID 1 did not appear within {BOOT_TIMEOUT:.0f} s")
            self.pid1 = _container_init(proc.pid)
            time.sleep(0.05)
        self.save()
        while True:
            state = self.exec(["systemctl", "is-system-running"], check=False).stdout.strip()
            if state in ("running", "degraded"):
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise HostError(f"{self.name} did not finish booting (state {state!r}); "
                                f"see {self.dir}/console.log")
            time.sleep(0.2)
        if state == "degraded":
            failed = self.exec(["systemctl", "--failed", "--no-legend", "--plain"], check=False)
            log(f"{self.name} booted degraded; failed units: {failed.stdout.strip()}")
        log(f"{self.name} booted (systemd {state})")

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Wait for /readyz and for the controller-manager's healthz (its controllers started)."""
        deadline = time.monotonic() + timeout
        checks = {
            "kube-apiserver /readyz": ["kubectl", "get", "--raw", "/readyz"],
            "kube-controller-manager /healthz": [
                "curl", "-sfk", "--max-time", "2", f"https://127.0.0.1:{self.ports['kcm']}/healthz"],
            "sshd": ["systemctl", "is-active", "ssh.service"],
        }
        for what, cmd in checks.items():
            while True:
                proc = self.exec(cmd, check=False, timeout=10)
                if proc.returncode == 0 and proc.stdout.strip() in ("ok", "active"):
                    break
                if time.monotonic() > deadline:
                    raise HostError(f"{self.name}: {what} not ready after {timeout:.0f} s "
                                    f"(last: {proc.stdout.strip() or proc.stderr.strip()}); "
                                    f"look at `journalctl` inside the host")
                time.sleep(0.5)
            log(f"{self.name}: {what} ok")
        shutil.copy2(self.root / "etc/rancher/k3s/k3s.yaml", self.kubeconfig)
        self.kubeconfig.chmod(0o600)

    def poweroff(self) -> None:
        if self.nspawn_pid and _alive(self.nspawn_pid):
            log(f"powering off {self.name}")
            # SIGTERM makes nspawn ask the container's systemd for a clean poweroff.
            os.kill(self.nspawn_pid, signal.SIGTERM)
            if not _wait_gone(self.nspawn_pid, POWEROFF_TIMEOUT):
                log(f"{self.name}: no clean poweroff within {POWEROFF_TIMEOUT:.0f} s; killing")
                os.kill(self.nspawn_pid, signal.SIGKILL)
        # SIGKILL to nspawn alone would leave the container's systemd running, reparented.
        for pid in (self.pid1, *self._cgroup_pids()):
            if pid and _alive(pid):
                os.kill(pid, signal.SIGKILL)
                _wait_gone(pid, 5)
        _reap(self.nspawn_pid)
        self._release_cgroups()
        self._clean_nspawn_run_state()
        self.nspawn_pid = self.pid1 = 0
        if self.dir.exists():
            self.save()

    def leftovers(self) -> list[str]:
        """Everything of this instance still present on the machine (empty when clean)."""
        found = [f"process {pid}" for pid in (self.nspawn_pid, self.pid1) if pid and _alive(pid)]
        found += [f"process {pid} in cgroup" for pid in self._cgroup_pids()]
        found += [str(root / self.cgroup) for root in CGROUP_ROOTS if (root / self.cgroup).exists()]
        with open("/proc/self/mounts") as fh:
            found += [line.split()[1] for line in fh if str(self.dir) in line.split()[1]]
        found += [str(p) for p in (Path("/run/systemd/nspawn/propagate") / self.name,) if p.exists()]
        return found

    def _cgroup_pids(self) -> list[int]:
        pids: set[int] = set()
        for root in CGROUP_ROOTS:
            base = root / self.cgroup
            if base.exists():
                for procs in base.rglob("cgroup.procs"):
                    pids.update(int(x) for x in procs.read_text().split())
        return sorted(pids)

    def _release_cgroups(self) -> None:
        for root in CGROUP_ROOTS:
            base = root / self.cgroup
            if not base.exists():
                continue
            # rmdir children first; a cgroup directory holds only pseudo-files.
            for sub in sorted((p for p in base.rglob("*") if p.is_dir()),
                              key=lambda p: len(p.parts), reverse=True):
                sub.rmdir()
            base.rmdir()

    def _clean_nspawn_run_state(self) -> None:
        shutil.rmtree(Path("/run/systemd/nspawn/propagate") / self.name, ignore_errors=True)
        for path in (Path("/run/systemd/nspawn/propagate"), Path("/run/systemd/nspawn/locks"),
                     Path("/run/systemd/nspawn")):
            try:
                path.rmdir()  # only when empty: another instance may still use it
            except OSError:
                pass


def instances_dir() -> Path:
    path = cache_dir() / "instances"
    path.mkdir(exist_ok=True)
    return path


def default_datastore() -> str:
    """CNPA_TESTHOST_DATASTORE when set (a whole test run on one datastore), else the default."""
    return check_datastore(os.environ.get("CNPA_TESTHOST_DATASTORE") or DEFAULT_DATASTORE,
                           "CNPA_TESTHOST_DATASTORE=")


def check_datastore(datastore: str, what: str = "datastore ") -> str:
    if datastore not in DATASTORES:
        raise HostError(f"{what}{datastore!r}: choose one of {', '.join(DATASTORES)}")
    return datastore


def prepare(suite: str = rootfs.SUITE, datastore: str | None = None) -> tuple[list[Path], Path]:
    """What a host is made from, built or fetched into the cache unless already there: the
    binaries it runs and its rootfs tarball. On a cold cache this is most of the time a create
    takes (minutes); a caller that must not wait that long for something else calls it first."""
    datastore = check_datastore(datastore) if datastore else default_datastore()
    apt_install(["systemd-container", "openssh-client"])  # systemd-nspawn, ssh-keygen
    control_plane = build.build()
    binaries = [control_plane / b for b in build.BINARIES]
    if datastore == "kine":
        binaries.append(build.build_kine() / "kine")
    return binaries, rootfs.ensure(suite)


def create(name: str, wait: bool = True, suite: str = rootfs.SUITE, datastore: str | None = None,
           compaction_interval: str = COMPACTION_INTERVAL) -> Instance:
    """Create and boot a host. datastore: DATASTORES, default default_datastore().
    compaction_interval: kube-apiserver's --etcd-compaction-interval (a Go duration; shorter
    makes old resourceVersions expire sooner)."""
    if not name.replace("-", "").isalnum() or len(name) > 40:
        raise HostError(f"instance name {name!r}: use letters, digits and '-' (at most 40)")
    datastore = check_datastore(datastore) if datastore else default_datastore()
    if not _GO_DURATION.fullmatch(compaction_interval):
        raise HostError(f"compaction interval {compaction_interval!r}: a Go duration such as "
                        f"{COMPACTION_INTERVAL} or 30s")
    inst = Instance(name=name)
    if inst.dir.exists():
        raise HostError(f"test host {name} already exists at {inst.dir}; destroy it first")
    binaries, tarball = prepare(suite, datastore)
    t0 = time.monotonic()
    inst.dir.mkdir(parents=True)
    try:
        log(f"unpacking rootfs into {inst.root}")
        inst.root.mkdir()
        run(["tar", "--numeric-owner", "--xattrs", "-C", str(inst.root), "-xf", str(tarball)],
            step="unpack rootfs", quiet=True)
        inst.ports = _free_ports(("ssh", "apiserver", *DATASTORE_PORTS[datastore], "kcm", "metrics"))
        _configure(inst, binaries, datastore, compaction_interval)
        inst.save()
        inst.boot()
        if wait:
            inst.wait_ready()
        _write_inventory(inst)
        inst.save()
    except BaseException:
        inst.poweroff()
        raise
    log(f"{name} ({datastore}) ready in {time.monotonic() - t0:.1f} s; ssh -p {inst.ports['ssh']} "
        f"-i {inst.key} root@127.0.0.1")
    return inst


def destroy(name: str, keep_files: bool = False) -> None:
    try:
        inst = Instance.load(name)
    except HostError:
        inst = Instance(name=name)
        if not inst.dir.exists():
            log(f"{name}: nothing to destroy")
            return
    inst.poweroff()
    left = inst.leftovers()
    if left:
        raise HostError(f"{name}: left behind after poweroff: {', '.join(left)}")
    if not keep_files:
        shutil.rmtree(inst.dir)
    log(f"{name} destroyed; nothing left running or mounted")


def _configure(inst: Instance, binaries: list[Path], datastore: str,
               compaction_interval: str) -> None:
    root, ports = inst.root, inst.ports
    (root / "etc/hostname").write_text(f"{inst.name}\n")
    with open(root / "etc/hosts", "a") as fh:
        fh.write(f"127.0.1.1 {inst.name}\n")
    (root / "etc/default/testhost").write_text(_settings(ports, datastore, compaction_interval))
    for binary in binaries:
        dest = root / "usr/local/bin" / binary.name
        try:
            os.link(binary, dest)
        except OSError:
            shutil.copy2(binary, dest)
    # Only the chosen datastore starts at boot (the rootfs has both units, neither enabled).
    wants = root / "etc/systemd/system/multi-user.target.wants" / f"{datastore}.service"
    wants.unlink(missing_ok=True)
    wants.symlink_to(f"/etc/systemd/system/{datastore}.service")
    # sshd on its own loopback port; keys made now so each instance has its own.
    (root / "etc/ssh/sshd_config.d/testhost.conf").write_text(
        f"Port {ports['ssh']}\nListenAddress 127.0.0.1\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nUseDNS no\n")
    run(["ssh-keygen", "-q", "-A", "-f", str(root)], step="ssh-keygen -A (host keys)", quiet=True)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"cnpa-testhost-{inst.name}",
         "-f", str(inst.key)], step="ssh-keygen (client key)", quiet=True)
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(inst.key.with_suffix(".pub").read_text())
    (ssh_dir / "authorized_keys").chmod(0o600)
    host_key = (root / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()
    (inst.dir / "known_hosts").write_text(f"[127.0.0.1]:{ports['ssh']} {host_key[0]} {host_key[1]}\n")


def _settings(ports: dict[str, int], datastore: str, compaction_interval: str) -> str:
    """The host's /etc/default/testhost: its ports and where its API server stores."""
    storage_port = ports["kine"] if datastore == "kine" else ports["etcd_client"]
    lines = [f"TESTHOST_{k.upper()}_PORT={v}" for k, v in ports.items()]
    lines += [f"TESTHOST_DATASTORE={datastore}",
              f"TESTHOST_STORAGE_SERVERS=http://127.0.0.1:{storage_port}",
              f"TESTHOST_ETCD_COMPACTION_INTERVAL={compaction_interval}"]
    return "".join(f"{line}\n" for line in lines)


def _write_inventory(inst: Instance) -> None:
    ssh_args = (f"-o UserKnownHostsFile={inst.dir / 'known_hosts'} -o StrictHostKeyChecking=yes "
                "-o ControlMaster=auto -o ControlPersist=60s")
    # Test hosts share this machine's loopback: the watch controller of each serves its metrics
    # and health checks on a port of its own (the role's default would be taken by the first).
    metrics = (f" cnpa_controller_metrics_address=127.0.0.1:{inst.ports['metrics']}"
               if "metrics" in inst.ports else "")
    inst.inventory.write_text(
        "# Written by `python -m testhost create`; the lab's k3s group, reached over SSH.\n"
        f"[k3s]\n{inst.name} ansible_host=127.0.0.1 ansible_port={inst.ports['ssh']} "
        f"ansible_user=root ansible_ssh_private_key_file={inst.key} "
        f"ansible_ssh_common_args='{ssh_args}'{metrics}\n")


def _free_ports(names: tuple[str, ...]) -> dict[str, int]:
    """Free loopback ports, one per name, avoiding those recorded by other instances (even if
    powered off)."""
    count = len(names)
    taken: set[int] = set()
    for state in instances_dir().glob("*/state.json"):
        taken.update(json.loads(state.read_text()).get("ports", {}).values())
    ports: list[int] = []
    socks = []
    for _ in range(count * 10):
        if len(ports) == count:
            break
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        socks.append(sock)
        if port not in taken and 20000 <= port <= 60999:
            ports.append(port)
    for sock in socks:
        sock.close()
    if len(ports) < count:
        raise HostError("could not find free loopback ports")
    return dict(zip(names, ports))


def _container_init(pid: int) -> int:
    """The container's PID 1 among nspawn's children: the one that is PID 1 in its own PID
    namespace. nspawn first forks an "outer child" that exits once it has started the real
    one (observed: it is listed about 10 ms before PID 1); taking it for PID 1 made a create
    fail with the container running and unknown."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return 0
    for child in children:
        try:
            status = Path(f"/proc/{child}/status").read_text()
        except OSError:
            continue
        nspid = next((line.split()[1:] for line in status.splitlines()
                      if line.startswith("NSpid:")), [])
        if len(nspid) > 1 and nspid[-1] == "1":
            return int(child)
    return 0


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(pid):
        _reap(pid)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
