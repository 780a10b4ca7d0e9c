"""How ``psij`` commands find the jobs users name (psij id, id prefix, native id), the CAUSE
column and ``--wide`` of the job tables, and ``psij wait --timeout``: the console script run as
users run it, on the registry of a private HOME."""

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, List, Optional

import pytest

import psij.registry
from psij import JobState
from test_cli_jobs import PSIJ, env, listed, psij_cmd
from test_registry_reruns import Rerunning, failed_oom, retried

# Two jobs of different schedulers with the same native id, an array's two elements, a PBS job
# recorded with its server, and ids with the characters SQL patterns use.
A = "3f2a1111-aaaa-4bbb-8ccc-000000000001"
B = "3f2a2222-aaaa-4bbb-8ccc-000000000002"
E4 = "7b001111-aaaa-4bbb-8ccc-000000000003"
E5 = "7b002222-aaaa-4bbb-8ccc-000000000004"
PBS = "c0ffee00-aaaa-4bbb-8ccc-000000000005"
ODD = "a_%x-1"
NATIVE_IS_PREFIX = "d00d0000-aaaa-4bbb-8ccc-000000000006"  # native id 7b00: a prefix of E4, E5
LONG = "walltime exceeded " * 10


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    return h


def fill(home: Path, *extra: Any) -> None:
    from psij._registry.accounting import NO_USE
    from psij._registry.store import open_store

    now = time.time()

    def row(job_id: str, executor: str, native: str, state: str = "COMPLETED",
            message: Optional[str] = None, cause: Optional[str] = None) -> Any:
        return (job_id, executor, "0", None, "{}", native, None, None, now, state, 6, 0,
                message, now, 1, 1, None, cause, *NO_USE)

    open_store(home / ".psij" / "work").write([
        row(A, "slurm", "2415", "FAILED", LONG, "time_limit"), row(B, "sge", "2415"),
        row(E4, "slurm", "900_4"), row(E5, "slurm", "900_5"), row(PBS, "pbs", "77.server"),
        row(ODD, "local", "5", "FAILED", "bad\x1b[31mred\nsecond line", "out_of_memory"),
        row(NATIVE_IS_PREFIX, "lsf", "7b00"), *[row(*e) for e in extra]], [])


def named(home: Path, word: str, command: str = "status") -> List[str]:
    """The ids ``psij COMMAND WORD --json`` shows."""
    done = psij_cmd(home, command, "--json", "--", word)
    assert done.returncode == 0, done.stderr
    return [j["id"] for j in json.loads(done.stdout)]


def refused(home: Path, *args: Any) -> str:
    """stderr of a command refused as bad usage (status 2), with nothing on stdout."""
    done = subprocess.run([PSIJ, *args], capture_output=True, env=env(home), timeout=120)
    err = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 2, (args, done.returncode, err)
    assert done.stdout == b"" and "Traceback" not in err, err
    return err


FOUND = [
    (A, [A]),  # the whole id
    ("3f2a1", [A]), ("3f2a2222", [B]),  # a unique prefix
    ("900_4", [E4]), ("900[4]", [E4]), ("900.5", [E5]),  # an element, in any spelling
    ("77", [PBS]), ("77.server", [PBS]),  # a PBS job, with or without its server
    ("5", [ODD]), (ODD, [ODD]),
]


@pytest.mark.parametrize("word, ids", FOUND)
def test_a_job_is_found_by_its_id_a_prefix_or_its_native_id(home: Path, word: str,
                                                            ids: List[str]) -> None:
    fill(home)
    assert named(home, word) == ids


