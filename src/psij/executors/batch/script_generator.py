"""The submit-script generators under their PSI/J path, for plugins that import them from here
(``from psij.executors.batch.script_generator import TemplatedScriptGenerator``).

They live in :mod:`psij._scripts.generator`; this module only re-exports the same objects and
must define nothing of its own (importing it loads pystache, as the generator needs it), but
for the names psij-python's module of this path imports from others, offered on first use.
psij's own modules import from :mod:`psij._scripts.generator` directly.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from psij._reexports import lazy_names as _lazy_names
from psij._scripts.generator import SubmitScriptGenerator, TemplatedScriptGenerator, inline_partials

__all__ = ["SubmitScriptGenerator", "TemplatedScriptGenerator", "inline_partials"]


# Names that psij-python's module of the same path also offers (imported there).
if not _TYPE_CHECKING:
    __getattr__ = _lazy_names(__name__, {
        "Job": "psij.job",
        "JobExecutorConfig": "psij.job_executor_config",
        "bash_escape": "psij.executors.batch.escape_functions",
    })
