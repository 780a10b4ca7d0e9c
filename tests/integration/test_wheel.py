"""The built wheel works on its own: installed into a fresh venv, it runs jobs through its
launcher scripts and finds its data files inside the installed package, not in this checkout.

The psij-python compatibility wheel (compat/psij-python) lets clients that require psij-python
install next to psij: checked in one fresh venv with a published client from the package index
(skipped, saying why, only when no index can be reached).
"""

import json
import os
import subprocess
import sys
import textwrap
import urllib.request
import zipfile
from pathlib import Path
from typing import Any, Dict

import pytest

SOURCE_ROOT = Path(__file__).resolve().parents[2]

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


def _build_wheel(source: Path, outdir: Path, pattern: str) -> Path:
    """Build the wheel of the project in ``source``: the one file matching ``pattern``."""
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(outdir),
          str(source)])
    wheels = list(outdir.glob(pattern))
    assert len(wheels) == 1, wheels
    return wheels[0]


def _fresh_venv(path: Path) -> Path:
    # Without a pip of its own the venv is made in a blink; _pip installs into it.
    _run([sys.executable, "-m", "venv", "--without-pip", str(path)])
    return path


def _pip(venv: Path, *args: str) -> "subprocess.CompletedProcess[str]":
    """This interpreter's pip, acting on ``venv``."""
    return _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                 "--disable-pip-version-check", *args])


@pytest.fixture(scope="module")
def psij_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from this checkout."""
    return _build_wheel(SOURCE_ROOT, tmp_path_factory.mktemp("wheel") / "dist", "psij-*.whl")


@pytest.fixture(scope="module")
def wheel_venv(psij_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding only the wheel built from this checkout (and its dependencies)."""
    venv = _fresh_venv(tmp_path_factory.mktemp("wheel-venv") / "venv")
    _pip(venv, "install", "--quiet", str(psij_wheel))
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
    assert f"class file: {site}/psij/executors/local/__init__.py" in plugins
    assert f"class file: {site}/psij/launchers/single.py" in plugins
    assert str(SOURCE_ROOT) not in plugins
    run = _run([psij, "run", "-n", "2", "--launcher", "multiple", "--", "/bin/echo", "hi"],
               env=env, cwd=tmp_path)
    assert run.stdout == "hi\nhi\n"


# -- the psij-python compatibility distribution (compat/psij-python) ---------------------------

# A published client that declares "Requires-Dist: psij-python" (no version constraint), and two
# published executor packages that do the same and declare StrictVersion('0.0.1').
CLIENT = "redun-psij==0.1.1"
EXECUTOR_PACKAGES = ("psij-zmq==0.5.0", "psij-rest==0.5.0")

CLIENT_SCRIPT = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    import psij
    from psij import Job, JobExecutor, JobSpec
    from psij._data import data_dir
    from redun_psij.executor import _create_job_attributes

    # redun-psij builds the attributes of a Slurm job this way (context -> slurm.comment).
    attrs = _create_job_attributes({"custom_attributes": {"slurm.qos": "debug"}},
                                   {"comment": "flow.step"}, "slurm", "align")
    slurm = JobExecutor.get_instance("slurm", config=psij.JobExecutorConfig(
        work_directory=Path(sys.argv[1])))
    script = slurm.submit_script(Job(JobSpec("/bin/true", attributes=attrs)))
    print(json.dumps({"psij_file": psij.__file__, "version": psij.__version__,
                      "data_dir": str(data_dir("launchers")),
                      "directives": [l for l in script.splitlines() if l.startswith("#SBATCH")]}))
