"""The package's shape: no import circle, the wings and their arrows.

Imports are read from each module's source (ast), wherever they stand: an import
inside a function is how a circle hides (the engine imported lazily by
store/__init__.py, importing back from it), so it counts too. Only imports
under ``if TYPE_CHECKING:`` are left out: they never run.

The wings (README.md, "Layout"): web/ (the game-facing path), cli/ (the command), api/ (the
admin HTTP API), operations/ (the rules of every admin write, for both), serving/ (the gunicorn
integration), store/, webhooks/ (subscription URLs, delivery; the admin side may use it, it uses
the store and the core), deployment (rendering deploy/), and the core (settings, tokens, names,
errors, loglines, urls, times). Arrows run one way: the command and the API over the operations, the
operations over the store; the web path and serving never import the admin side; the store
imports no wing; the core imports no wing. The web path reaches no module of the store that writes.
"""

from __future__ import annotations

import ast
import pathlib
import re

from tests.support import ADMIN_WINGS, WRITER_MODULES

REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = REPO / "authsvc"


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _type_checking_only(tree: ast.Module, functions: bool = False) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:`` (and inside functions, if
    ``functions``)."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
        if functions and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skipped


def imports_of(
    name: str, path: pathlib.Path, modules: dict[str, pathlib.Path], on_import: bool = False
) -> set[str]:
    """The authsvc modules ``name`` imports: ``from a.b import c`` is a.b.c if that is a module,
    else a.b. ``on_import``: only those its import runs, not those inside its functions."""
    tree = ast.parse(path.read_text(), str(path))
    skipped = _type_checking_only(tree, functions=on_import)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in found if m in modules and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_among_authsvc_modules():
    modules = _modules()
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert graph["authsvc.cli.command"], "the import reader found nothing: it is broken"
    assert not _cycles(graph)


def test_the_circle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


CORE = {
    "authsvc",
    "authsvc.settings",
    "authsvc.tokens",
    "authsvc.names",
    "authsvc.errors",
    "authsvc.loglines",
    "authsvc.urls",
    "authsvc.times",
}
# Old paths kept (README.md, "Layout"): each imports its new path and nothing else.
ALIASES = {"authsvc.wsgi": "authsvc.web.wsgi"}
WINGS = ("web", "cli", "api", "operations", "serving", "store", "webhooks", "deployment")
ADMIN = ADMIN_WINGS  # the admin side
WRITERS = WRITER_MODULES
NEVER = {  # wing -> the wings it may not import
    "web": ADMIN | {"serving", "webhooks", "deployment"},
    "serving": ADMIN | {"webhooks", "deployment"},
    "store": ADMIN | {"web", "serving", "webhooks", "deployment"},
    "core": ADMIN | {"web", "serving", "webhooks", "deployment", "store"},
    "webhooks": ADMIN | {"web", "serving", "deployment"},
    "operations": {"cli", "api", "serving", "deployment"},
    "api": {"cli", "deployment"},
    "cli": set(),  # `authsvc setup` renders the package's nginx sites with deployment's renderer
    "deployment": ADMIN | {"web", "serving", "webhooks", "store"},
}


def wing(module: str) -> str:
    """A wing of WINGS, core, alias, or "" for a module on no wing."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in WINGS:
        return parts[1]
    return "core" if module in CORE else "alias" if module in ALIASES else ""


def wrong_way(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs against NEVER, and aliases that import more than their new
    path."""
    found = [
        (a, b) for a, targets in graph.items() for b in targets if wing(b) in NEVER.get(wing(a), ())
    ]
    found += [(a, b) for a, new in ALIASES.items() if a in graph for b in graph[a] if b != new]
    return sorted(found)


