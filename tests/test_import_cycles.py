"""Architecture: no import cycle among the first-party modules, counting every import in a file (a function's lazy
import too: a cycle hidden by one still ties the modules together)."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("model_core", "ui", "attention_explorer", "pages")
SCRIPTS = ("app.py",)


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def first_party_modules() -> dict[str, pathlib.Path]:
    """Module name -> file, for every first-party .py file (a package is its ``__init__``)."""
    paths = [p for package in PACKAGES for p in (ROOT / package).rglob("*.py")]
    paths += [ROOT / script for script in SCRIPTS]
    return {_module_name(p): p for p in paths}


def _resolve(name: str, modules: dict) -> str | None:
    """The module ``name`` names, or its longest first-party prefix (``import a.b.c`` where c is an attribute)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _base(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module of a ``from ... import``, relative levels resolved against ``module``."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    package = package[:len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def imports_of(module: str, path: pathlib.Path, modules: dict) -> set[str]:
    """Every first-party module ``module`` imports anywhere in its file; ``from pkg import name`` counts as an
    import of ``pkg.name`` when that is a module, else of ``pkg``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(_resolve(alias.name, modules) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _base(node, module, path.name == "__init__.py")
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in modules else _resolve(base, modules))
    found.discard(None)
    found.discard(module)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = first_party_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module, iteratively (no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
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
    return found


def a_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One shortest cycle through the component's first module, as a path that ends where it starts."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for child in sorted(graph[node] & members):
            if child == start:
                return paths[node] + [start]
            if child not in paths:
                paths[child] = paths[node] + [child]
                queue.append(child)
    raise AssertionError(f"{component} is not strongly connected")


def test_the_graph_sees_lazy_and_relative_imports(tmp_path):
    """The finder itself: a function's import counts, and ``from pkg import module`` is the submodule."""
    modules = {"a": None, "a.b": None, "a.c": None, "d": None}
    path = tmp_path / "x.py"
    path.write_text("import d\n"
                    "def f():\n    from a import b\n    from . import c\n    from a.b import something\n",
                    encoding="utf-8")
    assert imports_of("a.x", path, modules) == {"d", "a.b", "a.c"}
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert a_cycle(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]


def test_no_import_cycles_among_first_party_modules():
    graph = import_graph()
    assert {"model_core", "model_core.cli.main", "ui.loaders", "attention_explorer", "app"} <= set(graph)
    cycles = [" -> ".join(a_cycle(graph, component)) for component in strongly_connected(graph)]
    assert not cycles, "import cycles (lazy imports count; break each by moving what both need into a third " \
                       "module):\n" + "\n".join(cycles)
