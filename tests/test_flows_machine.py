"""The flow machine's verbs, driven with a manual clock: create, grow, shrink (victims, signal
and grace), destroy, the two leases, status, ownership and restore after a restart."""

import signal
from typing import Any, List

import pytest

from psij import JobState
from psij.controller import Attach, Cancel, Log, Send, SetTimer, Submit
from psij.flows._verbs import FIELDS
from psij.flows.machine import (
    FlowConfig,
    FlowMachine,
    JournalDelete,
    JournalPut,
    MakeSandbox,
    MeasureSandbox,
    SignalJob,
)
from support.flow_sim import SPEC, Sim


def test_create_keeps_count_submitted_and_counts_active_as_provisioned() -> None:
    sim = Sim()
    h = sim.create(3)
    assert [s.key for s in sim.submits] == [f"{h}/0", f"{h}/1", f"{h}/2"]
    submit = sim.submits[0]
    assert submit.executor == "local"
    assert str(submit.spec.stdout_path) == f"/sb/1000/{h}/0.out"
    assert str(submit.spec.stderr_path) == f"/sb/1000/{h}/0.err"
    assert submit.spec.name == f"flow-{h}-0"
    assert MakeSandbox(f"/sb/1000/{h}", 1000) in sim.actions
    status = sim.call("status", handle=h)
    assert (status["requested"], status["provisioned"], status["waiting"]) == (3, 0, 3)
    sim.accept(JobState.QUEUED)
    sim.status(f"{h}/0", JobState.ACTIVE)
    status = sim.call("status", handle=h)
    assert (status["valid"], status["provisioned"], status["waiting"]) == (True, 1, 2)
    assert status["recently_started"] == 1
    assert sim.call("problems", handle=h) == {"id": sim.next_id, "ok": True, "problems": []}


def test_two_handles_are_independent() -> None:
    sim = Sim()
    a = sim.create(2)
    b = sim.create(1)
    assert a != b
    sim.run()
    sim.call("destroy", handle=a)
    assert sorted(sim.cancels) == [f"{a}/0", f"{a}/1"]
    assert sim.call("status", handle=b)["provisioned"] == 1
    assert sim.call("status", handle=a)["valid"] is False


def test_an_ended_instance_is_recorded_and_replaced() -> None:
    sim = Sim()
    h = sim.create(2)
    sim.run()
    sim.advance(120)
    sim.finish(f"{h}/0", exit_code=0)
    assert sim.unanswered == [f"{h}/2"]  # the replacement, at once (no_problem)
    assert MeasureSandbox(h, f"{h}/0", (f"/sb/1000/{h}/0.out", f"/sb/1000/{h}/0.err")) \
        in sim.actions
    [record] = sim.call("instances", handle=h)["instances"]
    native = sim.native[f"{h}/0"]
    assert record["id"] == f"{native}.0"
    assert record["exit_code"] == 0 and record["class"] == "no_problem"
    assert record["ended"] - record["started"] == 120
    assert record["stdout"] == f"/sb/1000/{h}/0.out"
    status = sim.call("status", handle=h)
    assert (status["provisioned"], status["waiting"], status["recently_terminated"]) == (1, 1, 1)


def test_a_job_cancelled_by_the_site_is_replaced() -> None:
    sim = Sim()
    h = sim.create(1)
    sim.run()
    sim.status(f"{h}/0", JobState.CANCELED)
    [record] = sim.call("instances", handle=h)["instances"]
    assert record["class"] == "unknown" and record["exit_code"] is None
    sim.advance(10)
    assert sim.unanswered == [f"{h}/1"]


