"""How the ``psij.cli`` package is cut: no module imports another in a circle (imports inside
functions and relative imports included), the exit codes are defined in one module, every module
says what it is for, none is past 700 lines, the names code outside imports stay, and ``import
psij.cli`` loads no command's module."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Set

import pytest

import psij.cli

FOLDER = Path(psij.cli.__file__).parent

# Importable from psij.cli, as they were from the single module the command once was.
KEPT_NAMES = ["main", "UsageError", "exit_status", "EXIT_USAGE", "EXIT_FAILED", "EXIT_CANCELED",
              "EXIT_BROKEN_PIPE", "DEFAULT_EXECUTOR", "build_attributes", "build_environment",
              "build_spec"]


def module_names(folder: Path, package: str) -> Dict[str, Path]:
    """Each module of the package in ``folder`` by its dotted name (the package by its own)."""
    return {package if path.stem == "__init__" else f"{package}.{path.stem}": path
            for path in sorted(folder.glob("*.py"))}


def imported_modules(name: str, path: Path, known: Set[str]) -> Set[str]:
    """The modules of ``known`` that module ``name`` imports anywhere in its source: at the top,
    inside functions or under TYPE_CHECKING, absolute or relative, ``from . import x`` naming a
    module or a name of the package."""
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    found: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: List[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[:len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                       for alias in node.names]
        for target in targets:
            # ``import psij.cli._run`` names the module itself; a longer name (an attribute
            # path) is taken to its module.
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(folder: Path, package: str) -> Dict[str, Set[str]]:
    modules = module_names(folder, package)
    return {name: imported_modules(name, path, set(modules)) for name, path in modules.items()}


def find_cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    """One cycle of ``graph`` as the modules along it (the first one again at the end), or None.
    """
    state: Dict[str, str] = {}
    path: List[str] = []

    def visit(node: str) -> Optional[List[str]]:
        state[node] = "open"
        path.append(node)
        for after in sorted(graph.get(node, ())):
            if state.get(after) == "open":
                return [*path[path.index(after):], after]
            if after not in state:
                cycle = visit(after)
                if cycle is not None:
                    return cycle
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle is not None:
                return cycle
    return None


def test_no_module_of_the_command_imports_another_in_a_circle() -> None:
    graph = import_graph(FOLDER, "psij.cli")
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_dependency_goes_from_the_dispatcher_to_the_families_to_the_shared_modules() -> None:
    graph = import_graph(FOLDER, "psij.cli")
    assert not [name for name, imports in graph.items() if "psij.cli" in imports]
    assert graph["psij.cli._common"] == set()
    # The dispatcher reaches every command's module; no command's module reaches another's.
    families = {"psij.cli._plugins", "psij.cli._run", "psij.cli._script", "psij.cli._jobs",
                "psij.cli._config", "psij.cli._supervise", "psij.cli._pilot", "psij.cli._flow",
                "psij.cli._report"}
    assert families <= graph["psij.cli"]
    assert {name: graph[name] & families for name in families} == {f: set() for f in families}


def test_the_scan_sees_imports_in_functions_and_relative_ones(tmp_path: Path) -> None:
    folder = tmp_path / "pkg"
    folder.mkdir()
    (folder / "__init__.py").write_text("def main():\n    from pkg import a\n")
    (folder / "a.py").write_text("def f():\n    from . import b\n")
    (folder / "b.py").write_text("import os\n\ndef g():\n    from .c import x\n")
    (folder / "c.py").write_text("def h():\n    from .. import pkg\n    import pkg.a.f\n")
    graph = import_graph(folder, "pkg")
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"},
                     "pkg.c": {"pkg.a"}}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    # A name imported back from the package, as the families once took helpers from the
    # command's module, closes a circle through the package.
    (folder / "c.py").write_text("def h():\n    from . import x\n")
    assert import_graph(folder, "pkg")["pkg.c"] == {"pkg"}
    assert find_cycle(import_graph(folder, "pkg")) == ["pkg", "pkg.a", "pkg.b", "pkg.c", "pkg"]
    (folder / "c.py").write_text("import os\n")
    assert find_cycle(import_graph(folder, "pkg")) is None


def test_the_exit_codes_are_defined_in_one_module() -> None:
    where: Dict[str, List[str]] = {}
    for name, path in module_names(FOLDER, "psij.cli").items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
            for target in targets:
                if isinstance(target, ast.Name) and target.id.startswith("EXIT_"):
                    where.setdefault(target.id, []).append(name)
    assert where == {code: ["psij.cli._common"] for code in
                     ("EXIT_USAGE", "EXIT_FAILED", "EXIT_CANCELED", "EXIT_BROKEN_PIPE",
                      "EXIT_TIMEOUT")}


def test_every_module_says_what_it_is_for_and_is_at_most_700_lines() -> None:
    for name, path in module_names(FOLDER, "psij.cli").items():
        text = path.read_text()
        assert ast.get_docstring(ast.parse(text)), f"{name} has no docstring"
        assert len(text.splitlines()) <= 700, name


@pytest.mark.parametrize("name", KEPT_NAMES)
def test_names_imported_from_the_command_stay(name: str) -> None:
    assert getattr(psij.cli, name) is not None
    assert psij.cli.__all__ == ["main"]


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        psij.cli.nothing_here  # noqa: B018


def test_the_dispatcher_knows_each_registry_command() -> None:
    from psij.cli import _jobs

    assert set(psij.cli._JOB_COMMANDS) == set(_jobs._HANDLERS)


def test_importing_the_command_loads_none_of_its_commands() -> None:
    code = ("import sys, json, psij.cli\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('psij.'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert json.loads(done.stdout) == ["psij.cli", "psij.cli._common", "psij.version"]


def _run_command(argv: List[str]) -> Dict[str, object]:
    """``psij.cli.main(argv)`` in a fresh interpreter: its status, output and the psij modules
    and whether argparse were loaded by then."""
    code = ("import contextlib, io, json, sys, psij.cli\n"
            "out = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n"
            f"    status = psij.cli.main({argv!r})\n"
            "loaded = sorted(m for m in sys.modules if m.startswith('psij.'))\n"
            "print(json.dumps({'status': status, 'out': out.getvalue(),\n"
            "                  'argparse': 'argparse' in sys.modules, 'modules': loaded}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True, env={**os.environ, "COLUMNS": "100"})
    result: Dict[str, object] = json.loads(done.stdout)
    return result


def test_psij_version_builds_no_parser_and_loads_no_command() -> None:
    result = _run_command(["--version"])
    assert result["status"] == 0
    assert result["out"] == f"psij {psij.cli.__version__}\n"
    assert result["argparse"] is False
    assert result["modules"] == ["psij.cli", "psij.cli._common", "psij.version"]


@pytest.mark.parametrize("argv", [["--help"], ["-h", "--version"], ["--ver"]])
def test_a_line_naming_no_command_loads_no_command(argv: List[str]) -> None:
    result = _run_command(argv)
    assert result["status"] == 0
    assert result["modules"] == ["psij.cli", "psij.cli._common", "psij.version"]


def test_psij_help_lists_each_command_as_the_command_itself_describes_it() -> None:
    # The full parser takes each line from the command's own module; the short one from the
    # table: both print the same help.
    full = psij.cli._build_parser()
    commands = next(a for a in full._actions if a.dest == "command")
    assert [(a.dest, a.help) for a in commands._choices_actions] == list(psij.cli._COMMAND_LINES)
    assert {name for name, _ in psij.cli._COMMAND_LINES} == set(psij.cli._COMMANDS)
    short = psij.cli._build_parser(["--help"])
    assert short.format_help() == full.format_help()
