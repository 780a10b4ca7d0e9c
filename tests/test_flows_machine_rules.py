"""The flow machine's rules, driven with a manual clock: termination classes, restart limits
per handle and across handles, problems, instance records and their deletion, sandbox quotas,
payloads, and requests it must refuse."""

import base64
import hashlib
import math
import random
from typing import Any, Dict, List, Tuple

import pytest

from psij import JobState
from psij.controller import (
    ActionDone,
    ActionFailed,
    BadMessage,
    Disconnected,
    JobStatusChanged,
    MessageReceived,
    Send,
    SignalReceived,
    Stop,
    Submit,
    Tick,
    TimerFired,
)
from psij.flows._termination import DEFAULT_MAP, parse_map
from psij.flows.machine import (
    DeleteFiles,
    DeletePayload,
    FlowConfig,
    PayloadStored,
    PayloadVerified,
    ReadOutput,
    SandboxMeasured,
    StorePayload,
    VerifyPayload,
)
from support.flow_sim import SPEC, Sim

# -- termination classes ----------------------------------------------------------------------


@pytest.mark.parametrize(("code", "klass"), [
    (0, "no_problem"), (84, "no_problem"), (75, "no_work"), (83, "no_work"),
    (64, "failed_init"), (78, "failed_init"), (126, "failed_init"), (127, "failed_init"),
    (80, "failed_init"), (81, "failed_after_work"), (82, "never_claimed"), (1, "unknown"),
    (137, "unknown"), (-9, "unknown"), (None, "unknown"),
])
def test_default_termination_map(code: Any, klass: str) -> None:
    assert parse_map(None).classify(code) == klass


def test_a_client_map_is_laid_over_the_defaults() -> None:
    m = parse_map({"1": "failed_after_work", "100-110": "never_claimed", "none": "no_work",
                   "default": "failed_init", "65": "no_problem"})
    assert m.classify(1) == "failed_after_work"
    assert m.classify(105) == "never_claimed"
    assert m.classify(None) == "no_work"
    assert m.classify(3) == "failed_init"
    assert m.classify(65) == "no_problem"  # a code wins over the default range 64-74
    assert m.classify(0) == "no_problem"
    # The client's range wins over the defaults' codes.
    wide = parse_map({"60-90": "no_work"})
    assert [wide.classify(c) for c in (64, 75, 80, 82, 91)] == ["no_work"] * 4 + ["unknown"]
    assert set(DEFAULT_MAP) >= {"0", "none", "default"}


@pytest.mark.parametrize("bad", [{"x": "unknown"}, {"1": "bad_class"}, {"5-2": "unknown"},
                                 [], {"1": 3}, {"99999999999999": "unknown"}])
def test_a_bad_termination_map_is_refused_naming_the_field(bad: Any) -> None:
    sim = Sim()
    answer = sim.call("create", spec=SPEC, executor="local", count=1, termination_map=bad)
    assert answer["error"]["code"] == "bad_request"
    assert answer["error"]["field"] == "termination_map"
    assert "termination_map" in answer["error"]["message"]


def test_the_class_comes_from_the_handles_map() -> None:
    sim = Sim()
    h = sim.create(1, termination_map={"3": "no_work"})
    sim.run()
    sim.finish(f"{h}/0", 3)
    [record] = sim.call("instances", handle=h)["instances"]
    assert record["class"] == "no_work"


# -- restart limits ---------------------------------------------------------------------------


def test_restarts_are_spaced_per_class_in_one_handle() -> None:
    sim = Sim()
    h = sim.create(3, intervals={"failed_init": 100, "no_work": 40}, rate=100)
    sim.run()
    t0 = sim.now
    for key in (f"{h}/0", f"{h}/1", f"{h}/2"):
        sim.finish(key, 64)  # failed_init
    first = list(sim.unanswered)
    assert len(first) == 1  # one at once, the others wait
    times = {first[0]: sim.now - t0}
    sim.run()
    for _ in range(300):
        sim.advance(1)
        for key in sim.run():
            times[key] = sim.now - t0
    assert sorted(times.values()) == [0, 100, 200]
    codes = [p["code"] for p in sim.call("problems", handle=h)["problems"]]
    assert "restarts_throttled" not in codes


