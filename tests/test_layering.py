"""explorer.app's imports point one way: no import circle of more than two modules, counting the imports made
inside functions (a circle hidden in a function still ties its modules together and breaks when the order of
first use changes). The graph is read from the source with `ast`, so nothing is imported to build it."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "explorer.app"


def modules() -> dict[str, Path]:
    """Every module under explorer/app by its dotted name (a package by its own name, for its __init__)."""
    found = {}
    for path in (ROOT / PACKAGE.replace(".", "/")).rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def is_package(name: str, known: dict[str, Path]) -> bool:
    return known[name].name == "__init__.py"


def imported(name: str, tree: ast.AST, known: dict[str, Path]) -> set[str]:
    """The modules under explorer.app that module `name` imports anywhere in its source: `from X import y` counts
    X.y where y is a module and X otherwise; importing a.b.c also runs a and a.b, unless `name` sits inside them
    (a package is already being imported when its own modules run)."""
    here = name if is_package(name, known) else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join(package + ([node.module] if node.module else []))
            targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    edges = set()
    for target in targets:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            step = ".".join(parts[:i])
            inside = name == step or name.startswith(step + ".")
            if step in known and step != name and (step == target or not inside):
                edges.add(step)
    return edges


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(name, ast.parse(path.read_text()), known) for name, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), largest first."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
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

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found, key=len, reverse=True)


def test_the_graph_sees_imports_inside_functions_and_from_packages():
    edges = graph()
    assert "explorer.app.jobs" in edges["explorer.app.worker"]  # `from . import jobs` inside run()
    assert "explorer.app.lessons" in edges["explorer.app.ui"]  # `from . import lessons`: the module, not the package
    assert "explorer.app.jobs" not in edges["explorer.app.jobs.warm"]  # its own package is already importing
    assert "explorer.app.lessons" in edges["explorer.app.jobs.warm"]  # `from ..lessons import base` runs lessons


def test_circles_finds_a_known_circle_and_leaves_a_chain_alone():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_circle_of_more_than_two_modules_in_the_app():
    found = circles(graph())
    for component in found:
        print(len(component), component)
    assert [c for c in found if len(c) > 2] == []


def test_the_lessons_registry_imports_a_lesson_only_when_it_is_asked_for():
    """Names, choices and checks read the registry without importing every lesson; a lesson's module is imported
    the first time its lesson is used, and its LESSON is the one its name says."""
    script = """
import sys
from explorer.app import lessons
loaded = lambda: sorted(m for m in lessons.MODULES.values() if f"explorer.app.lessons.{m}" in sys.modules)
assert loaded() == [], loaded()
assert lessons.names()[0] == "memory" and "kv-cache" in lessons.LESSONS and "nope" not in lessons.LESSONS
assert loaded() == [], loaded()
assert lessons.LESSONS["kv-cache"].name == "kv-cache"
assert loaded() == ["kv_cache"], loaded()
assert [lesson.name for lesson in lessons.LESSONS.values()] == lessons.names()
try:
    lessons.LESSONS["nope"]
except KeyError:
    pass
else:
    raise AssertionError("an unknown lesson is a KeyError, as in a dict")
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
