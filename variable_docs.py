#!/usr/bin/env python3
"""One source for each role variable's documentation: the roles' meta/argument_specs.yml.

Ansible checks a role's variables against its argument specs, and `ansible-doc -t role` shows
them; docs/lab.md's table of variables is generated from the same files, between the markers
below, so the three places a variable used to be described (defaults comments, argument specs,
docs) cannot drift apart:

    python3 dev.py docs            rewrite the table (after changing an argument spec)
    python3 dev.py docs --check    exit 1 if the table is not what the specs say

tests/unit/test_variable_docs.py fails when the table is stale, when a variable of a role's
defaults/main.yml has no entry in that role's argument specs, and when an entry's default
disagrees with defaults/main.yml (which is what Ansible actually applies: an argument spec's
default is documentation only).

One row per variable: the role that defines it (its defaults/main.yml, else the first entry
point that declares it optional) gives the type, default and description; the roles and entry
points that only require it (it comes from that role) are listed after it.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent
DOC = ROOT / "docs" / "lab.md"
BEGIN = ("<!-- BEGIN variables: generated from roles/*/meta/argument_specs.yml by "
         "`python3 dev.py docs`; edit the specs, not this table -->")
END = "<!-- END variables -->"
# "{{ name }}" in a default: filled in from the other defaults to compare with the spec's value.
_TEMPLATE = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


@dataclass
class Variable:
    name: str
    role: str
    entry: str
    spec: dict
    used_by: list[str] = field(default_factory=list)


def _load(path: Path):
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def roles(root: Path = ROOT) -> list[Path]:
    return sorted(p for p in (root / "roles").iterdir() if p.is_dir())


def role_defaults(role: Path) -> dict:
    path = role / "defaults" / "main.yml"
    return (_load(path) or {}) if path.exists() else {}


def role_specs(role: Path) -> dict:
    """{entry point: {option: spec}}, main first, the others in file order."""
    path = role / "meta" / "argument_specs.yml"
    specs = ((_load(path) or {}).get("argument_specs") or {}) if path.exists() else {}
    entries = sorted(specs, key=lambda e: e != "main")
    return {e: (specs[e] or {}).get("options") or {} for e in entries}


def _where(role: str, entry: str) -> str:
    return role if entry == "main" else f"{role} ({entry})"


def variables(root: Path = ROOT) -> list[Variable]:
    """Every variable of every role's argument specs, once. Its row is the entry that defines it:
    in that role's defaults/main.yml first, else declared optional, else the first to name it."""
    mentions: dict[str, list[tuple[int, str, str, dict]]] = {}
    for role in roles(root):
        defaults = role_defaults(role)
        for entry, options in role_specs(role).items():
            for name, spec in options.items():
                spec = spec or {}
                rank = 0 if name in defaults else 2 if spec.get("required") else 1
                mentions.setdefault(name, []).append((rank, role.name, entry, spec))
    result = []
    for name, seen in mentions.items():
        _, role, entry, spec = min(seen, key=lambda m: m[0])  # min() keeps the first of a tie
        used_by = [_where(r, e) for _, r, e, _ in seen if (r, e) != (role, entry)]
        result.append(Variable(name, role, entry, spec, used_by))
    # Rows grouped by the defining role (roles in name order), each group in spec order.
    role_order = {r.name: i for i, r in enumerate(roles(root))}
    return sorted(result, key=lambda v: role_order[v.role])


def _text(value) -> str:
    """A spec description (a string or a list of paragraphs) on one table line."""
    if isinstance(value, list):
        value = " ".join(str(v) for v in value)
    return " ".join(str(value or "").split()).replace("|", "\\|")


