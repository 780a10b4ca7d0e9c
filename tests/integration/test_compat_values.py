"""The same values through psij-python 0.9.11 and through this package: what each accepts, what
the job then does on ``local`` and what its Slurm script asks for and does.

psij-python is installed once into a virtual environment of its own in the test cache
(``.test-cache/`` at the top of the repository, or ``$PSIJ_TEST_CACHE``), from the package
index pip uses; both packages are named ``psij``, so that environment never sees this
repository. ``tests/support/compat_values.py`` builds every case there and here (a field of
``JobSpec``, ``JobAttributes``, ``ResourceSpecV1``, ``Job`` or an executor configuration, a kind
of value, set in the constructor, by assignment, or appended to ``arguments``), submits the
accepted ones that change what runs to ``local``, renders their Slurm script and runs it with
bash, and prints one JSON object per implementation. The two are compared here case by case.

The rule (docs/compat.rst, "Field values"): what the reference accepts and runs correctly, this
package accepts and runs the same; what the reference accepts and then fails on or runs
wrongly, this package refuses, at the latest at submit, with a message naming the field. Every
difference between the two is one of ``DIFFERENCES``, each with its reason, and each is listed
in the documentation; a new difference, or one listed that no longer happens, fails the test.
Without a package index the test skips, saying so.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from support.reference_venv import REFERENCE, REFERENCE_REQUIREMENTS, side_venv

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "tests" / "support" / "compat_values.py"
DOCS = REPO / "docs" / "compat.rst"
# psij-python and the two packages whose behaviour shows in the matrix: typeguard checks its
# constructors (the first item of a list only, in 4.x), pystache renders its scripts.
REQUIREMENTS = REFERENCE_REQUIREMENTS

# The Slurm options that each field is rendered as (other directives are not the field's).
OPTIONS = {
    "node_count": {"nodes", "ntasks"}, "process_count": {"nodes", "ntasks"},
    "processes_per_node": {"ntasks", "ntasks-per-node"},
    "cpu_cores_per_process": {"cpus-per-task"}, "gpu_cores_per_process": {"gpus-per-task"},
    "memory": {"mem"}, "exclusive_node_use": {"exclusive"}, "duration": {"time"},
    "queue_name": {"partition"}, "account": {"account"}, "project_name": {"account"},
    "reservation_id": {"reservation"}, "custom_attributes": {"qos", "ATTR1"},
    "resources": {"nodes", "ntasks", "exclusive"}, "attributes": {"partition", "time"},
    "directory": {"chdir"}, "spec": {"time"},
}

# Every difference left on purpose: (name, field pattern, value kinds, ways, reason). A case
# differs when one implementation refuses what the other takes, or both take it and the job or
# its script differs. The name is the one docs/compat.rst lists.
DIFFERENCES: List[Tuple[str, str, str, str, str]] = [
    ("resources-assignment-applies", r"ResourceSpecV1\.(node_count|process_count|"
     r"processes_per_node)", r"int|huge", "assign",
     "a count assigned after construction takes effect; the reference computes the derived "
     "counts in its constructor, so its script keeps the old ones"),
    ("ntasks-per-node-derived", r"ResourceSpecV1\.processes_per_node", r"None", "ctor|assign",
     "without processes_per_node the script leaves --ntasks-per-node out and Slurm places "
     "the tasks; the reference writes the count it derived"),
    ("generator-once", r"JobSpec\.arguments", r"generator", "assign",
     "a generator is read once, when it is set; the reference keeps it and reads it at "
     "each use, so the second use (the run after the rendering) sees no arguments"),
    ("newline-in-output-path", r"JobSpec\.(stdout_path|stderr_path)", r"newline",
     "ctor|assign", "an output file name with a newline is written as named; the "
     "reference's launcher cannot open it and the job fails"),
    ("no-directory-default", r"JobSpec\.directory|Job\.spec", r"None|JobSpec|empty",
     "ctor|assign", "a job without a directory (or with \"\") is given the submitting "
     "process's directory in --chdir, written in full; the reference writes no --chdir or "
     "--chdir=\".\", which sbatch reads the same way"),
    ("liberal-path-like", r"JobSpec\.(executable|arguments|directory|std\w+_path|pre_launch|"
     r"post_launch|environment)", r"pathlib\.Path|os\.PathLike|list\[(str,)?(pathlib\.Path|"
     r"os\.PathLike)\]|dict\[(pathlib\.Path|os\.PathLike)\]|bytes|list\[bytes\]|tuple|generator",
     "ctor|assign|append", "path-like values are text everywhere (bytes too, for the "
     "executable and arguments); the reference's constructor refuses them (typeguard) and "
     "its assignment takes them, then renders a Path as an absolute path and other "
     "path-likes as their repr on Slurm, or fails in Popen (environment)"),
    ("liberal-duration", r"JobAttributes\.duration", r"int|float|str .*", "ctor|assign",
     "a number of seconds and walltime text are durations; the reference's constructor takes "
     "only a timedelta and its Slurm script cannot render anything else"),
    ("duration-rounding", r"JobAttributes\.duration", r"timedelta\.max", "ctor|assign",
     "durations are rounded up to whole seconds (the reference drops the fraction)"),
    ("liberal-names-and-flags", r"JobSpec\.(name|inherit_environment)|JobAttributes\.("
     r"queue_name|account|reservation_id|project_name)|ResourceSpecV1\.exclusive_node_use",
     r"int|int 0|int 1", "ctor",
     "a whole number is a name (5 is \"5\") and 0 and 1 are flags, in the constructor too; "
     "the reference's constructor refuses them (typeguard) and its assignment takes them and "
     "renders them the same way"),
    ("only-bool", r"JobSpec\.inherit_environment|ResourceSpecV1\.exclusive_node_use",
     r"int 0|int 1|str|None", "assign",
     "flags take a bool, 0 or 1 only; the reference tests the truth of anything, so \"no\" "
     "means yes"),
    ("only-text", r"JobSpec\.(name|launcher)|JobAttributes\.(queue_name|account|"
     r"reservation_id|project_name)", r"pathlib\.Path|os\.PathLike|bytes|int|float|bool|tuple",
     "assign", "names take text only; the reference renders str(value), which for bytes, "
     "tuples and path-likes is their repr"),
    ("arguments-not-a-list", r"JobSpec\.arguments", r"str|set|dict", "assign",
     "arguments take an ordered iterable of words; the reference iterates a string into its "
     "characters, a dict into its keys and a set in no set order"),
    ("counts-checked", r"ResourceSpecV1\.\w+", r"zero|negative|float|bool|str|nan|inf|None|int|"
     r"int 1|huge", "ctor|assign",
     "counts and memory are positive ints, checked on assignment too; the reference checks "
     "types in its constructor only, takes 0 and negative counts there and renders (or, "
     "after construction, ignores) whatever is assigned"),
    ("config-checked", r"\w*Config\.\w+", r".*", "ctor|assign",
     "executor settings are checked when set (paths, bools, finite positive intervals); the "
     "reference's configurations check nothing and fail or poll wrongly when used"),
    ("directive-quoting", r"JobAttributes\.(queue_name|account|reservation_id|project_name|"
     r"custom_attributes)", r"shell_meta|dict\[shell_meta\]|dict\[str\]", "ctor|assign",
     "directive values are escaped once for double quotes; the reference puts shell quotes "
     "inside the double quotes, so sbatch receives the quotes as part of the value"),
    ("custom-flags", r"JobAttributes\.custom_attributes", r"dict\[bool\]|dict\[None\]",
     "ctor|assign", "a custom attribute True is written as a flag (--qos) and None is left "
     "out; the reference writes --qos=\"True\" and --qos=\"None\""),
    ("custom-values-checked", r"JobAttributes\.custom_attributes", r"dict\[(pathlib\.Path|"
     r"newline|nul|int key)\]|list of pairs", "ctor|assign",
     "custom attribute keys are text and values text (without NUL), numbers or bools, checked "
     "on assignment; a newline is refused at submit"),
    ("attributes-none", r"JobSpec\.attributes", r"None", "assign",
     "attributes=None reads back as a default JobAttributes() (10 minutes), as the "
     "reference's constructor does; the reference's assignment keeps None and asks Slurm for "
     "no time limit"),
    ("object-fields-checked", r"JobSpec\.(resources|attributes)|Job\.spec",
     r"dict|str|JobAttributes|ResourceSpecV1", "ctor|assign",
     "object fields take their class only; the reference takes anything on assignment (and "
     "in Job's constructor) and fails when the job is rendered or run"),
    ("refused-before-it-fails", r"JobAttributes\.\w+|JobSpec\.\w+",
     r"nul|newline|lone_surrogate|list\[nul\]|dict\[(nul|newline|lone_surrogate|None|bytes|"
     r"float|nan|tuple|int key)\]|list\[(None|int|float|bool|nan)\]|empty|None|int|bool|"
     r"negative|negative timedelta|huge|nan|inf",
     "ctor|assign|append", "values that no process or script can carry (NUL, lone "
     "surrogates, newlines in directives or in file names a script reads, words that are not "
     "text, negative or unbounded durations, an empty executable or file name) are refused "
     "when set or at submit, naming the field; the reference takes them and fails or runs "
     "the job wrongly"),
]


def _reference_python() -> Path:
    """The interpreter of the side environment holding psij-python (made once)."""
    return side_venv(REFERENCE, REQUIREMENTS)


def _clean_env() -> Dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PSIJ_CONFIG")}


def _run_both(tmp_path: Path) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    reference = _reference_python()
    procs = {}
    for impl, python in (("ours", Path(sys.executable)), ("reference", reference)):
        work = tmp_path / impl
        env = _clean_env()
        if impl == "ours":
            env["PYTHONPATH"] = str(REPO / "src")
        # The side environment must import its own psij, never this repository's.
        procs[impl] = subprocess.Popen([str(python), "-I" if impl == "reference" else "-B",
                                        str(DRIVER), impl, str(work)], cwd=str(tmp_path),
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True, env=env)
    outs = {}
    for impl, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{impl}:\n{stderr[-3000:]}"
        outs[impl] = json.loads(stdout)
    return outs["ours"], outs["reference"]


def _seconds(text: str) -> int:
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    return int(days or 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def _unescape(value: str) -> str:
    """A directive value as bash reads it between double quotes."""
    return re.sub(r'\\([\\"$`])', r"\1", value)


def outcome(case: Dict[str, Any], field: str) -> Any:
    """What a case came to, in terms both implementations share."""
    if "refused" in case:
        return "refused"
    seen: Dict[str, Any] = {}
    if "render_error" in case:
        seen["slurm"] = "refused"
    elif "directives" in case:
        wanted = OPTIONS.get(field, {"chdir"})
        seen["directives"] = {k: (_seconds(v) if k == "time" else _unescape(v))
                              for k, v in case["directives"].items() if k in wanted}
    if "slurm_run" in case and "render_error" not in case:
        seen["slurm"] = case["slurm_run"]
    if "local" in case:
        local = case["local"]
        seen["local"] = "refused" if "submit_error" in local else {
            "exit": local["exit"], "out": local["out"]}
    return seen


def refused_by_ours(case: Dict[str, Any]) -> Optional[str]:
    """Ours' message where it refused the case (when set, at submit or when rendering)."""
    if "refused" in case:
        return str(case["refused"])
    local = case.get("local", {})
    if "submit_error" in local or "render_error" in case:
        return str(local.get("submit_error") or case.get("render_error"))
    return None