def test_no_problem_restarts_are_limited_only_by_the_rate() -> None:
    sim = Sim(FlowConfig("/sb", aggregate_problem_interval=5))
    h = sim.create(20, rate=10)
    sim.advance(10)
    sim.run()
    for key in list(sim.machine.handles[h].live):
        sim.finish(key, 0)
    started = len(sim.run())
    assert started == 10  # the burst of a rate of 10/s
    sim.advance(1)
    assert len(sim.run()) == 10


def test_1000_instances_failing_in_the_same_second_restart_at_most_once_a_second() -> None:
    config = FlowConfig("/sb", aggregate_problem_interval=1.0, max_submit_rate=1000,
                        max_rate=1000, default_intervals={"unknown": 5.0, "failed_init": 5.0})
    sim = Sim(config)
    handles = [sim.create(10, rate=1000) for _ in range(100)]
    for _ in range(10):
        sim.advance(1)
    sim.run()
    assert sum(len(sim.machine.handles[h].live) for h in handles) == 1000
    keys = [k for h in handles for k in sim.machine.handles[h].live]
    sim.advance(0.5)
    t0 = sim.now
    sent_before = len(sim.submits)
    for i, key in enumerate(keys):  # all in the same second
        sim.finish(key, 64 if i % 2 else 1)
    restarts: List[float] = []
    for _ in range(120 * 4):
        restarts.extend(sim.now - t0 for _ in sim.run())
        sim.advance(0.25)
    restarts.extend(sim.now - t0 for _ in sim.run())
    assert len(sim.submits) - sent_before == len(restarts)
    assert 110 <= len(restarts) <= 121  # one a second across all handles, not 1000 at once
    for earlier, later in zip(restarts, restarts[1:]):
        assert later - earlier >= 1.0 - 1e-9
    # The problems of every handle still owed a restart say why it waits, and how long.
    throttled = {h: p for h in handles for p in sim.call("problems", handle=h)["problems"]
                 if p["code"] == "restarts_throttled"}
    owing = [h for h in handles if sim.machine.handles[h].owed]
    assert owing and sorted(throttled) == sorted(owing)
    assert all(p["limit"] == "aggregate" for p in throttled.values())
    assert sorted(p["handles_before"] for p in throttled.values()) == list(range(len(owing)))
    for p in throttled.values():
        assert p["handles_before"] <= p["next_restart_in_s"] <= p["handles_before"] + 1


def _turns(sim: Sim, seconds: float, step: float = 0.1) -> List[Tuple[float, str]]:
    """Run ``seconds`` with every started instance exiting 1 at once; (time, handle) of each
    start, and a check at every step that each handle owed a restart says why it waits."""
    started: List[Tuple[float, str]] = []
    end = sim.now + seconds
    while sim.now < end - 1e-9:
        for key in sim.run():
            started.append((sim.now, key.split("/")[0]))
            sim.finish(key, 1)
        for hid, h in sim.machine.handles.items():
            if h.owed:
                codes = [p["code"] for p in sim.call("problems", handle=hid)["problems"]]
                assert "restarts_throttled" in codes, (sim.now, hid, codes)
        sim.advance(step)
    return started


def test_the_aggregate_limit_is_shared_fairly_and_each_waiting_handle_says_so() -> None:
    # Issue 21: two handles of 5 instances that exit 1 at once, no interval of their own.
    # The aggregate limit (one such restart a second) went to the handle that came first in
    # the timer's order every time: 18 restarts for one, none for the other, and the starved
    # one's problems never said why (its next restart never looked more than 1 s away).
    sim = Sim()
    a = sim.create(5, intervals={"unknown": 0})
    b = sim.create(5, intervals={"unknown": 0})
    started = _turns(sim, 12.0)
    restarts = [hid for _, hid in started[10:]]  # after the 10 first starts
    assert 11 <= len(restarts) <= 13
    assert abs(restarts.count(a) - restarts.count(b)) <= 1
    # Turn and turn about: the handle that waited longest goes first.
    assert all(x != y for x, y in zip(restarts, restarts[1:])), restarts
    problem, = [p for p in sim.call("problems", handle=b)["problems"]
                if p["code"] == "restarts_throttled"]
    assert problem["limit"] == "aggregate" and problem["class"] == "unknown"
    assert "across all handles" in problem["message"]


