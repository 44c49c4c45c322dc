"""What the benchmark measures of a controller on a host: converge, restore, ready, deletion, and
an idle window. Each function takes the host (and the controller, where it matters)."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

from bench.host import (
    GROUP,
    PLURAL,
    VERSION,
    WRITE_VERBS,
    ApiException,
    BenchHost,
    bulk,
    log,
    new_teamspace,
    wait,
)
from bench.method import IDLE_WINDOW, PERIOD, POLL, QUIET_BOUND, QUIET_FOR


def usage(pid: int) -> tuple[float, float]:
    """(CPU seconds so far, peak RSS MiB) of a process on this machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    hwm = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines()
               if ln.startswith("VmHWM"))
    return cpu, int(hwm.split()[1]) / 1024


def converge(host: BenchHost, ctl: str, prefix: str, n: int, res: dict, send=None) -> None:
    """N new TeamSpaces -> all converged; besides the time, what else the server did meanwhile:
    CPU of the control plane's processes and every user's writes (audit log)."""
    off, cpu0, t0 = host.audit_offset(), host.server_cpu(), time.monotonic()
    (send or host.create_teamspaces)(prefix, n)
    res["create_s"] = round(time.monotonic() - t0, 3)
    bound = 1200 if ctl == "naive" else 900
    # Poll less often at large N: each poll lists N TeamSpaces on the same 2 cores.
    wait(lambda: host.converged(prefix, n), bound, f"{ctl} N={n} converged",
         interval=max(0.2, n / 2000))
    res["converge_s"] = round(time.monotonic() - t0, 3)
    cpu1 = host.server_cpu()
    res["converge_server_cpu_s"] = {k: round(cpu1[k] - cpu0.get(k, 0), 2) for k in cpu1}
    res["converge_writes_by_user"] = host.writes_by_user(off)


def restore_trials(host: BenchHost, ctl: str, prefix: str, n: int, trials: int, budget: float,
                   bound: float) -> list[float]:
    """A quota deleted at a random moment of the loop -> a new one in its place."""
    rng = random.Random(n)
    latencies: list[float] = []
    t_end = time.monotonic() + budget
    for _ in range(trials):
        if time.monotonic() > t_end:
            break
        time.sleep(rng.uniform(0, PERIOD + 0.3))  # a random moment of the loop
        ns = f"team-{prefix}{rng.randrange(n):03d}"
        old = host.core.read_namespaced_resource_quota("team-quota", ns).metadata.uid
        t0 = time.monotonic()
        host.core.delete_namespaced_resource_quota("team-quota", ns)

        def back(ns=ns, old=old) -> bool:
            try:
                return host.core.read_namespaced_resource_quota("team-quota", ns).metadata.uid != old
            except ApiException as exc:
                if exc.status == 404:
                    return False
                raise
        wait(back, bound, f"{ctl}: quota in {ns} restored", interval=POLL)
        latencies.append(round(time.monotonic() - t0, 3))
    return latencies


def ready_trials(host: BenchHost, ctl: str, prefix: str, trials: int, budget: float,
                 bound: float) -> list[float]:
    """New TeamSpace -> its status written (Ready), one at a time at a random moment of the
    loop, polled every POLL s. prefix is not the run's (so converged() still counts N)."""
    rng = random.Random(len(prefix))
    latencies: list[float] = []
    t_end = time.monotonic() + budget
    for i in range(trials):
        if time.monotonic() > t_end:
            break
        time.sleep(rng.uniform(0, PERIOD + 0.3))
        t0 = time.monotonic()
        host.api.request("POST", f"/apis/{GROUP}/{VERSION}/{PLURAL}", body=new_teamspace(prefix, i))
        path = f"/apis/{GROUP}/{VERSION}/{PLURAL}/{prefix}{i:03d}"
        wait(lambda path=path: host.status_done(host.raw(path)), bound,
             f"{ctl}: {path} ready", interval=POLL)
        latencies.append(round(time.monotonic() - t0, 3))
    return latencies


