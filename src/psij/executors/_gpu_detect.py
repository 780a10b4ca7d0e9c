"""Which GPUs a node has: the one finding shared by the pilot's own node and the local
executor's resource pool.

Sources, in order; the first that gives an answer wins (an answer may be "none"):

1. ``CUDA_VISIBLE_DEVICES``, ``ROCR_VISIBLE_DEVICES``, ``HIP_VISIBLE_DEVICES`` (the first one
   set; they restrict this process to their GPUs). An empty value, ``-1`` or ``NoDevFiles``
   means none; the list ends at the first id that is none or not an id (as the drivers read
   it); ids are indices or UUIDs (``GPU-...``, ``MIG-...``). With both ``ROCR_VISIBLE_DEVICES``
   and ``HIP_VISIBLE_DEVICES`` set, the HIP indices pick from the ROCR list, as the ROCm runtime
   does.
2. Inside a Slurm job (``SLURM_JOB_ID`` set): ``SLURM_STEP_GPUS``, then ``SLURM_JOB_GPUS``
   (lists of ids), then ``SLURM_GPUS_ON_NODE`` (a count: ids ``0`` to ``count - 1``). Empty or
   unreadable values are passed over.
3. ``nvidia-smi -L`` (the index of each ``GPU N:`` line).
4. ``rocm-smi --showid --csv`` (the N of each ``cardN,`` line).
5. The entries of ``/proc/driver/nvidia/gpus`` (one per GPU: ids ``0`` to ``count - 1``).

The vendor says which variables hand a task its GPUs (:meth:`GpuSet.environment`): NVIDIA's
``CUDA_VISIBLE_DEVICES``, or on AMD ``ROCR_VISIBLE_DEVICES`` with the ids and
``HIP_VISIBLE_DEVICES`` with ``0`` to ``k - 1`` (HIP indices count within what ROCR exposes).
It comes from the source, and for the Slurm variables from which vendor's tool or driver this
machine has (NVIDIA when neither).

Rules: nothing here raises for what the machine or its tools say. A command runs with a
timeout (its whole process group killed after it), stdin closed, stderr dropped and at most
:data:`MAX_OUTPUT` bytes of its output read; an output that is not UTF-8, garbage lines, a
failing or hanging command give what could be read, or nothing, and a log record saying
why. At most :data:`MAX_GPUS` GPUs are kept. :func:`found_gpus` runs the search once per
process, on first use (never at import), and again only when a variable it reads has changed.
Overrides (``--gpus``, a ``gpus`` setting) are read by :func:`gpus_from_setting`, which raises
``ValueError``/``TypeError`` naming the option for a bad value.

This module must not change the environment, and starts no process but the two probes
(through :mod:`psij.executors._process`, loaded only when it probes: a pilot's start-up is
measured in milliseconds).
"""

import functools
import os
import re
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from psij._clock import Clock, MonotonicClock
from psij._gpu_ids import AMD, ID_PATTERN, MAX_GPUS, NVIDIA, GpuSet, gpu_setting
from psij._lazylog import LazyLogger

__all__ = ["AMD", "MAX_GPUS", "MAX_OUTPUT", "NVIDIA", "PROBE_TIMEOUT", "PROC_GPUS", "GpuSet",
           "detect_gpus", "found_gpus", "gpus_from_setting", "parse_nvidia_smi",
           "parse_rocm_smi", "run_probe", "visible_ids"]

logger = LazyLogger(__name__)
_CLOCK: Clock = MonotonicClock()  # the probes are real processes: they run in real time

MAX_OUTPUT = 1 << 20
PROC_GPUS = "/proc/driver/nvidia/gpus"
PROBE_TIMEOUT = 10.0

_VISIBLE = (("CUDA_VISIBLE_DEVICES", NVIDIA), ("ROCR_VISIBLE_DEVICES", AMD),
            ("HIP_VISIBLE_DEVICES", AMD))
_NONE = ("-1", "NoDevFiles")
_NVIDIA_LINE = r"^GPU ([0-9]{1,9}):"
_ROCM_LINE = r"^card([0-9]{1,9}),"


# -- reading what sources say ------------------------------------------------------------------


def visible_ids(text: str, what: str) -> Tuple[str, ...]:
    """The ids of a visible-devices list, read as the drivers read it (see the module)."""
    ids: List[str] = []
    for part in text.split(","):
        part = part.strip()
        if part in _NONE or not part:
            break
        if re.match(ID_PATTERN, part) is None:
            logger.warning("%s: %r is not a GPU index or UUID; the list ends before it", what,
                           part[:40])
            break
        if part in ids:
            logger.debug("%s: GPU %s is listed twice; counted once", what, part)
            continue
        ids.append(part)
        if len(ids) == MAX_GPUS:
            logger.warning("%s: more than %d GPUs listed; the rest is ignored", what, MAX_GPUS)
            break
    return tuple(ids)