def test_the_turn_goes_to_the_handle_that_waited_longest() -> None:
    sim = Sim()
    hids = [sim.create(3, intervals={"unknown": 0}) for _ in range(3)]
    sim.run()
    sim.advance(10)
    order: List[str] = []
    for hid in hids:  # each one's instances fail, 0.3 s apart
        for key in sim.live(hid):
            sim.finish(key, 1)
        order += [k.split("/")[0] for k in sim.run()]
        sim.advance(0.3)
    for _ in range(8):
        sim.advance(1.0)
        order += [k.split("/")[0] for k in sim.run()]
    a, b, c = hids
    # a at once (the limit was free), then a again (waiting since then), then b, c, a (its
    # third and last), b, c.
    assert order == [a, a, b, c, a, b, c, b, c], order


def test_a_handle_that_no_longer_needs_its_turn_gives_it_to_the_next() -> None:
    sim = Sim()
    a = sim.create(2, intervals={"unknown": 0})
    b = sim.create(2, intervals={"unknown": 0})
    sim.run()
    for key in sim.live(a) + sim.live(b):
        sim.finish(key, 1)
    first = sim.run()
    assert [k.split("/")[0] for k in first] == [a]  # a's turn; a and b wait in line
    sim.call("destroy", handle=a)
    sim.advance(1.0)
    assert [k.split("/")[0] for k in sim.run()] == [b]
    sim.advance(1.0)
    assert [k.split("/")[0] for k in sim.run()] == [b]
    assert len(sim.machine.turns) == 0


def test_a_handle_held_by_its_own_interval_does_not_hold_the_others() -> None:
    sim = Sim()
    slow = sim.create(2, intervals={"unknown": 100})
    fast = sim.create(2, intervals={"unknown": 0})
    sim.run()
    for key in sim.live(slow) + sim.live(fast):
        sim.finish(key, 1)
    started = [k.split("/")[0] for k in sim.run()]
    assert started == [slow]  # the first turn; slow's next waits 100 s for its own interval
    for _ in range(3):
        sim.advance(1.0)
        started += [k.split("/")[0] for k in sim.run()]
    assert started == [slow, fast, fast]
    problem = sim.call("problems", handle=slow)["problems"][0]
    assert problem["limit"] == "interval" and problem["next_restart_in_s"] > 90


def test_failed_submissions_back_off_and_report_submit_failing() -> None:
    sim = Sim()
    h = sim.create(1)
    failures = []
    for _ in range(6):
        sim.reject("sbatch: error: Batch job submission failed: Invalid account")
        failures.append(sim.now)
        sim.advance(400)
    assert len(sim.submits) == 7  # the 7th waits to be answered
    problems = sim.call("problems", handle=h)["problems"]
    [failing] = [p for p in problems if p["code"] == "submit_failing"]
    assert failing["consecutive"] == 6 and "Invalid account" in failing["last_error"]
    status = sim.call("status", handle=h)
    assert status["submission_errors"] >= 1 and status["waiting"] == 0
    # The waits between tries double.
    sim2 = Sim()
    sim2.create(1)
    times = []
    for _ in range(5):
        times.append(sim2.now)
        sim2.reject()
        while not sim2.unanswered:
            sim2.advance(0.5)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert gaps == [1.0, 2.0, 4.0, 8.0]
    sim2.run()
    assert sim2.call("problems", handle="f1")["problems"] == []