def delete_all(host: BenchHost, ctl: str, prefix: str, n: int, send=None) -> dict:
    """N TeamSpaces deleted (bulk.IN_FLIGHT requests at a time, as they were created) -> every one
    archived, released and gone. Besides the time, the server's CPU and who wrote meanwhile."""
    off, cpu0, t0 = host.audit_offset(), host.server_cpu(), time.monotonic()

    if send is None:
        bulk.delete(host.api, [f"{prefix}{i:03d}" for i in range(n)])
    else:
        send(prefix, n)
    res = {"requests_s": round(time.monotonic() - t0, 3)}
    wait(lambda: not host.teamspaces(prefix), 900, f"{ctl} N={n}: every deletion done",
         interval=max(0.2, n / 2000))
    res["delete_s"] = round(time.monotonic() - t0, 3)
    cpu1 = host.server_cpu()
    res["server_cpu_s"] = {k: round(cpu1[k] - cpu0.get(k, 0), 2) for k in cpu1}
    res["writes_by_user"] = host.writes_by_user(off)
    log(f"{ctl} N={n}: {n} deletions done in {res['delete_s']} s")
    return res


def wait_quiet(host: BenchHost) -> dict:
    """Until nobody but Lease holders has written for QUIET_FOR s (bounded by QUIET_BOUND):
    how long that took and who wrote meanwhile (the audit log records every user's writes)."""
    t0 = time.monotonic()
    off, quiet_since, writes = host.audit_offset(), t0, {}
    for _ in range(int(QUIET_BOUND) + 1):
        if time.monotonic() - quiet_since >= QUIET_FOR:
            return {"waited_s": round(quiet_since - t0, 1), "writes_meanwhile": writes}
        time.sleep(1)
        events, off = host.audit_read(off)
        for ev in events:
            if ev.get("verb") in WRITE_VERBS and (ev.get("objectRef") or {}).get("resource") != "leases":
                user = ev.get("user", {}).get("username", "?")
                writes[user] = writes.get(user, 0) + 1
                quiet_since = time.monotonic()
        if time.monotonic() - t0 > QUIET_BOUND:
            break
    raise TimeoutError(f"the cluster still writing after {QUIET_BOUND:.0f} s: {writes}")


def window(host: BenchHost, agent: str, pid: int) -> dict:
    """A process's requests (by user agent) and CPU over IDLE_WINDOW from now."""
    cpu0, _ = usage(pid)
    off = host.audit_offset()
    time.sleep(IDLE_WINDOW)
    cpu1, rss = usage(pid)
    reqs = host.audit_since(off, agent, by_resource=True)
    return {"wall_s": None, "cpu_s": round(cpu1 - cpu0, 4), "maxrss_mib": round(rss, 1),
            "cpu_pct": round(100 * (cpu1 - cpu0) / IDLE_WINDOW, 2), "window_s": IDLE_WINDOW,
            "requests": reqs, "writes": sum(v for k, v in reqs.items() if k.split()[0] in WRITE_VERBS)}


def idle_window(host: BenchHost, ctl: str, peer, n: int, fresh_host_from: int) -> dict:
    """An event-driven peer with nothing to do, once the cluster is quiet: its requests and
    CPU over IDLE_WINDOW, between two of the watch controller's resyncs. For the watch
    controller from N = fresh_host_from on, a second window holding a resync says what one
    costs (every TeamSpace planned again from the cache)."""
    pid = peer.pid()
    quiet = wait_quiet(host)
    log(f"{ctl} N={n}: cluster quiet after {quiet['waited_s']} s more ({quiet['writes_meanwhile']})")
    resyncs = hasattr(peer, "next_resync")
    if resyncs and peer.next_resync() < time.monotonic() + IDLE_WINDOW + 2:
        time.sleep(max(0.0, peer.next_resync() - time.monotonic()) + 10)  # let it pass first
    res = {**window(host, peer.agent, pid), "quiet": quiet,
           "note": f"requests and CPU over a {IDLE_WINDOW:.0f} s idle window"}
    if resyncs and n >= fresh_host_from:
        time.sleep(max(0.0, peer.next_resync() - 2 - time.monotonic()))
        res["resync"] = window(host, peer.agent, pid)
        log(f"{ctl} N={n}: a window with a resync: {res['resync']}")
    return res
