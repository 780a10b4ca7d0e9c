"""Directive helpers shared by the PBS, LSF, Cobalt and Flux executors.

These schedulers read their directive lines (``#PBS``, ``#BSUB``, ``#COBALT``, ``# flux:``)
with rules that have no reliable escape mechanism, so values are either plain or refused (see
:func:`~psij.executors.batch.escape_functions.plain_directive_value`), and job names, which are
only labels, are made plain instead of refused. This module also spells custom attributes as
options (``-k value``, ``--key=value``). Pure string work: no files, no commands.
"""

from typing import Any, Dict, List

from psij.executors.batch.escape_functions import plain_job_name

__all__ = ["QUOTED_EXTRA", "option_items", "plain_job_name"]

# Characters allowed, beyond the plain ones, in values that a template writes between double
# quotes for a scheduler that splits directive lines like a shell (LSF, Flux). None of them is
# special inside double quotes, so the value reaches the scheduler as written.
QUOTED_EXTRA = " []()<>!&|*~{}"



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