def test_instances_ending_fast_are_reported_with_the_median() -> None:
    sim = Sim()
    h = sim.create(1, intervals={"no_problem": 0})
    for _ in range(5):
        sim.run()
        sim.advance(30)
        sim.finish(sim.machine.handles[h].live.copy().popitem()[0], 0)
        sim.advance(1)
    [fast] = [p for p in sim.call("problems", handle=h)["problems"]
              if p["code"] == "terminating_fast"]
    assert fast["median_runtime_s"] == 30 and fast["samples"] == 5
    assert "30 s" in fast["message"]


def test_held_jobs_do_not_count_as_waiting() -> None:
    from psij.executors.batch.sge import sge_status
    from psij.executors.batch.slurm import slurm_status

    sim = Sim()
    h = sim.create(5)
    keys = sim.accept(JobState.QUEUED)
    # What the backends report for a job their scheduler holds.
    sim.status(keys[0], JobState.QUEUED, metadata=sge_status("hqw").metadata)
    sim.status(keys[1], JobState.QUEUED, metadata=slurm_status("PENDING", "JobHeldUser").metadata)
    # Held back by the client (max_queued_per_shape): it goes out by itself, so it waits.
    sim.status(keys[2], JobState.QUEUED, metadata={"held_by": "client", "held": 3})
    sim.status(keys[3], JobState.QUEUED, metadata=slurm_status("PENDING", "Priority").metadata)
    status = sim.call("status", handle=h)
    assert (status["waiting"], status["held"]) == (3, 2)
    # Released by the scheduler: restated QUEUED without the hold, it waits again.
    sim.status(keys[1], JobState.QUEUED, metadata=slurm_status("PENDING", "None").metadata)
    status = sim.call("status", handle=h)
    assert (status["waiting"], status["held"]) == (4, 1)


# -- records, deletion, quotas ----------------------------------------------------------------


def _end_with_output(sim: Sim, h: str, key: str, code: int, size: int) -> None:
    sim.finish(key, code)
    sim.step(SandboxMeasured(h, key, size))


def test_delete_forgets_records_and_removes_their_files() -> None:
    sim = Sim()
    h = sim.create(2)
    sim.run()
    _end_with_output(sim, h, f"{h}/0", 0, 100)
    records = sim.call("instances", handle=h)["instances"]
    ident = records[0]["id"]
    answer = sim.call("delete", handle=h, ids=[ident, "nope.3"])
    assert (answer["deleted"], answer["unknown"]) == ([ident], ["nope.3"])
    assert DeleteFiles((f"/sb/1000/{h}/0.out", f"/sb/1000/{h}/0.err")) in sim.actions
    assert sim.call("instances", handle=h)["instances"] == []
    assert ("instance", f"{h}/0") not in sim.journal
    assert sim.call("status", handle=h)["sandbox_bytes"] == 0


def test_output_is_read_by_the_service_and_refused_once_deleted() -> None:
    sim = Sim()
    h = sim.create(1, quota_bytes=100, quota_policy="delete_oldest")
    sim.run()
    _end_with_output(sim, h, f"{h}/0", 0, 40)
    ident = sim.call("instances", handle=h)["instances"][0]["id"]
    before = len(sim.actions)
    assert sim.call("output", handle=h, instance=ident, stream="stderr", max_bytes=10) is None
    [read] = [a for a in sim.actions[before:] if type(a) is ReadOutput]
    assert (read.path, read.max_bytes, read.uid) == (f"/sb/1000/{h}/0.err", 10, 1000)
    sim.run()
    _end_with_output(sim, h, f"{h}/1", 0, 90)  # over the quota: the oldest output goes
    answer = sim.call("output", handle=h, instance=ident)
    assert answer["error"]["code"] == "output_unavailable"
    assert sim.call("output", handle=h, instance="9.9")["error"]["code"] == "unknown_instance"


