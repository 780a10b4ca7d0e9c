"""JSONSerializer: every JobSpec survives a round trip; the written form is small and readable."""

import io
import json
import re
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from psij import JobAttributes, JobSpec, ResourceSpecV1
from psij.job_spec import FIELDS
from psij.serialize import JSONSerializer
from psij.staging import URI, StageIn, StageOut, StageOutFlags, StagingMode, normalize_flags

SER = JSONSerializer()

# ---- strategies ----------------------------------------------------------------------------

HOSTILE = ["'", '"', "\\", "$HOME", "`id`", "; echo foo", "\n", "\r\n", "\t", " ", "{{x}}",
           "%s", "\u2028", "\U0001f600", "\ud800", "\udfff", "é", "\x1b[31m", "\x7f", "*", "~"]

# Any character but NUL (which the model refuses), lone surrogates included.
chars = st.one_of(
    st.characters(exclude_characters="\x00"),
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
    st.sampled_from("'\"\\$`;|&<>(){}[]*?! \t\n\r=:"),
)
# JSON cannot tell a high+low surrogate pair from the character it encodes (see serialize.py).
_SURROGATE_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")
text = st.one_of(st.text(chars, max_size=20), st.sampled_from(HOSTILE),
                 st.lists(st.sampled_from(HOSTILE), min_size=1, max_size=4).map("".join)
                 ).filter(lambda s: not _SURROGATE_PAIR.search(s))
non_empty = text.filter(bool)
paths = non_empty.map(Path)
env_names = non_empty.filter(lambda k: "=" not in k)
small_ints = st.integers(min_value=1, max_value=2 ** 40)


def _uri(t):
    try:
        return URI(t)
    except ValueError:
        assume(False)


uris = st.one_of(non_empty.map(_uri), non_empty.map(lambda t: URI("file://host/" + t)),
                 paths.map(URI))
modes = st.sampled_from(list(StagingMode))
flags = st.integers(min_value=0, max_value=15).map(StageOutFlags)

custom_values = st.one_of(
    text, st.integers(min_value=-(2 ** 63), max_value=2 ** 63), st.booleans(), st.none(),
    st.floats(allow_nan=False, allow_infinity=False))
# Any str is a custom attribute key: "<executor>.<option>" or not ("ATTR1"), hostile included.
custom_names = st.one_of(
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,8}\.[A-Za-z0-9_][A-Za-z0-9_.-]{0,8}", fullmatch=True),
    text)

durations = st.one_of(
    st.timedeltas(min_value=timedelta(0)),
    st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=3)),
    st.integers(min_value=0, max_value=10 ** 6).map(lambda s: timedelta(seconds=s)),
)


@st.composite
def resources(draw):
    n = draw(st.none() | small_ints)
    ppn = draw(st.none() | small_ints)
    if n is not None and ppn is not None:
        p = draw(st.sampled_from([None, n * ppn]))
    elif n is not None:
        p = draw(st.none() | small_ints.map(lambda k: k * n))
    elif ppn is not None:
        p = draw(st.none() | small_ints.map(lambda k: k * ppn))
    else:
        p = draw(st.none() | small_ints)
    return ResourceSpecV1(
        node_count=n, process_count=p, processes_per_node=ppn,
        cpu_cores_per_process=draw(st.none() | small_ints),
        gpu_cores_per_process=draw(st.none() | small_ints),
        exclusive_node_use=draw(st.booleans()),
        memory=draw(st.none() | st.integers(min_value=1, max_value=2 ** 62)))


attributes = st.builds(
    JobAttributes,
    duration=durations,
    queue_name=st.none() | text,
    account=st.none() | text,
    reservation_id=st.none() | text,
    custom_attributes=st.none() | st.dictionaries(custom_names, custom_values, max_size=4),
)

stage_ins = st.builds(StageIn, uris, paths, modes)
stage_outs = st.builds(StageOut, paths, uris, flags, modes)

