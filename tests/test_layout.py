"""The package's architecture rules, checked by reading the source with ``ast`` (nothing under ``asyncrl`` is imported).

Every import counts: module level, inside functions (lazy imports) and inside ``if`` blocks. ``from asyncrl.pkg import
name`` is an edge to the submodule ``asyncrl.pkg.name`` when that file exists, else to the package's ``__init__``. The
parent packages that Python initialises on the way to a submodule are edges only from outside them: by the time a
submodule runs, its own parents are already in ``sys.modules``, so a package ``__init__`` that imports its submodules,
which import their siblings, is fine; but ``asyncrl.weights.x`` importing ``asyncrl.rollout.gate`` runs
``asyncrl/rollout/__init__.py`` first, and whatever that imports. An explicit import of the package itself from inside
it is an edge, because it does cycle: the ``__init__`` is still half-run when its eagerly imported submodule asks it
for a name.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIR = ROOT / "asyncrl"
LAB_DIR = ROOT / "lab" / "asyncrl_lab"  # the benches and demos: a distribution beside asyncrl, in the house's count
MAX_LINES = 400
MAX_FLOORS = 7
# The rooms that implement roles, and what they must never know: the algorithm or the schedule a run uses. A worker
# gets its role's spec (asyncrl.config.specs); the trainer fits whatever Objective a batch carries.
WORKER_ROOMS = ("asyncrl.trainer", "asyncrl.workers", "asyncrl.rollout", "asyncrl.weights", "asyncrl.roles")
ALGORITHM_AND_SCHEDULE_NAMES = ("grpo", "ppo", "dpo", "distill", "sync", "one_step_off", "two_step_off", "fully_async")


def module_name(path: Path) -> str:
    top = PACKAGE_DIR if path.is_relative_to(PACKAGE_DIR) else LAB_DIR
    parts = path.relative_to(top.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules(lab: bool = False) -> dict[str, Path]:
    """Every module of the package by dotted name (a package is named by its ``__init__``); ``lab``: the lab's too."""
    paths = sorted(PACKAGE_DIR.rglob("*.py")) + (sorted(LAB_DIR.rglob("*.py")) if lab else [])
    return {module_name(p): p for p in paths}


def imports_of(source: str, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The absolute names ``module`` imports, anywhere in its source."""
    targets: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: climb from this module's package
                package = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return targets


def all_imports(lab: bool = False) -> dict[str, set[str]]:
    """Each module of the package (``lab``: and of the lab) and the absolute names it imports (stdlib and
    third-party names included)."""
    modules = package_modules(lab)
    known = set(modules)
    return {
        name: imports_of(path.read_text(encoding="utf-8"), name, path.name == "__init__.py", known)
        for name, path in modules.items()
    }


def import_graph(lab: bool = False) -> dict[str, set[str]]:
    """Edges between modules of the package (``lab``: and the lab) only (a module naming itself is not an edge), with
    the parent packages an import initialises when the importer is outside them."""
    imports = all_imports(lab)
    graph: dict[str, set[str]] = {}
    for name, targets in imports.items():
        edges = set()
        for t in targets:
            parts = t.split(".")
            for k in range(2, len(parts)):  # asyncrl.a for asyncrl.a.b (the root package runs first for everyone)
                parent = ".".join(parts[:k])
                if parent in imports and not is_under(name, parent):
                    edges.add(parent)
            edges.add(t)
        graph[name] = {t for t in edges if t in imports and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle as ``[a, b, ..., a]``, or None; depth-first in sorted order, so the same graph gives the same cycle."""
    on_path: list[str] = []
    done: set[str] = set()

    def visit(node: str) -> list[str] | None:
        on_path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt in on_path:
                return on_path[on_path.index(nxt) :] + [nxt]
            if nxt not in done and (cycle := visit(nxt)):
                return cycle
        on_path.pop()
        done.add(node)
        return None

    for node in sorted(graph):
        if node not in done and (cycle := visit(node)):
            return cycle
    return None


def is_under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


# ---- the checker itself ------------------------------------------------------------------------------------------
def test_find_cycle_reports_a_cycle_and_accepts_a_dag():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"x": {"y"}, "y": {"x"}}) == ["x", "y", "x"]
    diamond = {"top": {"left", "right"}, "left": {"bottom"}, "right": {"bottom"}, "bottom": set()}
    assert find_cycle(diamond) is None