def test_quota_stop_policy_stops_new_instances_until_records_are_deleted() -> None:
    sim = Sim()
    h = sim.create(1, quota_bytes=1000, quota_policy="stop")
    sim.run()
    _end_with_output(sim, h, f"{h}/0", 0, 1200)
    # Its replacement was submitted when it ended, before its output was measured; once the
    # sandbox is known to be full, nothing more starts.
    assert sim.unanswered == [f"{h}/1"]
    sim.run()
    sim.finish(f"{h}/1", 0)
    sim.advance(100)
    assert sim.unanswered == []
    [full] = [p for p in sim.call("problems", handle=h)["problems"] if p["code"] == "quota_full"]
    assert (full["sandbox_bytes"], full["quota_bytes"]) == (1200, 1000)
    ident = sim.call("instances", handle=h)["instances"][0]["id"]
    sim.call("delete", handle=h, ids=[ident])
    assert sim.unanswered == [f"{h}/2"]


def test_quota_delete_oldest_keeps_chosen_classes_longer() -> None:
    sim = Sim()
    h = sim.create(1, quota_bytes=250, quota_policy="delete_oldest",
                   keep_classes=["no_problem"], intervals={"failed_init": 0, "unknown": 0})
    codes = [0, 64, 0, 1, 0]
    for n, code in enumerate(codes):
        sim.run()
        sim.advance(100)
        _end_with_output(sim, h, f"{h}/{n}", code, 100)
        sim.advance(100)
    records = {r["key"]: r for r in sim.call("instances", handle=h)["instances"]}
    kept = sorted(k for k, r in records.items() if r["output"] == "kept")
    # 5 x 100 bytes into 250: the failed_init and unknown ones go first, then the oldest
    # no_problem one.
    assert kept == [f"{h}/2", f"{h}/4"]
    assert records[f"{h}/0"]["output"] == "deleted (quota)"
    assert sim.call("status", handle=h)["sandbox_bytes"] == 200
    assert len(records) == 5  # the records stay, only their output goes
    assert sim.unanswered  # delete_oldest never stops new instances


# -- payloads ---------------------------------------------------------------------------------


def _upload(sim: Sim, data: bytes, uid: int = 1000) -> str:
    before = len(sim.actions)
    assert sim.call("upload", uid=uid, data=base64.b64encode(data).decode()) is None
    [store] = [a for a in sim.actions[before:] if type(a) is StorePayload]
    assert store.sha256 == hashlib.sha256(data).hexdigest() and store.data == data
    sim.step(PayloadStored(uid, store.sha256, True, ""))
    return store.sha256


def test_payloads_are_verified_before_each_start_and_shared_between_handles() -> None:
    config = FlowConfig("/sb", keep_unused_payload=600)
    sim = Sim(config)
    sha = _upload(sim, b"#!/bin/sh\nexec sleep 100\n")
    a = sim.create(1, payload=sha, spec={"executable": "placeholder"})
    b = sim.create(1, payload=sha, spec={"arguments": ["x"]})
    verifies = [x for x in sim.actions if type(x) is VerifyPayload]
    assert [(v.key, v.sha256) for v in verifies] == [(f"{a}/0", sha), (f"{b}/0", sha)]
    assert sim.submits == []  # nothing submitted before the verification
    sim.step(PayloadVerified(f"{a}/0", True, f"/pl/1000/{sha}", ""))
    sim.step(PayloadVerified(f"{b}/0", False, None, "sha256 differs: changed on disk"))
    assert [str(s.spec.executable) for s in sim.submits] == [f"/pl/1000/{sha}"]
    [bad] = [p for p in sim.call("problems", handle=b)["problems"]
             if p["code"] == "payload_invalid"]
    assert "changed on disk" in bad["message"]
    # Kept while a valid handle uses it; removed after keep_unused_payload once none does.
    sim.call("destroy", handle=a)
    sim.advance(3600)
    assert not [x for x in sim.actions if type(x) is DeletePayload]
    sim.call("destroy", handle=b)
    sim.advance(599)
    assert not [x for x in sim.actions if type(x) is DeletePayload]
    sim.advance(2)
    assert [x for x in sim.actions if type(x) is DeletePayload] == [DeletePayload(1000, sha)]


def test_payloads_are_per_user() -> None:
    sim = Sim()
    sha = _upload(sim, b"payload")
    refused = sim.call("create", uid=1001, spec={"arguments": []}, executor="local", count=1,
                       payload=sha)
    assert refused["error"]["reason"] == "unknown_payload"


