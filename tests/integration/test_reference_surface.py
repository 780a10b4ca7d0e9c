"""Every module and public name of psij-python 0.9.11 and of its development line imports
here, and the reference's classes and functions take the same parameters.

psij-python 0.9.11 is installed from the package index into a side venv under the test cache
(``support.reference_venv``), where ``tests/support/surface_lister.py`` lists its modules, their
public names (classes and functions of the package, wherever in it they are defined, and
module constants; not the standard-library, ``typing`` or third-party names they import) and
the parameters of its public callables. Its development line (the main branch after 0.9.11) is
not on the package index: what it adds is kept below as data (``DEVELOPMENT_LINE``).
"""

import enum
import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from support.reference_venv import REFERENCE, REFERENCE_REQUIREMENTS, REPO, side_venv

LISTER = REPO / "tests" / "support" / "surface_lister.py"

# What psij-python's development line adds to 0.9.11's surface (module -> public names).
DEVELOPMENT_LINE = {
    "psij.staging": ["StageIn", "StageOut", "StageOutFlags", "StagingMode", "URI"],
    "psij.executors.batch.nqsv": ["NQSVExecutorConfig", "NQSVJobExecutor", "LARGE_TIMEOUT"],
    "psij.executors.batch.pbs_base": ["GenericPBSJobExecutor", "PBSExecutorConfig",
                                      "check_status_exit_code"],
}
DEVELOPMENT_STATES = ["STAGE_IN", "STAGE_OUT", "CLEANUP"]
DEVELOPMENT_SPEC_PARAMETERS = ["stage_in", "stage_out", "cleanup", "cleanup_flags"]
DEVELOPMENT_EXECUTORS = ["nqsv"]

# Names of the reference left out on purpose, with why (docs/compat.rst says the same).
LEFT_OUT = {
    ("psij", "PACKAGE"): "the reference's plugin scan at import: its folder name list",
    ("psij", "TYPES"): "the reference's plugin scan at import: its registration table",
    ("psij", "seen_paths"): "the reference's plugin scan at import: the sys.path entries seen",
}

# Parameters that differ on purpose: (module, qualified name) -> why.
SIGNATURE_DIFFERENCES: Dict[Tuple[str, str], str] = {}


@pytest.fixture(scope="module")
def reference() -> Dict[str, Any]:
    python = side_venv(REFERENCE, REFERENCE_REQUIREMENTS)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run([str(python), str(LISTER)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=str(python.parent))
    assert done.returncode == 0, done.stderr
    surface: Dict[str, Any] = json.loads(done.stdout)
    assert "psij.job" in surface and "Job" in surface["psij.job"]["names"]
    return surface


def _names(reference: Dict[str, Any]) -> List[Tuple[str, str, Dict[str, Any]]]:
    return [(module, name, info) for module, entry in sorted(reference.items())
            for name, info in sorted(entry["names"].items()) if (module, name) not in LEFT_OUT]


def test_every_module_of_the_reference_imports_here(reference: Dict[str, Any]) -> None:
    failed = {}
    for module in reference:
        try:
            importlib.import_module(module)
        except Exception as e:
            failed[module] = f"{type(e).__name__}: {e}"
    assert failed == {}


def test_every_public_name_of_the_reference_exists_here(reference: Dict[str, Any]) -> None:
    missing = [f"{module}.{name}" for module, name, _ in _names(reference)
               if not hasattr(importlib.import_module(module), name)]
    assert missing == []
    assert len(_names(reference)) > 150  # the listing is the whole surface, not a part


def _parameters(obj: Any) -> List[inspect.Parameter]:
    return [p for p in inspect.signature(obj).parameters.values() if p.name != "self"]


def _differences(reference_params: List[List[Any]], ours: Any) -> List[str]:
    """How ``ours`` fails to take the reference's parameters: each of them, in the same
    position and by the same name; a default where the reference has one (the same one when
    it is a plain value); any further parameter of ours optional."""
    try:
        params = _parameters(ours)
    except (TypeError, ValueError):
        return []
    found = []
    mine = {p.name: (i, p) for i, p in enumerate(params)}
    variadic = any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params)
    # The first parameter of a method (self, or cls of a class method) is bound on both sides.
    ref = reference_params[1:] if reference_params and reference_params[0][0] in ("self", "cls") \
        else reference_params
    for i, (name, kind, default) in enumerate(ref):
        if kind in ("VAR_POSITIONAL", "VAR_KEYWORD"):
            continue
        if name not in mine:
            if not variadic:
                found.append(f"no parameter {name!r}")
            continue
        index, p = mine[name]
        if kind == "POSITIONAL_OR_KEYWORD" and index != i:
            found.append(f"{name!r} is parameter {index}, the reference's is {i}")
        if default is not None and p.default is p.empty:
            found.append(f"{name!r} has no default (the reference's is {default})")
        elif default not in (None, "<object>") and repr(p.default) != default \
                and not isinstance(p.default, enum.Enum):
            found.append(f"{name!r} defaults to {p.default!r}, the reference's to {default}")
    names = {r[0] for r in ref}
    for p in params:
        if p.name not in names and p.default is p.empty \
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            found.append(f"{p.name!r} is required here and unknown to the reference")
    return found


