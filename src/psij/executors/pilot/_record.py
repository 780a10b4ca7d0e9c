"""Small immutable value classes for the pilot, cheap to define and to build.

The pilot's descriptions (nodes, requests, shapes, placements, task specifications, events)
are values: compared and hashed by their fields, never changed after construction. A
``Record`` subclass lists its fields in ``_fields`` and its storage in ``__slots__``; its own
``__init__`` takes the fields in that order, checks them and stores them with
``object.__setattr__`` (with any value derived from them, in slots of its own). Defining such a
class costs a plain class statement, where generated classes would cost code generation at
import on every start of the pilot.

It holds no domain logic and must not import anything of the pilot.
"""

from operator import attrgetter
from types import MappingProxyType
from typing import Any, Dict, Tuple, TypeVar

__all__ = ["Record", "replace"]

_R = TypeVar("_R", bound="Record")


class Record:
    """An immutable value: equal to another of the same class with equal ``_fields``."""

    __slots__ = ()
    _fields: Tuple[str, ...] = ()
    # The fields' values as one tuple, for comparing and hashing; an attrgetter is no
    # descriptor, so ``self._values(self)`` calls it unbound.
    _values: Any = None

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        fields = cls._fields
        if fields:
            # Two names at least, so that the getter always returns a tuple.
            cls._values = attrgetter(*fields) if len(fields) > 1 \
                else attrgetter(fields[0], fields[0])

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable: cannot delete {name!r}")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return bool(self._values(self) == self._values(other))

    def __ne__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return bool(self._values(self) != self._values(other))

    def __hash__(self) -> int:
        return hash(self._values(self))

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__name__}({shown})"

    def __reduce__(self) -> Tuple[Any, ...]:
        # Built again through ``__init__``, so that derived values (cached hashes of strings
        # among them) are computed afresh wherever the copy is made.
        # Read-only mappings are given as plain ones, which every constructor accepts.
        values = (getattr(self, name) for name in self._fields)
        return (type(self), tuple(dict(v) if isinstance(v, MappingProxyType) else v
                                  for v in values))

    def as_dict(self) -> Dict[str, Any]:
        """The fields by name (values as they are, not converted)."""
        return {name: getattr(self, name) for name in self._fields}


def replace(record: _R, **changes: Any) -> _R:
    """A copy of ``record`` with some fields changed, checked again by the class."""
    for name in changes:
        if name not in record._fields:
            raise TypeError(f"{type(record).__name__}: no field {name!r}; fields: "
                            f"{', '.join(record._fields)}")
    values = record.as_dict()
    values.update(changes)
    return type(record)(**values)

