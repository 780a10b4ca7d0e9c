"""The one base of immutable values across psij: :class:`Record`, :func:`derived` and
:func:`replace`.

Every value of the package (the pilot's nodes, requests, shapes, task specifications and
events; the batch layer's observations, tracker states, events and actions, command results,
directive rules, ...) is a ``Record``: compared and hashed by its fields, never changed after
construction.

A subclass names each field once, by annotating it in its body, in positional order; the
fields of its bases come first. ``name: int = 0`` gives a default (a field without one may not
follow one with one: refused when the class is made, as is a field named again in a
subclass). Annotations marked ``ClassVar`` and names starting with ``_`` are no fields. The
metaclass reads the body's annotations before the class exists (``__annotations__``, or on
Python 3.14 the lazy ``__annotate__`` read as source text through :mod:`annotationlib`, so
nothing is evaluated), takes the defaults out of the body (each field is a slot, whose
descriptor takes the name) and sets ``_fields`` and ``__slots__``: a subclass writes neither.
Type checkers see the constructor through ``dataclass_transform``.

A class that checks or converts its values defines ``_validate(self)``: called after every
field is stored, it raises on a bad value (the messages name the field) and may store a
converted one with ``self._set(name, value)``. A value computed from the fields (a cached
hash, lower bounds) is a derived slot: ``_hash: int = derived(init=False)``, a slot but no
field (not a parameter, not compared, shown or pickled), set by ``_validate``. A class whose
constructor took other parameters than its fields could still write ``__init__`` (storing
with ``self._set``); none does in psij, and ``tests/test_record.py`` keeps the list of those
allowed, each with its reason.

The ``__init__`` of a class is made on its first use (classes never built cost nothing): one
call of each slot's own setter with the defaults bound as default values (passed in as
objects, never written as source), then ``_validate`` if any; no loop (a loop over the setters
costs about 200 ns more per value built).

Why not frozen dataclasses, and why one idiom: defining a dataclass costs code generation at
import (0.5 to 1 ms per class: some 20 ms for the pilot's classes on every start of a pilot,
some 10 ms for the batch layer's), importing :mod:`dataclasses` itself 5 ms more, and building
one costs 1.2 (with ``slots``, Python 3.10+) to 1.6 times a ``Record`` (measured with
``timeit`` and ``python -X importtime``); making a ``Record`` class costs some 10 microseconds
in the metaclass, and its ``__init__`` is compiled only when first called. One base means one
set of rules for equality, hashing, copying, pickling and ``replace`` everywhere;
``tests/test_record.py`` checks that no module of psij defines a frozen dataclass, that no
``Record`` writes ``_fields``, ``__slots__`` or (but the allowed ones) ``__init__``, and that
every class with ``_fields`` is a ``Record`` (but the pilot's ``Launch``, a mutable message
to its agents).

It holds no domain logic and imports nothing of psij.
"""

import sys
from operator import attrgetter
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Dict, List, Mapping, Tuple, TypeVar

if TYPE_CHECKING:
    from typing_extensions import Literal, dataclass_transform
else:
    def dataclass_transform(**_: Any) -> Any:
        """Nothing at run time: only type checkers read this decorator."""
        return lambda cls: cls

__all__ = ["Record", "derived", "replace"]

