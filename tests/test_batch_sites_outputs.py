"""The PBS Pro, Torque, LSF, Cobalt and Flux executors, which cannot be tested against a real
scheduler here: canned outputs of their status, submit, cancel and list commands, for every
state code of their state maps, with garbage and error outputs. Their submit scripts are
in tests/test_batch_sites_scripts.py, end-to-end runs in tests/test_batch_sites_runs.py.
"""

import json
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from psij import Job, JobSpec, JobState, JobStatus, SubmitException
from psij.executors.batch import cobalt, flux, lsf, pbs, pbs_classic
from psij.executors.batch.batch_scheduler_executor import InvalidJobStateError
from psij.executors.batch.cobalt import CobaltJobExecutor
from psij.executors.batch.flux import FluxJobExecutor, jobid_to_decimal
from psij.executors.batch.lsf import LsfJobExecutor
from psij.executors.batch.pbs import PBSJobExecutor
from psij.executors.batch.pbs_classic import PBSClassicJobExecutor
from support.batch_sites import make


def meta(status: JobStatus) -> Dict[str, object]:
    assert status.metadata is not None
    return dict(status.metadata)


def held(status: JobStatus) -> bool:
    """Whether the status says that the scheduler holds the job (and says so in words)."""
    if meta(status).get("held_by") != "scheduler":
        return False
    assert status.state is JobState.QUEUED and "held by the scheduler" in str(status.message)
    return True


# ======================================================================== PBS Pro: qstat -F json

# The state each letter must map to, written out again (not derived from the map under test).
PBS_LIVE = {"B": JobState.ACTIVE, "E": JobState.ACTIVE, "H": JobState.QUEUED,
            "M": JobState.QUEUED, "Q": JobState.QUEUED, "R": JobState.ACTIVE,
            "S": JobState.ACTIVE, "T": JobState.QUEUED, "U": JobState.ACTIVE,
            "W": JobState.QUEUED}
PBS_ENDED = ("F", "X")


def pbs_json(jobs: Dict[str, Dict[str, object]]) -> str:
    """qstat -f -F json output as PBS Pro prints it (prolog, then the jobs)."""
    full = {}
    for job_id, attrs in jobs.items():
        full[job_id] = {"Job_Name": "psij", "Job_Owner": "alice@login1", "queue": "workq",
                        "server": "pbs1", "Checkpoint": "u", "ctime": "Fri Nov 11 17:57:05 2016",
                        "Resource_List": {"ncpus": 1, "nodect": 1, "walltime": "00:10:00"},
                        "Variable_List": "PBS_O_HOME=/home/alice,PBS_O_SHELL=/bin/bash",
                        **attrs}
    return json.dumps({"timestamp": 1479277336, "pbs_version": "19.1.3", "pbs_server": "pbs1",
                       "Jobs": full}, indent=4) + "\n"


@pytest.fixture
def pbs_ex(tmp_path: Path) -> PBSJobExecutor:
    ex = make("pbs", tmp_path)
    assert isinstance(ex, PBSJobExecutor)
    return ex


def test_pbs_map_is_fully_covered() -> None:
    assert set(pbs.STATE_MAP) == set(PBS_LIVE) | set(PBS_ENDED)


def test_pbs_every_live_state(pbs_ex: PBSJobExecutor) -> None:
    jobs = {f"{100 + i}.pbs1": {"job_state": code, "substate": 42, "comment": f"c{i}"}
            for i, code in enumerate(PBS_LIVE)}
    parsed = pbs_ex.parse_status_output(0, pbs_json(jobs))
    assert len(parsed) == len(PBS_LIVE)
    for i, (code, state) in enumerate(PBS_LIVE.items()):
        st = parsed[f"{100 + i}.pbs1"]
        assert st.state is state, code
        assert meta(st)["native_state"] == code and meta(st)["reason"] == f"c{i}"
        assert held(st) == (code == "H"), code


