"""A job's priority: the ``psij.priority`` custom attribute (``pilot.priority`` as well).

A priority is a finite number (int or float); a higher one goes first, equal ones go by
arrival. ``psij.priority`` wins when both attributes are set; a job without either has
priority 0. Anything else (a bool, a string, NaN, an infinity) is refused with an error naming
the attribute. The executors that honour it: ``pilot``, ``local`` with a resource pool
(``LocalJobExecutorConfig(resource_pool=...)``, also what batch executors' ``fallback="local"``
uses), and every batch executor (the order of submission of the jobs it holds with
``max_queued_per_shape``, and the scheduler's own priority with ``use_nice``).
"""

import math
from typing import Any, Optional, Union

from psij.exceptions import InvalidJobException

__all__ = ["ATTRIBUTE", "LEGACY_ATTRIBUTE", "job_priority", "priority_value"]

ATTRIBUTE = "psij.priority"
LEGACY_ATTRIBUTE = "pilot.priority"

Priority = Union[int, float]


def priority_value(field: str, value: Any) -> Priority:
    """``value`` as a priority, or InvalidJobException naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidJobException(f"custom attribute {field}: expected a number (int or "
                                  f"float; higher goes first), got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidJobException(f"custom attribute {field}: expected a finite number, got "
                                  f"{value!r}")
    return value


def job_priority(attributes: Optional[Any]) -> Priority:
    """The priority set in ``attributes`` (a JobAttributes or None); 0 when none is set."""
    if attributes is None:
        return 0
    for name in (ATTRIBUTE, LEGACY_ATTRIBUTE):
        value = attributes.get_custom_attribute(name)
        if value is not None:
            return priority_value(name, value)
    return 0
