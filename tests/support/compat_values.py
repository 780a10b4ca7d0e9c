"""The value matrix of the differential test against psij-python (tests/integration/
test_compat_values.py), run as a script by either implementation's interpreter.

``python compat_values.py ours|reference WORKDIR`` builds every case (a public field of the
model classes and executor configurations, a kind of value, a way of setting it: in the
constructor, by assignment after it, or appended to a list already assigned), sets it, and for
the accepted ones that change what runs submits the job to the local executor and renders and
runs its Slurm script (bash, with a fake ``scontrol``; no Slurm is needed). It prints one JSON
object, case id -> outcome. Only the standard library and ``psij`` are imported, so that the
same file runs beside psij-python 0.9.11 in its own virtual environment.
"""

import io
import json
import math
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from psij import Job, JobAttributes, JobExecutor, JobExecutorConfig, JobSpec, ResourceSpecV1

IMPL = sys.argv[1] if len(sys.argv) > 1 else "ours"
WORK = Path(sys.argv[2]) if len(sys.argv) > 2 else Path.cwd()
SHOW = WORK / "show"


class PathLikeValue(os.PathLike):  # type: ignore[type-arg]
    """A path-like object that is not a pathlib.Path (as some libraries' file objects are)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __fspath__(self) -> str:
        return self.path

    def __repr__(self) -> str:
        return f"PathLikeValue({self.path!r})"


def gen(*items: Any) -> Any:
    return (i for i in items)


# A value kind -> a function of the case folder giving a fresh value (generators are used once).
Values = List[Tuple[str, Callable[[Path], Any]]]

HOSTILE_TEXT: Values = [
    ("newline", lambda d: "a\nb"),
    ("nul", lambda d: "a\x00b"),
    ("lone_surrogate", lambda d: "a\ud800b"),
    ("shell_meta", lambda d: "$(echo x) `y` 'q' \"d\""),
    ("empty", lambda d: ""),
]
TEXT: Values = [
    ("str", lambda d: "value"),
    ("pathlib.Path", lambda d: Path("value")),
    ("os.PathLike", lambda d: PathLikeValue("value")),
    ("bytes", lambda d: b"value"),
    ("int", lambda d: 5),
    ("float", lambda d: 1.5),
    ("bool", lambda d: True),
    ("None", lambda d: None),
    ("tuple", lambda d: ("value",)),
    *HOSTILE_TEXT,
]
EXECUTABLE: Values = [
    ("str", lambda d: str(SHOW)),
    ("pathlib.Path", lambda d: SHOW),
    ("os.PathLike", lambda d: PathLikeValue(str(SHOW))),
    ("bytes", lambda d: os.fsencode(SHOW)),
    ("int", lambda d: 5),
    ("None", lambda d: None),
    ("newline", lambda d: str(SHOW) + "\nx"),
    ("nul", lambda d: str(SHOW) + "\x00"),
    ("lone_surrogate", lambda d: str(SHOW) + "\ud800"),
    ("empty", lambda d: ""),
]
ARGUMENTS: Values = [
    ("list[str]", lambda d: ["x y", "z"]),
    ("list[pathlib.Path]", lambda d: [Path("rel/file"), Path("/abs/file")]),
    ("list[os.PathLike]", lambda d: [PathLikeValue("p1"), "z"]),
    ("list[str,pathlib.Path]", lambda d: ["x", Path("rel/file")]),
    ("tuple", lambda d: ("x", "z")),
    ("generator", lambda d: gen("x", "z")),
    ("list[bytes]", lambda d: [b"x"]),
    ("list[int]", lambda d: [5]),
    ("list[float]", lambda d: [1.5]),
    ("list[bool]", lambda d: [True]),
    ("list[None]", lambda d: [None]),
    ("list[nan]", lambda d: [math.nan]),
    ("str", lambda d: "x z"),
    ("None", lambda d: None),
    ("empty_list", lambda d: []),
    ("set", lambda d: {"x"}),
    ("dict", lambda d: {"x": "z"}),
    ("list[newline]", lambda d: ["a\nb"]),
    ("list[nul]", lambda d: ["a\x00b"]),
    ("list[lone_surrogate]", lambda d: ["a\ud800b"]),
    ("list[shell_meta]", lambda d: ["$(echo x) `y` 'q' \"d\" *"]),
]
APPENDED: Values = [  # items appended to ``spec.arguments = ["x"]`` after the assignment
    ("str", lambda d: "--rerun"),
    ("pathlib.Path", lambda d: Path("rel/file")),
    ("os.PathLike", lambda d: PathLikeValue("p1")),
    ("bytes", lambda d: b"x"),
    ("int", lambda d: 5),
    ("None", lambda d: None),
    ("nul", lambda d: "a\x00b"),
]


def _paths(name: str) -> Values:
    return [
        ("str", lambda d: str(d / name)),
        ("pathlib.Path", lambda d: d / name),
        ("os.PathLike", lambda d: PathLikeValue(str(d / name))),
        ("bytes", lambda d: os.fsencode(d / name)),
        ("int", lambda d: 5),
        ("None", lambda d: None),
        ("tuple", lambda d: (str(d / name),)),
        ("empty", lambda d: ""),
        ("newline", lambda d: str(d / (name + "\nx"))),
        ("nul", lambda d: str(d / name) + "\x00"),
        ("lone_surrogate", lambda d: str(d / (name + "\ud800"))),
    ]


ENVIRONMENT: Values = [
    ("dict[str]", lambda d: {"N": "x y"}),
    ("dict[int]", lambda d: {"N": 4}),
    ("dict[bool]", lambda d: {"N": True}),
    ("dict[float]", lambda d: {"N": 1.5}),
    ("dict[nan]", lambda d: {"N": math.nan}),
    ("dict[huge int]", lambda d: {"N": 10 ** 30}),
    ("dict[negative int]", lambda d: {"N": -3}),
    ("dict[pathlib.Path]", lambda d: {"N": Path("/x/y")}),
    ("dict[os.PathLike]", lambda d: {"N": PathLikeValue("/x/y")}),
    ("dict[bytes]", lambda d: {"N": b"x"}),
    ("dict[None]", lambda d: {"N": None}),
    ("dict[tuple]", lambda d: {"N": ("x",)}),
    ("dict[int key]", lambda d: {1: "x"}),
    ("dict[newline]", lambda d: {"N": "a\nb"}),
    ("dict[nul]", lambda d: {"N": "a\x00b"}),
    ("dict[lone_surrogate]", lambda d: {"N": "a\ud800b"}),
    ("dict[shell_meta]", lambda d: {"N": "$(echo x) `y` 'q'"}),
    ("list of pairs", lambda d: [("N", "x")]),
    ("None", lambda d: None),
]
BOOL: Values = [
    ("True", lambda d: True), ("False", lambda d: False), ("int 1", lambda d: 1),
    ("int 0", lambda d: 0), ("str", lambda d: "yes"), ("None", lambda d: None),
]
COUNT: Values = [
    ("int", lambda d: 2), ("int 1", lambda d: 1), ("zero", lambda d: 0), ("negative", lambda d: -1),
    ("float", lambda d: 2.0), ("bool", lambda d: True), ("str", lambda d: "2"),
    ("None", lambda d: None), ("nan", lambda d: math.nan), ("inf", lambda d: math.inf),
    ("huge", lambda d: 10 ** 30),
]
DURATION: Values = [
    ("timedelta", lambda d: timedelta(minutes=5)), ("int", lambda d: 300),
    ("float", lambda d: 300.5), ("str 10m", lambda d: "10m"), ("str hh:mm:ss", lambda d: "1:00:00"),
    ("str digits", lambda d: "90"), ("None", lambda d: None), ("bool", lambda d: True),
    ("negative", lambda d: -1), ("negative timedelta", lambda d: timedelta(seconds=-1)),
    ("nan", lambda d: math.nan), ("inf", lambda d: math.inf), ("huge", lambda d: 1e300),
    ("timedelta.max", lambda d: timedelta.max),
]
CUSTOM: Values = [
    ("dict[str]", lambda d: {"slurm.qos": "x y"}), ("dict[int]", lambda d: {"slurm.qos": 5}),
    ("dict[float]", lambda d: {"slurm.qos": 1.5}), ("dict[bool]", lambda d: {"slurm.qos": True}),
    ("dict[None]", lambda d: {"slurm.qos": None}),
    ("dict[pathlib.Path]", lambda d: {"slurm.qos": Path("/x")}),
    ("dict[nan]", lambda d: {"slurm.qos": math.nan}),
    ("dict[newline]", lambda d: {"slurm.qos": "a\nb"}),
    ("dict[nul]", lambda d: {"slurm.qos": "a\x00b"}),
    ("dict[shell_meta]", lambda d: {"slurm.qos": "x\" --wrap='id'"}),
    ("dict[no prefix]", lambda d: {"ATTR1": "x"}), ("dict[int key]", lambda d: {1: "x"}),
    ("list of pairs", lambda d: [("slurm.qos", "x")]), ("None", lambda d: None),
]
SECONDS: Values = [
    ("int", lambda d: 5), ("float", lambda d: 0.5), ("zero", lambda d: 0),
    ("negative", lambda d: -1), ("nan", lambda d: math.nan), ("inf", lambda d: math.inf),
    ("bool", lambda d: True), ("str", lambda d: "5"), ("timedelta", lambda d: timedelta(seconds=5)),
    ("None", lambda d: None),
]
CONFIG_PATHS: Values = [
    ("str", lambda d: str(d / "w")), ("pathlib.Path", lambda d: d / "w"),
    ("os.PathLike", lambda d: PathLikeValue(str(d / "w"))), ("bytes", lambda d: os.fsencode(d)),
    ("int", lambda d: 5), ("None", lambda d: None), ("nul", lambda d: str(d) + "\x00"),
]


def _resources(d: Path) -> Any:
    return ResourceSpecV1(node_count=1)


OBJECTS: Dict[str, Values] = {
    "resources": [("ResourceSpecV1", _resources), ("None", lambda d: None),
                  ("dict", lambda d: {"node_count": 1}),
                  ("JobAttributes", lambda d: JobAttributes())],
    "attributes": [("JobAttributes", lambda d: JobAttributes(queue_name="q")),
                   ("None", lambda d: None), ("dict", lambda d: {"queue_name": "q"}),
                   ("ResourceSpecV1", _resources)],
}

# Fields that change what runs: their accepted values are run on local and by the Slurm script.
RUN_FIELDS = {"executable", "arguments", "directory", "environment", "inherit_environment",
              "stdin_path", "stdout_path", "stderr_path", "pre_launch", "post_launch"}


def matrix() -> List[Tuple[str, str, Values]]:
    """(class, field, values) for every public field of the 0.9.11 model and configurations."""
    rows: List[Tuple[str, str, Values]] = [
        ("JobSpec", "executable", EXECUTABLE), ("JobSpec", "arguments", ARGUMENTS),
        ("JobSpec", "directory", _paths("dir")), ("JobSpec", "name", TEXT),
        ("JobSpec", "inherit_environment", BOOL), ("JobSpec", "environment", ENVIRONMENT),
        ("JobSpec", "stdin_path", _paths("stdin.txt")),
        ("JobSpec", "stdout_path", _paths("out.txt")),
        ("JobSpec", "stderr_path", _paths("err.txt")),
        ("JobSpec", "resources", OBJECTS["resources"]),
        ("JobSpec", "attributes", OBJECTS["attributes"]),
        ("JobSpec", "pre_launch", _paths("pre.sh")), ("JobSpec", "post_launch", _paths("pre.sh")),
        ("JobSpec", "launcher", [("str", lambda d: "single"), *TEXT[1:]]),
        ("JobAttributes", "duration", DURATION),
        *[("JobAttributes", f, TEXT) for f in ("queue_name", "account", "reservation_id",
                                               "project_name")],
        ("JobAttributes", "custom_attributes", CUSTOM),
        *[("ResourceSpecV1", f, COUNT) for f in ("node_count", "process_count",
                                                 "processes_per_node", "cpu_cores_per_process",
                                                 "gpu_cores_per_process")],
        ("ResourceSpecV1", "exclusive_node_use", BOOL),
        ("ResourceSpecV1", "memory", [("int", lambda d: 1 << 30), *COUNT[2:]]),
        ("Job", "spec", [("JobSpec", lambda d: JobSpec(str(SHOW))), ("None", lambda d: None),
                         ("dict", lambda d: {"executable": "x"}), ("str", lambda d: "x")]),
    ]
    for cls in ("JobExecutorConfig", "BatchSchedulerExecutorConfig", "SlurmExecutorConfig"):
        rows += [(cls, "launcher_log_file", CONFIG_PATHS), (cls, "work_directory", CONFIG_PATHS)]
    for cls in ("BatchSchedulerExecutorConfig", "SlurmExecutorConfig"):
        rows += [(cls, "queue_polling_interval", SECONDS),
                 (cls, "initial_queue_polling_delay", SECONDS),
                 (cls, "queue_polling_error_threshold",
                  [v for v in SECONDS if v[0] != "timedelta"]),
                 (cls, "keep_files", BOOL)]
    return rows


def _config_class(name: str) -> Any:
    if name == "JobExecutorConfig":
        return JobExecutorConfig
    from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig
    if name == "BatchSchedulerExecutorConfig":
        return BatchSchedulerExecutorConfig
    from psij.executors.batch.slurm import SlurmExecutorConfig
    return SlurmExecutorConfig


def _error(ex: BaseException) -> str:
    return f"{type(ex).__name__}: {ex}"[:300]


def _base_spec(d: Path) -> Dict[str, Any]:
    return {"executable": str(SHOW), "arguments": ["x"], "directory": str(d),
            "stdout_path": str(d / "out.txt"), "stderr_path": str(d / "err.txt")}


def _build(cls: str, field: str, way: str, value: Any, d: Path) -> Any:
    """The object with ``value`` set in ``field``, in ``way``; raises what the setting raises."""
    if cls == "JobSpec":
        kwargs = _base_spec(d)
        if way == "ctor":
            kwargs[field] = value
            return JobSpec(**kwargs)
        spec = JobSpec(**kwargs)
        if way == "append":
            spec.arguments = ["x"]
            assert spec.arguments is not None
            spec.arguments.append(value)
        else:
            setattr(spec, field, value)
        return spec
    if cls == "JobAttributes":
        if way == "ctor":
            return JobAttributes(**{field: value})
        attrs = JobAttributes()
        setattr(attrs, field, value)
        return attrs
    if cls == "ResourceSpecV1":
        if way == "ctor":
            return ResourceSpecV1(**{field: value})
        res = ResourceSpecV1()
        setattr(res, field, value)
        return res
    if cls == "Job":
        if way == "ctor":
            return Job(value)
        job = Job()
        job.spec = value
        return job
    config = _config_class(cls)
    if way == "ctor":
        return config(**{field: value})
    made = config()
    setattr(made, field, value)
    return made


def _stored(obj: Any, cls: str, field: str) -> Any:
    got = getattr(obj, field, None)
    if isinstance(got, (list, tuple)):
        return [repr(i) for i in got]
    if isinstance(got, dict):
        return {repr(k): repr(v) for k, v in got.items()}
    return repr(got)


def _spec_of(cls: str, obj: Any, d: Path) -> Optional[JobSpec]:
    """A job spec carrying the object built, to render (and for JobSpec fields, to run)."""
    base = _base_spec(d)
    if cls == "JobSpec":
        spec: JobSpec = obj
        return spec
    if cls == "JobAttributes":
        return JobSpec(attributes=obj, **base)
    if cls == "ResourceSpecV1":
        return JobSpec(resources=obj, **base)
    if cls == "Job":
        return obj.spec  # type: ignore[no-any-return]
    return None


def _slurm_executor(work: Path) -> Any:
    from psij.executors.batch.slurm import SlurmExecutorConfig
    return JobExecutor.get_instance("slurm", config=SlurmExecutorConfig(work_directory=work))


def _render(executor: Any, job: Job) -> str:
    if IMPL == "reference":
        out = io.StringIO()
        executor.generate_submit_script(job, executor._create_script_context(job), out)
        return out.getvalue()
    return str(executor.submit_script(job))


def _directives(script: str, raw: bool = False) -> Dict[str, str]:
    """``#SBATCH --option=value`` lines as option -> value, the value as sbatch reads it
    (one pair of surrounding double quotes removed)."""
    found: Dict[str, str] = {}
    for line in script.splitlines():
        if not line.startswith("#SBATCH --"):
            continue
        option, _, value = line[len("#SBATCH --"):].partition("=")
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        if option in ("job-name", "output", "error", "export"):
            continue  # psij's own choices, not the field's
        found[option] = value if raw else value.replace(str(WORK), "WORK")
    return found


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text(errors="replace")[:400].replace(str(WORK), "WORK")
    except (OSError, ValueError) as ex:
        return f"<{type(ex).__name__}>"


def _out_file(spec: JobSpec, d: Path) -> Path:
    given = getattr(spec, "stdout_path", None)
    return Path(os.fspath(given)) if given is not None and not isinstance(given, bytes) \
        else d / "none"


Case = Tuple[str, str, str, Callable[[Path], Any], str]
Runs = List[Tuple[str, JobSpec, Path]]
Scripts = List[Tuple[str, Path, Path, Path]]


def _prepare(n: int) -> Path:
    d = WORK / f"c{n}"
    (d / "dir").mkdir(parents=True)
    (d / "pre.sh").write_text("export PRE=1\n")
    (d / "stdin.txt").write_text("IN\n")
    return d


def _case(case: Case, d: Path, slurm: Any, runs: Runs, scripts: Scripts) -> Dict[str, Any]:
    """Set one value; render the job of the accepted ones; queue the runs (in ``runs`` and
    ``scripts``, run together later)."""
    cls, field, kind, make, way = case
    cid = f"{cls}.{field}|{kind}|{way}"
    out: Dict[str, Any] = {}
    try:
        obj = _build(cls, field, way, make(d), d)
    except Exception as ex:
        out["refused"] = _error(ex)
        return out
    out["stored"] = _stored(obj, cls, "arguments" if way == "append" else field)
    try:
        spec = _spec_of(cls, obj, d)
    except Exception as ex:
        out["spec_error"] = _error(ex)
        return out
    if spec is None:
        return out
    runs_it = field in RUN_FIELDS or cls == "Job"
    try:
        text = _render(slurm, Job(spec))
        out["directives"] = _directives(text)
        if runs_it:
            script = d / "job.sbatch"
            script.write_text(text, errors="surrogateescape")
            # sbatch starts the script in its --chdir; bash alone would not.
            chdir = _directives(text, raw=True).get("chdir")
            cwd = Path(chdir) if chdir and Path(chdir).is_dir() else d
            scripts.append((cid, script, cwd, _out_file(spec, d)))
    except Exception as ex:
        out["render_error"] = _error(ex)
    if runs_it:
        runs.append((cid, spec, d))
    return out


def main() -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    SHOW.write_text('#!/bin/sh\nfor a; do printf "<%s>" "$a"; done\n'
                    'printf "\\nN=%s PRE=%s PWD=%s\\n" "${N-unset}" "${PRE-unset}" '
                    '"${PWD##*/}"\nif [ ! -t 0 ]; then head -c 40; fi\n')
    SHOW.chmod(0o700)
    fake = WORK / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "scontrol").write_text("#!/bin/sh\nhostname\n")
    (fake / "scontrol").chmod(0o700)
    slurm = _slurm_executor(WORK / "slurm-work")
    (WORK / "slurm-work" / "slurm").mkdir(parents=True, exist_ok=True)  # made at a real submit
    cases: List[Case] = [(cls, field, kind, make, way) for cls, field, values in matrix()
                         for kind, make in values for way in ("ctor", "assign")]
    cases += [("JobSpec", "arguments", kind, make, "append") for kind, make in APPENDED]
    results: Dict[str, Dict[str, Any]] = {}
    runs: Runs = []
    scripts: Scripts = []
    for n, case in enumerate(cases):
        cls, field, kind, _, way = case
        results[f"{cls}.{field}|{kind}|{way}"] = _case(case, _prepare(n), slurm, runs, scripts)
    # The scripts first: each output file is read and removed before the same spec runs locally.
    _run_scripts(scripts, results)
    _run_local(runs, results)
    json.dump(results, sys.stdout, sort_keys=True)


def _run_local(runs: Runs, results: Dict[str, Dict[str, Any]]) -> None:
    config = JobExecutorConfig(work_directory=WORK / "local-work")
    executor = JobExecutor.get_instance("local", config=config)
    for start in range(0, len(runs), 40):
        batch = []
        for cid, spec, d in runs[start:start + 40]:
            out_file = _out_file(spec, d)
            try:
                job = Job(spec)
                executor.submit(job)
            except Exception as ex:
                results[cid]["local"] = {"submit_error": _error(ex)}
                continue
            batch.append((cid, job, out_file))
        for cid, job, out_file in batch:
            status = job.wait(timedelta(seconds=60))
            results[cid]["local"] = {
                "state": str(status.state) if status else "timeout",
                "exit": status.exit_code if status else None,
                "out": _read(out_file)}


def _run_scripts(scripts: Scripts, results: Dict[str, Dict[str, Any]]) -> None:
    env = dict(os.environ, PATH=f"{WORK / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
               SLURM_JOB_NODELIST="localhost", SLURM_TASKS_PER_NODE="1")
    for start in range(0, len(scripts), 40):
        started = []
        for number, (cid, script, d, out_file) in enumerate(scripts[start:start + 40]):
            job_id = f"{start + number + 1000}"
            proc = subprocess.Popen(["bash", str(script)], cwd=str(d), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    env=dict(env, SLURM_JOB_ID=job_id))
            started.append((cid, proc, job_id, out_file))
        for cid, proc, job_id, out_file in started:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            codes = list((WORK / "slurm-work").rglob(f"{job_id}.ec"))
            text = _read(codes[0]) if codes else None
            # (ours writes the end time and the signal the script got after the status)
            exit_code = text.split()[0] if text and text.split() else None
            results[cid]["slurm_run"] = {
                "exit": int(exit_code) if exit_code and exit_code.isdigit() else None,
                "out": _read(out_file)}
            try:
                out_file.unlink()
            except (OSError, ValueError):
                pass


if __name__ == "__main__":
    main()