# The differences where this package refuses what the reference takes.
REFUSALS = {"only-bool", "only-text", "arguments-not-a-list", "counts-checked", "config-checked",
            "custom-values-checked", "object-fields-checked", "refused-before-it-fails"}


def reference_failed(case: Dict[str, Any]) -> bool:
    """Whether the reference, having taken the value, failed on it or ran the job in two ways
    (its local run and its Slurm script disagree)."""
    seen = outcome(case, "x")
    if not isinstance(seen, dict) or "local" not in seen:
        return True  # nothing run: judged by reading the script (see the reasons)
    local, slurm = seen["local"], seen.get("slurm")
    return local == "refused" or slurm == "refused" or local != slurm or local["exit"] != 0


def difference_of(cid: str) -> Optional[str]:
    name_field, kind, way = cid.split("|")
    for name, fields, kinds, ways, _ in DIFFERENCES:
        if (re.fullmatch(fields, name_field) and re.fullmatch(kinds, kind)
                and re.fullmatch(ways, way)):
            return name
    return None


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    return _run_both(tmp_path_factory.mktemp("compat"))


def test_every_difference_from_psij_python_is_one_left_on_purpose(both: Any) -> None:
    ours, reference = both
    assert set(ours) == set(reference) and len(ours) > 800
    unexplained, used = [], set()
    for cid in sorted(ours):
        field = cid.split("|")[0].split(".")[1]
        mine, theirs = outcome(ours[cid], field), outcome(reference[cid], field)
        if mine == theirs:
            continue
        name = difference_of(cid)
        if name in REFUSALS and refused_by_ours(ours[cid]) is None:
            name = None  # listed as refused here, but taken
        if name == "refused-before-it-fails" and not reference_failed(reference[cid]):
            name = None  # the reference runs it correctly: it must run here too
        if name is None:
            unexplained.append(f"{cid}\n  ours:      {mine}\n  reference: {theirs}")
        else:
            used.add(name)
    assert not unexplained, "\n".join(unexplained)
    assert used == {d[0] for d in DIFFERENCES}, "listed but not seen: " + ", ".join(
        sorted({d[0] for d in DIFFERENCES} - used))