def test_a_payload_that_could_not_be_stored_is_unknown() -> None:
    sim = Sim()
    before = len(sim.actions)
    sim.call("upload", data=base64.b64encode(b"abc").decode())
    [store] = [a for a in sim.actions[before:] if type(a) is StorePayload]
    sim.step(PayloadStored(1000, store.sha256, False, "disk full"))
    refused = sim.call("create", spec=SPEC, executor="local", count=1, payload=store.sha256)
    assert refused["error"]["reason"] == "unknown_payload"


def test_unused_uploads_survive_a_restart_and_are_collected_later() -> None:
    sim = Sim(FlowConfig("/sb", keep_unused_payload=100))
    sha = _upload(sim, b"x")
    sim.advance(50)
    after = sim.restart()
    after.advance(49)
    h = after.create(1, payload=sha, spec={"arguments": []})
    after.advance(1000)
    assert not [x for x in after.actions if type(x) is DeletePayload]
    assert h


# -- bad requests and events ------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "field", "code"), [
    ({"op": "grow", "handle": "f99", "n": 1}, "handle", "unknown_handle"),
    ({"op": "grow", "handle": 7, "n": 1}, "handle", "bad_request"),
    ({"op": "grow", "n": 1}, "handle", "bad_request"),
    ({"op": "grow", "handle": "f1", "n": -1}, "n", "bad_request"),
    ({"op": "grow", "handle": "f1", "n": 10**30}, "n", "bad_request"),
    ({"op": "grow", "handle": "f1", "n": math.nan}, "n", "bad_request"),
    ({"op": "grow", "handle": "f1", "n": "3"}, "n", "bad_request"),
    ({"op": "grow", "handle": "f1", "n": True}, "n", "bad_request"),
    ({"op": "grow", "handle": "f1"}, "n", "bad_request"),
    ({"op": "shrink", "handle": "f1", "n": 1, "signal": "SIGNOPE"}, "signal", "bad_request"),
    ({"op": "shrink", "handle": "f1", "n": 1, "signal": 999}, "signal", "bad_request"),
    ({"op": "shrink", "handle": "f1", "n": 1, "victims": "random"}, "victims", "bad_request"),
    ({"op": "shrink", "handle": "f1", "n": 1, "grace": -1}, "grace", "bad_request"),
    ({"op": "shrink", "handle": "f1", "n": 1, "grace": math.inf}, "grace", "bad_request"),
    ({"op": "renew", "handle": "f1", "lease": math.nan}, "lease", "bad_request"),
    ({"op": "renew", "handle": "f1", "lease": 0}, "lease", "bad_request"),
    ({"op": "renew", "handle": "f1"}, "lease", "bad_request"),
    ({"op": "create", "spec": SPEC, "executor": "local", "count": -2}, "count", "bad_request"),
    ({"op": "create", "spec": "x", "executor": "local", "count": 1}, "spec", "bad_request"),
    ({"op": "create", "spec": {"nope": 1}, "executor": "local", "count": 1}, "spec",
     "bad_request"),
    ({"op": "create", "spec": {}, "executor": "local", "count": 1}, "spec", "bad_request"),
    ({"op": "create", "spec": SPEC, "count": 1}, "executor", "bad_request"),
    ({"op": "create", "spec": SPEC, "executor": "a@b", "count": 1}, "executor", "bad_request"),
    ({"op": "create", "spec": SPEC, "executor": "local", "count": 1, "rate": 0}, "rate",
     "bad_request"),
    ({"op": "create", "spec": SPEC, "executor": "local", "count": 1, "intervals": {"x": 1}},
     "intervals", "bad_request"),
    ({"op": "create", "spec": SPEC, "executor": "local", "count": 1,
      "intervals": {"unknown": math.nan}}, "intervals.unknown", "bad_request"),
    ({"op": "create", "spec": SPEC, "executor": "local", "count": 1,
      "provisioning_leas": 60}, "provisioning_leas", "bad_request"),
    ({"op": "grow", "handle": "f1", "n": 1, "count": 2}, "count", "bad_request"),
    ({"op": "list", "handle": "f1"}, "handle", "bad_request"),
    ({"op": "create", "spec": SPEC, "executor": "local", "count": 1,
      "quota_policy": "random"}, "quota_policy", "bad_request"),
    ({"op": "create", "spec": SPEC, "executor": "local", "count": 1, "payload": "abc"},
     "payload", "bad_request"),
    ({"op": "create", "spec": SPEC, "executor": "local", "count": 1,
      "keep_classes": ["x"]}, "keep_classes", "bad_request"),
    ({"op": "create", "spec": {"executable": "/bin/\ud800"}, "executor": "local",
      "count": 1}, "spec.executable", "bad_request"),
    ({"op": "delete", "handle": "f1", "ids": "1.0"}, "ids", "bad_request"),
    ({"op": "upload", "data": "not base64!"}, "data", "bad_request"),
    ({"op": "upload"}, "data", "bad_request"),
    ({"op": "output", "handle": "f1", "instance": "1.0", "stream": "stdin"}, "stream",
     "bad_request"),
    ({"op": "fly"}, "op", "unknown_op"),
    ({"op": 3}, "op", "bad_request"),
    ({}, "op", "bad_request"),
    ({"op": "list", "id": {"a": 1}}, "id", "bad_request"),
])
def test_bad_requests_are_refused_naming_the_field(fields: Dict[str, Any], field: str,
                                                   code: str) -> None:
    sim = Sim()
    sim.create(1)
    conn = sim.conn_of(1000)
    message = {"id": "r1"}
    message.update(fields)
    answer = sim.send(conn, message)
    assert answer["ok"] is False, answer
    assert answer["error"]["code"] == code, answer
    if code == "bad_request":
        assert answer["error"]["field"] == field
        assert answer["error"]["message"].startswith(field.split(".")[0]) or field == "op"
    assert answer["id"] == (None if field == "id" else "r1")


