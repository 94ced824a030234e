"""The package's shape (docs/design.md, "Code map"): every import, function-local ones
included, goes to a lower floor or within its own package, so the import graph has no
circles; no module grows past ~400 lines; each package says what it owns."""

import ast
from pathlib import Path

import mlxspec

PACKAGE = Path(mlxspec.__file__).parent
FLOORS = {"errors": 0, "util": 1, "arch": 2, "cpu": 3, "device": 4, "core": 5, "constrained": 5, "costs": 6, "models": 6,
          "drafting": 7, "trees": 8, "decoder": 9, "distributed": 9, "api": 10, "session": 11, "server": 11, "bench": 11,
          "commands": 12, "converters": 12, "cli": 13, "__init__": 14}
SIDEWAYS = {("costs", "models"), ("models", "costs")}  # one floor, may use each other (no circle: checked below)
MAX_LINES = 420


def modules() -> dict[str, Path]:
    found = {}
    for p in PACKAGE.rglob("*.py"):
        parts = list(p.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = p
    return found


def import_graph() -> dict[str, set]:
    mods = modules()
    edges = {m: set() for m in mods}
    for m, p in mods.items():
        here = m.split(".") if p.name == "__init__.py" else m.split(".")[:-1]
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                subs = [f"{base}.{a.name}" for a in node.names]
                targets = [s for s in subs if s in mods]
                if len(targets) < len(subs):
                    targets.append(base)
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m and t != "mlxspec":
                    edges[m].add(t)
    return edges


def floor(module: str) -> tuple[int, str]:
    top = module.split(".")[1] if "." in module else "__init__"
    return FLOORS[top], top


def test_every_import_goes_down_or_within_its_package():
    wrong = []
    for a, targets in import_graph().items():
        fa, pa = floor(a)
        for b in targets:
            fb, pb = floor(b)
            if fb > fa or (fb == fa and pa != pb and (pa, pb) not in SIDEWAYS):
                wrong.append(f"{a} -> {b}")
    assert wrong == []


def circles(edges: dict[str, set]) -> list[list[str]]:
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_circles():
    assert circles(import_graph()) == []


def test_the_circle_finder_finds_one():
    """The control: a graph with a circle is caught."""
    graph = import_graph()
    graph["mlxspec.core.cache"] = graph["mlxspec.core.cache"] | {"mlxspec.decoder"}
    assert any("mlxspec.decoder" in c and "mlxspec.core.cache" in c for c in circles(graph))


def test_no_module_is_over_the_size_limit():
    big = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
           if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert big == {}


def test_every_package_says_what_it_owns():
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc.split()) >= 12, init
