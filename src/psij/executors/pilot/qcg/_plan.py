"""Planning a QCG-PilotJob request file: submit-time variables, names, dependencies, and the
share of the pool each iteration gets; the tasks of an iterative job made one at a time.

Pure: no I/O, no clock (the time a request was received and the unique ids are passed in).
Variables are expanded in two steps, as QCG does: the planner expands the ones known when a
request is received (rcnt, uniq, sname, date, time, dateTime, it, its, it_start, it_stop, itval,
jname); :func:`start_variables` gives the ones known when a task is placed (root_wd, ncores,
nnodes, nlist), which the runner expands then. A ``${name}`` that is not one of these is left
as it is, so that shell variables in scripts survive.

Rules:

- Requests are planned one at a time (:class:`RequestPlanner`), each against the names the
  requests before it left: a name used twice (unless removed in between), a name with
  forbidden characters, a dependency cycle between the jobs of one request, a ``split-into``
  that resolves to zero cores or nodes, or a ``maximum-iters`` minimum above the pool, make
  that request a :class:`BadRequest` and register none of its jobs.
- A dependency on a job that no request submitted does not refuse the request: the dependant
  is planned with ``missing`` set and ends OMITTED, as qcg-pilotjob documents.
- The jobs of one request may name each other in any order; they are planned (and then
  submitted) dependencies first.
- The iterations of a job with ``iteration`` (or the seed's ``iterate`` without ``${it}`` in
  the name) are the sub-tasks ``name:i`` of the group ``name``: the plan holds the group, and
  :meth:`PlannedJob.tasks` makes each sub-task when asked, in O(1) per iteration, so that a
  million iterations cost nothing before the first one runs.
- ``maximum-iters`` shares the pool's cores (or nodes) out among the iterations as
  qcg-pilotjob 0.14 does (:func:`maximum_iters`): as few rounds as the minimum allows, each
  round's iterations splitting the whole pool, the larger shares last.
"""

import re
from datetime import datetime, timedelta
from typing import (
    Callable,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)

from psij._record import Record
from psij.executors.pilot.qcg._schema import (
    SEED,
    BadRequest,
    Execution,
    JobDescription,
    RemoveJob,
    Request,
    RequestFile,
    Submit,
    expand_variables,
    iteration_index,
)
from psij.executors.pilot.resources import Amount, ResourcePool, ResourceRequest

__all__ = ["START_VARIABLES", "PlannedJob", "PlannedSubmit", "RequestPlanner", "StartContext",
           "TaskTemplate", "maximum_iters", "plan_requests", "start_variables"]

START_VARIABLES = ("root_wd", "ncores", "nnodes", "nlist")
"""The variables known only when a task is placed."""

# Characters QCG refuses in a final job name; ':' separates a sub-task's iteration index.
_NAME_FORBIDDEN = set("${}()'\"") | {":"}
_NAME_BAD = r"[\s${}()'\":]"
_VARIABLE = r"\$\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}"
_SPLIT_ZERO = "Wrong submit request - split-into resolved to zero"


class TaskTemplate(Record):
    """One task to submit: final name, scheduling data, and its execution with the variables
    known at start still to expand (see :func:`start_variables`). ``missing`` names a
    dependency that is no job: the task is not run and ends OMITTED."""

    name: str
    job: str
    resources: ResourceRequest
    execution: Execution
    after: Tuple[str, ...] = ()
    group: Optional[str] = None
    iteration: Optional[int] = None
    walltime: Optional[timedelta] = None
    missing: Optional[str] = None


class StartContext(Record):
    """What is known of a task when it is placed."""

    root_wd: str
    ncores: int
    nnodes: int
    nodes: Tuple[str, ...]


def start_variables(context: StartContext) -> Dict[str, str]:
    return {"root_wd": context.root_wd, "ncores": str(context.ncores),
            "nnodes": str(context.nnodes), "nlist": ",".join(context.nodes)}


