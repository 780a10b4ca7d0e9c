"""Directive helpers shared by the batch executors: custom attributes for all of them, the
rules for values and job names in directive lines (:class:`DirectiveRules`), and options
spelled from custom attributes.

Custom attributes (:func:`custom_attribute_items`) follow psij-python: any str key may be set,
and an executor renders only the keys ``<prefix>.<option>`` whose prefix is one of its own
(``slurm.``, ``pbs.`` for PBS Pro and Torque, ...), read when the job is submitted.

PBS, LSF, Cobalt and Flux read their directive lines (``#PBS``, ``#BSUB``, ``#COBALT``, ``# flux:``)
with rules that have no reliable escape mechanism, so values are either plain or refused (see
:func:`~psij._scripts.quoting.plain_directive_value`), and job names, which are
only labels, are made plain instead of refused. This module also spells custom attributes as
options (``-k value``, ``--key=value``). Pure string work: no files, no commands.
"""

import re
from typing import Any, Dict, List, Mapping, Optional, Sequence

from psij._record import Record
from psij._scripts.quoting import (
    directive_value,
    plain_directive_value,
    plain_job_name,
)
from psij.job_attributes import check_custom_value

__all__ = ["ESCAPED", "PLAIN", "PLAIN_QUOTED", "QUOTED_EXTRA", "DirectiveRules",
           "custom_attribute_items", "option_items", "plain_job_name"]

_OPTION_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")

# Characters allowed, beyond the plain ones, in values that a template writes between double
# quotes for a scheduler that splits directive lines like a shell (LSF, Flux). None of them is
# special inside double quotes, so the value reaches the scheduler as written.
QUOTED_EXTRA = " []()<>!&|*~{}"


class DirectiveRules(Record):
    """How a scheduler reads values in its directive lines.

    ``plain``: the scheduler has no escape mechanism, so a value may only hold characters that
    need none (plus ``extra``), and job names are made plain; otherwise values are escaped the
    way ``sbatch`` reads them and job names are written as given.
    """

    plain: bool
    extra: Optional[str] = None

    def value(self, field: str, value: str) -> str:
        """``value`` as written in a directive, or ValueError naming ``field``."""
        if self.plain:
            return plain_directive_value(field, value, extra=self.extra)
        return directive_value(field, value)

    def job_name(self, name: Optional[str]) -> Optional[str]:
        """The job name written in the script."""
        return plain_job_name(name) if self.plain else name


# sbatch-like: values between double quotes, backslash escapes (Slurm, batch-test).
ESCAPED = DirectiveRules(plain=False)
# No escape mechanism at all (Grid Engine, PBS, Cobalt).
PLAIN = DirectiveRules(plain=True)
# Lines split like a shell command line, values between double quotes (LSF, Flux).
PLAIN_QUOTED = DirectiveRules(plain=True, extra=QUOTED_EXTRA)


def custom_attribute_items(custom: Optional[Mapping[Any, object]],
                           prefixes: Optional[Sequence[str]]) -> Dict[str, List[Dict[str, Any]]]:
    """Custom attributes by prefix: ``{"slurm": [{"key": "qos", "value": "debug"}]}``.

    Only keys ``<prefix>.<option>`` with a prefix in ``prefixes`` (matched without regard to
    case) are kept, all under the first prefix (the others are the executor's other names:
    ``gridengine.`` on Grid Engine, ``torque.`` on Torque); others (``ATTR1``, ``pbs.x`` for
    Slurm, non-str keys) are skipped. With ``prefixes`` None (an executor written for
    psij-python, which declares none) every prefix is kept under its own name, as psij-python
    does. A value True becomes a bare flag (value None); False and None leave the option out.
    A kept option whose name is not a letter followed by letters, digits, ``_`` and ``-``, or
    whose value is not a str, int, float or bool, raises ValueError or TypeError naming the
    attribute; the value itself is checked for the directive by the executor.
    """
    found: Dict[str, List[Dict[str, Any]]] = {}
    wanted = None if prefixes is None else {p.lower() for p in prefixes}
    # A snapshot: the dict is the caller's and may change while a script is rendered.
    for name, value in list((custom or {}).items()):
        if not isinstance(name, str):
            continue
        prefix, dot, key = name.partition(".")
        prefix = prefix.lower()
        if not dot or (wanted is not None and prefix not in wanted):
            continue
        if not _OPTION_NAME.fullmatch(key):
            raise ValueError(
                f"JobAttributes.custom_attributes: {name!r} is not a valid {prefix} option "
                "name; accepted: a letter followed by letters, digits, '_' and '-'")
        check_custom_value(name, value)
        if value is None or value is False:
            continue
        group = prefix if prefixes is None else prefixes[0]
        found.setdefault(group, []).append(
            {"key": key, "value": None if value is True else str(value)})
    return found


def option_items(items: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Custom attribute items (``{"key", "value"}``) with the option spelled out as ``flag``.

    A one-letter key becomes ``-k`` (followed by a space when there is a value), a longer one
    ``--key`` (followed by ``=``); a value of None (the attribute was True) gives a bare flag.
    """
    spelled: List[Dict[str, Any]] = []
    for item in items:
        key = str(item["key"])
        value = item["value"]
        if len(key) == 1:
            flag = f"-{key}" if value is None else f"-{key} "
        else:
            flag = f"--{key}" if value is None else f"--{key}="
        spelled.append({"key": key, "value": value, "flag": flag})
    return spelled