def _yaml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"' if value == "" or value.strip() != value else value
    if isinstance(value, list):
        return "[" + ", ".join(_yaml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def _code(text: str) -> str:
    return "`" + text.replace("|", "\\|") + "`"


def _type(spec: dict) -> str:
    kind = spec.get("type", "str")
    if kind == "list" and spec.get("elements"):
        return f"list of {spec['elements']}"
    return kind


def _default(var: Variable, defaults: dict) -> str:
    spec = var.spec
    applied = defaults.get(var.name)
    shown = []
    if "default" in spec:
        shown.append(_code(_yaml_value(spec["default"])))
    if isinstance(applied, str) and _TEMPLATE.search(applied):
        shown.append(_code(applied))  # what it follows, e.g. {{ cnpa_base_dir }}/crd.yaml
    elif not shown and var.name in defaults:
        shown.append(_code(_yaml_value(applied)))
    if not shown:
        return "required" if spec.get("required") else "(none)"
    return " = ".join(shown) if len(shown) == 2 else shown[0]


def render(root: Path = ROOT) -> str:
    """The table, markers included."""
    all_defaults = {r.name: role_defaults(r) for r in roles(root)}
    lines = [BEGIN, "", "| Variable | Type | Default | Role | Description |", "|---|---|---|---|---|"]
    for var in variables(root):
        role = f"`{_where(var.role, var.entry)}`"
        if var.used_by:
            role += "; also read by " + ", ".join(f"`{u}`" for u in var.used_by)
        lines.append(f"| `{var.name}` | {_type(var.spec)} | {_default(var, all_defaults[var.role])} "
                     f"| {role} | {_text(var.spec.get('description'))} |")
    return "\n".join([*lines, "", END])


def _split(text: str) -> tuple[str, str, str]:
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"expected one pair of markers in {DOC.name}:\n{BEGIN}\n...\n{END}")
    head, rest = text.split(BEGIN)
    table, tail = rest.split(END)
    return head, BEGIN + table + END, tail


def current(doc: Path = DOC) -> str:
    return _split(doc.read_text(encoding="utf-8"))[1]


def write(doc: Path = DOC, root: Path = ROOT) -> bool:
    """Rewrite the table in doc; True if it changed."""
    text = doc.read_text(encoding="utf-8")
    head, old, tail = _split(text)
    new = render(root)
    if new == old:
        return False
    doc.write_text(head + new + tail, encoding="utf-8")
    return True


def undocumented(root: Path = ROOT) -> list[str]:
    """Variables of a role's defaults/main.yml that no entry point of that role specifies."""
    missing = []
    for role in roles(root):
        specified = {name for options in role_specs(role).values() for name in options}
        missing += [f"{role.name}: {name}" for name in role_defaults(role) if name not in specified]
    return missing


def _resolve(value, known: dict):
    """value with each "{{ name }}" of another default filled in; None if one is unknown."""
    if not isinstance(value, str):
        return value
    names = _TEMPLATE.findall(value)
    if any(n not in known or not isinstance(known[n], (str, int)) for n in names):
        return None
    resolved = _TEMPLATE.sub(lambda m: str(known[m.group(1)]), value)
    return _resolve(resolved, known) if _TEMPLATE.search(resolved) else resolved


def wrong_defaults(root: Path = ROOT) -> list[str]:
    """Spec defaults that differ from the value defaults/main.yml gives the same variable."""
    known: dict = {}
    for role in roles(root):
        known.update(role_defaults(role))
    wrong = []
    for role in roles(root):
        defaults = role_defaults(role)
        for entry, options in role_specs(role).items():
            for name, spec in options.items():
                if name not in defaults or "default" not in (spec or {}):
                    continue
                applied = _resolve(defaults[name], known)
                if applied is not None and applied != spec["default"]:
                    wrong.append(f"{_where(role.name, entry)}: {name}: argument spec says "
                                 f"{spec['default']!r}, defaults/main.yml gives {applied!r}")
    return wrong


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help=f"rewrite the table in {DOC}")
    mode.add_argument("--check", action="store_true", help="exit 1 if the table is stale")
    args = parser.parse_args(argv)
    problems = [f"not in argument_specs.yml: {m}" for m in undocumented()] + wrong_defaults()
    for problem in problems:
        print(f"variable_docs: {problem}", file=sys.stderr)
    if args.check:
        stale = current() != render()
        if stale:
            print(f"variable_docs: the table in {DOC.relative_to(ROOT)} is stale; run "
                  "`python3 dev.py docs`", file=sys.stderr)
        else:
            print(f"{DOC.relative_to(ROOT)}: table up to date")
        return 1 if stale or problems else 0
    changed = write()
    print(f"{DOC.relative_to(ROOT)}: {'table rewritten' if changed else 'table up to date'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