def test_create_refusals_name_the_reason() -> None:
    sim = Sim(FlowConfig("/sb", max_per_handle=10, max_per_user=15, max_total=20,
                         executors=("local", "slurm"), max_handles_per_user=3))
    refused = sim.call("create", spec=SPEC, executor="local", count=11)
    assert refused["ok"] is False and refused["error"]["reason"] == "over_handle_max"
    refused = sim.call("create", spec=SPEC, executor="local", count=5, max_count=4)
    assert refused["error"]["reason"] == "over_handle_max"
    sim.create(10)
    refused = sim.call("create", spec=SPEC, executor="local", count=6)
    assert refused["error"]["reason"] == "over_user_max"
    sim.create(10, uid=1001)
    refused = sim.call("create", uid=1002, spec=SPEC, executor="local", count=1)
    assert refused["error"]["reason"] == "over_service_max"
    refused = sim.call("create", spec=SPEC, executor="pbs", count=1)
    assert refused["error"]["code"] == "refused"
    assert refused["error"]["reason"] == "unknown_executor"
    assert "local, slurm" in refused["error"]["message"]
    refused = sim.call("create", spec=SPEC, executor="local", count=1, payload="a" * 64)
    assert refused["error"]["reason"] == "unknown_payload"
    sim.create(0)
    sim.create(0)
    refused = sim.call("create", spec=SPEC, executor="local", count=0)
    assert refused["error"]["reason"] == "too_many_handles"


def test_grow_is_accepted_or_denied_with_a_reason() -> None:
    sim = Sim(FlowConfig("/sb", max_per_handle=5, max_total=8))
    h = sim.create(2)
    answer = sim.call("grow", handle=h, n=3)
    assert answer["accepted"] is True and answer["count"] == 5
    assert len(sim.submits) == 5
    answer = sim.call("grow", handle=h, n=1)
    assert answer["accepted"] is False and answer["reason"] == "over_handle_max"
    assert answer["count"] == 5 and len(sim.submits) == 5
    other = sim.create(2, uid=1001)
    answer = sim.call("grow", handle=other, uid=1001, n=2)
    assert (answer["accepted"], answer["reason"]) == (False, "over_service_max")


def _running(sim: Sim, h: str, count: int) -> List[str]:
    """``count`` instances started 100 s apart, oldest first; then the rest left queued."""
    keys = []
    for _ in range(count):
        [key] = sim.run(sim.unanswered[:1])
        keys.append(key)
        sim.advance(100)
    return keys


@pytest.mark.parametrize("victims", ["not_running", "shortest", "longest"])
def test_shrink_chooses_victims(victims: str) -> None:
    sim = Sim()
    h = sim.create(6)
    running = _running(sim, h, 4)
    queued = sim.accept(JobState.QUEUED)
    assert len(queued) == 2
    answer = sim.call("shrink", handle=h, n=3, victims=victims, grace=0)
    assert answer["count"] == 3
    if victims == "not_running":
        # Only the two queued ones can go; the third goes when an instance ends.
        assert sorted(answer["victims"]) == sorted(queued)
    elif victims == "shortest":
        assert sorted(answer["victims"]) == sorted([*queued, running[-1]])
    else:
        assert sorted(answer["victims"]) == sorted([*queued, running[0]])
    assert sorted(sim.cancels) == sorted(answer["victims"])
    for key in answer["victims"]:
        sim.status(key, JobState.CANCELED)
    status = sim.call("status", handle=h)
    assert status["requested"] == 3 and status["waiting"] == 0
    assert status["provisioned"] == (4 if victims == "not_running" else 3)
    sim.advance(600)
    assert sim.unanswered == []  # nothing submitted to make up
    if victims == "not_running":
        sim.finish(running[0], 0)  # attrition: not replaced
        sim.advance(600)
        assert sim.unanswered == []
        assert sim.call("status", handle=h)["provisioned"] == 3


def test_shrink_with_longest_keeps_the_youngest() -> None:
    sim = Sim()
    h = sim.create(6)
    running = _running(sim, h, 6)
    answer = sim.call("shrink", handle=h, n=4, victims="longest", grace=0)
    assert sorted(answer["victims"]) == sorted(running[:4])
    assert sorted(set(sim.live(h)) - set(answer["victims"])) == sorted(running[4:])