def test_public_callables_take_the_reference_parameters(reference: Dict[str, Any]) -> None:
    problems: Dict[str, List[str]] = {}
    for module, name, info in _names(reference):
        ours = getattr(importlib.import_module(module), name)
        if info["kind"] == "function" and info["parameters"] is not None:
            found = _differences(info["parameters"], ours)
            if found and (module, name) not in SIGNATURE_DIFFERENCES:
                problems[f"{module}.{name}"] = found
        if info["kind"] != "class" or (inspect.isclass(ours) and issubclass(ours, enum.Enum)):
            continue
        for method, params in info["methods"].items():
            qualified = f"{name}.{method}"
            if params == "property":
                continue
            attr = inspect.getattr_static(ours, method, None)
            if attr is None:
                problems.setdefault(f"{module}.{qualified}", []).append("missing")
                continue
            if params is None or (module, qualified) in SIGNATURE_DIFFERENCES:
                continue
            found = _differences(params, getattr(ours, method))
            if found:
                problems[f"{module}.{qualified}"] = found
    assert problems == {}


def test_reference_classes_can_be_subclassed_here(reference: Dict[str, Any]) -> None:
    refused = {}
    for module, name, info in _names(reference):
        ours = getattr(importlib.import_module(module), name)
        if info["kind"] != "class" or (issubclass(ours, enum.Enum) and len(ours) > 0):
            continue  # an enumeration with members cannot be subclassed, there either
        try:
            type(f"Site{name}", (ours,), {"__module__": __name__})
        except TypeError as e:
            refused[f"{module}.{name}"] = str(e)
    assert refused == {}


def test_the_development_line_surface_exists_here() -> None:
    missing = [f"{module}.{name}" for module, names in DEVELOPMENT_LINE.items()
               for name in names if not hasattr(importlib.import_module(module), name)]
    assert missing == []
    from psij import JobExecutor, JobSpec, JobState
    assert all(hasattr(JobState, s) for s in DEVELOPMENT_STATES)
    spec_params = inspect.signature(JobSpec).parameters
    assert all(p in spec_params for p in DEVELOPMENT_SPEC_PARAMETERS)
    assert set(DEVELOPMENT_EXECUTORS) <= set(JobExecutor.get_executor_names())


def test_the_lister_reads_this_package_too(tmp_path: Path) -> None:
    """The lister sees imported names and signatures here as it does in the reference (it
    would otherwise hide a difference)."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    done = subprocess.run([sys.executable, str(LISTER)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    ours = json.loads(done.stdout)
    base = ours["psij.executors.batch.pbs_base"]["names"]
    assert {"GenericPBSJobExecutor", "PBSExecutorConfig", "check_status_exit_code"} <= set(base)
    init = base["GenericPBSJobExecutor"]["methods"]["__init__"]
    assert [p[0] for p in init] == ["self", "generator", "url", "config"]
    assert "psij.utils" in ours and "SingletonThread" in ours["psij.utils"]["names"]
