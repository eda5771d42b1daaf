"""The house's rules, read from the code's own import statements (parsed, never imported):
imports go from the commands down, never up and never in a circle, name modules that exist,
and no module is over 400 lines (issue 35).

Every import counts, those inside functions (lazy) and under TYPE_CHECKING too. Each of the
three checks is shown failing on a small package written to a temporary folder.
"""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 400

# microbench's layers, highest first: a module may import its own layer or any below it.
# `` is the package itself (microbench/__init__.py: the version).
MICROBENCH_LAYERS = ("__main__", "cli", "tuning", "analysis", "sweep", "replay", "algorithms",
                     "backends", "ranks", "results", "options", "views", "argtypes", "")
# patterns' layers, highest first: the package's own __init__ (what `from patterns import`
# gives), the disaggregated deployment, the engines (one package each, and the registry that
# imports them), then the shared vocabulary every engine is built from (every other module).
PATTERNS_LAYERS = ("", "disagg", "engines", "*")

Graph = dict[str, list[tuple[str, int]]]  # module -> [(imported module, line)]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def read_tree(root: Path, packages: tuple[str, ...]) -> tuple[Graph, dict[str, int]]:
    """Every import statement of every module under `packages` (the module it names: a
    `from a import b` names a.b when that is a module), and each module's line count."""
    files = {module_name(p, root): p
             for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}
    graph: Graph = {}
    lines: dict[str, int] = {}
    for name, path in files.items():
        text = path.read_text()
        lines[name] = len(text.splitlines())
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        edges = []
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.Import):
                edges += [(alias.name, node.lineno) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package `level` dots up
                    up = here[:len(here) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                for alias in node.names:
                    child = f"{base}.{alias.name}"
                    edges.append((child if child in files else base, node.lineno))
        graph[name] = list(dict.fromkeys(edges))  # `from a import b, c`: one edge
    return graph, lines


def _layer(module: str, layers: tuple[str, ...]) -> int | None:
    parts = module.split(".")
    sub = parts[1] if len(parts) > 1 else ""
    if sub in layers:
        return layers.index(sub)
    return layers.index("*") if "*" in layers else None


def layer_violations(graph: Graph) -> list[str]:
    """Imports from a lower layer to a higher one; patterns/ importing anything but itself
    and the standard library; a microbench package no layer names."""
    out = []
    for module, edges in sorted(graph.items()):
        top = module.split(".")[0]
        layers = MICROBENCH_LAYERS if top == "microbench" else PATTERNS_LAYERS
        mine = _layer(module, layers)
        if mine is None:
            out.append(f"{module}: its package is in no layer; add it to MICROBENCH_LAYERS")
            continue
        for target, line in edges:
            target_top = target.split(".")[0]
            if top == "patterns" and target_top != "patterns":
                if target_top not in sys.stdlib_module_names:
                    out.append(f"{module}:{line} imports {target}: patterns/ takes only the "
                               "standard library")
                continue
            if target_top != top:
                continue  # microbench -> patterns: patterns is the ground
            theirs = _layer(target, layers)
            if theirs is not None and theirs < mine:
                out.append(f"{module}:{line} imports {target}, a higher layer")
    return out


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One circle of the graph, or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1 on the path, 2 done
    for start in sorted(edges):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(edges.get(start, ())))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(edges.get(nxt, ()))))
    return None


def _strong_components(edges: dict[str, set[str]]) -> list[list[str]]:
    """The groups of nodes that reach each other, of two or more (Kosaraju, iterative)."""
    nodes = sorted(set(edges) | {t for ts in edges.values() for t in ts})
    order, seen = [], set()
    for start in nodes:
        if start in seen:
            continue
        seen.add(start)
        stack = [(start, iter(sorted(edges.get(start, ()))))]
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                order.append(node)
                stack.pop()
            elif nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, iter(sorted(edges.get(nxt, ())))))
    back: dict[str, set[str]] = {}
    for node, targets in edges.items():
        for target in targets:
            back.setdefault(target, set()).add(node)
    groups, done = [], set()
    for start in reversed(order):
        if start in done:
            continue
        group, todo = [], [start]
        done.add(start)
        while todo:
            node = todo.pop()
            group.append(node)
            for prev in back.get(node, ()):
                if prev not in done:
                    done.add(prev)
                    todo.append(prev)
        if len(group) > 1:
            groups.append(sorted(group))
    return groups


