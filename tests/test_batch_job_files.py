"""A batch job's start and end seen from the files its script writes (``<native id>.starts``,
``.ec``): what the files say (and what is garbage), what a look costs whatever the number of
jobs, what the tracker makes of it (an end with status 0 finishes the job at once; any other
end waits for the scheduler's word, which keeps the causes only it knows), and the status
poller that looks (ends seen with a 300 s poll; files that never appear turn the looks off)."""

import os
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence

import pytest

from psij import Job, JobSpec, JobState
from psij._clock import MonotonicClock
from psij.executors.batch import _poller
from psij.executors.batch._dir_events import DirEvents
from psij.executors.batch._job_files import JobFiles, parse_end, parse_start
from psij.executors.batch._poller import StatusPoller, TrackInputs
from psij.executors.batch._tracking import (
    Finish,
    JobAdded,
    MissingResolved,
    Observation,
    Phase,
    PollSucceeded,
    ReportState,
    ResolveMissing,
    RunStatusCommand,
    Settings,
    Tick,
    TrackerState,
    step,
)
from psij.executors.batch._tracking_events import FileSeen
from psij.job_status import JobStatus

# -- what the files say ----------------------------------------------------------------------


@pytest.mark.parametrize("text,expected", [
    ("1 1796679863.356176\n", (1, 1796679863.356176)),
    ("2 1796679863,5\n", (2, 1796679863.5)),  # a locale's decimal comma
    ("1\n", (1, None)),
    ("3 nan\n", (3, None)), ("3 inf\n", (3, None)), ("3 -5\n", (3, None)),
])
def test_a_start_file_gives_the_runs_and_the_time(text: str, expected: Any) -> None:
    assert parse_start(text) == expected


@pytest.mark.parametrize("text,expected", [
    ("0 1796679864.76656 - 1\n", (0, 1796679864.76656, None, 1)),
    ("143 1796679864 TERM 2\n", (143, 1796679864.0, "TERM", 2)),
    ("3\n", (3, None, None, None)),  # as scripts wrote it before
    ("255 1e9 USR2\n", (255, 1e9, "USR2", None)),
])
def test_an_end_file_gives_the_status_the_time_and_the_signal(text: str, expected: Any) -> None:
    assert parse_end(text) == expected


@pytest.mark.parametrize("text", [
    "", "\n", "x", "0x1", "-1", "256", "1" * 4, "1 2 3 4 5", "0 1 - 0", "0 1 - x", "nan",
    "\u0661", "3 1 $(rm)", "0 1 \udcff", "0 1 " + "A" * 17, "1.5", "0\n0\n0\n0", "\x00",
])
def test_garbage_in_a_file_says_nothing(text: str) -> None:
    assert parse_end(text) is None


def _write(directory: Path, name: str, text: str) -> None:
    tmp = directory / (name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, directory / name)


def test_a_look_says_each_write_once_and_only_for_followed_jobs(tmp_path: Path) -> None:
    files = JobFiles(tmp_path)
    assert files.look(["1", "2"]) == []
    _write(tmp_path, "1.starts", "1 100.5\n")
    _write(tmp_path, "9.starts", "1 100.5\n")  # not followed
    assert files.look(["1", "2"]) == [FileSeen("1", started=True, at=100.5, run=1)]
    assert files.look(["1", "2"]) == []  # said once
    _write(tmp_path, "1.ec", "0 101 - 1\n")
    _write(tmp_path, "2.ec", "garbage\n")
    assert files.look(["1", "2"]) == [FileSeen("1", exit_code=0, at=101.0, run=1)]
    _write(tmp_path, "2.ec", "3 102 TERM\n")  # rewritten: a new file
    assert files.look(["1", "2"]) == [FileSeen("2", exit_code=3, at=102.0, signal="TERM")]
    (tmp_path / "1.starts").unlink()
    (tmp_path / "1.ec").unlink()
    assert files.look(["1", "2"]) == []
    files.forget("2")
    assert files.look(["1"]) == []


def test_10000_followed_jobs_cost_one_stat_a_look_while_nothing_changes(tmp_path: Path) -> None:
    ids = [str(100000 + i) for i in range(10000)]
    for nid in ids[:3000]:
        (tmp_path / f"{nid}.out").write_text("")
        (tmp_path / f"{nid}.starts").write_text("1 5\n")
    old = time.time() - 60
    os.utime(tmp_path, (old, old))
    files = JobFiles(tmp_path)
    assert len(files.look(ids)) == 3000  # the first look lists and reads them once
    listings = files.listings
    for _ in range(100):
        assert files.look(ids) == []
    assert (files.looks, files.listings) == (101, listings)  # a stat each, no listing


