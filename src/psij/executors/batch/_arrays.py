"""Job arrays: many jobs that differ only in their arguments or environment go to the
scheduler as one array submission (``sbatch --array``, ``qsub -t``, ``qsub -J``,
``bsub -J "name[1-N]"``), and each keeps its own ``Job``, native id, status, exit code, output
files and cancel.

How a batch of jobs becomes arrays:

- Each job is checked as ``submit`` checks it, then its script is rendered once with two
  markers in place of what may differ between elements: the environment (the ``export`` lines)
  and the launch command (which carries the job's id, arguments and stdout/stderr paths). That
  rendering is the job's *shape*; jobs whose shapes are equal (same resources, limits, queue,
  name, directory, template values) form a group, in submission order.
- A group of two or more jobs is submitted as one array script: the shape with the scheduler's
  array directive added after the first line, the native-id line replaced by the element's form
  (``<array id>_<index>`` on Slurm, ``<id>.<index>`` on Grid Engine, ``<id>[<index>].<server>``
  on PBS, ``<id>[<index>]`` on LSF), and a ``case`` on the scheduler's index variable that
  exports the element's environment and sets its launch command's words. Jobs without a
  name, each named after its own script by default (Slurm), share a shape; their array takes
  the first one's name. Everything the script
  writes is named after the element's native id (its ``.out``, ``.ec`` and ``.nodefile``
  files), and the job's own streams follow its launch command, so every element has its own.
- A group bigger than the style's ``max_size`` is cut into several arrays. A single job, or a
  template without the markers exactly once, is rendered and submitted alone; a backend
  without an array style, or rendering its scripts by its own hooks, submits one by one
  through ``submit``.
- Where the script goes to a file (see ``psij.executors.batch._submit_io``), it is written
  once under the first job's name and hard-linked under every other job's name, so that each
  element's end removes its own link as for a single job.

A failure (a refused job, a failed array submission) fails only the jobs concerned: they stay
NEW and unbound, and :class:`~psij.exceptions.SubmitManyException` lists them once every group
has been tried. The pure part (shapes, grouping, the array script, element ids, index ranges)
is apart from :func:`submit_arrays`, a step of the submission pipeline: it takes the jobs the
executor checked with their script contexts, the template's generator, the ``SubmitInputs``
(``psij.executors.batch._submit_io``) and the track step as a callable,
never the executor (it imports nothing of ``batch_scheduler_executor``), and enters the
render and submit steps once per job or array. Nothing here starts processes but through
``_submit_io.run_submit``.
"""

import logging
import os
import re
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from psij._scripts.generator import TemplatedScriptGenerator
from psij._scripts.quoting import ShellWord
from psij.exceptions import SubmitException
from psij.executors.batch._script_context import default_job_name
from psij.executors.batch._submit_io import (
    SubmitInputs,
    parse_native_id,
    run_submit,
    submit_text,
)
from psij.job import Job

__all__ = ["LSF_ARRAYS", "PBS_ARRAYS", "SGE_ARRAYS", "SLURM_ARRAYS", "ArrayStyle", "array_script",
           "expand_index_list", "shape_context", "submit_arrays"]

logger = logging.getLogger(__name__)

ENV_MARK = "_PSIJ_ARRAY_ENVIRONMENT_MARK"
LAUNCH_MARK = "_psij_array_launch_mark"
NAME_MARK = "_psij_array_name_mark"
ELEMENT_WORDS = "_psij_element"


