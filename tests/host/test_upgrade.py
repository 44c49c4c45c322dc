"""An upgrade of the controller's code while passes run, on a real host: the lab's layout
(/root/cnpa-op) and the lab's loop controller, installed by playbooks/controller.yml.

Each version of the package here is the real one with one line added at the end of every module,
which prints `cnpa-mark MODULE VERSION` to stderr when the module is imported. A pass that
imported part of one version and part of another prints two versions. Passes run back to back by
hand (reconcile.sh --plan, as the lab's grader would run the script) and every 3 s in the unit
(its journal, one process per pass) while the next version is installed: no pass may print two.
Then the layout (releases/ID, `current`, `previous`, pruning), an unchanged re-run and --check.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest
from hostlib import ROOT, recap, wait_for

BASE = "/root/cnpa-op"
PACKAGE = ROOT / "roles" / "cnpa_reconciler" / "files" / "cnpa_controller"
MARK = "\nimport sys as _cnpa_mark_sys\n_cnpa_mark_sys.stderr.write('cnpa-mark %s {mark}\\n' % __name__)\n"
PASSES = "/tmp/upgrade-passes.log"
STOP = "/tmp/upgrade-stop"
LOOP_UNIT = "cnpa-upgrade-passes"
# Passes back to back, bounded in count and time; each one's stderr (its marks) after a header.
PASS_LOOP = f"""
rm -f {PASSES} {STOP}
end=$((SECONDS + 2400)); i=0
while [ $SECONDS -lt $end ] && [ $i -lt 5000 ] && [ ! -e {STOP} ]; do
  i=$((i + 1))
  out=$(KUBECONFIG=/etc/rancher/k3s/k3s.yaml {BASE}/reconcile.sh --plan 2>&1 >/dev/null); rc=$?
  printf '=== %s %s\\n%s\\n' "$i" "$rc" "$out" >> {PASSES}
