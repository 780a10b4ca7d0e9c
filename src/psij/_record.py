"""The one base of immutable values across psij: :class:`Record`, and :func:`replace`.

Every value of the package (the pilot's nodes, requests, shapes, task specifications and
events; the batch layer's observations, tracker states, events and actions, command results,
directive rules, ...) is a ``Record``: compared and hashed by its fields, never changed after
construction. A subclass lists its fields in ``_fields`` and its storage in ``__slots__`` (the
fields, then any value derived from them), and annotates each field. A class whose slots are
its fields and whose fields have no defaults needs no ``__init__``: it gets one taking the
fields in order, by position or by name (type checkers see it too, through
``dataclass_transform``). A class with defaults, checks or derived slots writes its own
``__init__``, which stores every slot at once with :meth:`Record._store`, in ``__slots__``
order. The first ``_store`` (and the first use of a made ``__init__``) of a class makes that
class's own: one call of each slot's setter, no loop (a loop over the setters costs about
200 ns more per value built); classes never built cost nothing.

Why not frozen dataclasses, and why one idiom: defining a dataclass costs code generation at
import (0.5 to 1 ms per class: some 20 ms for the pilot's classes on every start of a pilot,
some 10 ms for the batch layer's), importing :mod:`dataclasses` itself 5 ms more, and building
one costs 1.2 (with ``slots``, Python 3.10+) to 1.6 times a ``Record`` (measured with
``timeit`` and ``python -X importtime``). One base means one set of rules for equality,
hashing, copying, pickling and ``replace`` everywhere; ``tests/test_record.py`` checks that no
module of psij defines a frozen dataclass and that every class with ``_fields`` is a ``Record``
(but the pilot's ``Launch``, a mutable message to its agents).

It holds no domain logic and imports nothing of psij.
"""

from operator import attrgetter
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Tuple, TypeVar

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:
    def dataclass_transform(**_: Any) -> Any:
        """Nothing at run time: only type checkers read this decorator."""
        return lambda cls: cls

__all__ = ["Record", "replace"]

_R = TypeVar("_R", bound="Record")


@dataclass_transform(eq_default=True, frozen_default=True)
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
        if "__init__" not in cls.__dict__:
            cls.__init__ = Record.__init__  # type: ignore[method-assign]

    def __init__(self, *values: Any, **named: Any) -> None:
        """Store the fields, given in ``_fields`` order by position or by name; made into
        the class's own ``__init__`` on first use."""
        cls = type(self)
        init = _compile_init(cls)
        cls.__init__ = init  # type: ignore[method-assign]
        init(self, *values, **named)

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


def _compile_init(cls: type) -> Callable[..., None]:
    """``cls``'s ``__init__`` when it wrote none: its fields as parameters, stored in order."""
    fields = cls._fields  # type: ignore[attr-defined]
    if list(fields) != _slot_names(cls):
        raise TypeError(f"{cls.__name__}: a Record whose slots are not just its fields "
                        f"({', '.join(fields)}) must define __init__")
    if not all(name.isidentifier() and not name.startswith("__") for name in fields):
        raise TypeError(f"{cls.__name__}: field names must be identifiers")
    names = ", ".join(fields)
    source = (f"def __init__(self{', ' if fields else ''}{names}):\n"
              f"    self._store({names})\n")
    namespace: Dict[str, Any] = {}
    exec(source, namespace)  # the class's own field names only: nothing from outside
    init: Callable[..., None] = namespace["__init__"]
    init.__qualname__ = f"{cls.__name__}.__init__"
    return init


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

