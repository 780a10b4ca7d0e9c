"""``max_queued_per_shape`` end to end on the batch-test scheduler (real submit scripts, real
polling): held jobs report QUEUED held by the client, go in priority order, can be cancelled,
cannot be attached from another process; bad configuration values are refused."""

import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List

import pytest

import psij
import psij.registry
from psij import Job, JobAttributes, JobExecutor, JobSpec, JobState, JobStatus
from psij.executors.batch._batch_config import BatchSchedulerExecutorConfig
from psij.executors.batch._held_jobs import HELD_MESSAGE
from psij.executors.batch.batch_test import BatchTestExecutorConfig

WAIT = timedelta(seconds=60)


def job(delay: float, priority: Any = None, name: str = "j", **custom: Any) -> Job:
    attrs: Dict[str, Any] = {"batch-test.queue-delay": delay, **custom}
    if priority is not None:
        attrs["psij.priority"] = priority
    return Job(JobSpec("/bin/true", name=name, attributes=JobAttributes(
        custom_attributes=attrs)))


def test_held_jobs_report_queued_go_by_priority_and_cancel(tmp_path: Path) -> None:
    cfg = BatchTestExecutorConfig(work_directory=tmp_path / "w", queue_polling_interval=0.1,
                                  initial_queue_polling_delay=0.05, keep_finished=1,
                                  max_queued_per_shape=1)
    ex = JobExecutor.get_instance("batch-test", config=cfg)
    started: List[str] = []

    def seen(j: Job, st: JobStatus) -> None:
        if st.state is JobState.ACTIVE:
            started.append(j.spec.name)  # type: ignore[union-attr]

    ex.set_job_status_callback(seen)
    try:
        first = job(0.5, name="first")
        ex.submit(first)
        assert first.native_id is not None
        low, high, mid, gone = (job(0.5, 1, "low"), job(0.5, 5.5, "high"), job(0.5, 3, "mid"),
                                job(0.5, 9, "gone"))
        for j in (low, high, mid, gone):
            ex.submit(j)
        # other shape: not held behind the first one
        other = job(0.5, name="other", **{"batch-test.comment": "x"})
        ex.submit(other)
        assert other.native_id is not None
        for j in (low, high, mid, gone):
            st = j.status
            assert st.state is JobState.QUEUED and j.native_id is None
            assert st.message == HELD_MESSAGE
            assert st.metadata is not None and st.metadata["held_by"] == "client"
        assert high.status.metadata["held"] == 2  # type: ignore[index]
        gone.cancel()
        assert gone.status.state is JobState.CANCELED
        assert "held by the client" in (gone.status.message or "")
        for j in (first, low, high, mid, other):
            st = j.wait(WAIT)
            assert st is not None and st.state is JobState.COMPLETED, (j.spec, st)
        order = [n for n in started if n != "other"]
        assert order == ["first", "high", "mid", "low"]
        assert "gone" not in started
    finally:
        ex.close()


ATTACH = textwrap.dedent("""
    import sys
    import psij.registry
    try:
        psij.registry.reattach([sys.argv[1]], work_directory=sys.argv[2])
    except psij.registry.AttachError as e:
        print(e)
""")


def test_attach_of_a_held_job_from_another_process_says_it_is_held(tmp_path: Path) -> None:
    wd = tmp_path / "w"
    cfg = BatchTestExecutorConfig(work_directory=wd, queue_polling_interval=0.2,
                                  max_queued_per_shape=1)
    ex = JobExecutor.get_instance("batch-test", config=cfg)
    try:
        ex.submit(job(30))
        held = job(30)
        ex.submit(held)
        assert held.status.message == HELD_MESSAGE
        psij.registry.flush()
        out = subprocess.run([sys.executable, "-c", ATTACH, held.id, str(wd)],
                             capture_output=True, text=True, timeout=60)
        assert "held by the client process that submitted it" in out.stdout, out
        assert "max_queued_per_shape" in out.stdout
    finally:
        ex.close()
    # closing the executor ends the held job: it was never submitted
    assert held.status.state is JobState.FAILED
    assert "never submitted" in (held.status.message or "")


def test_a_failing_shape_does_not_block_another(tmp_path: Path) -> None:
    cfg = BatchTestExecutorConfig(work_directory=tmp_path / "w", queue_polling_interval=0.1,
                                  initial_queue_polling_delay=0.05, keep_finished=1,
                                  max_queued_per_shape=1)
    ex = JobExecutor.get_instance("batch-test", config=cfg)
    real = ex.get_submit_command  # type: ignore[attr-defined]

    def refused(j: Job, path: Path) -> List[str]:  # the scheduler refuses every "bad" job
        if (j.spec.name or "").startswith("bad"):  # type: ignore[union-attr]
            return [sys.executable, "-c", "import sys; sys.exit('refused: bad account')"]
        return real(j, path)  # type: ignore[no-any-return]

    ex.get_submit_command = refused  # type: ignore[attr-defined]
    try:
        ok = [job(0.3, name=f"ok{i}") for i in range(3)]
        bad = [job(0.3, name=f"bad{i}", **{"batch-test.comment": "bad"}) for i in range(4)]
        ex.submit(ok[0])
        keeper = job(0.3, name="keeper", **{"batch-test.comment": "bad"})
        ex.submit(keeper)  # accepted; the bad jobs of its shape are held behind it
        for j in (*bad, *ok[1:]):
            ex.submit(j)
        assert all(j.native_id is None for j in (*bad, *ok[1:]))
        for j in (keeper, *ok):
            st = j.wait(WAIT)
            assert st is not None and st.state is JobState.COMPLETED
        for j in bad:
            st = j.wait(WAIT)
            assert st is not None and st.state is JobState.FAILED
            assert "submitting failed" in (st.message or "") and "refused" in st.message
    finally:
        ex.close()