def test_what_psij_python_runs_correctly_runs_the_same_here(both: Any) -> None:
    # The workflow engine's way: a bare JobSpec, then paths assigned, then an item appended.
    ours, reference = both
    for cid in ("JobSpec.arguments|list[pathlib.Path]|assign",
                "JobSpec.arguments|pathlib.Path|append", "JobSpec.arguments|str|append",
                "JobSpec.stdout_path|pathlib.Path|assign", "JobSpec.executable|pathlib.Path|assign",
                "JobSpec.environment|dict[int]|ctor", "JobSpec.environment|dict[bool]|assign",
                "JobSpec.arguments|tuple|assign", "JobSpec.directory|empty|ctor"):
        theirs = outcome(reference[cid], "x")
        assert theirs["local"]["exit"] == 0 and theirs["local"] == theirs["slurm"], cid
        mine = outcome(ours[cid], "x")
        assert (mine["local"], mine["slurm"]) == (theirs["local"], theirs["slurm"]), cid


def test_what_ours_refuses_names_the_field(both: Any) -> None:
    ours, _ = both
    for cid, case in ours.items():
        message = refused_by_ours(case)
        if message is None:
            continue
        cls, field = cid.split("|")[0].split(".")
        label = {"project_name": "JobAttributes.account"}.get(field, f".{field}")
        if cls.endswith("Config") and field in ("launcher_log_file", "work_directory"):
            label = f"JobExecutorConfig.{field}"
        assert label in message or f"{cls}.{field}" in message, (cid, message)