def test_imports_of_sees_lazy_relative_and_submodule_imports():
    known = {"asyncrl.p", "asyncrl.p.a", "asyncrl.p.b", "asyncrl.q"}
    source = "import json\nfrom . import b, helper\nfrom ..q import f\ndef g():\n    import asyncrl.q\n"
    got = imports_of(source, "asyncrl.p.a", is_package=False, known=known)
    assert got == {"json", "asyncrl.p.b", "asyncrl.p", "asyncrl.q"}
    assert imports_of("from .a import x\n", "asyncrl.p", is_package=True, known=known) == {"asyncrl.p.a"}


def room_of(module: str) -> str:
    """A module's room: its top-level package under asyncrl (``asyncrl.trainer``), or itself (``asyncrl.cli``); the
    lab is one room (``asyncrl_lab``)."""
    if is_under(module, "asyncrl_lab"):
        return "asyncrl_lab"
    return ".".join(module.split(".")[:2])


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each room's floor: 1 for a room that imports no other room, else one above the highest room it imports."""
    edges: dict[str, set[str]] = {}
    for name, targets in graph.items():
        if name in ("asyncrl", "asyncrl_lab"):
            continue
        edges.setdefault(room_of(name), set()).update(
            room_of(t) for t in targets if t not in ("asyncrl", "asyncrl_lab")
        )
    out: dict[str, int] = {}

    def floor(room: str) -> int:
        if room not in out:
            out[room] = 0  # on the path (the graph has no circle: test_no_import_circle_in_the_package)
            out[room] = 1 + max((floor(r) for r in edges.get(room, ()) if r != room), default=0)
        return out[room]

    for room in edges:
        floor(room)
    return out


def test_floors_are_counted_by_the_longest_chain_of_rooms():
    graph = {"asyncrl.a.x": {"asyncrl.b.y"}, "asyncrl.b.y": {"asyncrl.c"}, "asyncrl.c": set(), "asyncrl.a.z": set()}
    assert floors(graph) == {"asyncrl.a": 3, "asyncrl.b": 2, "asyncrl.c": 1}


# ---- the rules ---------------------------------------------------------------------------------------------------
def test_the_house_has_at_most_seven_floors_with_the_command_line_and_the_lab_on_top():
    """The package and the lab together: the command line and the lab (its benches and demos, on the same public
    entry points a user has) are the top floor, side by side; nothing else is."""
    got = floors(import_graph(lab=True))
    top = max(got.values())
    by_floor = "\n".join(f"{f}: {', '.join(sorted(r for r, k in got.items() if k == f))}" for f in range(top, 0, -1))
    assert top <= MAX_FLOORS, f"{top} floors (at most {MAX_FLOORS}):\n{by_floor}"
    assert sorted(r for r, k in got.items() if k == top) == ["asyncrl.cli", "asyncrl_lab"], by_floor