# (letter, attributes) -> (state, exit code, cause, message part)
PBS_ENDINGS: List[Tuple[Dict[str, object], JobState, Optional[int], Optional[str],
                        Optional[str]]] = [
    ({"Exit_status": 0, "substate": 92}, JobState.COMPLETED, 0, None, None),
    ({"Exit_status": 3, "substate": 92}, JobState.FAILED, 3, None, None),
    ({"Exit_status": 271, "substate": 91}, JobState.CANCELED, 143, None, None),
    ({"substate": 91, "comment": "Job deleted"}, JobState.CANCELED, None, None, None),
    ({"Exit_status": -29, "substate": 93}, JobState.FAILED, None, "time_limit", None),
    ({"Exit_status": -27, "substate": 93}, JobState.FAILED, None, "out_of_memory", None),
    ({"Exit_status": -26, "substate": 93}, JobState.FAILED, None, "out_of_memory", None),
    ({"Exit_status": -1, "substate": 93}, JobState.FAILED, None, "launch_failure", None),
    ({"Exit_status": -20, "substate": 93}, JobState.FAILED, None, "node_failure", None),
    ({"Exit_status": -28, "substate": 93}, JobState.FAILED, None, None, "CPU time limit"),
    ({"Exit_status": -99, "substate": 93}, JobState.FAILED, None, None, "exit status -99"),
    ({"Exit_status": 265, "substate": 92,
      "resources_used": {"walltime": "00:10:02"}}, JobState.FAILED, 137, "time_limit", None),
    ({"Exit_status": 271, "substate": 92,
      "comment": "job killed: walltime 130 exceeded limit 120"},
     JobState.FAILED, 143, "time_limit", None),
    ({"Exit_status": 265, "substate": 92, "resources_used": {"walltime": "00:00:03"}},
     JobState.FAILED, 137, None, None),
    ({"substate": 93, "comment": "Not Running: Insufficient amount of resource"},
     JobState.FAILED, None, None, "Insufficient amount of resource"),
]


@pytest.mark.parametrize("letter", PBS_ENDED)
@pytest.mark.parametrize("attrs,state,code,cause,message", PBS_ENDINGS)
def test_pbs_finished_jobs(pbs_ex: PBSJobExecutor, letter: str, attrs: Dict[str, object],
                           state: JobState, code: Optional[int], cause: Optional[str],
                           message: Optional[str]) -> None:
    st = pbs_ex.parse_status_output(0, pbs_json({"7.pbs1": {"job_state": letter, **attrs}}))[
        "7.pbs1"]
    assert (st.state, st.exit_code) == (state, code)
    assert meta(st).get("cause") == cause
    if message is not None:
        assert message in str(st.message)


def test_pbs_unknown_and_finished_ids_on_stderr(pbs_ex: PBSJobExecutor) -> None:
    document = pbs_json({"8.pbs1": {"job_state": "R"}})
    out = document.rstrip("\n") + "\nqstat: Unknown Job Id 9.pbs1\n"
    parsed = pbs_ex.parse_status_output(153, out)
    assert list(parsed) == ["8.pbs1"] and parsed["8.pbs1"].state is JobState.ACTIVE
    assert pbs_ex.parse_status_output(153, "qstat: Unknown Job Id 9.pbs1\n") == {}
    assert pbs_ex.parse_status_output(0, pbs_json({})) == {}


@pytest.mark.parametrize("exit_code,out", [
    (2, "qstat: cannot connect to server pbs1 (errno=111)\n"),
    (0, "<html>gateway timeout</html>\n"),
    (0, '{"Jobs": {"1.pbs1": {"job_state": "Z"}}}'),
    (0, '{"Jobs": {"1.pbs1": {"Job_Name": "x"}}}'),
    (0, '{"Jobs": {"1.pbs1": {"job_state": "F", "Exit_status": "lots"}}}'),
    (0, '{"Jobs": {"1.pbs1": {"job_state": '),
    (153, pbs_json({"8.pbs1": {"job_state": "R"}}) + "qstat: Server shutting down\n"),
])
def test_pbs_errors_and_garbage_raise(pbs_ex: PBSJobExecutor, exit_code: int,
                                      out: str) -> None:
    with pytest.raises((ValueError, RuntimeError)):
        pbs_ex.parse_status_output(exit_code, out)


def test_pbs_json_with_unescaped_backslash_is_read(pbs_ex: PBSJobExecutor) -> None:
    # Some PBS versions print Variable_List values without escaping their backslashes.
    out = pbs_json({"5.pbs1": {"job_state": "Q"}}).replace(
        "PBS_O_SHELL=/bin/bash", "PBS_O_SHELL=/bin/bash,X=a\\qb")
    assert pbs_ex.parse_status_output(0, out)["5.pbs1"].state is JobState.QUEUED


