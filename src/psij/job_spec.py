"""What to run: executable, arguments, environment, redirections, resources, attributes, staging.

Pure data. Every field is checked when it is set (in the constructor and afterwards), so a bad
value fails where it was written, with the field's name in the message; lists and dicts that
can be changed in place afterwards are checked again at submit
(:meth:`psij.JobExecutor._check_job`). What is accepted follows psij-python, the reference:
what it takes and runs correctly is taken here (path-like values become text), what it takes
and then fails on or runs wrongly is refused (see docs/compat.rst).
"""

import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Union

from psij import _check
from psij.job_attributes import JobAttributes
from psij.resource_spec import ResourceSpec
from psij.staging import StageIn, StageOut, StageOutFlags

__all__ = ["JobSpec"]

_PATH_FIELDS = frozenset(("directory", "stdin_path", "stdout_path", "stderr_path", "pre_launch",
                          "post_launch"))

# Constructor parameters in order; serialization and equality walk this list.
FIELDS = ("executable", "arguments", "directory", "name", "inherit_environment", "environment",
          "stdin_path", "stdout_path", "stderr_path", "resources", "attributes", "pre_launch",
          "post_launch", "launcher", "stage_in", "stage_out", "cleanup", "cleanup_flags")


def _staging_list(field: str, value: Any, cls: type) -> Optional[List[Any]]:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise _check.fail_type(field, value, f"a set or list of {cls.__name__}, or None")
    items = list(value)
    for i, item in enumerate(items):
        if not isinstance(item, cls):
            raise _check.fail_type(f"{field}[{i}]", item, cls.__name__)
    return items


