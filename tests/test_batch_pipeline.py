"""A batch submission is a pipeline: check -> context -> render -> submit -> track, each step a
module that takes what the step before gave and never calls back into the executor.

The modules of the steps (and of arrays and held jobs, which run the same steps) import nothing
of the executor, not even for type checking, and take no executor; one submission enters each
step's module once, from the executor, and calls back into the executor's modules only through
the hooks resolved into the steps' inputs (a backend's overrides, the track step given to
arrays)."""

import ast
import re
import sys
from pathlib import Path
from types import FrameType
from typing import Any, Dict, List, Optional, Set, Tuple

import psij
from psij import Job, JobExecutorConfig, JobSpec
from psij.executors.batch import _arrays, _script_check, _script_context, _submit_io
from psij.executors.batch._batch_config import BatchSchedulerExecutorConfig
from psij.executors.batch._runner import FakeCommandRunner

SRC = Path(psij.__file__).parent
BATCH = SRC / "executors/batch"
STEP_FILES = [BATCH / "_script_context.py", BATCH / "_script_check.py",
              BATCH / "_site_directives.py", BATCH / "_submit_io.py", BATCH / "_arrays.py",
              BATCH / "_held_jobs.py", BATCH / "_poller.py",
              *sorted((SRC / "_scripts").glob("*.py"))]
EXECUTOR_MODULES = {"psij.executors.batch.batch_scheduler_executor",
                    "psij.executors.batch._script_steps", "psij.executors.batch.batch_test",
                    "psij.executors.batch.slurm"}
# Entered from the executor once per submission: check, context, render, submit, track.
STEP_MODULES = {_script_check.__name__, _script_context.__name__, "psij._scripts.generator",
                _submit_io.__name__, "psij.executors.batch._poller"}
# The executor's methods a step may call: the hooks resolved into its inputs.
HOOKS = {"get_submit_command", "get_submit_stdin", "job_id_from_submit_output",
         "_direct_submit", "_run", "_track"}
FORBIDDEN = ("batch_scheduler_executor", "_script_steps", "psij.executors.batch.slurm",
             "psij.executors.batch.sge", "psij.executors.batch.pbs")
EXECUTOR_TYPE = re.compile(r"\b(JobExecutor|\w*SchedulerExecutor|\w+JobExecutor|ScriptSteps)\b")


def imports(tree: ast.AST) -> List[str]:
    names: List[str] = []
    for node in ast.walk(tree):  # under TYPE_CHECKING too
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names += [node.module or ""] + [alias.name for alias in node.names]
    return names


def test_step_modules_import_nothing_of_the_executor() -> None:
    bad = [f"{path.name}: {name}" for path in STEP_FILES
           for name in imports(ast.parse(path.read_text()))
           if any(word in name for word in FORBIDDEN)]
    assert bad == []


def test_steps_take_no_executor() -> None:
    bad = []
    for path in STEP_FILES:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for arg in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs):
                note = ast.unparse(arg.annotation) if arg.annotation is not None else ""
                if arg.arg in ("executor", "ex") or EXECUTOR_TYPE.search(note):
                    bad.append(f"{path.name}: {node.name}({arg.arg})")
    assert bad == []


def test_the_steps_name_no_private_member_of_the_executor() -> None:
    # What they used to call back: now each comes in their inputs.
    words = re.compile(r"\b(executor|ex)\.(_\w+|work_directory|batch_config|SCRIPT_\w+)")
    bad = [f"{path.name}: {m.group(0)}" for path in STEP_FILES
           for m in words.finditer(path.read_text())]
    assert bad == []


def module_of(frame: Optional[FrameType]) -> str:
    return "" if frame is None else str(frame.f_globals.get("__name__", ""))


class Entries:
    """Counts the calls from the executor's modules into the steps' modules, and records
    every call from inside a step back into the executor's modules but the hooks."""

    def __init__(self, steps: Set[str]) -> None:
        self.steps = steps
        self.entries: Dict[str, int] = {}
        self.back: List[Tuple[str, str]] = []
        self._inside: List[FrameType] = []  # the frames of the step and the hook being run

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        inside = self._inside
        if event == "return" and inside and frame is inside[-1]:
            inside.pop()
            return
        if event != "call":
            return
        callee, caller = module_of(frame), module_of(frame.f_back)
        if len(inside) == 1:  # in a step, not in a hook it called
            if callee in EXECUTOR_MODULES:
                if frame.f_code.co_name in HOOKS:
                    inside.append(frame)
                else:
                    self.back.append((callee, frame.f_code.co_name))
        elif not inside and callee in self.steps and caller in EXECUTOR_MODULES:
            self.entries[callee] = self.entries.get(callee, 0) + 1
            inside.append(frame)

    def run(self, call: Any, *args: Any) -> None:
        sys.setprofile(self)
        try:
            call(*args)
        finally:
            sys.setprofile(None)


def test_one_submit_enters_each_step_once_and_never_calls_back(tmp_path: Path) -> None:
    ex = psij.JobExecutor.get_instance("batch-test",
                                       config=JobExecutorConfig(work_directory=tmp_path))
    first = Job(JobSpec(executable="/bin/true", directory=str(tmp_path)))
    ex.submit(first)  # the poller and the inputs made before
    job = Job(JobSpec(executable="/bin/true", directory=str(tmp_path),
                      environment={"A": "x y"}))
    seen = Entries(STEP_MODULES)
    try:
        seen.run(ex.submit, job)
        assert seen.entries == dict.fromkeys(STEP_MODULES, 1)
        assert seen.back == []
        assert job.native_id is not None
    finally:
        for j in (first, job):
            ex.cancel(j)
        ex.close()


def test_submit_many_enters_the_array_step_once_and_never_calls_back(tmp_path: Path) -> None:
    config = BatchSchedulerExecutorConfig(work_directory=tmp_path, queue_polling_interval=3600,
                                          initial_queue_polling_delay=3600)
    ex = psij.JobExecutor.get_instance("slurm", config=config)
    ex._runner = FakeCommandRunner(  # type: ignore[attr-defined]
        lambda argv, stdin: (0, "77;c\n") if argv[0] == "sbatch" else (0, ""))
    ex.submit(Job(JobSpec("/bin/true")))
    jobs = [Job(JobSpec("/bin/echo", [str(i)], environment={"I": str(i)})) for i in range(3)]
    seen = Entries({_arrays.__name__})
    try:
        seen.run(ex.submit_many, jobs)
        assert seen.entries == {_arrays.__name__: 1}
        assert seen.back == []
        assert [j.native_id for j in jobs] == ["77_0", "77_1", "77_2"]
    finally:
        ex.close()
