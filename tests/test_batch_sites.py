"""The PBS Pro, Torque, LSF, Cobalt and Flux executors, which cannot be tested against a real
scheduler here: canned outputs for every state code of their state maps, golden submit scripts
with hostile inputs, and end-to-end runs through fake scheduler commands
(``tests/fake_site_scheduler.py``) that run the submitted scripts for real.

Set PSIJ_UPDATE_GOLDEN=1 to rewrite tests/golden/<name>.sh after an intended change, then review
the difference.
"""

import json
import os
import re
import shlex
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Type

import pytest

import psij
from psij import (
    InvalidJobException,
    Job,
    JobAttributes,
    JobExecutor,
    JobSpec,
    JobState,
    JobStatus,
    ResourceSpecV1,
    SubmitException,
)
from psij.executors.batch import cobalt, flux, lsf, pbs, pbs_classic
from psij.executors.batch._runner import CommandResult
from psij.executors.batch._tracking import PollSucceeded
from psij.executors.batch.batch_scheduler_executor import (
    BatchSchedulerExecutor,
    BatchSchedulerExecutorConfig,
    InvalidJobStateError,
)
from psij.executors.batch.cobalt import CobaltJobExecutor
from psij.executors.batch.escape_functions import double_quoted, shell_word
from psij.executors.batch.flux import FluxJobExecutor, jobid_to_decimal
from psij.executors.batch.lsf import LsfJobExecutor
from psij.executors.batch.pbs import PBSJobExecutor
from psij.executors.batch.pbs_classic import PBSClassicJobExecutor

GOLDEN = Path(__file__).parent / "golden"
FAKE = Path(__file__).parent / "fake_site_scheduler.py"
HOSTILE_DIR = "/data/it's \"quoted\" $(whoami) `id` é ✓"
HOSTILE_NAME = "name with 'quotes' \"dq\" $(rm -rf ~) `id` é #not-a-comment"
EXECUTORS: Dict[str, Type[BatchSchedulerExecutor]] = {
    "pbs": PBSJobExecutor, "pbs_classic": PBSClassicJobExecutor, "lsf": LsfJobExecutor,
    "cobalt": CobaltJobExecutor, "flux": FluxJobExecutor}
WAIT = timedelta(seconds=30)


def make(name: str, work: Path) -> BatchSchedulerExecutor:
    return EXECUTORS[name](config=BatchSchedulerExecutorConfig(work_directory=work))


def meta(status: JobStatus) -> Dict[str, object]:
    assert status.metadata is not None
    return dict(status.metadata)


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
              note: str = "") -> str:
    return f"{job_id}|{state}|{result}|{code}|{exc}|{note}\n"


def test_flux_every_state(flux_ex: FluxJobExecutor) -> None:
    ids = ["\u0192D7j8aT", "\u0192TKuuBXJyV", "\u0192ABC", "\u0192z2", "\u01923"]
    out = "".join(flux_line(i, s) for i, s in zip(ids, FLUX_LIVE))
    parsed = flux_ex.parse_status_output(0, out)
    for job_id, (code, state) in zip(ids, FLUX_LIVE.items()):
        st = parsed[jobid_to_decimal(job_id)]
        assert st.state is state and meta(st)["native_state"] == code


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


# ======================================================================== golden scripts

# A custom attribute value each scheduler's directives can hold, and the option it becomes.
CUSTOM = {
    "pbs": {"pbs.W": "depend=afterok:12.pbs1", "pbs.m": "abe", "pbs.h": True},
    "pbs_classic": {"pbs.W": "depend=afterok:12.host", "pbs.m": "abe", "pbs.h": True},
    "lsf": {"lsf.R": "select[mem>4000 && type==any] span[hosts=1]", "lsf.B": True,
            "lsf.core_isolation": "0"},
    "cobalt": {"cobalt.attrs": "mcdram=cache:numa=quad", "cobalt.h": True,
               "cobalt.M": "user@example.org"},
    "flux": {"flux.requires": "host:node[1-2]", "flux.o": "cpu-affinity=per-task",
             "flux.unbuffered": True},
}


