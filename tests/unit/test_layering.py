"""The layering rules of docs/architecture.md, checked on the source (issue 24).

The rules are read from the table in docs/architecture.md ("imports" column),
so the drawing and the check cannot drift apart. Every import counts: module
level, inside functions (lazy), and under `TYPE_CHECKING` (mypy follows those).
A known exception or import cycle is listed below with its reason; a new one
fails the test, naming the file and line.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ARCHITECTURE = REPO / "docs" / "architecture.md"
PACKAGES = (
    "corral",
    "workers",
    "workflows",
    "activities",
    "sandbox",
    "policies",
    "observability",
    "contract",
)
# The contract (models, checks, config, errors, labels, ids, search attributes,
# priorities) sits below every layer: everyone imports it, it imports no layer.
EVERYONE_MAY_IMPORT = ("contract",)

# (importing module, imported module) -> why it is allowed anyway.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}

# Each known circle -> why it is still there. A cycle must lie inside one of them.
KNOWN_CYCLES: dict[frozenset[str], str] = {}


# ------------------------------------------------------------------ the rules


def layer_rules(markdown: str) -> dict[str, set[str]]:
    """folder -> the modules it may import (itself included), from the docs' table."""
    rows = [
        (match.group(1), match.group(2))
        for match in re.finditer(r"^\| `(\w+)/` \|.*\| ([^|]+) \|$", markdown, re.MULTILINE)
    ]
    order = [folder for folder, _ in rows]
    rules: dict[str, set[str]] = {}
    for position, (folder, cell) in enumerate(rows):
        if folder not in PACKAGES:
            continue
        if "everything below" in cell:
            allowed = set(order[position + 1 :])
        else:
            cell = re.sub(r"\([^)]*\)", "", cell).replace("`", "")
            allowed = {part.strip() for part in cell.split(",")}
            allowed = {part for part in allowed if re.fullmatch(r"[a-z_]+(\.[a-z_]+)*", part)}
        rules[folder] = (allowed & _importable()) | {folder, *EVERYONE_MAY_IMPORT}
    return rules


def _importable() -> set[str]:
    """What a table cell may name: a package, or a module of one."""
    return set(PACKAGES) | set(_modules())


def allowed(rules: dict[str, set[str]], source: str, target: str) -> bool:
    grants = rules[source.split(".")[0]]
    return any(target == grant or target.startswith(grant + ".") for grant in grants)


# ------------------------------------------------------------------ the source


