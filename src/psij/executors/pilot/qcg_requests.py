"""QCG-PilotJob request files: parsing, validation, ``${...}`` variables, responses, reports.

A request file is a JSON list of requests (``submit``, ``control``, ``jobStatus``, ``jobInfo``,
``cancelJob``, ``removeJob``, ``listJobs``, ``resourcesInfo``, ``finish``). Two forms are read:

- the *seed* form: an iterative job has ``"iterate": [start, stop]``, its name may contain
  ``${it}`` (each iteration then has its own name), ``split-into`` sits in ``numCores`` or
  ``numNodes``, and status requests name one job in ``jobName``;
- the *current* form: ``"iteration": {"start": a, "stop": b}`` or ``{"values": [...]}``, the
  iterations of job ``name`` are the sub-tasks ``name:a`` ... ``name:b-1``, ``split-into`` is
  ``"scheduler": {"name": "split-into", "params": {"parts": k}}``, status requests list names
  in ``jobNames``, and ``script`` runs a bash script.

Which form a file uses decides only the shape of the ``listJobs`` and ``resourcesInfo``
responses (the first request or job that shows a form decides); each job and request is read
by its own keys.

This module is pure: it does no I/O except :func:`load_request_file` reading the file, starts
nothing and keeps no clock (times and unique ids are passed in). Everything in a file is
checked before anything runs: a bad file raises :class:`RequestFileError`, whose message names
the request (``requests[3]``, counted from 0), the field and what is accepted. Variables are
expanded in two steps, as QCG does: :func:`plan_requests` expands the ones known when a request
is received (rcnt, uniq, sname, date, time, dateTime, it, its, it_start, it_stop, itval,
jname); :func:`start_variables` gives the ones known when a task is placed (root_wd, ncores,
nnodes, nlist), which the runner expands then. A ``${name}`` that is not one of these is left
as it is, so that shell variables in scripts survive.
"""

import json
import os
import re
from datetime import datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import (
    Any,
    Callable,
    Dict,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)

from psij.executors.pilot._record import Record
from psij.executors.pilot.resources import ResourceRequest
from psij.executors.pilot.scheduler import TaskState

__all__ = [
    "CURRENT", "SEED", "CancelJob", "Control", "Execution", "Finish", "JobDescription",
    "JobInfo", "JobStatus", "ListJobs", "PlannedSubmit", "RemoveJob", "Request",
    "RequestFile", "RequestFileError", "ResourcesInfo", "StartContext", "Submit", "TaskReport",
    "TaskTemplate", "expand_variables", "format_report_entry", "load_request_file",
    "parse_requests", "plan_requests", "qcg_state", "start_variables",
]

SEED = "seed"
CURRENT = "current"

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
# Characters QCG refuses in a final job name; ':' separates a sub-task's iteration index.
_NAME_FORBIDDEN = set("${}()'\"") | {":"}
_NAME_BAD = r"[\s${}()'\":]"
# Patterns as text: compiled (and cached by ``re``) when first used, not at import.
_WALLTIME = r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$"
_VARIABLE = r"\$\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}"

_NO_ENV: Mapping[str, str] = MappingProxyType({})
_set = object.__setattr__

START_VARIABLES = ("root_wd", "ncores", "nnodes", "nlist")
"""The variables known only when a task is placed."""


class RequestFileError(ValueError):
    """A request file that cannot be run; the message names the place and what is accepted."""


# -- parsed requests -------------------------------------------------------------------------


