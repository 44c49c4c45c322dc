"""The collection's tarball as `ansible-galaxy collection build` makes it (a few seconds, no
network): its metadata is true (an SPDX license matching LICENSE, no placeholder address,
dependencies the collection uses and nothing else, the version ranges tests/collection runs at
both ends), and no file it carries names a file of this repository that it does not carry (the
development README pointing at dev.py, a comment pointing at tests/).

A "name" is a path-like word of a shipped text file: a relative path with a slash, resolved from
the file's directory and from the collection's root (markdown links and plain mentions), or a file
name with an extension. It names an unshipped file when it is a path of this repository (a file
git tracks, or a directory of one) that the tarball lacks, and no shipped path is it or ends with
it: `cnpa_controller/plan.py` is the role's copy, which is shipped. Absolute paths (the target's
/opt/cnpa-op/...), URLs and ~/... are not the repository's and are left alone.
"""

from __future__ import annotations

import importlib.util
import json
import posixpath
import re
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
GALAXY = yaml.safe_load((ROOT / "galaxy.yml").read_text())
RUNTIME = yaml.safe_load((ROOT / "meta" / "runtime.yml").read_text())
GENERATED = {"MANIFEST.json", "FILES.json"}

# Names in shipped files that are not this change's to fix, each with what would fix it. The test
# fails on any other, and on an entry here that no longer occurs: fixing one means deleting it.
KNOWN = {
    # Comments in the roles and the controller package, which other work is changing: each should
    # name what the tarball carries (docs/collection.md, docs/operations.md, docs/target.md, the
    # role's own files) or say what it means without a path.
    ("roles/cnpa/defaults/main.yml", "docs/install.md"): "upgrade and uninstall: docs/collection.md",
    ("roles/cnpa_controller/defaults/main.yml", "docs/install.md"): "archive records: docs/collection.md",
    ("roles/cnpa_controller/defaults/main.yml", "docs/faults.md"): "the lease timings' figures",
    ("roles/cnpa_controller/defaults/main.yml", "tests/multihost"): "the lease timings' test",
    ("roles/cnpa_controller/defaults/main.yml", "docs/benchmark.md"): "the workers' figures",
    ("roles/cnpa_controller/meta/argument_specs.yml", "docs/install.md"):
        "shown by ansible-doc to the collection's users: docs/collection.md",
    ("roles/cnpa_lab/defaults/main.yml", "molecule/default"): "the lab's verify scenario",
    ("roles/cnpa_reconciler/files/cnpa_controller/__init__.py", "galaxy.yml"):
        "the version is the collection's (MANIFEST.json in the tarball)",
    ("roles/cnpa_reconciler/files/cnpa_controller/__main__.py", "docs/architecture.md"):
        "the --help text quoted there",
}

TOKEN = re.compile(r"(?<![\w/.:~$%@-])(?:\.\.?/)*[A-Za-z0-9_][A-Za-z0-9_.-]*"
                   r"(?:/[A-Za-z0-9_.-]+)*/?")
FILE_NAME = re.compile(r"\.[a-z][a-z0-9]{0,4}$")


def tree(paths) -> set[str]:
    """paths with every directory above them."""
    out = set()
    for path in paths:
        path = path.rstrip("/")
        while path and path != ".":
            out.add(path)
            path = posixpath.dirname(path)
    return out


def repository() -> set[str]:
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True,
                            check=True, timeout=60).stdout.decode().split("\0")
    return tree(p for p in listed if p)


def unshipped_names(texts: dict[str, str], shipped: set[str], repo: set[str]) -> set[tuple]:
    """(file, name) for every name in texts (shipped path -> its text) of a repository path that
    is not shipped."""
    shipped = tree(shipped)
    missing = repo - shipped
    shipped_base = {posixpath.basename(p) for p in shipped}
    missing_base = {posixpath.basename(p) for p in missing if FILE_NAME.search(p)}
    found = set()
    for name, text in texts.items():
        here = posixpath.dirname(name)
        for match in TOKEN.finditer(text):
            word = match.group().rstrip(".,;:")
            path = word.rstrip("/")
            if "/" not in word and not FILE_NAME.search(path):
                continue
            candidates = {posixpath.normpath(posixpath.join(here, path)), posixpath.normpath(path)}
            if candidates & shipped:
                continue
            bare = path.lstrip("./")
            if "/" in bare and any(s.endswith("/" + bare) for s in shipped):
                continue
            if "/" not in bare and bare in shipped_base:
                continue
            if candidates & missing or ("/" not in bare and bare in missing_base):
                found.add((name, word))
    return found


