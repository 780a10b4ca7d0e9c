"""The modules and names added for code written against psij-python's module layout:
psij.utils.SingletonThread, psij.launchers.scripts, psij.serialize.Serializer, and the names
modules offer on first use (psij._reexports)."""

import io
import json
import os
import sys
import threading
import warnings
from datetime import timedelta
from typing import IO, Any, Dict, List

import pytest

import psij.executors
import psij.job_launcher
import psij.launchers.multiple
from psij import JobAttributes, JobSpec, ResourceSpecV1
from psij.launchers import scripts
from psij.serialize import JSONSerializer, Serializer
from psij.utils import SingletonThread


class _Counter(SingletonThread):
    started: List[int] = []

    def __init__(self) -> None:
        super().__init__(name="counter", daemon=True)
        self.go = threading.Event()

    def run(self) -> None:
        _Counter.started.append(os.getpid())
        self.go.wait(30)


class _Other(SingletonThread):
    def __init__(self) -> None:
        super().__init__(daemon=True)

    def run(self) -> None:
        pass


def test_singleton_thread_is_one_started_thread_per_process_and_class() -> None:
    first = _Counter.get_instance()
    assert _Counter.get_instance() is first and first.is_alive()
    other = _Other.get_instance()
    assert other is not first and isinstance(other, _Other)
    first.go.set()
    first.join(10)
    assert _Counter.started == [os.getpid()]


@pytest.mark.skipif(sys.platform == "win32", reason="fork")
def test_a_forked_process_gets_its_own_singleton_thread() -> None:
    parent = _Counter.get_instance()
    read, write = os.pipe()
    with warnings.catch_warnings():  # 3.12+ warns of fork() in a process with threads
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: a new thread, not the parent's
        mine = _Counter.get_instance()
        os.write(write, b"1" if mine is not parent and mine.is_alive() else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"


def test_launcher_scripts_are_found_by_plain_name() -> None:
    path = scripts.script_path("multi_launch.sh")
    assert path.is_file() and path.parent == scripts.directory()
    assert psij.launchers.multiple.SCRIPT_PATH == path  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["", ".", "..", "../launchers/x.sh", "a/b", "x\0y", 7])
def test_launcher_script_names_that_are_not_plain_are_refused(name: Any) -> None:
    with pytest.raises(ValueError, match="launcher script name"):
        scripts.script_path(name)


def test_a_missing_launcher_script_says_so() -> None:
    with pytest.raises(FileNotFoundError, match="no launcher script"):
        scripts.script_path("nothing\nhere.sh")


class _LinesSerializer(Serializer):
    """A serializer of another syntax: one "key=json value" line per key."""

    def _dump_dict(self, dict: Dict[str, object], stream: IO[Any]) -> None:
        for key, value in dict.items():
            stream.write(f"{key}={json.dumps(value)}\n")

    def _load_dict(self, stream: IO[Any]) -> Dict[str, object]:
        lines = [line.split("=", 1) for line in stream.read().splitlines() if line]
        return {k: json.loads(v) for k, v in lines}


def test_a_serializer_of_its_own_syntax_gets_dump_and_load() -> None:
    spec = JobSpec("/bin/echo", ["a b"], environment={"X": "1"},
                   resources=ResourceSpecV1(node_count=2),
                   attributes=JobAttributes(duration=timedelta(minutes=3)))
    text = _LinesSerializer().dumps(spec)
    assert 'executable="/bin/echo"' in text.splitlines()
    assert _LinesSerializer().loads(text) == spec
    out = io.StringIO()
    _LinesSerializer().dump(spec, out)
    assert _LinesSerializer().load(io.StringIO(out.getvalue())) == spec
    assert JSONSerializer().loads(JSONSerializer().dumps(spec)) == spec
    assert isinstance(JSONSerializer(), Serializer)
    with pytest.raises(TypeError):
        Serializer()  # type: ignore[abstract]
    with pytest.raises(TypeError, match="JobSpec"):
        _LinesSerializer().dumps("not a spec")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="nonsense"):
        _LinesSerializer().loads('nonsense=1\n')


def test_names_offered_on_first_use() -> None:
    from psij.job import Job
    assert psij.job_launcher.Job is Job  # type: ignore[attr-defined]
    assert "Job" not in vars(psij.job_launcher)  # read from psij.job each time: not its own
    with pytest.raises(AttributeError, match="NoSuchName"):
        psij.job_launcher.NoSuchName  # type: ignore[attr-defined]  # noqa: B018
    from psij.executors import SlurmJobExecutor
    from psij.executors.batch.slurm import SlurmJobExecutor as Defined
    assert SlurmJobExecutor is Defined
    with pytest.raises(ImportError):
        from psij.executors import NoSuchExecutor  # type: ignore[attr-defined]  # noqa: F401
    assert "LocalJobExecutor" in dir(psij.executors)