def test_pbs_submit_cancel_and_list_outputs(pbs_ex: PBSJobExecutor) -> None:
    assert pbs_ex.job_id_from_submit_output("1234.pbs1\n") == "1234.pbs1"
    assert pbs_ex.job_id_from_submit_output("1234[].pbs1.example.org\n") == \
        "1234[].pbs1.example.org"
    with pytest.raises(ValueError):
        pbs_ex.job_id_from_submit_output("qsub: Unknown queue\n")
    for gone in ("qdel: Unknown Job Id 12.pbs1", "qdel: Job has finished 12.pbs1"):
        with pytest.raises(InvalidJobStateError):
            pbs_ex.process_cancel_command_output(35, gone)
    with pytest.raises(SubmitException, match="Unauthorized Request"):
        pbs_ex.process_cancel_command_output(159, "qdel: Unauthorized Request  12.pbs1")
    assert pbs_ex.get_status_command(["1.a", "2.a"]) == \
        ["qstat", "-f", "-F", "json", "-x", "1.a", "2.a"]
    assert pbs_ex.parse_list_output("12.pbs1\n13.pbs1\n\n") == ["12.pbs1", "13.pbs1"]


# ========================================================================= Torque: qstat -f

TORQUE_LIVE = {"E": JobState.ACTIVE, "H": JobState.QUEUED, "Q": JobState.QUEUED,
               "R": JobState.ACTIVE, "T": JobState.QUEUED, "W": JobState.QUEUED,
               "S": JobState.ACTIVE}


def torque_block(job_id: str, state: str, extra: str = "") -> str:
    """One job of ``qstat -f`` output in Torque's layout (a long value wrapped with a tab)."""
    return (f"Job Id: {job_id}\n"
            "    Job_Name = STDIN\n"
            "    Job_Owner = user@host\n"
            f"    job_state = {state}\n"
            "    queue = batchq\n"
            "    Resource_List.walltime = 00:10:00\n"
            "    Variable_List = PBS_O_HOME=/home/user,PBS_O_LOGNAME=user,\n"
            "\tPBS_O_PATH=/usr/local/bin:/usr/bin,PBS_O_SHELL=/bin/bash,PBS_O_HOST=host,\n"
            "\tPBS_O_WORKDIR=/opt/moab,PBS_O_QUEUE=batchq\n"
            f"{extra}\n")


@pytest.fixture
def torque_ex(tmp_path: Path) -> PBSClassicJobExecutor:
    ex = make("pbs_classic", tmp_path)
    assert isinstance(ex, PBSClassicJobExecutor)
    return ex


def test_torque_map_is_fully_covered() -> None:
    assert set(pbs_classic.STATE_MAP) == set(TORQUE_LIVE) | {"C"}


def test_torque_every_live_state(torque_ex: PBSClassicJobExecutor) -> None:
    out = "".join(torque_block(f"{i}.host", code) for i, code in enumerate(TORQUE_LIVE))
    parsed = torque_ex.parse_status_output(0, out)
    for i, (code, state) in enumerate(TORQUE_LIVE.items()):
        assert parsed[f"{i}.host"].state is state, code
        assert meta(parsed[f"{i}.host"])["native_state"] == code
        assert held(parsed[f"{i}.host"]) == (code == "H"), code


@pytest.mark.parametrize("extra,state,code,cause", [
    ("    exit_status = 0\n", JobState.COMPLETED, 0, None),
    ("    exit_status = 3\n", JobState.FAILED, 3, None),
    ("    exit_status = 271\n    resources_used.walltime = 00:00:04\n", JobState.CANCELED,
     143, None),
    ("    exit_status = 271\n    resources_used.walltime = 00:10:01\n", JobState.FAILED, 143,
     "time_limit"),
    ("    exit_status = -11\n", JobState.FAILED, None, "time_limit"),
    ("    exit_status = -10\n", JobState.FAILED, None, "out_of_memory"),
    ("    exit_status = -1\n", JobState.FAILED, None, "launch_failure"),
    ("", JobState.FAILED, None, None),
])
def test_torque_completed_jobs(torque_ex: PBSClassicJobExecutor, extra: str, state: JobState,
                               code: Optional[int], cause: Optional[str]) -> None:
    st = torque_ex.parse_status_output(0, torque_block("5.host", "C", extra))["5.host"]
    assert (st.state, st.exit_code) == (state, code)
    assert meta(st).get("cause") == cause


