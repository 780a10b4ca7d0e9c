"""The compute side of function jobs (``python -m psij.futures._run``): calls run in order,
claimed calls skipped, versions checked and signatures verified before anything is unpickled,
and nothing heavy imported."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest

from psij.futures import _run, _wire
from support import futures_functions as ff
from support.futures_calls import call_directory

TESTS = Path(__file__).resolve().parent


def result(directory: str, index: int, key: bytes) -> Dict[str, Any]:
    header, _payload = _wire.read_file(_wire.result_file(directory, index), key,
                                       f"{os.path.basename(directory)}/{index}")
    return header


class Touch:
    """Unpickling it creates a file: what a forged payload could do."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (Path.touch, (Path(self.path),))


def test_calls_run_in_order_and_a_claimed_one_is_skipped(tmp_path: Path) -> None:
    work, directory = call_directory(tmp_path / "w", [(ff.square, (3,), {}),
                                                      (ff.square, (4,), {}),
                                                      (ff.fail, ("no",), {})])
    assert _wire.claim(directory, 1, _wire.CLAIM_CANCEL)
    assert _run.run_directory(directory) == 2
    assert result(directory, 0, work.key)["outcome"] == "value"
    assert not os.path.exists(_wire.result_file(directory, 1))
    raised = result(directory, 2, work.key)
    assert raised["outcome"] == "raised" and raised["type"].endswith("futures_functions.Oops")
    assert "in fail" in raised["traceback"] and "_run.py" not in raised["traceback"]
    with open(_wire.claim_file(directory, 0), "rb") as claim:
        assert claim.read() == _wire.CLAIM_RUN


@pytest.mark.parametrize(("fields", "words"), [
    ({"python": "2.7"}, ["Python 2.7", f"Python {sys.version_info[0]}.{sys.version_info[1]}"]),
    ({"cloudpickle": "0.0.1", "needs_cloudpickle": True}, ["cloudpickle 0.0.1",
                                                            "cloudpickle 3", "same version"]),
])
def test_a_version_mismatch_is_reported_naming_both_versions(tmp_path: Path, fields: dict,
                                                            words: list) -> None:
    marker = tmp_path / "unpickled"
    work, directory = call_directory(tmp_path / "w", [(ff.echo, (Touch(str(marker)),), {})],
                                     headers=[fields])
    _run.run_directory(directory)
    header = result(directory, 0, work.key)
    assert header["outcome"] == "error"
    for word in words:
        assert word in header["message"]
    assert not marker.exists()


def flip(path: str, offset: int) -> None:
    data = bytearray(Path(path).read_bytes())
    data[offset] ^= 1
    Path(path).write_bytes(bytes(data))


def test_a_changed_call_is_not_unpickled_and_the_next_one_runs(tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    work, directory = call_directory(tmp_path / "w", [(ff.echo, (Touch(str(marker)),), {}),
                                                      (ff.square, (5,), {})])
    path = _wire.calls_file(directory)
    first_line = Path(path).read_bytes().index(b"\n")
    flip(path, first_line + 5)  # in call 0's pickle
    _run.run_directory(directory)
    header = result(directory, 0, work.key)
    assert header["outcome"] == "error" and "signature does not match" in header["message"]
    assert not marker.exists()
    assert result(directory, 1, work.key)["outcome"] == "value"


def test_a_broken_header_fails_its_call_and_leaves_the_rest_without_result(
        tmp_path: Path) -> None:
    work, directory = call_directory(tmp_path / "w", [(ff.square, (1,), {}),
                                                      (ff.square, (2,), {})])
    flip(_wire.calls_file(directory), 0)
    _run.run_directory(directory)
    assert "header is not JSON" in result(directory, 0, work.key)["message"]
    assert not os.path.exists(_wire.result_file(directory, 1))


def test_a_call_signed_for_another_call_is_refused(tmp_path: Path) -> None:
    work, first = call_directory(tmp_path / "w", [(ff.square, (1,), {})])
    _, second = call_directory(tmp_path / "w", [(ff.square, (2,), {})])
    os.replace(_wire.calls_file(first), _wire.calls_file(second))
    _run.run_directory(second)
    assert "signed for call" in result(second, 0, work.key)["message"]


def test_a_result_cut_short_says_so(tmp_path: Path) -> None:
    work, directory = call_directory(tmp_path / "w", [(ff.big, (1000,), {})])
    _run.run_directory(directory)
    path = _wire.result_file(directory, 0)
    os.truncate(path, os.path.getsize(path) - 10)
    with pytest.raises(_wire.WireError, match="cut short"):
        result(directory, 0, work.key)


def test_an_unsigned_key_or_a_public_one_stops_the_runner(tmp_path: Path) -> None:
    work, directory = call_directory(tmp_path / "w", [(ff.square, (1,), {})])
    os.chmod(os.path.join(work.path, "key"), 0o644)
    done = subprocess.run([sys.executable, "-m", "psij.futures._run", directory],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "is not private" in done.stderr
    assert _run.main([]) == 2


def test_the_runner_imports_neither_cloudpickle_nor_psij_machinery(tmp_path: Path) -> None:
    work, directory = call_directory(tmp_path / "w", [(ff.square, (7,), {})])
    code = ("import sys, runpy; sys.argv = ['_run', sys.argv[1]]\n"
            "from psij.futures import _run\n"
            "_run.main(sys.argv[1:])\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('psij', 'cloudpickle')))")
    env = dict(os.environ, PYTHONPATH=str(TESTS))
    done = subprocess.run([sys.executable, "-c", code, directory], capture_output=True,
                          text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.replace("'", '"')) == [
        "psij", "psij.futures", "psij.futures._run", "psij.futures._wire", "psij.futures.errors",
        "psij.version"]
    header = result(directory, 0, work.key)
    assert header["outcome"] == "value" and header["cloudpickle"] is None


@pytest.mark.parametrize("again", [("PSIJ_ATTEMPT", "2"), ("SLURM_RESTART_COUNT", "1")])
def test_a_job_run_again_runs_the_calls_its_earlier_run_left_without_a_result(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, again: Any) -> None:
    # Run 1 of the job wrote call 0's result and was killed in call 1 (claimed, no result);
    # the client cancelled call 2. Run 2 (psij.requeue, psij.retry) runs call 1 again and
    # keeps the others as they are.
    work, directory = call_directory(tmp_path / "w", [(ff.square, (3,), {}),
                                                      (ff.square, (4,), {}),
                                                      (ff.square, (5,), {})])
    assert _wire.claim(directory, 0, _wire.CLAIM_RUN)
    _run._result(directory, work.key, 0, {"outcome": "value"}, b"from run 1")
    assert _wire.claim(directory, 1, _wire.CLAIM_RUN)
    assert _wire.claim(directory, 2, _wire.CLAIM_CANCEL)
    monkeypatch.delenv("PSIJ_ATTEMPT", raising=False)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    assert _run.run_directory(directory) == 0  # a first run: call 1 is another runner's
    # The first run of a job that may be run again (PSIJ_ATTEMPT=1) is a first run too.
    monkeypatch.setenv("PSIJ_ATTEMPT", "1")
    assert _run.run_directory(directory) == 0
    monkeypatch.delenv("PSIJ_ATTEMPT")
    monkeypatch.setenv(*again)
    assert _run.run_directory(directory) == 1
    _header, payload = _wire.read_file(_wire.result_file(directory, 0), work.key,
                                       f"{os.path.basename(directory)}/0")
    assert payload == b"from run 1"
    assert result(directory, 1, work.key)["outcome"] == "value"
    assert not os.path.exists(_wire.result_file(directory, 2))