def test_ours_runs_alike_on_local_and_in_its_slurm_script(both: Any) -> None:
    ours, _ = both
    for cid, case in ours.items():
        seen = outcome(case, "x")
        if isinstance(seen, dict) and isinstance(seen.get("local"), dict) and "slurm" in seen:
            assert seen["slurm"] == seen["local"], cid


def test_the_documentation_lists_every_difference() -> None:
    text = DOCS.read_text()
    section = text[text.index("Field values"):]
    for name, *_ in DIFFERENCES:
        assert f"``{name}``" in section, name


class _PathLike:
    """An os.PathLike that is not a pathlib.Path."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __fspath__(self) -> str:
        return self.path


os.PathLike.register(_PathLike)


def test_staging_and_cleanup_take_path_like_values_as_the_development_line_does(
        tmp_path: Path) -> None:
    # Staging is in psij-python's development line only (no release to run beside this one):
    # there StageIn/StageOut take str, Path or URI sources and targets and check nothing.
    # Here any path-like is taken too, and a value no process can carry is refused when set.
    from psij import JobSpec
    from psij.staging import StageIn, StageOut

    given = _PathLike(str(tmp_path / "a b"))
    stage_in = StageIn(given, _PathLike("in.txt"))
    assert (stage_in.source.path, stage_in.target) == (str(tmp_path / "a b"), Path("in.txt"))
    stage_out = StageOut(Path("out.txt"), given)
    stage_out.source = _PathLike("other.txt")
    assert (stage_out.source, str(stage_out.target)) == (Path("other.txt"), str(tmp_path / "a b"))
    spec = JobSpec("/bin/true", cleanup=[_PathLike("scratch"), Path("tmp")])
    assert spec.cleanup == [Path("scratch"), Path("tmp")]
    for bad in (_PathLike("a\x00b"), b"in.txt", 5):
        with pytest.raises((TypeError, ValueError), match="StageIn.target"):
            StageIn("x", bad)