def test_torque_continuation_lines_and_unknown_ids(torque_ex: PBSClassicJobExecutor) -> None:
    fields = pbs_classic.parse_qstat_full(torque_block("5.host", "R"))["5.host"]
    assert fields["Variable_List"].endswith("PBS_O_WORKDIR=/opt/moab,PBS_O_QUEUE=batchq")
    out = torque_block("5.host", "R") + "qstat: Unknown Job Id Error 6.host\n"
    assert list(torque_ex.parse_status_output(153, out)) == ["5.host"]
    assert torque_ex.parse_status_output(153, "qstat: Unknown Job Id Error 6.host\n") == {}
    for exit_code, bad in [(0, "garbage line\n"), (0, torque_block("5.host", "Z")),
                           (1, "qstat: cannot connect to server host (errno=111)\n"),
                           (1, torque_block("5.host", "R") + "pbs_iff: cannot read reply\n"),
                           (0, "Job Id: 5.host\n    Job_Name = x\n")]:
        with pytest.raises((ValueError, RuntimeError)):
            torque_ex.parse_status_output(exit_code, bad)
    with pytest.raises(InvalidJobStateError):
        torque_ex.process_cancel_command_output(
            168, "qdel: Request invalid for state of job MSG=invalid state for job - COMPLETE "
                 "5.host")


# ========================================================================== LSF: bjobs -json

LSF_LIVE = {"PEND": JobState.QUEUED, "PROV": JobState.QUEUED, "PSUSP": JobState.QUEUED,
            "WAIT": JobState.QUEUED, "RUN": JobState.ACTIVE, "USUSP": JobState.ACTIVE,
            "SSUSP": JobState.ACTIVE, "UNKWN": JobState.ACTIVE, "ZOMBI": JobState.ACTIVE}


def bjobs_json(records: List[Dict[str, str]]) -> str:
    return json.dumps({"COMMAND": "bjobs", "JOBS": len(records), "RECORDS": records},
                      indent=2) + "\n"


@pytest.fixture
def lsf_ex(tmp_path: Path) -> LsfJobExecutor:
    ex = make("lsf", tmp_path)
    assert isinstance(ex, LsfJobExecutor)
    return ex


def test_lsf_map_is_fully_covered() -> None:
    assert set(lsf.STATE_MAP) == set(LSF_LIVE) | {"DONE", "EXIT"}


def test_lsf_every_live_state(lsf_ex: LsfJobExecutor) -> None:
    records = [{"JOBID": str(300 + i), "STAT": code, "EXIT_CODE": "", "EXIT_REASON": ""}
               for i, code in enumerate(LSF_LIVE)]
    parsed = lsf_ex.parse_status_output(0, bjobs_json(records))
    for i, (code, state) in enumerate(LSF_LIVE.items()):
        assert parsed[str(300 + i)].state is state, code
        assert meta(parsed[str(300 + i)])["native_state"] == code
        # PSUSP: held until bresume; USUSP (suspended while running) is not a hold
        assert held(parsed[str(300 + i)]) == (code == "PSUSP"), code


@pytest.mark.parametrize("stat,code,reason,state,exit_code,cause", [
    ("DONE", "", "", JobState.COMPLETED, 0, None),
    ("EXIT", "3", "", JobState.FAILED, 3, None),
    ("EXIT", "130", "TERM_OWNER: job killed by owner", JobState.CANCELED, 130, None),
    ("EXIT", "130", "TERM_ADMIN: job killed by root or LSF administrator", JobState.CANCELED,
     130, None),
    ("EXIT", "140", "TERM_RUNLIMIT: job killed after reaching LSF run time limit",
     JobState.FAILED, 140, "time_limit"),
    ("EXIT", "137", "TERM_MEMLIMIT: job killed after reaching LSF memory usage limit",
     JobState.FAILED, 137, "out_of_memory"),
    ("EXIT", "143", "TERM_PREEMPT: job killed after preemption", JobState.FAILED, 143,
     "preempted"),
    ("EXIT", "", "TERM_DEADLINE: job killed after deadline expires", JobState.FAILED, None,
     "deadline"),
])
def test_lsf_finished_jobs(lsf_ex: LsfJobExecutor, stat: str, code: str, reason: str,
                           state: JobState, exit_code: Optional[int],
                           cause: Optional[str]) -> None:
    out = bjobs_json([{"JOBID": "41", "STAT": stat, "EXIT_CODE": code, "EXIT_REASON": reason}])
    st = lsf_ex.parse_status_output(0, out)["41"]
    assert (st.state, st.exit_code) == (state, exit_code)
    assert meta(st).get("cause") == cause and meta(st)["reason"] == (reason or None)
    if "TERM_ADMIN" in reason:
        assert "administrator" in str(st.message)


