"""Lists the importable surface of the ``psij`` package that the running interpreter imports:
every module, every public name in it, and the parameters of public callables, as JSON on
standard output. Run by tests/integration/test_reference_surface.py in a side environment that
holds another implementation of the package, so that the two surfaces can be compared.

A name counts when it does not start with ``_`` and its value is either a class or function
of the package itself (``__module__`` under ``psij``), whether defined in that module or
imported into it from another module of the package, or a value assigned at the module's top
level (a constant). Names brought in from the standard library, ``typing`` or third parties,
type variables and loggers do not count. A module that cannot be imported (its optional
dependency is missing) is listed from its source, by the names it defines.
"""

import ast
import importlib
import inspect
import json
import logging
import sys
import typing
from pathlib import Path
from typing import Any, Dict, List, Optional, Set


def _module_name(package_root: Path, path: Path) -> Optional[str]:
    parts = list(path.relative_to(package_root.parent).with_suffix("").parts)
    if parts[-1] == "__main__":
        return None  # running it is the command line, importing it too
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _assigned(tree: ast.Module) -> Set[str]:
    """Top-level names the module binds itself (definitions and assignments)."""
    names: Set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _default(value: Any) -> Optional[str]:
    if value is inspect.Parameter.empty:
        return None
    if isinstance(value, (type(None), bool, int, float, str)):
        return repr(value)
    return "<object>"


def _parameters(obj: Any) -> Optional[List[List[Any]]]:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    return [[p.name, p.kind.name, _default(p.default)] for p in sig.parameters.values()]


def _ours(value: Any) -> bool:
    module = getattr(value, "__module__", None) or ""
    return module == "psij" or module.startswith("psij.")


def _counts(name: str, value: Any, assigned: Set[str]) -> bool:
    if name.startswith("_") or inspect.ismodule(value):
        return False
    if isinstance(value, (typing.TypeVar, logging.Logger)):
        return False
    if inspect.isclass(value) or inspect.isfunction(value):
        return _ours(value)
    if getattr(value, "__module__", None) == "typing":
        return False
    return name in assigned


def _describe(value: Any) -> Dict[str, Any]:
    if inspect.isclass(value):
        methods: Dict[str, Any] = {}
        for attr, member in vars(value).items():
            if attr.startswith("_") and attr != "__init__":
                continue
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if inspect.isfunction(member):
                methods[attr] = _parameters(member)
            elif isinstance(member, property):
                methods[attr] = "property"
        return {"kind": "class", "methods": methods}
    if inspect.isfunction(value):
        return {"kind": "function", "parameters": _parameters(value)}
    return {"kind": "value"}


def main() -> None:
    import psij

    package_root = Path(psij.__file__).resolve().parent
    surface: Dict[str, Any] = {}
    for path in sorted(package_root.rglob("*.py")):
        name = _module_name(package_root, path)
        if name is None:
            continue
        assigned = _assigned(ast.parse(path.read_text(encoding="utf-8")))
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            public = sorted(n for n in assigned if not n.startswith("_") and n != "logger")
            surface[name] = {"import_error": str(e),
                             "names": {n: {"kind": "unknown"} for n in public}}
            continue
        names = {attr: _describe(value) for attr, value in sorted(vars(module).items())
                 if _counts(attr, value, assigned)}
        surface[name] = {"names": names}
    json.dump(surface, sys.stdout, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