done
echo "=== end" >> {PASSES}
"""


def variant(tmp_path: Path, mark: str) -> Path:
    d = tmp_path / mark / "cnpa_controller"
    d.mkdir(parents=True)
    for f in sorted(PACKAGE.glob("*.py")):
        (d / f.name).write_text(f.read_text() + MARK.format(mark=mark))
    return d


def install(host, package: Path, *extra: str) -> dict:
    env = dict(os.environ, PATH=f"{ROOT / '.venv/bin'}:/usr/bin:/bin", ANSIBLE_FORCE_COLOR="0")
    proc = subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(host.inst.inventory),
                           str(ROOT / "playbooks" / "controller.yml"), "-e", "cnpa_layout=lab",
                           "-e", "cnpa_controller_mode=loop",
                           "-e", f"cnpa_reconciler_package_source={package}", *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return recap(proc.stdout, host.inst.name)


def hand_passes(host) -> list[tuple[int, set[str], int]]:
    """(exit status, versions imported, modules imported) of every finished pass run by hand."""
    text = host.sh(f"cat {PASSES} 2>/dev/null || true").stdout
    out = []
    for block in text.split("=== ")[1:]:
        head, _, body = block.partition("\n")
        if head.strip() == "end":
            continue
        marks = re.findall(r"^cnpa-mark (\S+) (\S+)$", body, re.M)
        out.append((int(head.split()[1]), {v for _m, v in marks}, len(marks)))
    return out


def unit_passes(host, since: str) -> list[set[str]]:
    """Versions each of the unit's passes imported, from its journal: one process per pass (the
    journal records the process that wrote each line)."""
    text = host.sh(f"journalctl -u cnpa-op -o json --no-pager --since '{since}'").stdout
    by_pid: dict[str, set[str]] = {}
    for line in text.splitlines():
        entry = json.loads(line)
        m = re.match(r"cnpa-mark \S+ (\S+)$", str(entry.get("MESSAGE", "")))
        if m:
            by_pid.setdefault(entry.get("_PID"), set()).add(m[1])
    return list(by_pid.values())


def layout(host) -> dict:
    script = f"""
    cd {BASE} && for p in current previous reconcile.sh cnpa_controller cnpa_plan.py; do
      if [ -L "$p" ]; then echo "$p link $(readlink "$p")"
      elif [ -e "$p" ]; then echo "$p $(stat -c %F:%a "$p")"; fi
    done; ls releases 2>/dev/null | sed 's/^/release /'"""
    out: dict = {"releases": set()}
    for line in host.sh(script).stdout.splitlines():
        key, _, value = line.partition(" ")
        if key == "release":
            out["releases"].add(value)
        else:
            out[key] = value
    return out


def release_of(host, mark: str) -> str:
    """The release directory holding version mark."""
    out = host.sh(f"grep -lF 'cnpa-mark %s {mark}' {BASE}/releases/*/cnpa_controller/__init__.py").stdout
    paths = out.split()
    assert len(paths) == 1, out
    return paths[0].split("/")[-3]


@pytest.fixture(scope="module")
def lab_layout(host):
    yield host
    host.sh(f"touch {STOP}; systemctl stop {LOOP_UNIT} 2>/dev/null; rm -rf {BASE}/releases/not-ours",
            check=False)
    env = dict(os.environ, PATH=f"{ROOT / '.venv/bin'}:/usr/bin:/bin")
    subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(host.inst.inventory),
                    str(ROOT / "playbooks" / "uninstall.yml"), "-e", "cnpa_controller_delete_teamspaces=true",
                    "-e", "cnpa_reconciler_keep_records=false"],
                   cwd=ROOT, env=env, capture_output=True, timeout=900, check=False)


def test_no_pass_imports_two_versions_while_the_code_is_upgraded(lab_layout, tmp_path):
    host = lab_layout
    a, b, c = (variant(tmp_path, m) for m in ("A", "B", "C"))
    install(host, a)
    since = host.sh("date '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    host.sh(f"systemd-run --unit={LOOP_UNIT} --collect bash -c {shlex.quote(PASS_LOOP)}")
    wait_for(lambda: sum(1 for _rc, v, _n in hand_passes(host) if v == {"A"}) >= 3, timeout=120,
             what="three passes of version A")
    started = time.monotonic()
    install(host, b)
    installed_in = time.monotonic() - started
    done = len(hand_passes(host))
    wait_for(lambda: len(hand_passes(host)) >= done + 3, timeout=300, what="three passes after the upgrade")
    time.sleep(7)  # two more of the unit's passes (every 3 s)
    host.sh(f"touch {STOP}")
    wait_for(lambda: "=== end" in host.sh(f"cat {PASSES}").stdout, timeout=120, what="the passes to stop")

    passes = hand_passes(host)
    mixed = [p for p in passes if len(p[1]) != 1]
    assert not mixed, f"{len(mixed)} of {len(passes)} passes imported more than one version: {mixed[:5]}"
    assert all(rc == 0 for rc, _v, _n in passes), [p for p in passes if p[0] != 0][:5]
    # Every pass imported the package (the marks of most of its modules), not a few lucky ones.
    assert min(n for _rc, _v, n in passes) >= 5, passes[:3]
    versions = [next(iter(v)) for _rc, v, _n in passes]
    # The passes ran on both sides of the switch, and during the install (it took installed_in s).
    assert versions[0] == "A" and versions[-1] == "B", versions
    assert len(passes) > 10, (len(passes), installed_in)
    assert versions == sorted(versions), "a pass went back to version A after one of B"
    unit = unit_passes(host, since)
    assert unit and all(len(v) == 1 for v in unit), unit
    assert {"A"} in unit and {"B"} in unit, unit

    # The layout: each version in its own release, `current` the new one, `previous` the one
    # before (a pass may still run from it), and the lab's reconcile.sh a regular executable file.
    got = layout(host)
    ra, rb = release_of(host, "A"), release_of(host, "B")
    assert got["releases"] == {ra, rb} and ra != rb, got
    assert got["current"] == f"link releases/{rb}" and got["previous"] == f"link releases/{ra}", got
    assert got["reconcile.sh"] == "regular file:755", got
    assert "cnpa_controller" not in got and "cnpa_plan.py" not in got, got
    assert host.sh(f"test -d {BASE}/releases/{rb}/cnpa_controller/__pycache__", check=False).returncode == 0
    mark = json.loads(host.sh(f"cat {BASE}/releases/{rb}/.cnpa-release").stdout)
    assert mark["release"] == rb and "cnpa_controller/plan.py" in mark["files"], mark
    assert host.sh(f"cmp {BASE}/reconcile.sh {BASE}/releases/{rb}/reconcile.sh", check=False).returncode == 0

    # The same code again: nothing changes. The next version in check mode: a change predicted,
    # none made.
    assert install(host, b)["changed"] == 0
    assert install(host, c, "--check")["changed"] > 0
    assert layout(host) == got
    # The next version for real: the oldest release goes, what is not ours in releases/ stays.
    host.sh(f"mkdir -p {BASE}/releases/not-ours && touch {BASE}/releases/not-ours/file")
    install(host, c)
    after = layout(host)
    assert ra not in after["releases"] and rb in after["releases"], after
    assert "not-ours" in after["releases"] and len(after["releases"]) == 3, after
    assert after["previous"] == f"link releases/{rb}", after

    # The uninstall takes the script, the links and our releases, and leaves the archive and
    # what is not ours.
    env = dict(os.environ, PATH=f"{ROOT / '.venv/bin'}:/usr/bin:/bin", ANSIBLE_FORCE_COLOR="0")
    proc = subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(host.inst.inventory),
                           str(ROOT / "playbooks" / "uninstall.yml")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:]
    left = host.sh(f"cd {BASE} && find . -mindepth 1 | sort").stdout.split()
    assert left == ["./archive", "./releases", "./releases/not-ours", "./releases/not-ours/file"], left
