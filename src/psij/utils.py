"""Helpers that psij-python offers under ``psij.utils``: :class:`SingletonThread`."""

import os
import threading
from typing import ClassVar, Dict, Optional, Type, TypeVar

__all__ = ["SingletonThread"]

_T = TypeVar("_T", bound="SingletonThread")


class SingletonThread(threading.Thread):
    """A thread of which each process runs at most one per subclass.

    Subclass it, implement :meth:`run`, and ask for the thread with :meth:`get_instance`, which
    starts it the first time. A process forked after that gets a fresh one of its own on its first
    call (the parent's thread does not exist in the child). Construct it directly only through
    :meth:`get_instance`, which calls the constructor without arguments.
    """

    _instances: ClassVar[Dict[int, "SingletonThread"]] = {}
    _lock: ClassVar[threading.RLock] = threading.RLock()

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        # One table per subclass: two kinds of singleton threads never answer for each other.
        cls._instances = {}

    def __init__(self, name: Optional[str] = None, daemon: bool = False) -> None:
        super().__init__(name=name, daemon=daemon)

    @classmethod
    def get_instance(cls: Type[_T]) -> _T:
        """This process's thread of this class, started on the first call."""
        with cls._lock:
            pid = os.getpid()
            found = cls._instances.get(pid)
            if not isinstance(found, cls):
                found = cls()
                cls._instances[pid] = found
                found.start()
            return found