class Execution(Record):
    """What a task runs; any string may still hold ``${...}`` variables."""

    _fields = ("exec", "args", "script", "env", "wd", "stdin", "stdout", "stderr", "modules",
               "venv", "model")
    __slots__ = _fields
    exec: Optional[str]
    args: Tuple[str, ...]
    script: Optional[str]
    env: Mapping[str, str]
    wd: Optional[str]
    stdin: Optional[str]
    stdout: Optional[str]
    stderr: Optional[str]
    modules: Tuple[str, ...]
    venv: Optional[str]
    model: str

    def __init__(self, exec: Optional[str] = None, args: Tuple[str, ...] = (),
                 script: Optional[str] = None, env: Mapping[str, str] = _NO_ENV,
                 wd: Optional[str] = None, stdin: Optional[str] = None,
                 stdout: Optional[str] = None, stderr: Optional[str] = None,
                 modules: Tuple[str, ...] = (), venv: Optional[str] = None,
                 model: str = "default") -> None:
        _set(self, "exec", exec)
        _set(self, "args", args)
        _set(self, "script", script)
        _set(self, "env", env)
        _set(self, "wd", wd)
        _set(self, "stdin", stdin)
        _set(self, "stdout", stdout)
        _set(self, "stderr", stderr)
        _set(self, "modules", modules)
        _set(self, "venv", venv)
        _set(self, "model", model)

    def command(self) -> List[str]:
        """The program and its arguments (``script``, ``modules`` and ``venv`` go through
        bash, as QCG runs them)."""
        if not self.modules and self.venv is None:
            if self.script is not None:
                return ["bash", "-c", self.script]
            assert self.exec is not None
            return [self.exec, *self.args]
        prologue = ""
        if self.modules:
            prologue += "source /etc/profile && module load " \
                + " ".join(_shell_quote(m) for m in self.modules) + " && "
        if self.venv is not None:
            prologue += f"source {_shell_quote(self.venv + '/bin/activate')} && "
        if self.script is not None:
            return ["bash", "-c", prologue + self.script]
        assert self.exec is not None
        return ["bash", "-c", prologue + 'exec "$@"', "bash", self.exec, *self.args]

    def has_variables(self) -> bool:
        """Whether some text of this execution holds a ``${``."""
        for text in (self.exec, self.script, self.wd, self.stdin, self.stdout, self.stderr,
                     self.venv):
            if text is not None and "${" in text:
                return True
        return any("${" in text for texts in (self.args, self.modules, self.env.values())
                   for text in texts)

    def expanded(self, values: Mapping[str, str]) -> "Execution":
        if not self.has_variables():
            return self

        def one(text: Optional[str]) -> Optional[str]:
            return None if text is None else expand_variables(text, values)

        return Execution(
            exec=one(self.exec), args=tuple(expand_variables(a, values) for a in self.args),
            script=one(self.script),
            env=MappingProxyType({k: expand_variables(v, values) for k, v in self.env.items()}),
            wd=one(self.wd), stdin=one(self.stdin), stdout=one(self.stdout),
            stderr=one(self.stderr), modules=tuple(expand_variables(m, values)
                                                  for m in self.modules),
            venv=one(self.venv), model=self.model)


class Iteration(Record):
    """The indices ``start`` .. ``stop - 1``; with ``values``, index i stands for values[i]."""

    _fields = ("start", "stop", "values")
    __slots__ = _fields
    start: int
    stop: int
    values: Optional[Tuple[str, ...]]

    def __init__(self, start: int, stop: int, values: Optional[Tuple[str, ...]] = None) -> None:
        _set(self, "start", start)
        _set(self, "stop", stop)
        _set(self, "values", values)

    @property
    def size(self) -> int:
        return self.stop - self.start


class JobDescription(Record):
    """One job of a ``submit`` request, checked, with its variables not yet expanded."""

    _fields = ("where", "name", "execution", "resources", "iteration", "after", "walltime",
               "form")
    __slots__ = _fields
    where: str
    name: str
    execution: Execution
    resources: ResourceRequest
    iteration: Optional[Iteration]
    after: Tuple[str, ...]
    walltime: Optional[timedelta]
    form: str  # how the job was written: the seed's ``iterate`` or the current ``iteration``

    def __init__(self, where: str, name: str, execution: Execution, resources: ResourceRequest,
                 iteration: Optional[Iteration] = None, after: Tuple[str, ...] = (),
                 walltime: Optional[timedelta] = None, form: str = CURRENT) -> None:
        _set(self, "where", where)
        _set(self, "name", name)
        _set(self, "execution", execution)
        _set(self, "resources", resources)
        _set(self, "iteration", iteration)
        _set(self, "after", after)
        _set(self, "walltime", walltime)
        _set(self, "form", form)


class Submit(Record):
    _fields = ("position", "jobs")
    __slots__ = _fields
    position: int
    jobs: Tuple[JobDescription, ...]

    def __init__(self, position: int, jobs: Tuple[JobDescription, ...]) -> None:
        _set(self, "position", position)
        _set(self, "jobs", jobs)