class ArrayStyle:
    """How one scheduler writes and names job arrays.

    ``single_id_line`` is the line of the scheduler's template that sets ``_PSIJ_NATIVE_ID``
    for a single job; ``array_id_line`` replaces it in an array script. ``directive`` is the
    line asking for indices ``first``..``last``; ``index_var`` the variable holding an
    element's index; ``max_size`` the most elements put in one array.
    """

    def __init__(self, index_var: str, first_index: int, single_id_line: str,
                 array_id_line: str, directive: str, max_size: int,
                 element_id: Callable[[str, int], str],
                 array_id: Callable[[str], Optional[Tuple[str, int]]],
                 add_directive: Optional[Callable[[str, int, int], str]] = None) -> None:
        self.index_var = index_var
        self.first_index = first_index
        self.single_id_line = single_id_line
        self.array_id_line = array_id_line
        self.directive = directive
        self.max_size = max_size
        self.element_id = element_id
        self._split = array_id
        self._add_directive = add_directive

    def split(self, native_id: str) -> Optional[Tuple[str, int]]:
        """(array id, index) of an element's native id; None for a job that is no element."""
        return self._split(native_id)

    def directives(self, shape: str, first: int, last: int) -> str:
        """``shape`` with the array directive added after its first line."""
        if self._add_directive is not None:
            return self._add_directive(shape, first, last)
        head, _, rest = shape.partition("\n")
        line = self.directive.format(first=first, last=last)
        return f"{head}\n{line}\n{rest}"


def _split_with(pattern: str) -> Callable[[str], Optional[Tuple[str, int]]]:
    compiled = re.compile(pattern)

    def split(native_id: str) -> Optional[Tuple[str, int]]:
        match = compiled.fullmatch(native_id)
        if match is None:
            return None
        return match.group("array"), int(match.group("index"))

    return split


SLURM_ARRAYS = ArrayStyle(
    index_var="SLURM_ARRAY_TASK_ID", first_index=0,
    single_id_line="_PSIJ_NATIVE_ID=$SLURM_JOB_ID",
    array_id_line='_PSIJ_NATIVE_ID="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"',
    directive="#SBATCH --array={first}-{last}",
    # Slurm's default MaxArraySize is 1001: indices 0 to 1000.
    max_size=1000,
    element_id=lambda array, index: f"{array}_{index}",
    array_id=_split_with(r"(?P<array>\d+)_(?P<index>\d+)"))

SGE_ARRAYS = ArrayStyle(
    index_var="SGE_TASK_ID", first_index=1,
    single_id_line="_PSIJ_NATIVE_ID=$JOB_ID",
    array_id_line='_PSIJ_NATIVE_ID="$JOB_ID.$SGE_TASK_ID"',
    directive="#$ -t {first}-{last}",
    max_size=75000,  # Grid Engine's default max_aj_tasks
    element_id=lambda array, index: f"{array}.{index}",
    array_id=_split_with(r"(?P<array>\d+)\.(?P<index>\d+)"))


def _pbs_element(array: str, index: int) -> str:
    return array.replace("[]", f"[{index}]", 1)


def _pbs_split(native_id: str) -> Optional[Tuple[str, int]]:
    # The array id keeps the server part: 1234[5].server -> 1234[].server.
    match = re.fullmatch(r"(\d+)\[(\d+)\](.*)", native_id)
    if match is None:
        return None
    return f"{match.group(1)}[]{match.group(3)}", int(match.group(2))


PBS_ARRAYS = ArrayStyle(
    # PBS_JOBID is the subjob's own id (1234[5].server): the single job's line serves both.
    index_var="PBS_ARRAY_INDEX", first_index=0,
    single_id_line="_PSIJ_NATIVE_ID=$PBS_JOBID",
    array_id_line="_PSIJ_NATIVE_ID=$PBS_JOBID",
    directive="#PBS -J {first}-{last}",
    max_size=10000,  # PBS Pro's default max_array_size
    element_id=_pbs_element, array_id=_pbs_split)

_LSF_NAME = re.compile(r'^#BSUB -J "([^"\n]*)"\n', re.MULTILINE)


def _lsf_directives(shape: str, first: int, last: int) -> str:
    # The array is named by -J: the job's own name (its line is dropped) or "psij".
    match = _LSF_NAME.search(shape)
    name = "psij"
    if match is not None:
        name = re.sub(r"[^A-Za-z0-9._-]", "_", match.group(1)) or "psij"
        shape = shape[:match.start()] + shape[match.end():]
    head, _, rest = shape.partition("\n")
    return f'{head}\n#BSUB -J "{name}[{first}-{last}]"\n{rest}'


