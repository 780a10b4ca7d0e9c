"""Site defaults: per-executor settings read from TOML files, so that jobs need not each name
their queue and account.

Files, highest precedence first: the file named by ``PSIJ_CONFIG``; the user's
``$XDG_CONFIG_HOME/psij/config.toml`` (``~/.config/psij/config.toml``); the site's
``/etc/psij/config.toml``. Each holds ``[executors.<name>]`` tables with these keys:

``queue``, ``account``, ``launcher``
    filled into a job that does not set them (``JobAttributes.queue_name``/``account``,
    ``JobSpec.launcher``), when it is submitted;
``custom_attributes``
    a table of ``"<executor>.<option>" = value``; each key the job does not set is added;
``work_directory``, ``poll_interval``, ``enforce_duration``, ``resource_pool``,
``spare_submit_commands``, ``rest_submit``
    the executor's configuration when it is made without one (``poll_interval`` is the batch
    executors' ``queue_polling_interval``, in seconds; ``enforce_duration`` and
    ``resource_pool`` (true, false or a table of ``cores``, ``memory``, ``tmp``, ``gpus``) are
    ``local``'s; ``spare_submit_commands`` is the batch executors'; ``rest_submit`` (true or
    false) is ``slurm``'s).

So a job's own values win over an explicit executor configuration, which wins over the files.
The files are read on first use (never by ``import psij``) and kept for the process; an error
in one names the file, the key and what is accepted, and is raised by every use until fixed.
Nothing here submits or changes jobs other than filling the fields above.
"""

import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple, TypeVar

from psij._record import Record

if TYPE_CHECKING:
    from psij.job_executor_config import JobExecutorConfig
    from psij.job_spec import JobSpec

__all__ = [
    "ENV_VAR",
    "SITE_FILE",
    "Setting",
    "SiteConfigError",
    "apply_job_defaults",
    "config_defaults",
    "files",
    "reset",
    "settings",
]

ENV_VAR = "PSIJ_CONFIG"
SITE_FILE = Path("/etc/psij/config.toml")

_JOB_KEYS = ("queue", "account", "launcher", "custom_attributes")
_CONFIG_KEYS = ("work_directory", "poll_interval", "enforce_duration", "resource_pool",
                "spare_submit_commands", "rest_submit")
_KEYS = _JOB_KEYS + _CONFIG_KEYS
_ACCEPTED = ("queue, account, launcher (strings), custom_attributes (a table), "
             "work_directory (a path), poll_interval (seconds above 0), "
             "enforce_duration (true or false, local only), resource_pool (true, false or a "
             "table of cores, memory, tmp and gpus, local only), spare_submit_commands (0 to 16, "
             "batch executors), rest_submit (true or false, slurm only)")


class SiteConfigError(ValueError):
    """A configuration file that cannot be used: the message names the file and the key."""


class Setting(Record):
    """One configured value and the file it came from."""

    value: Any
    source: str


def user_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "psij" / "config.toml"


def files() -> List[Tuple[str, Path]]:
    """The configuration files looked at, highest precedence first, with their role."""
    found: List[Tuple[str, Path]] = []
    named = os.environ.get(ENV_VAR)
    if named:
        found.append((ENV_VAR, Path(named)))
    found.append(("user", user_file()))
    found.append(("site", SITE_FILE))
    return found


_cache: Optional[Dict[str, Dict[str, Setting]]] = None


def reset() -> None:
    """Forget what was read, so that the next use reads the files again."""
    global _cache
    _cache = None


def settings() -> Dict[str, Dict[str, Setting]]:
    """Per executor name, the effective settings and where each came from."""
    global _cache
    if _cache is None:
        merged: Dict[str, Dict[str, Setting]] = {}
        for role, path in reversed(files()):  # lowest first: later ones override
            if role == ENV_VAR and not path.is_file():
                raise SiteConfigError(f"{path}: named by {ENV_VAR} but not a readable file")
            for name, values in _read(path).items():
                for key, value in values.items():
                    merged.setdefault(name, {})[key] = Setting(value, str(path))
        _cache = merged
    return _cache


def _read(path: Path) -> Dict[str, Dict[str, Any]]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as ex:
        raise SiteConfigError(f"{path}: cannot be read: {ex.strerror}") from None
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as ex:
        raise SiteConfigError(f"{path}: not UTF-8 text (byte {ex.start}); accepted: a TOML "
                              "file in UTF-8") from None
    except tomllib.TOMLDecodeError as ex:
        raise SiteConfigError(f"{path}: not valid TOML: {ex}") from None
    for key in doc:
        if key != "executors":
            raise SiteConfigError(f"{path}: unknown key {key!r}; accepted: [executors.<name>] "
                                  "tables")
    executors = doc.get("executors", {})
    if not isinstance(executors, dict):
        raise SiteConfigError(f"{path}: key 'executors': expected a table of "
                              "[executors.<name>] tables")
    out: Dict[str, Dict[str, Any]] = {}
    for name, table in executors.items():
        where = f"executors.{name}"
        if not isinstance(table, dict):
            raise SiteConfigError(f"{path}: key {where!r}: expected a table with keys "
                                  f"{_ACCEPTED}, got {_show(table)}")
        out[name] = {key: _value(path, f"{where}.{key}", key, value)
                     for key, value in table.items()}
    return out