def test_many_words_are_found_by_the_same_rules(home: Path) -> None:
    # From 20 words on, the registry is read once and indexed rather than asked per word.
    more = [(f"e{i:04}-aaaa", "slurm", str(5000 + i)) for i in range(20)]
    fill(home, *more)
    words = [w for w, _ in FOUND[1:]] + [native for _, _, native in more]
    done = psij_cmd(home, "status", "--json", *words)
    assert done.returncode == 0, done.stderr
    assert [j["id"] for j in json.loads(done.stdout)] == [A, B, E4, E5, PBS, ODD] + [
        job_id for job_id, _, _ in more]
    err = refused(home, "status", *words, "2415", "900", "7b00", "3f2", "nope")
    assert "no recorded job with id 3f2, nope (nor with them" in err
    assert f"ID '2415' names 2 recorded jobs: {A} (slurm" in err
    assert f"ID '900' names 2 recorded jobs: {E4} (slurm, native id 900_4" in err
    assert f"ID '7b00' names 3 recorded jobs: {E4}" in err and NATIVE_IS_PREFIX in err


def test_the_whole_id_wins_over_a_native_id_equal_to_it(home: Path) -> None:
    fill(home, ("2415", "local", "1"))  # a job whose psij id is another's native id
    assert named(home, "2415") == ["2415"]


@pytest.mark.parametrize("word, candidates", [
    ("2415", [A, B]),  # one native id in two schedulers
    ("3f2a", [A, B]),  # a prefix of two ids
    ("900", [E4, E5]),  # an array's number: its elements
    ("7b00", [E4, E5, NATIVE_IS_PREFIX]),  # a prefix of two ids and a third job's native id
])
def test_a_word_naming_several_jobs_is_refused_with_each_of_them(home: Path, word: str,
                                                                 candidates: List[str]) -> None:
    fill(home)
    for command in ("status", "wait", "cancel", "release"):
        err = refused(home, command, word)
        assert f"ID '{word}' names {len(candidates)} recorded jobs" in err, err
        for candidate in candidates:
            assert candidate in err
        assert "whole psij id" in err
    assert "(slurm, native id 2415, FAILED)" in refused(home, "status", "2415")
    assert "(sge, native id 2415, COMPLETED)" in refused(home, "priority", "2415", "5")


@pytest.mark.parametrize("word", [
    "3f2", "3f", "%", "%%%%", "____", "3f2_", "3f2%", "7b0_", "*", "2415*", "24", "241",
    "900_", "900_6", "900[]", "77.other", ODD[:3], A + "x", A.upper(),
])
def test_a_word_naming_no_job_is_refused(home: Path, word: str) -> None:
    # Short prefixes are no prefixes; SQL and glob patterns are plain characters.
    fill(home)
    err = refused(home, "status", "--", word)
    assert f"no recorded job with id {word} (nor with it as the beginning of an id, of 4 " \
           "characters or more, or as a native id)" in err, err


@pytest.mark.parametrize("word, says", [
    (b"", "an empty id names no job"),
    (b" ", "contains a space or a control character"),
    (b" 2415", "contains a space or a control character"),
    (b"24\n15", "contains a space or a control character"),
    (b"2415\t", "contains a space or a control character"),
    (b"\x1b[2J", "contains a space or a control character"),
    (b"\xff\xfe", "not valid text"),  # a lone surrogate once decoded
    (b"x" * 10000, "10000 characters; an id has at most 256"),
])
def test_hostile_words_are_clear_usage_errors(home: Path, word: bytes, says: str) -> None:
    fill(home)
    for command in ("status", "wait", "cancel", "release"):
        assert says in refused(home, command, "--", word)
    assert says in refused(home, "priority", "--", word, "5")


def test_several_words_are_each_resolved_and_each_problem_named(home: Path) -> None:
    fill(home)
    assert named(home, "3f2a1") == [A]
    done = psij_cmd(home, "status", "--json", "3f2a1", "900.5", "77", A)
    assert done.returncode == 0, done.stderr
    assert [j["id"] for j in json.loads(done.stdout)] == [A, E5, PBS]  # once each
    err = refused(home, "status", "nope1", "3f2a", "nope2")
    assert "no recorded job with id nope1, nope2 (nor with them" in err
    assert "ID '3f2a' names 2 recorded jobs" in err