specs = st.builds(
    JobSpec,
    executable=st.none() | non_empty,
    arguments=st.none() | st.lists(text, max_size=5),
    directory=st.none() | paths,
    name=st.none() | text,
    inherit_environment=st.booleans(),
    environment=st.none() | st.dictionaries(env_names, text | st.integers(), max_size=4),
    stdin_path=st.none() | paths,
    stdout_path=st.none() | paths,
    stderr_path=st.none() | paths,
    resources=st.none() | resources(),
    attributes=st.none() | attributes,
    pre_launch=st.none() | paths,
    post_launch=st.none() | paths,
    launcher=st.none() | text,
    stage_in=st.none() | st.lists(stage_ins, max_size=3),
    stage_out=st.none() | st.lists(stage_outs, max_size=3),
    cleanup=st.none() | st.lists(paths, max_size=3),
    cleanup_flags=flags,
)


def _strict_json(s):
    def refuse(name):
        raise AssertionError(f"non-standard JSON constant {name}")
    return json.loads(s, parse_constant=refuse)


# ---- properties ----------------------------------------------------------------------------

@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs)
def test_round_trip(spec):
    text_form = SER.dumps(spec)
    back = SER.loads(text_form)
    assert back == spec
    assert back._explicit_name() == spec._explicit_name()
    assert back.attributes.duration == spec.attributes.duration
    # Written form: strict, ASCII JSON whose keys are constructor parameter names.
    assert text_form.isascii()
    doc = _strict_json(text_form)
    assert set(doc) <= set(FIELDS)
    assert SER.dumps(back) == text_form


@settings(max_examples=300, deadline=None)
@given(durations)
def test_duration_round_trip_is_exact(d):
    spec = JobSpec(attributes=JobAttributes(duration=d))
    assert SER.loads(SER.dumps(spec)).attributes.duration == d


@settings(max_examples=100, deadline=None)
@given(specs)
def test_stream_round_trip(spec):
    out = io.StringIO()
    SER.dump(spec, out)
    assert SER.load(io.StringIO(out.getvalue())) == spec
    raw = io.BytesIO()
    SER.dump(spec, raw)
    raw.seek(0)
    assert SER.load(raw) == spec


# ---- the written form ----------------------------------------------------------------------

def test_default_spec_writes_empty_object():
    assert SER.dumps(JobSpec()) == "{}"
    assert SER.loads("{}") == JobSpec()


def test_implicit_name_is_not_written():
    assert json.loads(SER.dumps(JobSpec(executable="/bin/date"))) == {"executable": "/bin/date"}
    explicit = JobSpec(executable="/bin/date", name="clock")
    assert json.loads(SER.dumps(explicit)) == {"executable": "/bin/date", "name": "clock"}
    back = SER.loads(SER.dumps(JobSpec(executable="/bin/date")))
    back.executable = "/bin/true"
    assert back.name == "/bin/true"  # the name still follows the executable after reading


def test_only_non_default_values_are_written():
    spec = JobSpec(executable="x", inherit_environment=True,
                   attributes=JobAttributes(duration=timedelta(minutes=10)),
                   cleanup_flags=StageOutFlags.ALWAYS)
    assert json.loads(SER.dumps(spec)) == {"executable": "x"}
    spec = JobSpec(inherit_environment=False, environment={})
    assert json.loads(SER.dumps(spec)) == {"inherit_environment": False, "environment": {}}


def test_full_form():
    spec = JobSpec(
        executable="/bin/echo", arguments=["a b", "c"], directory=Path("/work"),
        environment={"N": 3}, stdout_path="out.txt",
        resources=ResourceSpecV1(node_count=2, processes_per_node=4, exclusive_node_use=True),
        attributes=JobAttributes(duration=timedelta(minutes=20), queue_name="debug",
                                 project_name="proj", custom_attributes={"slurm.qos": "low"}),
        stage_in=[StageIn("file://host/data", "in", StagingMode.LINK)],
        stage_out=[StageOut("out", "/results/out", StageOutFlags.ON_SUCCESS
                            | StageOutFlags.IF_PRESENT)],
        cleanup=["scratch"], cleanup_flags=StageOutFlags.NONE)
    assert json.loads(SER.dumps(spec)) == {
        "executable": "/bin/echo",
        "arguments": ["a b", "c"],
        "directory": "/work",
        "environment": {"N": "3"},
        "stdout_path": "out.txt",
        "resources": {"node_count": 2, "processes_per_node": 4, "exclusive_node_use": True,
                      "__version": 1},
        "attributes": {"duration": 1200, "queue_name": "debug", "account": "proj",
                       "custom_attributes": {"slurm.qos": "low"}},
        "stage_in": [{"source": "file://host/data", "target": "in", "mode": "LINK"}],
        "stage_out": [{"source": "out", "target": "/results/out",
                       "flags": ["IF_PRESENT", "ON_SUCCESS"], "mode": "COPY"}],
        "cleanup": ["scratch"],
        "cleanup_flags": [],
    }


