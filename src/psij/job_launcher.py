"""The launcher base class: how a job's processes are started once the job has its resources."""

import threading
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, List, Optional, Set

from psij._reexports import lazy_names
from psij.job_executor_config import JobExecutorConfig

if TYPE_CHECKING:
    from packaging.version import Version

    from psij.descriptor import Descriptor
    from psij.job import Job

__all__ = ["Launcher"]

_construct_lock = threading.Lock()


class Launcher(ABC):
    """Base class of launchers (``single``, ``multiple``, ``mpirun``, ``srun``, ...)."""

    DEFAULT_LAUNCHER_NAME = "single"

    def __init__(self, config: Optional[JobExecutorConfig] = None) -> None:
        self.config = config if config is not None else JobExecutorConfig.DEFAULT

    @abstractmethod
    def get_launch_command(self, job: "Job") -> List[str]:
        """The command (argv) that starts the job's processes."""

    @abstractmethod
    def is_launcher_failure(self, output: str) -> bool:
        """Whether the launcher's output says the launcher itself failed."""

    @abstractmethod
    def get_launcher_failure_message(self, output: str) -> str:
        """The failure message to report for a launcher failure, from its output."""

    @property
    def name(self) -> str:
        """The name this launcher was asked for by."""
        return _plugin_name(self, "launcher")

    @property
    def version(self) -> "Version":
        """The version from this launcher's descriptor."""
        return _plugin_version(self, "launcher")

    @staticmethod
    def get_instance(name: str, version_constraint: Optional[str] = None,
                     config: Optional[JobExecutorConfig] = None) -> "Launcher":
        """A new launcher of the named kind (highest version matching the constraint)."""
        from psij._plugins import REGISTRY

        entry = REGISTRY.select("launcher", name, version_constraint, base=Launcher)
        assert entry.cls is not None and issubclass(entry.cls, Launcher)  # select checked it
        inst: Launcher = entry.cls.__new__(entry.cls)
        inst.__dict__["_psij_plugin"] = (name, entry.desc.version)
        inst.__init__(config=config)  # type: ignore[misc]
        return inst

    @staticmethod
    def get_launcher_names() -> Set[str]:
        """Names of all known launchers."""
        from psij._plugins import REGISTRY

        return set(REGISTRY.names("launcher"))

    @staticmethod
    def register_launcher(desc: "Descriptor", root: str) -> None:
        """Declare a launcher by hand, as a descriptor file in ``root`` would."""
        from psij._plugins import REGISTRY

        REGISTRY.register("launcher", desc, root)


def _plugin_name(obj: object, kind: str) -> str:
    found = obj.__dict__.get("_psij_plugin")
    if found is not None:
        return str(found[0])
    static = getattr(type(obj), "_NAME_", None)
    if isinstance(static, str):
        return static
    from psij._plugins import REGISTRY

    entry = REGISTRY.find_entry_for_class(kind, type(obj))
    return entry.desc.name if entry is not None else type(obj).__name__.lower()


def _plugin_version(obj: object, kind: str) -> "Version":
    from packaging.version import Version

    found = obj.__dict__.get("_psij_plugin")
    if found is not None:
        return found[1]  # type: ignore[no-any-return]
    static = getattr(type(obj), "_VERSION_", None)
    if isinstance(static, Version):
        return static
    from psij._plugins import REGISTRY

    entry = REGISTRY.find_entry_for_class(kind, type(obj))
    return entry.desc.version if entry is not None else Version("0")


# Names that psij-python's module of the same path also offers (imported there).
if not TYPE_CHECKING:
    __getattr__ = lazy_names(__name__, {
        "Descriptor": "psij.descriptor",
        "Job": "psij.job",
    })