def test_a_live_job_is_found_cancelled_and_waited_for_by_its_native_id(home: Path) -> None:
    jid = psij_cmd(home, "submit", "--", "/bin/sleep", "600").stdout.strip()
    pid = jid  # until its native id is known
    try:
        [job] = listed(home, "status", jid[:8])
        pid = job["native_id"]
        assert job["id"] == jid and pid.isdigit() and job["state"] == "ACTIVE"
        assert [j["id"] for j in listed(home, "status", pid)] == [jid]
        # Not final within the timeout: its own exit status, the job as it is.
        waited = psij_cmd(home, "wait", "--timeout", "0.5", "--json", pid)
        assert waited.returncode == 124, waited.stderr
        assert [(j["id"], j["state"]) for j in json.loads(waited.stdout)] == [(jid, "ACTIVE")]
        assert f"1 job(s) not final after 0.5 s: {jid}" in waited.stderr
        progress = psij_cmd(home, "wait", "--timeout", "0", "--progress", pid)
        assert progress.returncode == 124 and "not final after 0 s" in progress.stderr
    finally:
        cancel = psij_cmd(home, "cancel", pid)
    assert cancel.returncode == 0, cancel.stderr
    waited = psij_cmd(home, "wait", "--timeout", "60", jid[:6])
    assert waited.returncode == 130, waited.stderr  # final in time: the job's own status


def test_wait_timeout_of_final_jobs_gives_their_status(home: Path) -> None:
    fill(home)
    assert psij_cmd(home, "wait", "--timeout", "0", "3f2a2").returncode == 0
    assert psij_cmd(home, "wait", "--timeout", "0", "3f2a1").returncode == 1


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "-1", "-0.5", "1e10", "abc",
                                   "", " ", "1s", "0x10", "\udcff"])
def test_wait_refuses_a_timeout_that_is_no_number_of_seconds(home: Path, value: str) -> None:
    fill(home)
    err = refused(home, "wait", b"--timeout=" + value.encode("utf-8", "surrogateescape"), A)
    assert "--timeout" in err and "expected a number of seconds from 0 to 1e+09" in err


def test_the_table_has_a_cause_column_and_wide_shows_whole_messages(home: Path) -> None:
    fill(home)
    for command in (["list"], ["status", "3f2a1", "5", "3f2a2"], ["wait", "3f2a1", "5"]):
        narrow = psij_cmd(home, *command).stdout.splitlines()
        wide = psij_cmd(home, *command, "--wide").stdout.splitlines()
        assert narrow[0].split() == ["ID", "EXECUTOR", "NATIVE_ID", "TAG", "STATE", "EXIT",
                                     "CAUSE", "MESSAGE"]
        assert wide[0] == narrow[0]
        rows = {line.split()[0]: line for line in narrow[1:]}
        whole = {line.split()[0]: line for line in wide[1:]}
        assert rows[A].split()[6] == "time_limit"
        assert rows[A].endswith(" " + LONG.strip()[:57] + "...")
        assert whole[A].endswith(" " + LONG.strip())
        # On one line; a terminal's escape is shown, not sent.
        assert rows[ODD].split()[6] == "out_of_memory"
        assert whole[ODD].endswith(r" bad\x1b[31mred second line")
        assert "\x1b" not in "".join(narrow + wide)
        if "3f2a2" in command or command == ["list"]:
            assert rows[B].split()[6] == "-"
    views = {v["id"]: v for v in listed(home, "list")}
    assert (views[A]["cause"], views[B]["cause"]) == ("time_limit", None)
    assert views[ODD]["message"] == "bad\x1b[31mred\nsecond line"  # as recorded


