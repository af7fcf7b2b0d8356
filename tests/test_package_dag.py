"""Architecture: ``model_core``'s packages form a DAG in the declared order (STYLE.md, "Layout of model_core"), and
an import inside a function says why it is there.

Every import of every module counts, a function's lazy one too: a cycle hidden inside a function still ties the
packages together. A package may import from a lower level or from its own level, never from a higher one; the
packages of one level may import each other, without a cycle (corpus reads analysis; roles reads corpus).
"""

from __future__ import annotations

import ast
import io
import pathlib
import re
import tokenize
from collections import defaultdict

from test_import_cycles import _base  # the one reading of a relative import

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "model_core"

LEVELS: tuple[tuple[str, ...], ...] = (
    ("settings", "words", "lazy", "kernel", "gate"),  # what everything shares: settings, the score kernel, the gate
    ("chapter3",),  # the from-scratch encoder: torch alone
    ("families",),  # one adapter a family; the custom one runs chapter3's encoder; text to tokens
    ("models",),  # loading picks a family's adapter; the custom encoder built with BERT's weights
    ("trace",),  # the request, its model resolved once, the one forward route, the trace
    ("compact", "io"),  # long inputs' compact trace; the one NPZ/JSON and CSV writer (it reads a trace alone)
    ("walk", "analysis", "effects", "generate", "roles", "corpus", "qk", "circuits"),  # the passes and analyses
    ("atlas",),  # the head atlas: a corpus scan with every analysis of a head beside it
    ("cli", "__init__", "__main__"),  # the command line, the public names
)
"""Bottom to top. A root module is its own "package" (``model_core/gate.py`` is ``gate``).

``io`` sits below the analyses, not beside ``cli`` at the top: it imports nothing above ``trace``, and an analysis
result that writes its own CSV (a circuit's edges) takes the one writer from it."""

LEVEL = {package: depth for depth, names in enumerate(LEVELS) for package in names}
MIN_WHY_WORDS = 3
"""A lazy import's comment says why in at least this many words (``# noqa`` alone says nothing)."""


def package_of(module: str) -> str:
    """``model_core.trace.forward`` -> ``trace``; ``model_core.gate`` -> ``gate``; ``model_core`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The first-party modules an import statement reaches (``from model_core import gate`` reaches the gate;
    ``from model_core import build_trace`` the package's ``__init__``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name.split(".")[0] == "model_core"]
    base = _base(node, module, is_package)
    if base.split(".")[0] != "model_core":
        return []
    if base != "model_core":
        return [base]
    return [f"model_core.{alias.name}" if _is_part(alias.name) else "model_core" for alias in node.names]


def _is_part(name: str) -> bool:
    return (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").is_file()


class _Imports(ast.NodeVisitor):
    """Every import statement of a module and whether it sits inside a function."""

    def __init__(self) -> None:
        self.found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []
        self._depth = 0

    def _function(self, node: ast.AST) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def _import(self, node: ast.Import | ast.ImportFrom) -> None:
        self.found.append((node, self._depth > 0))

    visit_Import = visit_ImportFrom = _import


def imports_in(path: pathlib.Path) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    visitor = _Imports()
    visitor.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return visitor.found


def comments_by_line(source: str) -> dict[int, str]:
    """Line number -> the text of the comment on it."""
    found = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found[token.start[0]] = token.string.lstrip("#").strip()
    return found


_PRAGMA = re.compile(r"noqa(:\s*[A-Z]+[0-9]+(\s*,\s*[A-Z]+[0-9]+)*)?|type:\s*ignore(\[[^]]*\])?")


def _says_why(comment: str | None) -> bool:
    """Whether a comment says something beyond a linter's pragma."""
    words = re.findall(r"[A-Za-z]{2,}", _PRAGMA.sub(" ", comment or ""))
    return len(words) >= MIN_WHY_WORDS