LSF_ARRAYS = ArrayStyle(
    index_var="LSB_JOBINDEX", first_index=1,
    single_id_line="_PSIJ_NATIVE_ID=$LSB_JOBID",
    array_id_line='_PSIJ_NATIVE_ID="$LSB_JOBID[$LSB_JOBINDEX]"',
    directive='#BSUB -J "psij[{first}-{last}]"',
    max_size=1000,  # LSF's default MAX_JOB_ARRAY_SIZE
    element_id=lambda array, index: f"{array}[{index}]",
    array_id=_split_with(r"(?P<array>\d+)\[(?P<index>\d+)\]"),
    add_directive=_lsf_directives)


# ---------------------------------------------------------------------------- pure part


def shape_context(context: Dict[str, object]) -> Dict[str, object]:
    """A copy of a script context with the markers in place of the environment and the
    launch command."""
    shaped = dict(context)
    shaped["env"] = [{"name": ENV_MARK, "value": ""}]
    psij = dict(context["psij"])  # type: ignore[call-overload]
    psij["launch_command"] = [ShellWord(LAUNCH_MARK)]
    job = context.get("job")
    if isinstance(job, Job) and psij.get("job_name") == default_job_name(job):
        psij["job_name"] = NAME_MARK  # each job's own default name: the array takes the first's
    shaped["psij"] = psij
    return shaped


def shape_is_usable(style: ArrayStyle, shape: str) -> bool:
    """True when ``shape`` holds each marker and the native-id line exactly once."""
    env_lines = [line for line in shape.splitlines()
                 if line.strip().startswith(f"export {ENV_MARK}=")]
    return (len(env_lines) == 1 and shape.count(LAUNCH_MARK) == 1
            and shape.count(ENV_MARK) == 1
            and sum(1 for line in shape.splitlines()
                    if line.strip() == style.single_id_line) == 1)


def element_text(env: Sequence[Tuple[str, str]], launch_words: Sequence[str],
                 escape: Callable[[object], str]) -> str:
    """The ``case`` branch body of one element: its exports and its launch command's words."""
    lines = [f'export {name}="{escape(value)}"' for name, value in env]
    command = " ".join(escape(ShellWord(w)) for w in launch_words)
    lines.append(f"{ELEMENT_WORDS}=({command})")
    return "\n".join(lines)


def array_script(style: ArrayStyle, shape: str, elements: Sequence[str],
                 first: Optional[int] = None) -> str:
    """The array script of ``elements`` (each from ``element_text``) over ``shape``."""
    start = style.first_index if first is None else first
    last = start + len(elements) - 1
    text = style.directives(shape, start, last)
    out: List[str] = []
    for line in text.split("\n"):
        stripped = line.strip()
        if stripped == style.single_id_line:
            out.append(style.array_id_line)
        elif stripped.startswith(f"export {ENV_MARK}="):
            out.append(f'case "${style.index_var}" in')
            for offset, body in enumerate(elements):
                out.append(f"{start + offset})")
                out.append(body)
                out.append(";;")
            out.append(f"*) echo \"psij: this array has no element ${style.index_var}\" >&2; "
                       "exit 1 ;;")
            out.append("esac")
        else:
            out.append(line.replace(LAUNCH_MARK, f'"${{{ELEMENT_WORDS}[@]}}"'))
    return "\n".join(out)


def expand_index_list(text: str) -> List[int]:
    """The indices of a scheduler's index list: ``5``, ``1-9``, ``1-9:2`` (Grid Engine's step),
    lists of those joined by commas, with an optional ``%N`` (Slurm's limit) at the end."""
    body = text.partition("%")[0]
    indices: List[int] = []
    for part in body.split(","):
        part = part.strip()
        match = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part)
        if match is None:
            raise ValueError(f"index list {text!r}: {part!r} is not an index or a range")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        step = int(match.group(3)) if match.group(3) is not None else 1
        if high < low or step < 1 or high - low > 10_000_000:
            raise ValueError(f"index list {text!r}: {part!r} is not a usable range")
        indices.extend(range(low, high + 1, step))
    return indices


