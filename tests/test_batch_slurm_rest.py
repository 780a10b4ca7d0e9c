"""Slurm submissions through a ``slurmrestd`` child (``rest_submit``): the request built from
the script (pure), and the child's handling with a fake ``slurmrestd`` beside a fake ``sbatch``.

The fake slurmrestd speaks HTTP on its standard input and output as the real one does in inetd
mode; what it does with each request is chosen by ``FAKE_MODE`` (answer a job id, refuse, end
before reading, end after reading, answer garbage) and it logs what it was given. The fake
sbatch logs its runs and prints a job id, so each test tells which way a job went. The same
handling with the real Slurm is in ``test_batch_slurm_rest_real.py``.
"""

import json
import os
import resource
import sys
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from psij import Job, JobAttributes, JobExecutor, JobSpec, SubmitException
from psij.executors.batch import _slurm_rest as rest
from psij.executors.batch._slurm_rest_child import RestSubmitter, slurmrestd_beside
from psij.executors.batch.slurm import SlurmExecutorConfig
from support.process_checks import alive

RENDERED = """#!/bin/bash
#SBATCH --job-name="a b"
#SBATCH --chdir="/runs/r 1"
#SBATCH --nodes=1
#SBATCH --ntasks=2
#SBATCH --cpus-per-task=1
#SBATCH --mem=1500K
#SBATCH --exclusive
#SBATCH --time=00:00:30
#SBATCH --partition="debug"
#SBATCH --nice=5
#SBATCH --begin="now+1hour"
#SBATCH --output=/dev/null
#SBATCH --error=/dev/null
#SBATCH --export=ALL

_PSIJ_NATIVE_ID=$SLURM_JOB_ID
#SBATCH --tmp=10K
echo done
"""

SITE = rest.SiteSettings(cli_filters=False, conf_path="/etc/slurm/slurm.conf",
                         propagated=("NOFILE", "CPU"))


# ------------------------------------------------------------------------ the request (pure)

def test_directives_become_fields_with_their_values_as_written() -> None:
    assert rest.job_fields(RENDERED) == {
        "name": "a b", "current_working_directory": "/runs/r 1", "nodes": "1", "tasks": "2",
        "cpus_per_task": "1",
        "memory_per_node": "1500K", "exclusive": "exclusive", "time_limit": "00:00:30",
        "partition": "debug", "nice": "5", "begin_time": "now+1hour",
        "standard_output": "/dev/null", "standard_error": "/dev/null"}
    # The --tmp line after the first command is not a directive for sbatch either.


@pytest.mark.parametrize("line", [
    "#SBATCH --tmp=10K",                 # no field in the job description
    "#SBATCH -N 2",                      # short option
    "#SBATCH --nodes 2",                 # value after a space
    '#SBATCH --job-name="a\\"b"',        # escaped quote
    "#SBATCH --job-name=a'b",
    "#SBATCH --comment=\"tab\there\"",
    "#SBATCH --export=NONE",             # sbatch would strip the environment
    "#SBATCH --export=HOME,PATH",
    "#SBATCH --nice",                    # bare form of an option with a value (sbatch: 100)
    "#SBATCH --exclusive=user",          # a value for a flag
    "#SBATCH --partition=",              # empty value
    "#SBATCH --no-such-option=1",
    "#SBATCH  --nodes=1",
])
def test_a_directive_that_cannot_be_given_exactly_sends_the_job_to_sbatch(line: str) -> None:
    assert rest.job_fields(f"#!/bin/bash\n#SBATCH --nodes=1\n{line}\necho x\n") is None


def test_the_last_of_repeated_directives_wins_as_in_sbatch() -> None:
    fields = rest.job_fields("#!/bin/bash\n#SBATCH --nice=1\n# comment\n\n#SBATCH --nice=7\nx\n")
    assert fields == {"nice": "7"}


