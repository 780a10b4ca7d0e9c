"""JSON form of a :class:`~psij.JobSpec`, for saving a job description and reading it back.

Pure conversion between a ``JobSpec`` and JSON text; it never runs, submits or opens anything
except the stream it is handed. Values are checked by the model classes themselves, so a bad
document fails with the same field-naming ``TypeError``/``ValueError`` as bad code would.

The document is one JSON object:

- Keys are the ``JobSpec`` constructor parameter names. Only values that differ from the
  constructor's default are written; ``name`` is written only when it was set explicitly (it
  otherwise follows the executable), ``attributes`` only when they differ from
  ``JobAttributes()``.
- Paths (``directory``, ``stdin_path``, ..., ``cleanup`` entries) are strings.
- ``environment`` is an object of strings; ``arguments`` a list of strings.
- ``resources`` is an object of the non-default ``ResourceSpecV1`` fields plus
  ``"__version": 1``. A missing ``__version`` is read as 1, the only version there is.
- ``attributes`` is an object of the non-default ``JobAttributes`` fields; ``project_name`` is
  never written (it is an alias of ``account``) but is read, and must then agree with
  ``account``. ``custom_attributes`` is an object of str, int, float (finite), bool or null;
  its keys are any strings (``"slurm.qos"``, ``"ATTR1"``).
- Durations are a JSON number of seconds: an integer when whole, otherwise a float, which is
  exact to the microsecond for anything shorter than 2**52 microseconds (about 142 years).
  A longer duration with a fractional second is written as the string ``"<seconds> s"``
  (``"9999999999.5 s"``), which is exact. On reading, numbers and strings of the form
  ``"<decimal seconds> s"`` (the form older writers use, e.g. ``"1200.0 s"``) are read exactly;
  other strings go through :meth:`~psij.JobAttributes.parse_walltime` (``"01:30:00"``, ``"90 m"``).
- ``stage_in`` is a list of ``{"source": "<URI>", "target": "<path>", "mode": "COPY"}``;
  ``stage_out`` a list of ``{"source": "<path>", "target": "<URI>", "flags": [...],
  "mode": "COPY"}``. Staging entries are written in full; on reading, ``mode`` defaults to
  ``COPY`` and ``flags`` to ``ALWAYS``. Modes are ``StagingMode`` member names.
- Stage-out flags (an entry's ``flags`` and the spec's ``cleanup_flags``) are written as the list
  of single-bit ``StageOutFlags`` names, e.g. ``["ON_SUCCESS", "ON_ERROR", "ON_CANCEL"]`` for
  ``ALWAYS`` and ``[]`` for ``NONE``. On reading, a list of any member names (``"ALWAYS"``
  included), a single name, or the integer value are accepted.

A key that is not one of the above raises ``ValueError`` naming the key and the accepted keys.
Text is written with non-ASCII characters escaped, so any Python string survives the trip through
a UTF-8 file, lone surrogates included (file names that were not valid UTF-8 are held that way).
The one exception is JSON's own: a high surrogate directly followed by a low one is written as
the same escape pair as the character it encodes, and reads back as that character.
"""

import inspect
import io
import json
import math
import re
from abc import ABC, abstractmethod
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import IO, Any, Callable, Dict, List, Mapping, Union

from psij import _check
from psij.job_attributes import JobAttributes, check_custom_name, check_custom_value
from psij.job_spec import FIELDS, JobSpec
from psij.resource_spec import ResourceSpec
from psij.staging import StageIn, StageOut, StageOutFlags, StagingMode

__all__ = ["JSONSerializer", "Serializer"]

JSONObject = Dict[str, Any]

_VERSION_KEY = "__version"