def test_shrink_signals_then_kills_after_the_grace() -> None:
    sim = Sim()
    h = sim.create(2)
    running = _running(sim, h, 2)
    answer = sim.call("shrink", handle=h, n=1, victims="longest", signal="SIGUSR1", grace=30)
    assert answer["victims"] == [running[0]]
    assert sim.signals == [(running[0], int(signal.SIGUSR1))]
    assert sim.cancels == []
    sim.advance(29.9)
    assert sim.cancels == []
    sim.advance(0.2)
    assert sim.cancels == [running[0]]
    sim.status(running[0], JobState.CANCELED, exit_code=143)
    [record] = sim.call("instances", handle=h)["instances"]
    assert record["class"] == "removed"


def test_a_victim_that_leaves_within_the_grace_is_not_cancelled() -> None:
    sim = Sim()
    h = sim.create(1)
    [key] = _running(sim, h, 1)
    sim.call("shrink", handle=h, n=1, victims="longest", signal=15, grace=30)
    sim.finish(key, 0)
    sim.advance(60)
    assert sim.cancels == []
    assert sim.unanswered == []


def test_without_grace_a_victim_goes_at_its_own_pace() -> None:
    sim = Sim()
    h = sim.create(1)
    [key] = _running(sim, h, 1)
    sim.call("shrink", handle=h, n=1, victims="shortest", signal="TERM", grace=None)
    assert sim.signals == [(key, int(signal.SIGTERM))]
    sim.advance(80000)  # within the cleanup lease
    assert sim.cancels == []
    status = sim.call("status", handle=h)
    assert (status["requested"], status["provisioned"]) == (0, 1)  # more than requested


def test_shrink_drops_restarts_no_longer_owed() -> None:
    sim = Sim()
    h = sim.create(3, intervals={"failed_init": 600})
    keys = sim.run()
    for key in keys:
        sim.finish(key, 64)
    sim.run()  # the first restart; two wait
    codes = [p["code"] for p in sim.call("problems", handle=h)["problems"]]
    assert codes == ["restarts_throttled"]
    sim.call("shrink", handle=h, n=2, signal=None)
    assert sim.call("problems", handle=h)["problems"] == []
    assert sim.signals == []
    sim.advance(3600)
    assert sim.unanswered == []


def test_a_signal_that_cannot_be_sent_cancels_at_once() -> None:
    from psij.controller import ActionFailed
    sim = Sim()
    h = sim.create(1)
    [key] = _running(sim, h, 1)
    sim.call("shrink", handle=h, n=1, victims="longest", grace=600)
    sim.step(ActionFailed(key, "signal", "qsig: no such verb", None))
    assert sim.cancels == [key]


def test_shrink_to_zero_ends_the_handle_when_asked() -> None:
    sim = Sim()
    h = sim.create(2)
    sim.run()
    kept = sim.call("shrink", handle=h, n=2, victims="longest", grace=0)
    assert kept["count"] == 0 and sim.call("status", handle=h)["valid"] is True
    g = sim.create(1)
    sim.run()
    sim.call("shrink", handle=g, n=1, victims="longest", grace=5, end_if_zero=True)
    status = sim.call("status", handle=g)
    assert (status["valid"], status["reason"]) == (False, "shrunk_to_zero")
    refused = sim.call("grow", handle=g, n=1)
    assert refused["error"]["code"] == "handle_ended"


def test_destroy_kills_everything_and_submits_nothing_again() -> None:
    sim = Sim()
    h = sim.create(4)
    sim.run(sim.unanswered[:2])
    sim.accept(JobState.QUEUED, sim.unanswered[:1])
    submitting = sim.unanswered[0]  # submission not returned yet
    assert sim.call("destroy", handle=h) == {"id": sim.next_id, "ok": True}
    assert sorted(sim.cancels) == sorted(k for k in sim.live(h) if k != submitting)
    sim.accept(JobState.QUEUED)  # the submission returns: cancelled then
    assert submitting in sim.cancels
    for key in sim.live(h):
        sim.status(key, JobState.CANCELED)
    sim.advance(3600)
    assert len(sim.submits) == 4
    status = sim.call("status", handle=h)
    assert (status["valid"], status["reason"], status["provisioned"]) == (False, "destroyed", 0)
    # Forgotten (records, journal and sandbox) after keep_ended.
    sim.advance(86400)
    assert sim.call("status", handle=h)["error"]["code"] == "unknown_handle"
    assert not [k for k in sim.journal if k[1].startswith(h)]