def _show(value: Any) -> str:
    text = repr(value)
    return (text if len(text) <= 60 else text[:57] + "...") + f" ({type(value).__name__})"


def _value(path: Path, where: str, key: str, value: Any) -> Any:
    def bad(accepted: str) -> SiteConfigError:
        return SiteConfigError(f"{path}: key {where!r}: expected {accepted}, got {_show(value)}")

    if key in ("queue", "account", "launcher", "work_directory"):
        if not isinstance(value, str) or value == "" or "\x00" in value:
            raise bad("a non-empty string")
        return value
    if key in ("enforce_duration", "rest_submit"):
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if key == "resource_pool":
        from psij import _check

        try:
            return _check.resource_pool(value)
        except (TypeError, ValueError) as e:
            raise bad(f"true, false or a table of cores, memory, tmp (ints) and gpus (a count "
                      f"or ids): {e}") from None
    if key == "spare_submit_commands":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 16:
            raise bad("a whole number from 0 to 16")
        return value
    if key == "poll_interval":
        from psij import _check

        try:
            return _check.seconds(where, value, positive=True)
        except (TypeError, ValueError):
            raise bad("a number of seconds above 0 and at most "
                      f"{_check.MAX_SECONDS}") from None
    if key == "custom_attributes":
        if not isinstance(value, dict):
            raise bad('a table of "<executor>.<option>" = value')
        for name, item in value.items():
            if isinstance(item, float) and not math.isfinite(item):
                raise SiteConfigError(f"{path}: key {where + '.' + name!r}: expected a string, "
                                      f"an integer, a finite number or a boolean, got {item!r}")
            if isinstance(item, int) and not isinstance(item, bool) and \
                    not -2**63 <= item < 2**63:
                raise SiteConfigError(f"{path}: key {where + '.' + name!r}: expected an integer "
                                      f"of at most 64 bits, got {item}")
            if not isinstance(item, (str, int, float, bool)):
                raise SiteConfigError(f"{path}: key {where + '.' + name!r}: expected a string, "
                                      f"an integer, a finite number or a boolean, got "
                                      f"{_show(item)}")
        return dict(value)
    raise SiteConfigError(f"{path}: unknown key {where!r}; accepted: {_ACCEPTED}")


def _for(executor_name: str) -> Mapping[str, Setting]:
    return settings().get(executor_name, {})


def apply_job_defaults(executor_name: str, spec: "JobSpec") -> None:
    """Fill into ``spec`` (a JobSpec) the settings of the files it does not set itself."""
    found = _for(executor_name)
    if not any(key in found for key in _JOB_KEYS):
        return
    from psij.job_attributes import JobAttributes

    if spec.launcher is None and "launcher" in found:
        spec.launcher = found["launcher"].value
    attrs = spec.attributes
    if attrs is None:
        attrs = spec.attributes = JobAttributes()
    if attrs.queue_name is None and "queue" in found:
        attrs.queue_name = found["queue"].value
    if attrs.account is None and "account" in found:
        attrs.account = found["account"].value
    if "custom_attributes" in found:
        extra = {k: v for k, v in found["custom_attributes"].value.items()
                 if attrs.custom_attributes is None or k not in attrs.custom_attributes}
        if extra:
            if attrs.custom_attributes is None:
                attrs.custom_attributes = extra
            else:
                attrs.custom_attributes.update(extra)


if TYPE_CHECKING:  # a bound given as text would be compiled on import
    _Config = TypeVar("_Config", bound=JobExecutorConfig)


def config_defaults(executor_name: str, config: "_Config") -> "_Config":
    """``config`` (an executor's new default configuration) with the files' settings."""
    found = _for(executor_name)
    if "work_directory" in found:
        config.work_directory = Path(found["work_directory"].value).expanduser()
    if "poll_interval" in found and hasattr(config, "queue_polling_interval"):
        config.queue_polling_interval = found["poll_interval"].value
    if "enforce_duration" in found and hasattr(config, "enforce_duration"):
        config.enforce_duration = found["enforce_duration"].value
    if "resource_pool" in found and hasattr(config, "resource_pool"):
        config.resource_pool = found["resource_pool"].value
    if "spare_submit_commands" in found and hasattr(config, "spare_submit_commands"):
        config.spare_submit_commands = found["spare_submit_commands"].value
    if "rest_submit" in found and hasattr(config, "rest_submit"):
        config.rest_submit = found["rest_submit"].value
    return config