def test_a_directory_changed_just_now_is_listed_again(tmp_path: Path) -> None:
    # (a file system may keep coarse times: two writes within one tick look like one)
    files = JobFiles(tmp_path)
    files.look(["1"])
    first = files.listings
    files.look(["1"])
    assert files.listings == first + 1
    old = time.time() - 60
    os.utime(tmp_path, (old, old))
    files.look(["1"])
    files.look(["1"])
    assert files.listings == first + 2


# -- the tracker -----------------------------------------------------------------------------

S = Settings(interval=300.0, initial_delay=300.0, confirm_delay=1.0)


def _tracking(*ids: str, rerunnable: bool = False) -> TrackerState:
    state = TrackerState()
    for nid in ids:
        state, _ = step(state, S, JobAdded(nid, rerunnable=rerunnable), 0.0)
    return state


def test_a_start_makes_a_queued_job_active_at_once() -> None:
    state, actions = step(_tracking("1"), S, FileSeen("1", started=True, at=5.0), 1.0)
    [report] = actions
    assert isinstance(report, ReportState) and report.observation.state is JobState.ACTIVE
    assert report.observation.metadata == {"source": "job file", "started_at": 5.0}
    assert state.jobs["1"].state is JobState.ACTIVE
    assert step(state, S, FileSeen("1", started=True, at=6.0), 2.0)[1] == []  # said once


def test_an_end_with_status_0_finishes_the_job_and_the_polls_stop() -> None:
    state, actions = step(_tracking("1"), S, FileSeen("1", exit_code=0, at=9.0), 1.0)
    assert [type(a) for a in actions] == [ReportState, Finish]  # ACTIVE first: it ran
    finish = actions[1]
    assert isinstance(finish, Finish)
    assert (finish.observation.state, finish.observation.exit_code) == (JobState.COMPLETED, 0)
    assert state.phase is Phase.IDLE and not state.jobs


@pytest.mark.parametrize("event", [
    FileSeen("1", exit_code=3, at=9.0),
    FileSeen("1", exit_code=0, at=9.0, signal="TERM"),  # the job may have handled a TERM
])
def test_any_other_end_waits_for_the_schedulers_cause(event: FileSeen) -> None:
    state, _ = step(_tracking("1"), S, FileSeen("1", started=True), 0.5)
    state, actions = step(state, S, event, 1.0)
    assert actions == [] and state.next_poll_at == 2.0  # a poll confirm_delay later
    state, actions = step(state, S, Tick(), 2.0)
    assert actions == [RunStatusCommand(("1",))]
    timeout = Observation(JobState.FAILED, "time limit", None, {"cause": "walltime"})
    state, actions = step(state, S, PollSucceeded({"1": timeout}), 2.5)
    assert actions == [Finish("1", timeout, False)]


def test_an_end_the_queue_still_shows_waits_for_it_with_polls_spaced_out() -> None:
    # (a script ends a moment before its job leaves the queue; Grid Engine keeps a deleted job
    # a while): never ended on the file's word while the scheduler shows the job
    state, _ = step(_tracking("1"), S, FileSeen("1", exit_code=3, at=9.0), 1.0)
    running = Observation(JobState.ACTIVE)
    now, delays = 2.0, []
    for _ in range(12):
        state, actions = step(state, S, Tick(), now)
        assert actions == [RunStatusCommand(("1",))]
        state, actions = step(state, S, PollSucceeded({"1": running}), now)
        assert actions == []
        assert state.next_poll_at is not None
        delays.append(state.next_poll_at - now)
        now = state.next_poll_at
    assert delays == [2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 300.0, 300.0, 300.0, 300.0]
    state, _ = step(state, S, Tick(), now)
    state, actions = step(state, S, PollSucceeded({"1": Observation(JobState.FAILED, "x", 3)}),
                          now)
    [finish] = actions
    assert isinstance(finish, Finish) and finish.observation.message == "x"


def test_an_end_the_scheduler_has_no_trace_of_is_the_files_word() -> None:
    state, _ = step(_tracking("1"), S, FileSeen("1", exit_code=3, at=9.0), 1.0)
    state, _ = step(state, S, Tick(), 2.0)
    state, actions = step(state, S, PollSucceeded({}), 2.0)
    assert actions == [ResolveMissing(("1",))]
    state, actions = step(state, S, MissingResolved({}), 2.1)
    assert [a.observation.exit_code for a in actions if isinstance(a, Finish)] == [3]


