"""The environment a command started now would inherit.

A child process started without an explicit environment gets the C library's ``environ``,
which holds what ``os.environ`` holds (its changes go through ``putenv``/``unsetenv``) and also
what ``os.putenv`` and C code set below it. Commands that are started ahead of need (spare
submit commands) or replaced by a request (Slurm's ``rest_submit``) are given this environment
explicitly, so that a job gets the same environment whichever way it was submitted. Where
``environ`` cannot be read (no ``ctypes``, no C library symbol), ``os.environ`` stands for it.
"""

import os
from typing import Any, Dict

__all__ = ["inherited", "inherited_bytes"]

_ENVIRON: Any = None  # the C library's environ; False when it cannot be read


def inherited_bytes() -> Dict[bytes, bytes]:
    """The inherited environment as bytes (the first of a repeated name wins, as in
    ``getenv``)."""
    global _ENVIRON
    if _ENVIRON is None:
        try:
            import ctypes

            _ENVIRON = ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")
        except (ImportError, OSError, ValueError, AttributeError):
            _ENVIRON = False
    if _ENVIRON is False:
        return {os.fsencode(k): os.fsencode(v) for k, v in os.environ.items()}
    out: Dict[bytes, bytes] = {}
    i = 0
    while True:
        item = _ENVIRON[i]
        if item is None:
            return out
        key, sep, value = item.partition(b"=")
        if sep and key:
            out.setdefault(key, value)
        i += 1


def inherited() -> Dict[str, str]:
    """The inherited environment as text (bytes that are not UTF-8 as lone surrogates, as in
    ``os.environ``)."""
    return {os.fsdecode(k): os.fsdecode(v) for k, v in inherited_bytes().items()}
