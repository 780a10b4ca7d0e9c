"""Quoting of user strings placed in submit scripts: one function per place a string can go.

The places, and the function for each:

- a complete shell word (a launch-command word written unquoted): :func:`shell_word`;
- the inside of a double-quoted shell string (``export X="..."``, ``cd "..."``):
  :func:`double_quoted`;
- the inside of a double-quoted directive value read by a scheduler that treats backslash as an
  escape inside quotes, as ``sbatch`` does (``#SBATCH --job-name="..."``): :func:`directive_value`,
  which also refuses what no directive line can hold (newline, carriage return, NUL);
- a directive value read by a scheduler without any escape mechanism (Grid Engine's ``#$``
  lines): :func:`plain_directive_value`, which accepts only characters that need none.

Templates render every ``{{value}}`` through one escape function, :func:`bash_escape`: plain
values come out ready for the inside of double quotes, and :class:`ShellWord` values (the launch
command) come out as complete words. Both the double-quoted and the sbatch directive contexts
undo exactly the same backslashes, so one rendering serves both.

Batch executors, the staging parts of job scripts (``psij.executors._staging``) and pilot
task scripts all quote with these functions; plugins import the same objects from
``psij._scripts.quoting``, which re-exports them. Nothing here reads files or
runs commands, and nothing else of psij is imported.
"""

import re
from typing import Optional

__all__ = ["ShellWord", "bash_escape", "directive_value", "double_quoted",
           "plain_directive_value", "shell_word"]

# Characters a shell word may hold without any quoting.
_PLAIN_WORD = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
_DOUBLE_QUOTE_SPECIAL = re.compile(r'([\\"$`])')
_PLAIN_DIRECTIVE = re.compile(r"[A-Za-z0-9_@%+=:,./-]*")


class ShellWord(str):
    """A string to be written as one complete shell word (quoted as needed by the template
    escape) rather than placed inside double quotes."""

    __slots__ = ()


def shell_word(value: str) -> str:
    """``value`` as one shell word: unchanged when it needs no quoting, else single-quoted."""
    if value and _PLAIN_WORD.fullmatch(value):
        return value
    return "'" + value.replace("'", "'\"'\"'") + "'"


def double_quoted(value: str) -> str:
    """``value`` ready to sit between double quotes: a backslash before backslash, double quote,
    dollar and backquote only.

    Inside double quotes the shell removes a backslash only before those four characters (and
    newline, which is kept as is here), so the text reads back exactly as given.
    """
    return _DOUBLE_QUOTE_SPECIAL.sub(r"\\\1", value)


def _refuse_line_breaks(field: str, value: str) -> None:
    for bad, name in (("\n", "newline"), ("\r", "carriage return"), ("\x00", "NUL")):
        if bad in value:
            raise ValueError(f"{field}: {value!r} contains a {name}, which cannot be written in "
                             "a submit-script directive; remove it")


def directive_value(field: str, value: str) -> str:
    """``value`` for the inside of a double-quoted directive value parsed like sbatch does.

    Raises ValueError naming ``field`` when the value holds a newline, carriage return or NUL.
    """
    _refuse_line_breaks(field, value)
    return double_quoted(value)


def plain_directive_value(field: str, value: str, extra: Optional[str] = None) -> str:
    """``value`` unchanged if it needs no escaping in a directive that has none, else ValueError.

    Accepted: letters, digits and ``_ @ % + = : , . / -`` plus the characters in ``extra``.
    """
    _refuse_line_breaks(field, value)
    allowed = _PLAIN_DIRECTIVE if extra is None else re.compile(
        r"[A-Za-z0-9_@%+=:,./" + re.escape(extra) + r"-]*")
    if not allowed.fullmatch(value):
        shown = "".join(sorted({c for c in value if not allowed.fullmatch(c)}))
        raise ValueError(f"{field}: {value!r} has characters this scheduler's directives cannot "
                         f"hold ({shown!r}); accepted: letters, digits and "
                         f"'_@%+=:,./-{extra or ''}'")
    return value


def bash_escape(o: object) -> str:
    """The escape function of submit-script templates.

    A :class:`ShellWord` becomes a complete shell word; anything else becomes its text escaped
    for the inside of double quotes (numbers need no escaping and stay as they are).
    """
    if isinstance(o, ShellWord):
        return shell_word(str(o))
    return double_quoted(str(o))


_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.-]")


def plain_job_name(name: Optional[str], limit: int = 64) -> Optional[str]:
    """``name`` as a job name every scheduler accepts, or None when there is none.

    Only the last path component is kept (names default to the executable's path), characters
    other than letters, digits, ``_ . -`` become ``_``, the name starts with a letter and has at
    most ``limit`` characters.
    """
    if name is None:
        return None
    plain = _NAME_CHARS.sub("_", name.rsplit("/", 1)[-1])
    if not plain or not plain[0].isalpha():
        plain = "j" + plain
    return plain[:limit]
