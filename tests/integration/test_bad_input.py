"""Wrong input to every model constructor and setter fails clearly and changes nothing.

Each case names a class, a field, a bad value and the exception expected. The same case is run
through the constructor and through the setter; the message must name ``<Class>.<field>`` and,
for a type error, say what is expected; a failed assignment must leave the old value in place.
"""

from datetime import timedelta
from pathlib import Path

import pytest

from psij import (
    Descriptor,
    InvalidJobException,
    Job,
    JobAttributes,
    JobExecutorConfig,
    JobSpec,
    JobState,
    JobStatus,
    ResourceSpecV1,
)
from psij.staging import URI, StageIn, StageOut, StageOutFlags, StagingMode

NUL = "a\x00b"

# Class name -> (class, the arguments every construction needs).
CLASSES = {
    "JobSpec": (JobSpec, {}),
    "JobAttributes": (JobAttributes, {}),
    "ResourceSpecV1": (ResourceSpecV1, {}),
    "JobStatus": (JobStatus, {"state": JobState.QUEUED}),
    "JobExecutorConfig": (JobExecutorConfig, {}),
    "StageIn": (StageIn, {"source": "in", "target": "out"}),
    "StageOut": (StageOut, {"source": "in", "target": "out"}),
}

PATH_FIELDS = ["directory", "stdin_path", "stdout_path", "stderr_path", "pre_launch",
               "post_launch"]
COUNT_FIELDS = ["node_count", "process_count", "processes_per_node", "cpu_cores_per_process",
                "gpu_cores_per_process"]