def test_lsf_unknown_ids_and_garbage(lsf_ex: LsfJobExecutor) -> None:
    out = bjobs_json([{"JOBID": "1", "STAT": "RUN", "EXIT_CODE": "", "EXIT_REASON": ""},
                      {"ERROR": "Job <2> is not found"}])
    assert list(lsf_ex.parse_status_output(0, out)) == ["1"]
    # bjobs exits 255 when none of the ids is known (LSB_BJOBS_CONSISTENT_EXIT_CODE).
    assert lsf_ex.output_means_no_jobs(255, "Job <2> is not found\n")
    assert not lsf_ex.output_means_no_jobs(255, "LSF is down. Please wait ...\n")
    assert not lsf_ex.output_means_no_jobs(255, "")
    # bjobs prints this before its answer while mbatchd is busy.
    busy = "Cannot connect to LSF. Please wait ...\n" + out
    assert list(lsf_ex.parse_status_output(0, busy)) == ["1"]
    for exit_code, bad in [(255, "LSF is down. Please wait ...\n"), (0, "no json here\n"),
                           (0, bjobs_json([{"JOBID": "1", "STAT": "BOGUS"}])),
                           (0, bjobs_json([{"JOBID": "1", "STAT": "EXIT", "EXIT_CODE": "x"}])),
                           (0, '{"COMMAND": "bjobs", "RECORDS": 3}')]:
        with pytest.raises((ValueError, RuntimeError)):
            lsf_ex.parse_status_output(exit_code, bad)


def test_lsf_submit_and_cancel_outputs(lsf_ex: LsfJobExecutor) -> None:
    assert lsf_ex.job_id_from_submit_output(
        "Job <6789> is submitted to default queue <normal>.\n") == "6789"
    assert lsf_ex.job_id_from_submit_output(
        "Cannot connect to LSF. Please wait ...\nJob <12> is submitted to queue <short>.\n") \
        == "12"
    with pytest.raises(ValueError):
        lsf_ex.job_id_from_submit_output("Bad project name. Job not submitted.\n")
    for gone in ("Job <5>: Job has already finished", "Job <5>: No matching job found"):
        with pytest.raises(InvalidJobStateError):
            lsf_ex.process_cancel_command_output(255, gone)
    # The script goes to bsub's standard input; its path is never part of the command.
    script = lsf_ex.work_directory / "it's a \"script\".job"
    script.parent.mkdir(parents=True)
    script.write_text("#BSUB -J x\n")
    assert lsf_ex.get_submit_command(Job(), script) == ["bsub"]
    assert lsf_ex.get_submit_stdin(Job(), script) == "#BSUB -J x\n"


# ==================================================================== Cobalt: qstat -l

COBALT_EXPECTED = {"queued": JobState.QUEUED, "dep_hold": JobState.QUEUED,
                   "maxrun_hold": JobState.QUEUED, "user_hold": JobState.QUEUED,
                   "admin_hold": JobState.QUEUED, "hold": JobState.QUEUED,
                   "starting": JobState.ACTIVE, "running": JobState.ACTIVE,
                   "killing": JobState.ACTIVE, "preempting": JobState.ACTIVE,
                   "preempted": JobState.QUEUED, "exiting": JobState.ACTIVE,
                   "done": JobState.ACTIVE, "dep_fail": JobState.FAILED}


@pytest.fixture
def cobalt_ex(tmp_path: Path) -> CobaltJobExecutor:
    ex = make("cobalt", tmp_path)
    assert isinstance(ex, CobaltJobExecutor)
    return ex


def test_cobalt_map_is_fully_covered() -> None:
    assert cobalt.STATE_MAP == COBALT_EXPECTED


