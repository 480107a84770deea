"""The import structure of streamapp/: no cycle, no function-level import that hides one,
user-facing errors in one place.

The layers themselves are import-linter contracts (``[tool.importlinter]`` in
pyproject.toml, run by ``make lint`` and scripts/test); these tests hold what a layers
contract cannot see: a cycle inside one layer, and imports moved into a function so
that the cycle they close goes unnoticed at import time.
"""

from __future__ import annotations

import ast
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import streamapp
from streamapp import errors

ROOT = Path(streamapp.__file__).parent

LAZY_STREAMAPP = {
    "streamapp.cli": (
        (
            *(
                "streamapp.worker",
                "streamapp.cli.reset",
                "streamapp.cli.retire",
                "streamapp.catchup.forwarder",
            ),
            *(
                "streamapp.web.forwarder",
                "streamapp.eventstore",
                "streamapp.verify.compare",
                "streamapp.verify.fold",
            ),
        ),
        "a command loads only the runner it uses (the command line starts fast); transports "
        "come through streamapp.transports.base's registry, which imports only the one picked",
    ),
    "streamapp.cli.reset": (
        ("streamapp.eventstore",),
        "the event store is opened only to hold its worker lock (STREAMAPP_BROKER=none)",
    ),
    "streamapp.eventstore": (
        ("streamapp.eventstore.postgres.store", "streamapp.eventstore.sqlite.store"),
        "open() loads only the backend its URL names (PostgreSQL needs the postgres extra)",
    ),
}
"""Where a function-level import of a streamapp module is allowed: importer (a module,
or a package and its modules) -> (modules it may import lazily, with theirs; why). Every
one is of an optional transport or backend, downwards; none may close a cycle (see
test_no_lazy_import_hides_a_cycle)."""

LAZY_THIRD_PARTY = {
    "rocksdict": "native and heavy: loaded when a store opens, not at `import streamapp`",
    "psycopg": "the postgres extra: checked when a PostgreSQL store opens",
    "aiohttp": "the web server: loaded by the commands that serve",
}
"""Third-party packages that may be imported inside a function, and why."""