# Below 2**52 microseconds a double's rounding error stays under half a microsecond, so the
# float written for a duration reads back as the same whole number of microseconds.
_EXACT_FLOAT_MICROSECONDS = 2 ** 52
_LONGEST_MICROSECONDS = timedelta.max // timedelta(microseconds=1)
_LONGEST_SECONDS = Decimal(_LONGEST_MICROSECONDS // 1_000_000 + 1)

# The form older writers use for durations: "<decimal seconds> s", e.g. "1200.0 s" or "1e-06 s".
_SECONDS_TEXT = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)\s*s\s*")

_STAGE_IN_KEYS = ("source", "target", "mode")
_STAGE_OUT_KEYS = ("source", "target", "flags", "mode")
_ATTRIBUTE_KEYS = ("duration", "queue_name", "account", "reservation_id", "custom_attributes",
                   "project_name")

# Flags are written bit by bit so that a reader needs no knowledge of composite names.
_SINGLE_BIT_FLAGS = [f for f in StageOutFlags.__members__.values()
                     if f.value and f.value & (f.value - 1) == 0]


def _defaults(cls: type) -> Dict[str, Any]:
    params = inspect.signature(cls.__init__).parameters  # type: ignore[misc]
    return {p.name: p.default for p in params.values() if p.name != "self"}


_SPEC_DEFAULTS = _defaults(JobSpec)
_ATTRIBUTE_DEFAULTS = _defaults(JobAttributes)


class Serializer(ABC):
    """Base class of job-spec serializers, as in psij-python: a subclass writes and reads the
    document form of a spec (a dict of str keys whose values are dicts, lists, str, int, float,
    bool or None; the format this module describes) in its own syntax, by implementing
    ``_dump_dict`` and ``_load_dict``. ``dump``/``load``/``dumps``/``loads`` are built
    on those two; a subclass may override them to work on its text directly.
    """

    def dump(self, spec: JobSpec, stream: IO[Any]) -> None:
        """Write ``spec`` to ``stream``."""
        self._dump_dict(self._from_spec(spec), stream)

    def load(self, stream: IO[Any]) -> JobSpec:
        """Read one document from ``stream`` and return the ``JobSpec`` it describes."""
        return self._to_spec(self._load_dict(stream))

    def dumps(self, spec: JobSpec) -> str:
        """The text of ``spec``."""
        out = io.StringIO()
        self.dump(spec, out)
        return out.getvalue()

    def loads(self, s: Union[str, bytes]) -> JobSpec:
        """The ``JobSpec`` described by the text ``s``."""
        if isinstance(s, (bytes, bytearray)):
            s = s.decode("utf-8")
        if not isinstance(s, str):
            raise _check.fail_type(f"{type(self).__name__}: text to read", s, "str or bytes")
        return self.load(io.StringIO(s))

    @abstractmethod
    def _dump_dict(self, dict: Dict[str, object], stream: IO[Any]) -> None:
        """Write the document form of a spec to ``stream``."""

    @abstractmethod
    def _load_dict(self, stream: IO[Any]) -> Dict[str, object]:
        """Read the document form of a spec from ``stream``."""

    def _from_spec(self, spec: JobSpec) -> Dict[str, object]:
        """The document form of ``spec``."""
        if not isinstance(spec, JobSpec):
            raise _check.fail_type(f"{type(self).__name__}: object to write", spec,
                                   "psij.JobSpec")
        return _spec_to_json(spec)

    def _to_spec(self, d: Dict[str, object]) -> JobSpec:
        """The ``JobSpec`` of a document form; ValueError/TypeError naming what is wrong."""
        return _spec_from_json(d)