@pytest.mark.parametrize("field,value,text", [
    ("max_queued_per_shape", 0, "at least 1"),
    ("max_queued_per_shape", -3, "at least 1"),
    ("max_queued_per_shape", 2.5, "whole number"),
    ("max_queued_per_shape", "10", "whole number"),
    ("memory_bucket", -1, "whole number of bytes"),
    ("memory_bucket", float("nan"), "whole number of bytes"),
    ("tmp_bucket", float("inf"), "whole number of bytes"),
    ("use_nice", 1, "bool"),
    ("fallback", "cloud", "None or 'local'"),
])
def test_bad_settings_are_refused_by_name(field: str, value: Any, text: str) -> None:
    with pytest.raises((TypeError, ValueError), match=f"{field}.*{text}"):
        BatchSchedulerExecutorConfig(**{field: value})


def test_cap_true_means_ten_and_default_is_off() -> None:
    assert BatchSchedulerExecutorConfig().max_queued_per_shape is None
    assert BatchSchedulerExecutorConfig(max_queued_per_shape=True).max_queued_per_shape == 10
    assert BatchSchedulerExecutorConfig(max_queued_per_shape=False).max_queued_per_shape is None
    assert BatchSchedulerExecutorConfig(max_queued_per_shape=3).max_queued_per_shape == 3


class _CountingRunner:
    """The executor's runner, noting when each status command ran."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.polls: List[float] = []

    def run(self, argv: Any, timeout: float, stdin: Any = None) -> Any:
        if "status" in argv:
            self.polls.append(time.monotonic())
        return self.runner.run(argv, timeout, stdin)


def test_a_freed_slot_is_used_within_the_short_interval(tmp_path: Path) -> None:
    # The full poll comes every 30 s; while a job is held, the queued job of its shape is
    # looked at every 0.3 s (the delay after a submit), so its start frees the slot at once.
    cfg = BatchTestExecutorConfig(work_directory=tmp_path / "w", queue_polling_interval=30,
                                  initial_queue_polling_delay=0.3, keep_finished=1,
                                  max_queued_per_shape=1)
    ex = JobExecutor.get_instance("batch-test", config=cfg)
    counting = _CountingRunner(ex._runner)  # type: ignore[attr-defined]
    ex._runner = counting  # type: ignore[attr-defined]
    try:
        first, second = (Job(JobSpec("/bin/sleep", ["4"], name=n, attributes=JobAttributes(
            custom_attributes={"batch-test.queue-delay": 1.0}))) for n in ("first", "second"))
        ex.submit(first)
        begin = time.monotonic()
        ex.submit(second)
        assert second.native_id is None  # held behind the first, of the same shape
        while second.native_id is None:
            assert time.monotonic() - begin < 20, "the held job did not go out within 20 s"
            time.sleep(0.02)
        out = time.monotonic()
        # the first starts 1 s after its submission; seen within a few short intervals
        assert out - begin < 2.5, out - begin
        assert first.status.state is JobState.ACTIVE
        # Nothing is held any more: no poll sooner than the full interval (but the one its
        # submission asks for, 0.3 s after it).
        time.sleep(3.0)
        assert [t for t in counting.polls if t > out + 1.0] == []
        # Its start is seen from the file its script writes, not at the next poll.
        assert second.status.state is JobState.ACTIVE
        assert second.status.metadata["source"] == "job file"
    finally:
        ex.close()


def test_a_new_priority_reorders_held_jobs_at_once(tmp_path: Path) -> None:
    cfg = BatchTestExecutorConfig(work_directory=tmp_path / "w", queue_polling_interval=0.1,
                                  initial_queue_polling_delay=0.05, keep_finished=1,
                                  max_queued_per_shape=1)
    ex = JobExecutor.get_instance("batch-test", config=cfg)
    started: List[str] = []
    ex.set_job_status_callback(lambda j, st: started.append(j.spec.name)  # type: ignore
                               if st.state is JobState.ACTIVE else None)
    try:
        first = job(0.5, name="first")
        ex.submit(first)
        jobs = {n: job(0.5, p, n) for n, p in (("a", 1), ("b", 2), ("c", 3))}
        for j in jobs.values():
            ex.submit(j)
        shared = jobs["a"].spec
        assert ex.set_priority(jobs["a"], 10) is True
        assert ex.set_priority(jobs["c"], -1.5) is True
        # The held job's status shows it; the spec it was made from is left as it was.
        assert jobs["a"].status.metadata["priority"] == 10  # type: ignore[index]
        assert jobs["a"].status.message == HELD_MESSAGE
        assert jobs["a"].spec is not shared
        assert shared.attributes.custom_attributes["psij.priority"] == 1  # type: ignore
        assert jobs["a"].spec.attributes.custom_attributes["psij.priority"] == 10  # type: ignore
        for j in (first, *jobs.values()):
            st = j.wait(WAIT)
            assert st is not None and st.state is JobState.COMPLETED
            # A job that ended keeps its place in history: no new priority for it.
            with pytest.raises(psij.InvalidJobException, match="no longer matters"):
                ex.set_priority(j, 1)
        assert started == ["first", "a", "b", "c"]
    finally:
        ex.close()