class _Derived:
    """What :func:`derived` returns: marks a slot set by ``_validate``, not a field."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "derived(init=False)"


_DERIVED = _Derived()
_NO_DEFAULT: Any = object()


def derived(*, init: "Literal[False]") -> Any:
    """Declare a derived slot: ``name: T = derived(init=False)`` in a class body.

    The value is computed from the fields by the class's ``_validate`` (with ``self._set``); it
    is no field: not a constructor parameter, not compared, hashed, shown or pickled. The
    ``init=False`` tells type checkers as much."""
    return _DERIVED


def _is_class_var(annotation: Any) -> bool:
    if isinstance(annotation, str):
        head = annotation.split("[", 1)[0].strip()
        return head == "ClassVar" or head.endswith(".ClassVar")
    return annotation is ClassVar or getattr(annotation, "__origin__", None) is ClassVar


def _own_annotations(namespace: Mapping[str, Any]) -> Mapping[str, Any]:
    """The annotations written in a class body, in order (strings, objects or both)."""
    annotations = namespace.get("__annotations__")
    if annotations is not None:
        return annotations  # type: ignore[no-any-return]
    if sys.version_info >= (3, 14):
        # Annotations evaluated lazily (PEP 649): read them as source text, evaluating none.
        import annotationlib
        annotate = annotationlib.get_annotate_from_class_namespace(namespace)
        if annotate is not None:
            return annotationlib.call_annotate_function(  # type: ignore[no-any-return]
                annotate, annotationlib.Format.STRING)
    return {}


def _class_annotations(cls: type) -> Mapping[str, Any]:
    """The annotations of a made class's own body (read for its ``__init__``'s signature)."""
    if sys.version_info >= (3, 14):
        import annotationlib
        return annotationlib.get_annotations(cls, format=annotationlib.Format.FORWARDREF)
    # Not ``cls.__annotations__``: on Python 3.9 a class without any gives its base's.
    return vars(cls).get("__annotations__", {})  # type: ignore[no-any-return]


class _RecordType(type):
    """The metaclass of :class:`Record`: reads a class body's fields from its annotations
    before the class exists, since its ``__slots__`` must be in the body."""

    _fields: Tuple[str, ...]
    _defaults: Mapping[str, Any]

    def __new__(mcls, name: str, bases: Tuple[type, ...], namespace: Dict[str, Any],
                **kwargs: Any) -> "_RecordType":
        parents = [b for b in bases if isinstance(b, _RecordType)]
        if not parents:  # Record itself
            return super().__new__(mcls, name, bases, namespace, **kwargs)
        for written in ("_fields", "__slots__"):
            if written in namespace:
                raise TypeError(f"{name}: a Record declares its fields by annotation only, "
                                f"not in {written}")
        fields: List[str] = []
        defaults: Dict[str, Any] = {}
        for parent in parents:
            fields.extend(f for f in parent._fields if f not in fields)
            defaults.update(parent._defaults)
        slots: List[str] = []
        derived_slots: List[str] = []
        for field, annotation in _own_annotations(namespace).items():
            value = namespace.get(field, _NO_DEFAULT)
            if value is _DERIVED:
                del namespace[field]
                derived_slots.append(field)
                continue
            if field.startswith("_") or _is_class_var(annotation):
                continue
            if field in fields:
                raise TypeError(f"{name}: field {field!r} is already a field of a base")
            if value is not _NO_DEFAULT:
                # The slot's descriptor takes the name: the default goes to ``__init__``.
                defaults[field] = namespace.pop(field)
            elif fields and fields[-1] in defaults:
                raise TypeError(f"{name}: field {field!r} has no default but follows "
                                f"{fields[-1]!r}, which has one")
            fields.append(field)
            slots.append(field)
        namespace["__slots__"] = (*slots, *derived_slots)
        namespace["_fields"] = tuple(fields)
        namespace["_defaults"] = MappingProxyType(defaults)
        # Two names at least, so that the getter always returns a tuple.
        namespace["_values"] = attrgetter(*fields) if len(fields) > 1 \
            else attrgetter(fields[0], fields[0]) if fields else staticmethod(_no_values)
        # Each class makes its own on first use (a subclass may have more fields).
        namespace.setdefault("__init__", Record._init_placeholder)
        return super().__new__(mcls, name, bases, namespace, **kwargs)

    @property
    def __signature__(cls) -> None:
        """None, once the class's own ``__init__`` is made: :func:`inspect.signature` (and the
        documentation) then reads the fields from it."""
        if vars(cls).get("__init__") is Record._init_placeholder:
            type.__setattr__(cls, "__init__", _compile_init(cls))
        return None


@dataclass_transform(eq_default=True, frozen_default=True, field_specifiers=(derived,))
class Record(metaclass=_RecordType):
    """An immutable value: equal to another of the same class with equal ``_fields``."""

    __slots__ = ()
    _fields: ClassVar[Tuple[str, ...]] = ()
    _defaults: ClassVar[Mapping[str, Any]] = MappingProxyType({})
    # The fields' values as one tuple, for comparing and hashing; an attrgetter is no
    # descriptor, so ``self._values(self)`` calls it unbound.
    _values: ClassVar[Any] = None
    if TYPE_CHECKING:
        def _validate(self) -> None:
            """Check or convert the stored fields, set the derived slots (optional)."""

        def _set(self, name: str, value: Any) -> None:
            """Store a slot past ``__setattr__`` (which refuses): for ``_validate`` only."""
    else:
        _set = object.__setattr__

    def __init__(self, *values: Any, **named: Any) -> None:
        """Store the fields, given in ``_fields`` order by position or by name; made into
        the class's own ``__init__`` on first use."""
        cls = type(self)
        init = _compile_init(cls)
        cls.__init__ = init  # type: ignore[method-assign]
        init(self, *values, **named)

    # The placeholder each class starts with (the metaclass's ``__signature__`` knows it).
    _init_placeholder = __init__

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


def _compile_init(cls: Any) -> Callable[..., None]:
    """``cls``'s ``__init__`` when it wrote none: its fields as parameters (with their
    defaults), each stored by its slot's own setter, then ``_validate`` if the class has one."""
    fields: Tuple[str, ...] = cls._fields
    defaults: Mapping[str, Any] = cls._defaults
    # Setters, defaults and the check come in as arguments of ``make``, by number: the
    # source holds only the class's own field names (identifiers, from its annotations).
    parameters = [f"{name}=d{i}" if name in defaults else name
                  for i, name in enumerate(fields)]
    body = [f"        s{i}(self, {name})\n" for i, name in enumerate(fields)]
    check = getattr(cls, "_validate", None)
    if check is not None:
        body.append("        check(self)\n")
    source = (f"def make({', '.join(f's{i}, d{i}' for i in range(len(fields)))}"
              f"{', ' if fields else ''}check):\n"
              f"    def __init__({', '.join(['self', *parameters])}):\n"
              f"{''.join(body) or '        pass'}\n"
              f"    return __init__\n")
    namespace: Dict[str, Any] = {}
    exec(source, namespace)
    arguments: List[Any] = []
    for name in fields:
        arguments += [getattr(cls, name).__set__, defaults.get(name)]
    init: Callable[..., None] = namespace["make"](*arguments, check)
    init.__qualname__ = f"{cls.__name__}.__init__"
    init.__annotations__ = {name: annotation for klass in reversed(cls.__mro__)
                            for name, annotation in _class_annotations(klass).items()
                            if name in fields}
    init.__annotations__["return"] = None
    return init


def _no_values(record: Any) -> Tuple[()]:
    return ()


_R = TypeVar("_R", bound=Record)


def replace(record: _R, **changes: Any) -> _R:
    """A copy of ``record`` with some fields changed, checked again by the class."""
    for name in changes:
        if name not in record._fields:
            raise TypeError(f"{type(record).__name__}: no field {name!r}; fields: "
                            f"{', '.join(record._fields)}")
    values = record.as_dict()
    values.update(changes)
    return type(record)(**values)
