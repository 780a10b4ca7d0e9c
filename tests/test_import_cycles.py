"""No two modules of psij import each other, directly or through others; and no module imports
one of a layer above its own (the layers of docs/architecture.rst).

The import graph is read from the source with :mod:`ast`, never by importing anything, so a
module that is slow or has side effects at import is still checked. What counts as an edge
``a -> b`` ("running module ``a`` may run or read module ``b``"):

- every ``import`` and ``from ... import`` statement of ``a``, at module level and inside
  functions, methods, classes, ``try`` and ``if`` blocks alike: an import inside a function runs
  when the function is called, and a circle closed that way is still a circle;
- except those in the body of ``if TYPE_CHECKING:`` (or ``if typing.TYPE_CHECKING:``), which
  never run; their ``else:`` branch does run and counts;
- relative imports are resolved against ``a``'s own package (``a`` itself when ``a`` is a
  package's ``__init__``);
- ``import x.y.z`` counts ``x.y.z``; ``from x.y import n`` counts ``x.y.n`` when that is a
  module, and ``x.y`` itself when some ``n`` is not a module (or for ``*``): those statements
  read ``x.y``'s namespace;
- importing ``x.y.z`` or ``from x.y import ...`` also runs the ``__init__`` of each package on
  the way (``x``, ``x.y``): that counts as an edge to the package, except for ``a``'s own
  enclosing packages, which Python has always begun to run before ``a``'s body starts, so the
  statement runs nothing of theirs (``psij.executors.batch.slurm`` importing
  ``psij.executors.batch.batch_scheduler_executor`` has no edge to ``psij.executors.batch``,
  while ``psij.job`` importing ``psij.executors.batch._clock`` has one to
  ``psij.executors`` and one to ``psij.executors.batch``);
- a module's import of itself and imports of modules outside psij are not edges; nor are
  modules loaded by name at run time (``importlib.import_module``), which plugin discovery does.

A cycle is reported as a chain ``a -> b -> c -> a`` (one shortest circle through each knot of
modules that reach one another), followed by the line of each step.
"""

import ast
from collections import deque
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Set

import psij

SRC = Path(psij.__file__).parent

Graph = Dict[str, Dict[str, int]]  # module -> {imported module: line of the first such import}


def module_names(root: Path, package: str) -> Dict[str, Path]:
    """Every module of the package at ``root`` by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join([package, *parts])] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _run_imports(tree: ast.AST) -> Iterator[ast.stmt]:
    """The import statements of ``tree`` that can run: all but those under TYPE_CHECKING."""
    todo: List[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))


def _packages_on_the_way(name: str) -> List[str]:
    """``a.b.c`` -> ``[a, a.b]``: the packages whose ``__init__`` importing ``name`` runs."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _targets(module: str, is_package: bool, node: ast.stmt, known: Set[str]) -> Set[str]:
    enclosing = set(_packages_on_the_way(module))
    targets: Set[str] = set()
    if isinstance(node, ast.Import):
        for alias in node.names:
            targets.update(p for p in _packages_on_the_way(alias.name) if p not in enclosing)
            targets.add(alias.name)
    else:
        assert isinstance(node, ast.ImportFrom)
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        targets.update(p for p in _packages_on_the_way(source) if p not in enclosing)
        if source not in enclosing:
            targets.add(source)
        for alias in node.names:
            if f"{source}.{alias.name}" in known:
                targets.add(f"{source}.{alias.name}")
            else:
                targets.add(source)
    return {t for t in targets if t in known and t != module}


def import_graph(root: Path, package: str) -> Graph:
    """The edges of every module of the package at ``root``, as the module docstring counts them."""
    modules = module_names(root, package)
    known = set(modules)
    graph: Graph = {}
    for name, path in modules.items():
        edges: Dict[str, int] = {}
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in sorted(_run_imports(tree), key=lambda n: n.lineno):
            for target in _targets(name, path.name == "__init__.py", node, known):
                edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


