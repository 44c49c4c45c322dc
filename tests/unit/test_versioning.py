"""The collection's version means what semantic versioning says: the changes a version carries
(changelogs/changelog.yaml, antsibull-changelog's record of the releases, and the fragments in
changelogs/fragments/ not released yet) never hold breaking changes without a new major, or
removed features without at least a new minor.

galaxy.yml's `version` is the version a tarball built from this tree says it is, so it must be
right as soon as a fragment says what the tree changed: the change that adds a
`breaking_changes` fragment raises the major (a `removed_features` one the minor) in the same
step, not only at the release. (`cnpa_controller.__version__` is galaxy.yml's version:
tests/unit/test_ctl_main.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHANGELOGS = ROOT / "changelogs"

# Releases made before this test existed that break the rule, each with why it stays: a release
# cannot be renumbered once published. Nothing is added here; a release that breaks the rule is
# made again under the right number.
KNOWN_MISNUMBERED = {
    "1.2.0": "renamed metrics and moved every default path (breaking changes) in a minor release; "
             "it should have been 2.0.0, as the next release's summary says",
}


def semver(text: str) -> tuple[int, int, int]:
    found = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(?:[-+][0-9A-Za-z.+-]*)?", str(text))
    assert found, f"not a semantic version: {text!r}"
    return int(found[1]), int(found[2]), int(found[3])


def needed(sections: set[str], previous: str) -> tuple[int, int, int] | None:
    """The lowest version the sections' kinds of change allow after previous (None: no rule)."""
    major, minor, _ = semver(previous)
    if "breaking_changes" in sections:
        return (major + 1, 0, 0)
    if "removed_features" in sections:
        return (major, minor + 1, 0)
    return None


def verdict(version: str, previous: str, sections: set[str]) -> str | None:
    """Why version cannot follow previous with changes of these sections, or None if it can."""
    lowest = needed(sections, previous)
    if lowest is not None and semver(version) < lowest:
        kind = "breaking changes" if "breaking_changes" in sections else "removed features"
        return (f"{version} after {previous} with {kind}: semantic versioning needs at least "
                f"{'.'.join(map(str, lowest))}")
    return None


def releases() -> dict[str, dict]:
    return yaml.safe_load((CHANGELOGS / "changelog.yaml").read_text())["releases"]


def released_order() -> list[str]:
    return sorted(releases(), key=semver)


def pending_fragments() -> dict[str, dict]:
    """The fragments not released yet (antsibull-changelog reads .yml and .yaml files)."""
    released = {name for release in releases().values() for name in release.get("fragments", [])}
    found = {}
    for path in sorted((CHANGELOGS / "fragments").iterdir()):
        if path.suffix in (".yml", ".yaml") and path.name not in released:
            found[path.name] = yaml.safe_load(path.read_text()) or {}
    return found


def galaxy_version() -> str:
    return yaml.safe_load((ROOT / "galaxy.yml").read_text())["version"]


@pytest.mark.parametrize(("version", "previous", "sections", "wrong"), [
    ("2.0.0", "1.3.0", {"breaking_changes", "minor_changes"}, False),
    ("1.4.0", "1.3.0", {"breaking_changes"}, True),
    ("1.3.1", "1.3.0", {"removed_features"}, True),
    ("1.4.0", "1.3.0", {"removed_features"}, False),
    ("2.0.0", "1.3.0", {"removed_features"}, False),
    ("1.3.1", "1.3.0", {"minor_changes", "bugfixes"}, False),
    ("1.3.0", "1.3.0", {"breaking_changes"}, True),
    ("2.0.0-rc1", "1.9.2", {"breaking_changes"}, False),
])
def test_the_rule(version, previous, sections, wrong):
    assert (verdict(version, previous, sections) is not None) is wrong


def test_each_release_raises_what_its_changes_need():
    order = released_order()
    found = {}
    for previous, version in zip(order, order[1:]):
        why = verdict(version, previous, set(releases()[version].get("changes", {})))
        if why:
            found[version] = why
    unexplained = {v: why for v, why in found.items() if v not in KNOWN_MISNUMBERED}
    assert not unexplained, unexplained
    # Every exception is still one: the list cannot hold a release that was right.
    assert set(KNOWN_MISNUMBERED) <= set(found), set(KNOWN_MISNUMBERED) - set(found)


def test_galaxy_version_is_the_last_release_or_later():
    last = released_order()[-1]
    assert semver(galaxy_version()) >= semver(last), (galaxy_version(), last)
    if semver(galaxy_version()) > semver(last):
        assert pending_fragments(), (f"galaxy.yml says {galaxy_version()}, the last release is "
                                     f"{last}, and no fragment in changelogs/fragments/ says "
                                     "what changed")


def test_the_pending_fragments_fit_galaxy_version():
    """The tree's version (galaxy.yml) against the last release and what the fragments since
    then say."""
    pending = pending_fragments()
    sections = {key for fragment in pending.values() for key in fragment}
    last = released_order()[-1]
    why = verdict(galaxy_version(), last, sections)
    which = sorted(name for name, fragment in pending.items()
                   if {"breaking_changes", "removed_features"} & set(fragment))
    assert why is None, (f"galaxy.yml's version: {why} (changelogs/fragments/: {', '.join(which)});"
                         " raise version in galaxy.yml and cnpa_controller.__version__")


def test_one_release_summary_at_most():
    """antsibull-changelog refuses a release whose fragments hold two release summaries ("Found
    prelude section ... more than once"): the next release's summary is one fragment; add to it."""
    with_summary = sorted(name for name, fragment in pending_fragments().items()
                          if "release_summary" in fragment)
    assert len(with_summary) <= 1, with_summary
