"""How the pilot package is cut: no module past 700 lines, the QCG-PilotJob file interface in
its own package (``qcg``) that the engine never imports, the names users import still there, one
framing of socket lines, one schema for the journal (written by its line builders, read back by
ReplayPlan)."""

import ast
import importlib
import json
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Set

import pytest

import psij.executors.pilot as pilot
from psij._line_framing import LineFramer, encode_line
from psij.executors.pilot.journal import (
    ReplayPlan,
    cancel_line,
    end_line,
    forget_line,
    read_journal,
    start_line,
    submit_lines,
)

FOLDER = Path(pilot.__file__).parent
QCG = FOLDER / "qcg"
DESCRIPTOR = FOLDER.parents[2] / "psij-descriptors" / "psij_pilot.py"

# The modules of the QCG-PilotJob file interface: ``run`` is what the command line calls.
QCG_MODULES = {"__init__", "_books", "_plan", "_report", "_requests", "_schema", "run"}

# What users import from the pilot (docs/api.rst, docs/pilot.rst) and what the command calls.
PUBLIC_NAMES = ["psij.executors.pilot.executor.PilotJobExecutor",
                "psij.executors.pilot.executor.PilotJobExecutorConfig",
                "psij.executors.pilot.resource_values.NodeSpec",
                "psij.executors.pilot.service.PilotClient",
                "psij.executors.pilot.service.serve_main",
                "psij.executors.pilot.qcg.run.check_request_file",
                "psij.executors.pilot.qcg.run.run_request_file"]


def imported_names(path: Path) -> Set[str]:
    """Every module name ``path`` imports, anywhere in its source (relative ones resolved as if
    the module were a top-level module of the pilot or of its ``qcg`` package)."""
    package = "psij.executors.pilot" + (".qcg" if path.parent == QCG else "")
    found: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def test_no_pilot_module_is_over_700_lines() -> None:
    sizes = {str(p.relative_to(FOLDER)): len(p.read_text().splitlines())
             for p in FOLDER.rglob("*.py")}
    assert "qcg/run.py" in sizes
    assert {name: n for name, n in sizes.items() if n > 700} == {}


def test_the_qcg_package_holds_the_file_interface() -> None:
    assert {p.stem for p in QCG.glob("*.py")} == QCG_MODULES
    assert sorted(p.name for p in FOLDER.glob("qcg*.py")) == []
    for name in ("qcg_books", "qcg_plan", "qcg_report", "qcg_requests", "qcg_run", "qcg_schema"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(f"psij.executors.pilot.{name}")
    for path in QCG.glob("*.py"):
        assert ast.get_docstring(ast.parse(path.read_text())), path.name


def test_the_engine_imports_nothing_of_the_file_interface() -> None:
    # The interface drives the engine; the pilot's own modules never reach back into it.
    for path in FOLDER.glob("*.py"):
        reached = {name for name in imported_names(path)
                   if name == "psij.executors.pilot.qcg"
                   or name.startswith("psij.executors.pilot.qcg.")}
        assert reached == set(), path.name
    # Relative imports are resolved too.
    assert "psij.executors.pilot.engine" in imported_names(QCG / "run.py")


def test_importing_the_qcg_package_loads_none_of_its_modules() -> None:
    code = ("import sys, json, psij.executors.pilot.qcg\n"
            "print(json.dumps(sorted(m for m in sys.modules\n"
            "                        if m.startswith('psij.executors.pilot'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert json.loads(done.stdout) == ["psij.executors.pilot", "psij.executors.pilot.qcg"]


@pytest.mark.parametrize("name", PUBLIC_NAMES)
def test_the_names_users_import_from_the_pilot_stay(name: str) -> None:
    module, _, attribute = name.rpartition(".")
    assert getattr(importlib.import_module(module), attribute) is not None


def test_the_descriptor_names_the_pilot_executor() -> None:
    descriptors = runpy.run_path(str(DESCRIPTOR))["__PSI_J_EXECUTORS__"]
    assert [d.name for d in descriptors] == ["pilot"]
    module, _, cls = descriptors[0].cls.rpartition(".")
    from psij.executors.pilot.executor import PilotJobExecutor

    assert getattr(importlib.import_module(module), cls) is PilotJobExecutor


def test_every_pilot_peer_frames_lines_with_the_one_helper() -> None:
    for name in ("agent.py", "_remote_nodes.py", "service.py", "engine.py"):
        text = (FOLDER / name).read_text()
        assert 'split(b"\\n")' not in text and "separators=" not in text, name
    message = {"op": "exited", "id": "t\u00e9\n", "code": None, "message": "\ud800"}
    line = encode_line(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1 and b" " not in line
    framer = LineFramer()
    assert framer.feed(line[:5]) == []
    assert [json.loads(x) for x in framer.feed(line[5:] + line)] == [message, message]


def test_the_journal_builders_write_what_a_resume_reads(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    tasks = [{"name": "a\"\u00e9", "executable": "/bin/true"},
             {"name": "b", "executable": "/bin/false"},
             {"name": "c", "executable": "/bin/true"}]
    lines = [*submit_lines(tasks), start_line('a"\u00e9', "n1", 4242, "f00d"),
             end_line('a"\u00e9', "SUCCEEDED", 0), start_line("b", "far"),
             end_line("b", "FAILED", None), cancel_line("c"), forget_line("b")]
    path.write_text("".join(lines))
    records = read_journal(path)
    assert len(records) == len(lines)  # every line is one JSON object
    assert records[3] == {"e": "start", "id": 'a"\u00e9', "node": "n1", "pid": 4242,
                          "run": "f00d"}
    assert records[5] == {"e": "start", "id": "b", "node": "far"}
    plan = ReplayPlan(records)
    assert list(plan.submitted) == ['a"\u00e9', "c"]
    assert plan.final == {'a"\u00e9': "SUCCEEDED"}
    assert plan.canceled == {"c"} and plan.leftovers == {}
    unfinished = ReplayPlan(read_journal(path)[:4])
    assert unfinished.leftovers == {'a"\u00e9': (4242, "f00d")}
