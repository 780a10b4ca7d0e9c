"""``psij plugins``: list every executor and launcher found, with versions, files, load errors
and clashes, and the descriptor files that could not be read.

It only reads the plugin registry (:mod:`psij._plugins`) and prints; it never makes an executor.
It imports only :mod:`psij.cli._common` of the command's modules.
"""

from typing import Any, Iterator, List

from psij.cli._common import add_command, one_line

__all__ = ["add_plugins_command", "plugins_main"]


def add_plugins_command(commands: Any) -> None:
    add_command(
        commands, "plugins", "list executors and launchers with versions, files and load errors",
        "List every executor and launcher found in psij-descriptors folders on sys.path: name, "
        "version, descriptor file, class and class file, whether it loads, and clashes between "
        "declarations. Descriptor files that could not be read are listed at the end.")


def _plugin_lines(kind: str) -> Iterator[str]:
    from psij._plugins import describe

    records = describe(kind)
    yield f"{kind.capitalize()}s:"
    if not records:
        yield "  (none)"
    for rec in records:
        title = f"  {rec['name']} {rec['version']}"
        if rec["alias_of"]:
            title += f" (alias of {rec['alias_of']})"
        yield title
        yield f"    descriptor: {rec['descriptor']}"
        yield f"    class:      {rec['class']}"
        yield f"    class file: {rec['class_file'] or '(not found)'}"
        yield f"    status:     {rec['error'] or 'ok'}"
        for note in rec["notes"]:
            yield f"    note:       {note}"


def plugins_main() -> int:
    from psij._plugins import KINDS, REGISTRY

    lines: List[str] = []
    for kind in KINDS:
        lines.extend(_plugin_lines(kind))
    broken = REGISTRY.broken_files
    lines.append("Broken descriptor files:")
    if not broken:
        lines.append("  (none)")
    for item in broken:
        lines.append(f"  {item.path}")
        lines.append(f"    error: {type(item.error).__name__}: {one_line(str(item.error))}")
    print("\n".join(lines))
    return 0
