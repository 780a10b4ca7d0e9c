"""The built wheel works on its own: installed into a fresh venv, it runs jobs through its
launcher scripts and finds its data files inside the installed package, not in this checkout.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict

import pytest

SOURCE_ROOT = Path(__file__).resolve().parents[1]

JOB_SCRIPT = textwrap.dedent('''
    import json, sys
    from pathlib import Path

    import psij
    from psij import Job, JobExecutor, JobExecutorConfig, JobSpec, ResourceSpecV1
    from psij._data import data_dir

    work = Path(sys.argv[1])
    config = JobExecutorConfig(work_directory=work / "psij-work",
                               launcher_log_file=work / "launcher.log")
    ex = JobExecutor.get_instance("local", config=config)
    (work / "pre.sh").write_text("export FROM_PRE_LAUNCH='set by pre-launch'\\n")
    results = {}
    for launcher, n in (("single", None), ("multiple", 2)):
        spec = JobSpec(executable="/bin/sh",
                       arguments=["-c", 'echo "$FROM_PRE_LAUNCH ${_PSI_J_PROCESS_INDEX_:-}"; '
                                        'echo to-stderr >&2'],
                       directory=work, pre_launch="pre.sh", launcher=launcher,
                       stdout_path=f"{launcher}.out", stderr_path=f"{launcher}.err",
                       resources=None if n is None else ResourceSpecV1(process_count=n))
        job = Job(spec)
        ex.submit(job)
        status = job.wait()
        results[launcher] = {
            "state": str(status.state), "exit_code": status.exit_code,
            "message": status.message,
            "stdout": (work / f"{launcher}.out").read_text(),
            "stderr": (work / f"{launcher}.err").read_text(),
        }
    launchers = data_dir("launchers")
    print(json.dumps({
        "psij_file": psij.__file__,
        "launchers_dir": str(launchers),
        "launcher_files": sorted(p.name for p in launchers.iterdir()),
        "templates_dir": str(Path(psij.__file__).parent / "_data" / "templates"),
        "deployed": sorted(str(p.relative_to(work)) for p in
                           (work / "psij-work").rglob("*_launch.sh")),
        "log": (work / "launcher.log").read_text(),
        "jobs": results,
    }))
''')


def _run(argv: Any, **kw: Any) -> "subprocess.CompletedProcess[str]":
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, **kw)
    assert proc.returncode == 0, f"{argv} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding only the wheel built from this checkout (and its dependencies)."""
    base = tmp_path_factory.mktemp("wheel")
    dist = base / "dist"
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist),
          str(SOURCE_ROOT)])
    wheels = list(dist.glob("psij-*.whl"))
    assert len(wheels) == 1, wheels
    venv = base / "venv"
    # Without a pip of its own the venv is made in a blink; this pip installs into it.
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
          "--quiet", "--disable-pip-version-check", str(wheels[0])])
    return venv


@pytest.fixture(scope="module")
def job_report(wheel_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    work = tmp_path_factory.mktemp("wheel-jobs")
    env = dict(os.environ, HOME=str(work / "home"))
    env.pop("PYTHONPATH", None)
    proc = _run([str(wheel_venv / "bin" / "python"), "-c", JOB_SCRIPT, str(work)], cwd=work,
                env=env)
    report: Dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    report["work"] = str(work)
    return report


def _site_packages(venv: Path) -> Path:
    found = list((venv / "lib").glob("python3*/site-packages"))
    assert len(found) == 1, found
    return found[0]


def test_installed_package_is_used_not_the_checkout(wheel_venv: Path,
                                                    job_report: Dict[str, Any]) -> None:
    site = _site_packages(wheel_venv)
    assert Path(job_report["psij_file"]) == site / "psij" / "__init__.py"
    assert Path(job_report["launchers_dir"]) == site / "psij" / "_data" / "launchers"


def test_launcher_scripts_ship_in_the_wheel(job_report: Dict[str, Any]) -> None:
    source = sorted(p.name for p in (SOURCE_ROOT / "launchers").iterdir() if p.is_file())
    assert "launcher_lib.sh" in source and "single_launch.sh" in source
    assert job_report["launcher_files"] == source


def test_templates_ship_in_the_wheel(job_report: Dict[str, Any]) -> None:
    source_dir = SOURCE_ROOT / "templates"
    source = sorted(str(p.relative_to(source_dir)) for p in source_dir.rglob("*") if p.is_file())
    installed_dir = Path(job_report["templates_dir"])
    installed = sorted(str(p.relative_to(installed_dir)) for p in installed_dir.rglob("*")
                       if p.is_file()) if installed_dir.is_dir() else []
    assert installed == source


@pytest.mark.parametrize("launcher, copies", [("single", 1), ("multiple", 2)])
def test_job_runs_through_the_installed_launcher_script(job_report: Dict[str, Any],
                                                        launcher: str, copies: int) -> None:
    job = job_report["jobs"][launcher]
    assert (job["state"], job["exit_code"], job["message"]) == ("COMPLETED", 0, None)
    if launcher == "single":
        assert job["stdout"] == "set by pre-launch \n"
    else:
        assert sorted(job["stdout"].splitlines()) == ["set by pre-launch 1",
                                                      "set by pre-launch 2"]
    assert job["stderr"] == "to-stderr\n" * copies
    # The scripts were deployed from the installed package and are the ones that ran.
    script = {"single": "single_launch.sh", "multiple": "multi_launch.sh"}[launcher]
    deployed = [d for d in job_report["deployed"] if d.endswith("/" + script)]
    assert len(deployed) == 1
    assert f"{job_report['work']}/{deployed[0]} started" in job_report["log"]


def test_console_script_of_the_wheel(wheel_venv: Path, tmp_path: Path) -> None:
    env = dict(os.environ, HOME=str(tmp_path))
    env.pop("PYTHONPATH", None)
    psij = str(wheel_venv / "bin" / "psij")
    plugins = _run([psij, "plugins"], env=env, cwd=tmp_path).stdout
    site = _site_packages(wheel_venv)
    assert f"class file: {site}/psij/executors/local.py" in plugins
    assert f"class file: {site}/psij/launchers/single.py" in plugins
    assert str(SOURCE_ROOT) not in plugins
    run = _run([psij, "run", "-n", "2", "--launcher", "multiple", "--", "/bin/echo", "hi"],
               env=env, cwd=tmp_path)
    assert run.stdout == "hi\nhi\n"