# (class, field, bad value, exception)
CASES = [
    ("JobSpec", "executable", 1, TypeError),
    ("JobSpec", "executable", bytearray(b"/bin/true"), TypeError),
    ("JobSpec", "executable", "", ValueError),
    ("JobSpec", "executable", NUL, ValueError),
    ("JobSpec", "arguments", "ls -l", TypeError),
    ("JobSpec", "arguments", 5, TypeError),
    ("JobSpec", "arguments", [1], TypeError),
    ("JobSpec", "arguments", ["ok", None], TypeError),
    ("JobSpec", "arguments", [NUL], ValueError),
    ("JobSpec", "arguments", [bytearray(b"x")], TypeError),
    ("JobSpec", "arguments", {"a"}, TypeError),
    ("JobSpec", "arguments", {"a": "b"}, TypeError),
    ("JobSpec", "name", 3.5, TypeError),
    ("JobSpec", "name", True, TypeError),
    ("JobSpec", "name", NUL, ValueError),
    ("JobSpec", "inherit_environment", "yes", TypeError),
    ("JobSpec", "inherit_environment", 2, TypeError),
    ("JobSpec", "inherit_environment", None, TypeError),
    ("JobSpec", "environment", [("A", "1")], TypeError),
    ("JobSpec", "environment", "A=1", TypeError),
    ("JobSpec", "environment", {1: "x"}, TypeError),
    ("JobSpec", "environment", {"A": None}, TypeError),
    ("JobSpec", "environment", {"A": 1.5}, TypeError),
    ("JobSpec", "environment", {"A": ["x"]}, TypeError),
    ("JobSpec", "environment", {"": "x"}, ValueError),
    ("JobSpec", "environment", {"A=B": "x"}, ValueError),
    ("JobSpec", "environment", {NUL: "x"}, ValueError),
    ("JobSpec", "environment", {"A": NUL}, ValueError),
    ("JobSpec", "resources", {"node_count": 1}, TypeError),
    ("JobSpec", "resources", JobAttributes(), TypeError),
    ("JobSpec", "attributes", {"queue_name": "q"}, TypeError),
    ("JobSpec", "attributes", ResourceSpecV1(), TypeError),
    ("JobSpec", "launcher", 1, TypeError),
    ("JobSpec", "launcher", NUL, ValueError),
    ("JobSpec", "stage_in", "file.txt", TypeError),
    ("JobSpec", "stage_in", 5, TypeError),
    ("JobSpec", "stage_in", ["file.txt"], TypeError),
    ("JobSpec", "stage_in", [StageOut("a", "b")], TypeError),
    ("JobSpec", "stage_out", [StageIn("a", "b")], TypeError),
    ("JobSpec", "stage_out", StageOut("a", "b"), TypeError),
    ("JobSpec", "cleanup", "scratch", TypeError),
    ("JobSpec", "cleanup", Path("scratch"), TypeError),
    ("JobSpec", "cleanup", [1], TypeError),
    ("JobSpec", "cleanup", [None], TypeError),
    ("JobSpec", "cleanup", [""], ValueError),
    ("JobSpec", "cleanup", [NUL], ValueError),
    ("JobSpec", "cleanup_flags", None, TypeError),
    ("JobSpec", "cleanup_flags", 14, TypeError),
    ("JobSpec", "cleanup_flags", "ALWAYS", TypeError),
    *[("JobSpec", f, v, e) for f in PATH_FIELDS for v, e in [
        (1, TypeError), (b"x", TypeError), (["x"], TypeError), (NUL, ValueError),
        (Path(NUL), ValueError)]],
    # "" is the current directory as a directory (as in psij-python), no file otherwise.
    *[("JobSpec", f, "", ValueError) for f in PATH_FIELDS if f != "directory"],

    ("JobAttributes", "duration", -600, ValueError),
    ("JobAttributes", "duration", float("nan"), ValueError),
    ("JobAttributes", "duration", "00:10:xx", ValueError),
    ("JobAttributes", "duration", "soon", ValueError),
    ("JobAttributes", "duration", "99999999999999999h", ValueError),
    ("JobAttributes", "duration", b"10m", TypeError),
    ("JobAttributes", "duration", None, TypeError),
    ("JobAttributes", "duration", timedelta(seconds=-1), ValueError),
    *[("JobAttributes", f, v, e) for f in ("queue_name", "account", "reservation_id",
                                           "project_name")
      for v, e in [(1.5, TypeError), (False, TypeError), (["q"], TypeError),
                   (NUL, ValueError)]],
    ("JobAttributes", "custom_attributes", [("slurm.qos", "x")], TypeError),
    ("JobAttributes", "custom_attributes", {1: "x"}, TypeError),
    ("JobAttributes", "custom_attributes", {"slurm.qos": ["x"]}, TypeError),
    ("JobAttributes", "custom_attributes", {"slurm.qos": {"a": 1}}, TypeError),
    ("JobAttributes", "custom_attributes", {"slurm.qos": NUL}, ValueError),

    *[("ResourceSpecV1", f, v, e) for f in [*COUNT_FIELDS, "memory"] for v, e in [
        ("2", TypeError), (2.0, TypeError), (True, TypeError), (0, ValueError),
        (-3, ValueError)]],
    ("ResourceSpecV1", "exclusive_node_use", 2, TypeError),
    ("ResourceSpecV1", "exclusive_node_use", None, TypeError),
    ("ResourceSpecV1", "exclusive_node_use", "true", TypeError),

    ("JobStatus", "state", "ACTIVE", TypeError),
    ("JobStatus", "state", None, TypeError),
    ("JobStatus", "state", 2, TypeError),
    ("JobStatus", "time", "now", TypeError),
    ("JobStatus", "time", True, TypeError),
    ("JobStatus", "message", 42, TypeError),
    ("JobStatus", "message", b"bytes", TypeError),
    ("JobStatus", "exit_code", "0", TypeError),
    ("JobStatus", "exit_code", 1.0, TypeError),
    ("JobStatus", "exit_code", False, TypeError),
    ("JobStatus", "metadata", [("a", 1)], TypeError),
    ("JobStatus", "metadata", "reason", TypeError),

    *[("JobExecutorConfig", f, v, e) for f in ("launcher_log_file", "work_directory")
      for v, e in [(1, TypeError), (["/tmp"], TypeError), ("", ValueError), (NUL, ValueError)]],

    ("StageIn", "source", 1, TypeError),
    ("StageIn", "source", None, TypeError),
    ("StageIn", "source", "", ValueError),
    ("StageIn", "source", NUL, ValueError),
    ("StageIn", "source", "http://[broken", ValueError),
    ("StageIn", "target", 1, TypeError),
    ("StageIn", "target", None, TypeError),
    ("StageIn", "target", URI("file:///x"), TypeError),
    ("StageIn", "target", "", ValueError),
    ("StageIn", "target", NUL, ValueError),
    ("StageIn", "mode", "COPY", TypeError),
    ("StageIn", "mode", None, TypeError),
    ("StageIn", "mode", StageOutFlags.ALWAYS, TypeError),
    ("StageOut", "source", 1, TypeError),
    ("StageOut", "source", URI("file:///x"), TypeError),
    ("StageOut", "source", NUL, ValueError),
    ("StageOut", "target", 1.5, TypeError),
    ("StageOut", "target", "ab://host:port/x", ValueError),
    ("StageOut", "target", NUL, ValueError),
    ("StageOut", "flags", 14, TypeError),
    ("StageOut", "flags", None, TypeError),
    ("StageOut", "flags", StagingMode.COPY, TypeError),
    ("StageOut", "mode", 1, TypeError),
]


def _case_id(case):
    cls, field, value, _ = case
    return f"{cls}.{field}={value!r}"


def _check_message(excinfo, cls_name, field, exc):
    message = str(excinfo.value)
    assert f"{cls_name}.{field}" in message
    if exc is TypeError:
        assert "expected" in message or "must be" in message


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_constructor(case):
    cls_name, field, value, exc = case
    cls, required = CLASSES[cls_name]
    with pytest.raises(exc) as info:
        cls(**dict(required, **{field: value}))
    _check_message(info, cls_name, field, exc)


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_setter(case):
    cls_name, field, value, exc = case
    cls, required = CLASSES[cls_name]
    obj = cls(**required)
    before = getattr(obj, field)
    with pytest.raises(exc) as info:
        setattr(obj, field, value)
    _check_message(info, cls_name, field, exc)
    assert getattr(obj, field) == before