def _numbered(text: str, pattern: str, what: str) -> Tuple[str, ...]:
    ids: List[str] = []
    seen = set()
    skipped = 0
    for line in text.splitlines():
        m = re.match(pattern, line.strip())
        if m is None:
            skipped += line.strip() != ""
            continue
        index = str(int(m.group(1)))
        if index in seen:
            continue
        seen.add(index)
        ids.append(index)
        if len(ids) == MAX_GPUS:
            logger.warning("%s: more than %d GPUs listed; the rest is ignored", what, MAX_GPUS)
            break
    if skipped:
        logger.debug("%s: %d line(s) that name no GPU were passed over", what, skipped)
    return tuple(ids)


def parse_nvidia_smi(text: str) -> Tuple[str, ...]:
    """The indices of the ``GPU N: ...`` lines of ``nvidia-smi -L`` (MIG lines and anything
    else passed over)."""
    return _numbered(text, _NVIDIA_LINE, "nvidia-smi -L")


def parse_rocm_smi(text: str) -> Tuple[str, ...]:
    """The N of the ``cardN,...`` lines of ``rocm-smi --showid --csv`` (the header and
    anything else passed over)."""
    return _numbered(text, _ROCM_LINE, "rocm-smi --showid --csv")


def _amd_visible(env: Mapping[str, str]) -> Tuple[str, ...]:
    rocr = visible_ids(env["ROCR_VISIBLE_DEVICES"], "ROCR_VISIBLE_DEVICES")
    if "HIP_VISIBLE_DEVICES" not in env:
        return rocr
    picked: List[str] = []
    for index in visible_ids(env["HIP_VISIBLE_DEVICES"], "HIP_VISIBLE_DEVICES"):
        if not index.isdigit() or int(index) >= len(rocr):
            logger.warning("HIP_VISIBLE_DEVICES: %r picks no GPU of ROCR_VISIBLE_DEVICES; "
                           "the list ends before it", index)
            break
        if rocr[int(index)] not in picked:
            picked.append(rocr[int(index)])
    return tuple(picked)


def _slurm_gpus(env: Mapping[str, str], vendor: str) -> Optional[GpuSet]:
    for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        text = env.get(name, "").strip()
        if text:
            ids = visible_ids(text, name)
            if ids:
                return GpuSet(ids, vendor, name)
            logger.warning("%s: %r lists no GPU; passed over", name, text[:80])
    text = env.get("SLURM_GPUS_ON_NODE", "").strip()
    if text:
        if text.isascii() and text.isdigit() and int(text) <= MAX_GPUS:
            return GpuSet(tuple(str(i) for i in range(int(text))), vendor,
                          "SLURM_GPUS_ON_NODE")
        logger.warning("SLURM_GPUS_ON_NODE: %r is not a count from 0 to %d; passed over",
                       text[:80], MAX_GPUS)
    return None


# -- probing the machine -----------------------------------------------------------------------