def test_not_a_json_object_and_bad_lines_are_answered() -> None:
    sim = Sim()
    conn = sim.connect()
    assert sim.send(conn, [1, 2])["error"]["field"] == "request"
    before = len(sim.answers)
    sim.step(BadMessage(conn, "line is not JSON: Expecting value"))
    (_, answer), = sim.answers[before:]
    assert answer["error"]["field"] == "line" and answer["id"] is None
    # A line that was JSON but held a value no message may: its field, and its id.
    read = {"id": 12, "op": "create", "intervals": {"unknown": math.nan}}
    sim.step(BadMessage(conn, "intervals.unknown: NaN is not a finite number",
                        "intervals.unknown", read))
    (_, answer), = sim.answers[before + 1:]
    assert answer["id"] == 12 and answer["error"]["field"] == "intervals.unknown"
    assert answer["error"]["message"].startswith("intervals.unknown: NaN")


def test_an_unidentified_caller_is_refused() -> None:
    from psij.controller import Connected, Peer
    sim = Sim()
    sim.step(Connected(9, Peer(-1, -1, -1, "127.0.0.1:4000"), "tcp"))
    answer = sim.send(9, {"id": 1, "op": "list"})
    assert answer["error"]["code"] == "not_identified"


def test_the_machine_never_raises_on_garbage_events() -> None:
    sim = Sim()
    h = sim.create(3)
    sim.run()
    rng = random.Random(12)
    junk: List[Any] = [None, 1, "x", [], {}, math.nan, "\udcff", 10**40, -1, {"op": None}]
    events = [
        lambda: JobStatusChanged(rng.choice([f"{h}/0", f"{h}/1", "zz", 3]),
                                 rng.choice(junk)),
        lambda: ActionDone(rng.choice([f"{h}/2", "q", None]), rng.choice(["submit", "call"]),
                           rng.choice(junk)),
        lambda: ActionFailed(f"{h}/1", rng.choice(["submit", "attach", "signal", "cancel"]),
                             "boom", None),
        lambda: MessageReceived(1, rng.choice(junk)),
        lambda: MessageReceived(1, {"op": rng.choice(["create", "grow", "status", "output"]),
                                    "handle": rng.choice([h, "f9", junk[2]]),
                                    "n": rng.choice(junk), "spec": rng.choice(junk)}),
        lambda: SandboxMeasured(h, rng.choice([f"{h}/0", "x"]), rng.choice(junk)),
        lambda: PayloadVerified(rng.choice([f"{h}/0", "x"]), rng.choice([True, False]),
                                rng.choice(junk), "m"),
        lambda: PayloadStored(1000, "ab", False, "x"),
        lambda: TimerFired(rng.choice(junk)), Tick, lambda: Disconnected(77, "gone"),
        lambda: object(),
    ]
    for _ in range(3000):
        actions = sim.step(rng.choice(events)())
        assert all(type(a).__name__ != "Log" or "failed on" not in a.message for a in actions)
        sim.advance(rng.random())
    assert sim.call("status", handle=h)["ok"] is True


