"""One value idiom across psij: every immutable value is a :class:`psij._record.Record`.

Checks the rule over the whole package tree, then the batch layer's values (once frozen
dataclasses): construction by position and by keyword, equality, hashing, immutability,
``replace``, copies, and the validation of :class:`Settings`.
"""

import ast
import copy
import importlib
import json
import pickle
import pkgutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any, List, Tuple

import pytest

import psij
import psij.executors.batch._tracking as tr
from psij._record import Record, replace
from psij.executors._staging import StagingReport
from psij.executors.batch._final_state import Seen
from psij.executors.batch._runner import CommandResult
from psij.executors.batch._site_directives import PLAIN_QUOTED, QUOTED_EXTRA, DirectiveRules
from psij.job_state import JobState

SRC = Path(psij.__file__).parent


def _frozen_dataclasses(path: Path) -> List[str]:
    """The classes of a source file decorated with ``dataclass(..., frozen=True)``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.ClassDef):
            continue
        for decorator in node.decorator_list:
            if isinstance(decorator, ast.Call) and any(
                    k.arg == "frozen" and isinstance(k.value, ast.Constant) and k.value.value
                    for k in decorator.keywords):
                found.append(f"{path.relative_to(SRC)}: {node.name}")
    return found


def test_no_module_of_psij_defines_a_frozen_dataclass() -> None:
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 50
    assert [name for path in files for name in _frozen_dataclasses(path)] == []


def test_every_class_with_fields_is_a_record() -> None:
    values: List[type] = []
    others: List[str] = []
    for info in pkgutil.walk_packages(psij.__path__, "psij."):
        if info.name == "psij.__main__":  # runs the command line
            continue
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if isinstance(obj, type) and obj.__module__ == info.name and "_fields" in dir(obj):
                if issubclass(obj, Record):
                    values.append(obj)
                else:
                    others.append(f"{info.name}.{obj.__name__}")
    # The one exception: the pilot's wire message to its agents (plain JSON fields, a mutable
    # dict and list inside, unhashable), left as it is while the pilot package is not changed.
    assert others == ["psij.executors.pilot._task_process.Launch"]
    names = {cls.__name__ for cls in values}
    assert {"Observation", "TrackerState", "Settings", "CommandResult", "DirectiveRules",
            "Seen", "StagingReport", "Transition", "NodeSpec"} <= names
    for cls in values:
        # Each value is slotted all the way down: no instance dictionary to change.
        assert "__dict__" not in dir(cls), cls.__name__


def test_the_batch_layer_no_longer_imports_dataclasses(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c",
         "import sys, json\n"
         "import psij.executors.batch.slurm, psij.executors.batch.batch_test\n"
         "import psij.executors.batch._final_state\n"
         "print(json.dumps('dataclasses' in sys.modules))\n"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) is False


OBS = tr.Observation(JobState.ACTIVE, "running", None, MappingProxyType({"native_state": "R"}))
JOBS = MappingProxyType({"1": tr.TrackedJob("1", JobState.ACTIVE)})

# (built by position, built by keyword, a value differing in one field)
SAMPLES: List[Tuple[Any, Any, Any]] = [
    (tr.Observation(JobState.FAILED, "m", 3),
     tr.Observation(exit_code=3, message="m", state=JobState.FAILED),
     tr.Observation(JobState.FAILED, "m", 4)),
    (tr.Settings(10.0, 1.0, 2, 60.0, 30.0, 3, 0.5),
     tr.Settings(interval=10.0, initial_delay=1.0, error_threshold=2, outage_tolerance=60.0,
              max_backoff=30.0, missing_grace=3, cancel_poll_delay=0.5),
     tr.Settings(10.0, 1.0, 2, 60.0, 30.0, 4, 0.5)),
    (tr.TrackedJob("1", JobState.QUEUED, True, 2),
     tr.TrackedJob(native_id="1", state=JobState.QUEUED, cancel_requested=True, misses=2),
     tr.TrackedJob("1", JobState.QUEUED, True, 1)),
    (tr.TrackerState(JOBS, tr.Phase.WAITING, 5.0, ("1",), None, 1, 2.0),
     tr.TrackerState(jobs=JOBS, phase=tr.Phase.WAITING, next_poll_at=5.0, in_flight=("1",),
                  failures=1, outage_since=2.0),
     tr.TrackerState(JOBS, tr.Phase.POLLING, 5.0, ("1",), None, 1, 2.0)),
    (tr.JobAdded("1", JobState.ACTIVE, True),
     tr.JobAdded(poll_soon=True, native_id="1", state=JobState.ACTIVE), tr.JobAdded("1")),
    (tr.Tick(), tr.Tick(), None),
    (tr.PollSucceeded({"1": OBS}), tr.PollSucceeded(observations={"1": OBS}),
     tr.PollSucceeded({})),
    (tr.MissingResolved({"1": OBS}), tr.MissingResolved(found={"1": OBS}),
     tr.MissingResolved({})),
    (tr.PollFailed("boom"), tr.PollFailed(error="boom"), tr.PollFailed("bang")),
    (tr.CancelAsked("1"), tr.CancelAsked(native_id="1"), tr.CancelAsked("2")),
    (tr.CancelFailed("1"), tr.CancelFailed(native_id="1"), tr.CancelFailed("2")),
    (tr.RunStatusCommand(("1", "2")), tr.RunStatusCommand(native_ids=("1", "2")),
     tr.RunStatusCommand(("1",))),
    (tr.ResolveMissing(("1",)), tr.ResolveMissing(native_ids=("1",)),
     tr.ResolveMissing(("2",))),
    (tr.ReportState("1", OBS), tr.ReportState(observation=OBS, native_id="1"),
     tr.ReportState("1", tr.Observation(JobState.ACTIVE))),
    (tr.Finish("1", OBS, False), tr.Finish("1", OBS, cancel_requested=False),
     tr.Finish("1", OBS, True)),
    (CommandResult(("squeue",), 0, "out", "err", None),
     CommandResult(argv=("squeue",), exit_code=0, stdout="out", stderr="err"),
     CommandResult(("squeue",), 1, "out", "err")),
    (DirectiveRules(True, QUOTED_EXTRA), PLAIN_QUOTED, DirectiveRules(True)),
    (Seen("1", OBS, False, 0, timedelta(minutes=5), None, "tail"),
     Seen(native_id="1", observation=OBS, cancel_requested=False, exit_code=0,
          time_limit=timedelta(minutes=5), stderr_tail="tail"),
     Seen("1", OBS, True, 0, timedelta(minutes=5), None, "tail")),
    (StagingReport("in", None, ["x"], 0), StagingReport(stage_in_error="in", stage_out_error=None,
                                                        cleanup_errors=["x"], job_exit=0),
     StagingReport("in", None, [], 0)),
]


def _ids(sample: Tuple[Any, Any, Any]) -> str:
    return type(sample[0]).__name__


@pytest.mark.parametrize("value, same, other", SAMPLES, ids=[_ids(s) for s in SAMPLES])
def test_values_equal_by_fields_built_either_way(value: Any, same: Any, other: Any) -> None:
    assert isinstance(value, Record)
    assert value == same and not value != same
    assert value != other and not value == other
    for name in type(value)._fields:
        assert getattr(value, name) == getattr(same, name)
    # Equal only to a value of its own class: not to the tuple of its fields.
    assert value != tuple(getattr(value, name) for name in type(value)._fields)


@pytest.mark.parametrize("value, same, other", SAMPLES, ids=[_ids(s) for s in SAMPLES])
def test_hashable_values_hash_by_fields(value: Any, same: Any, other: Any) -> None:
    try:
        hash(tuple(getattr(value, name) for name in type(value)._fields))
    except TypeError:
        # A mutable or read-only mapping (or a list) among the fields: no hash, as before.
        with pytest.raises(TypeError):
            hash(value)
        return
    assert hash(value) == hash(same)
    assert len({value, same}) == 1


@pytest.mark.parametrize("value, same, other", SAMPLES, ids=[_ids(s) for s in SAMPLES])
def test_values_cannot_be_changed_and_copy_as_equals(value: Any, same: Any, other: Any
                                                     ) -> None:
    cls = type(value).__name__
    name = (type(value)._fields or ("anything",))[0]
    with pytest.raises(AttributeError, match=f"{cls} is immutable: cannot set '{name}'"):
        setattr(value, name, None)
    with pytest.raises(AttributeError, match="immutable"):
        delattr(value, name)
    with pytest.raises(AttributeError):
        value.not_a_field = 1
    for made in (copy.copy(value), copy.deepcopy(value), pickle.loads(pickle.dumps(value))):
        assert made == value and type(made) is type(value)


def test_defaults_are_the_shared_empty_mapping_and_the_old_values() -> None:
    assert tr.Observation(JobState.QUEUED).metadata is tr.Observation(JobState.ACTIVE).metadata
    assert tr.TrackerState().jobs is tr.Observation(JobState.QUEUED).metadata
    assert isinstance(tr.TrackerState().jobs, MappingProxyType) and tr.TrackerState().jobs == {}
    assert tr.TrackerState().as_dict() == {
        "jobs": {}, "phase": tr.Phase.IDLE, "next_poll_at": None, "in_flight": (),
        "requested_poll_at": None, "failures": 0, "outage_since": None,
        "hurried": frozenset(), "next_hurry_at": None}
    assert tr.Settings().as_dict() == {
        "interval": 30.0, "initial_delay": 2.0, "error_threshold": 2, "outage_tolerance": 300.0,
        "max_backoff": 120.0, "missing_grace": 3, "cancel_poll_delay": 1.0,
        "fail_unstartable": False}
    assert (tr.JobAdded("1").state, tr.JobAdded("1").poll_soon) == (JobState.QUEUED, False)
    assert CommandResult(("x",), None).as_dict() == {
        "argv": ("x",), "exit_code": None, "stdout": "", "stderr": "", "failure": None}
    assert Seen("1", OBS, False).as_dict() == {
        "native_id": "1", "observation": OBS, "cancel_requested": False, "exit_code": None,
        "time_limit": None, "launcher_failure": None, "stderr_tail": None}
    with pytest.raises(TypeError):
        tr.Tick(1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        CommandResult(("x",))  # type: ignore[call-arg]


def test_repr_is_the_class_and_every_field_by_name() -> None:
    assert repr(CommandResult(("a",), 0)) == \
        "CommandResult(argv=('a',), exit_code=0, stdout='', stderr='', failure=None)"
    assert repr(tr.Tick()) == "Tick()"
    assert repr(DirectiveRules(False)) == "DirectiveRules(plain=False, extra=None)"


def test_replace_builds_a_checked_copy() -> None:
    state = tr.TrackerState()
    moved = replace(state, phase=tr.Phase.WAITING, next_poll_at=3.0)
    assert (moved.phase, moved.next_poll_at, moved.jobs) == (tr.Phase.WAITING, 3.0, {})
    assert state == tr.TrackerState() and type(moved) is tr.TrackerState
    assert replace(OBS, message="m") == tr.Observation(JobState.ACTIVE, "m", None, OBS.metadata)
    with pytest.raises(TypeError, match="TrackerState: no field 'phsae'"):
        replace(state, phsae=tr.Phase.WAITING)
    with pytest.raises(ValueError, match="Settings.interval: must be positive, got 0"):
        replace(tr.Settings(), interval=0)


@pytest.mark.parametrize("field, bad, words", [
    ("interval", 0, "must be positive"),
    ("interval", -1.5, "must be positive"),
    ("max_backoff", 0.0, "must be positive"),
    ("initial_delay", -1, "must not be negative"),
    ("outage_tolerance", -0.1, "must not be negative"),
    ("cancel_poll_delay", float("-inf"), "must not be negative"),
    ("error_threshold", -1, "must not be negative"),
    ("missing_grace", -3, "must not be negative"),
])
def test_settings_refuse_bad_values_naming_the_field(field: str, bad: float, words: str
                                                     ) -> None:
    with pytest.raises(ValueError, match=f"^Settings.{field}: {words}, got {bad}$"):
        tr.Settings(**{field: bad})  # type: ignore[arg-type]
    positional = list(tr.Settings().as_dict().values())
    positional[tr.Settings._fields.index(field)] = bad
    with pytest.raises(ValueError, match=f"^Settings.{field}: {words}, got {bad}$"):
        tr.Settings(*positional)


def test_settings_accept_their_limits() -> None:
    edge = tr.Settings(interval=1e-9, initial_delay=0, error_threshold=0, outage_tolerance=0,
                    max_backoff=float("inf"), missing_grace=0, cancel_poll_delay=0)
    assert edge.max_backoff == float("inf") and edge.missing_grace == 0


# ----------------------------------------------------------- the __init__ a Record is given


def test_a_record_without_init_takes_its_fields_by_position_or_name() -> None:
    from psij._record import Record

    class Pair(Record):
        _fields = ("left", "right")
        __slots__ = _fields
        left: int
        right: str

    assert Pair(1, "a") == Pair(right="a", left=1)
    assert (Pair(1, "a").left, Pair(1, "a").right) == (1, "a")
    with pytest.raises(TypeError, match="right"):
        Pair(1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Pair(1, "a", 2)  # type: ignore[call-arg]
    with pytest.raises(AttributeError, match="immutable"):
        Pair(1, "a").left = 2  # type: ignore[misc]


def test_each_subclass_gets_an_init_of_its_own_fields() -> None:
    from psij._record import Record

    class One(Record):
        _fields = ("a",)
        __slots__ = _fields
        a: int

    class Two(One):
        _fields = ("a", "b")
        __slots__ = ("b",)
        b: int

    assert One(1).a == 1  # One's __init__ is made first; Two must not inherit it
    two = Two(1, 2)
    assert (two.a, two.b) == (1, 2)
    assert One(a=3) != Two(3, 0)


def test_a_record_with_derived_slots_must_write_its_init() -> None:
    from psij._record import Record

    class Derived(Record):
        _fields = ("a",)
        __slots__ = ("_double", "a")
        a: int

    with pytest.raises(TypeError, match="must define __init__"):
        Derived(1)
