"""Plain bugs met in a first hour: batch-test honouring ``inherit_environment=False``, ``psij``
output piped to a reader that stops early, and whole ``--help`` descriptions of benchmarks."""

import subprocess
import sys
from pathlib import Path

import pytest

from psij import Job, JobExecutor, JobSpec, JobState
from psij.executors.batch.batch_test import BatchTestExecutorConfig

REPO = Path(__file__).resolve().parents[2]
PSIJ_SCRIPT = str(Path(sys.executable).parent / "psij")


@pytest.mark.parametrize("inherit,leaked", [(False, "unset"), (True, "leaked")])
def test_batch_test_honours_inherit_environment(inherit, leaked, tmp_path, monkeypatch):
    monkeypatch.setenv("PSIJ_TEST_SUBMITTER_ONLY", "leaked")
    out = tmp_path / "out.txt"
    cfg = BatchTestExecutorConfig(work_directory=tmp_path / "work", queue_polling_interval=0.2,
                                  initial_queue_polling_delay=0.1)
    with JobExecutor.get_instance("batch-test", config=cfg) as ex:
        job = Job(JobSpec("/bin/sh", ["-c", 'echo "${PSIJ_TEST_SUBMITTER_ONLY-unset} $MINE"'],
                          environment={"MINE": "given"}, inherit_environment=inherit,
                          stdout_path=out))
        ex.submit(job)
        status = job.wait(timeout=120)
    assert status is not None and status.state is JobState.COMPLETED, status
    assert out.read_text() == f"{leaked} given\n"


@pytest.mark.parametrize("args,codes", [
    (["plugins"], {141}),
    (["script", "--executor", "slurm", "--", "/bin/true"], {141}),
    # argparse drops its own write errors, so help may end 0; either way without a traceback.
    (["--help"], {0, 141}),
    (["run", "--help"], {0, 141}),
])
def test_output_to_a_closed_pipe_ends_quietly(args, codes):
    # The reading end is closed before the command writes anything (an interpreter takes far
    # longer to start than this close), as `| head` does once it has its lines.
    proc = subprocess.Popen([PSIJ_SCRIPT, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    with proc.stderr:
        err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) in codes, err
    assert err == ""


def test_output_to_head_keeps_the_lines_head_wants():
    done = subprocess.run(["/bin/sh", "-c", f'"{PSIJ_SCRIPT}" plugins | head -n 1'],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert done.stdout.strip() and "Traceback" not in done.stderr


@pytest.mark.parametrize("script", ["batch.py", "pilot_scheduler.py", "pilot_iterations.py"])
def test_bench_help_gives_the_whole_first_paragraph(script):
    path = REPO / "bench" / script
    doc = path.read_text().split('"""')[1]
    paragraph = " ".join(doc.split("\n\n")[0].split())
    done = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True,
                          timeout=60, check=True)
    assert paragraph.endswith(".")
    assert paragraph in " ".join(done.stdout.split())