def circles(graph: Graph) -> list[str]:
    """A circle of modules (a package's __init__ is a module: a package that imports a child
    that imports the package is one), and a circle of packages: sibling folders under one
    parent that import each other through any of their modules."""
    modules = {m: {t for t, _ in edges if t in graph and t != m} for m, edges in graph.items()}
    siblings: dict[str, set[str]] = {}
    for module, targets in modules.items():
        for target in targets:
            a, b = module.split("."), target.split(".")
            common = 0
            while common < min(len(a), len(b)) and a[common] == b[common]:
                common += 1
            if common < len(a) and common < len(b):  # neither is the other's package
                siblings.setdefault(".".join(a[:common + 1]), set()).add(".".join(b[:common + 1]))
    out = []
    found = _cycle(modules)
    if found:
        out.append(f"a circle of modules: {' -> '.join(found)}")
    for group in _strong_components(siblings):
        # Sibling modules alone are a circle of modules, said above.
        if any(any(m.startswith(node + ".") for m in graph) for node in group):
            out.append(f"a circle of packages: {', '.join(group)} import each other")
    return out


def missing_modules(graph: Graph) -> list[str]:
    """Imports of a microbench or patterns module that does not exist: after a move, a lazy
    import of the old path fails only when its function runs, not when tests collect."""
    return [f"{module}:{line} imports {target}, which is no module here"
            for module, edges in sorted(graph.items()) for target, line in edges
            if target.split(".")[0] in ("microbench", "patterns") and target not in graph]


def long_modules(lines: dict[str, int]) -> list[str]:
    return [f"{m}: {n} lines (at most {MAX_LINES})" for m, n in sorted(lines.items())
            if n > MAX_LINES]


def check(root: Path, packages: tuple[str, ...]) -> list[str]:
    graph, lines = read_tree(root, packages)
    return (layer_violations(graph) + circles(graph) + missing_modules(graph)
            + long_modules(lines))


def test_the_house_keeps_its_rules():
    assert check(ROOT, ("microbench", "patterns")) == []


# --- each check fails when its rule is broken (small packages in a temporary folder) ------

def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


GOOD = {
    "microbench/__init__.py": "",
    "microbench/cli/__init__.py": "from microbench.replay.plan import plan\n",
    "microbench/replay/__init__.py": "",
    "microbench/replay/plan.py": "import json\nfrom microbench.views.table import table\n"
                                 "from patterns.ops import Op\n",
    "microbench/views/__init__.py": "",
    "microbench/views/table.py": "from microbench.argtypes import positive_int\n",
    "microbench/argtypes.py": "import argparse\n",
    "patterns/__init__.py": "from patterns.engines import generate\n",
    "patterns/ops.py": "from dataclasses import dataclass\n",
    "patterns/engine_base.py": "from patterns.ops import Op\n",
    "patterns/engines/__init__.py": "from patterns.engines.vllm import profile\n",
    "patterns/engines/vllm/__init__.py": "",
    "patterns/engines/vllm/profile.py": "from patterns.engine_base import register\n",
}


def test_a_small_house_that_keeps_the_rules_passes(tmp_path):
    assert check(_write(tmp_path, GOOD), ("microbench", "patterns")) == []


def test_an_upward_import_fails_even_inside_a_function(tmp_path):
    bad = {**GOOD, "microbench/views/summary.py":
           "def summary():\n    from microbench.replay.plan import plan\n"}
    assert check(_write(tmp_path, bad), ("microbench", "patterns")) == [
        "microbench.views.summary:2 imports microbench.replay.plan, a higher layer",
        "a circle of packages: microbench.replay, microbench.views import each other"]


