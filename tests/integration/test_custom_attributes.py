"""Custom attributes as psij-python code uses them: any str key, the caller's dict kept (so a key
added after construction reaches the submit script), each batch executor rendering only its own
prefix, unsafe options refused at submit, and keys like ``ATTR1`` surviving serialization.
"""

import io
import secrets
import warnings
from pathlib import Path
from typing import Dict, List

import pytest

import psij
from psij import (
    InvalidJobException,
    Job,
    JobAttributes,
    JobExecutor,
    JobExecutorConfig,
    JobSpec,
    JobState,
)
from psij.executors.batch.batch_scheduler_executor import (
    BatchSchedulerExecutor,
    BatchSchedulerExecutorConfig,
)
from psij.serialize import JSONSerializer

# How each batch executor spells the option ``<prefix>.cust_attr1 = "val-1"``.
DIRECTIVES: Dict[str, str] = {
    "slurm": '#SBATCH --cust_attr1="val-1"',
    "batch-test": '#BATCH_TEST --cust_attr1="val-1"',
    "sge": "#$ -cust_attr1 val-1",
    "pbs": "#PBS -cust_attr1 val-1",
    "pbs_classic": "#PBS -cust_attr1 val-1",
    "lsf": '#BSUB -cust_attr1 "val-1"',
    "cobalt": "#COBALT --cust_attr1=val-1",
    "flux": '# flux: --cust_attr1="val-1"',
}


def prefix_of(name: str) -> str:
    return "pbs" if name.startswith("pbs") else name


def executor(name: str, tmp_path: Path) -> BatchSchedulerExecutor:
    ex = JobExecutor.get_instance(name, config=BatchSchedulerExecutorConfig(
        work_directory=tmp_path / "work"))
    assert isinstance(ex, BatchSchedulerExecutor)
    return ex


def directive_lines(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.startswith("#"))


def test_the_dict_given_is_the_dict_held() -> None:
    d: Dict[str, object] = {"slurm.qos": "debug"}
    attrs = JobAttributes(custom_attributes=d)
    assert attrs.custom_attributes is d
    d["ATTR1"] = "later"
    assert attrs.get_custom_attribute("ATTR1") == "later"
    attrs.set_custom_attribute("slurm.comment", "set")
    assert d["slurm.comment"] == "set"
    other: Dict[str, object] = {}
    attrs.custom_attributes = other
    assert attrs.custom_attributes is other


@pytest.mark.parametrize("key", ["ATTR1", "attr.with.dots", "slurm", "slurm.", "", " x y ",
                                 "\ud800", "a\nb", "pbs.Two Words"])
def test_any_str_key_is_accepted(key: str) -> None:
    attrs = JobAttributes(custom_attributes={key: "v"})
    assert attrs.get_custom_attribute(key) == "v"
    attrs.set_custom_attribute(key, 2)
    assert attrs.custom_attributes == {key: 2}


@pytest.mark.parametrize("key", [1, None, b"slurm.qos", ("slurm", "qos")])
def test_keys_must_be_str(key: object) -> None:
    with pytest.raises(TypeError, match=r"JobAttributes\.custom_attributes key"):
        JobAttributes(custom_attributes={key: "v"})  # type: ignore[dict-item]
    attrs = JobAttributes()
    with pytest.raises(TypeError, match=r"JobAttributes\.custom_attributes key"):
        attrs.set_custom_attribute(key, "v")  # type: ignore[arg-type]
    assert attrs.custom_attributes is None


@pytest.mark.parametrize("name", sorted(DIRECTIVES))
def test_key_added_after_construction_reaches_the_script(name: str, tmp_path: Path) -> None:
    d: Dict[str, object] = {}
    attrs = JobAttributes(custom_attributes=d)
    d[f"{prefix_of(name)}.cust_attr1"] = "val-1"
    d["ATTR1"] = "not for any scheduler"
    d["other.cust_attr2"] = "x"
    text = directive_lines(executor(name, tmp_path).submit_script(
        Job(JobSpec("/bin/true", attributes=attrs))))
    assert DIRECTIVES[name] in text.splitlines()
    assert "ATTR1" not in text and "scheduler" not in text and "cust_attr2" not in text


@pytest.mark.parametrize("name", sorted(DIRECTIVES))
@pytest.mark.parametrize("option, value, message", [
    ("bad option", "v", "not a valid .* option name"),
    ("", "v", "not a valid .* option name"),
    ("x", "two\nlines", "newline"),
    ("x", ["a", "list"], "str, int, float or bool"),
    ("x", "nul\x00", "NUL"),
])
def test_unsafe_option_added_later_is_refused_at_submit(name: str, option: str, value: object,
                                                        message: str, tmp_path: Path) -> None:
    d: Dict[object, object] = {}
    attrs = JobAttributes(custom_attributes=d)  # type: ignore[arg-type]
    key = f"{prefix_of(name)}.{option}"
    d[key] = value
    ex = executor(name, tmp_path)
    job = Job(JobSpec("/bin/true", attributes=attrs))
    with pytest.raises(InvalidJobException, match=message) as info:
        ex.submit(job)
    assert repr(key) in str(info.value)
    assert job.executor is None and job.status.state is JobState.NEW
    assert not list((tmp_path / "work").rglob("*.job"))


