"""How the tests are laid out: a test module at the top of tests/ is named after the source
module or package it tests (``test_<package>_<module>[_<aspect>].py``, with the executor
families named without ``executors``: ``test_batch_runner.py`` for
``psij/executors/batch/_runner.py``); tests of several modules together are in
``integration/``, ``real/`` and ``benchmarks/``; what the tests share is in the ``support``
package; and the private modules no test is named after or imports are exactly the listed ones,
each with the tests that reach it through another module."""

import ast
from pathlib import Path
from typing import Dict, Iterator, Set

import pytest

import psij
from support import collection_map
from support.renames import HELPERS, TEST_MODULES

TESTS = Path(__file__).resolve().parent
SRC = Path(psij.__file__).resolve().parent
FAMILIES = ("batch", "local", "pilot")
FOLDERS = ("integration", "real", "benchmarks")

# Tests of the psij package as a whole, named after what they check of it.
WHOLE_PACKAGE = {"test_import.py", "test_import_cycles.py", "test_package_layout.py",
                 "test_tests_layout.py", "test_time_rules.py"}

# Private modules that no test module is named after or imports, and the tests that reach them
# through the module that uses them.
COVERED_THROUGH: Dict[str, str] = {
    "psij._pids": "process start times (test_executors_process.py, test_registry_held.py)",
    "psij._priority": "use_nice and set_priority (test_batch_nice.py, "
                      "test_batch_priority_change.py, test_cli_priority.py)",
    "psij._registry.run_records": "the runs table read back as RunRecord "
                                  "(test_registry_runs.py)",
    "psij._reexports": "names offered on first use (integration/test_reference_modules.py, "
                       "integration/test_reference_surface.py)",
    "psij.cli._broken_pipe": "psij piped to a reader that stops early "
                             "(integration/test_first_hour_bugs.py)",
    "psij.cli._common": "the exit codes and statuses of every command (test_cli.py)",
    "psij.cli._config": "psij config (test_site_config.py)",
    "psij.cli._runs": "psij status --runs, table and JSON (test_registry_runs.py)",
    "psij.cli._flow": "psij flow (test_flows_service.py)",
    "psij.cli._job_options": "the job options of psij run/submit/script (test_cli.py)",
    "psij.cli._job_streams": "psij run's own streams (test_cli_run_logs.py)",
    "psij.cli._plugins": "psij plugins (test_cli.py, test_plugins.py)",
    "psij.cli._script": "psij script (test_cli.py)",
    "psij.cli._supervise": "psij supervise (test_supervise_run.py)",
    "psij.controller._io": "the controller loop's workers (test_controller_loop.py)",
    "psij.executors.batch._aux_files": "the files a batch job leaves beside its script "
                                       "(test_batch_scheduler_executor.py, test_batch_kill.py)",
    "psij.executors.batch._cancel_output": "failed cancel commands "
                                           "(test_batch_scheduler_executor.py, "
                                           "test_batch_sites_outputs.py)",
    "psij.executors.batch._command": "the command runner (test_batch_runner.py)",
    "psij.executors.batch._environ": "spare submit commands and slurmrestd "
                                     "(test_batch_spares.py, test_batch_slurm_rest.py)",
    "psij.executors.batch._figures_sge": "qacct's figures of a run (test_batch_figures.py, "
                                         "real/test_batch_figures_real.py)",
    "psij.executors.batch._named_jobs": "submissions stopped for good "
                                        "(test_batch_runner.py, test_batch_scheduler_executor.py)",
    "psij.executors.batch._status_table": "canned status outputs (test_batch_states.py, "
                                          "test_batch_sites_outputs.py)",
    "psij.executors.local._checks": "texts no process can receive (test_local_faults.py)",
    "psij.executors.local._env": "local jobs' environments (test_local.py)",
    "psij.executors.local._prepared": "local jobs run for real (test_local.py)",
    "psij.executors.local._keeper_kills": "the keeper's signals and KILLs "
                                          "(test_local_keeper.py, test_local_keeper_faults.py)",
    "psij.executors.local._start": "jobs handed to keepers (test_local_keeper.py)",
    "psij.executors.local._transfer": "local staging (test_staging.py)",
    "psij.executors.pilot._engine_output": "the engine's events and journal "
                                           "(test_pilot_engine.py, test_pilot_engine_events.py)",
    "psij.executors.pilot._orphans": "workers killed outright "
                                     "(test_pilot_local_workers_faults.py)",
    "psij.executors.pilot._run_dir": "the pilot's run folders (test_pilot_engine.py, "
                                     "integration/test_lifecycle.py)",
    "psij.executors.pilot._scheduler_values": "the pilot scheduler's events and actions "
                                              "(test_pilot_scheduler_order.py, "
                                              "test_machine.py)",
    "psij.executors.pilot._serve_options": "psij pilot serve (test_pilot_executor.py)",
    "psij.executors.pilot._shape_queue": "the pilot's scheduler (test_pilot_scheduler_order.py)",
    "psij.executors.pilot._staging": "pilot staging (test_staging.py)",
    "psij.executors.pilot._task_books": "the engine's task states (test_pilot_engine.py)",
    "psij.executors.pilot._worker": "the pilot's workers (test_pilot_local_workers_faults.py)",
    "psij.executors.pilot.qcg._books": "request files run end to end (test_pilot_qcg.py, "
                                       "test_pilot_qcg_like_qcg.py)",
    "psij.flows._flow_config": "the flow machine's limits (test_flows_machine.py)",
    "psij.flows._requests": "bad flow requests (test_flows_machine_rules.py)",
    "psij.flows._throttle": "throttled starts (test_flows_machine_rules.py)",
    "psij.supervise._config": "psij supervise's configuration (test_supervise_run.py)",
    "psij.supervise._entries": "the supervisor's records (test_supervise_machine.py)",
    "psij.supervise._lookups": "submissions of unknown outcome (test_supervise_machine.py)",
}