class JSONSerializer(Serializer):
    """Writes a :class:`~psij.JobSpec` as JSON and reads it back.

    ``dump``/``load`` work on text streams (binary streams are read and written as UTF-8);
    ``dumps``/``loads`` on strings. The format is described in this module's documentation.
    """

    def dump(self, spec: JobSpec, stream: IO[Any]) -> None:
        """Write ``spec`` as JSON to ``stream``."""
        text = self.dumps(spec)
        if _is_binary(stream):
            stream.write(text.encode("utf-8"))
        else:
            stream.write(text)

    def load(self, stream: IO[Any]) -> JobSpec:
        """Read one JSON document from ``stream`` and return the ``JobSpec`` it describes."""
        data = stream.read()
        if isinstance(data, (bytes, bytearray)):
            data = data.decode("utf-8")
        return self.loads(data)

    def dumps(self, spec: JobSpec) -> str:
        """The JSON text of ``spec``."""
        return json.dumps(self._from_spec(spec), allow_nan=False)

    def loads(self, s: Union[str, bytes]) -> JobSpec:
        """The ``JobSpec`` described by the JSON text ``s``."""
        if isinstance(s, (bytes, bytearray)):
            s = s.decode("utf-8")
        if not isinstance(s, str):
            raise _check.fail_type("JSONSerializer: text to read", s, "str or bytes")
        return _spec_from_json(json.loads(s))

    def _dump_dict(self, dict: Dict[str, object], stream: IO[Any]) -> None:
        text = json.dumps(dict, allow_nan=False)
        stream.write(text.encode("utf-8") if _is_binary(stream) else text)

    def _load_dict(self, stream: IO[Any]) -> Dict[str, object]:
        data = stream.read()
        loaded = json.loads(data.decode("utf-8") if isinstance(data, (bytes, bytearray))
                            else data)
        if not isinstance(loaded, dict):
            raise ValueError(f"JSONSerializer: a job spec document is a JSON object, got "
                             f"{type(loaded).__name__}")
        return loaded


def _is_binary(stream: IO[Any]) -> bool:
    if isinstance(stream, (io.RawIOBase, io.BufferedIOBase)):
        return True
    if isinstance(stream, io.TextIOBase):
        return False
    return "b" in getattr(stream, "mode", "")


# ---- writing -------------------------------------------------------------------------------

def _spec_to_json(spec: JobSpec) -> JSONObject:
    out: JSONObject = {}
    for field in FIELDS:
        value: Any
        if field == "attributes":
            # Unset attributes are written as none, without making a default JobAttributes;
            # set ones are empty exactly when they equal JobAttributes().
            stored = spec.__dict__.get("_attributes")
            attributes = _attributes_to_json(stored) if stored is not None else None
            if attributes:
                out[field] = attributes
            continue
        if field == "name":
            value = spec._explicit_name()
        else:
            value = getattr(spec, field)
        if value == _SPEC_DEFAULTS[field]:
            continue
        out[field] = _SPEC_WRITERS.get(field, _as_is)(value)
    return out


def _as_is(value: Any) -> Any:
    return value


def _path_text(value: Path) -> str:
    return str(value)


def _resources_to_json(res: ResourceSpec) -> JSONObject:
    out: JSONObject = {}
    for name, default in _defaults(type(res)).items():
        value = getattr(res, name)
        if value != default:
            out[name] = value
    out[_VERSION_KEY] = res.version
    return out


def _attributes_to_json(attrs: JobAttributes) -> JSONObject:
    out: JSONObject = {}
    for name in ("duration", "queue_name", "account", "reservation_id"):
        value = getattr(attrs, name)
        if value != _ATTRIBUTE_DEFAULTS[name]:
            out[name] = _duration_to_json(value) if name == "duration" else value
    custom = attrs.custom_attributes
    if custom:
        # Checked again here: the dict is the caller's and may have changed since it was set.
        for key, v in custom.items():
            check_custom_value(check_custom_name(key), v)
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError(f"JobAttributes.custom_attributes[{key!r}]: {v} has no JSON "
                                 "form; accepted: finite numbers")
        out["custom_attributes"] = dict(custom)
    return out


