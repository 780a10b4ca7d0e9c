"""How the local executor is laid out: one package, ``psij.executors.local``, holds every module
of it (none is left as a ``_local_*`` file beside the other executors), each says what it is
for and is at most 700 lines; its public names import from the package as they did from the
single module it once was and are the objects its modules define; the modules it shares with
the pilot and batch executors import nothing of it; and the keeper, started by its file's path,
finds the process layer it loads."""

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Set

import pytest

import psij.executors.local
from psij import JobExecutor
from psij.executors.local import _executor, _keeper, _keeper_client, _worker

EXECUTORS = Path(psij.executors.local.__file__).parents[1]
FOLDER = EXECUTORS / "local"

MODULES = {"__init__", "_checks", "_env", "_executor", "_handover", "_journal", "_keeper",
           "_keeper_client", "_keeper_kills", "_keeper_rows", "_pool_driver", "_pool_gpus",
           "_pool_machine", "_prepared", "_reruns", "_stage_in", "_start", "_time_limit",
           "_transfer", "_worker"}

# Shared with the pilot and batch executors: they stay in psij.executors.
SHARED = ["_process", "_process_watch", "_staging", "_gpu_detect", "_os_texts"]


def test_the_public_names_import_from_the_package_and_are_the_executors_own() -> None:
    from psij.executors.local import _WORKER, LocalJobExecutor, LocalJobExecutorConfig

    assert psij.executors.local.__all__ == ["LocalJobExecutor", "LocalJobExecutorConfig"]
    assert LocalJobExecutor is _executor.LocalJobExecutor
    assert LocalJobExecutorConfig is _executor.LocalJobExecutorConfig
    assert _WORKER is _worker.WORKER
    assert issubclass(LocalJobExecutor, JobExecutor)


def test_the_plugin_named_local_is_the_packages_class(tmp_path: Path) -> None:
    ex = JobExecutor.get_instance("local", config=psij.executors.local.LocalJobExecutorConfig(
        work_directory=tmp_path))
    assert type(ex) is psij.executors.local.LocalJobExecutor


def test_the_package_holds_the_local_executors_modules() -> None:
    assert {path.stem for path in FOLDER.glob("*.py")} == MODULES
    left = sorted(path.name for path in EXECUTORS.glob("*.py")
                  if path.name.startswith("_local_") or path.name in (
                      "local.py", "_keeper_client.py", "_gpus.py"))
    assert left == []
    assert {path.stem for path in EXECUTORS.glob("*.py")} == {"__init__", "flux", "rp", *SHARED}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_says_what_it_is_for_and_is_at_most_700_lines(name: str) -> None:
    text = (FOLDER / f"{name}.py").read_text()
    assert ast.get_docstring(ast.parse(text)), f"{name} has no docstring"
    assert len(text.splitlines()) <= 700, name


def run_time_imports(path: Path) -> Set[str]:
    """The modules ``path`` imports where it can run (all but ``if TYPE_CHECKING:`` bodies),
    absolute names only (the package uses no relative import)."""
    found: Set[str] = set()
    todo = [ast.parse(path.read_text(), str(path))]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.If) and isinstance(node.test, ast.Name) \
                and node.test.id == "TYPE_CHECKING":
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))
    return found


@pytest.mark.parametrize("name", SHARED)
def test_the_shared_modules_import_nothing_of_the_local_package(name: str) -> None:
    imports = run_time_imports(EXECUTORS / f"{name}.py")
    assert [i for i in imports if i.startswith("psij.executors.local")] == []


def test_the_scan_sees_imports_in_functions_but_not_for_type_checking(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a.b\n"
                    "else:\n    import c\n\ndef f():\n    from d.e import g\n")
    assert run_time_imports(path) == {"typing.TYPE_CHECKING", "c", "d.e.g"}


def test_the_keeper_is_started_from_the_package_and_finds_the_process_layer() -> None:
    spawn = EXECUTORS.parent / "_spawn.py"
    assert Path(_keeper_client._PROGRAM) == Path(_keeper.__file__) == FOLDER / "_keeper.py"
    assert Path(_keeper_client._LAYER) == spawn
    assert Path(_keeper.layer_path()) == spawn


def test_importing_the_package_loads_the_executors_modules_and_no_other_executor() -> None:
    code = ("import sys, json, psij.executors.local\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('psij.executors'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    loaded = set(json.loads(done.stdout))
    # All but the keeper and what it writes, which run in its own process.
    assert {f"psij.executors.local.{name}"
            for name in MODULES - {"__init__", "_keeper", "_keeper_kills", "_keeper_rows"}} \
        <= loaded
    assert not [m for m in loaded if m.startswith(("psij.executors.batch",
                                                   "psij.executors.pilot"))]
