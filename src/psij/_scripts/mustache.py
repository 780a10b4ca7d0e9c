"""A parsed Mustache template turned into Python functions, rendered as pystache renders it.

pystache walks its parse tree for every job, resolving each name through several layers of
objects; a submit script of some sixty tags cost about 60 microseconds that way. Here the
tree is turned once into nested functions, with each tag's name split in advance, so that a
render does only the lookups and the joining. The rules are pystache's own (with its
renderer's ``missing_tags="ignore"`` and ``str`` for values that are not strings):

- a name is looked up from the innermost section's value outwards: a dict by key, any object
  that is not of a built-in type by attribute (an attribute that can be called is called);
  the parts after the first dot are looked up in the value found for the part before it; a
  name not found is the empty string; ``.`` is the innermost value;
- ``{{name}}`` writes the value, as a string, through the escape function; ``{{{name}}}``
  and ``{{& name}}`` write it as is;
- a section repeats its content for each item of a list (or other iterable that is neither
  a string nor a dict), once for any other true value, never for a false one, with the item
  as the innermost value; an inverted section is written once when the value is false.

A value that pystache would treat as a Mustache lambda (a value that can be called, found
under a name) or a byte string makes the whole render go through pystache itself, so that
templates relying on them behave exactly as before. Templates whose parse tree has nodes
not known here (another pystache version) are not compiled: :func:`compile_template` gives
None and the caller keeps pystache. Only :mod:`psij._scripts.generator` uses this module;
it turns text into text, reads no file and imports nothing else of psij.
"""

from typing import Any, Callable, Dict, List, Optional

from pystache import parser as _parser  # type: ignore[import-untyped]
from pystache.parsed import ParsedTemplate  # type: ignore[import-untyped]

__all__ = ["NeedsPystache", "compile_template"]

# Appends what a part of the template gives, for a stack of values, to ``out``.
_Part = Callable[[List[Any], List[str]], None]


class NeedsPystache(Exception):
    """A value only pystache's own rendering handles (a lambda, a byte string) was met."""


class _NotFound:
    pass


_NOT_FOUND = _NotFound()


def _value(item: Any, key: str) -> Any:
    """``item``'s value for ``key`` (pystache's rules), or _NOT_FOUND."""
    if type(item) is dict:
        return item.get(key, _NOT_FOUND)
    if isinstance(item, dict):
        return item[key] if key in item else _NOT_FOUND
    if type(item).__module__ != "builtins":
        try:
            attr = getattr(item, key)
        except AttributeError:
            return _NOT_FOUND
        return attr() if callable(attr) else attr
    return _NOT_FOUND


def _resolver(name: str) -> Callable[[List[Any]], Any]:
    """A function giving the value of ``name`` for a stack ('' when it is not found)."""
    if name == ".":
        return lambda stack: stack[-1] if stack else ""
    first, *rest = name.split(".")

    def resolve(stack: List[Any]) -> Any:
        for item in reversed(stack):
            result = _value(item, first)
            if result is not _NOT_FOUND:
                break
        else:
            return ""
        for part in rest:
            result = _value(result, part)
            if result is _NOT_FOUND:
                return ""
        return result

    return resolve


def _text(value: Any) -> Any:
    """The value of an interpolation as a string (str subclasses kept, as pystache does)."""
    if isinstance(value, str):
        return value
    if callable(value) or isinstance(value, bytes):
        raise NeedsPystache()
    return str(value)


def _compile_nodes(nodes: List[Any], escape: Callable[[Any], str]) -> _Part:
    parts = [_compile_node(node, escape) for node in nodes]
    literal_only = all(isinstance(node, str) for node in nodes)
    if literal_only:
        text = "".join(nodes)
        return lambda stack, out: out.append(text)

    def run(stack: List[Any], out: List[str]) -> None:
        for part in parts:
            part(stack, out)

    return run


def _compile_node(node: Any, escape: Callable[[Any], str]) -> _Part:
    kind = type(node)
    if kind is str:
        return lambda stack, out: out.append(node)
    if kind in (_parser._CommentNode, _parser._ChangeNode):
        return lambda stack, out: None
    if kind in (_parser._EscapeNode, _parser._LiteralNode):
        resolve = _resolver(node.key)
        if kind is _parser._EscapeNode:
            def escaped(stack: List[Any], out: List[str]) -> None:
                value = resolve(stack)
                out.append(str(escape(value if type(value) is str else _text(value))))

            return escaped
        return lambda stack, out: out.append(str(_text(resolve(stack))))
    if kind is _parser._InvertedNode:
        resolve = _resolver(node.key)
        inner = _compile_tree(node.parsed_section, escape)

        def inverted(stack: List[Any], out: List[str]) -> None:
            if not resolve(stack):
                inner(stack, out)

        return inverted
    if kind is _parser._SectionNode:
        return _section(_resolver(node.key), _compile_tree(node.parsed, escape))
    raise TypeError(f"pystache node {kind.__name__} is not compiled")


def _section(resolve: Callable[[List[Any]], Any], inner: _Part) -> _Part:
    def section(stack: List[Any], out: List[str]) -> None:
        data = resolve(stack)
        if not data:
            return
        if isinstance(data, (str, bytes, dict)):
            values: Any = (data,)
        else:
            try:
                values = iter(data)
            except TypeError:
                values = (data,)
        for value in values:
            if callable(value):
                raise NeedsPystache()
            stack.append(value)
            try:
                inner(stack, out)
            finally:
                stack.pop()

    return section


def _compile_tree(parsed: Any, escape: Callable[[Any], str]) -> _Part:
    if not isinstance(parsed, ParsedTemplate):
        raise TypeError(f"not a pystache ParsedTemplate: {type(parsed).__name__}")
    return _compile_nodes(list(parsed._parse_tree), escape)


def compile_template(parsed: Any, escape: Callable[[Any], str]
                     ) -> Optional[Callable[[Dict[str, object]], str]]:
    """A function rendering the pystache template ``parsed`` for a context (see the module's
    docstring; it raises :class:`NeedsPystache` for values only pystache handles), or None
    when the template has parts this module does not know."""
    try:
        run = _compile_tree(parsed, escape)
    except (TypeError, AttributeError):
        return None

    def render(context: Dict[str, object]) -> str:
        out: List[str] = []
        run([context] if context is not None else [], out)
        return "".join(out)

    return render