def test_the_cleanup_lease_expiring_destroys_the_handle() -> None:
    sim = Sim()
    h = sim.create(2, lease=600, provisioning_lease=300)
    sim.run()
    sim.advance(599)
    assert sim.cancels == []
    sim.advance(2)
    assert sorted(sim.cancels) == [f"{h}/0", f"{h}/1"]
    status = sim.call("status", handle=h)
    assert (status["valid"], status["reason"]) == (False, "lease_expired")


def test_the_provisioning_lease_expiring_stops_new_starts_but_keeps_running_ones() -> None:
    sim = Sim()
    h = sim.create(2, lease=7200, provisioning_lease=600)
    sim.run()
    sim.advance(601)
    sim.finish(f"{h}/0", 0)
    sim.advance(1000)
    assert sim.unanswered == [] and sim.cancels == []
    assert sim.call("status", handle=h)["provisioned"] == 1
    codes = [p["code"] for p in sim.call("problems", handle=h)["problems"]]
    assert codes == ["provisioning_lease_expired"]
    renewed = sim.call("renew", handle=h, provisioning_lease=600)
    assert renewed["provisioning_remaining"] == 600 and renewed["shortened"] is False
    assert sim.unanswered == [f"{h}/2"]
    assert sim.call("problems", handle=h)["problems"] == []


def test_leases_are_shortened_and_say_so_and_renew_reports_remaining_time() -> None:
    sim = Sim(FlowConfig("/sb", max_lease=3600, max_provisioning_lease=600))
    answer = sim.call("create", spec=SPEC, executor="local", count=1, lease=86400,
                      provisioning_lease=5000)
    assert answer["shortened"] is True
    assert answer["lease"] == 3600 and answer["provisioning_lease"] == 600
    assert {c["field"] for c in answer["changed"]} == {"lease", "provisioning_lease"}
    h = answer["handle"]
    sim.advance(100)
    status = sim.call("status", handle=h)
    assert (status["lease_remaining"], status["provisioning_remaining"]) == (3500, 500)
    renewed = sim.call("renew", handle=h, lease=60)
    assert renewed["lease_remaining"] == 60
    assert renewed["provisioning_remaining"] == 60  # never beyond the cleanup lease
    renewed = sim.call("renew", handle=h, lease=7200, provisioning_lease=100)
    assert renewed["shortened"] is True and renewed["lease_remaining"] == 3600
    assert renewed["provisioning_remaining"] == 100


def test_other_users_see_unknown_handle() -> None:
    sim = Sim()
    h = sim.create(1)
    for op in ("status", "grow", "shrink", "renew", "problems", "instances", "destroy",
               "delete", "output"):
        given = {"handle": h, "n": 1, "lease": 10, "ids": [], "instance": "x"}
        answer = sim.call(op, uid=1001, **{k: v for k, v in given.items() if k in FIELDS[op]})
        assert answer["error"]["code"] == "unknown_handle", op
    assert sim.call("list", uid=1001)["handles"] == []
    assert sim.call("list")["handles"] == [{"handle": h, "valid": True, "requested": 1}]
    assert sim.call("status", handle=h)["valid"] is True


def test_a_multi_user_service_submits_to_the_callers_executor() -> None:
    sim = Sim(FlowConfig("/sb", multi_user=True))
    h = sim.create(1, uid=1234, executor="slurm")
    assert sim.submits[0].executor == "slurm@1234"
    assert str(sim.submits[0].spec.stdout_path).startswith(f"/sb/1234/{h}/")


