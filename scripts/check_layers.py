"""The import-layer contract of fusee, checked by `make lint` and tests/test_layers.py.

Every module of the package has a rank (`RANKS`, lowest first); a module may
import only modules of its own rank or below, and the imports that run (at
module level or inside functions: lazy imports count) form no cycle.
Imports under ``if TYPE_CHECKING:`` are annotations only: they obey the
ranks but may close a cycle.

Two rules more, TYPE_CHECKING imports included:

- the engine's facade (``fusee.engine._engine``) is imported by the engine
  package alone (its parts get what they need passed in, never the whole
  Engine); the parts that still hold it are listed in `ENGINE_HOLDERS`, a
  list that only shrinks (an entry that no longer imports it is reported);
- the processes without workflow code (``fusee.client``, ``fusee.cli``,
  ``fusee.ui``) import the engine's public names (``fusee.engine``) and
  ``fusee.remote``, never a private module of the engine.

Inside the engine, its modules sit in ranked rooms (`ROOMS`, lowest
first): an engine module imports only engine modules of its own room or
below, TYPE_CHECKING imports included (the facade, ``_engine``, is left to
the rule above), and a new engine module must be given a room.

And one rule on the engine's run state: a field of ``RunState``
(``fusee.engine._state``) is assigned in that module only; the other parts
call its methods (``add_signal``, ``end``, ...), which keep its invariants.

Run: ``python scripts/check_layers.py [PACKAGE_DIR]`` (exit 1 on a violation).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

# Lowest first. A package's rank covers its submodules unless one is listed.
RANKS: Mapping[str, int] = {
    "fusee.errors": 0,
    "fusee._status": 0,
    "fusee._version": 0,
    "fusee._durations": 0,
    "fusee._codegen": 0,
    "fusee._codec": 1,
    "fusee.record": 1,
    "fusee.codecs": 1,
    "fusee.blobs": 1,
    "fusee.machine": 2,
    "fusee._loop": 3,
    "fusee._combinators": 3,
    "fusee._definitions": 4,
    "fusee._runtime": 5,
    "fusee._stepfn": 5,
    "fusee._jsonview": 5,
    "fusee._events": 5,
    "fusee._schedule": 5,
    "fusee.context": 6,
    "fusee._logger": 6,
    "fusee._driver": 7,
    "fusee.store": 8,
    "fusee._payloads": 8,
    "fusee._queue": 8,
    # What a process without workflow code needs: runs reached through the store.
    "fusee.remote": 9,
    "fusee.engine": 10,
    "fusee.client": 11,
    "fusee.testing": 12,
    "fusee.pytest_plugin": 12,
    "fusee.ui": 13,
    "fusee.cli": 14,
    "fusee": 15,
    "fusee.__main__": 15,
    # Integrations with other libraries, each behind an extra: they use
    # fusee's public names (the facade) like any application does.
    "fusee.contrib": 16,
}


# The engine's parts that still take the whole Engine (under TYPE_CHECKING):
# none. Each gets keyword-only arguments, callables or a small Protocol
# (issue 32); the list stays for a part on its way there, and only shrinks.
ENGINE_HOLDERS: frozenset[str] = frozenset()
# The rooms inside fusee.engine (issue 32), lowest first. A room's modules
# import only its own and lower rooms' (TYPE_CHECKING imports too), so that
# the parts do not reach each other through a cycle no import shows.
ROOMS: Mapping[str, int] = {
    # 1. a loaded run's state, the clock, and what every part names: a
    # shard's alarms (`_state.Alarms`) hold the timers' `Alarm`s, so the
    # timers sit here with the state; the run handles and their info; what
    # a continue-as-new carries; spans and metrics; the test host's hooks.
    "fusee.engine._state": 1,
    "fusee.engine._clock": 1,
    "fusee.engine._timers": 1,
    "fusee.engine._run": 1,
    "fusee.engine._carry": 1,
    "fusee.engine._telemetry": 1,
    "fusee.engine._hooks": 1,
    # 2. group commit, streams, events, run deadlines, reports of slow steps
    # and of code that does not yield.
    "fusee.engine._commit": 2,
    "fusee.engine._streams": 2,
    "fusee.engine._events": 2,
    "fusee.engine._deadlines": 2,
    "fusee.engine._slowsteps": 2,
    "fusee.engine._watchdog": 2,
    # 3. the run table: loading, parking, waking; which shards' runs this
    # engine serves (the leases: local operations ask whether a refused
    # write goes on through the store).
    "fusee.engine._runs": 3,
    "fusee.engine._leases": 3,
    # 4. steps and the host the drivers call.
    "fusee.engine._steps": 4,
    "fusee.engine._host": 4,
    # 5. local operations on runs.
    "fusee.engine._messages": 5,
    "fusee.engine._queues": 5,
    "fusee.engine._schedules": 5,
    "fusee.engine._fork": 5,
    "fusee.engine._retention": 5,
    # 6. the router (the one place that chooses here or through the store)
    # and the inbox, which applies what other processes post.
    "fusee.engine._router": 6,
    "fusee.engine._inbox": 6,
    # 7. the composition root and public facade, and the API shapes it shares.
    "fusee.engine._engine": 7,
    "fusee.engine._starts": 7,
    "fusee.engine._bulk": 7,
}
# Processes without workflow code: public names and fusee.remote only.
_OUTSIDE: tuple[str, ...] = ("client", "cli", "ui")


@dataclass(frozen=True, slots=True)
class Edge:
    """One import: ``source`` imports ``target`` at ``line``."""

    source: str
    target: str
    line: int
    typing_only: bool


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def rank_of(module: str) -> int | None:
    """The rank of ``module``: its own, or its nearest listed package's.

    The top package's rank is its own only: a new module directly under it
    must be given a rank.
    """
    if module in RANKS:
        return RANKS[module]
    name = module.rpartition(".")[0]
    while "." in name:
        if name in RANKS:
            return RANKS[name]
        name = name.rpartition(".")[0]
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def edges_of(module: str, source: str, modules: set[str], package: str) -> list[Edge]:
    """The imports of package modules in ``source``."""
    out: list[Edge] = []

    def visit(node: ast.AST, typing_only: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, typing_only)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == package:
                    out.append(Edge(module, alias.name, node.lineno, typing_only))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == package:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    target = sub if sub in modules else node.module
                    out.append(Edge(module, target, node.lineno, typing_only))
        for child in ast.iter_child_nodes(node):
            visit(child, typing_only)

    visit(ast.parse(source), False)
    return out


def state_fields(source: str) -> frozenset[str]:
    """The fields ``class RunState`` declares (annotated names) in ``source``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == "RunState":
            return frozenset(
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            )
    return frozenset()