def run_probe(argv: Sequence[str], timeout: float = PROBE_TIMEOUT, limit: int = MAX_OUTPUT,
              environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The output of ``argv`` (stdin closed, stderr dropped, ``environ`` its environment), at
    most ``limit`` bytes of it; None when it cannot start, runs past ``timeout`` seconds or
    exits non-zero (logged). Started by the executors' one process layer, as the leader of a
    process group of its own, which is killed when the command is not done in time."""
    import select

    from psij.executors._process import SIGKILL, LaunchError, Spawner, killpg

    env = dict(os.environ if environ is None else environ)
    read_end, write_end = os.pipe()
    try:
        devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            pid = Spawner().spawn(list(argv), os.getcwd(), env, devnull, write_end, devnull)
        finally:
            os.close(devnull)
    except (LaunchError, OSError) as ex:
        os.close(read_end)
        logger.debug("GPU probe %s could not start: %s", argv[0], ex)
        return None
    finally:
        os.close(write_end)
    chunks: List[bytes] = []
    size = 0
    why = ""
    deadline = _CLOCK.now() + timeout
    try:
        # poll, not select: select refuses descriptors numbered 1024 and above.
        readable = select.poll()
        readable.register(read_end, select.POLLIN)
        while True:
            left = deadline - _CLOCK.now()
            if left <= 0:
                why = f"did not finish within {timeout:g} s"
                break
            if not readable.poll(max(1, int(left * 1000))):
                continue
            data = os.read(read_end, 65536)
            if not data:
                break
            chunks.append(data[:limit - size])
            size += len(chunks[-1])
            if size >= limit:
                why = f"printed more than {limit} bytes"
                break
    except Exception as ex:  # the probe must not outlive a failure here
        why = f"could not be read: {ex}"
    finally:
        if why:
            killpg(pid, SIGKILL)
        os.close(read_end)
        code = _wait(pid, deadline)
    if code is None and not why:
        why = f"did not finish within {timeout:g} s"
    truncated = why.startswith("printed")
    if why:
        logger.warning("GPU probe %s %s; it was stopped and its output %s", argv[0], why,
                       "cut there" if truncated else "dropped")
        if not truncated:
            return None
    elif code != 0:
        logger.warning("GPU probe %s exited with %s; no GPU taken from it", " ".join(argv),
                       code)
        return None
    return b"".join(chunks).decode("utf-8", errors="replace")


def _wait(pid: int, deadline: float) -> Optional[int]:
    """The exit code of the probe ``pid``; None when someone else reaped it, or when it had
    not ended by ``deadline`` (its process group is then killed)."""
    from psij.executors._process import SIGKILL, exit_code_of, killpg, reap

    def ended() -> Optional[Tuple[Optional[int]]]:
        done, status = reap(pid)
        if not done:
            return None
        return (exit_code_of(status) if status is not None else 0,)

    result = _CLOCK.poll(ended, deadline - _CLOCK.now(), 0.005)
    if result is not None:
        return result[0]
    killpg(pid, SIGKILL)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    return None


def _proc_gpus(path: str) -> Tuple[str, ...]:
    try:
        entries = [e for e in os.listdir(path) if not e.startswith(".")]
    except OSError:
        return ()
    return tuple(str(i) for i in range(min(len(entries), MAX_GPUS)))


def _machine_vendor(env: Mapping[str, str], proc: str) -> str:
    import shutil

    path = env.get("PATH", os.defpath)
    if shutil.which("nvidia-smi", path=path) or os.path.isdir(proc):
        return NVIDIA
    if shutil.which("rocm-smi", path=path) or os.path.exists("/dev/kfd"):
        return AMD
    return NVIDIA


def detect_gpus(environ: Optional[Mapping[str, str]] = None, proc: Optional[str] = None,
                timeout: float = PROBE_TIMEOUT) -> GpuSet:
    """The GPUs of this node (see the module for the order): ``environ`` stands for this
    process's environment (its ``PATH`` finds the tools), ``proc`` for
    ``/proc/driver/nvidia/gpus``. Never raises for what it finds; uncached."""
    env = os.environ if environ is None else environ
    try:
        return _detect(env, PROC_GPUS if proc is None else proc, timeout)
    except Exception:  # a bug here must not stop a pilot or an executor
        logger.exception("GPU detection failed; no GPU taken")
        return GpuSet((), NVIDIA, "none (detection failed)")


def _detect(env: Mapping[str, str], proc: str, timeout: float) -> GpuSet:
    import shutil

    for name, vendor in _VISIBLE:
        if name in env:
            ids = _amd_visible(env) if name == "ROCR_VISIBLE_DEVICES" \
                else visible_ids(env[name], name)
            return GpuSet(ids, vendor, name)
    if env.get("SLURM_JOB_ID"):
        found = _slurm_gpus(env, _machine_vendor(env, proc))
        if found is not None:
            return found
    path = env.get("PATH", os.defpath)
    for tool, argv, parse, vendor in (
            ("nvidia-smi", ("-L",), parse_nvidia_smi, NVIDIA),
            ("rocm-smi", ("--showid", "--csv"), parse_rocm_smi, AMD)):
        program = shutil.which(tool, path=path)
        if program is None:
            continue
        text = run_probe((program, *argv), timeout, environ=env)
        if text is None:
            continue
        ids = parse(text)
        if ids:
            return GpuSet(ids, vendor, f"{tool} {' '.join(argv)}")
        logger.debug("%s lists no GPU", tool)
    ids = _proc_gpus(proc)
    if ids:
        return GpuSet(ids, NVIDIA, proc)
    return GpuSet((), NVIDIA, "none found")


# What the finding depends on in this process's environment.
_INPUTS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
           "SLURM_JOB_ID", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE", "PATH")


def found_gpus() -> GpuSet:
    """This node's GPUs (:func:`detect_gpus` of this process's environment), found once per
    process: again only if one of the variables it reads has changed since."""
    return _found(tuple(os.environ.get(name) for name in _INPUTS))


@functools.lru_cache(maxsize=4)
def _found(inputs: Tuple[Optional[str], ...]) -> GpuSet:
    # Nothing is logged on the way to a plain answer: logging is not loaded on a pilot's
    # start-up path unless something went wrong.
    return detect_gpus()


# -- overrides ---------------------------------------------------------------------------------


def gpus_from_setting(field: str, value: Any, found: Optional[GpuSet] = None) -> GpuSet:
    """The GPUs an override gives (:func:`psij._gpu_ids.gpu_setting`: a count or a list of
    ids): a count ``N`` is the first ``N`` GPUs ``found`` (default: :func:`found_gpus`, asked
    only for a count), else ids ``0`` to ``N - 1``; ``found`` gives the vendor. Raises
    ``ValueError``/``TypeError`` naming ``field``."""
    setting = gpu_setting(field, value)
    base = found if found is not None else found_gpus()
    if isinstance(setting, int):
        if len(base.ids) >= setting:
            return GpuSet(base.ids[:setting], base.vendor, field)
        return GpuSet(tuple(str(i) for i in range(setting)), base.vendor, field)
    return GpuSet(setting, base.vendor, field)
