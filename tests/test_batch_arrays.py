"""Job arrays and ``submit_many`` without a real scheduler: the pure parts of
``psij.executors.batch._arrays`` (array scripts, index lists, grouping), the parsers of array
elements in each scheduler's status output, and PBS Pro and LSF arrays end to end through the
fake commands of ``tests/support/fake_site_scheduler.py``, which run each element's script for real.
"""

import subprocess
import threading
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import pytest

from psij import Job, JobExecutor, JobSpec, JobState
from psij.exceptions import SubmitManyException
from psij.executors.batch import _arrays
from psij.executors.batch._runner import CommandResult, CommandRunner
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutor
from psij.executors.batch.sge import SgeJobExecutor
from psij.executors.batch.slurm import SlurmJobExecutor
from support.batch_sites import WAIT, fake_site


class Recording:
    """The executor's runner, recording every command."""

    def __init__(self, inner: CommandRunner) -> None:
        self.inner = inner
        self.calls: List[Tuple[str, ...]] = []
        self.lock = threading.Lock()

    def run(self, argv: Sequence[str], timeout: float,
            stdin: Optional[str] = None) -> CommandResult:
        with self.lock:
            self.calls.append(tuple(argv))
        return self.inner.run(argv, timeout, stdin)

    def to(self, program: str) -> List[Tuple[str, ...]]:
        with self.lock:
            return [c for c in self.calls if c[0] == program]


def array_jobs(out: Path, n: int, sleeper: Optional[int] = None) -> List[Job]:
    jobs = []
    for i in range(n):
        if i == sleeper:
            spec = JobSpec("/bin/sleep", ["60"], stdout_path=out / str(i), name="arr")
        else:
            spec = JobSpec("/bin/sh", ["-c", 'printf "%s %s\\n" "$ELEMENT" "$1"; exit "$2"', "sh",
                                       f"arg {i}", str(i % 3)],
                           environment={"ELEMENT": f"element {i}"}, stdout_path=out / str(i),
                           name="arr")
        jobs.append(Job(spec))
    return jobs


# ======================================================== PBS Pro and LSF through the fakes