class JobSpec:
    """The description of a job, independent of where it runs.

    Path fields accept ``str`` or any path-like object (``pathlib.Path``, ``os.PathLike``) and
    are stored as ``Path`` (``directory=""`` is the current directory, ``"."``).
    ``executable`` and the items of ``arguments`` accept ``str``, ``bytes`` or a path-like
    object and are stored as text (``os.fspath``, ``os.fsdecode``); ``arguments`` may be given as
    any ordered iterable (list, tuple, generator) and is stored as a new list, which may be
    changed in place (``spec.arguments.append(...)``): its items are checked again at submit.
    Environment values accept ``str``, ``int`` or a path-like object and are stored as
    ``str``. See :doc:`compat` for how each value compares with psij-python.
    """

    executable: Optional[str]
    arguments: Optional[List[str]]
    directory: Optional[Path]
    inherit_environment: bool
    environment: Optional[Dict[str, str]]
    stdin_path: Optional[Path]
    stdout_path: Optional[Path]
    stderr_path: Optional[Path]
    resources: Optional[ResourceSpec]
    pre_launch: Optional[Path]
    post_launch: Optional[Path]
    launcher: Optional[str]
    stage_in: Optional[List[StageIn]]
    stage_out: Optional[List[StageOut]]
    cleanup: Optional[List[Path]]
    cleanup_flags: StageOutFlags

    def __init__(
        self,
        executable: "Union[str, bytes, os.PathLike[str], None]" = None,
        arguments: "Optional[Iterable[Union[str, bytes, os.PathLike[str]]]]" = None,
        directory: "Union[str, os.PathLike[str], None]" = None,
        name: Optional[str] = None,
        inherit_environment: bool = True,
        environment: "Optional[Mapping[str, Union[str, int, os.PathLike[str]]]]" = None,
        stdin_path: "Union[str, os.PathLike[str], None]" = None,
        stdout_path: "Union[str, os.PathLike[str], None]" = None,
        stderr_path: "Union[str, os.PathLike[str], None]" = None,
        resources: Optional[ResourceSpec] = None,
        attributes: Optional[JobAttributes] = None,
        pre_launch: "Union[str, os.PathLike[str], None]" = None,
        post_launch: "Union[str, os.PathLike[str], None]" = None,
        launcher: Optional[str] = None,
        stage_in: Optional[Iterable[StageIn]] = None,
        stage_out: Optional[Iterable[StageOut]] = None,
        cleanup: "Optional[Iterable[Union[str, os.PathLike[str]]]]" = None,
        cleanup_flags: StageOutFlags = StageOutFlags.ALWAYS,
    ) -> None:
        values = (executable, arguments, directory, name, inherit_environment, environment,
                  stdin_path, stdout_path, stderr_path, resources, attributes, pre_launch,
                  post_launch, launcher, stage_in, stage_out, cleanup, cleanup_flags)
        for field, value in zip(FIELDS, values):
            setattr(self, field, value)

    def __setattr__(self, field: str, value: Any) -> None:
        label = "JobSpec." + field
        if field in _PATH_FIELDS:
            # "" as directory is the current directory, as psij-python reads it (Path("")).
            value = _check.opt_path(label, value, "." if field == "directory" else None)
        elif field == "executable":
            value = _check.opt_text(label, value, raw=True)
            if value == "":
                raise ValueError("JobSpec.executable: must not be empty")
        elif field == "name":
            field, value = "_name", _check.opt_name(label, value)
        elif field == "launcher":
            value = _check.opt_str(label, value)
        elif field == "arguments":
            value = _check.opt_str_list(label, value, raw=True)
        elif field == "inherit_environment":
            value = _check.flag(label, value)
        elif field == "environment":
            value = _check.env_dict(label, value)
        elif field == "resources":
            value = _check.instance(label, value, ResourceSpec, "psij.ResourceSpec")
        elif field == "attributes":
            value = _check.instance(label, value, JobAttributes, "psij.JobAttributes")
        elif field == "stage_in":
            value = _staging_list(label, value, StageIn)
        elif field == "stage_out":
            value = _staging_list(label, value, StageOut)
        elif field == "cleanup":
            if value is not None:
                if isinstance(value, (str, bytes, os.PathLike)) or not isinstance(value, Iterable):
                    raise _check.fail_type(label, value, "a set or list of paths, or None")
                value = [_check.opt_path(f"{label}[{i}]", v) for i, v in enumerate(value)]
                if any(v is None for v in value):
                    raise TypeError(f"{label}: entries must be str or path-like, not None")
        elif field == "cleanup_flags":
            value = _check.instance(label, value, StageOutFlags, "psij.staging.StageOutFlags",
                                    False)
        elif not field.startswith("_"):
            raise AttributeError(f"JobSpec has no field {field!r}; fields: {', '.join(FIELDS)}")
        object.__setattr__(self, field, value)

    @property
    def name(self) -> Optional[str]:
        """The job's name; defaults to the executable."""
        n: Optional[str] = self.__dict__.get("_name")
        return n if n is not None else self.executable

    @name.setter
    def name(self, value: Optional[str]) -> None:
        self.__setattr__("name", value)

    @property
    def attributes(self) -> JobAttributes:
        """Scheduler attributes; a default ``JobAttributes()`` is made on first read if unset."""
        attrs: Optional[JobAttributes] = self.__dict__.get("_attributes")
        if attrs is None:
            attrs = JobAttributes()
            object.__setattr__(self, "_attributes", attrs)
        return attrs

    @attributes.setter
    def attributes(self, value: Optional[JobAttributes]) -> None:
        value = _check.instance("JobSpec.attributes", value, JobAttributes, "psij.JobAttributes")
        object.__setattr__(self, "_attributes", value)

    def _explicit_name(self) -> Optional[str]:
        n: Optional[str] = self.__dict__.get("_name")
        return n

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, JobSpec):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in FIELDS)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        shown = []
        for f in FIELDS:
            v = getattr(self, f)
            if f == "attributes" and v == JobAttributes():
                continue
            if v is None or (f == "inherit_environment" and v is True) or (
                    f == "cleanup_flags" and v == StageOutFlags.ALWAYS) or (
                    f == "name" and self._explicit_name() is None):
                continue
            shown.append(f"{f}={v!r}")
        return "JobSpec(" + ", ".join(shown) + ")"
