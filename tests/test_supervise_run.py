"""``psij supervise`` as a real process on ``local`` and inside a pilot: the example study to
the end, configuration errors before anything is submitted, hostile servers, and Ctrl+C."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Iterator, Optional

import pytest

from support.hostile_lines import hostile_lines
from support.supervise_study import ROOT, Study, sleeping, wait_for


def psij(*words: str, cwd: Path = ROOT) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([sys.executable, "-m", "psij", *words], capture_output=True,
                          text=True, cwd=cwd, timeout=120)


def test_example_study_runs_to_completion_on_local(tmp_path: Path) -> None:
    study = Study(tmp_path / "r").start()
    assert study.wait(120) == 0, study.errors()
    study.check_finished()
    assert "the server finished" in study.errors()


@pytest.fixture
def pilot(tmp_path: Path) -> Iterator[str]:
    socket_path = tmp_path / "pilot.sock"
    process = subprocess.Popen([sys.executable, "-m", "psij", "pilot", "serve", "--socket",
                                str(socket_path), "--cores", "4", "--wd", str(tmp_path)],
                               stderr=subprocess.DEVNULL)
    try:
        wait_for(socket_path.exists, 30, "the pilot's socket")
        yield f"unix://{socket_path}"
    finally:
        process.terminate()
        process.wait(30)


def test_example_study_runs_to_completion_inside_a_pilot(tmp_path: Path, pilot: str) -> None:
    study = Study(tmp_path / "r", executor="pilot", executor_url=pilot).start()
    assert study.wait(120) == 0, study.errors()
    study.check_finished()


def test_print_options_lists_every_option_with_default_and_meaning() -> None:
    from psij.supervise import OPTIONS

    shown = psij("supervise", "--print-options")
    assert shown.returncode == 0
    for option in OPTIONS:
        assert f"{option.name}  [default: " in shown.stdout
    assert "[default: 1000]" in shown.stdout and "psij-supervise-YYYYMMDDTHHMMSS" in shown.stdout
    version = psij("supervise", "--version")
    assert version.returncode == 0 and version.stdout.startswith("psij ")


def test_bad_config_names_every_wrong_field_before_anything_is_submitted(
        tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    config = {
        "output_dir": str(tmp_path / "out"),
        "job_limit": -1, "timer_delay": "NaN", "job_update_interval": 1e400,
        "fault_tolerance": "yes", "max_server_restarts": 10 ** 100, "protocol": "sctp",
        "std_output": 1, "verbose": -3, "stop_grace": 0, "colour": "blue",
        "client_template": {"executable": "/bin/x", "duration": -5},
        "server": {"executable": "/bin/touch", "arguments": [str(marker)],
                   "environment": {"X": "SURROGATE"}},
    }
    path = tmp_path / "c.json"
    # NaN and infinity as JSON tokens, and a lone surrogate in a name.
    path.write_text(json.dumps(config).replace('"NaN"', "NaN")
                    .replace('"colour"', '"col\\ud800our"').replace("SURROGATE", "\\udbff"))
    done = psij("supervise", str(path))
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    for field in ("job_limit", "timer_delay", "job_update_interval", "fault_tolerance",
                  "max_server_restarts", "protocol", "std_output", "verbose", "stop_grace",
                  "not an option", "client_template", "server.environment.X"):
        assert sum(field in line for line in lines) >= 1, (field, done.stderr)
    assert len(lines) == 12, done.stderr
    assert "got NaN" in done.stderr and '"unix" or "tcp"' in done.stderr
    assert not marker.exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("text,words", [
    ("{not json", "not JSON"),
    ("[1, 2]", "must be a JSON object"),
    ("{}", "server: required"),
    ('{"server": {"executable": "/bin/true"}, "executor": "nosuch"}',
     "'nosuch' is not an installed executor"),
    ("[" * 100000, "not JSON"),
])
def test_unreadable_configs_give_one_clear_error(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(text)
    done = psij("supervise", str(path), cwd=tmp_path)
    assert done.returncode == 2 and words in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not [p for p in os.listdir(tmp_path) if p.startswith("psij-supervise-")]
    missing = psij("supervise", str(tmp_path / "missing.json"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr


HOSTILE_SERVER = textwrap.dedent("""
    import json, os, socket, sys
    address = os.environ["PSIJ_SUPERVISOR"][len("unix:"):]
    token = os.environ["PSIJ_SUPERVISOR_TOKEN"]

    def talk(sock, line):
        sock.sendall(line)
        reader = sock.makefile("rb")
        while True:
            answer = json.loads(reader.readline() or b"null")
            if answer is None or answer.get("type") != "ping":
                return answer

    def new():
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(address)
        return sock

    out = {}
    out["wrong"] = talk(new(), b'{"type": "hello", "token": "guess"}\\n')
    out["no hello"] = talk(new(), b'{"type": "submit", "client": "a", "arguments": []}\\n')
    sock = new()
    out["hello"] = talk(sock, json.dumps({"type": "hello", "token": token}).encode() + b"\\n")
    out["garbage"] = talk(sock, b"\\xff\\xfe garbage\\n")
    out["not json"] = talk(sock, b"{{{\\n")
    out["unknown"] = talk(sock, b'{"type": "launch_missiles"}\\n')
    out["array"] = talk(sock, b"[1, 2, 3]\\n")
    out["nan"] = talk(sock, b'{"type": "submit", "client": "a", "arguments": [], '
                            b'"group_size": NaN}\\n')
    out["surrogate"] = talk(sock, b'{"type": "submit", "client": "\\\\ud800", '
                                  b'"arguments": []}\\n')
    if sys.argv[1] == "done":
        out["done"] = talk(sock, b'{"type": "done"}\\n')
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)
    if sys.argv[1] == "huge":
        try:
            sock.sendall(b'{"type": "ping", "pad": "' + b"x" * 3_000_000 + b'"}\\n')
        except OSError:
            pass
        sock.recv(1)
