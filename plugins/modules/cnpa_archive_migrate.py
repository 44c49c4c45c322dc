#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Copy the archive records of an earlier install into this one's archive, losing none."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: cnpa_archive_migrate
short_description: Copy archive records from an earlier install's archive, keeping every one
description:
  - Every record C(*.json) of O(src) (a regular file) ends up in O(dest) under its own name, or,
    when O(dest) already holds a record of that name with another uid, under the name the
    controller gives a record it keeps aside (C(NAME.UID.json), C(UID.json) for names over 200
    characters).
  - A record is never overwritten. Where O(dest) already has the same deletion (same uid), nothing
    is copied. A file that cannot be placed that way (not a record, or its place taken by a
    different one) is left where it is and reported in RV(conflicts).
  - Each copy is written to a temporary file, flushed, and linked to its name only if that name is
    still free, so a record the running controller writes meanwhile is never replaced.
  - O(src) is left as it is.
version_added: "1.4.0"
author:
  - cnpa-op maintainers (@labhub)
options:
  src:
    description: The earlier archive directory. A missing one is fine (nothing to do).
    type: path
    required: true
  dest:
    description: This install's archive directory (it must exist).
    type: path
    required: true
attributes:
  check_mode:
    description: Reports what it would change and changes nothing.
    support: full
notes:
  - Runs on the target, with its own Python standard library only.
"""

EXAMPLES = r"""
- name: Copy the lab layout's records into the system layout's archive
  cnpa_archive_migrate:
    src: /root/cnpa-op/archive
    dest: /var/lib/cnpa-op/archive
"""

RETURN = r"""
copied:
  description: Files of O(src) copied under their own name.
  type: list
  elements: str
  returned: always
kept:
  description: Files of O(src) copied under the name of a record kept aside (C(from), C(as)).
  type: list
  elements: dict
  returned: always
conflicts:
  description: Files of O(src) not copied, with the reason.
  type: list
  elements: dict
  returned: always
"""

import json
import os
import re
import tempfile

from ansible.module_utils.basic import AnsibleModule


# What the controller's executor accepts in a file name it makes (a TeamSpace's name, a uid).
SAFE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")


def keep_name(name, uid):
    """The controller's name for an earlier record it keeps aside (executor.py, _archive)."""
    return f"{name}.{uid}.json" if len(name) <= 200 else f"{uid}.json"


def _read(path):
    """(bytes, parsed record or None) of a regular file; (None, None) when there is none."""
    if os.path.islink(path) or not os.path.isfile(path):
        return (b"", None) if os.path.lexists(path) else (None, None)
    with open(path, "rb") as fh:
        data = fh.read()
    try:
        record = json.loads(data.decode("utf-8"))
    except ValueError:
        return data, None
    ok = (isinstance(record, dict) and isinstance(record.get("name"), str)
          and isinstance(record.get("uid"), str) and SAFE.match(record["name"])
          and SAFE.match(record["uid"]))
    return data, record if ok else None


def decide(src, dest):
    """[(file, target name or None, reason)] for every record of src: where it goes."""
    out = []
    for entry in sorted(os.listdir(src)):
        if not entry.endswith(".json") or entry.startswith("."):
            continue
        path = os.path.join(src, entry)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        data, record = _read(path)
        have, have_record = _read(os.path.join(dest, entry))
        if have is None:
            out.append((entry, entry, "copy"))
            continue
        if have == data:
            continue
        if record is None or have_record is None:
            out.append((entry, None, f"{dest}/{entry} differs and one of the two is not a record"))
            continue
        if have_record["uid"] == record["uid"]:
            continue  # the same deletion, recorded by both
        keep = keep_name(record["name"], record["uid"])
        there, there_record = _read(os.path.join(dest, keep))
        if there is None:
            out.append((entry, keep, "keep"))
        elif there != data and (there_record or {}).get("uid") != record["uid"]:
            out.append((entry, None, f"{dest}/{entry} is another deletion's record and "
                                     f"{dest}/{keep} holds something else"))
    return out


def place(src_path, dest, name):
    """A copy of src_path at dest/name, whole and flushed, unless that name is taken: True if made."""
    with open(src_path, "rb") as fh:
        data = fh.read()
    mode = os.stat(src_path).st_mode & 0o777
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=dest)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        try:
            os.link(tmp, os.path.join(dest, name))
        except FileExistsError:
            return False
        dfd = os.open(dest, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return True
    finally:
        os.unlink(tmp)


def main():
    module = AnsibleModule(
        argument_spec=dict(src=dict(type="path", required=True), dest=dict(type="path", required=True)),
        supports_check_mode=True,
    )
    src, dest = module.params["src"], module.params["dest"]
    copied, kept, conflicts = [], [], []
    if not os.path.isdir(src) or os.path.realpath(src) == os.path.realpath(dest):
        module.exit_json(changed=False, copied=copied, kept=kept, conflicts=conflicts)
    if not os.path.isdir(dest):
        module.fail_json(msg=f"the archive directory {dest} does not exist")
    for entry, target, reason in decide(src, dest):
        if target is None:
            conflicts.append({"file": entry, "reason": reason})
            continue
        if not module.check_mode:
            try:
                made = place(os.path.join(src, entry), dest, target)
            except OSError as e:
                module.fail_json(msg=f"cannot copy {src}/{entry} to {dest}/{target}: {e}",
                                 copied=copied, kept=kept)
            if not made:
                why = f"{dest}/{target} appeared meanwhile; the next run looks again"
                conflicts.append({"file": entry, "reason": why})
                continue
        if reason == "copy":
            copied.append(entry)
        else:
            kept.append({"from": entry, "as": target})
    for c in conflicts:
        module.warn(f"{src}/{c['file']} not copied: {c['reason']}")
    module.exit_json(changed=bool(copied or kept), copied=copied, kept=kept, conflicts=conflicts)


if __name__ == "__main__":
    main()
