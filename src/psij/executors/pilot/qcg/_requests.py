"""QCG-PilotJob request files: reading and checking them, one request at a time.

A request file is a JSON list of requests (``submit``, ``control``, ``jobStatus``, ``jobInfo``,
``cancelJob``, ``removeJob``, ``listJobs``, ``resourcesInfo``, ``finish``). Two forms are read:

- the *seed* form (QCG 0.4): an iterative job has ``"iterate": [start, stop]``, its name may
  contain ``${it}`` (each iteration then has its own name), ``split-into`` sits in ``numCores``
  or ``numNodes``, ``"scheduler": "maximum-iters"`` names an iteration scheduler, and status
  requests name one job in ``jobName``;
- the *current* form: ``"iteration": {"start": a, "stop": b}`` or ``{"values": [...]}``, the
  iterations of job ``name`` are the sub-tasks ``name:a`` ... ``name:b-1``, ``split-into`` is
  ``"scheduler": {"name": "split-into", "params": {"parts": k}}``, status requests list names
  in ``jobNames``, and ``script`` runs a bash script.

Which form a file uses decides only the shape of the ``listJobs`` and ``resourcesInfo``
responses (the first request or job that shows a form decides); each job and request is read
by its own keys.

This module is pure: it does no I/O except :func:`load_request_file` reading the file. Each
request is checked on its own, as QCG answers each on its own: a request that cannot be run
becomes a :class:`~psij.executors.pilot.qcg._schema.BadRequest` whose message names the request
(``requests[3]``, counted from 0), the field and what is accepted, and the others are kept.
Only a file that is not JSON or not a list raises :class:`RequestFileError`. The records live
in :mod:`psij.executors.pilot.qcg._schema`; expanding them into tasks is
:mod:`psij.executors.pilot.qcg._plan`'s.
"""

import json
import os
import re
from datetime import timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from psij.executors.pilot.qcg._schema import (
    CURRENT,
    SEED,
    BadRequest,
    CancelJob,
    Control,
    Execution,
    FinishRequest,
    Iteration,
    JobDescription,
    JobInfo,
    JobStatusRequest,
    ListJobs,
    RemoveJob,
    Request,
    RequestFile,
    ResourcesInfo,
    Spread,
    Submit,
)
from psij.executors.pilot.resources import ResourceRequest

__all__ = ["FINISH_AFTER_ALL_TASKS_DONE", "RequestFileError", "load_request_file",
           "parse_requests"]

FINISH_AFTER_ALL_TASKS_DONE = "finishAfterAllTasksDone"

_REQUEST_KINDS = ("submit", "control", "jobStatus", "jobInfo", "cancelJob", "removeJob",
                  "listJobs", "resourcesInfo", "finish")
_JOB_KEYS = ("name", "iterate", "iteration", "execution", "resources", "dependencies",
             "attributes")
_EXECUTION_KEYS = ("exec", "args", "script", "env", "wd", "stdin", "stdout", "stderr",
                   "modules", "venv", "model", "model_opts")
_EXECUTION_TEXTS = ("exec", "script", "wd", "stdin", "stdout", "stderr", "venv")
_RESOURCE_KEYS = ("numCores", "numNodes", "wt")
_AMOUNT_KEYS = ("exact", "min", "max", "split-into", "scheduler")
# Execution models that run the task's program once, as a plain process; the MPI models of
# QCG need a launcher that a file-mode pilot does not choose for the user.
_MODELS = ("default", "threads")
# Patterns as text: compiled (and cached by ``re``) when first used, not at import.
_WALLTIME = r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$"

_NO_ENV: Mapping[str, str] = MappingProxyType({})



class RequestFileError(ValueError):
    """A request file that cannot be run; the message names the place and what is accepted."""



# -- reading ---------------------------------------------------------------------------------