def test_keys_an_executor_does_not_render_are_never_checked_by_it(tmp_path: Path) -> None:
    d: Dict[object, object] = {"ATTR1": "two\nlines", "pbs.bad option": [1], 7: "int key"}
    attrs = JobAttributes(custom_attributes={})
    attrs.custom_attributes.update(d)  # type: ignore[union-attr]
    text = executor("slurm", tmp_path).submit_script(Job(JobSpec("/bin/true", attributes=attrs)))
    assert "two" not in text and "int key" not in text


SER = JSONSerializer()


def test_serialization_round_trips_keys_without_a_prefix() -> None:
    custom: Dict[str, object] = {"ATTR1": "v1", "ATTR2": 2, "slurm.qos": "debug", "x": None,
                                 "odd key \ud800": True}
    spec = JobSpec("/bin/true", attributes=JobAttributes(custom_attributes=custom))
    back = SER.loads(SER.dumps(spec))
    assert back.attributes.custom_attributes == custom
    assert back == spec


def test_serializer_checks_values_added_after_construction() -> None:
    d: Dict[object, object] = {}
    spec = JobSpec("/bin/true", attributes=JobAttributes(
        custom_attributes=d))  # type: ignore[arg-type]
    d["ATTR1"] = object()
    with pytest.raises(TypeError, match=r"custom_attributes\['ATTR1'\]"):
        SER.dumps(spec)
    d.clear()
    d[3] = "x"
    with pytest.raises(TypeError, match=r"custom_attributes key"):
        SER.dumps(spec)


def test_job_serialized_by_psij_python_with_keys_without_a_prefix(tmp_path: Path) -> None:
    # The form psij-python 0.9.11 writes: every non-default constructor argument, the name
    # filled in from the executable, durations as "<seconds> s", project_name for the account.
    doc = ('{"name": "/bin/date", "executable": "/bin/date", "attributes": {"duration": '
           '"1200.0 s", "project_name": "proj", "custom_attributes": {"ATTR1": "v1", '
           '"ATTR2": "2", "slurm.qos": "debug"}}}')
    spec = SER.loads(doc)
    assert spec.attributes.custom_attributes == {"ATTR1": "v1", "ATTR2": "2",
                                                 "slurm.qos": "debug"}
    assert spec.attributes.account == "proj"
    assert SER.loads(SER.dumps(spec)) == spec
    text = directive_lines(executor("slurm", tmp_path).submit_script(Job(spec)))
    assert '#SBATCH --qos="debug"' in text.splitlines()
    assert "ATTR" not in text


# -- the attributes psij itself reads: checked by every executor, read by kind from text -------

DECLARED_BAD = [("psij.priority", "abc", "expected a number"),
                ("psij.priority", float("nan"), "expected a finite number"),
                ("pilot.priority", True, "expected a number"),
                ("psij.tmp", "1073741824", "expected a whole number of bytes"),
                ("psij.tmp", -1, "expected a whole number of bytes"),
                ("pilot.time_limit", "60", "expected a number of seconds")]


@pytest.mark.parametrize("name", ["local", "batch-test", "slurm", "cobalt", "pilot"])
@pytest.mark.parametrize("key,value,text", DECLARED_BAD)
def test_a_declared_attribute_of_the_wrong_kind_is_refused_by_every_executor(
        name: str, key: str, value: object, text: str, tmp_path: Path) -> None:
    # Also by executors that do not use it (local without a pool, cobalt without use_nice):
    # a job one executor refuses is refused by all.
    config = (BatchSchedulerExecutorConfig if name not in ("local", "pilot")
              else JobExecutorConfig)(work_directory=tmp_path / "work")
    ex = JobExecutor.get_instance(name, config=config)
    custom: Dict[str, object] = {}
    job = Job(JobSpec("/bin/true", attributes=JobAttributes(custom_attributes=custom)))
    custom[key] = value  # added after construction, as psij-python code does
    try:
        with pytest.raises(InvalidJobException, match=f"custom attribute {key}: {text}"):
            ex.submit(job)
        assert job.status.state is JobState.NEW and job.executor is None
        if isinstance(ex, BatchSchedulerExecutor):
            with pytest.raises(InvalidJobException, match=f"custom attribute {key}"):
                ex.submit_script(job)
    finally:
        getattr(ex, "close", lambda: None)()


@pytest.mark.parametrize("text,value", [("1073741824", 1073741824), ("1e9", 1000000000),
                                        (" 0 ", 0)])