@pytest.mark.parametrize("name", ["pbs", "lsf"])
def test_fake_site_array_elements_keep_their_own_everything(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ex = fake_site(name, tmp_path, monkeypatch)
    runner = Recording(ex._runner)
    ex._runner = runner
    out = tmp_path / "out"
    out.mkdir()
    jobs = array_jobs(out, 6, sleeper=2)
    ex.submit_many(jobs)
    submit = "qsub" if name == "pbs" else "bsub"
    assert len(runner.to(submit)) == 1
    ids = [job.native_id for job in jobs]
    if name == "pbs":
        array = str(ids[0]).split("[")[0]
        assert ids == [f"{array}[{i}].fakepbs" for i in range(6)]
    else:
        array = str(ids[0]).split("[")[0]
        assert ids == [f"{array}[{i + 1}]" for i in range(6)]
    sleeper = jobs[2]
    assert sleeper.wait(WAIT, target_states=[JobState.ACTIVE]) is not None
    sleeper.cancel()
    for i, job in enumerate(jobs):
        st = job.wait(WAIT)
        assert st is not None, (i, job.native_id)
        if i == 2:
            assert st.state is JobState.CANCELED, st
            continue
        assert st.exit_code == i % 3, (i, st)
        assert st.state is (JobState.COMPLETED if i % 3 == 0 else JobState.FAILED), (i, st)
        assert (out / str(i)).read_text() == f"element {i} arg {i}\n"
    # Each poll asked about the array once, never element by element.
    status = runner.to("qstat" if name == "pbs" else "bjobs")
    assert status
    for argv in status:
        if name == "pbs":
            assert argv[-2:] == ("-t", f"{array}[].fakepbs"), argv
        else:
            assert argv[-1] == array, argv
    # Cancel named the element alone.
    cancel = runner.to("qdel" if name == "pbs" else "bkill")
    assert [c[-1] for c in cancel] == [ids[2]]
    ex.close()


def test_fake_pbs_array_script_asks_for_the_indices(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    ex = fake_site("pbs", tmp_path, monkeypatch)
    ex.config.keep_files = True  # type: ignore[attr-defined]
    jobs = array_jobs(tmp_path, 3)
    ex.submit_many(jobs)
    script = (ex.work_directory / f"{jobs[0].id}.job").read_text()
    assert script.splitlines()[1] == "#PBS -J 0-2"
    assert 'case "$PBS_ARRAY_INDEX" in' in script
    # One file, linked under each job's name.
    assert all((ex.work_directory / f"{j.id}.job").samefile(ex.work_directory
                                                            / f"{jobs[0].id}.job") for j in jobs)
    for job in jobs:
        job.wait(WAIT)
    ex.close()


def test_lsf_array_is_named_after_the_jobs(tmp_path: Path) -> None:
    shape = '#!/bin/bash\n#BSUB -J "my job"\n#BSUB -n 1\n'
    text = _arrays.LSF_ARRAYS.directives(shape, 1, 4)
    assert text == '#!/bin/bash\n#BSUB -J "my_job[1-4]"\n#BSUB -n 1\n'
    assert _arrays.LSF_ARRAYS.directives("#!/bin/bash\n", 1, 2) == \
        '#!/bin/bash\n#BSUB -J "psij[1-2]"\n'


# ======================================================== pure parts


def test_array_script_runs_each_element_with_its_own_environment_and_words(
        tmp_path: Path) -> None:
    shape = "\n".join(["#!/bin/bash", "#X directive", "_PSIJ_NATIVE_ID=$SLURM_JOB_ID",
                       f'export {_arrays.ENV_MARK}=""', "run() {",
                       f"    {_arrays.LAUNCH_MARK} ", "}", "run", 'echo "id=$_PSIJ_NATIVE_ID"'])
    assert _arrays.shape_is_usable(_arrays.SLURM_ARRAYS, shape)
    from psij._scripts.quoting import bash_escape
    hostile = "$(touch PWNED) `id` \"q\" 'x' \\ é"
    words = ["printf", "%s|%s\\n", "$V", hostile]
    elements = [_arrays.element_text([("V", f"{hostile}{i}")], words, bash_escape)
                for i in range(3)]
    text = _arrays.array_script(_arrays.SLURM_ARRAYS, shape, elements)
    assert text.splitlines()[1] == "#SBATCH --array=0-2"
    for i in range(3):
        done = subprocess.run(["bash", "-c", text], capture_output=True, text=True, cwd=tmp_path,
                              env={"SLURM_ARRAY_TASK_ID": str(i), "SLURM_ARRAY_JOB_ID": "77",
                                   "PATH": "/usr/bin:/bin"})
        # Words stay words: printf gets the literal "$V" and the hostile text, nothing runs.
        assert done.stdout == f"$V|{hostile}\nid=77_{i}\n", done
    assert not (tmp_path / "PWNED").exists()
    outside = subprocess.run(["bash", "-c", text], capture_output=True, text=True,
                             env={"SLURM_ARRAY_TASK_ID": "3", "PATH": "/usr/bin:/bin"})
    assert outside.returncode == 1 and "no element 3" in outside.stderr


def test_array_script_exports_the_element_environment(tmp_path: Path) -> None:
    shape = "\n".join(["#!/bin/bash", "_PSIJ_NATIVE_ID=$JOB_ID", f'export {_arrays.ENV_MARK}=""',
                       f"{_arrays.LAUNCH_MARK} "])
    from psij._scripts.quoting import bash_escape
    elements = [_arrays.element_text([("V", f"value {i} $HOME")], ["sh", "-c", 'echo "$V"'],
                                     bash_escape) for i in range(2)]
    text = _arrays.array_script(_arrays.SGE_ARRAYS, shape, elements)
    assert text.splitlines()[1] == "#$ -t 1-2"
    for i in range(2):
        done = subprocess.run(["bash", "-c", text], capture_output=True, text=True,
                              env={"SGE_TASK_ID": str(i + 1), "PATH": "/usr/bin:/bin"})
        assert done.stdout == f"value {i} $HOME\n", done


@pytest.mark.parametrize("shape", [
    "#!/bin/bash\n_PSIJ_NATIVE_ID=$SLURM_JOB_ID\n",  # no markers
    f'#!/bin/bash\nexport {_arrays.ENV_MARK}=""\n{_arrays.LAUNCH_MARK}\n',  # no id line
    f'#!/bin/bash\n_PSIJ_NATIVE_ID=$SLURM_JOB_ID\nexport {_arrays.ENV_MARK}=""\n'
    f"{_arrays.LAUNCH_MARK}\n{_arrays.LAUNCH_MARK}\n",  # the command twice
])
def test_shapes_without_exactly_one_of_each_marker_are_not_used(shape: str) -> None:
    assert not _arrays.shape_is_usable(_arrays.SLURM_ARRAYS, shape)


@pytest.mark.parametrize("text,indices", [
    ("5", [5]), ("1-4", [1, 2, 3, 4]), ("1-9:4", [1, 5, 9]), ("0-2,7,9-10", [0, 1, 2, 7, 9, 10]),
    ("3-5%2", [3, 4, 5]),
])
def test_index_lists(text: str, indices: List[int]) -> None:
    assert _arrays.expand_index_list(text) == indices


@pytest.mark.parametrize("text", ["", "a", "5-1", "1-9:0", "-3", "1-99999999999", "1..3",
                                  "\udc80", "nan", "1-2:-1"])
def test_bad_index_lists_name_the_part(text: str) -> None:
    with pytest.raises(ValueError, match="index list"):
        _arrays.expand_index_list(text)


def test_element_ids_and_their_arrays() -> None:
    assert _arrays.SLURM_ARRAYS.split("12_3") == ("12", 3)
    assert _arrays.SLURM_ARRAYS.split("12") is None
    assert _arrays.SGE_ARRAYS.split("12.3") == ("12", 3)
    assert _arrays.PBS_ARRAYS.split("12[3].server.example") == ("12[].server.example", 3)
    assert _arrays.PBS_ARRAYS.element_id("12[].srv", 4) == "12[4].srv"
    assert _arrays.LSF_ARRAYS.split("12[3]") == ("12", 3)


def test_slurm_reads_array_elements_and_pending_ranges(tmp_path: Path) -> None:
    ex = JobExecutor.get_instance("slurm")
    assert isinstance(ex, SlurmJobExecutor)
    argv = ex.get_status_command(["40_0", "40_1", "41"])
    assert "--array" in argv and "--jobs=40,41" in argv
    out = "40_0|COMPLETED|None\n40_1|RUNNING|None\n40_[2-4,7%2]|PENDING|JobArrayTaskLimit\n"
    found = ex.parse_status_output(0, out)
    assert sorted(found) == ["40_0", "40_1", "40_2", "40_3", "40_4", "40_7"]
    assert found["40_3"].state is JobState.QUEUED
    acct = ("40_0|COMPLETED|0:0|None\n40_0.batch|COMPLETED|0:0|\n"
            "40_1|FAILED|3:0|NonZeroExitCode\n40_1.batch|FAILED|3:0|\n"
            "40_[2-4]|PENDING|0:0|None\n")
    done = ex.parse_accounting_output(0, acct)
    assert sorted(done) == ["40_0", "40_1"] and done["40_1"].exit_code == 3
    with pytest.raises(ValueError):
        ex.parse_status_output(0, "40_[a-b]|PENDING|None\n")


def test_sge_reads_array_tasks_and_cancels_one(tmp_path: Path) -> None:
    ex = JobExecutor.get_instance("sge")
    assert isinstance(ex, SgeJobExecutor)
    xml = """<?xml version='1.0'?>
<job_info><queue_info>
<job_list state="running"><JB_job_number>9</JB_job_number><state>r</state><tasks>1</tasks>
</job_list></queue_info><job_info>
<job_list state="pending"><JB_job_number>9</JB_job_number><state>qw</state><tasks>2-6:2</tasks>
</job_list>
<job_list state="pending"><JB_job_number>10</JB_job_number><state>qw</state></job_list>
</job_info></job_info>"""
    found = ex.parse_status_output(0, xml)
    assert sorted(found) == ["10", "9.1", "9.2", "9.4", "9.6"]
    assert found["9.1"].state is JobState.ACTIVE and found["9.4"].state is JobState.QUEUED
    assert ex.get_cancel_command("9.4") == ["qdel", "9", "-t", "4"]
    assert ex.get_cancel_command("10") == ["qdel", "10"]
    assert ex.get_accounting_commands(["9.4"]) == [["qacct", "-j", "9", "-t", "4"]]
    record = "==============================================================\n"
    acct = (record + "jobnumber    9\ntaskid       4\nfailed       0\nexit_status  5\n"
            + record + "jobnumber    10\ntaskid       undefined\nfailed       0\n"
            "exit_status  0\n")
    done = ex.parse_accounting_output(0, acct)
    assert done["9.4"].exit_code == 5 and done["10"].state is JobState.COMPLETED


# ======================================================== submit_many everywhere


def test_submit_many_on_local_runs_each_job(tmp_path: Path) -> None:
    ex = JobExecutor.get_instance("local")
    jobs = [Job(JobSpec("/bin/sh", ["-c", f"exit {i}"])) for i in range(3)]
    ex.submit_many(jobs)
    assert [job.wait(WAIT).exit_code for job in jobs] == [0, 1, 2]  # type: ignore[union-attr]


def test_submit_many_reports_failed_jobs_and_submits_the_others(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ex = fake_site("pbs", tmp_path, monkeypatch)
    good = array_jobs(tmp_path, 3)
    bad = Job(JobSpec(None))
    twice = good[0]
    with pytest.raises(SubmitManyException) as info:
        ex.submit_many([*good, bad])
    assert [job for job, _ in info.value.failures] == [bad]
    assert "JobSpec.executable" in str(info.value)
    assert bad.status.state is JobState.NEW and bad.executor is None
    with pytest.raises(SubmitManyException) as info:
        ex.submit_many([twice])  # not NEW any more
    assert info.value.failures[0][0] is twice
    for job in good:
        assert job.wait(WAIT) is not None
    ex.close()


def test_a_refused_array_leaves_its_jobs_new_and_unbound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ex = fake_site("lsf", tmp_path, monkeypatch)
    jobs = [Job(JobSpec("/bin/true", [str(i)], attributes=_queue("nosuchqueue")))
            for i in range(3)]
    with pytest.raises(SubmitManyException) as info:
        ex.submit_many(jobs)
    assert len(info.value.failures) == 3 and "No such queue" in str(info.value)
    assert all(j.status.state is JobState.NEW and j.executor is None for j in jobs)
    ex.submit_many([Job(JobSpec("/bin/true"))])  # the executor goes on
    ex.close()


def _queue(name: str) -> "object":
    from psij import JobAttributes

    return JobAttributes(queue_name=name)


def test_different_shapes_go_as_different_arrays(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    ex = fake_site("pbs", tmp_path, monkeypatch)
    runner = Recording(ex._runner)
    ex._runner = runner
    jobs = [Job(JobSpec("/bin/true", [str(i)], name="a" if i % 2 else "b")) for i in range(4)]
    jobs.append(Job(JobSpec("/bin/true", name="alone")))
    ex.submit_many(jobs)
    assert len(runner.to("qsub")) == 3
    assert "[" in str(jobs[0].native_id) and "[" not in str(jobs[4].native_id)
    for job in jobs:
        st = job.wait(WAIT)
        assert st is not None and st.state is JobState.COMPLETED, st
    ex.close()


def test_an_executor_with_its_own_script_hook_submits_one_by_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ex = fake_site("pbs", tmp_path, monkeypatch)

    class Own(type(ex)):  # type: ignore[misc]
        def generate_submit_script(self, job: Job, context: object, out: object) -> None:
            super().generate_submit_script(job, context, out)  # type: ignore[arg-type]

    ex.__class__ = Own
    assert ex._script_inputs().generator is None
    runner = Recording(ex._runner)
    ex._runner = runner
    jobs = [Job(JobSpec("/bin/true", [str(i)])) for i in range(3)]
    ex.submit_many(jobs)
    assert len(runner.to("qsub")) == 3
    for job in jobs:
        assert job.wait(WAIT) is not None
    assert isinstance(ex, BatchSchedulerExecutor)
    ex.close()


@pytest.mark.parametrize("name", ["local", "slurm"])
@pytest.mark.parametrize("jobs,field", [
    (None, "submit_many jobs"), ("abc", "submit_many jobs"), (42, "submit_many jobs"),
    ([Job(JobSpec("/bin/true")), "x"], r"submit_many jobs\[1\]"),
    ([float("nan")], r"submit_many jobs\[0\]"),
])
def test_submit_many_refuses_what_is_not_a_list_of_jobs(name: str, jobs: object,
                                                         field: str) -> None:
    ex = JobExecutor.get_instance(name)
    with pytest.raises(TypeError, match=field):
        ex.submit_many(jobs)  # type: ignore[arg-type]
