"""Executors made one per job (as workflow tools do) leave a constant number of files: every
local executor of a process shares that process's journal, and ``list()``/``attach()`` from
another process still see every job."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

RUN = r"""
import json, sys
from pathlib import Path
from psij import Job, JobExecutor, JobSpec
from psij.executors.local import LocalJobExecutorConfig
work, count = Path(sys.argv[1]), int(sys.argv[2])
jobs = []
for i in range(count):
    ex = JobExecutor.get_instance("local", config=LocalJobExecutorConfig(work_directory=work))
    job = Job(JobSpec("/bin/sh", ["-c", f"exit {i % 3}"]))
    ex.submit(job)
    jobs.append(job)
for job in jobs:
    job.wait()
ended = {j.native_id: [j.id, j.status.exit_code] for j in jobs}
# One more job, still running while another process looks (list() shows running jobs).
ex = JobExecutor.get_instance("local", config=LocalJobExecutorConfig(work_directory=work))
running = Job(JobSpec("/bin/sleep", ["600"]))
ex.submit(running)
import subprocess
pid = sorted(ended)[7]
looked = subprocess.run([sys.executable, "-c", sys.argv[3], str(work), pid],
                        capture_output=True, text=True, timeout=300)
running.cancel()
running.wait()
print(json.dumps([ended, running.native_id, looked.stdout, looked.stderr]))
"""

LOOK = r"""
import json, sys
from pathlib import Path
from psij import Job, JobExecutor
from psij.executors.local import LocalJobExecutorConfig
ex = JobExecutor.get_instance("local",
                              config=LocalJobExecutorConfig(work_directory=Path(sys.argv[1])))
listed = ex.list()
pid = sys.argv[2]
job = Job()
ex.attach(job, pid)
job.wait()
print(json.dumps([sorted(listed), job.status.state.name, job.status.exit_code]))
"""


def _run(code: str, *args: str, home: Path) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env={"HOME": str(home), "PATH": "/usr/bin:/bin"}, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def _files(top: Path) -> List[Path]:
    return sorted(p for p in top.rglob("*") if not p.is_dir())


def _jobs(tmp_path: Path, name: str, count: int) -> Tuple[Dict[str, List[int]], str, str]:
    home = tmp_path / f"home-{name}"
    home.mkdir()
    work = tmp_path / f"work-{name}"
    ended, running, looked, errors = json.loads(_run(RUN, str(work), str(count), LOOK,
                                                     home=home))
    assert looked, errors
    return ended, running, looked


def test_one_executor_per_job_leaves_a_constant_number_of_files(tmp_path: Path) -> None:
    small, _, _ = _jobs(tmp_path, "200", 200)
    big, running, looked = _jobs(tmp_path, "400", 400)
    assert len(small) == 200 and len(big) == 400
    small_files = _files(tmp_path / "work-200") + _files(tmp_path / "home-200")
    big_files = _files(tmp_path / "work-400") + _files(tmp_path / "home-400")
    assert len(small_files) <= 8, small_files
    assert len(big_files) == len(small_files), big_files
    journals = [p for p in _files(tmp_path / "work-400") if p.suffix == ".journal"]
    assert len(journals) == 1 and journals[0].stat().st_mode & 0o777 == 0o600
    # Another process listed the running job and attached to an ended one, finding its code.
    listed, state, seen = json.loads(looked.strip().splitlines()[-1])
    assert running in listed
    code = big[sorted(big)[7]][1]
    assert (state, seen) == ("COMPLETED" if code == 0 else "FAILED", code)


def test_many_work_directories_keep_few_journals_open_and_lose_no_line(tmp_path: Path) -> None:
    from psij import Job, JobExecutor, JobSpec
    from psij.executors.local import LocalJobExecutorConfig

    def journal_fds() -> int:
        fds = Path("/proc/self/fd")
        return sum(1 for fd in fds.iterdir()
                   if _target(fd).startswith(str(tmp_path)) and _target(fd).endswith(".journal"))

    executors = [JobExecutor.get_instance("local", config=LocalJobExecutorConfig(
        work_directory=tmp_path / f"w{i}")) for i in range(40)]
    for ex in executors + executors[:3]:  # the first ones again after their files were closed
        job = Job(JobSpec("/bin/true"))
        ex.submit(job)
        assert job.wait() is not None
    assert journal_fds() <= 32
    for i in range(40):
        [journal] = [p for p in _files(tmp_path / f"w{i}") if p.suffix == ".journal"]
        starts = [line for line in journal.read_text().splitlines() if line.startswith("S ")]
        assert len(starts) == (2 if i < 3 else 1), (i, starts)


def _target(fd: Path) -> str:
    try:
        return str(fd.readlink())
    except OSError:
        return ""


def test_a_cancel_noted_in_another_journal_makes_the_end_a_cancel(tmp_path: Path) -> None:
    from psij import Job, JobState
    from psij.executors._local_journal import scan_journals
    from psij.executors.local import LocalJobExecutor, LocalJobExecutorConfig

    folder = tmp_path / "local"
    folder.mkdir(mode=0o700)
    (folder / "a.journal").write_text("S 4242 1000 job-a\nS 4343 1001 job-b\n"
                                      "E 4242 1000 143\nE 4343 1001 143\n")
    # Another process cancelled job-a (and wrote a line no reader can take, which is skipped).
    (folder / "b.journal").write_text("C 4242 1000 canceled\nC 4242\n")
    found = scan_journals(folder)
    assert (found[(4242, "1000")].canceled, found[(4343, "1001")].canceled) == (True, False)
    ex = LocalJobExecutor(config=LocalJobExecutorConfig(work_directory=tmp_path))
    a, b = Job(), Job()
    ex.attach(a, "4242")
    ex.attach(b, "4343")
    assert (a.status.state, a.status.exit_code) == (JobState.CANCELED, 143)
    assert (b.status.state, b.status.exit_code) == (JobState.FAILED, 143)
