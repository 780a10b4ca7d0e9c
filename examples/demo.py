"""A short tour of the local executor: run a few jobs and print what they wrote.

Run with ``make demo`` (or ``python examples/demo.py`` where psij is installed).
"""

import tempfile
from pathlib import Path

import psij
from psij import Job, JobExecutor, JobSpec, ResourceSpecV1


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="psij-demo-"))
    ex = JobExecutor.get_instance("local")
    print(f"psij {psij.__version__}, executor {ex.name} {ex.version}, files in {work}")

    hello = Job(JobSpec("/bin/echo", ["hello from a psij job"], stdout_path=work / "hello.out"))
    hello.set_job_status_callback(lambda job, st: print(f"  hello -> {st.state}"))
    ex.submit(hello)
    hello.wait()
    print("hello wrote:", (work / "hello.out").read_text().strip())

    three = Job(JobSpec("/bin/sh", ["-c", 'echo "copy $_PSI_J_PROCESS_INDEX_ on $(hostname)"'],
                        launcher="multiple", resources=ResourceSpecV1(process_count=3),
                        stdout_path=work / "three.out"))
    ex.submit(three)
    print("three copies ->", three.wait())
    print((work / "three.out").read_text().strip())

    failing = Job(JobSpec("/bin/sh", ["-c", "echo 'no input file' >&2; exit 3"],
                          stderr_path=work / "failing.err"))
    ex.submit(failing)
    status = failing.wait()
    assert status is not None
    print(f"failing job -> {status.state}, exit code {status.exit_code}: {status.message}")

    jobs = [Job(JobSpec("/bin/sh", ["-c", f"echo {i * i}"], stdout_path=work / f"sq{i}.out"))
            for i in range(10)]
    for j in jobs:
        ex.submit(j)
    for j in jobs:
        j.wait()
    squares = [(work / f"sq{i}.out").read_text().strip() for i in range(10)]
    print("ten jobs at once wrote:", " ".join(squares))


if __name__ == "__main__":
    main()
