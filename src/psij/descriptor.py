"""Plugin descriptors: what a ``psij-descriptors/*.py`` file declares about an executor or launcher.

A descriptor names a plugin, its version and the fully qualified name of its class. It is pure
data; discovery and loading live in :mod:`psij._plugins`.
"""

from typing import TYPE_CHECKING, List, Optional

if TYPE_CHECKING:
    from packaging.version import Version

__all__ = ["Descriptor"]


class Descriptor:
    """Declares a plugin, e.g. ``Descriptor("slurm", Version("1.0"), "pkg.mod.Cls")``."""

    def __init__(self, name: str, version: "Version", cls: str,
                 aliases: Optional[List[str]] = None, nice_name: Optional[str] = None) -> None:
        from packaging.version import Version

        if not isinstance(name, str) or not name:
            raise TypeError(f"Descriptor.name: expected a non-empty str, got {name!r}")
        if isinstance(version, str):
            try:
                version = Version(version)
            except ValueError as ex:
                raise ValueError(f"Descriptor.version: {ex}") from None
        if not isinstance(version, Version):
            raise TypeError(f"Descriptor.version: expected packaging.version.Version, got "
                            f"{version!r} ({type(version).__name__})")
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