# -- restart ----------------------------------------------------------------------------------

def test_restore_reattaches_live_instances_and_submits_no_duplicate() -> None:
    sim = Sim()
    h = sim.create(4, lease=7200, provisioning_lease=3600)
    running = sim.run(sim.unanswered[:2])
    queued = sim.accept(JobState.QUEUED, sim.unanswered[:1])
    lost = sim.unanswered[0]  # being submitted when the service died
    sim.advance(50)
    sim.finish(running[0], 0)
    sim.run([f"{h}/4"])  # the replacement (lost's submission is still in flight)
    assert sim.unanswered == [lost]
    submitted_before = len(sim.submits)
    sim.advance(10)
    after = sim.restart()
    attached = sorted(a.key for a in after.restored if type(a) is Attach)
    assert attached == sorted([running[1], queued[0], f"{h}/4"])
    assert {a.native_id for a in after.restored if type(a) is Attach} == \
        {sim.native[k] for k in attached}
    # Only the lost one is replaced: one new submission, with a new key.
    assert [s.key for s in after.submits] == [f"{h}/5"]
    assert len(sim.submits) == submitted_before
    status = after.call("status", handle=h)
    assert status["requested"] == 4 and status["submission_errors"] == 1
    assert status["lease_remaining"] == 7200 - 60
    [record] = after.call("instances", handle=h)["instances"]
    assert record["id"] == f"{sim.native[running[0]]}.0"
    # The attached ones are followed again.
    after.finish(running[1], 0)
    assert after.unanswered[-1] == f"{h}/6"


def test_restore_after_a_lease_expired_while_stopped_destroys_and_keeps_ids_unique() -> None:
    sim = Sim()
    h = sim.create(1, lease=600)
    sim.run()
    sim.clock.advance(1000)  # the service was down when the lease expired
    after = sim.restart()
    assert after.cancels == [f"{h}/0"]
    assert after.call("status", handle=h)["reason"] == "lease_expired"
    new = after.create(1)
    assert new != h and int(new[1:]) > int(h[1:])


def test_restore_keeps_victims_grace_and_payload_references() -> None:
    sim = Sim()
    h = sim.create(2)
    running = _running(sim, h, 2)
    sim.call("shrink", handle=h, n=1, victims="longest", grace=300)
    after = sim.restart()
    after.advance(301)
    assert after.cancels == [running[0]]
    assert after.call("status", handle=h)["requested"] == 1
    assert [s for s in after.restored if type(s) is Submit] == []


def test_journal_holds_only_json_values() -> None:
    import json
    sim = Sim()
    h = sim.create(2)
    sim.run()
    sim.finish(f"{h}/0", 3)
    for action in sim.actions:
        if type(action) is JournalPut:
            json.dumps(action.value, allow_nan=False)
    assert SignalJob  # exported


# A journal as the service wrote it before instance states were an enum (one JSON text per
# record, as the journal's table keeps them).
_OLD_JOURNAL = [
    ("handle", "f1", '{"uid": 1000, "spec": {"executable": "/bin/sleep", "arguments": ["1000"]}, '
     '"executor": "local", "count": 2, "created": 1700000000.0, "max_count": null, "rate": 10.0, '
     '"intervals": {"failed_init": 60.0, "failed_after_work": 10.0, "never_claimed": 30.0, '
     '"no_work": 60.0, "no_problem": 0.0, "unknown": 10.0}, "termination_map": {}, '
     '"lease_expires": 1700086400.0, "provisioning_expires": 1700003600.0, '
     '"quota_bytes": 104857600, "quota_policy": "stop", "keep_classes": [], "payload": null, '
     '"sandbox": "/sb/1000/f1", "next_n": 2, "end_if_zero": false, "end_reason": null, '
     '"ended_at": null}'),
    ("meta", "machine", '{"next_handle": 2}'),
    ("instance", "f1/0", '{"handle": "f1", "n": 0, "state": "active", "submitted": 1700000000.0, '
     '"native_id": "5001", "started": 1700000000.0, "ended": null, "exit_code": null, '
     '"class": null, "size": 0, "output": "kept", "victim": false, "cancelled": false, '
     '"kill_at": null}'),
    ("instance", "f1/1", '{"handle": "f1", "n": 1, "state": "queued", "submitted": 1700000000.0, '
     '"native_id": "5002", "started": null, "ended": null, "exit_code": null, "class": null, '
     '"size": 0, "output": "kept", "victim": false, "cancelled": false, "kill_at": null}'),
]