def test_default_resources_write_only_the_version():
    assert json.loads(SER.dumps(JobSpec(resources=ResourceSpecV1()))) == {
        "resources": {"__version": 1}}


@pytest.mark.parametrize(("duration", "written"), [
    (timedelta(minutes=20), 1200),
    (timedelta(0), 0),
    (timedelta(seconds=1, microseconds=500000), 1.5),
    (timedelta(microseconds=1), 1e-06),
    (timedelta(days=999999999), 999999999 * 86400),
    (timedelta.max, "86399999999999.999999 s"),
])
def test_duration_form(duration, written):
    doc = json.loads(SER.dumps(JobSpec(attributes=JobAttributes(duration=duration))))
    assert doc["attributes"]["duration"] == written
    assert type(doc["attributes"]["duration"]) is type(written)
    assert SER.loads(json.dumps(doc)).attributes.duration == duration


# ---- reading other forms -------------------------------------------------------------------

@pytest.mark.parametrize(("written", "duration"), [
    ("1200.0 s", timedelta(minutes=20)),
    ("1200 s", timedelta(minutes=20)),
    ("0.5 s", timedelta(milliseconds=500)),
    ("1e-06 s", timedelta(microseconds=1)),
    ("86399999999999.999999 s", timedelta.max),
    ("20 m", timedelta(minutes=20)),
    ("2h", timedelta(hours=2)),
    ("01:30:00", timedelta(minutes=90)),
    ("45", timedelta(minutes=45)),
    (1200, timedelta(minutes=20)),
    (1200.0, timedelta(minutes=20)),
    (0.000001, timedelta(microseconds=1)),
    (0.0000004, timedelta(0)),
])
def test_duration_forms_read(written, duration):
    doc = json.dumps({"attributes": {"duration": written}})
    assert SER.loads(doc).attributes.duration == duration


def test_reads_what_older_writers_write():
    # The exact text older PSI/J writers produce: implicit name written, empty attributes,
    # duration as "<seconds> s", project_name next to account.
    doc = ('{"executable": "/bin/echo", "arguments": ["a", "b"], "directory": "/tmp", '
           '"name": "/bin/echo", "inherit_environment": false, "environment": {"A": "1"}, '
           '"resources": {"node_count": 2, "processes_per_node": 3, "exclusive_node_use": true, '
           '"memory": 1000, "__version": 1}, "attributes": {"duration": "1200.0 s", '
           '"queue_name": "q", "account": "acc", "custom_attributes": {"slurm.qos": "x", '
           '"a.b": 3}, "project_name": "acc"}, "launcher": "mpirun"}')
    spec = SER.loads(doc)
    assert spec == JobSpec(
        executable="/bin/echo", arguments=["a", "b"], directory="/tmp", name="/bin/echo",
        inherit_environment=False, environment={"A": "1"},
        resources=ResourceSpecV1(node_count=2, processes_per_node=3, exclusive_node_use=True,
                                 memory=1000),
        attributes=JobAttributes(duration=timedelta(minutes=20), queue_name="q", account="acc",
                                 custom_attributes={"slurm.qos": "x", "a.b": 3}),
        launcher="mpirun")
    assert SER.loads('{"attributes": {}}') == JobSpec()


def test_missing_resource_version_means_version_1():
    assert SER.loads('{"resources": {"node_count": 3}}').resources == ResourceSpecV1(
        node_count=3)


@pytest.mark.parametrize(("written", "expected"), [
    (["ALWAYS"], StageOutFlags.ALWAYS),
    (["IF_PRESENT", "ALWAYS"], StageOutFlags.ALWAYS | StageOutFlags.IF_PRESENT),
    ("ON_ERROR", StageOutFlags.ON_ERROR),
    ([], StageOutFlags.NONE),
    (["NONE"], StageOutFlags.NONE),
    (3, StageOutFlags.IF_PRESENT | StageOutFlags.ON_SUCCESS),
    (0, StageOutFlags.NONE),
])
def test_flag_forms_read(written, expected):
    spec = SER.loads(json.dumps({"cleanup_flags": written, "stage_out": [
        {"source": "a", "target": "b", "flags": written}]}))
    assert spec.cleanup_flags == expected
    # StageOut.flags holds the normalized value: no ON_* flag means all of them.
    assert spec.stage_out[0].flags == normalize_flags(expected)