def field_writes(source: str, fields: frozenset[str]) -> list[tuple[int, str]]:
    """Assignments ``name.field = ...`` (``+=``, tuple targets too) to one of ``fields``.

    An assignment through ``self`` is the object's own (another class's
    field of the same name), not a run state's.
    """
    found: list[tuple[int, str]] = []

    def check(target: ast.expr, line: int) -> None:
        if isinstance(target, ast.Tuple | ast.List):
            for elt in target.elts:
                check(elt, line)
        elif (
            isinstance(target, ast.Attribute)
            and target.attr in fields
            and isinstance(target.value, ast.Name)
            and target.value.id not in ("self", "cls")
        ):
            found.append((line, ast.unparse(target)))

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                check(target, node.lineno)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            check(node.target, node.lineno)
    return found


def violations(root: Path) -> list[str]:
    """What breaks the contract in the package at ``root``, one line each."""
    paths = {module_name(root, p): p for p in sorted(root.rglob("*.py"))}
    modules = set(paths)
    problems: list[str] = []
    graph: dict[str, set[str]] = {m: set() for m in modules}
    package = root.name
    facade = f"{package}.engine._engine"
    outside = tuple(f"{package}.{name}" for name in _OUTSIDE)
    holders: set[str] = set()
    engine_part = f"{package}.engine._"
    for module in sorted(modules):
        if module.startswith(engine_part) and module not in ROOMS:
            problems.append(
                f"{module}: no room; add it to ROOMS in scripts/check_layers.py "
                "(the lowest room whose modules it needs)"
            )
    state_module = f"{package}.engine._state"
    fields = state_fields(paths[state_module].read_text()) if state_module in paths else frozenset()
    for module, path in paths.items():
        if fields and module.startswith(f"{package}.engine.") and module != state_module:
            for line, target in field_writes(path.read_text(), fields):
                problems.append(
                    f"{path}:{line}: {module} assigns {target}, a field of RunState: "
                    "call a method of RunState (fusee/engine/_state.py) that keeps its invariants"
                )
        own = rank_of(module)
        if own is None:
            problems.append(f"{module}: no rank; add it to RANKS in scripts/check_layers.py")
            continue
        for e in edges_of(module, path.read_text(), modules, package):
            if e.target == module:
                continue
            if e.target == facade and module != f"{package}.engine":
                holders.add(module)
                if module not in ENGINE_HOLDERS:
                    problems.append(
                        f"{path}:{e.line}: {module} imports {facade}: only the engine package "
                        "imports the facade (TYPE_CHECKING too); pass the part what it needs "
                        "(keyword-only arguments, a callable, a small Protocol)"
                    )
            if (
                any(module == o or module.startswith(o + ".") for o in outside)
                and e.target.startswith(f"{package}.engine.")
                and e.target.rpartition(".")[2].startswith("_")
            ):
                problems.append(
                    f"{path}:{e.line}: {module} imports {e.target}: a process without "
                    f"workflow code imports {package}.engine's public names and "
                    f"{package}.remote only"
                )
            if (
                module.startswith(engine_part)
                and e.target.startswith(engine_part)
                and e.target != facade
            ):
                problems.extend(_room_problem(path, e))
            theirs = rank_of(e.target)
            if theirs is not None and theirs > own:
                problems.append(
                    f"{path}:{e.line}: {module} (rank {own}) imports {e.target} "
                    f"(rank {theirs}): imports go down the layers only"
                )
            if not e.typing_only and e.target in graph:
                graph[module].add(e.target)
    for stale in sorted((ENGINE_HOLDERS & modules) - holders):
        problems.append(
            f"{stale} no longer imports {facade}: remove it from ENGINE_HOLDERS "
            "in scripts/check_layers.py"
        )
    problems.extend(_cycles(graph))
    return problems


def _room_problem(path: Path, e: Edge) -> list[str]:
    mine, theirs = ROOMS.get(e.source), ROOMS.get(e.target)
    if mine is None or theirs is None or theirs <= mine:
        return []
    return [
        f"{path}:{e.line}: {e.source} (room {mine}) imports {e.target} (room {theirs}): "
        "an engine module imports its own room's and lower rooms' only; pass it what it "
        "needs from above (a keyword-only argument, a callable, a small Protocol)"
    ]


def _cycles(graph: Mapping[str, Iterable[str]]) -> list[str]:
    found: list[str] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def walk(m: str) -> None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if n not in graph:
                continue
            if state.get(n) == 1:
                cycle = [*path[path.index(n) :], n]
                found.append("import cycle: " + " -> ".join(cycle))
            elif n not in state:
                walk(n)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            walk(m)
    return found


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent / "fusee"
    problems = violations(root)
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
