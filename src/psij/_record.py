"""The one base of immutable values across psij: :class:`Record`, and :func:`replace`.

Every value of the package (the pilot's nodes, requests, shapes, task specifications and
events; the batch layer's observations, tracker states, events and actions, command results,
directive rules, ...) is a ``Record``: compared and hashed by its fields, never changed after
construction. A subclass lists its fields in ``_fields`` and its storage in ``__slots__`` (the
fields, then any value derived from them); its own ``__init__`` checks the arguments and stores
every slot at once with :meth:`Record._store`, in ``__slots__`` order. The first ``_store`` of
a class makes that class's own: one call of each slot's setter, no loop (a loop over the
setters costs about 200 ns more per value built); classes never built cost nothing.

Why not frozen dataclasses, and why one idiom: defining a dataclass costs code generation at
import (0.5 to 1 ms per class: some 20 ms for the pilot's classes on every start of a pilot,
some 10 ms for the batch layer's), importing :mod:`dataclasses` itself 5 ms more, and building
one costs 1.2 (with ``slots``, Python 3.10+) to 1.6 times a ``Record`` (measured with
``timeit`` and ``python -X importtime``). One base means one set of rules for equality,
hashing, copying, pickling and ``replace`` everywhere; ``tests/test_values.py`` checks that no
module of psij defines a frozen dataclass and that every class with ``_fields`` is a ``Record``
(but the pilot's ``Launch``, a mutable message to its agents).

It holds no domain logic and imports nothing of psij.
"""

from operator import attrgetter
from types import MappingProxyType
from typing import Any, Callable, Dict, List, Tuple, TypeVar

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
        else:
            cls._values = staticmethod(_no_values)
        # Each class makes its own on first use (a subclass may have more slots).
        cls._store = Record._store  # type: ignore[method-assign]

    def _store(self, *values: Any) -> None:
        """Store every slot, in ``__slots__`` order: called once, by ``__init__``."""
        cls = type(self)
        store = _compile_store(cls)
        cls._store = store  # type: ignore[method-assign]
        store(self, *values)

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


def _slot_names(cls: type) -> List[str]:
    return [name for klass in reversed(cls.__mro__)
            for name in klass.__dict__.get("__slots__", ())]


def _compile_store(cls: type) -> Callable[..., None]:
    """``cls``'s ``_store``: each slot's own setter called once, in ``__slots__`` order (the
    setters store without going through ``__setattr__``, which refuses)."""
    names = _slot_names(cls)
    values = ", ".join(f"v{i}" for i in range(len(names)))
    setters = ", ".join(f"s{i}" for i in range(len(names)))
    body = "".join(f"        s{i}(self, v{i})\n" for i in range(len(names))) or "        pass\n"
    source = (f"def make({setters}):\n"
              f"    def _store(self{', ' if names else ''}{values}):\n{body}"
              f"    return _store\n")
    namespace: Dict[str, Any] = {}
    exec(source, namespace)  # only slot setters and numbered names: nothing from outside
    store: Callable[..., None] = namespace["make"](*(getattr(cls, n).__set__ for n in names))
    store.__qualname__ = f"{cls.__name__}._store"
    return store


def _no_values(record: Any) -> Tuple[()]:
    return ()


def replace(record: _R, **changes: Any) -> _R:
    """A copy of ``record`` with some fields changed, checked again by the class."""
    for name in changes:
        if name not in record._fields:
            raise TypeError(f"{type(record).__name__}: no field {name!r}; fields: "
                            f"{', '.join(record._fields)}")
    values = record.as_dict()
    values.update(changes)
    return type(record)(**values)