class Control(Record):
    _fields = ("position", "command")
    __slots__ = _fields
    position: int
    command: str

    def __init__(self, position: int, command: str) -> None:
        _set(self, "position", position)
        _set(self, "command", command)


class JobStatus(Record):
    """``jobStatus``; ``listed`` when the names came as the current form's ``jobNames``."""

    _fields = ("position", "names", "listed")
    __slots__ = _fields
    position: int
    names: Tuple[str, ...]
    listed: bool

    def __init__(self, position: int, names: Tuple[str, ...], listed: bool) -> None:
        _set(self, "position", position)
        _set(self, "names", names)
        _set(self, "listed", listed)


class JobInfo(Record):
    _fields = ("position", "names")
    __slots__ = _fields
    position: int
    names: Tuple[str, ...]

    def __init__(self, position: int, names: Tuple[str, ...]) -> None:
        _set(self, "position", position)
        _set(self, "names", names)


class CancelJob(Record):
    _fields = ("position", "names", "listed")
    __slots__ = _fields
    position: int
    names: Tuple[str, ...]
    listed: bool

    def __init__(self, position: int, names: Tuple[str, ...], listed: bool) -> None:
        _set(self, "position", position)
        _set(self, "names", names)
        _set(self, "listed", listed)


class RemoveJob(Record):
    _fields = ("position", "names", "listed")
    __slots__ = _fields
    position: int
    names: Tuple[str, ...]
    listed: bool

    def __init__(self, position: int, names: Tuple[str, ...], listed: bool) -> None:
        _set(self, "position", position)
        _set(self, "names", names)
        _set(self, "listed", listed)


class ListJobs(Record):
    _fields = ("position",)
    __slots__ = _fields
    position: int

    def __init__(self, position: int) -> None:
        _set(self, "position", position)


class ResourcesInfo(Record):
    _fields = ("position",)
    __slots__ = _fields
    position: int

    def __init__(self, position: int) -> None:
        _set(self, "position", position)


class Finish(Record):
    _fields = ("position",)
    __slots__ = _fields
    position: int

    def __init__(self, position: int) -> None:
        _set(self, "position", position)


Request = Union[Submit, Control, JobStatus, JobInfo, CancelJob, RemoveJob, ListJobs,
                ResourcesInfo, Finish]


def request_kind(request: Request) -> str:
    """The ``request`` word of a parsed request."""
    return _KIND_OF[type(request)]


_KIND_OF: Dict[type, str] = {
    Submit: "submit", Control: "control", JobStatus: "jobStatus", JobInfo: "jobInfo",
    CancelJob: "cancelJob", RemoveJob: "removeJob", ListJobs: "listJobs",
    ResourcesInfo: "resourcesInfo", Finish: "finish",
}


class RequestFile(Record):
    """All requests of a file, in file order, and the form its responses take."""

    _fields = ("requests", "dialect")
    __slots__ = _fields
    requests: Tuple[Request, ...]
    dialect: str

    def __init__(self, requests: Tuple[Request, ...], dialect: str = SEED) -> None:
        _set(self, "requests", requests)
        _set(self, "dialect", dialect)


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
    """Check the decoded JSON of a request file; raises :class:`RequestFileError`."""
    if not isinstance(data, list):
        raise RequestFileError(f"requests: expected a JSON list of requests, got "
                               f"{_json_type(data)}")
    requests: List[Request] = []
    dialect: Optional[str] = None
    # Files repeat a few resource shapes over thousands of jobs: each is read once.
    resources: _ResourceCache = {}
    for index, item in enumerate(data):
        where = f"requests[{index}]"
        request, form = _parse_request(where, index, item, resources)
        requests.append(request)
        if dialect is None:
            dialect = form
    return RequestFile(tuple(requests), dialect or SEED)


_ResourceCache = Dict[Tuple[str, Optional[int]], Tuple[ResourceRequest, Optional[timedelta]]]


