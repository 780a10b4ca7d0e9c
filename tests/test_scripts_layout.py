"""Where quoting and script rendering live: in ``psij._scripts``, which batch executors, the
staging parts of job scripts and the pilot import directly, and which imports no executor; the
PSI/J paths plugins import (``psij.executors.batch.escape_functions``, ``.script_generator``,
``.template_function_library``) re-export the very same objects and nothing else.

The import rules are read from the source with the graph of tests/test_import_cycles.py (every
import counts, inside functions too).
"""

import importlib
import types
from typing import Dict, List, Tuple

import pytest

from test_import_cycles import SRC, import_graph

# PSI/J path -> (the module that now holds the code, the public names the path had).
REEXPORTS: Dict[str, Tuple[str, List[str]]] = {
    "psij.executors.batch.escape_functions": (
        "psij._scripts.quoting",
        ["ShellWord", "bash_escape", "directive_value", "double_quoted", "plain_directive_value",
         "plain_job_name", "shell_word"]),
    "psij.executors.batch.script_generator": (
        "psij._scripts.generator",
        ["SubmitScriptGenerator", "TemplatedScriptGenerator", "inline_partials"]),
    "psij.executors.batch.template_function_library": (
        "psij._scripts.template_functions",
        ["ALL", "walltime_to_minutes"]),
}

# Modules outside batch/ that quote or render, each with what it takes from psij._scripts.
USERS = {
    "psij.executors._staging": {"psij._scripts.quoting"},
    "psij.executors.pilot._staging": {"psij._scripts.quoting", "psij._scripts.generator"},
}


def _public(module: types.ModuleType) -> Dict[str, object]:
    """The public names ``module`` defines itself (not the modules and names it imports)."""
    return {name: value for name, value in vars(module).items()
            if not name.startswith("_") and not isinstance(value, types.ModuleType)
            and getattr(value, "__module__", module.__name__) == module.__name__}


@pytest.mark.parametrize("old", sorted(REEXPORTS))
def test_each_psij_path_re_exports_the_same_objects(old: str) -> None:
    new_name, names = REEXPORTS[old]
    old_module = importlib.import_module(old)
    new_module = importlib.import_module(new_name)
    assert sorted(_public(new_module)) == names, f"{new_name} has public names {old} lacks"
    for name in names:
        assert getattr(old_module, name) is getattr(new_module, name), f"{old}.{name}"
    kept = {name: value for name, value in vars(old_module).items()
            if not name.startswith("_") and not isinstance(value, types.ModuleType)}
    assert sorted(kept) == names, f"{old} defines names of its own"
    assert old_module.__all__ == new_module.__all__
    namespace: Dict[str, object] = {}
    exec(f"from {old} import *", namespace)
    assert {n for n in namespace if n != "__builtins__"} == set(new_module.__all__)


def test_the_template_helpers_are_the_same_objects_under_both_paths() -> None:
    from psij._scripts.template_functions import ALL
    from psij.executors.batch.template_function_library import ALL as OLD_ALL
    from psij.executors.batch.template_function_library import walltime_to_minutes

    assert OLD_ALL is ALL
    assert OLD_ALL["walltime_to_minutes"] is walltime_to_minutes


def test_no_module_of_psij_imports_quoting_or_rendering_from_batch() -> None:
    graph = import_graph(SRC, "psij")
    old_paths = set(REEXPORTS)
    reached = {module: sorted(old_paths & set(edges)) for module, edges in graph.items()
               if module not in old_paths and old_paths & set(edges)}
    assert reached == {}, "import psij._scripts.* instead of the PSI/J paths kept for plugins"
    for old, (new, _) in REEXPORTS.items():
        # psij._reexports: the names psij-python's module of that path imports, on first use
        assert set(graph[old]) - {"psij._scripts", "psij._reexports"} == {new}


def test_the_shared_package_imports_no_executor() -> None:
    graph = import_graph(SRC, "psij")
    shared = [name for name in graph if name.startswith("psij._scripts")]
    assert sorted(shared) == ["psij._scripts", "psij._scripts.generator", "psij._scripts.mustache",
                              "psij._scripts.quoting", "psij._scripts.template_functions"]
    for name in shared:
        reaching = [t for t in graph[name] if t.startswith(("psij.executors", "psij.launchers"))]
        assert reaching == [], f"{name} imports {reaching}"


@pytest.mark.parametrize("module", sorted(USERS))
def test_local_staging_and_the_pilot_take_quoting_from_the_shared_package(module: str) -> None:
    edges = set(import_graph(SRC, "psij")[module])
    assert USERS[module] <= edges
    assert not any(e.startswith("psij.executors.batch") for e in edges), sorted(edges)
