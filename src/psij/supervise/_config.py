"""The configuration of ``psij supervise``: every option with its default and meaning, and
the reading of a configuration file into a checked :class:`SuperviseConfig`.

Every wrong field gives one line naming it and what is accepted; all of them are reported at
once, in a :class:`ConfigError`, before anything is submitted.
"""

import json
import math
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from psij._record import Record
from psij.supervise._messages import RequestError, build_spec, check_strings, check_text

__all__ = ["OPTIONS", "ConfigError", "SuperviseConfig", "options_text", "read_config"]

_DAY = 86400.0


class ConfigError(ValueError):
    """A configuration with wrong fields: ``problems`` has one line per field."""

    def __init__(self, problems: List[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class SuperviseConfig(Record):
    """A checked configuration (``OPTIONS`` gives the meaning and default of each field)."""

    executor: str
    executor_url: Optional[str]
    executor_config: Dict[str, Any]
    server: Dict[str, Any]
    client_template: Optional[Dict[str, Any]]
    output_dir: str
    job_limit: int
    timer_delay: float
    job_update_interval: float
    fault_tolerance: bool
    max_server_restarts: int
    protocol: str
    bind: Optional[str]
    std_output: bool
    verbose: int
    connect_timeout: float
    stop_grace: float
    workers: int


class _Option(Record):
    name: str
    default: Any
    meaning: str
    read: Callable[[str, Any], Any]


def _show(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _whole(lowest: int, highest: int) -> Callable[[str, Any], int]:
    def read(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) \
                or not lowest <= value <= highest:
            raise ValueError(f"{name}: expected a whole number from {lowest} to {highest}, "
                             f"got {_show(value)}")
        return value
    return read


def _seconds(lowest: float, highest: float) -> Callable[[str, Any], float]:
    def read(name: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or not lowest < value <= highest:
            raise ValueError(f"{name}: expected a number of seconds greater than {lowest:g} "
                             f"and at most {highest:g}, got {_show(value)}")
        return float(value)
    return read


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected true or false, got {_show(value)}")
    return value


def _text(name: str, value: Any) -> str:
    try:
        return check_text(name, value, 4096)
    except RequestError as error:
        raise ValueError(str(error)) from None


def _opt_text(name: str, value: Any) -> Optional[str]:
    return None if value is None else _text(name, value)


def _executor_config(name: str, value: Any) -> Dict[str, Any]:
    from psij.executors.batch._batch_config import BatchSchedulerExecutorConfig
    if not isinstance(value, dict):
        raise ValueError(f"{name}: expected an object of executor settings, got {_show(value)}")
    try:
        BatchSchedulerExecutorConfig(**value)
    except TypeError as error:
        accepted = ("launcher_log_file, work_directory, queue_polling_interval, "
                    "initial_queue_polling_delay, queue_polling_error_threshold, keep_files, "
                    "queue_polling_outage_tolerance, command_timeout")
        raise ValueError(f"{name}: {error} (accepted keys: {accepted})") from None
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None
    return dict(value)


def _spec(name: str, value: Any) -> Dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{name}: expected a JobSpec in JSON form (an object with "
                         f"'executable', ...), got {_show(value)}")
    try:
        check_strings(name, value)
        build_spec(value, 0, name, {}, ".", False)
    except RequestError as error:
        text = str(error)
        raise ValueError(text if text.startswith(name) else
                         f"{name}: {text[len('spec: '):]}") from None
    return dict(value)


def _opt_spec(name: str, value: Any) -> Optional[Dict[str, Any]]:
    return None if value is None else _spec(name, value)


def _protocol(name: str, value: Any) -> str:
    if value not in ("unix", "tcp"):
        raise ValueError(f"{name}: expected \"unix\" or \"tcp\", got {_show(value)}")
    return str(value)


def _required(name: str, value: Any) -> Any:
    raise ValueError(f"{name}: required")


def _default_output_dir() -> str:
    return time.strftime("psij-supervise-%Y%m%dT%H%M%S")


OPTIONS: Tuple[_Option, ...] = (
    _Option("executor", "local", "the executor jobs are submitted to (local, slurm, sge, pbs, "
            "pilot, or any installed one)", _text),
    _Option("executor_url", None, "the executor's URL (for pilot: unix:///PATH of the pilot's "
            "socket)", _opt_text),
    _Option("executor_config", {}, "the executor's settings: work_directory, "
            "launcher_log_file, and for batch executors queue_polling_interval, keep_files, "
            "command_timeout, ...", _executor_config),
    _Option("server", None, "the server job, a JobSpec in JSON form (required)", _spec),
    _Option("client_template", None, "the JobSpec in JSON form of a client job requested "
            "by arguments: the request's arguments are appended to the template's",
            _opt_spec),
    _Option("output_dir", "psij-supervise-YYYYMMDDTHHMMSS", "where the submit scripts, job "
            "output and the log go (created 0700)", _text),
    _Option("job_limit", 1000, "the most client jobs submitted and not final at once; "
            "further requests wait in order", _whole(1, 10_000_000)),
    _Option("timer_delay", 5.0, "seconds between two ticks: the server is pinged every tick "
            "and dead after two ticks without a message", _seconds(0.0, _DAY)),
    _Option("job_update_interval", 30.0, "seconds between two status queries of a batch "
            "executor (its queue_polling_interval unless executor_config sets it)",
            _seconds(0.0, _DAY)),
    _Option("fault_tolerance", True, "restart a dead server (after cancelling every job); "
            "off: stop with exit code 1. The server is told in PSIJ_FAULT_TOLERANCE (1/0) and "
            "MELISSA_FAULT_TOLERANCE (ON/OFF)", _bool),
    _Option("max_server_restarts", 3, "the most server restarts before the supervisor stops "
            "with exit code 1", _whole(0, 1_000_000)),
    _Option("protocol", "unix", "how the server connects: \"unix\" (a socket file, for a "
            "server on this machine) or \"tcp\"", _protocol),
    _Option("bind", None, "for tcp: HOST or HOST:PORT to listen on (default: every address, "
            "a free port; the server is told this machine's name)", _opt_text),
    _Option("std_output", True, "write job.<uid>.<name>.out/.err for every job; false: no "
            "job output files", _bool),
    _Option("verbose", 0, "0: lifecycle messages; 1: every job; 2: debugging",
            _whole(0, 3)),
    _Option("connect_timeout", 60.0, "seconds a running server job may take to connect "
            "before it counts as dead", _seconds(0.0, _DAY)),
    _Option("stop_grace", 30.0, "seconds to wait, when stopping, for the jobs cancelled to "
            "end (a submit command still running then is killed)", _seconds(0.0, _DAY)),
    _Option("workers", 4, "the most executor calls (submit, cancel) running at once",
            _whole(1, 256)),
)


def options_text() -> str:
    """What ``--print-options`` shows: each option, its default and its meaning."""
    lines = []
    for option in OPTIONS:
        default = "(required)" if option.name == "server" else _show(option.default)
        if option.name == "output_dir":
            default = option.default
        lines.append(f"{option.name}  [default: {default}]\n    {option.meaning}")
    return "\n".join(lines)


def read_config(document: Any) -> SuperviseConfig:
    """The checked configuration from ``document`` (a decoded JSON object); raises
    :class:`ConfigError` listing every wrong field."""
    if not isinstance(document, dict):
        raise ConfigError([f"the configuration must be a JSON object of options, got "
                           f"{type(document).__name__}"])
    known = {option.name: option for option in OPTIONS}
    problems: List[str] = []
    for key in document:
        if key not in known:
            problems.append(f"{_show(key)}: not an option (accepted: "
                            f"{', '.join(known)})")
    values: Dict[str, Any] = {}
    for option in OPTIONS:
        if option.name not in document:
            if option.name == "server":
                problems.append("server: required (a JobSpec in JSON form)")
            values[option.name] = (_default_output_dir() if option.name == "output_dir"
                                   else option.default)
            continue
        try:
            values[option.name] = option.read(option.name, document[option.name])
        except (ValueError, TypeError, RecursionError) as error:
            problems.append(str(error))
    if values.get("protocol") == "unix" and document.get("bind") is not None:
        problems.append("bind: only for protocol \"tcp\"")
    if problems:
        raise ConfigError(problems)
    return SuperviseConfig(**values)