def _duration_to_json(d: timedelta) -> Union[int, float, str]:
    if d.microseconds == 0:
        return d.days * 86400 + d.seconds
    seconds = d.total_seconds()
    if abs(d // timedelta(microseconds=1)) < _EXACT_FLOAT_MICROSECONDS:
        return seconds
    return f"{d.days * 86400 + d.seconds}.{d.microseconds:06d} s"


def _flags_to_json(flags: StageOutFlags) -> List[str]:
    return [f.name for f in _SINGLE_BIT_FLAGS if f & flags and f.name is not None]


def _stage_in_to_json(items: List[StageIn]) -> List[JSONObject]:
    return [{"source": str(s.source), "target": str(s.target), "mode": s.mode.name}
            for s in items]


def _stage_out_to_json(items: List[StageOut]) -> List[JSONObject]:
    return [{"source": str(s.source), "target": str(s.target), "flags": _flags_to_json(s.flags),
             "mode": s.mode.name} for s in items]


_SPEC_WRITERS: Dict[str, Callable[[Any], Any]] = {
    "directory": _path_text,
    "stdin_path": _path_text,
    "stdout_path": _path_text,
    "stderr_path": _path_text,
    "pre_launch": _path_text,
    "post_launch": _path_text,
    "resources": _resources_to_json,
    "stage_in": _stage_in_to_json,
    "stage_out": _stage_out_to_json,
    "cleanup": lambda paths: [str(p) for p in paths],
    "cleanup_flags": _flags_to_json,
}


# ---- reading -------------------------------------------------------------------------------

def _object(field: str, value: Any) -> JSONObject:
    if not isinstance(value, dict):
        raise _check.fail_type(field, value, "a JSON object")
    return value


def _check_keys(field: str, obj: Mapping[str, Any], accepted: Any) -> None:
    for key in obj:
        if key not in accepted:
            raise ValueError(f"{field}: unknown key {key!r}; accepted: {', '.join(accepted)}")


def _spec_from_json(doc: Any) -> JobSpec:
    doc = _object("JobSpec", doc)
    _check_keys("JobSpec", doc, FIELDS)
    kwargs = {field: _SPEC_READERS.get(field, _as_is)(value) for field, value in doc.items()}
    return JobSpec(**kwargs)


def _resources_from_json(value: Any) -> ResourceSpec:
    obj = _object("JobSpec.resources", value)
    version = obj.get(_VERSION_KEY, 1)
    if isinstance(version, bool) or not isinstance(version, int):
        raise _check.fail_type(f"JobSpec.resources.{_VERSION_KEY}", version, "int")
    cls = type(ResourceSpec.get_instance(version))
    fields = _defaults(cls)
    _check_keys("JobSpec.resources", obj, [*fields, _VERSION_KEY])
    res: ResourceSpec = cls(**{k: v for k, v in obj.items() if k != _VERSION_KEY})
    return res


def _attributes_from_json(value: Any) -> JobAttributes:
    obj = _object("JobSpec.attributes", value)
    _check_keys("JobSpec.attributes", obj, _ATTRIBUTE_KEYS)
    kwargs = dict(obj)
    if "duration" in kwargs:
        kwargs["duration"] = _duration_from_json(kwargs["duration"])
    return JobAttributes(**kwargs)


def _duration_from_json(value: Any) -> timedelta:
    field = "JobAttributes.duration"
    if isinstance(value, bool):
        raise _check.fail_type(field, value, "a number of seconds or a walltime string")
    if isinstance(value, int):
        return _seconds(field, Decimal(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{field}: {value} is not a duration; accepted: finite seconds")
        return _seconds(field, Decimal(value))
    if isinstance(value, str):
        m = _SECONDS_TEXT.fullmatch(value)
        if m:
            return _seconds(field, Decimal(m.group(1)))
        try:
            return JobAttributes.parse_walltime(value)
        except ValueError as ex:
            raise ValueError(f"{field}: {ex}; or a number of seconds") from None
    raise _check.fail_type(field, value, "a number of seconds or a walltime string")


def _seconds(field: str, seconds: Decimal) -> timedelta:
    # Decimal keeps the written digits exact; rounding to microseconds is timedelta's own unit.
    if seconds < 0:
        raise ValueError(f"{field}: must not be negative, got {seconds} s")
    micro = (int((seconds * 1_000_000).to_integral_value()) if seconds < _LONGEST_SECONDS
             else _LONGEST_MICROSECONDS + 1)
    if micro > _LONGEST_MICROSECONDS:
        raise ValueError(f"{field}: {seconds} s is longer than the longest duration "
                         f"({timedelta.max})")
    return timedelta(microseconds=micro)


def _flags_from_json(field: str, value: Any) -> StageOutFlags:
    names = StageOutFlags.__members__
    if isinstance(value, str):
        value = [value]
    if isinstance(value, bool):
        raise _check.fail_type(field, value, "a list of StageOutFlags names or an int")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{field}: {value} is not a combination of StageOutFlags; "
                             "accepted: a list of names or a non-negative int")
        try:
            return StageOutFlags(value)
        except ValueError:
            raise ValueError(f"{field}: {value} is not a combination of StageOutFlags; "
                             f"accepted: {', '.join(f'{n}={f.value}' for n, f in names.items())}"
                             ) from None
    if not isinstance(value, list):
        raise _check.fail_type(field, value, "a list of StageOutFlags names or an int")
    flags = StageOutFlags.NONE
    for i, name in enumerate(value):
        if not isinstance(name, str):
            raise _check.fail_type(f"{field}[{i}]", name, "a StageOutFlags name")
        if name not in names:
            raise ValueError(f"{field}[{i}]: unknown flag {name!r}; accepted: "
                             f"{', '.join(names)}")
        flags |= names[name]
    return flags


def _mode_from_json(field: str, value: Any) -> StagingMode:
    if not isinstance(value, str):
        raise _check.fail_type(field, value, "a StagingMode name")
    try:
        return StagingMode[value]
    except KeyError:
        raise ValueError(f"{field}: unknown mode {value!r}; accepted: "
                         f"{', '.join(StagingMode.__members__)}") from None


def _staging_entry(field: str, value: Any, accepted: Any) -> JSONObject:
    obj = _object(field, value)
    _check_keys(field, obj, accepted)
    for key in ("source", "target"):
        if key not in obj:
            raise ValueError(f"{field}: missing key {key!r}")
    return obj


def _list(field: str, value: Any) -> List[Any]:
    if not isinstance(value, list):
        raise _check.fail_type(field, value, "a JSON list")
    return value


def _stage_in_from_json(value: Any) -> List[StageIn]:
    out = []
    for i, item in enumerate(_list("JobSpec.stage_in", value)):
        field = f"JobSpec.stage_in[{i}]"
        obj = _staging_entry(field, item, _STAGE_IN_KEYS)
        mode = _mode_from_json(f"{field}.mode", obj.get("mode", "COPY"))
        out.append(StageIn(obj["source"], obj["target"], mode))
    return out


def _stage_out_from_json(value: Any) -> List[StageOut]:
    out = []
    for i, item in enumerate(_list("JobSpec.stage_out", value)):
        field = f"JobSpec.stage_out[{i}]"
        obj = _staging_entry(field, item, _STAGE_OUT_KEYS)
        flags = (_flags_from_json(f"{field}.flags", obj["flags"]) if "flags" in obj
                 else StageOutFlags.ALWAYS)
        mode = _mode_from_json(f"{field}.mode", obj.get("mode", "COPY"))
        out.append(StageOut(obj["source"], obj["target"], flags, mode))
    return out


_SPEC_READERS: Dict[str, Callable[[Any], Any]] = {
    "resources": lambda v: None if v is None else _resources_from_json(v),
    "attributes": lambda v: None if v is None else _attributes_from_json(v),
    "stage_in": lambda v: None if v is None else _stage_in_from_json(v),
    "stage_out": lambda v: None if v is None else _stage_out_from_json(v),
    "cleanup_flags": lambda v: _flags_from_json("JobSpec.cleanup_flags", v),
}
