"""Plugin discovery and loading for executors and launchers.

Rules:
- Descriptor files are the ``*.py`` modules in ``<entry>/psij-descriptors/`` for every
  ``sys.path`` entry (real paths de-duplicated, in ``sys.path`` order). They are read on first
  use of the registry, never at ``import psij``.
- A plugin class is loaded only when that plugin is asked for, and from the same path entry as
  its descriptor, so two versions of one nominal package can live in two entries. When the
  module name is already taken by another entry's file, the file is loaded under a private
  module name.
- Several versions may share a name; without a constraint the highest wins. The same
  name and version declared twice for the same class file is one plugin; declared for two
  different files, the first in ``sys.path`` order is used and the clash is reported.
- A broken descriptor file or plugin class never stops discovery: any exception raised while
  reading a descriptor file, or locating or importing a plugin's module (an ``ImportError``, a
  ``NameError`` from the plugin package's ``__init__.py``, even ``SystemExit``) is stored, and
  raised only when that plugin is asked for, as a ``ValueError`` whose message begins with
  ``Unable to load executor <name>`` (or ``launcher``), the words psij-python uses and that
  client code matches on, chained from the stored error.
- The registry is an object; nothing is stored on plugin classes.
"""

import importlib
import importlib.util
import os
import sys
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List, Optional, Tuple

from psij._lazylog import LazyLogger
from psij.descriptor import Descriptor

logger = LazyLogger(__name__)

DESCRIPTORS_DIR = "psij-descriptors"
KINDS = ("executor", "launcher")

# What third-party code may raise at import and that must stay with its plugin. SystemExit is
# included (a module that exits when a dependency is missing); KeyboardInterrupt is not.
_PLUGIN_ERRORS = (Exception, SystemExit)


@dataclass
class PluginEntry:
    """One declared plugin version and, once asked for, its class or the error loading it."""

    kind: str
    desc: Descriptor
    root: str
    descriptor_file: str
    cls: Optional[type] = None
    error: Optional[BaseException] = None
    loaded: bool = False
    notes: List[str] = field(default_factory=list)

    @property
    def class_file(self) -> Optional[str]:
        return _module_file(self.root, self.desc.cls.rpartition(".")[0])


@dataclass
class _BrokenFile:
    path: str
    error: BaseException