def load_request_file(path: Union[str, "os.PathLike[str]"]) -> RequestFile:
    """Read and check a request file (see :func:`parse_requests`)."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as exc:
        raise RequestFileError(f"{source}: cannot read the request file: "
                               f"{exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise RequestFileError(f"{source}: not UTF-8 text: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RequestFileError(f"{source}: not valid JSON: {exc.msg} at line {exc.lineno} "
                               f"column {exc.colno}") from None
    return parse_requests(data)


def parse_requests(data: Any) -> RequestFile:
    """Check the decoded JSON of a request file, one request at a time: a request that cannot
    be run becomes a :class:`BadRequest` (its message names the request, the field and what is
    accepted) and the others are kept. Raises :class:`RequestFileError` only when ``data`` is
    not a list of requests at all."""
    if not isinstance(data, list):
        raise RequestFileError(f"requests: expected a JSON list of requests, got "
                               f"{_json_type(data)}")
    requests: List[Request] = []
    dialect: Optional[str] = None
    # Files repeat a few resource shapes over thousands of jobs: each is read once.
    resources: _ResourceCache = {}
    for index, item in enumerate(data):
        where = f"requests[{index}]"
        try:
            request, form = _parse_request(where, index, item, resources)
        except RequestFileError as exc:
            kind = item.get("request") if isinstance(item, dict) else None
            requests.append(BadRequest(index, kind if isinstance(kind, str) else "?",
                                       str(exc)))
            continue
        requests.append(request)
        if dialect is None:
            dialect = form
    return RequestFile(tuple(requests), dialect or SEED)


_ResourceCache = Dict[Tuple[str, Optional[int]],
                      Tuple[ResourceRequest, Optional[timedelta], Optional[Spread]]]


def _parse_request(where: str, index: int, item: Any, resources: _ResourceCache
                   ) -> Tuple[Request, Optional[str]]:
    if not isinstance(item, dict):
        raise RequestFileError(f"{where}: expected a JSON object with a 'request' key, got "
                               f"{_json_type(item)}")
    _valid_text(where, item)
    kind = item.get("request")
    if kind not in _REQUEST_KINDS:
        got = "no 'request' key" if "request" not in item else f"{kind!r}"
        raise RequestFileError(f"{where}.request: {got}; accepted: "
                               f"{', '.join(_REQUEST_KINDS)}")
    if kind == "submit":
        _known_keys(where, item, ("request", "jobs"))
        jobs = item.get("jobs")
        if not isinstance(jobs, list) or not jobs:
            raise RequestFileError(f"{where}.jobs: expected a non-empty list of job "
                                   f"descriptions, got {_json_type(jobs)}")
        parsed = tuple(_parse_job(f"{where}.jobs[{i}]", job, resources)
                       for i, job in enumerate(jobs))
        forms = [job.form for job in parsed if job.iteration is not None]
        return Submit(index, parsed), (forms[0] if forms else None)
    if kind == "control":
        _known_keys(where, item, ("request", "command"))
        command = item.get("command")
        if command != FINISH_AFTER_ALL_TASKS_DONE:
            raise RequestFileError(f"{where}.command: {command!r} is not a control command; "
                                   f"accepted: {FINISH_AFTER_ALL_TASKS_DONE}")
        return Control(index, command), None
    if kind in ("jobStatus", "cancelJob", "removeJob", "jobInfo"):
        names, listed = _job_names(where, item, allow_single=kind != "jobInfo")
        form = CURRENT if listed else SEED
        if kind == "jobStatus":
            return JobStatusRequest(index, names, listed), form
        if kind == "cancelJob":
            return CancelJob(index, names, listed), form
        if kind == "removeJob":
            return RemoveJob(index, names, listed), form
        return JobInfo(index, names, True), CURRENT
    _known_keys(where, item, ("request",))
    if kind == "listJobs":
        return ListJobs(index), None
    if kind == "resourcesInfo":
        return ResourcesInfo(index), None
    return FinishRequest(index), None


def _job_names(where: str, item: Mapping[str, Any], allow_single: bool
               ) -> Tuple[Tuple[str, ...], bool]:
    accepted = ("request", "jobName", "jobNames") if allow_single else ("request", "jobNames")
    _known_keys(where, item, accepted)
    if "jobNames" in item:
        if "jobName" in item:
            raise RequestFileError(f"{where}: give either 'jobName' or 'jobNames', not both")
        names = item["jobNames"]
        if not isinstance(names, list) or not names \
                or not all(isinstance(n, str) and n for n in names):
            raise RequestFileError(f"{where}.jobNames: expected a non-empty list of job "
                                   f"names, got {_show(names)}")
        return tuple(names), True
    if "jobName" in item:
        name = item["jobName"]
        if not isinstance(name, str) or not name:
            raise RequestFileError(f"{where}.jobName: expected a job name, got {_show(name)}")
        return (name,), False
    wanted = "'jobName' or 'jobNames'" if allow_single else "'jobNames'"
    raise RequestFileError(f"{where}: {item['request']} needs {wanted}")


def _parse_job(where: str, job: Any, resources: _ResourceCache) -> JobDescription:
    if not isinstance(job, dict):
        raise RequestFileError(f"{where}: expected a job description (a JSON object), got "
                               f"{_json_type(job)}")
    _known_keys(where, job, _JOB_KEYS)
    name = job.get("name")
    if not isinstance(name, str) or not name.strip():
        raise RequestFileError(f"{where}.name: expected a non-empty job name, got "
                               f"{_show(name)}")
    if "iterate" in job and "iteration" in job:
        raise RequestFileError(f"{where}: give either 'iterate' (seed form) or 'iteration', "
                               f"not both")
    iteration: Optional[Iteration] = None
    form = CURRENT
    if "iterate" in job:
        iteration = _parse_iterate(f"{where}.iterate", job["iterate"])
        form = SEED
    elif "iteration" in job:
        iteration = _parse_iteration(f"{where}.iteration", job["iteration"])
    if "execution" not in job:
        raise RequestFileError(f"{where}.execution: missing; a job needs 'exec' or 'script' "
                               f"in its execution")
    execution = _parse_execution(f"{where}.execution", job["execution"])
    value = job.get("resources")
    # The text of the decoded JSON tells values apart (a key order of its own only costs a
    # second parse), for a fraction of the cost of encoding it again.
    key = (repr(value), None if iteration is None else iteration.size)
    known = resources.get(key)
    if known is None:
        known = resources[key] = _parse_resources(f"{where}.resources", value, iteration)
    request, walltime, spread = known
    after: Tuple[str, ...] = ()
    if "dependencies" in job:
        after = _parse_dependencies(f"{where}.dependencies", job["dependencies"])
    if "attributes" in job and not isinstance(job["attributes"], dict):
        raise RequestFileError(f"{where}.attributes: expected a JSON object, got "
                               f"{_json_type(job['attributes'])}")
    return JobDescription(where=where, name=name, execution=execution, resources=request,
                          iteration=iteration, after=after, walltime=walltime, form=form,
                          spread=spread)


def _parse_iterate(where: str, value: Any) -> Iteration:
    if not isinstance(value, list) or len(value) != 2 or not all(_is_int(v) for v in value):
        raise RequestFileError(f"{where}: expected [start, stop] (two integers), got "
                               f"{_show(value)}")
    start, stop = value
    if stop <= start:
        raise RequestFileError(f"{where}: stop ({stop}) must be greater than start ({start})")
    return Iteration(start, stop)


def _parse_iteration(where: str, value: Any) -> Iteration:
    if not isinstance(value, dict):
        raise RequestFileError(f"{where}: expected an object with 'start'/'stop' or "
                               f"'values', got {_json_type(value)}")
    _known_keys(where, value, ("start", "stop", "values"))
    if "values" in value:
        if "start" in value or "stop" in value:
            raise RequestFileError(f"{where}: 'values' cannot be combined with "
                                   f"'start'/'stop'")
        values = value["values"]
        if not isinstance(values, list) or not values:
            raise RequestFileError(f"{where}.values: expected a non-empty list, got "
                                   f"{_show(values)}")
        texts = []
        for i, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, (str, int, float)):
                raise RequestFileError(f"{where}.values[{i}]: expected a string or number, "
                                       f"got {_show(v)}")
            texts.append(v if isinstance(v, str) else json.dumps(v))
        return Iteration(0, len(texts), tuple(texts))
    if "stop" not in value:
        raise RequestFileError(f"{where}: 'stop' is required (or give 'values')")
    start, stop = value.get("start", 0), value["stop"]
    for key, v in (("start", start), ("stop", stop)):
        if not _is_int(v):
            raise RequestFileError(f"{where}.{key}: expected an integer, got {_show(v)}")
    if stop <= start:
        raise RequestFileError(f"{where}: stop ({stop}) must be greater than start ({start})")
    return Iteration(start, stop)


def _parse_execution(where: str, value: Any) -> Execution:
    if not isinstance(value, dict):
        raise RequestFileError(f"{where}: expected a JSON object, got {_json_type(value)}")
    _known_keys(where, value, _EXECUTION_KEYS)
    texts: Dict[str, Optional[str]] = dict.fromkeys(_EXECUTION_TEXTS)
    for key in _EXECUTION_TEXTS:
        v = value.get(key)
        if v is None:
            continue
        if type(v) is not str or v == "" or "\x00" in v:
            raise RequestFileError(f"{where}.{key}: expected a non-empty string, got "
                                   f"{_show(v)}")
        texts[key] = v
    if (texts["exec"] is None) == (texts["script"] is None):
        raise RequestFileError(f"{where}: give exactly one of 'exec' (a program) or 'script' "
                               f"(bash commands)")
    if texts["script"] is not None and value.get("args"):
        raise RequestFileError(f"{where}.args: arguments go with 'exec', not with 'script'")
    args = tuple(_strings(f"{where}.args", value["args"], numbers=True)) \
        if "args" in value else ()
    modules = tuple(_strings(f"{where}.modules", value["modules"], numbers=False)) \
        if "modules" in value else ()
    env_value = value.get("env", {})
    if env_value is None:
        env_value = {}
    if not isinstance(env_value, dict):
        raise RequestFileError(f"{where}.env: expected an object of name to string, got "
                               f"{_json_type(env_value)}")
    env: Dict[str, str] = {}
    for k, v in env_value.items():
        if k == "" or "=" in k or "\x00" in k:
            raise RequestFileError(f"{where}.env: {k!r} is not a variable name")
        if isinstance(v, bool) or not isinstance(v, (str, int, float)) \
                or (isinstance(v, str) and "\x00" in v):
            raise RequestFileError(f"{where}.env[{k!r}]: expected a string, got {_show(v)}")
        env[k] = v if isinstance(v, str) else json.dumps(v)
    model = value.get("model", "default")
    if model is None:
        model = "default"
    if model not in _MODELS:
        raise RequestFileError(f"{where}.model: {model!r} is not supported; accepted: "
                               f"{', '.join(_MODELS)}")
    if "model_opts" in value and not isinstance(value["model_opts"], dict):
        raise RequestFileError(f"{where}.model_opts: expected a JSON object, got "
                               f"{_json_type(value['model_opts'])}")
    return Execution(texts["exec"], args, texts["script"],
                     MappingProxyType(env) if env else _NO_ENV, texts["wd"], texts["stdin"],
                     texts["stdout"], texts["stderr"], modules, texts["venv"], model)


def _parse_resources(where: str, value: Any, iteration: Optional[Iteration]
                     ) -> Tuple[ResourceRequest, Optional[timedelta], Optional[Spread]]:
    if value is None:
        return ResourceRequest.from_qcg({"exact": 1}), None, None
    if not isinstance(value, dict):
        raise RequestFileError(f"{where}: expected a JSON object, got {_json_type(value)}")
    _known_keys(where, value, _RESOURCE_KEYS)
    amounts: Dict[str, Optional[Dict[str, Any]]] = {}
    spread: Optional[Spread] = None
    for key in ("numCores", "numNodes"):
        amounts[key] = None
        if key in value:
            amounts[key], spreads = _amount(f"{where}.{key}", value[key], iteration)
            if spreads:
                if spread is not None:
                    raise RequestFileError(f"{where}: maximum-iters goes on numCores or "
                                           f"numNodes, not both")
                spread = Spread(key, amounts[key].get("min", 1), None)  # type: ignore
    walltime: Optional[timedelta] = None
    if "wt" in value:
        walltime = _walltime(f"{where}.wt", value["wt"])
    try:
        request = ResourceRequest.from_qcg(amounts["numCores"], amounts["numNodes"])
        if spread is not None:
            other = amounts["numNodes" if spread.key == "numCores" else "numCores"]
            spread = Spread(spread.key, spread.minimum,
                            None if other is None else MappingProxyType(other))
            request = spread.request(spread.minimum)
    except (TypeError, ValueError) as exc:
        raise RequestFileError(f"{where}.{exc}") from None
    return request, walltime, spread


def _amount(where: str, value: Any, iteration: Optional[Iteration]
            ) -> Tuple[Dict[str, Any], bool]:
    """A ``numCores``/``numNodes`` element in the seed's keys (a ``split-into`` scheduler
    translated), and whether it asks for ``maximum-iters``."""
    if not isinstance(value, dict):
        raise RequestFileError(f"{where}: expected an object with exact, min, max, "
                               f"split-into or scheduler, got {_json_type(value)}")
    _known_keys(where, value, _AMOUNT_KEYS)
    out = {k: v for k, v in value.items() if k != "scheduler"}
    for key, v in out.items():
        if not _is_int(v) or v < 1:
            raise RequestFileError(f"{where}.{key}: expected a positive integer, got "
                                   f"{_show(v)}")
    if "scheduler" not in value:
        return out, False
    scheduler = value["scheduler"]
    if isinstance(scheduler, str):
        # QCG 0.4's form: the scheduler's name alone.
        scheduler = {"name": scheduler}
    if not isinstance(scheduler, dict) \
            or scheduler.get("name") not in ("split-into", "maximum-iters"):
        raise RequestFileError(f"{where}.scheduler: expected \"maximum-iters\", "
                               f"\"split-into\" or {{\"name\": one of them, \"params\": "
                               f"{{...}}}}, got {_show(value['scheduler'])}")
    _known_keys(f"{where}.scheduler", scheduler, ("name", "params"))
    params = scheduler.get("params", {})
    if not isinstance(params, dict):
        raise RequestFileError(f"{where}.scheduler.params: expected a JSON object, got "
                               f"{_json_type(params)}")
    if "exact" in out or "max" in out or "split-into" in out:
        raise RequestFileError(f"{where}.scheduler: goes with 'min' only, not with "
                               f"'exact', 'max' or 'split-into'")
    if iteration is None and (scheduler["name"] == "maximum-iters" or "parts" not in params):
        raise RequestFileError(f"{where}.scheduler: {scheduler['name']} shares the pool out "
                               f"among iterations; a job without iterations needs "
                               f"split-into with params.parts")
    out.setdefault("min", 1)
    if scheduler["name"] == "maximum-iters":
        return out, True
    _known_keys(f"{where}.scheduler.params", params, ("parts",))
    parts = params.get("parts", iteration.size if iteration is not None else 1)
    if not _is_int(parts) or parts < 1:
        raise RequestFileError(f"{where}.scheduler.params.parts: expected a positive integer, "
                               f"got {_show(parts)}")
    # Each iteration gets the pool's total divided by parts, at least min.
    out["split-into"] = parts
    return out, False


def _walltime(where: str, value: Any) -> timedelta:
    match = re.match(_WALLTIME, value) if isinstance(value, str) else None
    if match is None or not any(match.groups()):
        raise RequestFileError(f"{where}: expected a duration like '1h30m', '10m' or '45s', "
                               f"got {_show(value)}")
    hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    walltime = timedelta(hours=hours, minutes=minutes, seconds=seconds)
    if not walltime:
        raise RequestFileError(f"{where}: the wall time must be longer than 0, got "
                               f"{value!r}")
    return walltime


def _parse_dependencies(where: str, value: Any) -> Tuple[str, ...]:
    if not isinstance(value, dict):
        raise RequestFileError(f"{where}: expected an object with 'after', got "
                               f"{_json_type(value)}")
    _known_keys(where, value, ("after",))
    if "after" not in value:
        raise RequestFileError(f"{where}.after: missing; list the jobs to wait for")
    return tuple(_strings(f"{where}.after", value["after"], numbers=False, nonempty=True))


# -- small helpers ---------------------------------------------------------------------------


def _valid_text(where: str, value: Any) -> None:
    """Refuse a lone surrogate (``"\\ud800"`` is valid JSON, but no file name, argument or
    variable can hold it) anywhere in ``value``, naming where it is."""
    stack = [(where, value)]
    while stack:
        at, item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise RequestFileError(f"{at}: {_show(item)} holds a lone surrogate; text "
                                       f"must be valid Unicode") from None
        elif isinstance(item, dict):
            for key, inner in item.items():
                stack.append((at, key))
                stack.append((f"{at}.{key}", inner))
        elif isinstance(item, list):
            stack.extend((f"{at}[{i}]", inner) for i, inner in enumerate(item))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _known_keys(where: str, item: Mapping[str, Any], accepted: Sequence[str]) -> None:
    if len(item) <= len(accepted) and all(key in accepted for key in item):
        return
    for key in item:
        if key not in accepted:
            raise RequestFileError(f"{where}: unknown key {key!r}; accepted: "
                                   f"{', '.join(accepted)}")


def _strings(where: str, value: Any, numbers: bool, nonempty: bool = False) -> List[str]:
    if not isinstance(value, list):
        raise RequestFileError(f"{where}: expected a list of strings, got {_json_type(value)}")
    out: List[str] = []
    for i, item in enumerate(value):
        if isinstance(item, str) and "\x00" not in item and (item or not nonempty):
            out.append(item)
        elif numbers and isinstance(item, (int, float)) and not isinstance(item, bool):
            out.append(json.dumps(item))
        else:
            kind = "a string or number" if numbers else "a non-empty string" if nonempty \
                else "a string"
            raise RequestFileError(f"{where}[{i}]: expected {kind}, got {_show(item)}")
    return out


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    text = json.dumps(value) if _jsonable(value) else repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({_json_type(value)})"


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True
