"""What the state machines share: one ``IllegalEvent`` class (``psij._machine``), defined once
and raised by every machine for an event it cannot accept."""

import ast
from pathlib import Path

import pytest

import psij
from psij._machine import IllegalEvent
from psij.executors.batch import _holding, _tracking
from psij.executors.local import _pool_machine as _local_pool

SRC = Path(psij.__file__).resolve().parent


def test_illegal_event_is_defined_once_in_the_whole_package() -> None:
    defined = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        defined += [f"{path.relative_to(SRC)}:{node.lineno}" for node in ast.walk(tree)
                    if isinstance(node, ast.ClassDef) and node.name == "IllegalEvent"]
    assert defined == ["_machine.py:12"]


def test_every_machine_raises_the_one_class() -> None:
    for module in (_local_pool, _holding, _tracking):
        assert module.IllegalEvent is IllegalEvent
    pool = _local_pool.LocalPool(_local_pool.Amounts(1, None, None))
    with pytest.raises(IllegalEvent):
        pool.step(_local_pool.Ended("never-arrived"))
