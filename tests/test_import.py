"""``import psij`` loads nothing but the package; public names load on first use.

Every check runs in a fresh interpreter and looks at ``sys.modules``, never at time.
"""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psij

# Modules ``import psij`` used to pull in, and heavier ones an executor needs.
HEAVY = ["psij.job", "psij.job_spec", "psij.job_executor", "psij.job_launcher", "psij._check",
         "psij._plugins", "psij.descriptor", "psij.serialize", "psij.staging", "psij.executors",
         "typing", "threading", "pathlib", "datetime", "re", "enum", "json", "logging", "uuid",
         "subprocess", "dataclasses", "inspect", "typeguard", "packaging", "packaging.version",
         "sqlite3", "psij.registry", "psij._registry.store", "asyncio", "psij._job_async",
         "tqdm", "psij.cli._wait_progress", "psij.report", "psij.cli._report", "matplotlib",
         "numpy"]


def run_fresh(code: str, cwd: Path) -> Any:
    """Run ``code`` in a new interpreter and return the JSON it prints last."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=cwd, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_psij_loads_only_the_package_and_its_version(tmp_path: Path) -> None:
    added = run_fresh(
        "import sys, json\n"
        "bare = set(sys.modules)\n"
        "import psij\n"
        "print(json.dumps(sorted(set(sys.modules) - bare)))\n", tmp_path)
    assert added == ["psij", "psij.version"]


def test_import_psij_loads_none_of_the_heavy_modules(tmp_path: Path) -> None:
    loaded = run_fresh(
        "import sys\n"
        "bare = set(sys.modules)\n"
        "import psij\n"
        f"heavy = {HEAVY!r}\n"
        "new = [m for m in heavy if m in sys.modules and m not in bare]\n"
        "print(repr(new).replace(\"'\", '\"'))\n", tmp_path)
    assert loaded == []


def test_a_public_name_loads_its_module_on_first_use(tmp_path: Path) -> None:
    seen = run_fresh(
        "import sys, json, psij\n"
        "before = 'psij.job_spec' in sys.modules\n"
        "spec = psij.JobSpec(executable='/bin/true')\n"
        "print(json.dumps([before, 'psij.job_spec' in sys.modules, type(spec).__module__,\n"
        "                  'JobSpec' in vars(psij)]))\n", tmp_path)
    assert seen == [False, True, "psij.job_spec", True]


def test_reference_style_imports_work_in_a_fresh_interpreter(tmp_path: Path) -> None:
    names = run_fresh(
        "import json\n"
        "from psij import Job, JobExecutor, JobSpec\n"
        "import psij.executors.local\n"
        "import psij\n"
        "from psij import *\n"
        "assert Job is psij.job.Job and JobSpec is psij.job_spec.JobSpec\n"
        "assert issubclass(psij.executors.local.LocalJobExecutor, JobExecutor)\n"
        "print(json.dumps(sorted(n for n in psij.__all__ if n in globals())))\n", tmp_path)
    assert names == sorted(psij.__all__)


def test_every_public_name_is_its_defining_module_object() -> None:
    for name in psij.__all__:
        value = getattr(psij, name)
        if name != "__version__":
            module = sys.modules[value.__module__]
            assert getattr(module, name) is value, name


def test_dir_lists_the_public_names_before_they_are_loaded(tmp_path: Path) -> None:
    listed = run_fresh(
        "import json, psij\n"
        "print(json.dumps([n for n in psij.__all__ if n not in dir(psij)]))\n", tmp_path)
    assert listed == []


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    try:
        psij.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("psij.NoSuchThing did not raise")


def test_private_submodules_still_import_by_from_import(tmp_path: Path) -> None:
    names = run_fresh(
        "import json\n"
        "from psij import _check, job_state\n"
        "print(json.dumps([_check.__name__, job_state.__name__]))\n", tmp_path)
    assert names == ["psij._check", "psij.job_state"]


# Modules whose import is measured (bench/ and the performance guide): none may make a
# typing.ForwardRef (a quoted name inside a subscript, or a TypeVar bound given as text) when
# it is imported, since the first one compiles its text and so sets up the AST types, some
# nine million instructions, more than 5% of importing the pilot's engine.
MEASURED = ["psij.executors.pilot.engine", "psij.executors.local", "psij.executors.batch.slurm",
            "psij.executors.batch.sge", "psij._registry.recorder"]


def test_importing_an_executor_makes_no_forward_reference(tmp_path: Path) -> None:
    made = run_fresh(
        "import json, sys, typing\n"
        "made = []\n"
        "init = typing.ForwardRef.__init__\n"
        "def counting(self, arg, *more, **named):\n"
        "    made.append(arg)\n"
        "    init(self, arg, *more, **named)\n"
        "typing.ForwardRef.__init__ = counting\n"
        f"for name in {MEASURED!r}:\n"
        "    __import__(name)\n"
        "print(json.dumps(made))\n", tmp_path)
    assert made == []


def test_the_pilot_engine_loads_datetime_and_its_inline_tasks_only_when_used(
        tmp_path: Path) -> None:
    loaded = run_fresh(
        "import json, sys\n"
        "import psij.executors.pilot.engine\n"
        "print(json.dumps([m for m in ('datetime', 'psij.executors.pilot._inline_tasks')\n"
        "                  if m in sys.modules]))\n", tmp_path)
    assert loaded == []


def test_checks_of_durations_take_a_timedelta_once_datetime_is_loaded() -> None:
    from datetime import timedelta

    from psij import _check
    assert _check._MAX_TIMEDELTA_SECONDS == timedelta.max.total_seconds()
    assert _check.duration("d", timedelta(seconds=5)) == timedelta(seconds=5)
    assert _check.duration("d", 5) == timedelta(seconds=5)
    assert _check.timeout("t", timedelta(seconds=-1)) == 0.0
    assert _check.seconds("s", timedelta(milliseconds=1500)) == 1.5
    assert not _check._is_timedelta(1.5)


def test_the_local_executor_loads_logging_only_when_it_logs(tmp_path: Path) -> None:
    loaded = run_fresh(
        "import json, sys\n"
        "import psij.executors.local\n"
        "before = 'logging' in sys.modules\n"
        "from psij.executors.local import _executor\n"
        "_executor.logger.isEnabledFor(30)\n"
        "print(json.dumps([before, 'logging' in sys.modules]))\n", tmp_path)
    assert loaded == [False, True]
