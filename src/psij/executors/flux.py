"""The Flux executor's former module path, kept so existing imports keep working.

The executor lives in :mod:`psij.executors.batch.flux`; this module only re-exports it.
"""

from psij.executors.batch.flux import FluxJobExecutor

__all__ = ["FluxJobExecutor"]