""")


@pytest.mark.parametrize("ending", ["done", "huge"])
def test_hostile_server_messages_are_refused_and_never_crash_the_supervisor(
        tmp_path: Path, ending: str) -> None:
    script = tmp_path / "server.py"
    script.write_text(HOSTILE_SERVER)
    answers = tmp_path / "answers.json"
    config = {"server": {"executable": sys.executable,
                         "arguments": [str(script), ending, str(answers)]},
              "output_dir": str(tmp_path / "out"), "timer_delay": 1,
              "fault_tolerance": False}
    (tmp_path / "c.json").write_text(json.dumps(config))
    done = psij("supervise", str(tmp_path / "c.json"))
    assert "Traceback" not in done.stderr
    got = json.loads(wait_for(lambda: answers.exists() and answers.read_text(), 30,
                              "the server's answers"))
    assert got["wrong"] == {"type": "refused", "reason": "hello: wrong token"}
    assert "first message must be" in got["no hello"]["reason"]
    assert got["hello"]["type"] == "welcome" and got["hello"]["generation"] == 1
    assert "not UTF-8" in got["garbage"]["reason"]
    assert "not JSON" in got["not json"]["reason"]
    assert "launch_missiles" in got["unknown"]["reason"]
    assert "JSON object" in got["array"]["reason"]
    assert "group_size" in got["nan"]["reason"]
    assert "lone surrogate" in got["surrogate"]["reason"]
    if ending == "done":
        assert got["done"]["type"] == "accepted"
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == 1, done.stderr
        assert "line too long" in done.stderr and "fault_tolerance is off" in done.stderr


FUZZING_SERVER = textwrap.dedent("""
    import json, os, socket, sys, threading, time
    sys.path.insert(0, sys.argv[1])
    from support.hostile_lines import exchange, hostile_lines

    path = os.environ["PSIJ_SUPERVISOR"][len("unix:"):]
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(path)
    send_lock = threading.Lock()

    def send(message):
        with send_lock:
            sock.sendall(json.dumps(message).encode() + b"\\n")

    send({"type": "hello", "token": os.environ["PSIJ_SUPERVISOR_TOKEN"]})
    reader = sock.makefile("rb")
    assert json.loads(reader.readline())["type"] == "welcome"
    sent, late, answers = {}, [], {}
    done = threading.Event()

    def read():
        for line in reader:
            message = json.loads(line)
            if message.get("type") == "ping":
                send({"type": "pong"})
            elif message.get("type") == "pong" and message.get("ref") in sent:
                late.append(time.monotonic() - sent.pop(message["ref"]))
            elif message.get("type") == "accepted":
                done.set()

    def ping():  # the other client: its own requests, answered all along
        ref = 0
        while not done.is_set():
            ref += 1
            sent[ref] = time.monotonic()
            send({"type": "ping", "ref": ref})
            time.sleep(0.05)

    threading.Thread(target=read, daemon=True).start()
    pinger = threading.Thread(target=ping, daemon=True)
    pinger.start()
    for name, line in hostile_lines():
        answers[name] = exchange(path, line)
    time.sleep(0.5)
    waiting = [time.monotonic() - t for t in list(sent.values())]
    with open(sys.argv[2], "w") as f:
        json.dump({"answers": answers, "pongs": len(late), "longest": max(late + waiting)}, f)
    send({"type": "done"})
    done.wait(30)