def _parse_request(where: str, index: int, item: Any, resources: _ResourceCache
                   ) -> Tuple[Request, Optional[str]]:
    if not isinstance(item, dict):
        raise RequestFileError(f"{where}: expected a JSON object with a 'request' key, got "
                               f"{_json_type(item)}")
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
            return JobStatus(index, names, listed), form
        if kind == "cancelJob":
            return CancelJob(index, names, listed), form
        if kind == "removeJob":
            return RemoveJob(index, names, listed), form
        return JobInfo(index, names), CURRENT
    _known_keys(where, item, ("request",))
    if kind == "listJobs":
        return ListJobs(index), None
    if kind == "resourcesInfo":
        return ResourcesInfo(index), None
    return Finish(index), None


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
    request, walltime = known
    after: Tuple[str, ...] = ()
    if "dependencies" in job:
        after = _parse_dependencies(f"{where}.dependencies", job["dependencies"])
    if "attributes" in job and not isinstance(job["attributes"], dict):
        raise RequestFileError(f"{where}.attributes: expected a JSON object, got "
                               f"{_json_type(job['attributes'])}")
    return JobDescription(where=where, name=name, execution=execution, resources=request,
                          iteration=iteration, after=after, walltime=walltime, form=form)


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
    if texts["script"] is not None and "args" in value:
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
                     ) -> Tuple[ResourceRequest, Optional[timedelta]]:
    if value is None:
        return ResourceRequest.from_qcg({"exact": 1}), None
    if not isinstance(value, dict):
        raise RequestFileError(f"{where}: expected a JSON object, got {_json_type(value)}")
    _known_keys(where, value, _RESOURCE_KEYS)
    amounts: Dict[str, Optional[Dict[str, Any]]] = {}
    for key in ("numCores", "numNodes"):
        amounts[key] = None if key not in value \
            else _amount(f"{where}.{key}", value[key], iteration)
    walltime: Optional[timedelta] = None
    if "wt" in value:
        walltime = _walltime(f"{where}.wt", value["wt"])
    try:
        request = ResourceRequest.from_qcg(amounts["numCores"], amounts["numNodes"])
    except (TypeError, ValueError) as exc:
        raise RequestFileError(f"{where}.{exc}") from None
    return request, walltime


def _amount(where: str, value: Any, iteration: Optional[Iteration]) -> Dict[str, Any]:
    """A ``numCores``/``numNodes`` element in the seed's keys (``scheduler`` translated)."""
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
        return out
    scheduler = value["scheduler"]
    if not isinstance(scheduler, dict) \
            or scheduler.get("name") not in ("split-into", "maximum-iters"):
        raise RequestFileError(f"{where}.scheduler: expected {{\"name\": \"split-into\" or "
                               f"\"maximum-iters\", \"params\": {{...}}}}, got "
                               f"{_show(scheduler)}")
    _known_keys(f"{where}.scheduler", scheduler, ("name", "params"))
    params = scheduler.get("params", {})
    if not isinstance(params, dict):
        raise RequestFileError(f"{where}.scheduler.params: expected a JSON object, got "
                               f"{_json_type(params)}")
    if "exact" in out or "max" in out or "split-into" in out:
        raise RequestFileError(f"{where}.scheduler: goes with 'min' only, not with "
                               f"'exact', 'max' or 'split-into'")
    if iteration is None and "parts" not in params:
        raise RequestFileError(f"{where}.scheduler: a job without iterations needs "
                               f"params.parts")
    if scheduler["name"] == "split-into":
        _known_keys(f"{where}.scheduler.params", params, ("parts",))
    parts = params.get("parts", iteration.size if iteration is not None else 1)
    if not _is_int(parts) or parts < 1:
        raise RequestFileError(f"{where}.scheduler.params.parts: expected a positive integer, "
                               f"got {_show(parts)}")
    # Both iteration schedulers give each iteration an equal part of the pool, at least min:
    # split-into in parts, maximum-iters in as many parts as there are iterations.
    out["split-into"] = parts
    out.setdefault("min", 1)
    return out


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


# -- planning: submit-time variables, names and dependencies -----------------------------------