def reached_on_import(starts: set[str], modules: dict[str, pathlib.Path]) -> set[str]:
    """What importing ``starts`` and calling their functions can load: each module's imports, its
    functions' too, and the imports its parent packages run (not their functions: the web path calls
    no function of authsvc/store/__init__.py)."""
    seen: set[str] = set()  # imported, and its functions may be called
    ran: set[str] = set()  # a parent package: only its import runs
    todo = list(starts)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(imports_of(name, modules[name], modules))
        parts = name.split(".")
        for n in range(1, len(parts)):
            package = ".".join(parts[:n])
            if package in modules and package not in ran:
                ran.add(package)
                todo.extend(imports_of(package, modules[package], modules, on_import=True))
    return seen | ran


def test_every_module_stands_in_a_wing():
    modules = _modules()
    astray = sorted(name for name in modules if not wing(name))
    assert not astray, f"place these in a wing of WINGS or the core (README.md, layout): {astray}"


def test_the_arrows_run_one_way():
    modules = _modules()
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert graph["authsvc.web.app"] and graph["authsvc.serving.access_log"], (
        "the import reader found nothing"
    )
    assert not wrong_way(graph)


def test_times_are_shown_by_one_formatter():
    """A unix time becomes text in authsvc/times.py only: the API's, the command's and the webhooks'
    RFC 3339 stamps cannot drift apart (a second copy would round or pad its own way)."""
    calls = re.compile(r"\.(strftime|fromtimestamp|utcfromtimestamp|isoformat)\(")
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != PACKAGE / "times.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if calls.search(line)
    ]
    assert not found, "format times with authsvc.times.utc:\n" + "\n".join(found)


def test_the_web_path_reaches_no_store_that_writes_and_no_admin_module():
    modules = _modules()
    web = {name for name in modules if wing(name) == "web"} | {"authsvc.wsgi"}
    reached = reached_on_import(web, modules)
    assert not reached & WRITERS
    assert {"authsvc.store.sqlite.reader", "authsvc.store.postgres.reader"} <= reached, (
        "the import reader is broken"
    )
    assert not {name for name in reached if wing(name) in ADMIN}


def test_the_direction_rules_catch_a_wrong_arrow():
    assert wrong_way(
        {"authsvc.web.app": {"authsvc.operations.players"}, "authsvc.tokens": {"authsvc.errors"}}
    ) == [("authsvc.web.app", "authsvc.operations.players")]
    assert wrong_way({"authsvc.settings": {"authsvc.store.common"}}) == [
        ("authsvc.settings", "authsvc.store.common")
    ]
    assert wrong_way({"authsvc.operations.players": {"authsvc.api.problems"}}) == [
        ("authsvc.operations.players", "authsvc.api.problems")
    ]
    assert wrong_way({"authsvc.store.base": {"authsvc.serving.redact"}}) == [
        ("authsvc.store.base", "authsvc.serving.redact")
    ]
    assert wrong_way({"authsvc.wsgi": {"authsvc.web.wsgi", "authsvc.web.app"}}) == [
        ("authsvc.wsgi", "authsvc.web.app")
    ]


def _store_methods_that_open_a_write(source: str) -> list[str]:
    """The methods of the class Store in ``source`` that call ``self.write(``: a one-call write
    wrapper."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == "Store":
            for method in node.body:
                if isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "write"
                    and isinstance(call.func.value, ast.Name)
                    and call.func.value.id == "self"
                    for call in ast.walk(method)
                ):
                    found.append(method.name)
    return found


def test_the_store_has_one_way_to_write():
    """Every write goes through ``with store.write(audit) as tx`` and the transaction's methods
    (store/writes.py): the Store class wraps no write of its own, so there is one way to write."""
    assert _store_methods_that_open_a_write((PACKAGE / "store" / "base.py").read_text()) == []


def test_the_write_wrapper_finder_finds_a_wrapper():
    source = (
        "class Store:\n    def add_player(self, user_id, username, *, audit=None):\n        with "
        "self.write(audit) as tx:\n            return tx.add_player(user_id, username)\n    def "
        "get_player(self, user_id): ...\n"
    )
    assert _store_methods_that_open_a_write(source) == ["add_player"]


def test_the_console_script_names_the_command():
    """`authsvc` (the console script) runs authsvc/cli/command.py's main."""
    import tomllib

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["authsvc"] == "authsvc.cli.command:main"
