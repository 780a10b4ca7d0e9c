"""An elastic pilot's allocation policy: defaults, accepted values, and hostile values refused
with an error that names the field."""

from datetime import timedelta
from typing import Any, Dict

import pytest

from psij import JobExecutorConfig
from psij.executors.pilot.allocation_policy import AllocationPolicy


def test_defaults() -> None:
    policy = AllocationPolicy("slurm")
    assert (policy.executor, policy.nodes, policy.cores_per_node, policy.gpus_per_node) == \
        ("slurm", 1, None, 0)
    assert (policy.duration, policy.idle_timeout, policy.retry_delay) == (3600.0, 300.0, 5.0)
    assert (policy.max_allocations, policy.min_allocations, policy.backlog_per_allocation,
            policy.max_failures) == (1, 0, 1, 3)
    assert policy.queue is None and policy.account is None and policy.custom_attributes == {}


def test_values_are_kept() -> None:
    config = JobExecutorConfig()
    policy = AllocationPolicy(
        "batch-test", executor_url="x", executor_config=config, nodes=2, cores_per_node=8,
        gpus_per_node=4, duration=timedelta(minutes=30), queue="debug", account=1234,
        custom_attributes={"slurm.constraint": "gpu", "n": 3, "f": 1.5, "b": True},
        max_allocations=4, min_allocations=1, backlog_per_allocation=100,
        idle_timeout=timedelta(seconds=90), max_failures=5, retry_delay=0)
    assert policy.executor_config is config
    assert policy.duration == 1800.0 and policy.idle_timeout == 90.0
    assert policy.account == "1234"  # a number as a name, as a scheduler reads it
    assert policy.custom_attributes == {"slurm.constraint": "gpu", "n": 3, "f": 1.5,
                                        "b": True}
    shown = policy.to_json()
    assert "executor_config" not in shown and shown["max_allocations"] == 4
    assert "AllocationPolicy(" in repr(policy)


def test_the_custom_attributes_are_a_copy() -> None:
    given: Dict[str, Any] = {"a": "1"}
    policy = AllocationPolicy("local", custom_attributes=given)
    given["a"] = "2"
    assert policy.custom_attributes == {"a": "1"}


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(("field", "value", "error"), [
    ("executor", "", ValueError), ("executor", "sl urm", ValueError),
    ("executor", "slurm\n", ValueError), ("executor", "../x", ValueError),
    ("executor", None, TypeError), ("executor", 3, TypeError),
    ("executor", "x" * 200, ValueError),
    ("executor_url", 5, TypeError), ("executor_url", "a\x00b", ValueError),
    ("executor_url", "\ud800", ValueError),
    ("executor_config", "slurm", TypeError),
    ("nodes", 0, ValueError), ("nodes", -1, ValueError), ("nodes", 10 ** 30, ValueError),
    ("nodes", True, TypeError), ("nodes", 1.0, TypeError), ("nodes", "2", TypeError),
    ("cores_per_node", 0, ValueError), ("cores_per_node", NAN, TypeError),
    ("gpus_per_node", -1, ValueError), ("gpus_per_node", INF, TypeError),
    ("duration", 0, ValueError), ("duration", -5, ValueError), ("duration", NAN, ValueError),
    ("duration", INF, ValueError), ("duration", 1e300, ValueError),
    ("duration", "1h", TypeError), ("duration", True, TypeError),
    ("queue", "", ValueError), ("queue", " ", ValueError), ("queue", "a\nb", ValueError),
    ("queue", "a\rb", ValueError), ("queue", "a\x00b", ValueError),
    ("queue", "\ud800x", ValueError), ("queue", 1.5, TypeError),
    ("account", "x\n#SBATCH --qos=high", ValueError),
    ("custom_attributes", "a=b", TypeError), ("custom_attributes", [("a", "b")], TypeError),
    ("custom_attributes", {1: "b"}, TypeError), ("custom_attributes", {"": "b"}, ValueError),
    ("custom_attributes", {"a\nb": "c"}, ValueError),
    ("custom_attributes", {"a": "b\nc"}, ValueError),
    ("custom_attributes", {"a": "\ud800"}, ValueError),
    ("custom_attributes", {"\ud800": "a"}, ValueError),
    ("custom_attributes", {"a": NAN}, ValueError),
    ("custom_attributes", {"a": INF}, ValueError),
    ("custom_attributes", {"a": None}, TypeError),
    ("custom_attributes", {"a": ["b"]}, TypeError),
    ("max_allocations", 0, ValueError), ("max_allocations", -3, ValueError),
    ("max_allocations", 10 ** 9, ValueError), ("max_allocations", None, TypeError),
    ("min_allocations", -1, ValueError),
    ("backlog_per_allocation", 0, ValueError), ("backlog_per_allocation", 0.5, TypeError),
    ("idle_timeout", -1, ValueError), ("idle_timeout", 0, ValueError),
    ("idle_timeout", NAN, ValueError),
    ("idle_timeout", INF, ValueError), ("idle_timeout", None, TypeError),
    ("max_failures", 0, ValueError), ("max_failures", 10 ** 6, ValueError),
    ("max_failures", False, TypeError),
    ("retry_delay", -0.1, ValueError), ("retry_delay", NAN, ValueError),
])
def test_hostile_values_are_refused_naming_the_field(field: str, value: Any,
                                                     error: type) -> None:
    kwargs: Dict[str, Any] = {field: value}
    executor = kwargs.pop("executor", "slurm")
    with pytest.raises(error, match=f"AllocationPolicy.{field}"):
        AllocationPolicy(executor, **kwargs)


def test_the_minimum_cannot_exceed_the_maximum() -> None:
    AllocationPolicy("local", min_allocations=2, max_allocations=2)
    with pytest.raises(ValueError, match=r"min_allocations: 3 is more than max_allocations"):
        AllocationPolicy("local", min_allocations=3, max_allocations=2)


def test_fields_are_keywords_only() -> None:
    with pytest.raises(TypeError):
        AllocationPolicy("local", 2)  # type: ignore[misc]


def test_from_json_takes_the_fields_and_refuses_others() -> None:
    policy = AllocationPolicy.from_json({"executor": "slurm", "nodes": 2, "queue": "debug",
                                         "idle_timeout": 60, "max_allocations": 3})
    assert (policy.executor, policy.nodes, policy.queue, policy.max_allocations) == \
        ("slurm", 2, "debug", 3)
    assert AllocationPolicy.from_json(policy.to_json()).to_json() == policy.to_json()
    with pytest.raises(ValueError, match=r"policy.json: unknown field 'executor_config'"):
        AllocationPolicy.from_json({"executor": "local", "executor_config": {}},
                                   "policy.json")
    with pytest.raises(ValueError, match="'executor' is needed"):
        AllocationPolicy.from_json({"nodes": 1})
    with pytest.raises(TypeError, match="a JSON object"):
        AllocationPolicy.from_json(["local"])
    with pytest.raises(ValueError, match="AllocationPolicy.nodes"):
        AllocationPolicy.from_json({"executor": "local", "nodes": -1})