def test_staging_defaults_on_reading():
    spec = SER.loads('{"stage_in": [{"source": "a", "target": "b"}], '
                     '"stage_out": [{"source": "c", "target": "d"}]}')
    assert spec.stage_in == [StageIn("a", "b", StagingMode.COPY)]
    assert spec.stage_out == [StageOut("c", "d", StageOutFlags.ALWAYS, StagingMode.COPY)]


def test_null_means_default():
    assert SER.loads('{"executable": null, "resources": null, "attributes": null, '
                     '"stage_in": null, "cleanup": null}') == JobSpec()


def test_file_round_trip(tmp_path):
    spec = JobSpec(executable="/bin/echo", arguments=["é", "\U0001f600"])
    f = tmp_path / "spec.json"
    with open(f, "w", encoding="utf-8") as out:
        SER.dump(spec, out)
    with open(f, encoding="utf-8") as inp:
        assert SER.load(inp) == spec
    with open(f, "rb") as raw:
        assert SER.load(raw) == spec
    assert SER.loads(f.read_bytes()) == spec


# ---- errors --------------------------------------------------------------------------------

@pytest.mark.parametrize(("doc", "key", "where"), [
    ({"executabel": "x"}, "executabel", "JobSpec"),
    ({"attributes": {"walltime": 5}}, "walltime", "JobSpec.attributes"),
    ({"resources": {"nodes": 2, "__version": 1}}, "nodes", "JobSpec.resources"),
    ({"stage_in": [{"source": "a", "target": "b", "flags": []}]}, "flags", "JobSpec.stage_in[0]"),
    ({"stage_out": [{"source": "a", "target": "b", "how": 1}]}, "how", "JobSpec.stage_out[0]"),
    ({"__version": 1}, "__version", "JobSpec"),
])
def test_unknown_key(doc, key, where):
    with pytest.raises(ValueError) as info:
        SER.loads(json.dumps(doc))
    msg = str(info.value)
    assert msg.startswith(where + ":")
    assert repr(key) in msg
    assert "accepted:" in msg


def test_unknown_key_lists_the_accepted_ones():
    with pytest.raises(ValueError) as info:
        SER.loads('{"exe": "x"}')
    for field in FIELDS:
        assert field in str(info.value)


