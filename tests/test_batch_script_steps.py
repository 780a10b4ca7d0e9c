"""The inputs of the script steps of a batch submission (``psij.executors.batch._script_steps``):
one ``ScriptInputs`` per executor and configuration, made again when what it depends on changes.
That the steps' modules take no executor and are entered once per submission is checked by
``test_batch_pipeline.py``."""

from pathlib import Path

import psij
from psij import JobExecutorConfig
from psij.executors.batch import _script_steps
from psij.executors.batch._script_context import ScriptInputs


def test_inputs_are_made_once_per_executor_and_configuration(tmp_path: Path) -> None:
    ex = psij.JobExecutor.get_instance("slurm", config=JobExecutorConfig(work_directory=tmp_path))
    assert isinstance(ex, _script_steps.ScriptSteps)
    inputs = ex._script_inputs()
    assert isinstance(inputs, ScriptInputs)
    assert ex._script_inputs() is inputs
    assert inputs.name_after_script and inputs.directory_directive
    ex.config.use_nice = True  # type: ignore[attr-defined]
    changed = ex._script_inputs()
    assert changed is not inputs and changed.use_nice and changed.nice is not None
    ex.close()


def test_inputs_are_made_again_for_another_class(tmp_path: Path) -> None:
    ex = psij.JobExecutor.get_instance("slurm", config=JobExecutorConfig(work_directory=tmp_path))
    inputs = ex._script_inputs()  # type: ignore[attr-defined]
    assert inputs.generator is not None

    class Own(type(ex)):  # type: ignore[misc]
        def generate_submit_script(self, job: object, context: object, out: object) -> None:
            super().generate_submit_script(job, context, out)

    ex.__class__ = Own  # its scripts now come from its own hook, not the template alone
    assert ex._script_inputs().generator is None  # type: ignore[attr-defined]
    ex.close()