def test_every_field_of_every_class_has_a_case():
    import inspect

    covered = {(c, f) for c, f, _, _ in CASES}
    for name, (cls, _) in CLASSES.items():
        for param in inspect.signature(cls.__init__).parameters:
            if param != "self":
                assert (name, param) in covered, f"{name}.{param}"


# ---- cases that do not fit the table -------------------------------------------------------

def test_good_values_are_accepted_by_every_setter():
    # The table only shows something if the same fields accept good values.
    s = JobSpec()
    s.executable = "/bin/echo"
    s.arguments = ("a", "b")
    s.directory = "/tmp"
    s.environment = {"A": 1}
    s.cleanup = {"x"}
    s.stage_in = {StageIn("a", "b")}
    assert s.arguments == ["a", "b"] and s.environment == {"A": "1"}
    assert s.cleanup == [Path("x")]
    st = JobStatus(JobState.ACTIVE, time=5, message="m", exit_code=-9, metadata={"k": 1})
    assert st.time == 5.0 and isinstance(st.time, float)
    st.exit_code = None
    config = JobExecutorConfig(work_directory="/w")
    config.launcher_log_file = "/log"
    assert config.launcher_log_file == Path("/log") and config.work_directory == Path("/w")
    out = StageOut("a", "b")
    out.target = "file:///results/b"
    assert out.target == URI("file:///results/b")


def test_config_work_directory_cannot_be_unset():
    config = JobExecutorConfig()
    assert config.work_directory == Path.home() / ".psij" / "work"
    with pytest.raises(TypeError, match=r"JobExecutorConfig\.work_directory"):
        config.work_directory = None
    assert config.work_directory == Path.home() / ".psij" / "work"


def test_project_name_setter_names_itself():
    a = JobAttributes(account="acc")
    with pytest.raises(TypeError, match=r"JobAttributes\.project_name"):
        a.project_name = 5.5  # type: ignore[assignment]
    assert a.account == "acc"


@pytest.mark.parametrize(("name", "value", "exc"), [
    (1, "x", TypeError),
    (None, "x", TypeError),
    ("slurm.qos", object(), TypeError),
    ("slurm.qos", NUL, ValueError),
])
def test_set_custom_attribute(name, value, exc):
    a = JobAttributes(custom_attributes={"slurm.qos": "keep"})
    with pytest.raises(exc, match=r"JobAttributes\.custom_attributes"):
        a.set_custom_attribute(name, value)
    assert a.custom_attributes == {"slurm.qos": "keep"}


@pytest.mark.parametrize("value", ["spec", 1, JobAttributes()])
def test_job_spec(value):
    with pytest.raises(TypeError, match=r"Job\.spec.*expected"):
        Job(value)
    j = Job(JobSpec(executable="x"))
    with pytest.raises(TypeError, match=r"Job\.spec.*expected"):
        j.spec = value
    assert j.spec == JobSpec(executable="x")


@pytest.mark.parametrize(("value", "exc"), [
    (1, TypeError), (None, TypeError), ("", ValueError), (NUL, ValueError),
    ("http://[::1", ValueError), ("ab://host:99999/x", ValueError)])
def test_uri(value, exc):
    with pytest.raises(exc, match="URI"):
        URI(value)


DESCRIPTOR_ARGS = {"name": "x", "version": "1.0", "cls": "pkg.mod.Cls"}


@pytest.mark.parametrize(("field", "value", "exc"), [
    ("name", "", TypeError),
    ("name", 1, TypeError),
    ("version", 1.0, TypeError),
    ("version", None, TypeError),
    ("version", "not a version", ValueError),
    ("cls", "Cls", TypeError),
    ("cls", None, TypeError),
    ("aliases", "alias", TypeError),
    ("aliases", 5, TypeError),
    ("aliases", [1], TypeError),
    ("aliases", [""], TypeError),
    ("nice_name", 1, TypeError),
])
def test_descriptor(field, value, exc):
    with pytest.raises(exc, match=rf"Descriptor\.{field}"):
        Descriptor(**dict(DESCRIPTOR_ARGS, **{field: value}))


def test_descriptor_accepts_good_values():
    from packaging.version import Version

    d = Descriptor("x", Version("1.2"), "pkg.mod.Cls", aliases=("y",), nice_name="X")
    assert d.version == Version("1.2") and d.aliases == ["y"] and d.nice_name == "X"


@pytest.mark.parametrize("kwargs", [
    dict(node_count=2, process_count=3, processes_per_node=2),
    dict(node_count=4, process_count=6),
    dict(node_count=2, process_count=2, processes_per_node=2),
])
def test_inconsistent_resources(kwargs):
    with pytest.raises(InvalidJobException, match=r"ResourceSpecV1.*process_count"):
        ResourceSpecV1(**kwargs)


@pytest.mark.parametrize(("field", "value"), [
    ("process_count", 5), ("node_count", 3), ("processes_per_node", 3)])
def test_inconsistent_resource_setter_keeps_previous_value(field, value):
    r = ResourceSpecV1(node_count=2, process_count=4, processes_per_node=2)
    with pytest.raises(InvalidJobException, match="ResourceSpecV1"):
        setattr(r, field, value)
    assert (r.node_count, r.process_count, r.processes_per_node) == (2, 4, 2)