def test_the_command_line_reads_declared_attributes_by_their_kind(text: str,
                                                                  value: int) -> None:
    from psij.cli import build_attributes

    attrs = build_attributes([f"psij.tmp={text}", "psij.priority=-2.5", "slurm.qos=7"])
    assert attrs.custom_attributes == {"psij.tmp": value, "psij.priority": -2.5,
                                       "slurm.qos": "7"}  # an undeclared one stays text


@pytest.mark.parametrize("assignment,text", [
    ("psij.priority=abc", "psij.priority: expected a number, got 'abc'"),
    ("psij.priority=inf", "psij.priority: expected a finite number"),
    ("psij.tmp=1.5", "psij.tmp: expected a whole number of bytes"),
    ("psij.tmp=-1", "psij.tmp: expected a whole number of bytes"),
    ("pilot.time_limit=0", "pilot.time_limit: expected a number of seconds above 0")])
def test_the_command_line_refuses_declared_attributes_of_the_wrong_kind(
        assignment: str, text: str) -> None:
    from psij.cli import UsageError, build_attributes

    with pytest.raises(UsageError, match=text):
        build_attributes([assignment])


# ------------------------------------------- every name of an executor is a prefix (issue 21, 14)

def batch_names() -> List[str]:
    """Every name a batch executor is known by, aliases included, as psij-python's own
    script-generation test lists them (JobExecutor.get_executor_names())."""
    names = []
    for name in sorted(JobExecutor.get_executor_names()):
        try:
            ex = JobExecutor.get_instance(name)
        except Exception:
            continue
        if isinstance(ex, BatchSchedulerExecutor):
            names.append(name)
        ex.close()
    return names


def test_every_alias_is_listed() -> None:
    assert {"torque", "gridengine", "pbspro", "pbs_classic", "sge"} <= set(batch_names())


@pytest.mark.parametrize("name", batch_names())
def test_psij_python_script_generation_check_with_the_executor_name_as_prefix(
        name: str, tmp_path: Path) -> None:
    # psij-python's test_submit_script_generation, in its own terms: each value set on a bare
    # spec must appear in the script, and custom attributes are named after the executor
    # (with its map pbspro/pbs_classic -> pbs; both spellings are checked here).
    ex = executor(name, tmp_path)
    for prefix in sorted({name, {"pbspro": "pbs", "pbs_classic": "pbs"}.get(name, name)}):
        custom: Dict[str, object] = {}
        attrs = JobAttributes(custom_attributes=custom)
        spec = JobSpec(resources=psij.ResourceSpecV1(), attributes=attrs)
        spec.launcher = "single"
        job = Job(spec)
        for field, setter in [("executable", spec), ("directory", spec), ("queue_name", attrs),
                              ("account", attrs), ("reservation_id", attrs),
                              (f"{prefix}.cust_attr1", custom), (f"{prefix}.cust_attr2", custom)]:
            token = secrets.token_hex()
            if isinstance(setter, dict):
                setter[field] = token
            else:
                setattr(setter, field, token)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Flux: a reservation is not passed on
                out = io.StringIO()
                ex.generate_submit_script(job, ex._create_script_context(job), out)
            assert token in out.getvalue(), (name, prefix, field)


@pytest.mark.parametrize("name,alias,canonical", [("sge", "gridengine", "sge"),
                                                  ("pbs", "pbspro", "pbs"),
                                                  ("pbs_classic", "torque", "pbs"),
                                                  ("pbs_classic", "pbs_classic", "pbs")])
def test_aliases_render_whatever_name_the_executor_was_made_by(name: str, alias: str,
                                                               canonical: str,
                                                               tmp_path: Path) -> None:
    attrs = JobAttributes(custom_attributes={f"{alias}.cust_attr1": "val-1",
                                             "slurm.cust_attr2": "no"})
    text = directive_lines(executor(name, tmp_path).submit_script(
        Job(JobSpec("/bin/true", attributes=attrs))))
    assert DIRECTIVES[name] in text.splitlines() and "cust_attr2" not in text
    assert prefix_of(name) == canonical


class _PsijPythonStyleExecutor(BatchSchedulerExecutor):
    """An executor written for psij-python: it declares no custom attribute prefix and its
    template reads custom_attributes.<its prefix> itself."""

    TEMPLATE = Path(__file__).parent.parent / "plugins" / "reference_batch_test" / "attrs.mustache"


def test_an_executor_declaring_no_prefix_sees_every_prefix(tmp_path: Path) -> None:
    ex = _PsijPythonStyleExecutor(config=BatchSchedulerExecutorConfig(
        work_directory=tmp_path / "work"))
    attrs = JobAttributes(custom_attributes={"batch-test.MY_VAR": "v 1", "other.X": "2",
                                             "NO_PREFIX": "3"})
    text = ex.submit_script(Job(JobSpec("/bin/true", attributes=attrs)))
    assert 'export MY_VAR="v 1"' in text.splitlines()
    assert 'other X="2"' in text.splitlines()
