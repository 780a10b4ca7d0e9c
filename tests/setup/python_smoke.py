"""The smoke check of one supported Python (tests/setup/pythons.sh): run by the interpreter of
a fresh virtual environment into which psij was installed from the checkout (``pip install
.``), in an empty directory that is also ``HOME``. It checks that the interpreter is the one
asked for, that psij is the installed copy (not the checkout) with its data files, that every
module of psij imports on this Python (annotations and other constructs evaluated at import
time included), that a local job runs through the bare path and through a launcher script,
and that the ``psij`` command runs a job and prints a batch script from the installed
templates. It prints what it checked, one line each, and exits 1 at the first failure.

Usage: python python_smoke.py X.Y CHECKOUT
"""

import importlib
import os
import pkgutil
import subprocess
import sys
from pathlib import Path
from typing import List


def fail(what: str) -> None:
    print(f"FAILED: {what}", flush=True)
    sys.exit(1)


def check_interpreter(expected: str) -> None:
    running = "{}.{}".format(*sys.version_info[:2])
    if running != expected:
        fail(f"this is Python {running}, not {expected}")
    if sys.prefix == sys.base_prefix:
        fail(f"{sys.executable} is not in a virtual environment")
    print(f"ok: Python {sys.version.split()[0]} ({sys.executable})")


def check_installed_copy(checkout: Path) -> None:
    import psij
    from psij._data import data_dir

    where = Path(psij.__file__).resolve()
    if checkout in where.parents:
        fail(f"psij was imported from the checkout ({where}), not from the installed wheel")
    templates = where.parent / "_data" / "templates"
    launchers = data_dir("launchers")
    if not (templates / "slurm.mustache").is_file():
        fail(f"the installed package has no templates ({templates})")
    if checkout in launchers.resolve().parents or not any(launchers.iterdir()):
        fail(f"the launcher scripts are not those of the installed package ({launchers})")
    print(f"ok: psij {psij.__version__} installed in {where.parent}, with its data files")


def check_every_module_imports() -> None:
    import psij

    failed: List[str] = []
    count = 0
    for module in pkgutil.walk_packages(psij.__path__, "psij.",
                                        onerror=lambda name: failed.append(name)):
        if module.name.rsplit(".", 1)[-1] == "__main__":
            continue  # runs the command line when imported
        count += 1
        try:
            importlib.import_module(module.name)
        except Exception as e:
            failed.append(f"{module.name}: {e!r}")
    if failed:
        fail("modules that do not import:\n  " + "\n  ".join(failed))
    print(f"ok: all {count} modules of psij import")


def check_local_jobs(work: Path) -> None:
    from psij import Job, JobExecutor, JobExecutorConfig, JobSpec, JobState, ResourceSpecV1

    ex = JobExecutor.get_instance("local", config=JobExecutorConfig(
        work_directory=work / "psij-work"))
    for launcher, processes in (("single", 1), ("multiple", 2)):
        out = work / f"{launcher}.out"
        job = Job(JobSpec("/bin/echo", ["smoke"], directory=work, stdout_path=out,
                          launcher=launcher,
                          resources=ResourceSpecV1(process_count=processes)))
        ex.submit(job)
        status = job.wait(timeout=120)
        if status is None or status.state is not JobState.COMPLETED:
            fail(f"a local job ({launcher} launcher) ended {status}")
        if out.read_text().split() != ["smoke"] * processes:
            fail(f"a local job ({launcher} launcher) wrote {out.read_text()!r}")
    print("ok: local jobs ran (single launcher, multiple launcher with 2 processes)")


def check_command(work: Path) -> None:
    psij_command = Path(sys.executable).parent / "psij"
    ran = subprocess.run([str(psij_command), "run", "/bin/echo", "ok"], cwd=str(work),
                         capture_output=True, text=True, timeout=120)
    if ran.returncode != 0 or ran.stdout.strip() != "ok":
        fail(f"`psij run /bin/echo ok` exited {ran.returncode}, printed {ran.stdout!r}, "
             f"{ran.stderr!r}")
    shown = subprocess.run([str(psij_command), "script", "--executor", "slurm", "/bin/true"],
                           cwd=str(work), capture_output=True, text=True, timeout=120)
    if shown.returncode != 0 or "#SBATCH" not in shown.stdout:
        fail(f"`psij script --executor slurm /bin/true` exited {shown.returncode}: "
             f"{shown.stderr!r}")
    print("ok: `psij run /bin/echo ok` printed ok; `psij script` printed a Slurm script")


def main(argv: List[str]) -> None:
    if len(argv) != 3:
        fail("usage: python_smoke.py X.Y CHECKOUT")
    work = Path(os.getcwd())
    check_interpreter(argv[1])
    check_installed_copy(Path(argv[2]).resolve())
    check_every_module_imports()
    check_local_jobs(work)
    check_command(work)


if __name__ == "__main__":
    main(sys.argv)
