"""How the controller and the registry are laid out: ``psij.controller`` is one package whose
public names are the objects its private modules define; ``psij.registry`` keeps its public
names, and its private parts (the recorder and the store) are the private package
``psij._registry``, outside it (the recorder is imported by every executor's first status
change, and the registry's public functions need the executors: one package holding both would
import itself in a circle), whose ``__init__`` imports nothing. No part of the local or pilot
executor imports its executor's module. No module of psij is past 700 lines."""

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

import psij
import psij.controller
import psij.registry

SRC = Path(psij.__file__).parent

CONTROLLER_NAMES = [
    "Action", "ActionDone", "ActionFailed", "ActionKind", "Attach", "BadMessage", "Call", "Cancel",
    "CancelTimer", "Clock", "Close", "Connected", "ControllerLoop", "Disconnected", "Event",
    "Forget", "JobStatusChanged", "Log", "Machine", "ManualClock", "MessageReceived",
    "MonotonicClock", "Peer", "Send", "SetTimer", "SignalReceived", "Started", "Stop", "Submit",
    "Tick", "TimerFired", "exit_code_for_signal",
]

REGISTRY_NAMES = ["AttachError", "JobRecord", "RegistryError", "RunRecord", "attach", "find",
                  "flush", "prune", "reattach", "registry_file", "runs", "set_prune_age",
                  "set_recording", "set_tag"]

# What other modules of psij (the ``psij`` commands) read from psij.registry besides __all__.
REGISTRY_USED = ["MAX_TAG_LENGTH", "_check_tag", "_iso", "_recorded_config", "_select",
                 "_work_directory", "use_json"]


def run_fresh(code: str, cwd: Path) -> Any:
    """Run ``code`` in a new interpreter and return the JSON it prints last."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=cwd, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_controller_keeps_every_public_name() -> None:
    assert sorted(psij.controller.__all__) == sorted(CONTROLLER_NAMES)


@pytest.mark.parametrize("name", CONTROLLER_NAMES)
def test_a_controller_name_is_the_object_its_package_defines(name: str) -> None:
    from psij import _clock
    from psij.controller import _loop, _values

    value = getattr(psij.controller, name)
    homes = [m for m in (_values, _loop, _clock) if getattr(m, name, None) is value]
    assert homes, f"psij.controller.{name} is defined by none of its modules"
    namespace: Dict[str, Any] = {}
    exec(f"from psij.controller import {name} as imported", namespace)
    assert namespace["imported"] is value


def test_the_controller_is_one_package_and_no_controller_module_is_left_at_the_top() -> None:
    assert Path(psij.controller.__file__).name == "__init__.py"
    assert sorted(p.name for p in (SRC / "controller").glob("*.py")) == [
        "__init__.py", "_io.py", "_loop.py", "_values.py"]
    assert sorted(p.name for p in SRC.glob("*controller*.py")) == []


def test_the_controller_s_modules_say_what_they_are_for() -> None:
    for path in sorted((SRC / "controller").glob("*.py")):
        assert ast.get_docstring(ast.parse(path.read_text())), path.name


def test_the_registry_keeps_every_public_name() -> None:
    assert sorted(psij.registry.__all__) == sorted(REGISTRY_NAMES)


@pytest.mark.parametrize("name", REGISTRY_NAMES + REGISTRY_USED)
def test_a_registry_name_is_the_object_its_defining_module_holds(name: str) -> None:
    value = getattr(psij.registry, name)
    module = getattr(value, "__module__", "psij.registry")
    assert getattr(sys.modules[module], name) is value
    namespace: Dict[str, Any] = {}
    exec(f"from psij.registry import {name} as imported", namespace)
    assert namespace["imported"] is value


def test_the_registry_s_private_parts_are_one_package_that_imports_nothing_at_its_top() -> None:
    package = SRC / "_registry"
    assert sorted(p.name for p in package.glob("*.py")) == [
        "__init__.py", "accounting.py", "durable.py", "held.py", "recorder.py",
        "run_records.py", "runs.py", "store.py"]
    assert sorted(p.name for p in SRC.glob("*registry*.py")) == ["registry.py"]
    init = ast.parse((package / "__init__.py").read_text())
    assert ast.get_docstring(init)
    assert [node for node in ast.walk(init) if isinstance(node, (ast.Import, ast.ImportFrom))] == []
    for path in sorted(package.glob("*.py")):
        assert ast.get_docstring(ast.parse(path.read_text())), path.name


def test_a_job_s_first_status_loads_the_recorder_but_neither_the_registry_nor_sqlite(
        tmp_path: Path) -> None:
    loaded = run_fresh(
        "import json, sys\n"
        "import psij.job_executor, psij.executors.local\n"
        "import psij._registry.recorder\n"
        "print(json.dumps([m in sys.modules for m in ('psij.registry', 'sqlite3')]))\n",
        tmp_path)
    assert loaded == [False, False]


def test_no_module_of_psij_is_past_700_lines() -> None:
    long: List[str] = [str(path.relative_to(SRC)) for path in sorted(SRC.rglob("*.py"))
                       if len(path.read_text().splitlines()) > 700]
    assert long == []


# The local and pilot executors' parts take what they need as arguments: none imports the
# executor class's module (not even for type checkers), so none can call back into it.
EXECUTOR_MODULES = {"local": ("psij.executors.local._executor", "psij.executors.local"),
                    "pilot": ("psij.executors.pilot.executor",)}


def _imported_names(path: Path) -> List[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names


@pytest.mark.parametrize("family", sorted(EXECUTOR_MODULES))
def test_no_part_of_the_local_or_pilot_executor_imports_its_executor(family: str) -> None:
    executor = EXECUTOR_MODULES[family]
    folder = SRC / "executors" / family
    parts = [p for p in sorted(folder.rglob("*.py"))
             if p.name != "__init__.py" and f"psij.executors.{family}.{p.stem}" not in executor]
    assert len(parts) >= 10
    offenders = {p.relative_to(SRC).as_posix(): names for p in parts
                 if (names := [n for n in _imported_names(p) if n in executor])}
    assert not offenders
    # The check sees such an import when there is one.
    assert _imported_names(SRC / "executors" / "local" / "__init__.py").count(
        "psij.executors.local._executor") == 2