''')


def _dist_info(wheel: Path) -> Dict[str, str]:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
        return {"names": "\n".join(names), "METADATA": z.read(metadata).decode()}


@pytest.fixture(scope="module")
def compat_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build_wheel(SOURCE_ROOT / "compat" / "psij-python",
                        tmp_path_factory.mktemp("compat") / "dist", "psij_python-*.whl")


def test_compat_wheel_is_metadata_only(compat_wheel: Path) -> None:
    import psij

    info = _dist_info(compat_wheel)
    assert all(".dist-info/" in n for n in info["names"].splitlines()), info["names"]
    metadata = info["METADATA"].splitlines()
    assert "Name: psij-python" in metadata
    assert f"Version: 0.9.11+psij.{psij.__version__}" in metadata
    assert f"Requires-Dist: psij>={psij.__version__}" in metadata


def _index_url() -> str:
    """The package index pip uses (PIP_INDEX_URL, pip's configuration, or PyPI)."""
    url = os.environ.get("PIP_INDEX_URL", "")
    if not url:
        proc = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.index-url"],
                              capture_output=True, text=True, timeout=60)
        url = proc.stdout.strip() if proc.returncode == 0 else ""
    return (url or "https://pypi.org/simple").rstrip("/")


@pytest.fixture(scope="module")
def client_venv(psij_wheel: Path, compat_wheel: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Path:
    """psij and the compatibility wheel, then the client from the package index."""
    base = tmp_path_factory.mktemp("clients")
    probe = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--dest", str(base / "probe"), CLIENT],
        capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        index = _index_url()
        try:
            with urllib.request.urlopen(f"{index}/redun-psij/", timeout=30):
                pass
        except OSError as ex:
            pytest.skip(f"no package index reachable ({index}: {ex}) to fetch {CLIENT}")
        pytest.fail(f"{index} answers but pip could not fetch {CLIENT}:\n{probe.stderr}")
    # What makes the test meaningful: the client does require psij-python.
    (client,) = (base / "probe").glob("*.whl")
    assert "Requires-Dist: psij-python" in _dist_info(client)["METADATA"].splitlines()
    venv = _fresh_venv(base / "venv")
    _pip(venv, "install", "--quiet", str(psij_wheel), str(compat_wheel))
    _pip(venv, "install", "--quiet", CLIENT)
    return venv


def test_client_requiring_psij_python_installs_next_to_psij(client_venv: Path,
                                                            tmp_path: Path) -> None:
    import psij

    installed = {d["name"].lower().replace("_", "-"): d["version"] for d in json.loads(
        _pip(client_venv, "list", "--format", "json").stdout)}
    assert installed["psij-python"] == f"0.9.11+psij.{psij.__version__}"
    assert installed["psij"] == psij.__version__ and "redun-psij" in installed
    assert "No broken requirements found." in _pip(client_venv, "check").stdout

    env = dict(os.environ, HOME=str(tmp_path))
    env.pop("PYTHONPATH", None)
    proc = _run([str(client_venv / "bin" / "python"), "-c", CLIENT_SCRIPT, str(tmp_path / "w")],
                env=env, cwd=tmp_path)
    report = json.loads(proc.stdout.splitlines()[-1])
    site = _site_packages(client_venv)
    assert Path(report["psij_file"]) == site / "psij" / "__init__.py"
    assert report["version"] == psij.__version__
    assert Path(report["data_dir"]) == site / "psij" / "_data" / "launchers"
    assert {'#SBATCH --job-name="align"', '#SBATCH --comment="flow.step"',
            '#SBATCH --qos="debug"'} <= set(report["directives"])
    command = _run([str(client_venv / "bin" / "psij"), "run", "--", "/bin/echo", "hi"],
                   env=env, cwd=tmp_path)
    assert command.stdout == "hi\n"


def test_executor_packages_requiring_psij_python_resolve_and_are_listed(
        client_venv: Path, tmp_path: Path) -> None:
    # pip's resolver takes the compatibility wheel for their "psij-python" requirement...
    report = tmp_path / "report.json"
    _pip(client_venv, "install", "--quiet", "--dry-run", "--report", str(report),
         *EXECUTOR_PACKAGES)
    would_install = {i["metadata"]["name"].lower()
                     for i in json.loads(report.read_text())["install"]}
    assert {"psij-zmq", "psij-rest"} <= would_install
    assert "psij-python" not in would_install and "psij" not in would_install
    # ... and psij lists the executors they declare with StrictVersion('0.0.1').
    target = tmp_path / "plugins"
    _pip(client_venv, "install", "--quiet", "--no-deps", "--target", str(target),
         *EXECUTOR_PACKAGES)
    env = dict(os.environ, HOME=str(tmp_path), PYTHONPATH=str(target))
    listing = _run([str(client_venv / "bin" / "psij"), "plugins"], env=env, cwd=tmp_path).stdout
    assert "\n  zmq 0.0.1\n" in listing and "\n  rest 0.0.1\n" in listing
    assert "Broken descriptor files:\n  (none)" in listing
