"""The script steps of a batch submission (``psij.executors.batch._script_steps``): check ->
context -> render are functions of the job and of one ``ScriptInputs``; the modules of those
steps import nothing of the executor, take no executor, and one submission enters each of them
once, never calling back into the executor."""

import ast
import re
import sys
from pathlib import Path
from types import FrameType
from typing import Any, Dict, List, Optional, Tuple

import psij
from psij import Job, JobExecutorConfig, JobSpec
from psij.executors.batch import _script_check, _script_context, _script_steps
from psij.executors.batch._script_context import ScriptInputs

SRC = Path(psij.__file__).parent
STEP_FILES = [SRC / "executors/batch/_script_context.py",
              SRC / "executors/batch/_script_check.py",
              SRC / "executors/batch/_site_directives.py",
              *sorted((SRC / "_scripts").glob("*.py"))]
EXECUTOR_MODULES = {"psij.executors.batch.batch_scheduler_executor",
                    "psij.executors.batch._script_steps",
                    "psij.executors.batch.batch_test"}
# Entered from the executor once per submission: check, context, render.
STEP_MODULES = {_script_check.__name__, _script_context.__name__, "psij._scripts.generator"}
FORBIDDEN = ("batch_scheduler_executor", "_script_steps")
EXECUTOR_TYPE = re.compile(r"\b(JobExecutor|\w*SchedulerExecutor|\w+JobExecutor|ScriptSteps)\b")


def imports(tree: ast.AST) -> List[str]:
    names: List[str] = []
    for node in ast.walk(tree):  # under TYPE_CHECKING too
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names += [node.module or ""] + [alias.name for alias in node.names]
    return names


def test_script_step_modules_import_nothing_of_the_executor() -> None:
    bad = [f"{path.name}: {name}" for path in STEP_FILES
           for name in imports(ast.parse(path.read_text()))
           if any(word in name for word in FORBIDDEN)]
    assert bad == []


def test_script_steps_take_no_executor() -> None:
    bad = []
    for path in STEP_FILES:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for arg in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs):
                note = ast.unparse(arg.annotation) if arg.annotation is not None else ""
                if arg.arg == "executor" or EXECUTOR_TYPE.search(note):
                    bad.append(f"{path.name}: {node.name}({arg.arg})")
    assert bad == []


def test_inputs_are_made_once_per_executor_and_configuration(tmp_path: Path) -> None:
    ex = psij.JobExecutor.get_instance("slurm", config=JobExecutorConfig(work_directory=tmp_path))
    assert isinstance(ex, _script_steps.ScriptSteps)
    inputs = ex._script_inputs()
    assert isinstance(inputs, ScriptInputs)
    assert ex._script_inputs() is inputs
    assert inputs.name_after_script and inputs.directory_directive
    ex.config.use_nice = True  # type: ignore[attr-defined]
    changed = ex._script_inputs()
    assert changed is not inputs and changed.use_nice and changed.nice is not None
    ex.close()


def module_of(frame: Optional[FrameType]) -> str:
    return "" if frame is None else str(frame.f_globals.get("__name__", ""))


def test_one_submit_enters_each_script_step_once_and_never_calls_back(
        tmp_path: Path) -> None:
    ex = psij.JobExecutor.get_instance("batch-test",
                                       config=JobExecutorConfig(work_directory=tmp_path))
    job = Job(JobSpec(executable="/bin/true", directory=str(tmp_path),
                      environment={"A": "x y"}))
    entries: Dict[str, int] = {}
    back: List[Tuple[str, str]] = []
    inside: List[Any] = []  # the frame of the step being run, if any

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "return" and inside and frame is inside[-1]:
            inside.pop()
            return
        if event != "call":
            return
        callee, caller = module_of(frame), module_of(frame.f_back)
        if inside:
            if callee in EXECUTOR_MODULES:
                back.append((callee, frame.f_code.co_name))
        elif callee in STEP_MODULES and caller in EXECUTOR_MODULES:
            entries[callee] = entries.get(callee, 0) + 1
            inside.append(frame)

    sys.setprofile(profile)
    try:
        ex.submit(job)
    finally:
        sys.setprofile(None)
    try:
        assert entries == dict.fromkeys(STEP_MODULES, 1)
        assert back == []
    finally:
        ex.cancel(job)
        ex.close()
