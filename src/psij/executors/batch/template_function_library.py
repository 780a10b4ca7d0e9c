"""The functions submit-script templates get as ``psij.lib``, under their PSI/J path, for
plugins that import them from here.

They live in :mod:`psij._scripts.template_functions`; this module only re-exports the same
objects and must define nothing of its own. psij's own modules import from
:mod:`psij._scripts.template_functions` directly.
"""

from psij._scripts.template_functions import ALL, walltime_to_minutes

__all__ = ["ALL", "walltime_to_minutes"]