""")


def test_hostile_lines_are_refused_while_the_server_is_served(tmp_path: Path) -> None:
    script = tmp_path / "server.py"
    script.write_text(FUZZING_SERVER)
    results = tmp_path / "results.json"
    config = {"server": {"executable": sys.executable,
                         "arguments": [str(script), str(Path(__file__).parent), str(results)]},
              "output_dir": str(tmp_path / "out"), "timer_delay": 1,
              "fault_tolerance": False}
    (tmp_path / "c.json").write_text(json.dumps(config))
    done = psij("supervise", str(tmp_path / "c.json"))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    got = json.loads(results.read_text())
    for name, answer in got["answers"].items():
        if answer is None:
            assert name in ("10^6 keys", "100 MB line"), name  # too long: closed at once
            continue
        assert answer["type"] == "refused" and answer["reason"], (name, answer)
    assert got["pongs"] >= 10 and got["longest"] < 5, got


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_mid_study_on_local_cancels_every_client(tmp_path: Path, signum: int,
                                                        code: int) -> None:
    results = tmp_path / "r"
    study = Study(results, clients=8, wave=4)
    (results / "sleep").write_text("60")
    study.start()
    wait_for(lambda: len(study.native_ids(kind="client")) >= 4, 60, "clients running")
    started = time.monotonic()
    study.signal(signum)
    assert study.wait(30) == code, study.errors()
    assert time.monotonic() - started < 10
    # Every job cancelled has its final state in the journal: the next run has nothing to do.
    assert study.unsettled() == set(), study.log()
    # No client of the study is left running (their command line names the folder).
    left = subprocess.run(["pgrep", "-f", f"supervised_study.py client {results}"],
                          capture_output=True, text=True)
    assert left.stdout == "", left.stdout
    assert study.results_done() == []


@pytest.mark.parametrize("bind", ["127.0.0.1", None])
def test_example_study_over_tcp(tmp_path: Path, bind: Optional[str]) -> None:
    options = {"protocol": "tcp", **({"bind": bind} if bind else {})}
    study = Study(tmp_path / "r", clients=6, wave=3, **options).start()
    assert study.wait(120) == 0, study.errors()
    study.check_finished()
    assert "connects to tcp:" in study.log()
    if bind:
        assert "connects to tcp:127.0.0.1:" in study.log()


def test_tcp_bind_that_cannot_be_used_is_a_config_error(tmp_path: Path) -> None:
    config = {"server": {"executable": "/bin/true"}, "protocol": "tcp",
              "bind": "256.1.1.1:99999", "output_dir": str(tmp_path / "out")}
    (tmp_path / "c.json").write_text(json.dumps(config))
    done = psij("supervise", str(tmp_path / "c.json"))
    assert done.returncode == 2 and "bind: cannot listen on" in done.stderr, done.stderr


def test_a_socket_path_too_long_goes_to_a_private_temporary_folder_removed_after(
        tmp_path: Path) -> None:
    study = Study(tmp_path / "r", clients=2, wave=2,
                  output_dir=str(tmp_path / ("long-" * 30) / "out"))
    study.start()
    assert study.wait(60) == 0, study.errors()
    study.check_finished()
    line = next(x for x in study.log().splitlines() if "connects to unix:" in x)
    socket_path = line.split("connects to unix:")[1]
    assert len(socket_path.encode()) < 100 and "psij-sup-" in socket_path
    assert not os.path.exists(os.path.dirname(socket_path))


LIBRARY_SERVER = textwrap.dedent("""
    import json, sys, time
    from psij import JobSpec
    from psij.supervise.client import Refused, connect

    out = {}
    with connect() as supervisor:
        out["generation"] = supervisor.generation
        supervisor.submit("slow", spec=JobSpec("/bin/sleep", ["60"]))
        try:
            supervisor.submit("slow", spec={"executable": "/bin/true"})
        except Refused as error:
            out["duplicate"] = str(error)
        supervisor.cancel("slow")
        supervisor.submit("group", group_size=3, spec={
            "executable": "/bin/sh",
            "arguments": ["-c", "echo $PSIJ_SUPERVISE_GROUP_SIZE $PSIJ_SUPERVISE_CLIENT"]})
        out["updates"] = [[u.client, u.state, u.exit_code] for u in supervisor.updates()]
        try:
            supervisor.cancel("nobody")
        except Refused as error:
            out["nobody"] = str(error)
        time.sleep(3.5)  # busy for over 2T: the library's thread answers the pings
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
""")


def test_client_library_submits_cancels_follows_and_keeps_a_busy_server_alive(
        tmp_path: Path) -> None:
    script = tmp_path / "server.py"
    script.write_text(LIBRARY_SERVER)
    answers = tmp_path / "answers.json"
    config = {"server": {"executable": sys.executable, "arguments": [str(script), str(answers)]},
              "output_dir": str(tmp_path / "out"), "timer_delay": 1, "fault_tolerance": False,
              "verbose": 1}
    (tmp_path / "c.json").write_text(json.dumps(config))
    done = psij("supervise", str(tmp_path / "c.json"))
    assert done.returncode == 0, done.stderr
    got = json.loads(answers.read_text())
    assert got["generation"] == 1
    assert "already submitted" in got["duplicate"]
    assert "no client 'nobody'" in got["nobody"]
    finals = {client: (state, code) for client, state, code in got["updates"]
              if state in ("COMPLETED", "FAILED", "CANCELED")}
    # A local job is CANCELED when cancel returns (as in psij-python): no exit code yet.
    assert finals == {"slow": ("CANCELED", None), "group": ("COMPLETED", 0)}
    out = tmp_path / "out"
    assert (out / "job.2.group.out").read_text() == "3 group\n"
    assert (out / "submit.1.sh").exists() and "is dead" not in done.stderr


def test_the_client_library_skips_what_it_cannot_read_from_its_supervisor() -> None:
    # A hostile supervisor: the server's reader thread must answer pings and pass on updates
    # after every line of the corpus (before, a deep line killed it with RecursionError).
    from psij.supervise.client import Connection

    mine, theirs = socket.socketpair()
    reader = theirs.makefile("rb")

    def supervisor() -> None:
        assert json.loads(reader.readline())["type"] == "hello"
        theirs.sendall(b'{"type": "welcome", "generation": 3, "uid": 0}\n')
        for _, line in hostile_lines():
            theirs.sendall(line + b"\n")
        theirs.sendall(b'{"type": "ping"}\n{"type": "update", "client": "c", "uid": 1, '
                       b'"state": "COMPLETED", "exit_code": 0}\n')

    feeder = threading.Thread(target=supervisor, daemon=True)
    feeder.start()
    connection = Connection(mine, "token")
    try:
        assert connection.generation == 3
        update = connection.next_update(timeout=60)
        assert update is not None and (update.client, update.state) == ("c", "COMPLETED")
        assert json.loads(reader.readline()) == {"type": "pong"}
        feeder.join(10)
    finally:
        connection.close()
        theirs.close()


def test_an_unusable_output_dir_or_a_live_supervisor_there_is_a_config_error(
        tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)  # writable by others: not a private folder
    config = {"server": {"executable": "/bin/true"}, "output_dir": str(shared)}
    (tmp_path / "c.json").write_text(json.dumps(config))
    done = psij("supervise", str(tmp_path / "c.json"))
    assert done.returncode == 2 and done.stderr.startswith("psij supervise: output_dir: "), \
        done.stderr
    assert "Traceback" not in done.stderr
    # A second supervisor on the output folder of a running one.
    study = Study(tmp_path / "r", clients=4, wave=1)
    (tmp_path / "r" / "sleep").write_text("2")
    study.start()
    wait_for(lambda: "connected" in study.log(), 30, "the first supervisor's server")
    second = psij("supervise", str(study.path))
    assert second.returncode == 2 and "another process is listening" in second.stderr, \
        second.stderr
    assert study.wait(60) == 0, study.errors()


def test_a_supervisor_killed_leaves_a_journal_the_next_one_goes_on_from(
        tmp_path: Path) -> None:
    """The leftovers are cancelled: on local through the journal of the process that started
    them (their process groups are signalled); on Slurm see test_supervise_slurm.py."""
    results = tmp_path / "r"
    first = Study(results, clients=6, wave=3)
    (results / "sleep").write_text("60")
    first.start()
    wait_for(lambda: len(sleeping(results)) == 3, 60, "three clients sleeping")
    orphans = sleeping(results)
    assert first.process is not None
    first.process.kill()
    first.process.wait()
    leftovers = first.native_ids()
    assert len(leftovers) == 4  # the server and three clients
    try:
        (results / "sleep").write_text("0")
        second = Study(results, clients=6, wave=3).start()
        assert second.wait(60) == 0, second.errors()
        second.check_finished()
        assert "cancelling 4 job(s) an earlier supervisor left: " in second.log()
        said = second.log().split("an earlier supervisor left: ")[1].splitlines()[0]
        assert set(said.split(", ")) == leftovers
        assert (results / "server.2.pid").exists()  # generations go on
        # uids go on too: the files of the first supervisor are still there.
        names = os.listdir(second.output)
        assert len([n for n in names if n.startswith("submit.")]) == 1 + 3 + 1 + 6
        assert "job.4.study-server.out" in names
        # The clients the first supervisor left asleep for 60 s were cancelled, not waited for.
        wait_for(lambda: not any(_alive(pid) for pid in orphans), 20, "leftover clients gone")
    finally:
        for pid in orphans:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# A journal as supervisors wrote it before the kinds of jobs were an enum: a server that ran
# and ended, a client left running, and a client whose submission was not seen returning.
_OLD_JOURNAL = (
    '{"uid":0,"kind":"server","client":null,"generation":1,"name":"server.u0.m"}\n'
    '{"uid":0,"kind":"server","client":null,"generation":1,"name":"server.u0.m",'
    '"native_id":"900"}\n'
    '{"uid":1,"kind":"client","client":"a","generation":1,"name":"a.u1.m"}\n'
    '{"uid":1,"kind":"client","client":"a","generation":1,"name":"a.u1.m",'
    '"native_id":"901"}\n'
    '{"uid":2,"kind":"client","client":"b","generation":2,"name":"b.u2.m"}\n'
    '{"uid":0,"final":"COMPLETED"}\n')


def test_a_journal_of_the_former_form_is_read_and_appended_to_alike(tmp_path: Path) -> None:
    from psij.controller import Attach, Started
    from psij.supervise import EntryKind, Settings, Supervisor
    from psij.supervise._machine import Journal
    from psij.supervise._run import JournalFile

    (tmp_path / "supervise.journal").write_text(_OLD_JOURNAL)
    journal = JournalFile(tmp_path)
    leftovers, unsure, first_uid, generation = journal.read()
    assert (leftovers, unsure, first_uid, generation) == ([(1, "901")], [(2, "b.u2.m")], 3, 2)
    machine = Supervisor(Settings(
        server={"executable": "/bin/server"}, client_template=None, output_dir=str(tmp_path),
        address="unix:/s", job_limit=10, tick=1.0, fault_tolerance=True,
        max_server_restarts=0, std_output=False, connect_timeout=10.0, stop_grace=5.0),
        new_token=lambda: "t", leftovers=leftovers, first_uid=first_uid,
        first_generation=generation, marker="m", unsure=unsure)
    actions = machine.step(Started(), 0.0)
    assert Attach(1, "901") in actions
    journal.open()
    try:
        for action in actions:
            if type(action) is Journal:
                journal.write(action)
    finally:
        journal.close()
    assert machine.jobs[1].kind is EntryKind.LEFTOVER and machine.jobs[3].kind is EntryKind.SERVER
    assert (tmp_path / "supervise.journal").read_text() == _OLD_JOURNAL + (
        '{"uid":2,"final":"UNKNOWN"}\n'  # no look-up by name without an executor
        '{"uid":3,"kind":"server","client":null,"generation":3,"name":"server.u3.m"}\n')


def test_with_fault_tolerance_off_the_server_knows_and_ends_the_study_when_a_client_fails(
        tmp_path: Path) -> None:
    results = tmp_path / "r"
    study = Study(results, clients=6, wave=3, fault_tolerance=False)
    (results / "fail.1").write_text("")
    study.start()
    assert study.wait(60) == 1, study.errors()
    assert "the server said it was done, then ended FAILED (exit code 1)" in study.errors()
    said = (study.output / "job.0.study-server.err").read_text()
    assert "client c1 ended FAILED; fault tolerance is off: the study ends" in said
    assert not (results / "combined.txt").exists()
    assert study.unsettled() == set(), study.log()
