"""The quoting functions under their PSI/J path, for plugins and user code that import them
from here (``from psij.executors.batch.escape_functions import bash_escape``).

The functions live in :mod:`psij._scripts.quoting`; this module only re-exports the same
objects and must define nothing of its own. psij's own modules import from
:mod:`psij._scripts.quoting` directly.
"""

from psij._scripts.quoting import (
    ShellWord,
    bash_escape,
    directive_value,
    double_quoted,
    plain_directive_value,
    shell_word,
)
from psij._scripts.quoting import plain_job_name as plain_job_name

__all__ = ["ShellWord", "bash_escape", "directive_value", "double_quoted",
           "plain_directive_value", "shell_word"]
