"""The plugin package of docs/plugins.rst (docs/examples/mysched-psij) installs with pip and
its declarative batch executor runs jobs, in a fresh Python, against a fake ``mysched``
command that runs the submit scripts for real."""

import json
import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "mysched-psij"

# The fake MySched: submit SCRIPT, status ID..., cancel ID, list (see docs/plugins.rst).
FAKE_MYSCHED = r'''#!{python}
import os, signal, subprocess, sys
from pathlib import Path

spool = Path({spool!r})
spool.mkdir(exist_ok=True)
command, args = sys.argv[1], sys.argv[2:]
state = lambda i: (spool / f"{{i}}.state").read_text().strip()
if command == "submit":
    number = len(list(spool.glob("*.state"))) + 1
    (spool / f"{{number}}.state").write_text("R")
    wrapper = 'bash "$1"; if [ $? = 0 ]; then echo C; else echo F; fi >"$2"'
    proc = subprocess.Popen(["sh", "-c", wrapper, "sh", args[0], str(spool / f"{{number}}.state")],
                            env=dict(os.environ, MYSCHED_JOB_ID=str(number)),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    (spool / f"{{number}}.pgid").write_text(str(proc.pid))
    print(f"Submitted job {{number}}")
elif command == "status":
    for i in args:
        if (spool / f"{{i}}.state").exists():
            print(i, state(i))
elif command == "cancel":
    if state(args[0]) in ("C", "F", "X"):
        sys.exit(f"mysched: job {{args[0]}} has already ended")
    (spool / f"{{args[0]}}.state").write_text("X")
    os.killpg(int((spool / f"{{args[0]}}.pgid").read_text()), signal.SIGTERM)
elif command == "list":
    for p in spool.glob("*.state"):
        print(p.stem)
'''

JOBS = r'''
import json, sys
from datetime import timedelta
import psij
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig

config = BatchSchedulerExecutorConfig(work_directory=sys.argv[1], queue_polling_interval=0.5,
                                      initial_queue_polling_delay=0.2)
ex = psij.JobExecutor.get_instance("ms", config=config)
out = sys.argv[1] + "/hello.txt"
hello = psij.Job(psij.JobSpec("/bin/echo", ["hello", "it's me"], stdout_path=out))
failing = psij.Job(psij.JobSpec("/bin/sh", ["-c", "exit 3"]))
sleeper = psij.Job(psij.JobSpec("/bin/sleep", ["60"]))
no_myrun = psij.Job(psij.JobSpec("/bin/true", launcher="myrun"))  # no myrun on PATH
for job in (hello, failing, sleeper, no_myrun):
    ex.submit(job)
wait = timedelta(seconds=30)
sleeper.wait(wait, target_states=[psij.JobState.ACTIVE])
listed = sleeper.native_id in ex.list()
sleeper.cancel()
report = {"class": type(ex).__module__, "listed": listed,
          "hello": str(hello.wait(wait).state), "hello_out": open(out).read(),
          "failing": [str(failing.wait(wait).state), failing.status.exit_code],
          "sleeper": str(sleeper.wait(wait).state),
          "no_myrun": [str(no_myrun.wait(wait).state), no_myrun.status.message]}
print(json.dumps(report))
'''


def test_example_package_installs_and_runs_jobs(tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--no-index", "--disable-pip-version-check",
                    "--target", str(target), str(EXAMPLE)], check=True, timeout=300)
    assert (target / "psij-descriptors" / "mysched.py").is_file()
    assert (target / "mysched_psij" / "mysched.mustache").is_file()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "mysched"
    fake.write_text(FAKE_MYSCHED.format(python=sys.executable, spool=str(tmp_path / "spool")))
    fake.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, PYTHONPATH=str(target),
               PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run([sys.executable, "-c", JOBS, str(work)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {"class": "mysched_psij.executor", "listed": True,
                      "hello": "COMPLETED", "hello_out": "hello it's me\n",
                      "failing": ["FAILED", 3], "sleeper": "CANCELED",
                      "no_myrun": ["FAILED", report["no_myrun"][1]]}
    # The launcher's check (docs/plugins.rst) gives the failure its message.
    assert "psij launcher: myrun not found on PATH" in report["no_myrun"][1]
    assert str(target) in subprocess.run(
        [sys.executable, "-c", "import mysched_psij; print(mysched_psij.__file__)"], env=env,
        capture_output=True, text=True, check=True).stdout