def test_patterns_importing_microbench_or_a_third_party_library_fails(tmp_path):
    bad = {**GOOD, "patterns/ops.py": "import numpy\nfrom microbench.argtypes import x\n"}
    assert check(_write(tmp_path, bad), ("microbench", "patterns")) == [
        "patterns.ops:1 imports numpy: patterns/ takes only the standard library",
        "patterns.ops:2 imports microbench.argtypes: patterns/ takes only the standard library",
        "a circle of packages: microbench, patterns import each other"]


def test_shared_pattern_vocabulary_importing_an_engine_fails(tmp_path):
    bad = {**GOOD, "patterns/ops.py": "from patterns.engines.vllm.profile import forward\n"}
    problems = check(_write(tmp_path, bad), ("microbench", "patterns"))
    assert problems[0] == "patterns.ops:1 imports patterns.engines.vllm.profile, a higher layer"


def test_a_package_that_imports_a_child_importing_the_package_is_a_circle(tmp_path):
    # The registry of old: engines/__init__ imports each engine, each engine imports
    # `register` from the package.
    bad = {**GOOD, "patterns/engines/vllm/profile.py": "from patterns.engines import register\n"}
    assert check(_write(tmp_path, bad), ("microbench", "patterns")) == [
        "a circle of modules: patterns.engines -> patterns.engines.vllm.profile -> "
        "patterns.engines"]


def test_a_circle_of_modules_in_one_layer_fails(tmp_path):
    bad = {**GOOD, "microbench/replay/plan.py": "from microbench.replay.timing import t\n",
           "microbench/replay/timing.py": "def t():\n    from microbench.replay.plan import p\n"}
    assert check(_write(tmp_path, bad), ("microbench", "patterns")) == [
        "a circle of modules: microbench.replay.plan -> microbench.replay.timing -> "
        "microbench.replay.plan"]


def test_a_circle_of_packages_fails(tmp_path):
    # No module imports itself back, but the folders do: workload -> engines -> workload.
    bad = {**GOOD, "patterns/workload/__init__.py": "",
           "patterns/workload/steps.py": "from patterns.engines.vllm.rules import sizes\n",
           "patterns/engines/vllm/rules.py": "sizes = [1]\n",
           "patterns/engines/vllm/workload.py": "from patterns.workload.steps import build\n"}
    assert check(_write(tmp_path, bad), ("microbench", "patterns")) == [
        "patterns.workload.steps:1 imports patterns.engines.vllm.rules, a higher layer",
        "a circle of packages: patterns.engines, patterns.workload import each other"]


def test_a_module_over_400_lines_fails(tmp_path):
    bad = {**GOOD, "microbench/argtypes.py": "x = 1\n" * 401}
    assert check(_write(tmp_path, bad), ("microbench", "patterns")) == [
        "microbench.argtypes: 401 lines (at most 400)"]


def test_a_microbench_package_in_no_layer_fails(tmp_path):
    bad = {**GOOD, "microbench/kvtransfer/__init__.py": "", "microbench/kvtransfer/plan.py": ""}
    assert check(_write(tmp_path, bad), ("microbench", "patterns")) == [
        "microbench.kvtransfer: its package is in no layer; add it to MICROBENCH_LAYERS",
        "microbench.kvtransfer.plan: its package is in no layer; add it to MICROBENCH_LAYERS"]


def test_an_import_of_a_module_moved_away_fails(tmp_path):
    # A lazy import of a path a move left behind: collecting the tests does not see it.
    bad = {**GOOD, "microbench/cli/__init__.py": "from microbench.replay.plan import plan\n"
                                                 "def run():\n"
                                                 "    from microbench.kvtransfer.plan import p\n"}
    assert check(_write(tmp_path, bad), ("microbench", "patterns")) == [
        "microbench.cli:3 imports microbench.kvtransfer.plan, which is no module here"]