class TaskTemplate(Record):
    """One task to submit: final name, scheduling data, and its execution with the variables
    known at start (root_wd, ncores, nnodes, nlist) still to expand (see
    :func:`start_variables`)."""

    _fields = ("name", "job", "resources", "execution", "after", "group", "iteration", "walltime")
    __slots__ = _fields
    name: str
    job: str
    resources: ResourceRequest
    execution: Execution
    after: Tuple[str, ...]
    group: Optional[str]
    iteration: Optional[int]
    walltime: Optional[timedelta]

    def __init__(self, name: str, job: str, resources: ResourceRequest, execution: Execution,
                 after: Tuple[str, ...] = (), group: Optional[str] = None,
                 iteration: Optional[int] = None, walltime: Optional[timedelta] = None) -> None:
        _set(self, "name", name)
        _set(self, "job", job)
        _set(self, "resources", resources)
        _set(self, "execution", execution)
        _set(self, "after", after)
        _set(self, "group", group)
        _set(self, "iteration", iteration)
        _set(self, "walltime", walltime)


class StartContext(Record):
    """What is known of a task when it is placed."""

    _fields = ("root_wd", "ncores", "nnodes", "nodes")
    __slots__ = _fields
    root_wd: str
    ncores: int
    nnodes: int
    nodes: Tuple[str, ...]

    def __init__(self, root_wd: str, ncores: int, nnodes: int, nodes: Tuple[str, ...]) -> None:
        _set(self, "root_wd", root_wd)
        _set(self, "ncores", ncores)
        _set(self, "nnodes", nnodes)
        _set(self, "nodes", nodes)


def start_variables(context: StartContext) -> Dict[str, str]:
    return {"root_wd": context.root_wd, "ncores": str(context.ncores),
            "nnodes": str(context.nnodes), "nlist": ",".join(context.nodes)}


class PlannedSubmit(Record):
    """A ``submit`` request with its jobs expanded into tasks, in submission order."""

    _fields = ("position", "tasks", "job_names")
    __slots__ = _fields
    position: int
    tasks: Tuple[TaskTemplate, ...]
    # The job names as QCG reports them in the submit response (a group counts once).
    job_names: Tuple[str, ...]

    def __init__(self, position: int, tasks: Tuple[TaskTemplate, ...],
                 job_names: Tuple[str, ...]) -> None:
        _set(self, "position", position)
        _set(self, "tasks", tasks)
        _set(self, "job_names", job_names)


def expand_variables(text: str, values: Mapping[str, str]) -> str:
    """``${name}`` (spaces allowed inside the braces) replaced by ``values[name]``; a name
    not in ``values`` is left as written."""
    if "${" not in text:
        return text

    def replace(match: "re.Match[str]") -> str:
        value = values.get(match.group(1))
        return match.group(0) if value is None else value

    return re.sub(_VARIABLE, replace, text)


def _variables_in(text: str) -> Set[str]:
    return set(re.findall(_VARIABLE, text))


def plan_requests(requests: RequestFile, received: datetime,
                  unique_id: Callable[[], str], site_name: str = "local"
                  ) -> List[Union[PlannedSubmit, Request]]:
    """Expand every submit request into tasks and check names and dependencies in file order.

    ``received`` is when the file was read (the date/time variables); ``unique_id`` gives a
    new ``${uniq}`` value per task. Each submit request increments ``${rcnt}``, starting at 1.
    A task name used twice (unless removed in between), a name with forbidden characters or
    an unknown variable, and a dependency on a job not submitted by an earlier or the same
    request raise :class:`RequestFileError`.
    """
    registry = _Registry()
    planned: List[Union[PlannedSubmit, Request]] = []
    rcnt = 0
    for request in requests.requests:
        if isinstance(request, Submit):
            rcnt += 1
            tasks: List[TaskTemplate] = []
            names: List[str] = []
            base = {"rcnt": str(rcnt), "sname": site_name, "date": received.date().isoformat(),
                    "time": received.time().isoformat(), "dateTime": str(received)}
            for job in request.jobs:
                job_tasks, job_names = _plan_job(job, base, unique_id, registry)
                tasks.extend(job_tasks)
                names.extend(job_names)
            planned.append(PlannedSubmit(request.position, tuple(tasks), tuple(names)))
        else:
            if isinstance(request, RemoveJob):
                for name in request.names:
                    registry.remove(name)
            planned.append(request)
    return planned