def test_a_poll_under_way_when_a_file_said_active_is_not_a_requeue() -> None:
    state = _tracking("1", rerunnable=True)
    state, _ = step(state, S, Tick(), 300.0)  # the poll goes out while the job is queued
    state, actions = step(state, S, FileSeen("1", started=True), 300.1)
    assert [a.observation.state for a in actions if isinstance(a, ReportState)] == [
        JobState.ACTIVE]
    state, actions = step(state, S, PollSucceeded({"1": Observation(JobState.QUEUED)}), 300.2)
    assert actions == [] and state.jobs["1"].state is JobState.ACTIVE
    # The next poll's QUEUED is a requeue again.
    state, _ = step(state, S, Tick(), 600.2)
    state, actions = step(state, S, PollSucceeded({"1": Observation(JobState.QUEUED)}), 600.3)
    assert [a.observation.state for a in actions if isinstance(a, ReportState)] == [
        JobState.QUEUED]


def test_a_requeue_after_a_signalled_end_follows_the_next_run() -> None:
    state, _ = step(_tracking("1", rerunnable=True), S, FileSeen("1", started=True), 0.1)
    state, _ = step(state, S, FileSeen("1", exit_code=143, signal="TERM"), 1.0)
    state, _ = step(state, S, Tick(), 2.0)
    state, actions = step(state, S, PollSucceeded({"1": Observation(JobState.QUEUED)}), 2.0)
    assert [a.observation.state for a in actions if isinstance(a, ReportState)] == [
        JobState.QUEUED]
    assert state.jobs["1"].ended is None
    state, actions = step(state, S, FileSeen("1", started=True, run=2), 5.0)
    assert [a.observation.state for a in actions if isinstance(a, ReportState)] == [
        JobState.ACTIVE]
    state, actions = step(state, S, FileSeen("1", exit_code=0), 6.0)
    assert [type(a) for a in actions] == [Finish]


def test_a_file_of_a_job_no_longer_followed_is_ignored() -> None:
    state = _tracking("1")
    assert step(state, S, FileSeen("2", exit_code=0), 1.0) == (state, [])


# -- the poller ------------------------------------------------------------------------------


