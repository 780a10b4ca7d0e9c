"""The requests of a QCG-PilotJob request file, as checked records (what
:mod:`psij.executors.pilot.qcg._requests` reads and :mod:`psij.executors.pilot.qcg._plan`
expands).

Pure data: no parsing, no I/O. Any text of a job may still hold ``${...}`` variables.
"""

import re
from datetime import timedelta
from types import MappingProxyType
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from psij._record import Record
from psij.executors.pilot.resources import ResourceRequest

__all__ = [
    "CURRENT", "SEED", "BadRequest", "CancelJob", "Control", "Execution", "FinishRequest",
    "Iteration", "JobDescription", "JobInfo", "JobStatusRequest", "ListJobs", "RemoveJob",
    "Request", "RequestFile", "ResourcesInfo", "Spread", "Submit", "expand_variables",
    "iteration_index", "request_kind",
]

SEED = "seed"
CURRENT = "current"

_VARIABLE = r"\$\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}"
_NO_ENV: Mapping[str, str] = MappingProxyType({})


def iteration_index(text: str) -> Optional[int]:
    """The index in a sub-task's name ``job:index`` (which may be negative), or None."""
    digits = text[1:] if text.startswith("-") else text
    if not digits.isdigit() or not digits.isascii() or (digits[0] == "0" and len(digits) > 1):
        return None
    return int(text)


def expand_variables(text: str, values: Mapping[str, str]) -> str:
    """``${name}`` (spaces allowed inside the braces) replaced by ``values[name]``; a name
    not in ``values`` is left as written."""
    if "${" not in text:
        return text

    def replace(match: "re.Match[str]") -> str:
        value = values.get(match.group(1))
        return match.group(0) if value is None else value

    return re.sub(_VARIABLE, replace, text)


class Execution(Record):
    """What a task runs; any string may still hold ``${...}`` variables."""

    exec: Optional[str] = None
    args: Tuple[str, ...] = ()
    script: Optional[str] = None
    env: Mapping[str, str] = _NO_ENV
    wd: Optional[str] = None
    stdin: Optional[str] = None
    stdout: Optional[str] = None
    stderr: Optional[str] = None
    modules: Tuple[str, ...] = ()
    venv: Optional[str] = None
    model: str = "default"

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

    start: int
    stop: int
    values: Optional[Tuple[str, ...]] = None

    @property
    def size(self) -> int:
        return self.stop - self.start


class JobDescription(Record):
    """One job of a ``submit`` request, checked, with its variables not yet expanded."""

    where: str
    name: str
    execution: Execution
    resources: ResourceRequest
    iteration: Optional[Iteration] = None
    after: Tuple[str, ...] = ()
    walltime: Optional[timedelta] = None
    # How the job was written: the seed's ``iterate`` or the current ``iteration``.
    form: str = CURRENT
    spread: Optional["Spread"] = None  # maximum-iters: each iteration's own share of the pool


class Spread(Record):
    """``maximum-iters`` on ``numCores`` or ``numNodes`` (``key``): the pool's cores or nodes
    are shared out among the iterations, each getting at least ``minimum``; ``other`` is the
    element of the other key, if any, as written."""

    key: str
    minimum: int
    other: Optional[Mapping[str, Any]]

    def request(self, amount: int) -> ResourceRequest:
        """The request of an iteration given ``amount`` cores or nodes."""
        exact = {"exact": amount}
        if self.key == "numCores":
            return ResourceRequest.from_qcg(exact, self.other)
        return ResourceRequest.from_qcg(self.other, exact)


class Submit(Record):
    position: int
    jobs: Tuple[JobDescription, ...]


class Control(Record):
    position: int
    command: str


class _NamedJobs(Record):
    """A request about named jobs; ``listed`` when the names came as ``jobNames``."""

    position: int
    names: Tuple[str, ...]
    listed: bool = True


class JobStatusRequest(_NamedJobs):
    """``jobStatus`` (named so as not to be taken for :class:`psij.JobStatus`)."""


class JobInfo(_NamedJobs):
    """``jobInfo``."""


class CancelJob(_NamedJobs):
    """``cancelJob``."""


class RemoveJob(_NamedJobs):
    """``removeJob``."""


class _Bare(Record):
    position: int


class ListJobs(_Bare):
    """``listJobs``."""


class ResourcesInfo(_Bare):
    """``resourcesInfo``."""


class FinishRequest(_Bare):
    """``finish``: stop at once (named apart from the batch layer's ``Finish``)."""


class BadRequest(Record):
    """A request that cannot be run: answered with an error response, the others still run."""

    position: int
    kind: str
    message: str


Request = Union[Submit, Control, JobStatusRequest, JobInfo, CancelJob, RemoveJob, ListJobs,
                ResourcesInfo, FinishRequest, BadRequest]


def request_kind(request: Request) -> str:
    """The ``request`` word of a parsed request."""
    if isinstance(request, BadRequest):
        return request.kind
    return _KIND_OF[type(request)]


_KIND_OF: Dict[type, str] = {
    Submit: "submit", Control: "control", JobStatusRequest: "jobStatus", JobInfo: "jobInfo",
    CancelJob: "cancelJob", RemoveJob: "removeJob", ListJobs: "listJobs",
    ResourcesInfo: "resourcesInfo", FinishRequest: "finish",
}


class RequestFile(Record):
    """All requests of a file, in file order, and the form its responses take."""

    requests: Tuple[Request, ...]
    dialect: str = SEED

    def errors(self) -> List[BadRequest]:
        return [r for r in self.requests if isinstance(r, BadRequest)]


def _shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"