class _Registry:
    """Names known at each point of a file, to check uniqueness and dependencies up front."""

    def __init__(self) -> None:
        self.tasks: Set[str] = set()
        self.groups: Dict[str, List[str]] = {}

    def add(self, where: str, name: str, group: Optional[str]) -> None:
        if name in self.tasks or name in self.groups:
            raise RequestFileError(f"{where}.name: job {name!r} is already submitted by an "
                                   f"earlier request; job names must be unique (removeJob "
                                   f"first to reuse one)")
        self.tasks.add(name)
        if group is not None:
            self.groups.setdefault(group, []).append(name)

    def known(self, name: str) -> bool:
        return name in self.tasks or name in self.groups

    def remove(self, name: str) -> None:
        for member in self.groups.pop(name, ()):
            self.tasks.discard(member)
        self.tasks.discard(name)


def _plan_job(job: JobDescription, base: Mapping[str, str], unique_id: Callable[[], str],
              registry: _Registry) -> Tuple[List[TaskTemplate], List[str]]:
    iteration = job.iteration
    if iteration is None:
        indices: Sequence[Optional[int]] = [None]
    else:
        indices = range(iteration.start, iteration.stop)
    per_iteration_names = iteration is not None and "it" in _variables_in(job.name)
    if per_iteration_names and job.form != SEED:
        raise RequestFileError(f"{job.where}.name: {job.name!r} uses ${{it}}; with "
                               f"'iteration' the sub-tasks are named {job.name}:N by "
                               f"themselves (the seed's 'iterate' allows ${{it}} in names)")
    group: Optional[str] = None
    if iteration is not None and not per_iteration_names:
        group = _checked_name(job.where,
                              expand_variables(job.name, {**base, "uniq": unique_id()}))
        if registry.known(group):
            raise RequestFileError(f"{job.where}.name: job {group!r} is already submitted by "
                                   f"an earlier request; job names must be unique (removeJob "
                                   f"first to reuse one)")
    tasks: List[TaskTemplate] = []
    if "${" not in job.name and not any("${" in d for d in job.after) \
            and not job.execution.has_variables():
        # Nothing to expand: every task is the job itself (under its iteration's name).
        jname = _checked_name(job.where, job.name)
        for i, dependency in enumerate(job.after):
            if not registry.known(dependency):
                raise _unknown_dependency(job.where, i, dependency)
        for index in indices:
            name = f"{jname}:{index}" if group is not None else jname
            registry.add(job.where, name, group)
            tasks.append(TaskTemplate(name, group or name, job.resources, job.execution,
                                      job.after, group, index, job.walltime))
        return tasks, [group] if group is not None else [t.name for t in tasks]
    for index in indices:
        values = dict(base)
        values["uniq"] = unique_id()
        if iteration is not None and index is not None:
            values.update(it=str(index), its=str(iteration.size),
                          it_start=str(iteration.start), it_stop=str(iteration.stop))
            if iteration.values is not None:
                values["itval"] = iteration.values[index - iteration.start]
        jname = _checked_name(job.where, expand_variables(job.name, values))
        values["jname"] = jname
        name = f"{jname}:{index}" if group is not None else jname
        after: List[str] = []
        for i, dependency in enumerate(job.after):
            target = expand_variables(dependency, values)
            if not registry.known(target):
                raise _unknown_dependency(job.where, i, target)
            after.append(target)
        registry.add(job.where, name, group)
        tasks.append(TaskTemplate(name=name, job=group or name, resources=job.resources,
                                  execution=job.execution.expanded(values),
                                  after=tuple(after), group=group, iteration=index,
                                  walltime=job.walltime))
    return tasks, [group] if group is not None else [t.name for t in tasks]


def _unknown_dependency(where: str, index: int, target: str) -> RequestFileError:
    return RequestFileError(f"{where}.dependencies.after[{index}]: {target!r} is not a job "
                            f"submitted before this one; a job can only wait for jobs "
                            f"submitted earlier in the file")


def _checked_name(where: str, name: str) -> str:
    if re.search(_NAME_BAD, name) is None:
        return name
    bad = sorted({c for c in name if c in _NAME_FORBIDDEN or c.isspace()})
    if bad:
        unknown = _variables_in(name)
        if unknown:
            raise RequestFileError(f"{where}.name: {name!r} uses unknown variable(s) "
                                   f"{', '.join(sorted(unknown))}; names may use rcnt, uniq, "
                                   f"sname, date, time, dateTime and, with iterations, it, "
                                   f"its, it_start, it_stop, itval")
        raise RequestFileError(f"{where}.name: {name!r} contains {''.join(bad)!r}; job names "
                               f"may not contain spaces, quotes, $, braces, parentheses or "
                               f"':' (which separates an iteration index)")
    return name