@pytest.mark.parametrize(("doc", "exc", "match"), [
    ("[]", TypeError, "JobSpec"),
    ("null", TypeError, "JobSpec"),
    ("{", ValueError, "line 1"),
    ('{"arguments": "ls"}', TypeError, "JobSpec.arguments"),
    ('{"arguments": [1]}', TypeError, r"JobSpec.arguments\[0\]"),
    ('{"directory": 5}', TypeError, "JobSpec.directory"),
    ('{"stdout_path": ""}', ValueError, "JobSpec.stdout_path"),
    ('{"executable": "a\\u0000b"}', ValueError, "JobSpec.executable"),
    ('{"inherit_environment": "yes"}', TypeError, "JobSpec.inherit_environment"),
    ('{"environment": {"A": [1]}}', TypeError, "JobSpec.environment"),
    ('{"resources": 4}', TypeError, "JobSpec.resources"),
    ('{"resources": {"__version": 2}}', ValueError, "version"),
    ('{"resources": {"__version": "1"}}', TypeError, "__version"),
    ('{"resources": {"__version": true}}', TypeError, "__version"),
    ('{"resources": {"node_count": 2, "process_count": 3}}', Exception, "process_count"),
    ('{"resources": {"node_count": "2"}}', TypeError, "ResourceSpecV1.node_count"),
    ('{"attributes": []}', TypeError, "JobSpec.attributes"),
    ('{"attributes": {"duration": -1}}', ValueError, "JobAttributes.duration"),
    ('{"attributes": {"duration": "-1.0 s"}}', ValueError,
     r"JobAttributes.duration: walltime.*hh:mm:ss"),
    ('{"attributes": {"duration": true}}', TypeError, "JobAttributes.duration"),
    ('{"attributes": {"duration": null}}', TypeError, "JobAttributes.duration"),
    ('{"attributes": {"duration": NaN}}', ValueError, "JobAttributes.duration"),
    ('{"attributes": {"duration": Infinity}}', ValueError, "JobAttributes.duration"),
    ('{"attributes": {"duration": 1e300}}', ValueError, "JobAttributes.duration"),
    ('{"attributes": {"duration": "1e999999 s"}}', ValueError, "JobAttributes.duration"),
    ('{"attributes": {"duration": "ten minutes"}}', ValueError,
     r"JobAttributes.duration: walltime.*hh:mm:ss"),
    ('{"attributes": {"queue_name": 1.5}}', TypeError, "JobAttributes.queue_name"),
    ('{"attributes": {"account": "a", "project_name": "b"}}', ValueError, "project_name"),
    ('{"attributes": {"custom_attributes": {"a.b": [1]}}}', TypeError, "custom_attributes"),
    ('{"stage_in": {"source": "a"}}', TypeError, "JobSpec.stage_in"),
    ('{"stage_in": ["a"]}', TypeError, r"JobSpec.stage_in\[0\]"),
    ('{"stage_in": [{"source": "a"}]}', ValueError, r"JobSpec.stage_in\[0\].*'target'"),
    ('{"stage_in": [{"source": "a", "target": "b", "mode": "SYMLINK"}]}', ValueError,
     r"JobSpec.stage_in\[0\].mode.*COPY"),
    ('{"stage_in": [{"source": "a", "target": "b", "mode": 1}]}', TypeError,
     r"JobSpec.stage_in\[0\].mode"),
    ('{"stage_in": [{"source": 1, "target": "b"}]}', TypeError, "StageIn.source"),
    ('{"stage_out": [{"source": "a", "target": "b", "flags": ["SOMETIMES"]}]}', ValueError,
     r"JobSpec.stage_out\[0\].flags\[0\].*ON_SUCCESS"),
    ('{"cleanup_flags": 16}', ValueError, "JobSpec.cleanup_flags"),
    ('{"cleanup_flags": -1}', ValueError, "JobSpec.cleanup_flags"),
    ('{"cleanup_flags": true}', TypeError, "JobSpec.cleanup_flags"),
    ('{"cleanup_flags": null}', TypeError, "JobSpec.cleanup_flags"),
    ('{"cleanup_flags": [2]}', TypeError, r"JobSpec.cleanup_flags\[0\]"),
    ('{"cleanup": "x"}', TypeError, "JobSpec.cleanup"),
])
def test_bad_documents(doc, exc, match):
    with pytest.raises(exc, match=match):
        SER.loads(doc)


def test_non_finite_custom_attribute_is_refused():
    spec = JobSpec(attributes=JobAttributes(custom_attributes={"x.y": float("inf")}))
    with pytest.raises(ValueError, match=r"custom_attributes\['x.y'\]"):
        SER.dumps(spec)


def test_only_job_specs_are_written():
    with pytest.raises(TypeError, match="JobSpec"):
        SER.dumps({"executable": "x"})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="str or bytes"):
        SER.loads(42)  # type: ignore[arg-type]


def test_surrogates():
    lone = JobSpec(executable="/bin/echo", arguments=["\udcff", "\ud800x", "a\udc80"])
    assert SER.loads(SER.dumps(lone)) == lone
    # A surrogate pair is how JSON spells a character outside the BMP: it reads back as one.
    paired = SER.loads(SER.dumps(JobSpec(arguments=["\ud83d\ude00"])))
    assert paired.arguments == ["\U0001f600"]


def test_writing_a_spec_leaves_unset_attributes_unset():
    # Recording every job in the registry writes its spec: that must not give the spec a
    # JobAttributes it did not have (nor cost making one), and reads the same either way.
    spec = JobSpec("/bin/true")
    written = SER.dumps(spec)
    assert spec.__dict__.get("_attributes") is None
    assert written == SER.dumps(JobSpec("/bin/true", attributes=JobAttributes()))
    assert SER.loads(written) == spec
