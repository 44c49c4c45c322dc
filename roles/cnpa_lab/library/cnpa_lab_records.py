# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's own archive records: found by name and uid, never by a file name alone."""

import json
import os

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: cnpa_lab_records
short_description: Find, and optionally remove, the archive records of the lab's own TeamSpaces
description:
  - The archive directory holds a record (C(NAME.json), earlier ones C(NAME.UID.json)) of every
    TeamSpace the controller archived, the lab's and anybody else's. This module tells the lab's
    apart by content, not by file name.
  - A record is the lab's only when its file is a regular file named C(NAME.json) or
    C(NAME.UID.json) for a TeamSpace NAME of O(uids), it holds a JSON object whose C(name) is
    NAME and whose C(uid) is one of the lab's uids of NAME (and, for C(NAME.UID.json), equals
    UID). Anything else (another name, another uid, not JSON, a symlink) is reported in
    RV(others) and never touched.
  - The lab's uids of NAME are O(uids[NAME]) plus those the lab's evidence files under
    O(base_dir) record for NAME (O(evidence)).
  - The archive directory itself is never removed (the controller's sandbox binds it).
version_added: "1.0.0"
author:
  - cnpa-op maintainers
options:
  archive_dir:
    description: The controller's archive directory.
    type: path
    required: true
  base_dir:
    description: Directory of the lab's evidence files (O(evidence) paths are relative to it).
    type: path
    required: true
  teamspaces:
    description: Names of the lab's TeamSpaces whose records are looked at (others never are).
    type: list
    elements: str
    required: true
  uids:
    description:
      - TeamSpace name to a uid, or a list of uids, known to be the lab's (for example the live
        TeamSpaces about to be deleted).
    type: dict
    default: {}
  evidence:
    description:
      - Where the evidence files record the lab's uids, a list of C(file), C(teamspace), C(key).
      - A file that is missing, not JSON or without that key adds nothing.
    type: list
    elements: dict
    default: []
  state:
    description: C(present) only reports; C(absent) removes the lab's records.
    type: str
    choices: [present, absent]
    default: present
attributes:
  check_mode:
    support: full
notes:
  - Runs on the target, with its own Python standard library only.
"""

EXAMPLES = r"""
- name: Remove the records of the lab's alpha and beta, nothing else
  cnpa_lab_records:
    archive_dir: /root/cnpa-op/archive
    base_dir: /root/cnpa-op
    teamspaces: [alpha, beta]
    uids: {alpha: "{{ alpha_uid }}"}
    evidence:
      - {file: before.json, teamspace: alpha, key: uid}
      - {file: cleanup.json, teamspace: beta, key: uid}
    state: absent
"""

RETURN = r"""
uids:
  description: The lab's uids of each name of O(teamspaces), sorted.
  type: dict
  returned: always
records:
  description: The lab's records (C(path), C(name), C(uid)).
  type: list
  elements: dict
  returned: always
others:
  description: Files named after one of the TeamSpaces that are not the lab's records (kept).
  type: list
  elements: str
  returned: always
removed:
  description: Paths removed (or that would be removed in check mode).
  type: list
  elements: str
  returned: always
"""


def _load(path):
    """The parsed JSON of a regular file, or None (missing, unreadable, not JSON, a symlink)."""
    try:
        if os.path.islink(path) or not os.path.isfile(path):
            return None
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def lab_uids(base_dir, teamspaces, evidence, known):
    """The lab's uids of each TeamSpace name: known (name -> uid or uids) plus the uids the
    evidence files record, as sorted lists."""
    uids = {name: set() for name in teamspaces}
    for name, value in known.items():
        if name in uids:
            uids[name].update(u for u in ([value] if isinstance(value, str) else value or []) if u)
    for item in evidence:
        data = _load(os.path.join(base_dir, item["file"]))
        uid = data.get(item["key"]) if isinstance(data, dict) else None
        if isinstance(uid, str) and uid and item["teamspace"] in uids:
            uids[item["teamspace"]].add(uid)
    return {name: sorted(v) for name, v in uids.items()}


def classify(archive_dir, uids):
    """(records, others): the lab's records and the other files named after its TeamSpaces."""
    try:
        entries = sorted(os.listdir(archive_dir))
    except OSError:
        return [], []
    records, others = [], []
    for entry in entries:
        for name, known in uids.items():
            if entry == name + ".json":
                file_uid = None
            elif entry.startswith(name + ".") and entry.endswith(".json") and len(entry) > len(name) + 6:
                file_uid = entry[len(name) + 1:-len(".json")]
            else:
                continue
            path = os.path.join(archive_dir, entry)
            data = _load(path)
            if (isinstance(data, dict) and data.get("name") == name and data.get("uid") in known
                    and file_uid in (None, data.get("uid"))):
                records.append({"path": path, "name": name, "uid": data["uid"]})
            else:
                others.append(path)
            break
    return records, others


def main():
    module = AnsibleModule(
        argument_spec=dict(
            archive_dir=dict(type="path", required=True),
            base_dir=dict(type="path", required=True),
            teamspaces=dict(type="list", elements="str", required=True),
            uids=dict(type="dict", default={}),
            evidence=dict(type="list", elements="dict", default=[]),
            state=dict(type="str", choices=["present", "absent"], default="present"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    uids = lab_uids(p["base_dir"], p["teamspaces"], p["evidence"], p["uids"])
    records, others = classify(p["archive_dir"], uids)
    removed = []
    if p["state"] == "absent":
        for rec in records:
            if not module.check_mode:
                try:
                    os.unlink(rec["path"])
                except FileNotFoundError:
                    continue
                except OSError as e:
                    module.fail_json(msg=f"cannot remove {rec['path']}: {e}", removed=removed)
            removed.append(rec["path"])
    module.exit_json(changed=bool(removed), uids=uids, records=records, others=others, removed=removed)


if __name__ == "__main__":
    main()