def test_cobalt_every_state(cobalt_ex: CobaltJobExecutor) -> None:
    # Cobalt's vertical layout: "JobID: <id>", then names padded to the longest, then ": ".
    out = "".join(f"JobID: {500 + i}\n    State : {code}\n\n"
                  for i, code in enumerate(COBALT_EXPECTED))
    parsed = cobalt_ex.parse_status_output(0, out)
    for i, (code, state) in enumerate(COBALT_EXPECTED.items()):
        st = parsed[str(500 + i)]
        assert st.state is state and meta(st)["native_state"] == code
        # dep_hold and maxrun_hold end by themselves: waiting, not held
        assert held(st) == (code in ("user_hold", "admin_hold", "hold")), code
    assert "depends on" in str(parsed[str(500 + len(COBALT_EXPECTED) - 1)].message)


def test_cobalt_gone_jobs_garbage_and_outputs(cobalt_ex: CobaltJobExecutor) -> None:
    # qstat exits 1 without a word when none of the ids is in the queue.
    assert cobalt_ex.output_means_no_jobs(1, "")
    assert not cobalt_ex.output_means_no_jobs(1, "Failed to connect to queue manager\n")
    for exit_code, bad in [(0, "JobID: 1\n    State : exploding\n"), (0, "<html>\n"),
                           (1, "Failed to connect to queue manager\n"),
                           (0, "    State : running\n"), (0, "JobID: x1\n")]:
        with pytest.raises((ValueError, RuntimeError)):
            cobalt_ex.parse_status_output(exit_code, bad)
    assert cobalt_ex.job_id_from_submit_output("12345\n") == "12345"
    with pytest.raises(ValueError):
        cobalt_ex.job_id_from_submit_output("Not all required arguments provided\n")
    assert cobalt_ex.parse_list_output("JobID\n=====\n11\n12\n") == ["11", "12"]


# ======================================================================= Flux: flux jobs

FLUX_LIVE = {"DEPEND": JobState.QUEUED, "PRIORITY": JobState.QUEUED, "SCHED": JobState.QUEUED,
             "RUN": JobState.ACTIVE, "CLEANUP": JobState.ACTIVE}
# (result, returncode, exception type, note) -> (state, exit code, cause)
FLUX_ENDINGS = [
    ("COMPLETED", "0", "", "", JobState.COMPLETED, 0, None),
    ("FAILED", "3", "", "", JobState.FAILED, 3, None),
    ("FAILED", "-9", "", "", JobState.FAILED, 137, None),
    ("FAILED", "127", "exec", "task 0: start failed: nosuch: No such file or directory",
     JobState.FAILED, 127, "launch_failure"),
    ("FAILED", "", "node-failure", "lost contact with node12", JobState.FAILED, None,
     "node_failure"),
    ("CANCELED", "-128", "cancel", "", JobState.CANCELED, None, None),
    ("CANCELED", "-15", "cancel", "", JobState.CANCELED, 143, None),
    ("TIMEOUT", "-9", "timeout", "resource allocation expired", JobState.FAILED, 137,
     "time_limit"),
]


@pytest.fixture
def flux_ex(tmp_path: Path) -> FluxJobExecutor:
    ex = make("flux", tmp_path)
    assert isinstance(ex, FluxJobExecutor)
    return ex


def test_flux_maps_are_fully_covered() -> None:
    assert set(flux.STATE_MAP) == set(FLUX_LIVE) | {"INACTIVE"}
    assert set(flux.RESULT_MAP) == {e[0] for e in FLUX_ENDINGS}


def test_flux_job_ids() -> None:
    # RFC 19 examples: the same id in decimal and F58, with the UTF-8 or the ASCII prefix.
    assert jobid_to_decimal("\u0192D7j8aT") == "7952400384"
    assert jobid_to_decimal("fD7j8aT") == "7952400384"
    assert jobid_to_decimal("\u0192TKuuBXJyV") == "3371397661327360"
    assert jobid_to_decimal(" 7952400384\n") == "7952400384"
    for bad in ("\u0192D7j0aT", "xyz", "", "\u0192"):
        with pytest.raises(ValueError):
            jobid_to_decimal(bad)