def source_modules() -> Dict[str, Path]:
    """Dotted name -> file of every module of psij (``__main__`` left out)."""
    modules = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__main__":
            continue
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def expected_test_name(module: str) -> str:
    """The name part of the test module of ``module`` (``psij.executors.batch._runner`` ->
    ``batch_runner``): leading underscores dropped, ``executors`` dropped before an executor
    family, a package's name not repeated at the start of its module's."""
    parts = module.split(".")[1:]
    if len(parts) >= 2 and parts[0] == "executors" and parts[1] in FAMILIES:
        parts = parts[1:]
    words: list = []
    for part in parts:
        part = part.lstrip("_")
        if words and part.startswith(words[-1] + "_"):
            part = part[len(words[-1]) + 1:]
        words.append(part)
    return "_".join(words)




def imported_names(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def named_after(stem: str, name: str) -> bool:
    return bool(name) and (stem == name or stem.startswith(name + "_"))


def test_every_top_test_module_is_named_after_a_module_or_package_of_psij() -> None:
    names = {expected_test_name(module) for module in source_modules()}
    unnamed = [path.name for path in sorted(TESTS.glob("test_*.py"))
               if path.name not in WHOLE_PACKAGE
               and not any(named_after(path.stem[len("test_"):], name) for name in names)]
    assert unnamed == [], f"named after no module of psij: {unnamed}"


def test_the_top_folder_holds_only_test_modules_and_conftest() -> None:
    others = sorted(path.name for path in TESTS.glob("*.py")
                    if path.name != "conftest.py" and not path.name.startswith("test_"))
    assert others == [], f"helpers belong in tests/support: {others}"
    for folder in (*FOLDERS, "support"):
        assert (TESTS / folder / "__init__.py").is_file(), folder


@pytest.mark.parametrize("folder", FOLDERS)
def test_folders_of_tests_hold_test_modules_only(folder: str) -> None:
    others = sorted(path.name for path in (TESTS / folder).glob("*.py")
                    if path.name != "__init__.py" and not path.name.startswith("test_"))
    assert others == []


def test_helpers_are_imported_from_the_support_package_only() -> None:
    helpers = {Path(old).stem for old in HELPERS if old.endswith(".py")}
    helpers |= {Path(new).stem for new in HELPERS.values()} - {"README"}
    helpers.discard("executor_test_params")  # psij-python's own, on its suite's path
    bare = sorted(f"{path.relative_to(TESTS)}: {name}"
                  for path in TESTS.rglob("*.py") if "psij_python_harness" not in path.parts
                  for name in imported_names(path) if name.split(".")[0] in helpers)
    assert bare == []


def test_the_private_modules_no_test_names_or_imports_are_the_listed_ones() -> None:
    modules = source_modules()
    test_files = [path for path in TESTS.rglob("test_*.py")]
    imported: Set[str] = set()
    for path in test_files:
        imported.update(imported_names(path))
    named = {module for module in modules for path in test_files
             if named_after(path.stem[len("test_"):], expected_test_name(module))}
    private = [module for module in modules
               if any(part.startswith("_") for part in module.split("."))]
    untested = sorted(module for module in private if module not in named
                      and not any(name == module or name.startswith(module + ".")
                                  for name in imported))
    assert untested == sorted(COVERED_THROUGH), (
        "a private module gained a test (take it off COVERED_THROUGH) or lost its last one")


def test_every_renamed_test_module_is_where_the_table_says() -> None:
    for old, new in {**HELPERS, **TEST_MODULES}.items():
        assert (TESTS / new).is_file(), new
        assert not (TESTS / old).exists(), old


def test_collected_ids_map_through_the_rename_table(tmp_path: Path) -> None:
    renames = {"test_a.py": "real/test_a.py"}
    before = ["tests/test_a.py::test_x[1]", "tests/test_b.py::TestC::test_y"]
    after = ["tests/test_b.py::TestC::test_y", "tests/real/test_a.py::test_x[1]"]
    assert collection_map.compare(before, after, renames).equal
    lost = collection_map.compare(before, after[:1], renames)
    assert lost.lost == ["tests/real/test_a.py::test_x[1]"] and not lost.equal
    new = collection_map.compare(before[1:], after, renames)
    assert new.new == ["tests/real/test_a.py::test_x[1]"] and not new.equal
    assert not collection_map.compare(before, before + before[:1], renames).equal


def test_the_collection_map_reads_collect_only_output_and_fails_on_a_difference(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    old, moved = next(iter(TEST_MODULES.items()))
    before = tmp_path / "before.txt"
    before.write_text(f"tests/{old}::test_one\ntests/test_job.py::test_two\n\n2 tests collected\n")
    after = tmp_path / "after.txt"
    after.write_text(f"tests/test_job.py::test_two\ntests/{moved}::test_one\n\n2 tests collected\n")
    assert collection_map.main([str(before), str(after)]) == 0
    after.write_text("tests/test_job.py::test_two\n")
    assert collection_map.main([str(before), str(after)]) == 1
    assert f"lost: tests/{moved}::test_one" in capsys.readouterr().out
    empty = tmp_path / "empty.txt"
    empty.write_text("no tests ran\n")
    assert collection_map.main([str(empty), str(empty)]) == 1