def group_by_shape(shapes: Sequence[Tuple[Job, Optional[str]]]) -> List[List[Job]]:
    """Jobs with equal shapes together, in order of first appearance; a job without a usable
    shape (None) alone."""
    groups: Dict[object, List[Job]] = {}
    for n, (job, shape) in enumerate(shapes):
        groups.setdefault(shape if shape is not None else ("alone", n), []).append(job)
    return list(groups.values())


# ---------------------------------------------------------------------------- submission


# The track step of a submitted job: its native id and, for an element, its array's id.
Track = Callable[[Job, str, Optional[str]], None]
Failures = List[Tuple[Job, BaseException]]


def submit_arrays(style: ArrayStyle, generator: TemplatedScriptGenerator,
                  checked: Sequence[Tuple[Job, Dict[str, object]]], inputs: SubmitInputs,
                  track: Track) -> Failures:
    """Submit ``checked`` jobs (each bound to the executor, with its script context), as
    arrays where they allow it (see the module's docstring), handing each submitted job to
    ``track``; the jobs that failed, each with its exception (left NEW and unbound)."""
    failures: Failures = []
    prepared: List[Tuple[Job, Optional[str]]] = []
    contexts: Dict[str, Dict[str, object]] = {}
    for job, context in checked:
        shape: Optional[str] = None
        try:
            shape = generator.render(shape_context(context))
        except Exception as e:  # the template wants more than the markers: one by one
            logger.debug("job %s: no array shape: %s", job.id, e)
        if shape is not None and not shape_is_usable(style, shape):
            shape = None
        contexts[job.id] = context
        prepared.append((job, shape))
    shape_of = dict((job.id, shape) for job, shape in prepared)
    for group in group_by_shape(prepared):
        shape = shape_of[group[0].id]
        if shape is None or len(group) < 2:
            for job in group:
                _submit_one(generator, inputs, track, job, contexts[job.id], failures)
            continue
        for lo in range(0, len(group), style.max_size):
            chunk = group[lo:lo + style.max_size]
            if len(chunk) < 2:
                _submit_one(generator, inputs, track, chunk[0], contexts[chunk[0].id],
                            failures)
                continue
            _submit_array(style, generator, inputs, track, shape, chunk, contexts, failures)
    return failures


def _submit_one(generator: TemplatedScriptGenerator, inputs: SubmitInputs, track: Track,
                job: Job, context: Dict[str, object], failures: Failures) -> None:
    """Render and submit one job, as ``submit`` does after its check and context steps."""
    try:
        native_id = submit_text(inputs, job, generator.render(context))
        if isinstance(native_id, SubmitException):
            raise native_id
    except Exception as e:
        job.executor = None
        failures.append((job, e))
        return
    track(job, native_id, None)


def _element(generator: TemplatedScriptGenerator, context: Dict[str, object]) -> str:
    env = [(str(e["name"]), str(e["value"])) for e in context["env"]]  # type: ignore
    words = [str(w) for w in context["psij"]["launch_command"]]  # type: ignore
    return element_text(env, words, generator.escape)


def _submit_array(style: ArrayStyle, generator: TemplatedScriptGenerator,
                  inputs: SubmitInputs, track: Track, shape: str, group: List[Job],
                  contexts: Dict[str, Dict[str, object]], failures: Failures) -> None:
    first = group[0]
    array_id: Union[str, Exception]
    try:
        text = array_script(style, shape, [_element(generator, contexts[j.id]) for j in group])
        text = text.replace(NAME_MARK, default_job_name(first))
        result, script = run_submit(inputs, first, text)
        if script.exists():  # written (kept files, or a scheduler reading no standard input)
            for job in group[1:]:
                link = inputs.script_dir / f"{job.id}.job"
                try:
                    os.unlink(link)
                except FileNotFoundError:
                    pass
                os.link(script, link)
        array_id = parse_native_id(result, inputs, first, script, array_of=len(group))
    except Exception as e:
        array_id = e
    if not isinstance(array_id, str):
        for job in group:
            job.executor = None
            failures.append((job, array_id))
        return
    logger.debug("array of %d jobs submitted as %s", len(group), array_id)
    for offset, job in enumerate(group):
        track(job, style.element_id(array_id, style.first_index + offset), array_id)
