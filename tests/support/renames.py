"""Where each test module and helper of the former flat tests/ folder went, as paths relative
to tests/ (old name -> new name). Read by :mod:`support.collection_map`, which maps the test
ids collected before the move onto the ids collected after it; it imports nothing else."""

from typing import Dict

# Test helpers: one support package, imported as ``from support.NAME import ...`` everywhere.
HELPERS: Dict[str, str] = {
    "_batch_sites.py": "support/batch_sites.py",
    "_launchers.py": "support/launchers.py",
    "_pilot_tasks.py": "support/pilot_tasks.py",
    "fake_site_scheduler.py": "support/fake_site_scheduler.py",
    "fake_slurm.py": "support/fake_slurm.py",
    "flow_helpers.py": "support/flow_helpers.py",
    "flow_sim.py": "support/flow_sim.py",
    "hostile_lines.py": "support/hostile_lines.py",
    "local_users.py": "support/local_users.py",
    "process_checks.py": "support/process_checks.py",
    "supervise_study.py": "support/supervise_study.py",
    "psij_python_harness/README.md": "real/psij_python_harness/README.md",
    "psij_python_harness/_test_tools.py": "real/psij_python_harness/_test_tools.py",
    "psij_python_harness/executor_test_params.py":
        "real/psij_python_harness/executor_test_params.py",
    "psij_python_harness/psij_python_options.py":
        "real/psij_python_harness/psij_python_options.py",
}

# Test modules of one source module: tests/test_<package>_<module>[_<aspect>].py.
UNIT: Dict[str, str] = {
    "test_batch_backend_styles.py": "test_batch_scheduler_executor_styles.py",
    "test_batch_executor.py": "test_batch_scheduler_executor.py",
    "test_batch_held.py": "test_batch_held_jobs.py",
    "test_batch_mustache.py": "test_scripts_mustache.py",
    "test_batch_os_texts.py": "test_executors_os_texts.py",
    "test_batch_quoting.py": "test_scripts_quoting.py",
    "test_batch_scripts.py": "test_scripts_generator.py",
    "test_batch_test_executor.py": "test_batch_test.py",
    "test_staging_scripts.py": "test_scripts_generator_staging.py",
    "test_staging_sites.py": "test_batch_sites_staging.py",
    "test_cli_progress.py": "test_cli_wait_progress.py",
    "test_flow_executor.py": "test_flows_executor.py",
    "test_flow_files.py": "test_flows_journal.py",
    "test_flow_machine.py": "test_flows_machine.py",
    "test_flow_machine_rules.py": "test_flows_machine_rules.py",
    "test_flow_service.py": "test_flows_service.py",
    "test_flow_users.py": "test_flows_service_users.py",
    "test_gpu_detection.py": "test_executors_gpu_detect.py",
    "test_process_layer.py": "test_executors_process.py",
    "test_launchers_deploy.py": "test_launchers_script_based_launcher.py",
    "test_local_journal_files.py": "test_local_journal.py",
    "test_local_keepers_faults.py": "test_local_keeper_faults.py",
    "test_local_pool_executor.py": "test_local_pool_driver.py",
    "test_log_environment.py": "test_lazylog.py",
    "test_machine_shape.py": "test_machine.py",
    "test_pilot_clock.py": "test_pilot_engine_clock.py",
    "test_pilot_workers_faults.py": "test_pilot_local_workers_faults.py",
    "test_spawn_layer.py": "test_spawn.py",
    "test_values.py": "test_record.py",
}

# Tests of several modules together, run in-process or as users run psij.
INTEGRATION: Dict[str, str] = {name: f"integration/{name}" for name in (
    "test_bad_input.py",
    "test_custom_attributes.py",
    "test_docs_examples.py",
    "test_durations.py",
    "test_failure_wording.py",
    "test_first_hour_bugs.py",
    "test_lifecycle.py",
    "test_model.py",
    "test_plugin_example.py",
    "test_plugin_reference_launcher.py",
    "test_wheel.py",
)}

# Suites that need the real Slurm and Grid Engine of tests/setup (they skip without them).
REAL: Dict[str, str] = {name: f"real/{name}" for name in (
    "test_batch_arrays_real.py",
    "test_batch_held_slurm.py",
    "test_batch_multinode_real.py",
    "test_batch_out_of_memory_real.py",
    "test_batch_priority_real.py",
    "test_batch_real.py",
    "test_batch_scheduler_holds_real.py",
    "test_batch_signals_real.py",
    "test_batch_slurm_rest_real.py",
    "test_batch_submission_control_real.py",
    "test_batch_unstartable_real.py",
    "test_flow_real.py",
    "test_pilot_nodes_real.py",
    "test_pilot_real.py",
    "test_psij_python_suite_real.py",
    "test_registry_full.py",
    "test_staging_real.py",
    "test_supervise_sge.py",
    "test_supervise_slurm.py",
)}

# The tests of bench/: each runs a benchmark script at a tiny size.
BENCHMARKS: Dict[str, str] = {name: f"benchmarks/{name}" for name in (
    "test_bench_batch.py",
    "test_bench_holding.py",
    "test_bench_pilot_nodes.py",
    "test_bench_scale.py",
    "test_bench_smoke.py",
    "test_flow_machine_bench.py",
    "test_supervise_bench.py",
)}

TEST_MODULES: Dict[str, str] = {**UNIT, **INTEGRATION, **REAL, **BENCHMARKS}
RENAMES: Dict[str, str] = {**HELPERS, **TEST_MODULES}

# Test modules new with the move (their ids have no old id to map from).
ADDED = ("test_tests_layout.py",)