# -- responses and reports -------------------------------------------------------------------


_QCG_STATES = {
    TaskState.WAITING: "QUEUED",
    TaskState.QUEUED: "QUEUED",
    TaskState.RUNNING: "EXECUTING",
    TaskState.SUCCEEDED: "SUCCEED",
    TaskState.FAILED: "FAILED",
    TaskState.CANCELED: "CANCELED",
    TaskState.OMITTED: "OMITTED",
}


def qcg_state(state: TaskState) -> str:
    """The QCG name of a task state."""
    return _QCG_STATES[state]


class TaskReport(Record):
    """What the responses and ``jobs.report`` say about one task."""

    _fields = ("name", "state", "history", "allocation", "wd", "runtime", "exit_code", "message")
    __slots__ = _fields
    name: str
    state: str
    history: Tuple[Tuple[datetime, str], ...]
    allocation: Optional[str]
    wd: Optional[str]
    runtime: Optional[timedelta]
    exit_code: Optional[int]
    message: Optional[str]

    def __init__(self, name: str, state: str, history: Tuple[Tuple[datetime, str], ...] = (),
                 allocation: Optional[str] = None, wd: Optional[str] = None,
                 runtime: Optional[timedelta] = None, exit_code: Optional[int] = None,
                 message: Optional[str] = None) -> None:
        _set(self, "name", name)
        _set(self, "state", state)
        _set(self, "history", history)
        _set(self, "allocation", allocation)
        _set(self, "wd", wd)
        _set(self, "runtime", runtime)
        _set(self, "exit_code", exit_code)
        _set(self, "message", message)

    def runtime_fields(self) -> Dict[str, str]:
        fields: Dict[str, str] = {}
        if self.allocation is not None:
            fields["allocation"] = self.allocation
        if self.wd is not None:
            fields["wd"] = self.wd
        if self.runtime is not None:
            fields["rtime"] = str(self.runtime)
        if self.exit_code is not None:
            fields["exit_code"] = str(self.exit_code)
        return fields

    def history_text(self) -> str:
        return "".join(f"\n{when}: {state}" for when, state in self.history)


def format_report_entry(report: TaskReport) -> str:
    """One entry of ``jobs.report``: the name and final state, the dated history, then the
    allocation (``node:cores``, comma separated), working directory, run time, exit code and
    the reason of a failure, each on its own indented line."""
    lines = [f"{report.name} ({report.state})"]
    lines.extend(f"    {when}: {state}" for when, state in report.history)
    lines.extend(f"    {key}: {value}" for key, value in report.runtime_fields().items())
    if report.message:
        lines.append(f"    message: {_one_line(report.message)}")
    return "\n".join(lines) + "\n"


def ok_response(data: Optional[Mapping[str, Any]] = None, message: Optional[str] = None
                ) -> Dict[str, Any]:
    response: Dict[str, Any] = {"code": 0}
    if message is not None:
        response["message"] = message
    if data is not None:
        response["data"] = dict(data)
    return response


def error_response(message: str) -> Dict[str, Any]:
    return {"code": 1, "message": message}


def job_status_data(report: TaskReport) -> Dict[str, Any]:
    """The seed's ``jobStatus`` data for one task: name, status, history and runtime."""
    return {"jobName": report.name, "status": report.state, "history": report.history_text(),
            "runtime": report.runtime_fields()}


def job_info_data(report: TaskReport) -> Dict[str, Any]:
    data = job_status_data(report)
    if report.message:
        data["messages"] = report.message
    return data


def resources_data(dialect: str, total_nodes: int, total_cores: int, used_cores: int
                   ) -> Dict[str, int]:
    free = total_cores - used_cores
    if dialect == SEED:
        return {"totalCores": total_cores, "totalNodes": total_nodes, "usedCores": used_cores,
                "freeCores": free}
    return {"total_nodes": total_nodes, "total_cores": total_cores, "used_cores": used_cores,
            "free_cores": free}


# -- small helpers ---------------------------------------------------------------------------


def _shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def _one_line(text: str) -> str:
    return " ".join(text.split())


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