def knots(graph: Graph) -> List[List[str]]:
    """The strongly connected groups of two or more modules (Tarjan), each sorted, in order."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return sorted(found)


def shortest_cycle(graph: Graph, knot: Sequence[str]) -> List[str]:
    """A shortest circle through the first module of ``knot``, ending where it starts."""
    start = knot[0]
    members = set(knot)
    came_from: Dict[str, Optional[str]] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(graph[node]):
            if child == start:
                path = [node]
                step = came_from[node]
                while step is not None:
                    path.append(step)
                    step = came_from[step]
                return [*reversed(path), start]
            if child in members and child not in came_from:
                came_from[child] = node
                queue.append(child)
    raise AssertionError(f"{start} is on no circle")


def describe(graph: Graph, modules: Dict[str, Path], root: Path, cycle: List[str]) -> str:
    """``a -> b -> a`` and, below it, the file and line of each step."""
    steps = [f"    {a} -> {b}: {modules[a].relative_to(root).as_posix()}:{graph[a][b]}"
             for a, b in zip(cycle, cycle[1:])]
    return "\n".join([" -> ".join(cycle), *steps])


def cycles_left(root: Path, package: str) -> List[str]:
    """One described circle per knot of the package."""
    graph = import_graph(root, package)
    modules = module_names(root, package)
    return [describe(graph, modules, root, shortest_cycle(graph, knot))
            for knot in knots(graph)]


def test_the_graph_of_psij_has_every_module_and_the_edges_it_should() -> None:
    graph = import_graph(SRC, "psij")
    assert len(graph) > 100
    assert "psij.executors.batch.batch_scheduler_executor" in graph["psij.executors.batch.slurm"]
    # A function-level import, and one made only for type checkers.
    assert "psij.executors.batch._spares" in graph["psij.executors.batch._runner"]
    assert "psij.executors.batch.batch_scheduler_executor" not in graph[
        "psij.executors.batch._submit_io"]


def test_no_module_of_psij_is_on_an_import_cycle() -> None:
    left = cycles_left(SRC, "psij")
    assert not left, "import cycles:\n" + "\n".join(left)


# The layers of docs/architecture.rst, from the bottom: a module imports modules of its own
# layer or of one below, never above. Modules not named here are the core (the model, the
# public API and the shared edge). The first prefix that matches a module gives its layer.
LAYERS = (("cli", ("psij.cli", "psij.__main__")),
          ("built on the API", ("psij.controller", "psij.flows", "psij.supervise",
                                "psij.registry", "psij.futures", "psij.remote",
                                "psij.executors.pilot.qcg", "psij.report")),
          ("executors", ("psij.executors", "psij.launchers")))
LAYER_ORDER = {"core": 0, "executors": 1, "built on the API": 2, "cli": 3}


def layer_of(module: str) -> str:
    for name, prefixes in LAYERS:
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return name
    return "core"


def imports_upwards(graph: Graph) -> List[str]:
    """Each import of a module from a layer above its own, as ``a (layer) -> b (layer): line``."""
    return [f"{a} ({layer_of(a)}) -> {b} ({layer_of(b)}): line {line}"
            for a, edges in sorted(graph.items()) for b, line in sorted(edges.items())
            if LAYER_ORDER[layer_of(b)] > LAYER_ORDER[layer_of(a)]]


def test_no_module_imports_a_layer_above_its_own() -> None:
    graph = import_graph(SRC, "psij")
    assert layer_of("psij.executors.pilot.qcg.run") == "built on the API"
    assert layer_of("psij.executors.pilot.engine") == "executors"
    assert layer_of("psij.job") == "core" and layer_of("psij._registry.recorder") == "core"
    upwards = imports_upwards(graph)
    assert not upwards, "imports from a layer above:\n" + "\n".join(upwards)
    # The check sees such an import when there is one.
    assert imports_upwards({"psij.job": {"psij.flows.machine": 3}}) == [
        "psij.job (core) -> psij.flows.machine (built on the API): line 3"]


def _package(tmp_path: Path, files: Dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_cycle_closed_by_an_import_inside_a_function_is_found(tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "from pkg.b import B\n",
        "b.py": "import os\n\nclass B:\n    def run(self) -> None:\n"
                "        from pkg import c\n        c.go()\n",
        "c.py": "def go() -> None:\n    import pkg.a\n",
    })
    assert cycles_left(root, "pkg") == [
        "pkg.a -> pkg.b -> pkg.c -> pkg.a\n"
        "    pkg.a -> pkg.b: a.py:1\n    pkg.b -> pkg.c: b.py:5\n    pkg.c -> pkg.a: c.py:2"]


def test_an_import_only_for_type_checking_is_no_edge(tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "from pkg.b import B\n",
        "b.py": "import typing\nfrom typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from pkg.a import A\n"
                "if typing.TYPE_CHECKING:\n    import pkg.a\nelse:\n    import pkg.c\n"
                "class B:\n    pass\n",
        "c.py": "",
    })
    assert import_graph(root, "pkg")["pkg.b"] == {"pkg.c": 8}
    assert cycles_left(root, "pkg") == []


def test_relative_imports_are_resolved_against_the_module_s_package(tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "__init__.py": "",
        "top.py": "",
        "sub/__init__.py": "from . import low\nfrom .low import x\n",
        "sub/low.py": "from .. import top\nfrom ..top import y\nfrom .mid import z\n",
        "sub/mid.py": "from . import low\n",
    })
    graph = import_graph(root, "pkg")
    assert graph["pkg.sub"] == {"pkg.sub.low": 1}
    assert graph["pkg.sub.low"] == {"pkg.top": 1, "pkg.sub.mid": 3}
    assert graph["pkg.sub.mid"] == {"pkg.sub.low": 1}
    assert cycles_left(root, "pkg") == [
        "pkg.sub.low -> pkg.sub.mid -> pkg.sub.low\n"
        "    pkg.sub.low -> pkg.sub.mid: sub/low.py:3\n"
        "    pkg.sub.mid -> pkg.sub.low: sub/mid.py:1"]


def test_a_package_init_run_on_the_way_counts_unless_it_encloses_the_importer(
        tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "__init__.py": "",
        "job.py": "import pkg.ex.batch.clock\n",
        "ex/__init__.py": "",
        "ex/batch/__init__.py": "from pkg.ex.batch.bse import Executor\n",
        "ex/batch/bse.py": "from pkg.job import Job\n",
        "ex/batch/clock.py": "",
        "ex/batch/slurm.py": "from pkg.ex.batch.bse import Executor\nfrom pkg import job\n",
    })
    graph = import_graph(root, "pkg")
    assert graph["pkg.job"] == {"pkg.ex": 1, "pkg.ex.batch": 1, "pkg.ex.batch.clock": 1}
    assert graph["pkg.ex.batch.slurm"] == {"pkg.ex.batch.bse": 1, "pkg.job": 2}
    assert cycles_left(root, "pkg") == [
        "pkg.ex.batch -> pkg.ex.batch.bse -> pkg.job -> pkg.ex.batch\n"
        "    pkg.ex.batch -> pkg.ex.batch.bse: ex/batch/__init__.py:1\n"
        "    pkg.ex.batch.bse -> pkg.job: ex/batch/bse.py:1\n"
        "    pkg.job -> pkg.ex.batch: job.py:1"]