def test_a_stop_signal_stops_the_loop_and_leaves_instances_running() -> None:
    sim = Sim()
    sim.create(2)
    sim.run()
    actions = sim.step(SignalReceived(15))
    assert [type(a) for a in actions] == [Stop]
    assert sim.cancels == []
    assert Send and Submit


def test_the_service_submission_rate_holds_across_handles() -> None:
    sim = Sim(FlowConfig("/sb", max_submit_rate=5))
    for _ in range(4):
        sim.create(10, rate=100)
    assert len(sim.submits) == 5  # the service's burst, shared by all handles
    sim.advance(1)
    assert len(sim.submits) == 10
    sim.advance(6)
    assert len(sim.submits) == 40


def test_an_upload_too_large_is_refused() -> None:
    sim = Sim(FlowConfig("/sb", max_payload_bytes=10))
    answer = sim.call("upload", data=base64.b64encode(b"x" * 11).decode())
    assert answer["error"]["field"] == "data" and "1 to 10 bytes" in answer["error"]["message"]


def test_restore_survives_a_damaged_journal() -> None:
    from psij.flows.machine import FlowMachine
    machine = FlowMachine(FlowConfig("/sb"))
    junk: List[Any] = [
        ("handle", "f3", {"uid": 1000}),                      # fields missing
        ("handle", "fx", "not an object"),
        ("instance", "f3/0", {"handle": "f3"}),
        ("instance", "f9/0", {"handle": "f9", "n": 0, "submitted": 1.0, "state": "queued",
                              "native_id": "77"}),           # of no known handle
        ("payload", "1/x", {"uid": "x"}),
        ("meta", "machine", {"next_handle": 4}),
        "garbage", None, (1, 2),
    ]
    actions = machine.restore(junk, 1_700_000_000.0)
    assert all(type(a).__name__ in ("Log", "JournalDelete") for a in actions)
    sim = Sim(machine=machine)
    assert sim.create(1) == "f4"


def test_a_failing_rule_fails_only_its_event_and_the_timer_stays_set(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from psij.controller import Log
    from psij.flows import _core
    sim = Sim()
    h = sim.create(1)
    sim.run()

    def broken(*args: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(_core, "status_changed", broken)
    sim.timer = None
    sim.machine.armed = None
    actions = sim.step(JobStatusChanged(f"{h}/0", "whatever"))
    assert any(type(a) is Log and "RuntimeError('a bug')" in a.message for a in actions)
    assert sim.timer is not None  # the lease checks still come


def test_every_entry_of_the_one_timer_has_one_rule_and_a_due_kind() -> None:
    from psij.flows import _core
    assert set(_core._DUE_RULES) == set(_core.Due)
    sim = Sim()
    h = sim.create(2)
    sim.run()
    sim.call("shrink", handle=h, n=1, victims="longest", grace=300)
    kinds = []
    while True:
        entry = sim.machine.due.pop_due(float("inf"))
        if entry is None:
            break
        kinds.append(entry[1][0])
    assert _core.Due.KILL in kinds and _core.Due.LEASE in kinds
    assert all(type(kind) is _core.Due for kind in kinds)