@cache
def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if "_gen" in path.parts or "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(
    module: str, source: str, known: set[str], *, is_package: bool = False
) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import in `source` of one of ours."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield from _ours(alias.name, node.lineno, known)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, node, is_package)
            submodules = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
            yield from ((name, node.lineno) for name in submodules)
            if len(submodules) < len(node.names):  # names defined in `base` itself
                yield from _ours(base, node.lineno, known)


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    parts = parts if is_package else parts[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join([*parts, *([node.module] if node.module else [])])


def _ours(name: str, line: int, known: set[str]) -> Iterator[tuple[str, int]]:
    # `import sandbox.models.x` names a module we know, or an attribute of one.
    while name and name not in known:
        name = name.rpartition(".")[0]
    if name:
        yield name, line


def import_graph() -> dict[str, list[tuple[str, int]]]:
    modules = _modules()
    known = set(modules)
    return {
        name: list(imports_of(name, path.read_text(), known, is_package=path.name == "__init__.py"))
        for name, path in modules.items()
    }


def upward_imports(
    rules: dict[str, set[str]], graph: dict[str, list[tuple[str, int]]]
) -> list[str]:
    return [
        f"{source}:{line} imports {target}"
        for source, targets in sorted(graph.items())
        for target, line in targets
        if not allowed(rules, source, target) and (source, target) not in KNOWN_UPWARD
    ]


def cycles(graph: dict[str, Iterable[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph.get(root, ())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(component)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(graph.get(child, ()))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def new_cycles(graph: dict[str, list[tuple[str, int]]]) -> list[set[str]]:
    edges = {src: {dst for dst, _ in targets if dst != src} for src, targets in graph.items()}
    return [c for c in cycles(edges) if not any(c <= known for known in KNOWN_CYCLES)]


# ------------------------------------------------------------------ the tests


def test_the_architecture_table_gives_every_package_its_rule() -> None:
    rules = layer_rules(ARCHITECTURE.read_text())
    assert set(rules) == set(PACKAGES)
    assert rules["observability"] == {"observability", *EVERYONE_MAY_IMPORT}
    assert rules["contract"] == {"contract"}  # the contract imports no layer
    assert "workflows" not in rules["activities"]  # models below workflows
    assert "corral" not in rules["workers"]  # entry points never import the face
    assert {"policies.alert", "policies.responses"} <= rules["workflows"]
    assert rules["corral"] >= set(PACKAGES) - {"corral"}


def test_nothing_imports_upward() -> None:
    rules = layer_rules(ARCHITECTURE.read_text())
    upward = upward_imports(rules, import_graph())
    assert not upward, (
        "imports against docs/architecture.md's layering (move the shared code down, "
        "or list the exception with its reason in tests/unit/test_layering.py):\n"
        + "\n".join(upward)
    )


def test_an_upward_import_is_caught() -> None:
    rules = layer_rules(ARCHITECTURE.read_text())
    known = set(_modules())
    source = "from workflows.episode import EpisodeWorkflow\nimport corral.sdk\n"
    graph = {"activities.node": list(imports_of("activities.node", source, known))}
    assert upward_imports(rules, graph) == [
        "activities.node:1 imports workflows.episode",
        "activities.node:2 imports corral.sdk",
    ]
    lazy = "def f() -> None:\n    from observability import records\n"
    graph = {"sandbox.client": list(imports_of("sandbox.client", lazy, known))}
    assert upward_imports(rules, graph) == ["sandbox.client:2 imports observability.records"]


def test_no_new_import_cycle() -> None:
    found = new_cycles(import_graph())
    assert not found, "modules that import each other (move what they share into a module " + (
        f"both import): {[sorted(c) for c in found]}"
    )


def test_a_new_cycle_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    known = frozenset({"sandbox.client", "sandbox.sandbox"})
    monkeypatch.setitem(KNOWN_CYCLES, known, "a made-up known one")
    graph = {
        "observability.plots": [("observability.report", 1)],
        "observability.report": [("observability.plots", 3)],
        "sandbox.client": [("sandbox.sandbox", 9)],
        "sandbox.sandbox": [("sandbox.client", 2)],  # the known one
    }
    assert new_cycles(graph) == [{"observability.plots", "observability.report"}]


# ------------------------------------------------------------------ the CLI (issue 24)


def cli_modules() -> list[str]:
    return sorted(m for m in _modules() if m == "corral.cli" or m.startswith("corral.cli_"))


def lazy_import_lines(source: str) -> set[int]:
    """The lines of the imports made inside a function (not at module level)."""
    return {
        node.lineno
        for function in ast.walk(ast.parse(source))
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef)
        for node in ast.walk(function)
        if isinstance(node, ast.Import | ast.ImportFrom)
    }


def cli_reaches_below(
    graph: dict[str, list[tuple[str, int]]], lazy: dict[str, set[int]]
) -> list[str]:
    """The CLI's imports that pass the SDK by: of a module below the face that is not
    the contract, or of `corral.bench` at module level (a bench mode is imported
    when it runs)."""
    found = []
    for source, targets in sorted(graph.items()):
        for target, line in targets:
            ours = target == "corral" or target.startswith("corral.")
            if ours and (target == "corral.bench" or target.startswith("corral.bench.")):
                if line not in lazy.get(source, set()):
                    found.append(f"{source}:{line} imports {target} at module level")
            elif not ours and not any(
                target == module or target.startswith(module + ".")
                for module in EVERYONE_MAY_IMPORT
            ):
                found.append(f"{source}:{line} imports {target}")
    return found


def test_the_cli_reaches_below_only_through_the_sdk() -> None:
    graph = import_graph()
    modules = cli_modules()
    assert {"corral.cli", "corral.cli_common", "corral.cli_nodes"} <= set(modules)
    lazy = {name: lazy_import_lines(_modules()[name].read_text()) for name in modules}
    below = cli_reaches_below({name: graph[name] for name in modules}, lazy)
    assert not below, (
        "the CLI imports below the face (go through corral.sdk, or corral.ops for what an "
        "operator does; the contract modules are the exception):\n" + "\n".join(below)
    )


def test_a_cli_import_below_the_sdk_is_caught() -> None:
    known = set(_modules())
    source = (
        "from workers.stack import Stack\n"
        "from contract.errors import CorralError\n"
        "from corral.ops.stack import stack_up\n"
        "from corral.bench.core import run_bench\n"
        "def bench() -> None:\n"
        "    from corral.bench.core import describe\n"
        "    from workflows.nodes import list_nodes\n"
        "    import contract.config\n"
    )
    graph = {"corral.cli_tools": list(imports_of("corral.cli_tools", source, known))}
    assert cli_reaches_below(graph, {"corral.cli_tools": lazy_import_lines(source)}) == [
        "corral.cli_tools:1 imports workers.stack",
        "corral.cli_tools:4 imports corral.bench.core at module level",
        "corral.cli_tools:7 imports workflows.nodes",
    ]
