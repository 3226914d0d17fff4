"""The tree shows the architecture, and stays that way: each room (a package or a top-level
module of `agent/`) imports only the rooms below it, no module imports itself through
others (no import circle, TYPE_CHECKING imports included), and no module is past
MAX_LINES without saying why in its opening docstring.

Read from the code's own imports with `ast`; nothing is imported or run.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "agent"

MAX_LINES = 700
LONG_BECAUSE = "long because"
"""A module past MAX_LINES says why in its docstring with these words."""

# Bottom to top. A room may import the rooms named for it; `agent.cli` finds the
# subcommands' modules by name at run time and is checked by its own test below.
BASE = {"protocol", "backoff", "message", "logs", "config", "tally", "files"}
MAY_IMPORT: dict[str, set[str]] = {
    "protocol": set(),
    "files": set(),
    "backoff": set(),
    "tally": set(),
    "message": set(),
    "logs": set(),
    "config": {"controller"},
    "controller": set(),
    "line": {"controller", "tally"},
    "simulator": {"controller"},
    "client": {"protocol", "backoff", "message", "logs", "config", "tally"},
    "emulator": BASE | {"client"},
    "sync": BASE | {"client", "controller"},
    "pair": BASE | {"client"},
    "ops": BASE | {"client", "controller", "sync"},
    "commission": BASE | {"client", "controller", "ops"},
    "runtime": BASE
    | {"client", "controller", "line", "simulator", "emulator", "sync", "pair", "ops"},
    "cli": {"runtime"},
    "__main__": {"cli"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "agent"


def _imports(module: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The modules of `agent` that `module` imports, anywhere in the file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "agent":
                    yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.split(".")[0] != "agent":
                continue
            for alias in node.names:
                # `from agent.x import y`: y may be a module of its own.
                sub = f"{target}.{alias.name}"
                yield sub if sub in known else target


def _graph() -> dict[str, set[str]]:
    known = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        targets = set()
        for target in _imports(module, path, known):
            while target not in known and "." in target:
                target = target.rpartition(".")[0]
            if target in known and target != module:
                targets.add(target)
        graph[module] = targets
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_room_is_known() -> None:
    rooms = {_room(module) for module in _modules()} - {"agent"}
    assert rooms <= set(MAY_IMPORT), (
        f"rooms without a place in MAY_IMPORT: {rooms - set(MAY_IMPORT)}"
    )


def test_no_room_imports_a_room_above_it() -> None:
    wrong = []
    for module, targets in _graph().items():
        room = _room(module)
        for target in targets:
            other = _room(target)
            if other not in (room, "agent") and other not in MAY_IMPORT.get(room, set()):
                wrong.append(f"{module} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_no_import_circle() -> None:
    circles = _circles(_graph())
    assert not circles, "\n".join(" <-> ".join(c) for c in circles)


def test_the_circle_check_sees_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("module", sorted(_modules()))
def test_no_module_is_long_without_a_reason(module: str) -> None:
    path = _modules()[module]
    lines = len(path.read_text().splitlines())
    if lines <= MAX_LINES:
        return
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert LONG_BECAUSE in docstring, (
        f"{path.relative_to(ROOT)} has {lines} lines: split it by concern, or say in its "
        f"docstring why it is {LONG_BECAUSE} ..."
    )


def test_the_cli_names_only_modules_that_exist() -> None:
    from agent.cli import SUBCOMMANDS

    known = _modules()
    for name, target in SUBCOMMANDS.items():
        module = target.partition(":")[0]
        assert module in known, f"agent {name}: {module} does not exist"