def maximum_iters(total: int, iterations: int, minimum: int) -> Iterator[int]:
    """The cores (or nodes) of each iteration under ``maximum-iters``, in iteration order.

    As few rounds as ``minimum`` allows; the iterations of a round split ``total`` between
    them as evenly as whole numbers allow, the larger shares last (8 over 5: 1, 1, 2, 2, 2).
    """
    if minimum > total:
        raise ValueError(f"maximum-iters: min ({minimum}) is more than the pool's {total}")
    per_round = total // minimum
    rounds = -(-iterations // per_round)
    left = iterations
    for done in range(rounds):
        in_round = -(-left // (rounds - done))
        free = total
        for i in range(in_round):
            share = free // (in_round - i)
            free -= share
            yield share
        left -= in_round


class PlannedJob:
    """One job of a planned ``submit``: its response name and its tasks, made on demand."""

    __slots__ = ("_make", "count", "group", "name", "start")

    def __init__(self, name: str, group: Optional[str], count: int,
                 make: Callable[[], Iterator[TaskTemplate]], start: int = 0) -> None:
        self.name = name  # as the submit response lists it
        self.group = group  # the iteration group, for a job of sub-tasks
        self.count = count
        self.start = start  # the first iteration index of a group
        self._make = make

    def tasks(self) -> Iterator[TaskTemplate]:
        """The job's tasks in iteration order (each call starts again)."""
        return self._make()


class PlannedSubmit(Record):
    """A ``submit`` request with its jobs planned, dependencies first."""

    position: int
    jobs: Tuple[PlannedJob, ...]
    # The job names as QCG reports them in the submit response (a group counts once).
    job_names: Tuple[str, ...]

    def tasks(self) -> Iterator[TaskTemplate]:
        for job in self.jobs:
            yield from job.tasks()


Planned = Union[PlannedSubmit, Request]


def plan_requests(requests: RequestFile, received: datetime, unique_id: Callable[[], str],
                  pool: ResourcePool, site_name: str = "local") -> List[Planned]:
    """Every request of a file planned in file order (see :class:`RequestPlanner`)."""
    planner = RequestPlanner(received, unique_id, pool, site_name)
    return [planner.plan(request) for request in requests.requests]


class _Registry:
    """The job names known after each request: plain tasks and iteration groups."""

    def __init__(self) -> None:
        self.tasks: Set[str] = set()
        self.groups: Dict[str, range] = {}

    def known(self, name: str) -> bool:
        if name in self.tasks or name in self.groups:
            return True
        group, _, text = name.rpartition(":")
        indices = self.groups.get(group)
        if indices is None:
            return False
        index = iteration_index(text)
        return index is not None and index in indices

    def remove(self, name: str) -> None:
        self.groups.pop(name, None)
        self.tasks.discard(name)


class RequestPlanner:
    """Plans the requests of one file in order, against the names earlier ones left."""

    def __init__(self, received: datetime, unique_id: Callable[[], str], pool: ResourcePool,
                 site_name: str = "local") -> None:
        self._received = received
        self._unique_id = unique_id
        self._site_name = site_name
        self._registry = _Registry()
        self._rcnt = 0
        nodes = pool.nodes
        self._totals = {"cores": sum(n.cores for n in nodes), "nodes": len(nodes),
                        "node cores": max(n.cores for n in nodes)}

    def plan(self, request: Request) -> Planned:
        """``request`` planned, or a :class:`BadRequest` saying why it cannot run."""
        if isinstance(request, RemoveJob):
            for name in request.names:
                self._registry.remove(name)
        if not isinstance(request, Submit):
            return request
        self._rcnt += 1
        try:
            return self._plan_submit(request)
        except ValueError as exc:
            return BadRequest(request.position, "submit", str(exc))

    def _plan_submit(self, request: Submit) -> PlannedSubmit:
        received = self._received
        base = {"rcnt": str(self._rcnt), "sname": self._site_name,
                "date": received.date().isoformat(), "time": received.time().isoformat(),
                "dateTime": str(received)}
        # Names this request adds, checked against each other and the registry; registered
        # only once the whole request is planned.
        adding = _Registry()
        planned: Dict[int, PlannedJob] = {}
        for index in _dependencies_first(request.jobs):
            job = request.jobs[index]
            self._check_resources(job)
            planned[index] = self._plan_job(job, base, adding)
        names: List[str] = []
        for index in range(len(request.jobs)):  # the response lists them in file order
            job_plan = planned[index]
            if job_plan.group is not None or job_plan.count == 1:
                names.append(job_plan.name)
            else:
                names.extend(t.name for t in job_plan.tasks())
        self._registry.tasks |= adding.tasks
        self._registry.groups.update(adding.groups)
        return PlannedSubmit(request.position, tuple(planned.values()), tuple(names))

    def _check_resources(self, job: JobDescription) -> None:
        totals = self._totals
        request = job.resources
        checks: List[Tuple[str, Optional[Amount], str]] = [
            ("numNodes", request.nodes, "nodes"),
            ("numCores", request.processes, "cores"),
            ("numCores", request.processes_per_node, "node cores"),
        ]
        for key, amount, total in checks:
            if amount is not None and amount.split_into is not None \
                    and totals[total] // amount.split_into == 0:
                raise ValueError(f"{job.where}.resources.{key}: {_SPLIT_ZERO} (the pool's "
                                 f"{totals[total]} {total.split()[-1]} split into "
                                 f"{amount.split_into} parts)")
        spread = job.spread
        if spread is not None:
            have = totals["cores" if spread.key == "numCores" else "nodes"]
            if spread.minimum > have:
                raise ValueError(f"{job.where}.resources.{spread.key}.min: maximum-iters with "
                                 f"min {spread.minimum}, more than the pool's {have}")

    def _known(self, adding: _Registry, name: str) -> bool:
        return self._registry.known(name) or adding.known(name)

    def _missing(self, adding: _Registry, after: Sequence[str]) -> Optional[str]:
        return next((a for a in after if not self._known(adding, a)), None)

    def _plan_job(self, job: JobDescription, base: Mapping[str, str],
                  adding: _Registry) -> PlannedJob:
        iteration = job.iteration
        per_iteration_names = iteration is not None and "it" in _variables_in(job.name)
        if per_iteration_names and job.form != SEED:
            raise ValueError(f"{job.where}.name: {job.name!r} uses ${{it}}; with "
                             f"'iteration' the sub-tasks are named {job.name}:N by "
                             f"themselves (the seed's 'iterate' allows ${{it}} in names)")
        if iteration is None or per_iteration_names:
            return self._plan_eager(job, base, adding)
        group = _checked_name(job.where, expand_variables(
            job.name, {**base, "uniq": self._unique_id()}))
        self._check_unique(job.where, group, adding)
        adding.groups[group] = range(iteration.start, iteration.stop)
        resources = self._resources(job)
        static = "${" not in job.name and not any("${" in d for d in job.after) \
            and not job.execution.has_variables()

        def make() -> Iterator[TaskTemplate]:
            shares = resources()
            if static:
                missing = self._missing(adding, job.after)
                for index in range(iteration.start, iteration.stop):
                    yield TaskTemplate(f"{group}:{index}", group, next(shares), job.execution,
                                       job.after, group, index, job.walltime, missing)
                return
            fixed = {**base, "its": str(iteration.size), "it_start": str(iteration.start),
                     "it_stop": str(iteration.stop), "jname": group}
            for index in range(iteration.start, iteration.stop):
                values = dict(fixed)
                values["uniq"] = self._unique_id()
                values["it"] = str(index)
                if iteration.values is not None:
                    values["itval"] = iteration.values[index - iteration.start]
                after = tuple(expand_variables(d, values) for d in job.after)
                yield TaskTemplate(f"{group}:{index}", group, next(shares),
                                   job.execution.expanded(values), after, group, index,
                                   job.walltime, self._missing(adding, after))

        return PlannedJob(group, group, iteration.size, make, iteration.start)

    def _plan_eager(self, job: JobDescription, base: Mapping[str, str],
                    adding: _Registry) -> PlannedJob:
        """A plain job, or the seed's iterations named by ``${it}``: one job per task."""
        iteration = job.iteration
        indices: Sequence[Optional[int]] = [None] if iteration is None \
            else range(iteration.start, iteration.stop)
        shares = self._resources(job)()
        tasks: List[TaskTemplate] = []
        for index in indices:
            values = dict(base)
            values["uniq"] = self._unique_id()
            if iteration is not None and index is not None:
                values.update(it=str(index), its=str(iteration.size),
                              it_start=str(iteration.start), it_stop=str(iteration.stop))
                if iteration.values is not None:
                    values["itval"] = iteration.values[index - iteration.start]
            name = _checked_name(job.where, expand_variables(job.name, values))
            values["jname"] = name
            self._check_unique(job.where, name, adding)
            after = tuple(expand_variables(d, values) for d in job.after)
            missing = self._missing(adding, after)
            adding.tasks.add(name)
            tasks.append(TaskTemplate(name, name, next(shares),
                                      job.execution.expanded(values), after, None, index,
                                      job.walltime, missing))
        frozen = tuple(tasks)
        return PlannedJob(frozen[0].name, None, len(frozen), lambda: iter(frozen))

    def _check_unique(self, where: str, name: str, adding: _Registry) -> None:
        if self._known(adding, name):
            raise ValueError(f"{where}.name: job {name!r} is already submitted; job names "
                             f"must be unique (removeJob first to reuse one)")

    def _resources(self, job: JobDescription) -> Callable[[], Iterator[ResourceRequest]]:
        """Each iteration's request: the job's own, or its ``maximum-iters`` share."""
        spread = job.spread
        iteration = job.iteration
        if spread is None or iteration is None:
            return lambda: _repeat(job.resources)
        total = self._totals["cores" if spread.key == "numCores" else "nodes"]

        def shares() -> Iterator[ResourceRequest]:
            requests: Dict[int, ResourceRequest] = {}
            for amount in maximum_iters(total, iteration.size, spread.minimum):
                request = requests.get(amount)
                if request is None:
                    request = requests[amount] = spread.request(amount)
                yield request

        return shares


def _repeat(value: ResourceRequest) -> Iterator[ResourceRequest]:
    while True:
        yield value


def _dependencies_first(jobs: Sequence[JobDescription]) -> List[int]:
    """The indices of the jobs of one request, each after the jobs of the same request it
    names (as written, or as its group ``name:i``); raises ``ValueError`` for a cycle."""
    by_name = {job.name: i for i, job in enumerate(jobs)}
    needs: List[List[int]] = []
    for job in jobs:
        targets = set()
        for dependency in job.after:
            i = by_name.get(dependency)
            if i is None:
                i = by_name.get(dependency.rpartition(":")[0])
            if i is not None:
                targets.add(i)
        needs.append(sorted(targets))
    order: List[int] = []
    state = [0] * len(jobs)  # 0 new, 1 being visited, 2 placed
    for first in range(len(jobs)):
        stack = [(first, 0)]
        while stack:
            at, next_need = stack.pop()
            if next_need == 0:
                if state[at] == 2:
                    continue
                state[at] = 1
            if next_need < len(needs[at]):
                stack.append((at, next_need + 1))
                target = needs[at][next_need]
                if state[target] == 1:
                    cycle = [jobs[i].name for i, s in enumerate(state) if s == 1]
                    raise ValueError(f"{jobs[target].where}.dependencies: a dependency cycle "
                                     f"between jobs {', '.join(repr(n) for n in cycle)}; "
                                     f"none of them could ever start")
                if state[target] == 0:
                    stack.append((target, 0))
                continue
            state[at] = 2
            order.append(at)
    return order


def _variables_in(text: str) -> Set[str]:
    return set(re.findall(_VARIABLE, text))


def _checked_name(where: str, name: str) -> str:
    if re.search(_NAME_BAD, name) is None:
        return name
    bad = sorted({c for c in name if c in _NAME_FORBIDDEN or c.isspace()})
    unknown = _variables_in(name)
    if unknown:
        raise ValueError(f"{where}.name: {name!r} uses unknown variable(s) "
                         f"{', '.join(sorted(unknown))}; names may use rcnt, uniq, sname, "
                         f"date, time, dateTime and, with iterations, it, its, it_start, "
                         f"it_stop, itval")
    raise ValueError(f"{where}.name: {name!r} contains {''.join(bad)!r}; job names may not "
                     f"contain spaces, quotes, $, braces, parentheses or ':' (which "
                     f"separates an iteration index)")