@pytest.fixture(scope="module")
def tarball(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tarball")
    subprocess.run([BIN / "ansible-galaxy", "collection", "build", "--output-path", out, ROOT],
                   cwd=out, capture_output=True, check=True, timeout=300)
    return out / f"labhub-cnpa-{GALAXY['version']}.tar.gz"


@pytest.fixture(scope="module")
def contents(tarball) -> tuple[set[str], dict[str, str]]:
    """(every path in the tarball, the text of each shipped text file)."""
    with tarfile.open(tarball) as tar:
        members = tar.getmembers()
        texts = {}
        for member in members:
            if member.isfile() and member.name not in GENERATED:
                try:
                    texts[member.name] = tar.extractfile(member).read().decode()
                except UnicodeDecodeError:
                    pass   # a picture
    return {m.name.rstrip("/") for m in members}, texts


def test_no_shipped_file_names_a_repository_file_it_does_not_ship(contents):
    shipped, texts = contents
    found = unshipped_names(texts, shipped, repository())
    new = sorted(found - set(KNOWN))
    assert not new, "shipped files name files the tarball lacks:\n  " + \
        "\n  ".join(f"{name}: {word}" for name, word in new)
    gone = sorted(set(KNOWN) - found)
    assert not gone, f"fixed: delete these from KNOWN: {gone}"


@pytest.mark.parametrize(("name", "text", "flagged"), [
    ("README.md", "python3 dev.py test", {"dev.py"}),
    ("docs/collection.md", "see `tests/collection/` and [x](../tests/unit/test_plan.py)",
     {"tests/collection/", "../tests/unit/test_plan.py"}),
    ("docs/collection.md", "[ops](operations.md), [lab](lab.md) and README.md", {"lab.md", "README.md"}),
    ("roles/cnpa/tasks/main.yml", "# as in cnpa_controller/plan.py and files/reconcile.sh", set()),
    ("roles/cnpa/tasks/main.yml", "dest: /opt/cnpa-op/reconcile.sh, ~/.cache/cnpa-op/tests/x", set()),
    ("roles/cnpa/tasks/main.yml", "https://example.org/tests/dev.py and $HOME/tests/x", set()),
    ("docs/collection.md", "`labhub.cnpa.site` is playbooks/site.yml; not bench/", {"bench/"}),
    ("meta/runtime.yml", "# pinned in requirements.txt, see galaxy.yml.", {"requirements.txt", "galaxy.yml"}),
    ("docs/collection.md", "platform.labhub.io/v1alpha1, team-<name>/quota, 0.5/s", set()),
])
def test_the_names_found_are_the_unshipped_files_named(name, text, flagged):
    shipped = {"docs/collection.md", "docs/operations.md", "roles/cnpa/tasks/main.yml",
               "roles/cnpa_reconciler/files/reconcile.sh", "playbooks/site.yml", "meta/runtime.yml",
               "roles/cnpa_reconciler/files/cnpa_controller/plan.py"}
    repo = tree(shipped | {"README.md", "dev.py", "tests/collection/test_collection.py",
                           "tests/unit/test_plan.py", "docs/lab.md", "bench/report.py", "site.yml",
                           "requirements.txt", "galaxy.yml", "cnpa_controller/plan.py"})
    assert {word for _, word in unshipped_names({name: text}, shipped, repo)} == flagged


def test_the_manifest_has_the_license_and_no_placeholder(tarball):
    with tarfile.open(tarball) as tar:
        info = json.load(tar.extractfile("MANIFEST.json"))["collection_info"]
        license_text = tar.extractfile("LICENSE").read().decode()
    assert info["license"] == ["GPL-3.0-or-later"] and info["license_file"] is None, info
    # LICENSE is the GPL version 3; the modules' headers grant "v3.0+" (or later).
    assert "GNU GENERAL PUBLIC LICENSE\n                       Version 3, 29 June 2007" in license_text
    for module in (ROOT / "plugins" / "modules").glob("*.py"):
        assert "GNU General Public License v3.0+" in module.read_text(), module
    for key in ("repository", "documentation", "homepage", "issues"):
        assert not info[key] or "example" not in info[key], (key, info[key])
    assert info["readme"] == "docs/collection.md"


def test_the_dependencies_are_what_the_collection_uses(contents):
    """A collection named by a fully qualified name in what the tarball ships (roles, playbooks,
    plugins, meta) is declared, and a declared one is named there: ansible.posix, whose callbacks
    only the repository's ansible.cfg and molecule scenarios enable, is not a dependency."""
    _, texts = contents
    used = set()
    for name, text in texts.items():
        if name.split("/")[0] not in ("roles", "playbooks", "plugins", "meta"):
            continue
        if name.endswith((".yml", ".yaml", ".j2")):
            # A module, a module_defaults group, a role, a filter: namespace.collection.name.
            used |= set(re.findall(r"(?<![\w./])([a-z][a-z0-9_]*\.[a-z][a-z0-9_]*)\.[a-z_]\w*",
                                   text))
        elif name.endswith(".py"):
            used |= {".".join(m) for m in re.findall(r"ansible_collections\.(\w+)\.(\w+)", text)}
    # Only Ansible content namespaces: words like platform.labhub.io are not collections.
    collections = {c for c in used if c.split(".")[0] in {"ansible", "kubernetes", "community",
                                                          "labhub", "cloud", "containers"}}
    assert collections - {"ansible.builtin", "ansible.legacy", "labhub.cnpa"} == \
        set(GALAXY["dependencies"]), collections


def pin(path: Path, package: str) -> str:
    return re.search(rf"^{re.escape(package)}==(\S+)", path.read_text(), re.M)[1]


def test_the_declared_ranges_end_at_the_versions_the_collection_tests_run():
    """requires_ansible and the kubernetes.core dependency are closed ranges whose ends are the
    pinned versions tests/collection runs: the highest with the lab's pins, the lowest from
    tests/collection/lowest/ (which kubernetes.core its `ansible` wheel bundles is checked there,
    once the wheel is downloaded)."""
    spec = re.fullmatch(r">=([\d.]+),<=([\d.]+)", RUNTIME["requires_ansible"])
    assert spec, RUNTIME["requires_ansible"]
    lowest = ROOT / "tests" / "collection" / "lowest"
    assert spec[1] == pin(lowest / "requirements.txt", "ansible-core") \
        == pin(lowest / "requirements.lock", "ansible-core")
    assert spec[2] == pin(ROOT / "requirements.lock", "ansible-core")
    kubernetes_core = re.fullmatch(r">=([\d.]+),<=([\d.]+)", GALAXY["dependencies"]["kubernetes.core"])
    assert kubernetes_core, GALAXY["dependencies"]
    bundled = Path(importlib.util.find_spec("ansible_collections").submodule_search_locations[0])
    from importlib.metadata import version
    assert version("ansible") == pin(ROOT / "requirements.lock", "ansible"), "stale .venv"
    manifest = json.loads((bundled / "kubernetes/core/MANIFEST.json").read_text())
    assert kubernetes_core[2] == manifest["collection_info"]["version"]
    assert "ansible==" in (lowest / "kubernetes-core.lock").read_text()


def test_the_alerts_runbook_links_point_into_what_the_tarball_carries(contents):
    """monitoring/alerts.yml's default runbook base is a page of the collection as installed
    under /usr/share/ansible/collections; the tarball carries that page with every anchor."""
    shipped, texts = contents
    rules = [r for g in yaml.safe_load(texts["monitoring/alerts.yml"])["groups"] for r in g["rules"]]
    prefix = "file:///usr/share/ansible/collections/ansible_collections/labhub/cnpa/"
    for rule in rules:
        url = rule["annotations"]["runbook_url"]
        assert url.startswith(prefix), url
        page, anchor = url[len(prefix):].split("#")
        assert page in shipped, page
        headings = re.findall(r"^#+ (.*)$", texts[page], re.MULTILINE)
        assert anchor in {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
                          for h in headings}, (page, anchor)
    assert "monitoring/generate.py" in shipped and "monitoring/alerts_test.yml" in shipped