class PluginRegistry:
    """All executors and launchers declared on ``sys.path``, discovered once, loaded on demand."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._entries: Optional[Dict[str, Dict[str, List[PluginEntry]]]] = None
        self.broken_files: List[_BrokenFile] = []
        self._sideload_count = 0

    def _discover(self) -> Dict[str, Dict[str, List[PluginEntry]]]:
        with self._lock:
            if self._entries is not None:
                return self._entries
            entries: Dict[str, Dict[str, List[PluginEntry]]] = {k: {} for k in KINDS}
            seen = set()
            for entry in list(sys.path):
                try:
                    root = os.path.realpath(entry or os.getcwd())
                except (OSError, TypeError, ValueError):
                    continue  # not a path, or "" while the current directory is gone
                if root in seen:
                    continue
                seen.add(root)
                folder = os.path.join(root, DESCRIPTORS_DIR)
                try:
                    names = sorted(os.listdir(folder))
                except OSError:
                    continue
                for fname in names:
                    if fname.endswith(".py") and not fname.startswith("."):
                        self._read_descriptor_file(root, os.path.join(folder, fname), entries)
            self._entries = entries
            return entries

    def _read_descriptor_file(self, root: str, path: str,
                              entries: Dict[str, Dict[str, List[PluginEntry]]]) -> None:
        modname = "psij-descriptors." + Path(path).stem
        try:
            spec = importlib.util.spec_from_file_location(modname, path)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot read {path}")
            mod = importlib.util.module_from_spec(spec)
            with warnings.catch_warnings():
                # Descriptor files written for psij-python import distutils, deprecated since
                # Python 3.10; under -W error that warning would hide the plugins they declare.
                warnings.simplefilter("ignore", DeprecationWarning)
                spec.loader.exec_module(mod)
        except _PLUGIN_ERRORS as ex:  # a broken descriptor file must not stop discovery
            logger.warning("could not read plugin descriptor file %s: %s", path, ex)
            self.broken_files.append(_BrokenFile(path, ex))
            return
        for kind in KINDS:
            declared = getattr(mod, f"__PSI_J_{kind.upper()}S__", None)
            if declared is None:
                continue
            if not isinstance(declared, (list, tuple)):
                self.broken_files.append(_BrokenFile(path, TypeError(
                    f"__PSI_J_{kind.upper()}S__ must be a list of Descriptor")))
                continue
            for desc in declared:
                if not isinstance(desc, Descriptor):
                    self.broken_files.append(_BrokenFile(path, TypeError(
                        f"__PSI_J_{kind.upper()}S__ holds {desc!r}, not a Descriptor")))
                    continue
                desc.path = path
                self._insert(entries[kind], PluginEntry(kind, desc, root, path))

    def _insert(self, store: Dict[str, List[PluginEntry]], entry: PluginEntry) -> None:
        desc = entry.desc
        names = [desc.name.lower()] + [a.lower() for a in desc.aliases]
        for name in dict.fromkeys(names):
            versions = store.setdefault(name, [])
            clash = next((e for e in versions if e.desc.version == desc.version), None)
            if clash is not None:
                same = (clash.desc.cls == desc.cls and clash.class_file == entry.class_file) \
                    or clash is entry
                if not same:
                    note = (f"{entry.kind} {name!r} {desc.version} is declared again in "
                            f"{entry.descriptor_file} (class file {entry.class_file}); the one "
                            f"in {clash.descriptor_file} is used")
                    logger.warning("%s", note)
                    clash.notes.append(note)
                continue
            versions.append(entry)
            versions.sort(key=lambda e: e.desc.version)

    # -- queries -------------------------------------------------------------------------------

    def names(self, kind: str) -> List[str]:
        """Names (and aliases) of plugins of a kind; names starting with ``_`` are hidden."""
        return sorted(n for n in self._discover()[kind] if not n.startswith("_"))

    def entries(self, kind: str) -> List[Tuple[str, PluginEntry]]:
        return [(name, e) for name, vs in sorted(self._discover()[kind].items()) for e in vs]

    def select(self, kind: str, name: str, version_constraint: Optional[str] = None,
               base: Optional[type] = None) -> PluginEntry:
        """The entry for ``name`` matching the constraint, with its class loaded.

        Raises ValueError for an unknown name, an unsatisfiable constraint, or a plugin whose
        class could not be loaded (chained from the stored error) or is not a subclass of
        ``base``.
        """
        if not isinstance(name, str):
            raise TypeError(f"{kind} name: expected str, got {name!r} ({type(name).__name__})")
        store = self._discover()[kind]
        versions = store.get(name.lower())
        if not versions:
            raise ValueError(f"no {kind} named {name!r}; available {kind}s: "
                             f"{', '.join(self.names(kind)) or '(none)'}")
        if version_constraint is not None:
            from packaging.specifiers import InvalidSpecifier, SpecifierSet

            try:
                spec = SpecifierSet(version_constraint)
            except (InvalidSpecifier, TypeError) as ex:
                raise ValueError(f"version_constraint: {version_constraint!r} is not a version "
                                 "specifier such as '>= 1.0' or '~= 0.9'") from ex
            matching = [e for e in versions if spec.contains(e.desc.version, prereleases=True)]
            if not matching:
                have = ", ".join(str(e.desc.version) for e in versions)
                raise ValueError(f"no {kind} {name!r} satisfies {version_constraint!r}; "
                                 f"versions found: {have}")
            chosen = matching[-1]
        else:
            chosen = versions[-1]
        self.load(chosen)
        where = f"version {chosen.desc.version} declared in {chosen.descriptor_file}"
        if chosen.error is not None:
            raise ValueError(f"Unable to load {kind} {name}: {where}: "
                             f"{type(chosen.error).__name__}: {chosen.error}") from chosen.error
        if base is not None and not (isinstance(chosen.cls, type)
                                     and issubclass(chosen.cls, base)):
            raise ValueError(f"Unable to load {kind} {name}: {where}: {chosen.desc.cls} is not "
                             f"a {base.__module__.partition('.')[0]}.{base.__name__}")
        return chosen

    def load(self, entry: PluginEntry) -> None:
        with self._lock:
            if entry.loaded:
                return
            try:
                entry.cls = self._load_class(entry)
            except _PLUGIN_ERRORS as ex:
                entry.error = ex
            entry.loaded = True

    def _load_class(self, entry: PluginEntry) -> type:
        modname, _, clsname = entry.desc.cls.rpartition(".")
        file = entry.class_file
        if file is None:
            raise ImportError(f"module {modname} is not in {entry.root} (where its descriptor "
                              f"{entry.descriptor_file} is)")
        mod = self._module_from(modname, file)
        try:
            cls = getattr(mod, clsname)
        except AttributeError:
            raise ImportError(f"{file} has no class {clsname}") from None
        if not isinstance(cls, type):
            raise TypeError(f"{entry.desc.cls} is not a class")
        return cls

    def _module_from(self, modname: str, file: str) -> ModuleType:
        current = sys.modules.get(modname)
        if current is not None and _same_file(getattr(current, "__file__", None), file):
            return current
        if current is None:
            try:
                spec = importlib.util.find_spec(modname)
            except (ImportError, ValueError):
                spec = None
            if spec is not None and _same_file(spec.origin, file):
                return importlib.import_module(modname)
        # The canonical name belongs to another path entry: load this file on its own.
        self._sideload_count += 1
        alias = f"_psij_plugin_{self._sideload_count}.{modname}"
        spec = importlib.util.spec_from_file_location(alias, file)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {file}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[alias] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[alias]
            raise
        return mod

    def register(self, kind: str, desc: Descriptor, root: str) -> None:
        """Add a descriptor by hand (for code that registers plugins programmatically)."""
        entries = self._discover()
        with self._lock:
            self._insert(entries[kind], PluginEntry(kind, desc, os.path.realpath(root),
                                                    desc.path or "<registered>"))

    def find_entry_for_class(self, kind: str, cls: type) -> Optional[PluginEntry]:
        """The entry whose loaded class is ``cls`` (for instances made without get_instance)."""
        if self._entries is None:
            return None
        for vs in self._entries[kind].values():
            for e in vs:
                if e.cls is cls:
                    return e
        return None

    def reset(self) -> None:
        """Forget everything found so far (the next query discovers again)."""
        with self._lock:
            self._entries = None
            self.broken_files = []


def _module_file(root: str, modname: str) -> Optional[str]:
    base = os.path.join(root, *modname.split("."))
    for candidate in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def _same_file(a: Optional[str], b: Optional[str]) -> bool:
    if not a or not b:
        return False
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


REGISTRY = PluginRegistry()


def describe(kind: str) -> List[Dict[str, Any]]:
    """One record per declared plugin of a kind, loading each to report its load error."""
    out = []
    seen = set()
    for name, entry in REGISTRY.entries(kind):
        REGISTRY.load(entry)
        key = id(entry)
        alias_of = entry.desc.name if name != entry.desc.name.lower() else None
        out.append({
            "name": name,
            "alias_of": alias_of,
            "version": str(entry.desc.version),
            "descriptor": entry.descriptor_file,
            "class": entry.desc.cls,
            "class_file": entry.class_file,
            "error": None if entry.error is None else f"{type(entry.error).__name__}: "
                                                       f"{entry.error}",
            "notes": list(entry.notes) if key not in seen else [],
        })
        seen.add(key)
    return out