@dataclass(frozen=True)
class Import:
    importer: str
    target: str
    line: int
    lazy: bool
    """Inside a function (runs on call, not at import)."""
    typing: bool = False
    """Under ``if TYPE_CHECKING:`` (read by type checkers only)."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(importer: str, path: Path, node: ast.ImportFrom) -> list[str]:
    if node.level == 0:
        base = node.module or ""
    else:
        package = importer.split(".") if path.name == "__init__.py" else importer.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, *([node.module] if node.module else [])])
    # ``from pkg import mod`` imports the module pkg.mod; ``from mod import name`` imports mod
    subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
    rest = len(subs) < len(node.names)
    return [*subs, *([base] if rest else [])]


def _imports() -> list[Import]:
    found: list[Import] = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))

        def visit(
            node: ast.AST, lazy: bool, typing: bool, name: str = name, path: Path = path
        ) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.Import):
                    found.extend(
                        Import(name, a.name, child.lineno, lazy, typing) for a in child.names
                    )
                elif isinstance(child, ast.ImportFrom):
                    targets = _resolve(name, path, child)
                    found.extend(Import(name, t, child.lineno, lazy, typing) for t in targets)
                inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
                checking = isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)
                visit(child, inner, typing or checking)

        visit(tree, False, False)
    return found


IMPORTS = _imports()


def _internal(target: str) -> bool:
    return target == "streamapp" or target.startswith("streamapp.")


def _package(module: str) -> str:
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def _graph(*, lazy: bool) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for imp in IMPORTS:
        if not _internal(imp.target) or imp.target == imp.importer:
            continue
        if lazy or not imp.lazy:  # TYPE_CHECKING imports count: no cycle even for types
            graph[imp.importer].add(imp.target)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (a list of modules, first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := walk(nxt)) is not None:
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := walk(node)) is not None:
            return found
    return None


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node == goal:
            return True
        if node not in seen:
            seen.add(node)
            todo.extend(graph.get(node, ()))
    return False


def test_the_module_graph_has_no_cycle() -> None:
    """Module-level imports of streamapp/ form no cycle, TYPE_CHECKING ones included (a
    helper types the task it serves against a protocol: engine.task_surface)."""
    cycle = _cycle(_graph(lazy=False))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_no_lazy_import_hides_a_cycle() -> None:
    """A function-level import of a streamapp module never imports back its importer:
    moved to the top of the file it would still import cleanly."""
    graph = _graph(lazy=True)
    hidden = [
        f"{i.importer}:{i.line} imports {i.target} in a function, and {i.target} imports "
        f"{i.importer} back"
        for i in IMPORTS
        if i.lazy and _internal(i.target) and _reaches(graph, i.target, i.importer)
    ]
    assert not hidden, "\n".join(hidden)


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_lazy_imports_are_documented() -> None:
    """Function-level imports are of optional transports or heavy packages only, each
    listed above with why; everything else is imported at the top of its module."""
    stdlib = sys.stdlib_module_names
    undocumented = []
    for i in IMPORTS:
        if not i.lazy:
            continue
        if _internal(i.target):
            allowed = next(
                (a for m, (a, _why) in LAZY_STREAMAPP.items() if _within(i.importer, m)), ()
            )
            if any(_within(i.target, a) for a in allowed):
                continue
        elif i.target.split(".")[0] in LAZY_THIRD_PARTY or i.target.split(".")[0] in stdlib:
            continue
        undocumented.append(f"{MODULES[i.importer]}:{i.line}: import {i.target}")
    assert not undocumented, (
        "function-level imports not allowed (move them to the top of the module, or "
        "document one in LAZY_STREAMAPP / LAZY_THIRD_PARTY with why):\n" + "\n".join(undocumented)
    )


def test_the_checks_see_a_lazy_import_that_closes_a_cycle() -> None:
    """The walk finds a function-level import and a cycle through it (this test's own
    sample: what outputs.py did with streamapp.app before the topics leaf)."""
    graph = {"a": {"b"}, "b": set()}
    graph["b"].add("a")  # b's import of a inside a function
    assert _cycle(graph) == ["a", "b", "a"]
    assert _reaches(graph, "a", "b")
    assert any(i.lazy for i in IMPORTS), "the walk sees no function-level import at all"


USER_ERRORS_ELSEWHERE = {
    "streamapp.testing.broker.StuckRecordsError": "the memory broker's test report: it "
    "carries the broker's StuckRecord values; importable from streamapp.memory",
}


def _error_classes() -> list[str]:
    found = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ClassDef)
                and not node.name.startswith("_")
                and any(
                    ast.unparse(b).split(".")[-1].endswith(("Error", "Exception", "Refuse"))
                    for b in node.bases
                )
            ):
                found.append(f"{name}.{node.name}")
    return found


def test_errors_live_in_errors_py() -> None:
    """Every public exception class of streamapp/ is defined in streamapp/errors.py
    (private ones, ``_Answer``-like control flow inside one module, stay there)."""
    elsewhere = [
        e
        for e in _error_classes()
        if not e.startswith("streamapp.errors.") and e not in USER_ERRORS_ELSEWHERE
    ]
    assert not elsewhere, f"define these in streamapp/errors.py: {elsewhere}"


@pytest.mark.parametrize(
    "name",
    sorted(
        n
        for n, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, Exception) and obj.__module__ == errors.__name__
    ),
)
def test_every_error_is_importable_from_streamapp(name: str) -> None:
    assert getattr(streamapp, name, None) is getattr(errors, name)
    assert name in streamapp.__all__


def test_one_name_per_class() -> None:
    """No two public classes of streamapp/ share a name (two ``Message`` classes with
    different fields were once read as one): a reader finds a name in one place."""
    where: dict[str, list[str]] = {}
    for name, path in MODULES.items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where.setdefault(node.name, []).append(name)
    twice = {cls: mods for cls, mods in where.items() if len(mods) > 1}
    assert not twice, f"classes defined in more than one module (rename one): {twice}"
