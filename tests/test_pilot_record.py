"""The pilot's immutable value classes: equality, hashing, immutability, copies and replace."""

import copy
import pickle
from typing import Any

import pytest

from psij._record import replace
from psij.executors.pilot.engine import TaskEvent, TaskSpec
from psij.executors.pilot.resources import Amount, NodeSpec, ResourceRequest
from psij.executors.pilot.scheduler import TaskRequest, TaskState, Transition


def test_values_are_equal_by_class_and_fields_and_hash_alike() -> None:
    assert Amount(1, 4) == Amount(1, 4, None) and hash(Amount(1, 4)) == hash(Amount(1, 4))
    assert Amount(1, 4) != Amount(1, 5) and Amount(1, 4) != Amount(1, 4, 2)
    # Same fields, other class: not equal (as with dataclasses), and no tuple either.
    assert Transition("a", TaskState.FAILED) != TaskEvent("a", TaskState.FAILED, 0.0)
    assert Amount(1, 4) != (1, 4, None)
    request = ResourceRequest(Amount.exact(2), custom={"licence": 1})
    again = ResourceRequest(Amount.exact(2), custom={"licence": 1})
    assert request == again and hash(request) == hash(again)
    assert len({request, again, ResourceRequest()}) == 2
    assert NodeSpec("n1", 4, custom={"a": 1}) in {NodeSpec("n1", 4, custom={"a": 1})}


def test_values_cannot_be_changed() -> None:
    spec = TaskSpec("t", "/bin/true", ["x"], environment={"A": "1"})
    with pytest.raises(AttributeError, match="TaskSpec is immutable: cannot set 'name'"):
        spec.name = "u"  # type: ignore[misc]
    with pytest.raises(AttributeError, match="immutable"):
        del spec.executable  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.environment["A"] = "2"  # type: ignore[index]
    assert spec.arguments == ("x",) and spec.environment == {"A": "1"}


def test_replace_checks_the_new_values_and_the_field_names() -> None:
    request = TaskRequest("a", priority=1, after=["b"])
    moved = replace(request, name="c", after=["d"])
    assert (moved.name, moved.priority, moved.after) == ("c", 1, ("d",))
    assert request.name == "a"
    with pytest.raises(TypeError, match="TaskRequest: no field 'nmae'"):
        replace(request, nmae="c")
    with pytest.raises(TypeError, match="TaskRequest.priority"):
        replace(request, priority="high")


@pytest.mark.parametrize("value", [
    Amount(2, None, 4),
    ResourceRequest(Amount(1, 8), cores_per_process=2, custom={"licence": 1}),
    NodeSpec("n1", 4, memory=1 << 30, gpus=2, custom={"a": 1}),
    TaskSpec("t", "/bin/echo", ["a b"], directory="d", environment={"X": "1"},
             resources=ResourceRequest(Amount.exact(2)), after=["s"], time_limit=1.5),
    Transition("a", TaskState.OMITTED, "because"),
])
def test_copies_and_pickles_are_equal_values(value: Any) -> None:
    for made in (copy.copy(value), copy.deepcopy(value), pickle.loads(pickle.dumps(value))):
        assert made == value and type(made) is type(value)
        if type(value).__hash__ is not None and not isinstance(value, TaskSpec):
            assert hash(made) == hash(value)


def test_repr_names_the_class_and_every_field() -> None:
    assert repr(Amount(1, None)) == "Amount(minimum=1, maximum=None, split_into=None)"
    assert repr(Transition("a", TaskState.FAILED)).startswith("Transition(task_id='a', state=")


def test_every_pilot_value_is_a_record_stored_in_slot_order() -> None:
    # One value idiom in the pilot: Record subclasses that store every slot at once, derived
    # ones included; no module keeps its own object.__setattr__ alias.
    import importlib
    import pkgutil
    from pathlib import Path

    import psij.executors.pilot as pilot
    from psij._record import Record
    from psij.executors.pilot.resources import Shape

    folder = Path(pilot.__file__).parent
    for info in pkgutil.walk_packages([str(folder)], "psij.executors.pilot."):
        path = folder.joinpath(*info.name.split(".")[3:])
        text = (path / "__init__.py" if info.ispkg else path.with_suffix(".py")).read_text()
        assert "object.__setattr__" not in text, info.name
        assert "@dataclass" not in text, info.name
        if info.name.rpartition(".")[2] not in ("agent", "service", "run", "executor"):
            importlib.import_module(info.name)

    shape = Shape(2, 4, 1, 2, 1, 4, 3, 0, 0, False, ())
    assert (shape.min_cores, shape.min_node_cores, shape.cores_only) == (6, 3, True)
    assert hash(shape) == hash(Shape(2, 4, 1, 2, 1, 4, 3, 0, 0, False, ()))
    assert issubclass(Shape, Record)


def test_the_constructor_refuses_a_wrong_number_of_values() -> None:
    with pytest.raises(TypeError, match=r"__init__\(\) missing 1 required positional argument"):
        Transition("a")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"__init__\(\) takes from 3 to 4 positional arguments"):
        Transition("a", TaskState.FAILED, None, None)  # type: ignore[call-arg]