def test_workers_never_import_or_name_an_algorithm_or_a_schedule():
    """A worker gets its role's spec, not the config: it never imports asyncrl.algorithms or asyncrl.schedules,
    reads cfg.algorithm / trainer.schedule, or compares with an algorithm's or a schedule's name."""
    bad = []
    modules = package_modules()
    for name, targets in sorted(all_imports().items()):
        if not any(is_under(name, room) for room in WORKER_ROOMS):
            continue
        bad += [f"{name} imports {t}" for t in sorted(targets) if is_under(t, "asyncrl.algorithms")]
        bad += [f"{name} imports {t}" for t in sorted(targets) if is_under(t, "asyncrl.schedules")]
        tree = ast.parse(modules[name].read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("algorithm", "schedule"):
                bad.append(f"{name}:{node.lineno} reads .{node.attr}")
            if isinstance(node, ast.Compare):
                for const in [c for c in ast.walk(node) if isinstance(c, ast.Constant)]:
                    if const.value in ALGORITHM_AND_SCHEDULE_NAMES:
                        bad.append(f"{name}:{node.lineno} compares with {const.value!r}")
    assert not bad, "workers know neither the algorithm nor the schedule:\n" + "\n".join(bad)


def test_no_import_circle_in_the_package_or_the_lab():
    cycle = find_cycle(import_graph(lab=True))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_package_imports_nothing_from_the_lab():
    """The lab sits beside asyncrl (its own distribution; its commands join the CLI through entry points): no
    module of asyncrl, the command line included, imports it (lazily either)."""
    bad = [
        f"{name} imports {target}"
        for name, targets in sorted(all_imports().items())
        for target in sorted(targets)
        if is_under(target, "asyncrl_lab")
    ]
    assert not bad, "asyncrl must not depend on its lab:\n" + "\n".join(bad)


def test_rewards_do_not_import_workers():
    bad = [
        f"{name} imports {target}"
        for name, targets in sorted(all_imports().items())
        if is_under(name, "asyncrl.rewards")
        for target in sorted(targets)
        if is_under(target, "asyncrl.workers")
    ]
    assert not bad, "\n".join(bad)


def test_losses_import_only_torch():
    def allowed(target: str) -> bool:
        top = target.split(".")[0]
        return top in sys.stdlib_module_names or top == "torch" or is_under(target, "asyncrl.losses")

    bad = [
        f"{name} imports {target}"
        for name, targets in sorted(all_imports().items())
        if is_under(name, "asyncrl.losses")
        for target in sorted(targets)
        if not allowed(target)
    ]
    assert not bad, "asyncrl.losses may import only the standard library and torch:\n" + "\n".join(bad)


def test_no_source_file_over_400_lines_in_the_package_or_the_lab():
    counts = {p: len(p.read_text(encoding="utf-8").splitlines()) for p in package_modules(lab=True).values()}
    over = [f"{p.relative_to(ROOT)}: {n}" for p, n in counts.items() if n > MAX_LINES]
    assert not over, f"files over {MAX_LINES} lines (split them by responsibility):\n" + "\n".join(over)


def test_the_formatter_formats_every_line():
    """No ``# fmt: skip``: a line the formatter may not touch is a line laid out by hand, and the next hand lays it out
    differently."""
    skipped = [
        f"{p.relative_to(ROOT)}:{k}"
        for p in package_modules(lab=True).values()
        for k, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if "fmt: skip" in line or "fmt: off" in line
    ]
    assert not skipped, "lines the formatter skips:\n" + "\n".join(skipped)


def test_the_wheel_ships_the_package_alone_and_the_lab_commands_join_by_entry_points():
    """asyncrl's wheel holds asyncrl only (the packages its pyproject selects); the lab is its own distribution,
    whose ``asyncrl.commands`` entry points are the bench and demo commands the command line offers."""
    import tomllib
    from importlib.metadata import entry_points

    from setuptools import find_namespace_packages

    from asyncrl.cli import build_parser

    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    shipped = find_namespace_packages(str(ROOT), include=conf["include"])
    assert "asyncrl" in shipped and not [p for p in shipped if not is_under(p, "asyncrl")], shipped
    lab = tomllib.loads((ROOT / "lab" / "pyproject.toml").read_text())["project"]["entry-points"]["asyncrl.commands"]
    assert {ep.name: ep.value for ep in entry_points(group="asyncrl.commands")} == lab  # installed as declared
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(lab) <= set(sub.choices)


def _ends(block: list[ast.stmt], raising: bool = True) -> bool:
    """Whether control never goes past ``block``'s end: it holds a statement that always returns, raises (when
    ``raising``: a ``with`` may swallow an exception, never a return), continues or breaks."""
    return any(_always_leaves(s, raising) for s in block)


def _always_leaves(s: ast.stmt, raising: bool) -> bool:
    if isinstance(s, (ast.Return, ast.Continue, ast.Break)):
        return True
    if isinstance(s, ast.Raise):
        return raising
    if isinstance(s, (ast.With, ast.AsyncWith)):
        return _ends(s.body, raising=False)
    if isinstance(s, ast.If):
        return _ends(s.body, raising) and _ends(s.orelse, raising)
    if isinstance(s, ast.Try):
        handled = all(_ends(h.body, raising) for h in s.handlers)
        return _ends(s.finalbody, raising) or ((_ends(s.body, raising) or _ends(s.orelse, raising)) and handled)
    if isinstance(s, ast.While):  # ``while True`` with no ``break`` of its own
        loops = (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        own = [n for n in _walk_skipping(s.body, loops) if isinstance(n, ast.Break)]
        return isinstance(s.test, ast.Constant) and s.test.value is True and not own
    return False


def _walk_skipping(block: list[ast.stmt], skip: tuple[type, ...]) -> list[ast.AST]:
    """Every node under ``block``, not descending into nodes of the ``skip`` types (their own loops, functions)."""
    out: list[ast.AST] = []
    todo: list[ast.AST] = list(block)
    while todo:
        node = todo.pop()
        out.append(node)
        if not isinstance(node, skip):
            todo.extend(ast.iter_child_nodes(node))
    return out


def unreachable_statements(source: str) -> list[int]:
    """The lines of statements that follow, in the same block, one after which control never goes on: a ``return``,
    ``raise``, ``continue`` or ``break``, or an ``if``, ``try`` or ``with`` that always ends in one (a ``yield`` left
    after a ``return`` to make a function a generator is code that never runs)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if not isinstance(block, list):
                continue
            for before, after in zip(block, block[1:]):
                if _always_leaves(before, raising=True):
                    lines.append(after.lineno)
                    break
    return sorted(lines)


def test_the_unreachable_check_finds_the_statements_after_a_block_that_always_leaves():
    source = (
        "def f(x):\n    return x\n    yield\n"
        "def g():\n    for i in range(3):\n        if i:\n            continue\n            print(i)\n"
        "        else:\n            break\n        raise ValueError\n"
        "def h():\n    try:\n        pass\n    finally:\n        raise ValueError\n        x = 1\n"
        "def w(t):\n    with t:\n        return 1\n    yield\n"
        "def t():\n    try:\n        return 1\n    except KeyError:\n        raise\n    x = 2\n"
        "def fine(x, t):\n    if x:\n        return 1\n    with t:\n        raise KeyError\n"
        "    try:\n        return 2\n    except KeyError:\n        pass\n"
        "    while True:\n        break\n    return 3\n"
    )
    assert unreachable_statements(source) == [3, 8, 11, 17, 21, 27]


def test_no_unreachable_statement_in_the_package_or_the_lab():
    found = [
        f"{p.relative_to(ROOT)}:{line}"
        for p in package_modules(lab=True).values()
        for line in unreachable_statements(p.read_text(encoding="utf-8"))
    ]
    assert not found, "statements that never run:\n" + "\n".join(found)


# The modules that hold the typed clients: the only ones that name a worker's method by string.
CLIENT_MODULES = ("asyncrl.roles.clients", "asyncrl.weights.clients", "asyncrl.schedules.fully_async.client")


def string_calls(source: str) -> list[tuple[int, str]]:
    """``(line, method)`` of every ``x.call("method", ...)``: a worker's method named by string."""
    return [
        (node.lineno, node.args[0].value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "call"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ]


def test_no_role_method_called_by_string_outside_the_client_modules():
    """Every call of a worker's method goes through a typed client (``asyncrl.roles.clients`` and the other client
    modules): its arguments and what it returns are typed once, where the method is named."""
    assert string_calls("h.call('version')\nreward_fn.call(*args)\nh.call(method, 1)\n") == [(1, "version")]
    found = [
        f"{path.relative_to(ROOT)}:{line} calls {method!r}"
        for name, path in package_modules(lab=True).items()
        if name not in CLIENT_MODULES
        for line, method in string_calls(path.read_text(encoding="utf-8"))
    ]
    assert not found, "role methods called by string outside the client modules:\n" + "\n".join(found)