def test_a_journal_of_string_states_reads_back_and_is_written_the_same() -> None:
    import json

    from psij.flows._handle import InstanceState
    machine = FlowMachine(FlowConfig("/sb"))
    actions = machine.restore([(kind, key, json.loads(text)) for kind, key, text in _OLD_JOURNAL],
                              1_700_000_010.0)
    assert not [a for a in actions if type(a) is Log]
    live = machine.handles["f1"].live
    assert live["f1/0"].state is InstanceState.ACTIVE
    assert live["f1/1"].state is InstanceState.QUEUED
    for kind, key, text in _OLD_JOURNAL:
        if kind == "instance":
            written = live[key].journal()
            assert type(written["state"]) is str
            assert json.dumps(written) == text
    assert sorted(a.key for a in actions if type(a) is Attach) == ["f1/0", "f1/1"]
    assert [s for s in actions if type(s) is Submit] == []


def test_an_instance_of_an_unknown_state_is_skipped_and_logged() -> None:
    import json
    machine = FlowMachine(FlowConfig("/sb"))
    records = [(kind, key, json.loads(text)) for kind, key, text in _OLD_JOURNAL]
    records[-1][2]["state"] = "dreaming"
    actions = machine.restore(records, 1_700_000_010.0)
    assert any(type(a) is Log and "f1/1" in a.message and "dreaming" in a.message
               for a in actions)
    assert "f1/1" not in machine.handles["f1"].live and "f1/0" in machine.handles["f1"].live


def test_renewing_often_keeps_one_lease_check_per_handle() -> None:
    sim = Sim()
    h = sim.create(1, lease=600, provisioning_lease=60)
    sim.run()
    for _ in range(2000):
        sim.advance(30)
        sim.call("renew", handle=h, lease=600, provisioning_lease=60)
    assert len(sim.machine.due) < 10
    assert sim.call("status", handle=h)["valid"] is True
    sim.advance(59)
    assert sim.call("problems", handle=h)["problems"] == []
    sim.advance(2)
    codes = [p["code"] for p in sim.call("problems", handle=h)["problems"]]
    assert codes == ["provisioning_lease_expired"]


def _kills(sim: Sim) -> List[object]:
    """(key, kill) of every Cancel the machine asked for."""
    from psij.controller import Cancel

    return [(a.key, a.kill) for a in sim.actions if type(a) is Cancel]


def test_the_grace_ends_with_a_kill_without_the_executors_own_grace() -> None:
    # The grace runs from the signal to the kill: at its end the executor is asked to kill
    # at once (JobExecutor.kill), not to cancel with its own grace period added.
    sim = Sim()
    h = sim.create(3)
    running = _running(sim, h, 3)
    sim.call("shrink", handle=h, n=1, victims="longest", signal="SIGTERM", grace=2)
    sim.advance(2.1)
    assert _kills(sim) == [(running[0], True)]
    sim.call("shrink", handle=h, n=1, victims="longest", signal=None, grace=0)
    assert _kills(sim)[1:] == [(running[1], True)]
    sim.call("destroy", handle=h)
    assert _kills(sim)[2:] == [(running[2], True)]