def test_site_settings_read_the_propagated_limits_and_cli_filters() -> None:
    def read(limits: str, exceptions: str = "(null)", filters: str = "(null)") -> rest.SiteSettings:
        return rest.site_settings(
            f"Configuration data as of x\nCliFilterPlugins        = {filters}\n"
            f"PropagateResourceLimits = {limits}\n"
            f"PropagateResourceLimitsExcept = {exceptions}\n"
            "SLURM_CONF              = /etc/slurm/slurm.conf\nSLURM_VERSION = 22.05.8\n")

    assert read("NONE").propagated == ()
    assert read("ALL").propagated == rest._RLIMITS
    assert read("NOFILE,CORE").propagated == ("CORE", "NOFILE")
    assert read("ALL", "MEMLOCK, rlimit_as").propagated == tuple(
        n for n in rest._RLIMITS if n not in ("MEMLOCK", "AS"))
    assert not read("NONE").cli_filters and read("NONE", filters="lua").cli_filters
    assert read("NONE").conf_path == "/etc/slurm/slurm.conf"
    with pytest.raises(ValueError, match="PropagateResourceLimits"):
        rest.site_settings("garbage\n\udcff = \n")


def test_the_environment_is_the_submitters_plus_what_sbatch_adds(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    env = {"HOME": "/h", "PSIJ_X": "ünï", "SLURM_UMASK": "0077"}
    out = rest.job_environment(env, {"name": "j"}, SITE, "0022")
    assert out is not None
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    cpu = resource.getrlimit(resource.RLIMIT_CPU)[0]
    assert out == dict(
        env, SLURM_PRIO_PROCESS=str(os.getpriority(os.PRIO_PROCESS, 0)),
        SLURM_SUBMIT_DIR=str(tmp_path.resolve()),
        SLURM_SUBMIT_HOST=os.uname().nodename.split(".")[0],
        SLURM_CONF="/etc/slurm/slurm.conf", SLURM_JOB_NAME="j",
        SLURM_RLIMIT_NOFILE=str(nofile),
        SLURM_RLIMIT_CPU=str(cpu if cpu >= 0 else 2 ** 64 - 1))  # unlimited: all ones
    assert out["SLURM_UMASK"] == "0077"  # a umask set by the user is kept, as sbatch does
    assert rest.job_environment({}, {}, SITE, "0027")["SLURM_UMASK"] == "0027"  # type: ignore


@pytest.mark.parametrize("name", ["SBATCH_ACCOUNT", "SBATCH_EXPORT", "SLURM_HINT",
                                  "SLURM_EXPORT_ENV"])
def test_variables_that_change_what_sbatch_does_send_the_job_to_sbatch(name: str) -> None:
    assert rest.job_environment({name: "x"}, {}, SITE, "0022") is None


def test_an_environment_sbatch_could_not_be_started_with_sends_the_job_to_sbatch() -> None:
    # Linux takes at most 128 KiB per "NAME=value" (NUL included) and ARG_MAX in all; sbatch
    # then fails to start, so slurmrestd must not take the job either.
    limit = 32 * 4096
    fits = "x" * (limit - len("BIG=") - 1)
    assert rest.job_environment({"BIG": fits}, {}, SITE, "0022") is not None
    assert rest.job_environment({"BIG": fits + "x"}, {}, SITE, "0022") is None
    # counted in bytes: 3 bytes per euro sign, and bytes kept from undecodable text
    assert rest.job_environment({"E": "\u20ac" * 50_000}, {}, SITE, "0022") is None
    assert rest.job_environment({"S": "\udcff" * (limit - 3)}, {}, SITE, "0022") is not None
    assert rest.job_environment({"S": "\udcff" * (limit - 2)}, {}, SITE, "0022") is None
    many = {f"V{i}": "x" * 100_000 for i in range(os.sysconf("SC_ARG_MAX") // 100_000 + 1)}
    assert rest.job_environment(many, {}, SITE, "0022") is None
    assert rest.job_environment(dict(list(many.items())[:5]), {}, SITE, "0022") is not None


def test_the_request_is_utf8_json_with_its_length_and_refuses_lone_surrogates() -> None:
    data = rest.request_bytes("#!/bin/bash\necho é\n", {"nice": "1"}, {"A": "ü"}, "/w")
    assert data is not None
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"POST /slurm/v0.0.38/job/submit HTTP/1.1\r\n")
    assert f"Content-Length: {len(body)}".encode() in head
    assert json.loads(body) == {"script": "#!/bin/bash\necho é\n", "job": {
        "nice": "1", "environment": {"A": "ü"}, "current_working_directory": "/w"}}
    assert rest.request_bytes("x", {}, {"A": "\udcff"}, "/w") is None
    # The script's --chdir, as sbatch takes it, over the submitting process's folder.
    moved = rest.request_bytes("x", {"current_working_directory": "/runs"}, {}, "/w")
    assert moved is not None
    assert json.loads(moved.partition(b"\r\n\r\n")[2])["job"]["current_working_directory"] \
        == "/runs"


@pytest.mark.parametrize("status,body,expected", [
    (200, b'{"errors": [], "job_id": 42}', 42),
    (200, b'{"errors": [{"error": "Job is in held state"}], "job_id": 7}', 7),
    (500, b'{"errors": [{"error": "Invalid partition name specified"}]}', None),
    (200, b'{"errors": [], "job_id": true}', None),
    (200, b'{"errors": [], "job_id": -3}', None),
    (200, b'{"errors": [], "job_id": "5"}', None),
    (200, b"not json \xff", None),
    (200, b"[1, 2]", None),
])
def test_responses_give_a_job_id_only_when_the_job_was_taken(
        status: int, body: bytes, expected: object) -> None:
    job_id, said = rest.parse_response(status, body)
    assert job_id == expected
    if status == 500:
        assert "Invalid partition name specified" in said


# ------------------------------------------------------------------------ the child (fake)

FAKE_RESTD = r"""#!{python}
import json, os, sys
log = open(os.environ["FAKE_LOG"], "a")
log.write("start %d\n" % os.getpid()); log.flush()
mode = os.environ.get("FAKE_MODE", "ok")
inp, out = sys.stdin.buffer, sys.stdout.buffer
n = 0
while True:
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        c = inp.read(1)
        if not c:
            sys.exit(0)
        head += c
    if head.startswith(b"GET /slurm/v0.0.38/ping "):
        if mode == "end-before":
            sys.exit(0)
        out.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"); out.flush()
        continue
    length = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0]
                 .split(b":")[1])
    req = json.loads(inp.read(length))
    n += 1
    log.write("job %s %s\n" % (req["job"].get("name"), req["job"]["current_working_directory"]))
    log.flush()
    if mode == "end-after":
        sys.exit(0)
    if mode == "garbage":
        out.write(b"what?\r\n\r\n"); out.flush(); continue
    if mode == "refuse":
        body = json.dumps({"errors": [{"error": "Invalid account"}]}).encode()
        status = b"500 Internal Server Error"
    else:
        body = json.dumps({"errors": [], "job_id": 1000 + n}).encode()
        status = b"200 OK"
    out.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    out.flush()
"""

FAKE_SBATCH = """#!/bin/sh
cat >/dev/null
echo "sbatch" >> "$FAKE_LOG"
echo 77
"""

FAKE_SCONTROL = """#!/bin/sh
echo "scontrol $*" >> "$FAKE_LOG"
printf 'CliFilterPlugins = (null)\\nPropagateResourceLimits = NONE\\nSLURM_CONF = /x\\n'
"""


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("slurmrestd", FAKE_RESTD.replace("{python}", sys.executable)),
                       ("sbatch", FAKE_SBATCH), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "log"
    log.touch()
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    yield log


def _log(log: Path) -> List[str]:
    return log.read_text().splitlines()


def _submit(tmp_path: Path, count: int, **config: object) -> List[Job]:
    ex = JobExecutor.get_instance("slurm", config=SlurmExecutorConfig(
        work_directory=tmp_path / "w", queue_polling_interval=60, spare_submit_commands=0,
        **config))  # type: ignore[arg-type]
    jobs = []
    try:
        for i in range(count):
            job = Job(JobSpec("/bin/true", name=f"j{i}", directory=tmp_path))
            jobs.append(job)
            ex.submit(job)
    finally:
        ex.close()
    return jobs


def test_the_slurmrestd_beside_the_sbatch_on_path_is_used(fake: Path, tmp_path: Path) -> None:
    assert slurmrestd_beside("sbatch", os.environ["PATH"]) == str(tmp_path / "bin/slurmrestd")
    jobs = _submit(tmp_path, 4)
    # The first job goes to sbatch; the settings are read once; the child serves the rest.
    assert [job.native_id for job in jobs] == ["77", "1001", "1002", "1003"]
    log = _log(fake)
    assert log[0] == "sbatch" and log.count("scontrol show config") == 1
    assert [line for line in log if line.startswith("start")] == [log[2]]  # one child
    assert [line.split()[1] for line in log if line.startswith("job")] == ["j1", "j2", "j3"]


def test_the_child_serves_when_its_pipes_are_numbered_past_1024(fake: Path,
                                                                tmp_path: Path) -> None:
    # A program with many files open gives the child's pipes high numbers: select() refused
    # them (ValueError), which failed the submission and left the child's pipes open.
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1300:
        pytest.skip(f"at most {hard} open files here")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1300), hard))
    taken = []
    try:
        while True:  # every number up to 1100 taken: the next ones are above
            fd = os.open(os.devnull, os.O_RDONLY)
            taken.append(fd)
            if fd >= 1100:
                break
        jobs = _submit(tmp_path, 3)
    finally:
        for fd in taken:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert [job.native_id for job in jobs] == ["77", "1001", "1002"]


