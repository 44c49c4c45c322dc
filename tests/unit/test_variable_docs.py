"""One source per variable's documentation: docs/lab.md's table is what the roles' argument specs
say (variable_docs.py), every default has a spec, and no spec states another default.

The first three tests check the repository; the others check that the generator and its checks
catch what they are for, on a small tree of roles made here."""

from __future__ import annotations

import textwrap

import pytest

import variable_docs as vd


def test_docs_table_is_what_the_argument_specs_say():
    assert vd.current() == vd.render(), (
        "docs/lab.md's variable table is stale: run `python3 dev.py docs` and commit the result")


def test_every_default_has_an_argument_spec():
    assert vd.undocumented() == [], (
        "variables in defaults/main.yml without an entry in that role's meta/argument_specs.yml")


def test_argument_spec_defaults_are_the_applied_ones():
    assert vd.wrong_defaults() == []


# -- the generator on a tree of its own ---------------------------------------------------------

def _role(root, name, defaults: str, specs: str) -> None:
    role = root / "roles" / name
    (role / "defaults").mkdir(parents=True)
    (role / "meta").mkdir()
    (role / "defaults" / "main.yml").write_text(textwrap.dedent(defaults))
    (role / "meta" / "argument_specs.yml").write_text(textwrap.dedent(specs))


@pytest.fixture
def tree(tmp_path):
    _role(tmp_path, "base", """\
        ---
        base_dir: /srv/lab
        base_file: "{{ base_dir }}/x.json"
        """, """\
        ---
        argument_specs:
          main:
            options:
              base_dir: {type: path, default: /srv/lab, description: Where | everything lives.}
              base_file:
                type: path
                default: /srv/lab/x.json
                description: [One file., "Two lines."]
        """)
    _role(tmp_path, "user", """\
        ---
        user_paths: [/a, /b]
        """, """\
        ---
        argument_specs:
          main:
            options:
              user_paths: {type: list, elements: path, default: [/a, /b], description: Paths.}
              base_dir: {type: path, required: true, description: From base.}
          stop:
            options:
              base_dir: {type: path, required: true, description: From base.}
              user_only_input: {type: str, required: true, description: Given by the caller.}
        """)
    doc = tmp_path / "doc.md"
    doc.write_text(f"# Vars\n\nbefore\n\n{vd.BEGIN}\nold table\n{vd.END}\n\nafter\n")
    return tmp_path, doc


def test_render_one_row_per_variable_from_the_role_that_defines_it(tree):
    root, _ = tree
    rows = [line for line in vd.render(root).splitlines() if line.startswith("| `")]
    assert rows == [
        "| `base_dir` | path | `/srv/lab` | `base`; also read by `user`, `user (stop)` "
        "| Where \\| everything lives. |",
        "| `base_file` | path | `/srv/lab/x.json` = `{{ base_dir }}/x.json` | `base` "
        "| One file. Two lines. |",
        "| `user_paths` | list of path | `[/a, /b]` | `user` | Paths. |",
        "| `user_only_input` | str | required | `user (stop)` | Given by the caller. |",
    ]


def test_write_replaces_only_the_table_and_check_sees_staleness(tree):
    root, doc = tree
    assert vd.current(doc) != vd.render(root)
    assert vd.write(doc, root) is True
    text = doc.read_text()
    assert text.startswith("# Vars\n\nbefore\n\n" + vd.BEGIN) and text.endswith(vd.END + "\n\nafter\n")
    assert "old table" not in text
    assert vd.current(doc) == vd.render(root)
    assert vd.write(doc, root) is False  # a second run changes nothing
    # A new option in a spec makes the table stale again.
    spec = root / "roles/user/meta/argument_specs.yml"
    spec.write_text(spec.read_text().replace(
        "\n  stop:", "\n  main2:\n    options: {new_var: {type: int}}\n  stop:"))
    assert vd.current(doc) != vd.render(root)
    assert "| `new_var` | int | (none) |" in vd.render(root)


def test_a_default_without_a_spec_is_found(tree):
    root, _ = tree
    assert vd.undocumented(root) == []
    with open(root / "roles/user/defaults/main.yml", "a") as fh:
        fh.write("user_secret_knob: 3\n")
    assert vd.undocumented(root) == ["user: user_secret_knob"]


def test_a_spec_default_that_is_not_the_applied_one_is_found(tree):
    root, _ = tree
    assert vd.wrong_defaults(root) == []
    defaults = root / "roles/base/defaults/main.yml"
    # The template follows base_dir: a changed base_dir makes the spec of base_file wrong too.
    defaults.write_text(defaults.read_text().replace("base_dir: /srv/lab", "base_dir: /opt/lab"))
    assert vd.wrong_defaults(root) == [
        "base: base_dir: argument spec says '/srv/lab', defaults/main.yml gives '/opt/lab'",
        "base: base_file: argument spec says '/srv/lab/x.json', defaults/main.yml gives "
        "'/opt/lab/x.json'",
    ]


def test_markers_missing_or_doubled_is_an_error(tmp_path, tree):
    root, _ = tree
    doc = tmp_path / "bad.md"
    for text in ("no markers\n", f"{vd.BEGIN}\n{vd.END}\n{vd.BEGIN}\n{vd.END}\n", f"{vd.END}\n{vd.BEGIN}\n"):
        doc.write_text(text)
        with pytest.raises(ValueError, match="one pair of markers"):
            vd.write(doc, root)