def test_a_signal_that_cannot_be_sent_falls_back_to_the_executors_cancel() -> None:
    from psij.controller import ActionFailed

    sim = Sim()
    h = sim.create(1)
    [key] = _running(sim, h, 1)
    sim.call("shrink", handle=h, n=1, victims="longest", signal="SIGUSR1", grace=30)
    sim.step(ActionFailed(key, "signal", "qsig: no such verb", None))
    assert _kills(sim) == [(key, False)]


def _held_by(machine: FlowMachine) -> List[Any]:
    """What the machine's attributes hold: each value, and each item of a list, tuple, set or
    dict among them."""
    held: List[Any] = []
    for value in vars(machine).values():
        held.append(value)
        if isinstance(value, dict):
            held.extend(value.values())
        elif isinstance(value, (list, tuple, set, frozenset)):
            held.extend(value)
    return held


def test_a_steps_actions_are_exactly_what_it_returns_and_the_machine_keeps_none() -> None:
    # The same events go to two machines; the caller of the second empties each list once
    # its step is over and fills it with junk. The actions agree, so no step writes into or
    # reads from the list of another, and nothing on the machine holds a step's list or any
    # action in it.
    def scenario(sim: Sim) -> None:
        h = sim.create(3)
        sim.run()
        sim.finish(f"{h}/0", 1)
        sim.advance(120)
        sim.run()
        sim.call("shrink", handle=h, n=1, victims="longest", signal=int(signal.SIGTERM),
                 grace=5)
        sim.advance(10)
        sim.call("status", handle=h)
        sim.call("destroy", handle=h)
        for key in sim.live(h):
            sim.status(key, JobState.CANCELED)
        sim.advance(86400 * 8)

    plain, spoiled = Sim(), Sim()
    machine = spoiled.machine
    step = machine.step
    lists: List[List[Any]] = []

    def step_then_spoil(event: Any, now: float) -> List[Any]:
        actions = step(event, now)
        assert all(actions is not before for before in lists)
        assert "out" not in vars(machine)
        held = _held_by(machine)
        assert not any(thing is actions or any(thing is a for a in actions) for thing in held)
        lists.append(actions)
        kept = list(actions)
        actions.clear()
        actions.append(Log("junk"))
        return kept

    machine.step = step_then_spoil  # type: ignore[method-assign]
    scenario(plain)
    scenario(spoiled)
    assert len(lists) > 10
    assert spoiled.actions == plain.actions
    assert Log("junk") not in plain.actions
    kinds = {type(a) for a in plain.actions}
    assert {Submit, Cancel, SignalJob, JournalPut, JournalDelete, SetTimer, Send} <= kinds
    before = Sim()
    before.create(2)
    before.run()
    fresh = before.restart()  # restore, then Started, which gives what restore gave again
    assert any(type(a) is Attach for a in fresh.restored) and not any(
        thing is a for thing in _held_by(fresh.machine) for a in fresh.restored)


def test_an_instance_run_again_waits_until_its_next_run_starts() -> None:
    # Its job requeued or retried (psij.requeue, psij.retry) is QUEUED again after it ran:
    # the instance is waiting, not provisioned, until the job is ACTIVE again, and it ends
    # once, with its start kept from its first run.
    sim = Sim()
    h = sim.create(1)
    sim.run()
    sim.advance(60)
    assert sim.call("status", handle=h)["provisioned"] == 1
    sim.status(f"{h}/0", JobState.QUEUED, metadata={"attempt": 2, "rerun": "requeue",
                                                    "cause": "preempted"})
    status = sim.call("status", handle=h)
    assert (status["provisioned"], status["waiting"]) == (0, 1)
    assert sim.unanswered == []  # nothing submitted in its place
    sim.status(f"{h}/0", JobState.ACTIVE, metadata={"attempt": 2})
    assert sim.call("status", handle=h)["provisioned"] == 1
    sim.advance(60)
    sim.finish(f"{h}/0", exit_code=0)
    [record] = sim.call("instances", handle=h)["instances"]
    assert record["ended"] - record["started"] == 120