class _Hooks:
    """A scheduler whose status command shows every job queued forever."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.polls = 0
        self.statuses: Dict[str, List[JobStatus]] = {}
        self.ended: List[str] = []

    def inputs(self) -> TrackInputs:
        return TrackInputs(
            name="files-test", poll_status=self.poll, resolve_missing=self.resolve,
            withdraw=lambda nid: None, final_status=self.final,
            aux_path=lambda nid, suffix: self.directory / f"{nid}{suffix}",
            job_ended=lambda jobs, nid: self.ended.append(nid),
            set_status=self.set_status,
            restate=lambda job, status: None, job_files=self.directory)

    @staticmethod
    def set_status(job: Job, status: JobStatus) -> None:
        job._set_status(status)

    def poll(self, ids: Sequence[str]) -> PollSucceeded:
        self.polls += 1
        return PollSucceeded({nid: Observation(JobState.QUEUED) for nid in ids})

    def resolve(self, ids: Sequence[str]) -> MissingResolved:
        return MissingResolved({})

    def final(self, jobs: Sequence[Job], nid: str, obs: Observation, cancel: bool
              ) -> JobStatus:
        return JobStatus(obs.state, message=obs.message, exit_code=obs.exit_code,
                         metadata=dict(obs.metadata))


def test_the_poller_sees_ends_from_the_files_with_a_300_s_poll(tmp_path: Path) -> None:
    hooks = _Hooks(tmp_path)
    poller = StatusPoller(hooks.inputs(), S, MonotonicClock())
    jobs = [Job(JobSpec("/bin/true")) for _ in range(3)]
    try:
        for i, job in enumerate(jobs):
            job._native_id = str(i)
            poller.add(job, str(i), attach=False)
        _write(tmp_path, "0.starts", "1 5\n")
        _write(tmp_path, "1.ec", "0 6 -\n")
        assert jobs[0].wait(timeout=_seconds(20), target_states=[JobState.ACTIVE]) is not None
        done = jobs[1].wait(timeout=_seconds(20))
        assert done is not None and done.state is JobState.COMPLETED and done.exit_code == 0
        assert hooks.ended == ["1"] and hooks.polls == 0
        assert jobs[2].status.state is JobState.NEW  # (the executor reports QUEUED)
    finally:
        poller.stop(wait=True)


@pytest.mark.parametrize("seen_running", [True, False])
def test_files_never_seen_for_jobs_the_scheduler_ran_and_ended_turn_the_looks_off(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, seen_running: bool) -> None:
    # A job the scheduler showed running and then ended without any file of its own in sight
    # tells that the files are not visible here; a job first seen ended (attached after its
    # end: the files may be gone with the process that followed it) tells nothing.
    hooks = _Hooks(tmp_path)
    polled: Dict[str, int] = {}

    def scheduler(ids: Sequence[str]) -> PollSucceeded:
        hooks.polls += 1
        seen = {}
        for nid in ids:
            polled[nid] = polled.get(nid, 0) + 1
            running = seen_running and polled[nid] == 1
            seen[nid] = Observation(JobState.ACTIVE) if running \
                else Observation(JobState.COMPLETED, None, 0)
        return PollSucceeded(seen)

    hooks.poll = scheduler  # type: ignore[method-assign]
    settings = Settings(interval=0.05, initial_delay=0.05)
    poller = StatusPoller(hooks.inputs(), settings, MonotonicClock())
    try:
        for i in range(_poller.UNSEEN_LIMIT):
            job = Job(JobSpec("/bin/true"))
            job._native_id = str(i)
            poller.add(job, str(i), attach=False)
            assert job.wait(timeout=_seconds(20)) is not None
        assert (poller._files is None) is seen_running
        assert ("not visible" in caplog.text) is seen_running
        if seen_running:
            assert str(tmp_path) in caplog.text
    finally:
        poller.stop(wait=True)


def _seconds(n: float) -> Any:
    from datetime import timedelta

    return timedelta(seconds=n)


# -- word from the kernel ----------------------------------------------------------------------


def _events_threads() -> List[str]:
    return [t.name for t in threading.enumerate() if t.name == "events-test-files"]


def test_a_file_renamed_into_the_directory_wakes_the_poller_at_once(tmp_path: Path) -> None:
    woken = threading.Event()
    events = DirEvents(tmp_path, woken.set, "events-test")
    if not events.start():
        pytest.skip("no inotify on this system (the periodic look is all there is)")
    try:
        assert events.start()  # already running: the same thread
        assert len(_events_threads()) == 1
        time.sleep(0.05)
        assert not woken.is_set()  # nothing happened, nothing said
        _write(tmp_path, "1.ec", "0 1 -\n")
        assert woken.wait(10)
    finally:
        events.stop(wait=True)
    assert _events_threads() == []  # ended at once, without a timeout to run out


def test_a_wake_that_raises_is_logged_and_the_events_go_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    calls: List[int] = []
    woken = threading.Event()

    def wake() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        woken.set()

    events = DirEvents(tmp_path, wake, "events-test")
    if not events.start():
        pytest.skip("no inotify on this system")
    try:
        _write(tmp_path, "a", "x")
        deadline = time.monotonic() + 10
        while not calls:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        _write(tmp_path, "b", "x")
        assert woken.wait(10)
        assert "could not pass on a file event" in caplog.text
    finally:
        events.stop(wait=True)


def test_without_inotify_there_are_no_events_and_no_thread(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    monkeypatch.setattr("sys.platform", "darwin")
    events = DirEvents(tmp_path, lambda: None, "events-test")
    assert events.start() is False and _events_threads() == []
    events.stop(wait=True)  # harmless
    monkeypatch.setattr("sys.platform", "linux")
    assert DirEvents(tmp_path / "absent", lambda: None, "events-test").start() is False


def test_the_poller_ends_its_events_thread_with_itself(tmp_path: Path) -> None:
    hooks = _Hooks(tmp_path)
    poller = StatusPoller(hooks.inputs(), S, MonotonicClock())
    job = Job(JobSpec("/bin/true"))
    job._native_id = "1"
    poller.add(job, "1", attach=False)
    names = [t.name for t in threading.enumerate()]
    poller.stop(wait=True)
    assert [t.name for t in threading.enumerate() if t.name.startswith("psij-files-test")] == []
    assert any(n == "psij-files-test-status-files" for n in names) or not _has_inotify(tmp_path)


def _has_inotify(directory: Path) -> bool:
    events = DirEvents(directory, lambda: None, "probe")
    try:
        return events.start()
    finally:
        events.stop(wait=True)


@pytest.mark.parametrize("watched", [True, False])
def test_held_shapes_are_polled_often_only_where_no_start_file_tells_the_start(
        tmp_path: Path, watched: bool) -> None:
    hooks = _Hooks(tmp_path)
    inputs = hooks.inputs()
    if not watched:
        inputs = TrackInputs(**{**inputs.as_dict(), "job_files": None})
    poller = StatusPoller(inputs, Settings(interval=300.0, initial_delay=0.1),
                          MonotonicClock())
    try:
        job = Job(JobSpec("/bin/true"))
        job._native_id = "1"
        poller.add(job, "1", attach=False, group="shape")
        poller.hurry({"shape"})
        time.sleep(1.5)
        # The first poll after the submit comes either way; the queued job of a shape that
        # holds jobs back is polled again every 0.1 s only without the start files.
        assert (hooks.polls <= 2) is watched, hooks.polls
    finally:
        poller.stop(wait=True)


@pytest.mark.parametrize("start_seen", [True, False])
def test_the_end_of_a_run_the_scheduler_requeued_is_not_the_jobs_end(start_seen: bool) -> None:
    # Grid Engine's qmod -rj: the queue shows the job requeued while its run still ends (the
    # scheduler warns it first); that run's end file comes after, and is old news.
    state = _tracking("1", rerunnable=True)
    if start_seen:
        state, _ = step(state, S, FileSeen("1", started=True, run=1), 0.1)
    else:
        state, _ = step(state, S, Tick(), 300.0)
        state, _ = step(state, S, PollSucceeded({"1": Observation(JobState.ACTIVE)}), 300.0)
    state, _ = step(state, S, Tick(), 600.0)
    state, actions = step(state, S, PollSucceeded({"1": Observation(JobState.QUEUED)}), 600.0)
    assert [a.observation.state for a in actions if isinstance(a, ReportState)] == [
        JobState.QUEUED]
    old = FileSeen("1", exit_code=143, signal="USR2", run=1)
    assert step(state, S, old, 601.0) == (state, [])  # nothing said, no poll asked
    assert step(state, S, FileSeen("1", exit_code=143), 601.0) == (state, [])  # (old format)
    state, actions = step(state, S, FileSeen("1", started=True, run=2), 605.0)
    assert [a.observation.state for a in actions if isinstance(a, ReportState)] == [
        JobState.ACTIVE]
    state, actions = step(state, S, FileSeen("1", exit_code=0, run=2), 606.0)
    assert [type(a) for a in actions] == [Finish]


def test_an_end_seen_before_its_start_says_when_it_ended() -> None:
    _, actions = step(_tracking("1"), S, FileSeen("1", exit_code=0, at=9.0, run=1), 1.0)
    report, finish = actions
    assert isinstance(report, ReportState) and isinstance(finish, Finish)
    assert report.observation.metadata == {"source": "job file", "started_at": 9.0}
    assert finish.observation.metadata == {"source": "job file", "ended_at": 9.0}


def test_only_the_files_asked_for_wake_the_poller(tmp_path: Path) -> None:
    woken = threading.Event()
    events = DirEvents(tmp_path, woken.set, "events-test", (".starts", ".ec"))
    if not events.start():
        pytest.skip("no inotify on this system")
    try:
        _write(tmp_path, "1.job", "#!/bin/sh\n")  # a submit script, an output file
        (tmp_path / "1.out").write_text("")
        _write(tmp_path, "1.ec.part", "0\n")
        assert not woken.wait(0.5)
        _write(tmp_path, "1.ec", "0 1 - 1\n")
        assert woken.wait(10)
    finally:
        events.stop(wait=True)


def test_events_are_read_past_descriptor_1023(tmp_path: Path) -> None:
    # (select() refuses such descriptors; a process with many files open has them)
    held = []
    try:
        while True:
            fd = os.open(os.devnull, os.O_RDONLY)
            held.append(fd)
            if fd > 1030:
                break
    except OSError:
        pytest.skip("this process may not open over 1030 descriptors")
    try:
        woken = threading.Event()
        events = DirEvents(tmp_path, woken.set, "events-test")
        if not events.start():
            pytest.skip("no inotify on this system")
        try:
            _write(tmp_path, "1.ec", "0 1 - 1\n")
            assert woken.wait(10)
        finally:
            events.stop(wait=True)
    finally:
        for fd in held:
            os.close(fd)