def flux_line(job_id: str, state: str, result: str = "", code: str = "", exc: str = "",
              note: str = "", urgency: str = "16", figures: str = "||||||") -> str:
    # figures: t_submit|t_run|t_cleanup|t_inactive|ncores|nodelist|duration
    return f"{job_id}|{state}|{result}|{code}|{urgency}|{figures}|{exc}|{note}\n"


def test_flux_every_state(flux_ex: FluxJobExecutor) -> None:
    ids = ["\u0192D7j8aT", "\u0192TKuuBXJyV", "\u0192ABC", "\u0192z2", "\u01923"]
    out = "".join(flux_line(i, s) for i, s in zip(ids, FLUX_LIVE))
    parsed = flux_ex.parse_status_output(0, out)
    for job_id, (code, state) in zip(ids, FLUX_LIVE.items()):
        st = parsed[jobid_to_decimal(job_id)]
        assert st.state is state and meta(st)["native_state"] == code
        assert not held(st)


def test_flux_urgency_zero_is_held(flux_ex: FluxJobExecutor) -> None:
    # `flux job urgency ID hold` sets urgency 0: the job waits in SCHED (or PRIORITY) until
    # its urgency is raised again.
    out = (flux_line("\u0192D7j8aT", "SCHED", urgency="0")
           + flux_line("\u0192TKuuBXJyV", "PRIORITY", urgency="0")
           + flux_line("\u0192ABC", "SCHED", urgency="16")
           + flux_line("\u0192z2", "RUN", urgency="0"))
    parsed = flux_ex.parse_status_output(0, out)
    assert [held(parsed[jobid_to_decimal(i)]) for i in
            ("\u0192D7j8aT", "\u0192TKuuBXJyV", "\u0192ABC", "\u0192z2")] == \
        [True, True, False, False]


@pytest.mark.parametrize("result,code,exc,note,state,exit_code,cause", FLUX_ENDINGS)
def test_flux_inactive_jobs(flux_ex: FluxJobExecutor, result: str, code: str, exc: str,
                            note: str, state: JobState, exit_code: Optional[int],
                            cause: Optional[str]) -> None:
    out = flux_line("\u0192D7j8aT", "INACTIVE", result, code, exc, note)
    st = flux_ex.parse_status_output(0, out)["7952400384"]
    assert (st.state, st.exit_code) == (state, exit_code)
    assert meta(st).get("cause") == cause and meta(st)["result"] == result


def test_flux_notes_with_bars_unknown_ids_and_garbage(flux_ex: FluxJobExecutor) -> None:
    out = flux_line("\u0192D7j8aT", "INACTIVE", "FAILED", "1", "custom", "a | b | c")
    st = flux_ex.parse_status_output(0, out)["7952400384"]
    assert meta(st)["reason"] == "a | b | c" and "a | b | c" in str(st.message)
    both = flux_line("\u0192D7j8aT", "RUN") + "\u0192D7j8aU: not found\n"
    assert list(flux_ex.parse_status_output(0, both)) == ["7952400384"]
    assert flux_ex.parse_status_output(1, "flux-jobs: ERROR: 123: not found\n") == {}
    for exit_code, bad in [(0, flux_line("\u0192D7j8aT", "EXPLODED")),
                           (0, flux_line("\u0192D7j8aT", "INACTIVE", "WEIRD")),
                           (0, flux_line("\u0192D7j8aT", "INACTIVE", "FAILED", "x")),
                           (0, "hello world\n"), (0, flux_line("notanid", "RUN")),
                           (1, "flux-jobs: ERROR: Unable to connect to Flux\n")]:
        with pytest.raises((ValueError, RuntimeError)):
            flux_ex.parse_status_output(exit_code, bad)


def test_flux_submit_cancel_and_attach(flux_ex: FluxJobExecutor) -> None:
    assert flux_ex.job_id_from_submit_output("\u0192D7j8aT\n") == "7952400384"
    with pytest.raises(ValueError):
        flux_ex.job_id_from_submit_output("flux-batch: ERROR: unknown queue\n")
    for gone in ("flux-cancel: ERROR: job is inactive", "flux-cancel: ERROR: 12: unknown job"):
        with pytest.raises(InvalidJobStateError):
            flux_ex.process_cancel_command_output(1, gone)
    job = Job(JobSpec("/bin/true"))
    with pytest.raises(ValueError, match="not a Flux job id"):
        flux_ex.attach(job, "123abc")
    assert job.executor is None
