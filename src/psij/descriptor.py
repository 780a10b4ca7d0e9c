"""Plugin descriptors: what a ``psij-descriptors/*.py`` file declares about an executor or launcher.

A descriptor names a plugin, its version and the fully qualified name of its class. It is pure
data; discovery and loading live in :mod:`psij._plugins`.

Versions are held as :class:`packaging.version.Version`. Descriptor files written for
psij-python pass what it accepted: besides a ``Version`` or a version string, a distutils
``StrictVersion`` or ``LooseVersion`` (published plugins such as psij-zmq declare
``StrictVersion('0.0.1')``). distutils is not imported here (Python 3.12 removed it); an object
shaped like those classes (a ``vstring`` str, or a ``version`` tuple or list) is read from its
text.
"""

from typing import TYPE_CHECKING, Any, List, Optional, Union

if TYPE_CHECKING:
    from packaging.version import Version

__all__ = ["Descriptor"]


class Descriptor:
    """Declares a plugin, e.g. ``Descriptor("slurm", Version("1.0"), "pkg.mod.Cls")``."""

    def __init__(self, name: str, version: "Union[Version, str, object]", cls: str,
                 aliases: Optional[List[str]] = None, nice_name: Optional[str] = None) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"Descriptor.name: expected a non-empty str, got {name!r}")
        version = as_version(version)
        if not isinstance(cls, str) or "." not in cls:
            raise TypeError(f"Descriptor.cls: expected a fully qualified class name such as "
                            f"'pkg.module.Class', got {cls!r}")
        if aliases is not None and (not isinstance(aliases, (list, tuple)) or
                                    not all(isinstance(a, str) and a for a in aliases)):
            raise TypeError(f"Descriptor.aliases: expected a list of non-empty str, got "
                            f"{aliases!r}")
        if nice_name is not None and not isinstance(nice_name, str):
            raise TypeError(f"Descriptor.nice_name: expected str or None, got {nice_name!r}")
        self.name = name
        self.version = version
        self.cls = cls
        self.aliases = list(aliases) if aliases else []
        self.nice_name = nice_name if nice_name is not None else name
        # Set by discovery: the descriptor file this came from.
        self.path: Optional[str] = None

    def __repr__(self) -> str:
        return (f"Descriptor(name={self.name!r}, version={self.version}, cls={self.cls!r}, "
                f"aliases={self.aliases!r}, path={self.path!r})")


_ACCEPTED = ("accepted: a packaging.version.Version, a version string such as '1.0.2', or a "
             "distutils StrictVersion or LooseVersion")


def as_version(value: Any) -> "Version":
    """``value`` as a :class:`packaging.version.Version` (see the module docstring)."""
    from packaging.version import InvalidVersion, Version

    if isinstance(value, Version):
        return value
    if isinstance(value, str):
        text = value
    elif isinstance(getattr(value, "vstring", None), str):
        text = value.vstring  # LooseVersion, and StrictVersion in some copies of distutils
    elif isinstance(getattr(value, "version", None), (tuple, list)) or \
            isinstance(getattr(value, "release", None), tuple):
        # StrictVersion (its str() rebuilds the text) or another copy of packaging's Version.
        text = str(value)
    else:
        raise TypeError(f"Descriptor.version: {value!r} ({type(value).__name__}) is not a "
                        f"version; {_ACCEPTED}")
    try:
        return Version(text)
    except InvalidVersion:
        raise ValueError(f"Descriptor.version: {value!r} does not read as a version "
                         f"({text!r} is not a PEP 440 version); {_ACCEPTED}") from None