def full_job(name: str) -> Job:
    prefix = "pbs" if name.startswith("pbs") else name
    custom: Dict[str, object] = {**CUSTOM[name], f"{prefix}.off": False, "other.ignored": "x",
                                 "slurm.qos": "debug"}
    supported_memory = None if name == "flux" else 3 * 1024**3 + 1
    spec = JobSpec(
        executable="/opt/my app/run $(x).sh",
        arguments=["plain", "two words", "it's", "$(touch /tmp/pwned)", "`id`", "a\"b",
                   "back\\slash", "new\nline", "é ✓", ""],
        directory=HOSTILE_DIR, name=HOSTILE_NAME, inherit_environment=False,
        environment={"PLAIN": "v", "HOSTILE": "$(id) `id` \"q\" 'q' \\ $HOME\nline2", "NUM": 7},
        stdin_path="/in/put file.txt", stdout_path=f"{HOSTILE_DIR}/out.txt",
        stderr_path="/err/e r r's.txt",
        resources=ResourceSpecV1(node_count=2, processes_per_node=3, cpu_cores_per_process=2,
                                 gpu_cores_per_process=1, exclusive_node_use=True,
                                 memory=supported_memory),
        attributes=JobAttributes(duration=timedelta(days=1, hours=2, minutes=3, seconds=4),
                                 queue_name="debug", account="proj-42",
                                 reservation_id=None if name == "flux" else "resv.1",
                                 custom_attributes=custom),
        pre_launch="/etc/pre launch.sh", post_launch="post.sh", launcher="multiple")
    job = Job(spec)
    job._id = "00000000-1111-2222-3333-444444444444"
    return job


def render(ex: BatchSchedulerExecutor, job: Job) -> str:
    text = ex.submit_script(job)
    launch = ex._create_script_context(job)["psij"]["launch_command"]  # type: ignore[index]
    text = text.replace(shell_word(launch[1]), "<LAUNCHER_SCRIPT>")
    return text.replace(double_quoted(str(ex.work_directory.absolute())), "<SCRIPT_DIR>")


@pytest.fixture
def work(tmp_path: Path) -> Path:
    # The work directory is hostile too; it is replaced by <SCRIPT_DIR> in the golden files.
    return tmp_path / "work 'dir' \"q\" $(x) `y` é"