def unexplained_lazy_imports(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """``file:line`` of each import inside a function with no comment naming why, on its own lines or on the
    comment line just above it (one comment may head a block of consecutive lazy imports)."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    comments = comments_by_line(source)
    lazy = [node for node, in_function in imports_in(path) if in_function]
    import_lines = {line for node in lazy for line in range(node.lineno, node.end_lineno + 1)}
    bad = []
    for node in lazy:
        if any(_says_why(comments.get(line)) for line in range(node.lineno, node.end_lineno + 1)):
            continue
        above = node.lineno - 1
        while above in import_lines:  # the block of lazy imports this one belongs to
            above -= 1
        if above >= 1 and lines[above - 1].lstrip().startswith("#") and _says_why(comments.get(above)):
            continue
        bad.append(f"{path.relative_to(root)}:{node.lineno}")
    return bad


def package_graph() -> dict[str, dict[str, list[str]]]:
    """Package -> imported package -> the ``file:line`` of each import that makes the edge."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        source = package_of(module) if path.parent != PACKAGE else path.stem
        graph[source]  # every package is a node, an importer or not
        for node, _ in imports_in(path):
            for target in _targets(node, module, path.name == "__init__.py"):
                imported = package_of(target)
                if imported != source:
                    graph[source][imported].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return graph


def find_cycle(graph: dict[str, dict[str, list[str]]]) -> list[str] | None:
    """One cycle of the graph as a path that ends where it starts, or None (an iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path = [start]
        children = [iter(sorted(graph[start]))]
        state[start] = 1
        while path:
            child = next(children[-1], None)
            if child is None:
                state[path.pop()] = 2
                children.pop()
            elif state.get(child) == 1:
                return path[path.index(child):] + [child]
            elif not state.get(child):
                state[child] = 1
                path.append(child)
                children.append(iter(sorted(graph.get(child, ()))))
    return None


def upward_imports(graph: dict[str, dict[str, list[str]]]) -> list[str]:
    return [f"{source} (level {LEVEL[source]}) imports {target} (level {LEVEL[target]}) at {', '.join(where)}"
            for source, targets in sorted(graph.items()) for target, where in sorted(targets.items())
            if source in LEVEL and target in LEVEL and LEVEL[target] > LEVEL[source]]


def test_the_checks_see_what_they_look_for(tmp_path):
    """The finders themselves: a lazy import counts, a cycle is found, an upward import and an unexplained lazy
    import are reported, a commented one (or a block under one comment) passes."""
    graph = {"a": {"b": ["x:1"]}, "b": {"c": ["x:2"]}, "c": {"a": ["x:3"]}, "d": {"a": ["x:4"]}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": ["x:1"]}, "b": {}}) is None
    assert upward_imports({"trace": {"walk": ["t.py:3"]}, "walk": {"trace": ["w.py:1"]}}) == [
        "trace (level 4) imports walk (level 6) at t.py:3"]
    path = tmp_path / "probe.py"
    path.write_text("import os\n"
                    "def f():\n    from model_core import gate\n"
                    "def g():\n    # Ray is heavy and optional: loaded by the runs that use it\n"
                    "    import ray\n    import ray.data\n"
                    "def h():\n    import faiss  # FAISS is optional and slow to import\n"
                    "def i():\n    import x  # noqa: PLC0415\n", encoding="utf-8")
    found = imports_in(path)
    assert [in_function for _, in_function in found] == [False, True, True, True, True, True]
    assert _targets(found[1][0], "model_core.trace.forward", False) == ["model_core.gate"]
    assert unexplained_lazy_imports(path, tmp_path) == ["probe.py:3", "probe.py:11"]


def test_every_model_core_package_has_a_level():
    graph = package_graph()
    assert {"trace", "families", "gate", "cli"} <= set(graph)
    missing = sorted(set(graph) - set(LEVEL))
    assert not missing, f"packages with no declared level: {missing}; add each to LEVELS in {__name__}.py"


def test_model_core_packages_have_no_cycle():
    graph = package_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "package cycle (lazy imports count): " + " -> ".join(cycle) + "\n" + "\n".join(
        f"  {a} -> {b}: {', '.join(graph[a][b])}" for a, b in zip(cycle, cycle[1:]))


def test_no_package_imports_from_a_higher_level():
    up = upward_imports(package_graph())
    assert not up, "imports against the order of LEVELS (move the code down, or the import up):\n" + "\n".join(up)


def test_every_import_inside_a_function_says_why():
    bad = [where for path in sorted(PACKAGE.rglob("*.py")) for where in unexplained_lazy_imports(path)]
    assert not bad, ("imports inside functions with no comment saying why (move them to the top of the module; "
                     "keep one inside a function only for a heavy optional engine or start-up time, and say "
                     "so on its line or the line above):\n" + "\n".join(bad))
