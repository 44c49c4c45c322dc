#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Switch the controller's code from one release directory to another with one rename."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: cnpa_release
short_description: Make one release of the controller's code current with one rename, and tidy up
description:
  - Each version of the code (C(reconcile.sh) and C(cnpa_controller/)) is installed into
    C(BASE/releases/ID/) and marked complete there by a file C(.cnpa-release) (the role writes it
    last, after compiling). C(BASE/current) is a symlink to C(releases/ID); C(reconcile.sh) beside
    it resolves C(current) once per pass, so a pass imports one release whole.
  - O(state=present) makes O(release) current by C(rename(2)) of a fresh temporary symlink over
    C(current) (never a moment without one, never a half-switched one), points C(previous) at the
    release it replaced (a pass started before the switch may still run from it), and removes the
    other releases that are ours (a directory whose C(.cnpa-release) names it).
  - O(state=earlier_absent) removes what versions before releases kept beside C(reconcile.sh), the
    package C(cnpa_controller/) (when its C(__init__.py) is ours) and C(cnpa_plan.py), once
    C(current) exists (until then that code is the one in use).
  - O(state=absent) removes all of the code that is ours under O(base_dir) (C(reconcile.sh) when
    it is ours, C(current), C(previous), the releases, the earlier versions' code), and nothing
    else (the archive, the lab's evidence and files of others stay).
  - Whatever is in the way and not ours is never touched; it is reported in RV(foreign).
  - Before it removes code a pass may be running, it waits for the passes' lock O(lock_file).
version_added: "1.4.0"
author:
  - cnpa-op maintainers (@labhub)
options:
  base_dir:
    description: The directory of C(reconcile.sh), C(current) and C(releases/).
    type: path
    required: true
  release:
    description: The release to make current (a directory name under C(releases/)); O(state=present) only.
    type: str
  state:
    description: See the description.
    type: str
    choices: [present, earlier_absent, absent]
    default: present
  lock_file:
    description:
      - The passes' lock (C(reconcile.sh)'s C(CNPA_LOCK_FILE)). Taken before code is removed, so no
        pass runs from it then. None or a missing directory, no waiting.
    type: path
  lock_timeout:
    description: Seconds to wait for O(lock_file); then nothing is removed this time (a warning says so).
    type: int
    default: 70
attributes:
  check_mode:
    description: Reports what it would change and changes nothing.
    support: full
notes:
  - Runs on the target, with its own Python standard library only.
"""

EXAMPLES = r"""
- name: Make release 0123456789abcdef current
  cnpa_release:
    base_dir: /opt/cnpa-op
    release: 0123456789abcdef
    lock_file: /run/cnpa-op/pass.lock
"""

RETURN = r"""
current:
  description: The release C(current) names afterwards (or would, in check mode); null if none.
  type: str
  returned: always
previous:
  description: The release C(previous) names afterwards; null if none.
  type: str
  returned: always
removed:
  description: Paths removed (or that would be removed in check mode).
  type: list
  elements: str
  returned: always
foreign:
  description: Paths where code of ours would be that are not ours (left alone).
  type: list
  elements: str
  returned: always
"""

import errno
import fcntl
import json
import os
import shutil
import time

from ansible.module_utils.basic import AnsibleModule


MARKER = ".cnpa-release"
RELEASES = "releases"
# The second line of every version of this project's reconcile.sh.
SCRIPT_MARK = "# reconcile.sh - one pass of the TeamSpace controller (lab steps 3 and 6)."
# The start of every version of the package's __init__.py.
PACKAGE_MARK = '"""cnpa-op\'s TeamSpace controller'


def _read(path, limit=65536):
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(limit)
    except OSError:
        return None


def release_is_ours(releases, name):
    path = os.path.join(releases, name)
    if os.path.islink(path) or not os.path.isdir(path):
        return False
    try:
        data = json.loads(_read(os.path.join(path, MARKER)) or "")
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("release") == name


def link_release(base, link):
    """The release a link of ours names (C(releases/NAME)), "" when there is no link, None when
    something else is there."""
    path = os.path.join(base, link)
    if not os.path.lexists(path):
        return ""
    if not os.path.islink(path):
        return None
    target = os.readlink(path)
    head, _sep, name = target.partition("/")
    if head != RELEASES or not name or "/" in name or name in (".", ".."):
        return None
    return name


def script_is_ours(path):
    if os.path.islink(path) or not os.path.isfile(path):
        return False
    return SCRIPT_MARK in (_read(path) or "").splitlines()[:3]


def package_is_ours(path):
    if os.path.islink(path) or not os.path.isdir(path):
        return False
    return (_read(os.path.join(path, "__init__.py")) or "").startswith(PACKAGE_MARK)


def plan_module_is_ours(path):
    return (not os.path.islink(path) and os.path.isfile(path)
            and "TeamSpace" in (_read(path) or ""))


def replace_link(base, link, target):
    """base/link names target after one rename(2); a reader sees the old or the new link."""
    tmp = os.path.join(base, f".{link}.tmp")
    if os.path.islink(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, os.path.join(base, link))


class Lock:
    """flock(2) on the passes' lock (reconcile.sh takes the same), bounded."""

    def __init__(self, path, timeout):
        self.path, self.timeout, self.fd = path, timeout, None

    def acquire(self):
        if not self.path or not os.path.isdir(os.path.dirname(self.path)):
            return True
        try:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError:
            return True  # a lock nobody can open is one no pass holds (reconcile.sh exits 3 then)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                    return False
            time.sleep(0.2)

    def release(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def plan_removals(base, state, keep):
    """(paths to remove, foreign paths) for the state, keeping the releases named in keep."""
    remove, foreign = [], []
    releases = os.path.join(base, RELEASES)
    if state == "earlier_absent" and not link_release(base, "current"):
        return remove, foreign  # no release installed yet: that code is still the one in use
    if state in ("earlier_absent", "absent"):
        flat = os.path.join(base, "cnpa_controller")
        if os.path.lexists(flat):
            (remove if package_is_ours(flat) else foreign).append(flat)
        plan_module = os.path.join(base, "cnpa_plan.py")
        if os.path.lexists(plan_module):
            (remove if plan_module_is_ours(plan_module) else foreign).append(plan_module)
    if state == "earlier_absent":
        return remove, foreign
    if state == "absent":
        script = os.path.join(base, "reconcile.sh")
        if os.path.lexists(script):
            (remove if script_is_ours(script) else foreign).append(script)
        for link in ("current", "previous"):
            if link_release(base, link):
                remove.append(os.path.join(base, link))
            elif link_release(base, link) is None:
                foreign.append(os.path.join(base, link))
    if os.path.isdir(releases) and not os.path.islink(releases):
        for name in sorted(os.listdir(releases)):
            if name in keep:
                continue
            (remove if release_is_ours(releases, name) else foreign).append(os.path.join(releases, name))
    return remove, foreign


def main():
    module = AnsibleModule(
        argument_spec=dict(
            base_dir=dict(type="path", required=True),
            release=dict(type="str"),
            state=dict(type="str", choices=["present", "earlier_absent", "absent"], default="present"),
            lock_file=dict(type="path"),
            lock_timeout=dict(type="int", default=70),
        ),
        required_if=[("state", "present", ["release"])],
        supports_check_mode=True,
    )
    p = module.params
    base, state, release = p["base_dir"], p["state"], p["release"]
    releases = os.path.join(base, RELEASES)
    changed = False
    current, previous = link_release(base, "current"), link_release(base, "previous")
    if state == "present":
        if not release or "/" in release or release.startswith("."):
            module.fail_json(msg=f"release {release!r} is not a directory name under {releases}")
        if current is None:
            module.fail_json(msg=f"{base}/current is not cnpa-op's link into {releases}/: move it "
                                 "away (the install switches releases through it)")
        if not release_is_ours(releases, release) and not module.check_mode:
            module.fail_json(msg=f"{releases}/{release} is no complete release (no {MARKER} naming "
                                 "it): not switching to it")
        if current != release:
            if not module.check_mode:
                if current and previous is not None:
                    replace_link(base, "previous", f"{RELEASES}/{current}")
                replace_link(base, "current", f"{RELEASES}/{release}")
            if current and previous is not None:
                previous = current
            current, changed = release, True
    keep = {r for r in (current, previous) if r} if state != "absent" else set()
    remove, foreign = plan_removals(base, state, keep)
    if remove and not module.check_mode:
        lock = Lock(p["lock_file"], p["lock_timeout"])
        if not lock.acquire():
            lock.release()
            module.warn(f"a pass held {p['lock_file']} for over {p['lock_timeout']} s: {', '.join(remove)} "
                        "not removed this time (the next run removes them)")
            module.exit_json(changed=changed, current=current or None, previous=previous or None,
                             removed=[], foreign=foreign)
        try:
            for path in remove:
                try:
                    _remove(path)
                except FileNotFoundError:
                    continue
                except OSError as e:
                    module.fail_json(msg=f"cannot remove {path}: {e}", removed=remove)
        finally:
            lock.release()
    if state == "absent" and os.path.isdir(releases) and not os.path.islink(releases):
        left = [n for n in os.listdir(releases) if os.path.join(releases, n) not in remove]
        if not left:
            if not module.check_mode:
                try:
                    os.rmdir(releases)
                except FileNotFoundError:
                    pass
            remove.append(releases)
    if state == "absent":
        current = previous = None
    for path in foreign:
        module.warn(f"{path} is not cnpa-op's code: left alone")
    module.exit_json(changed=changed or bool(remove), current=current or None,
                     previous=previous or None, removed=remove, foreign=foreign)


if __name__ == "__main__":
    main()