@pytest.mark.parametrize("name", sorted(EXECUTORS))
def test_golden_script(name: str, work: Path) -> None:
    text = render(make(name, work), full_job(name))
    golden = GOLDEN / f"{name}.sh"
    if os.environ.get("PSIJ_UPDATE_GOLDEN") == "1":
        GOLDEN.mkdir(exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text(), f"{name}: the script differs from {golden}"
    check = subprocess.run(["bash", "-n"], input=text.encode(), capture_output=True)
    assert check.returncode == 0, check.stderr.decode()
    assert "slurm" not in text and "other" not in text and "-off" not in text


def directive_words(text: str, prefix: str) -> List[List[str]]:
    """The words of each directive line, split the way the scheduler splits them."""
    return [shlex.split(line[len(prefix):]) for line in text.splitlines()
            if line.startswith(prefix)]


def test_pbs_directives(work: Path) -> None:
    lines = directive_words(render(make("pbs", work), full_job("pbs")), "#PBS")
    assert ["-N", "name_with__quotes___dq____rm_-rf_____id_____not-a-comment"] in lines
    assert ["-l", "select=2:ncpus=6:mpiprocs=3:ngpus=3:mem=3145729kb"] in lines
    assert ["-l", "place=scatter:exclhost"] in lines and ["-l", "walltime=26:03:04"] in lines
    # The reservation is the queue the job must go to.
    assert ["-q", "resv.1"] in lines and ["-q", "debug"] not in lines
    assert ["-A", "proj-42"] in lines and ["-W", "depend=afterok:12.pbs1"] in lines
    assert ["-m", "abe"] in lines and ["-h"] in lines and ["-V"] not in lines


def test_torque_directives(work: Path) -> None:
    lines = directive_words(render(make("pbs_classic", work), full_job("pbs_classic")), "#PBS")
    assert ["-l", "nodes=2:ppn=6:gpus=3"] in lines
    assert ["-l", "mem=6291458kb"] in lines and ["-n"] in lines
    assert ["-q", "debug"] in lines and ["-W", "x=ADVRES:resv.1"] in lines


def test_lsf_directives_read_back_exactly(work: Path) -> None:
    lines = directive_words(render(make("lsf", work), full_job("lsf")), "#BSUB")
    assert ["-n", "6"] in lines and ["-R", "span[ptile=3]"] in lines
    assert ["-R", "affinity[core(2)]"] in lines and ["-gpu", "num=1/task"] in lines
    assert ["-x"] in lines and ["-M", "1048577KB"] in lines and ["-W", "26:04"] in lines
    assert ["-q", "debug"] in lines and ["-P", "proj-42"] in lines and ["-U", "resv.1"] in lines
    assert ["-R", "select[mem>4000 && type==any] span[hosts=1]"] in lines
    assert ["-B"] in lines and ["-core_isolation", "0"] in lines and ["-env", "none"] in lines


def test_cobalt_directives(work: Path) -> None:
    text = render(make("cobalt", work), full_job("cobalt"))
    lines = directive_words(text, "#COBALT")
    assert ["-n", "2"] in lines and ["--proccount", "6"] in lines and ["-t", "1564"] in lines
    assert ["-q", "resv.1"] in lines and ["-A", "proj-42"] in lines
    assert ["--attrs=mcdram=cache:numa=quad"] in lines and ["-h"] in lines
    assert ["-M", "user@example.org"] in lines
    assert "also asked for: cpu_cores_per_process=2, gpu_cores_per_process=1" in text


def test_flux_directives_read_back_exactly(work: Path) -> None:
    lines = directive_words(render(make("flux", work), full_job("flux")), "# flux:")
    assert ["-N", "2"] in lines and ["-n", "6"] in lines and ["-c", "2"] in lines
    assert ["-g", "1"] in lines and ["--exclusive"] in lines and ["-t", "93784s"] in lines
    assert ["--queue=debug"] in lines and ["--setattr=system.bank=proj-42"] in lines
    assert ["--requires=host:node[1-2]"] in lines and ["-o", "cpu-affinity=per-task"] in lines
    assert ["--unbuffered"] in lines and ["--env=-*"] in lines


@pytest.mark.parametrize("name,field,value,accepted", [
    ("pbs", "queue_name", "all q", "' '"),
    ("pbs_classic", "account", "a;b", "';'"),
    ("cobalt", "queue_name", "q$(id)", "'$()'"),
    ("lsf", "queue_name", 'q"x', "'\"'"),
    ("lsf", "account", "a`id`", "'`'"),
    ("flux", "queue_name", "q$HOME", "'$'"),
    ("flux", "account", "back\\slash", "'\\\\'"),
])
def test_unsafe_directive_values_are_refused(name: str, field: str, value: str,
                                             accepted: str, work: Path) -> None:
    ex = make(name, work)
    attributes = JobAttributes()
    setattr(attributes, field, value)
    job = Job(JobSpec("/bin/true", attributes=attributes))
    with pytest.raises(InvalidJobException, match=f"{field}.*{re.escape(accepted)}"):
        ex.submit(job)
    assert job.executor is None and job.status.state is JobState.NEW
    assert not ex.work_directory.exists() or not list(ex.work_directory.glob("*.job"))


@pytest.mark.parametrize("name", sorted(EXECUTORS))
def test_newlines_in_directive_values_are_refused(name: str, work: Path) -> None:
    prefix = "pbs" if name.startswith("pbs") else name
    job = Job(JobSpec("/bin/true", attributes=JobAttributes(
        custom_attributes={f"{prefix}.x": "a\nb"})))
    with pytest.raises(InvalidJobException, match="newline"):
        make(name, work).submit_script(job)


def test_flux_refuses_memory_and_reservations(work: Path) -> None:
    ex = make("flux", work)
    with pytest.raises(InvalidJobException, match="ResourceSpecV1.memory: Flux cannot"):
        ex.submit(Job(JobSpec("/bin/true", resources=ResourceSpecV1(memory=1024))))
    with pytest.raises(InvalidJobException, match="reservation_id: Flux has no reservations"):
        ex.submit(Job(JobSpec("/bin/true", attributes=JobAttributes(reservation_id="r1"))))
    assert not ex.work_directory.exists() or not list(ex.work_directory.glob("*.job"))


@pytest.mark.parametrize("name", sorted(EXECUTORS))
def test_minimal_job_renders(name: str, work: Path) -> None:
    text = render(make(name, work), Job(JobSpec("/bin/true")))
    assert "<LAUNCHER_SCRIPT>" in text and "_PSIJ_NATIVE_ID=" in text
    assert subprocess.run(["bash", "-n"], input=text.encode()).returncode == 0


# ===================================================== end to end through fake commands

TOOLS = {"pbs": ("pbs", ["qsub", "qstat", "qdel", "qselect"]),
         "pbs_classic": ("torque", ["qsub", "qstat", "qdel", "qselect"]),
         "lsf": ("lsf", ["bsub", "bjobs", "bkill"]),
         "cobalt": ("cobalt", ["qsub", "qstat", "qdel"]),
         "flux": ("flux", ["flux"])}
SUBMIT_ERRORS = {"pbs": "qsub: Unknown queue", "pbs_classic": "Unknown queue MSG=cannot locate",
                 "lsf": "No such queue. Job not submitted",
                 "cobalt": "'nosuchqueue' is not a valid queue name",
                 "flux": "Invalid queue 'nosuchqueue' specified"}


@pytest.fixture(params=sorted(EXECUTORS))
def site(request: pytest.FixtureRequest, tmp_path: Path,
         monkeypatch: pytest.MonkeyPatch) -> Iterator[Tuple[str, BatchSchedulerExecutor]]:
    """An executor whose scheduler commands are the fakes, first on PATH."""
    name: str = request.param
    executor = fake_site(name, tmp_path, monkeypatch)
    yield name, executor
    executor.close()


def fake_site(name: str, tmp_path: Path,
              monkeypatch: pytest.MonkeyPatch) -> BatchSchedulerExecutor:
    flavour, tools = TOOLS[name]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    spool = tmp_path / "spool"
    for tool in tools:
        wrapper = bin_dir / tool
        args = [sys.executable, "-S", str(FAKE), str(spool), flavour]
        if tool != "flux":
            args.append(tool)
        wrapper.write_text(f"#!/bin/sh\nexec {' '.join(map(shlex.quote, args))} \"$@\"\n")
        wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    config = BatchSchedulerExecutorConfig(work_directory=tmp_path / "work",
                                          queue_polling_interval=0.2,
                                          initial_queue_polling_delay=0.1)
    executor = JobExecutor.get_instance(name, config=config)
    assert isinstance(executor, BatchSchedulerExecutor)
    return executor


def test_lsf_script_goes_to_bsub_on_stdin(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    ex = fake_site("lsf", tmp_path, monkeypatch)
    calls = []
    real = ex._runner

    class Recording:
        def run(self, argv: Sequence[str], timeout: float,
                stdin: Optional[str] = None) -> CommandResult:
            calls.append((tuple(argv), stdin))
            return real.run(argv, timeout, stdin)

    ex._runner = Recording()
    job = Job(JobSpec("/bin/true", name="on stdin"))
    ex.submit(job)
    argv, stdin = calls[0]
    assert argv == ("bsub",)  # no shell, no path: the fake bsub reads the script on stdin
    assert stdin is not None and "#BSUB -J \"on_stdin\"" in stdin
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED, st
    ex.close()


def test_lsf_bjobs_exit_255_means_no_jobs(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LSB_BJOBS_CONSISTENT_EXIT_CODE", "Y")
    ex = fake_site("lsf", tmp_path, monkeypatch)
    result = ex._run(ex.get_list_command())
    assert result.exit_code == 255 and "No job found" in result.stderr
    assert ex.list() == []
    event = ex._poll_status(["404"])
    assert isinstance(event, PollSucceeded) and event.observations == {}
    job = Job(JobSpec("/bin/sleep", ["30"]))
    ex.submit(job)
    assert ex.list() == [job.native_id]
    job.cancel()
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.CANCELED, st
    ex.close()


def test_cobalt_script_is_executable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ex = fake_site("cobalt", tmp_path, monkeypatch)
    ex.batch_config.keep_files = True
    job = Job(JobSpec("/bin/true"))
    ex.submit(job)  # the fake qsub refuses scripts that are not executable
    script = ex.work_directory / f"{job.id}.job"
    assert script.stat().st_mode & 0o777 == 0o700
    assert type(ex).SCRIPT_MODE == 0o700
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED, st
    ex.close()


def test_end_to_end(site: Tuple[str, BatchSchedulerExecutor], tmp_path: Path) -> None:
    name, ex = site
    out = tmp_path / "out put's.txt"
    err = tmp_path / "err.txt"
    hello = Job(JobSpec("/bin/echo", ["hello", "it's", "$(id)", "é ✓"], stdout_path=out))
    failing = Job(JobSpec("/bin/sh", ["-c", "echo 'disk full' >&2; exit 3"],
                          stderr_path=err))
    sleeper = Job(JobSpec("/bin/sleep", ["30"]))
    for job in (hello, failing, sleeper):
        ex.submit(job)
        assert job.native_id and job.status.state is JobState.QUEUED
    assert sleeper.wait(WAIT, target_states=[JobState.ACTIVE]) is not None
    assert set(ex.list()) >= {sleeper.native_id}
    sleeper.cancel()

    st = hello.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED and st.exit_code == 0, st
    assert out.read_text() == "hello it's $(id) é ✓\n"
    st = failing.wait(WAIT)
    assert st is not None and st.state is JobState.FAILED and st.exit_code == 3, st
    assert "code 3" in str(st.message) and "disk full" in str(st.message)
    st = sleeper.wait(WAIT)
    assert st is not None and st.state is JobState.CANCELED, st
    # The files of finished jobs are gone (keep_files is off).
    assert not list(ex.work_directory.glob("*.job")), name


def test_exit_code_file_is_named_after_the_native_id(
        site: Tuple[str, BatchSchedulerExecutor]) -> None:
    _, ex = site
    ex.batch_config.keep_files = True
    job = Job(JobSpec("/bin/sh", ["-c", "exit 5"]))
    ex.submit(job)
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.FAILED and st.exit_code == 5, st
    assert (ex.work_directory / f"{job.native_id}.ec").read_text() == "5\n"
    assert (ex.work_directory / f"{job.id}.job").is_file()


def test_cancel_while_pending(site: Tuple[str, BatchSchedulerExecutor]) -> None:
    _, ex = site
    # The fake scheduler keeps jobs of the queue "held" waiting until they are cancelled.
    job = Job(JobSpec("/bin/true", attributes=JobAttributes(queue_name="held")))
    ex.submit(job)
    assert job.wait(timedelta(seconds=0.6)) is None and job.status.state is JobState.QUEUED
    job.cancel()
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.CANCELED, st


def test_two_processes_see_their_nodefile(site: Tuple[str, BatchSchedulerExecutor],
                                          tmp_path: Path) -> None:
    _, ex = site
    out = tmp_path / "lines.txt"
    job = Job(JobSpec("/bin/sh", ["-c", 'wc -l < "$PSIJ_NODEFILE"'], stdout_path=out,
                      launcher="multiple",
                      resources=ResourceSpecV1(process_count=2, cpu_cores_per_process=2)))
    ex.submit(job)
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED, st
    assert out.read_text().split() == ["2", "2"]


def test_submit_errors_carry_the_scheduler_message(site: Tuple[str, BatchSchedulerExecutor]
                                                   ) -> None:
    name, ex = site
    job = Job(JobSpec("/bin/true", attributes=JobAttributes(queue_name="nosuchqueue")))
    with pytest.raises(SubmitException) as raised:
        ex.submit(job)
    message = str(raised.value)
    assert SUBMIT_ERRORS[name] in message and "submit script is kept at" in message
    kept = Path(message.rsplit("kept at ", 1)[1].split()[0])
    assert kept.is_file() and "nosuchqueue" in kept.read_text()
    assert job.executor is None and job.status.state is JobState.NEW


def test_cancel_of_a_finished_job_is_quiet(site: Tuple[str, BatchSchedulerExecutor]) -> None:
    _, ex = site
    job = Job(JobSpec("/bin/true"))
    ex.submit(job)
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED
    assert job.native_id is not None
    result = ex._run(ex.get_cancel_command(job.native_id))
    if not result.ok:
        with pytest.raises(InvalidJobStateError):
            ex.process_cancel_command_output(result.exit_code or 1, result.output)


def test_attach_from_another_executor(site: Tuple[str, BatchSchedulerExecutor],
                                      tmp_path: Path) -> None:
    name, ex = site
    job = Job(JobSpec("/bin/sh", ["-c", "sleep 0.5; exit 4"]))
    ex.submit(job)
    assert job.native_id is not None
    ex.close()  # from here on only the other executor follows the job (and reads its files)
    config = BatchSchedulerExecutorConfig(work_directory=tmp_path / "work",
                                          queue_polling_interval=0.2,
                                          initial_queue_polling_delay=0.1)
    other = JobExecutor.get_instance(name, config=config)
    assert isinstance(other, BatchSchedulerExecutor)
    try:
        twin = Job()
        native = job.native_id
        if name == "flux":
            native = subprocess.run(["flux", "jobs", "-n", "-o", "{id.f58}", native],
                                    capture_output=True, text=True).stdout.strip()
            assert native.startswith("\u0192")
        other.attach(twin, native)
        st = twin.wait(WAIT)
        assert st is not None and st.state is JobState.FAILED and st.exit_code == 4, st
        assert twin.native_id == job.native_id
    finally:
        other.close()


class _OtherResourceSpec(psij.ResourceSpec):
    @property
    def version(self) -> int:
        return 2


@pytest.mark.parametrize("name", ["slurm", "sge", "pbs", "pbs_classic", "lsf", "cobalt", "flux",
                                  "batch-test"])
def test_resources_other_than_v1_are_refused_naming_the_field(name: str, tmp_path: Path) -> None:
    ex = psij.JobExecutor.get_instance(
        name, config=psij.JobExecutorConfig(work_directory=tmp_path))
    job = psij.Job(psij.JobSpec("/bin/true", resources=_OtherResourceSpec()))
    with pytest.raises(psij.InvalidJobException, match="JobSpec.resources"):
        ex.submit_script(job)  # type: ignore[attr-defined]
