"""The shape of the cnpa_controller package, as a maintainer reads it: its modules import each
other without a cycle (so every module stands on a floor above all it imports, and nothing runs
back up), and each module is short enough to hold in one's head.

`python3 tests/unit/test_ctl_structure.py` prints the floors, the imports and the line counts."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "roles/cnpa_reconciler/files/cnpa_controller"
# The most lines any module of the package may have, and the executor and the two stores it
# composes (one job each: requests, records, Events).
MAX_LINES = 500
ONE_JOB = {"executor": 350, "archive": 350, "events": 350}


def modules() -> dict[str, Path]:
    return {p.stem: p for p in sorted(PACKAGE.glob("*.py"))}


def imports() -> dict[str, set[str]]:
    """module -> the package's modules it imports (at any place in it: a function's import
    counts as much as the module's own)."""
    mods = modules()
    out: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                names = [node.module.split(".")[0]] if node.module else \
                    [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                    node.module.startswith("cnpa_controller."):
                names = [node.module.split(".")[1]]
            elif isinstance(node, ast.Import):
                names = [a.name.split(".")[1] for a in node.names
                         if a.name.startswith("cnpa_controller.")]
            else:
                continue
            out[m].update(n for n in names if n in mods and n != m)
    return out


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each module's floor: 0 when it imports none of the package, else one above the highest of
    those it imports. Raises ValueError naming a cycle."""
    floor: dict[str, int] = {}

    def visit(m: str, path: tuple[str, ...]) -> int:
        if m in path:
            raise ValueError("import cycle: " + " -> ".join((*path[path.index(m):], m)))
        if m not in floor:
            floor[m] = max((visit(t, (*path, m)) + 1 for t in graph[m]), default=0)
        return floor[m]

    for m in graph:
        visit(m, ())
    return floor


def lines() -> dict[str, int]:
    return {m: len(p.read_text().splitlines()) for m, p in modules().items()}


def test_the_package_imports_without_a_cycle():
    floors(imports())   # raises on a cycle


def test_the_executor_composes_the_archive_store_and_the_recorder_which_never_call_back():
    graph = imports()
    assert {"archive", "events"} <= graph["executor"]
    for store in ("archive", "events"):
        assert "executor" not in graph[store] and not {"archive", "events"} & graph[store]


def test_every_mode_reads_its_settings_from_config_not_from_the_watch_loop():
    graph = imports()
    for mode in ("once", "__main__"):
        assert "config" in graph[mode]
    assert "controller" not in graph["once"]


def _outside_imports(module: str) -> set[str]:
    """What a module imports from outside the package, each name with its parents (http.client
    gives http and http.client)."""
    names = set()
    for node in ast.walk(ast.parse(modules()[module].read_text())):
        if isinstance(node, ast.Import):
            found = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found = [node.module]
        else:
            continue
        for name in found:
            parts = name.split(".")
            names.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return {n for n in names if not n.startswith("cnpa_controller")}


def test_one_transport_and_one_kubeconfig_reader_for_every_mode():
    """Every request and watch goes through api.py's http.client connection; the kubeconfig is
    read in kubeconfig.py alone; the kubernetes client and urllib3 are not imported at all."""
    for module in modules():
        outside = _outside_imports(module)
        assert not {"kubernetes", "urllib3"} & outside, module
        if module != "api":
            assert not {"http.client", "urllib.request", "ssl"} & outside, \
                f"{module} makes requests itself"
        if module != "kubeconfig":
            assert "yaml" not in outside, f"{module} reads a kubeconfig itself"


def test_no_module_is_too_long_to_hold_in_ones_head():
    counted = lines()
    for module, most in ONE_JOB.items():
        assert counted[module] < most, f"{module}.py: {counted[module]} lines"
    too_long = {m: n for m, n in counted.items() if n > MAX_LINES}
    assert not too_long, f"over {MAX_LINES} lines: {too_long}"


if __name__ == "__main__":
    graph, counted = imports(), lines()
    floor = floors(graph)
    print(f"{len(graph)} modules on {max(floor.values()) + 1} floors, "
          f"{sum(counted.values())} lines")
    for f in range(max(floor.values()) + 1):
        print(f"floor {f}: " + ", ".join(f"{m} ({counted[m]})" for m in graph if floor[m] == f))
    for m in graph:
        print(f"  {m} -> {', '.join(sorted(graph[m])) or '-'}")
    sys.exit(0)
