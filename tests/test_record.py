"""One value idiom across psij: every immutable value is a :class:`psij._record.Record`, each
of its fields named once, in its annotation.

Checks the rule over the whole package tree (with ``ast``: no Record writes ``_fields``,
``__slots__`` or, but the allowed conversions, ``__init__``), the base's behaviour (defaults,
field order with inheritance, ClassVar, derived slots, ``_validate``, pickling, ``replace``),
then the batch layer's values (once frozen dataclasses): construction by position and by
keyword, equality, hashing, immutability, ``replace``, copies, and the validation of
:class:`Settings`.
"""

import ast
import copy
import importlib
import inspect
import json
import pickle
import pkgutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, Dict, List, Tuple

import pytest

import psij
import psij.executors.batch._tracking as tr
from psij._record import Record, derived, replace
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
        "fail_unstartable": False, "confirm_delay": 1.0}
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
    class Pair(Record):
        left: int
        right: str

    assert Pair._fields == ("left", "right") and Pair.__slots__ == ("left", "right")
    assert Pair(1, "a") == Pair(right="a", left=1)
    assert (Pair(1, "a").left, Pair(1, "a").right) == (1, "a")
    with pytest.raises(TypeError, match="right"):
        Pair(1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Pair(1, "a", 2)  # type: ignore[call-arg]
    with pytest.raises(AttributeError, match="immutable"):
        Pair(1, "a").left = 2  # type: ignore[misc]
    assert "__dict__" not in dir(Pair)
    # Documentation tools read the fields from the signature, before any value is built.

    class Later(Record):
        first: int
        second: str = "b"

    assert str(inspect.signature(Later)) == "(first: int, second: str = 'b') -> None"
    assert Later(1).second == "b"


def test_defaults_are_given_in_the_body_and_shared() -> None:
    empty: Tuple[str, ...] = ()

    class Job(Record):
        name: str
        tags: Tuple[str, ...] = empty
        tries: int = 3

    assert Job("j") == Job("j", (), 3) == Job(name="j", tries=3)
    assert Job("j").tags is empty and Job("k", tries=1).tries == 1
    # The default left the body: the name is the slot's descriptor.
    assert Job._fields == ("name", "tags", "tries")
    assert type(Job.__dict__["tries"]).__name__ == "member_descriptor"
    assert repr(Job("j")) == "Job(name='j', tags=(), tries=3)"


def test_default_objects_reach_init_as_objects_not_as_source() -> None:
    marker = object()

    class Odd(Record):
        value: Any = marker  # no repr that could be written back as source

    assert Odd().value is marker


def test_each_subclass_gets_an_init_of_its_own_fields_after_its_bases() -> None:
    class One(Record):
        a: int

    class Two(One):
        b: int
        c: str = "c"

    assert One(1).a == 1  # One's __init__ is made first; Two must not inherit it
    two = Two(1, 2)
    assert Two._fields == ("a", "b", "c") and Two.__slots__ == ("b", "c")
    assert (two.a, two.b, two.c) == (1, 2, "c")
    assert One(a=3) != Two(3, 0)


def test_class_vars_and_private_names_are_no_fields() -> None:
    class Counted(Record):
        kinds: ClassVar[Tuple[str, ...]] = ("x", "y")
        _cache: ClassVar[Dict[str, int]] = {}
        n: int

    assert Counted._fields == ("n",) and Counted.__slots__ == ("n",)
    assert Counted.kinds == ("x", "y") and Counted(1).kinds == ("x", "y")


def test_string_annotations_as_postponed_evaluation_writes_them() -> None:
    namespace: Dict[str, Any] = {}
    exec("from __future__ import annotations\n"
         "from typing import ClassVar\n"
         "from psij._record import Record\n"
         "class Later(Record):\n"
         "    shared: ClassVar[int] = 1\n"
         "    first: Undefined\n"
         "    second: int = 2\n", namespace)
    later = namespace["Later"]
    assert later._fields == ("first", "second")
    assert later(1) == later(1, 2) and later.shared == 1


def test_a_field_without_default_after_one_with_is_refused_when_the_class_is_made() -> None:
    with pytest.raises(TypeError, match="Late: field 'b' has no default but follows 'a', "
                                        "which has one"):
        class Late(Record):
            a: int = 0
            b: int

    class Base(Record):
        a: int = 0

    with pytest.raises(TypeError, match="Sub: field 'b' has no default but follows 'a'"):
        class Sub(Base):
            b: int


def test_fields_and_slots_written_by_hand_are_refused() -> None:
    with pytest.raises(TypeError, match="by annotation only, not in _fields"):
        class Old(Record):
            _fields = ("a",)
            a: int
    with pytest.raises(TypeError, match="by annotation only, not in __slots__"):
        class Slotted(Record):
            __slots__ = ("a",)
            a: int
    with pytest.raises(TypeError, match="'a' is already a field"):
        class Base(Record):
            a: int

        class Again(Base):
            a: int


class _Span(Record):
    """A checked value with a converted field and a derived slot (module level: pickled)."""

    low: int
    high: int
    labels: Tuple[str, ...] = ()
    width: int = derived(init=False)

    def _validate(self) -> None:
        if self.high < self.low:
            raise ValueError(f"_Span: high ({self.high}) is less than low ({self.low})")
        if type(self.labels) is not tuple:
            self._set("labels", tuple(self.labels))
        self._set("width", self.high - self.low)


def test_validate_checks_converts_and_sets_derived_slots() -> None:
    span = _Span(1, 4, ["a"])  # type: ignore[arg-type]
    assert span.labels == ("a",) and span.width == 3
    assert _Span._fields == ("low", "high", "labels")
    assert _Span.__slots__ == ("low", "high", "labels", "width")
    with pytest.raises(ValueError, match=r"^_Span: high \(0\) is less than low \(1\)$"):
        _Span(1, 0)
    # Derived: no parameter, not compared, hashed or shown.
    with pytest.raises(TypeError):
        _Span(1, 4, (), 3)  # type: ignore[call-arg]
    assert repr(span) == "_Span(low=1, high=4, labels=('a',))"
    assert hash(span) == hash((1, 4, ("a",)))
    with pytest.raises(AttributeError, match="_Span is immutable: cannot set 'width'"):
        span.width = 0  # type: ignore[misc]


def test_pickle_copy_and_replace_go_through_the_checks() -> None:
    span = _Span(1, 4, ("a",))
    for made in (pickle.loads(pickle.dumps(span)), copy.copy(span), copy.deepcopy(span)):
        assert made == span and made.width == 3
    wider = replace(span, high=9)
    assert (wider.high, wider.width, span.width) == (9, 8, 3)
    with pytest.raises(ValueError, match="is less than low"):
        replace(span, high=0)


@pytest.mark.skipif(sys.version_info < (3, 14), reason="lazy annotations: Python 3.14")
def test_lazy_annotations_are_read_without_evaluating_them() -> None:
    namespace: Dict[str, Any] = {}
    exec("from psij._record import Record\n"
         "class Lazy(Record):\n"
         "    first: Undefined\n"
         "    second: int = 2\n", namespace)
    assert namespace["Lazy"]._fields == ("first", "second")


# --------------------------------------------------------------- the rule, over src/psij

# Record subclasses allowed to write their own ``__init__``: a constructor whose parameters
# are not its fields (a conversion API), with the reason. None today: every conversion fits in
# ``_validate``.
CONVERSION_INITS: Dict[str, str] = {}


def _record_classes() -> List[Tuple[Path, ast.ClassDef]]:
    """Every class of src/psij deriving from Record, directly or through another one."""
    classes = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                classes.append((path, node))
    records = {"Record"}
    found: List[Tuple[Path, ast.ClassDef]] = []
    grown = True
    while grown:
        grown = False
        for path, node in classes:
            if (path, node) in found:
                continue
            if any(ast.unparse(b).rpartition(".")[2] in records for b in node.bases):
                found.append((path, node))
                records.add(node.name)
                grown = True
    return found


def test_every_record_names_each_field_once_in_its_annotation() -> None:
    records = _record_classes()
    assert len(records) > 100
    written = []
    inits = []
    for path, node in records:
        where = f"{path.relative_to(SRC)}: {node.name}"
        for statement in node.body:
            targets: List[ast.expr] = []
            if isinstance(statement, ast.Assign):
                targets = statement.targets
            elif isinstance(statement, ast.AnnAssign):
                targets = [statement.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id in ("_fields", "__slots__"):
                    written.append(f"{where}.{target.id}")
            if isinstance(statement, ast.FunctionDef) and statement.name == "__init__":
                inits.append(node.name)
        assert "self._store(" not in ast.unparse(node), where
    assert written == []
    assert sorted(inits) == sorted(CONVERSION_INITS)