def test_the_cause_an_executor_gives_a_final_state_is_recorded(home: Path) -> None:
    wd = home / ".psij" / "work"
    again = Rerunning(wd, [failed_oom(), failed_oom(), failed_oom()])
    failed = retried()
    again.submit(failed)
    assert failed.wait(60).state is JobState.FAILED
    ok = Rerunning(wd, [failed_oom()])  # its second run completes
    fine = retried()
    ok.submit(fine)
    assert fine.wait(60).state is JobState.COMPLETED
    assert psij.registry.flush()
    views = {v["id"]: v for v in listed(home, "list")}
    assert views[failed.id]["cause"] == "out_of_memory" and views[failed.id]["attempt"] == 3
    assert views[fine.id]["cause"] is None and views[fine.id]["attempt"] == 2
    [record] = psij.registry.find(failed.id, work_directory=wd)
    assert record.cause == "out_of_memory"
    # The final status a job re-attached from the registry gets carries it.
    assert (psij.registry._recorded_status(record).metadata or {})["cause"] == "out_of_memory"
    table = psij_cmd(home, "status", failed.id[:8]).stdout.splitlines()
    assert table[1].split()[6] == "out_of_memory"


def test_a_registry_made_before_the_cause_column_gets_it(home: Path) -> None:
    wd = home / ".psij" / "work"
    wd.mkdir(parents=True, mode=0o700)
    path = wd / "jobs.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(
        "PRAGMA journal_mode=WAL; CREATE TABLE jobs (id TEXT NOT NULL UNIQUE, executor TEXT "
        "NOT NULL, executor_version TEXT, url TEXT, config TEXT, native_id TEXT, spec TEXT, "
        "tag TEXT, submitted REAL NOT NULL, state TEXT NOT NULL, rank INTEGER NOT NULL, "
        "exit_code INTEGER, message TEXT, updated REAL NOT NULL, final INTEGER NOT NULL, "
        "attempt INTEGER NOT NULL DEFAULT 1, rerun TEXT, held TEXT, holder TEXT); "
        "INSERT INTO jobs VALUES ('old-1', 'slurm', '0.1', NULL, '{}', '4242', NULL, NULL, 1e9, "
        "'FAILED', 6, 3, 'it failed', 1e9, 1, 1, NULL, NULL, NULL);")
    conn.close()
    path.chmod(0o600)
    assert [(v["id"], v["cause"], v["cpu_seconds"], v["max_rss_bytes"])
            for v in listed(home, "status", "4242")] == [("old-1", None, None, None)]
    conn = sqlite3.connect(path)
    try:
        columns = [r[1] for r in conn.execute("PRAGMA table_info(jobs)")]
    finally:
        conn.close()
    assert columns[-14:] == ["held", "holder", "cause", "started_at", "ended_at",
                             "cpu_seconds", "max_rss_bytes", "queued_at", "nodes", "cores",
                             "requested_memory_bytes", "requested_seconds", "held_from",
                             "held_to"]


@pytest.mark.slurm
def test_the_cause_slurm_gives_shows_in_the_table_and_the_json(home: Path) -> None:
    # A job over its memory (killed through the cgroup memory controller), as users submit it.
    from real.test_batch_out_of_memory_real import HOG, _memory_problem

    problem = _memory_problem()
    if problem:
        pytest.skip(problem)
    done = psij_cmd(home, "submit", "--executor", "slurm", "--attr", "slurm.mem=100M", "--",
                    sys.executable, "-c", HOG, "400")
    assert done.returncode == 0, done.stderr
    jid = done.stdout.strip()
    native = listed(home, "status", jid)[0]["native_id"]
    waited = psij_cmd(home, "wait", "--timeout", "240", "--json", native)
    assert waited.returncode not in (0, 124), waited.stderr
    [view] = json.loads(waited.stdout)
    assert (view["id"], view["state"], view["cause"]) == (jid, "FAILED", "out_of_memory")
    for command in (["list"], ["status", jid[:8]]):
        table = psij_cmd(home, *command).stdout.splitlines()
        assert table[1].split()[6] == "out_of_memory", table