def test_off_means_sbatch_for_every_job(fake: Path, tmp_path: Path) -> None:
    jobs = _submit(tmp_path, 3, rest_submit=False)
    assert [job.native_id for job in jobs] == ["77"] * 3
    assert _log(fake) == ["sbatch"] * 3


def test_no_slurmrestd_beside_sbatch_means_sbatch(fake: Path, tmp_path: Path) -> None:
    (tmp_path / "bin/slurmrestd").unlink()
    assert [job.native_id for job in _submit(tmp_path, 3)] == ["77"] * 3


def test_a_refused_job_goes_to_sbatch_which_gives_its_own_answer(
        fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MODE", "refuse")
    jobs = _submit(tmp_path, 3)
    assert [job.native_id for job in jobs] == ["77"] * 3
    log = _log(fake)
    assert log.count("sbatch") == 3 and len([x for x in log if x.startswith("job")]) == 2


def test_a_child_that_ends_before_reading_leaves_the_job_to_sbatch_and_rests(
        fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MODE", "end-before")
    jobs = _submit(tmp_path, 4)
    assert [job.native_id for job in jobs] == ["77"] * 4
    assert len([x for x in _log(fake) if x.startswith("start")]) == 1  # not started again


@pytest.mark.parametrize("mode", ["end-after", "garbage"])
def test_a_child_failing_after_taking_the_job_fails_it_without_a_retry(
        fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    monkeypatch.setenv("FAKE_MODE", mode)
    with pytest.raises(SubmitException) as info:
        _submit(tmp_path, 3)
    assert "may have been submitted" in str(info.value) and not info.value.transient
    log = _log(fake)
    assert log.count("sbatch") == 1 and len([x for x in log if x.startswith("job")]) == 1


def test_the_child_stops_when_idle_and_on_close(fake: Path, tmp_path: Path) -> None:
    from psij.executors.batch._runner import SubprocessRunner

    runner = SubprocessRunner()
    sub = RestSubmitter(lambda argv: runner.run(argv, 10), idle=0.3)
    script = "#!/bin/bash\n#SBATCH --job-name=x\ntrue\n"
    assert sub.submit(("sbatch", "--parsable"), script, 10) is None  # the first: sbatch
    result = sub.submit(("sbatch", "--parsable"), script, 10)
    assert result is not None and result.ok and result.stdout == "1001\n"
    pid = sub.child_pid
    assert pid is not None and alive(pid)
    deadline = __import__("time").monotonic() + 10
    while alive(pid):
        assert __import__("time").monotonic() < deadline, "child not stopped when idle"
        __import__("time").sleep(0.05)
    assert sub.child_pid is None
    result = sub.submit(("sbatch", "--parsable"), script, 10)  # started again on demand
    assert result is not None and result.stdout == "1001\n"
    pid = sub.child_pid
    sub.close()
    assert pid is not None and not alive(pid)
    assert sub.submit(("sbatch", "--parsable"), script, 10) is None  # closed: sbatch


def test_a_forked_child_process_uses_sbatch(fake: Path, tmp_path: Path) -> None:
    from psij.executors.batch._runner import SubprocessRunner

    runner = SubprocessRunner()
    sub = RestSubmitter(lambda argv: runner.run(argv, 10))
    script = "#!/bin/bash\ntrue\n"
    for _ in range(2):
        sub.submit(("sbatch", "--parsable"), script, 10)
    assert sub.child_pid is not None
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        os.close(read)
        os.write(write, b"none" if sub.submit(("sbatch", "--parsable"), script, 10) is None
                 else b"used")
        os._exit(0)
    os.close(write)
    assert os.read(read, 10) == b"none"
    os.close(read)
    os.waitpid(pid, 0)
    result = sub.submit(("sbatch", "--parsable"), script, 10)  # the parent still uses it
    assert result is not None and result.ok
    sub.close()


@pytest.mark.parametrize("value", ["yes", 1, None, float("nan")])
def test_rest_submit_must_be_a_bool(value: object) -> None:
    with pytest.raises(TypeError, match="SlurmExecutorConfig.rest_submit"):
        SlurmExecutorConfig(rest_submit=value)  # type: ignore[arg-type]


def test_jobs_keep_their_attributes_whichever_way(fake: Path, tmp_path: Path) -> None:
    jobs: Dict[str, Job] = {}
    ex = JobExecutor.get_instance("slurm", config=SlurmExecutorConfig(
        work_directory=tmp_path / "w", queue_polling_interval=60))
    try:
        for name in ("a", "b"):
            job = Job(JobSpec("/bin/true", name=name, attributes=JobAttributes(
                custom_attributes={"slurm.comment": "c"})))
            ex.submit(job)
            jobs[name] = job
    finally:
        ex.close()
    assert jobs["a"].native_id == "77" and jobs["b"].native_id == "1001"


def test_an_idle_stop_that_raises_is_logged_and_the_next_job_starts_a_new_child(
        fake: Path, caplog: pytest.LogCaptureFixture) -> None:
    import time

    from psij.executors.batch._runner import SubprocessRunner

    class Failing(RestSubmitter):
        failures = 1

        def _stop_locked(self) -> None:
            super()._stop_locked()
            if self.failures:
                self.failures -= 1
                raise OSError("cannot stop")

    runner = SubprocessRunner()
    sub = Failing(lambda argv: runner.run(argv, 10), idle=0.2)
    script = "#!/bin/bash\ntrue\n"
    sub.submit(("sbatch", "--parsable"), script, 10)
    assert sub.submit(("sbatch", "--parsable"), script, 10) is not None
    deadline = time.monotonic() + 10
    while "stopping the idle slurmrestd child failed" not in caplog.text:
        assert time.monotonic() < deadline, "the failed stop was not logged"
        time.sleep(0.05)
    result = sub.submit(("sbatch", "--parsable"), script, 10)
    assert result is not None and result.ok  # a new child serves
    assert len([x for x in _log(fake) if x.startswith("start")]) == 2
    sub.close()
