"""psij.remote._staging: stage-in sources sent in pieces to a job's folder on the remote
side, the spec rewritten to point there, stage-out files brought back; here the client's
calls reach a real ServerStaging through the JSON they would cross the connection as."""

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from psij import InvalidJobException, JobSpec
from psij.remote import _staging
from psij.remote._protocol import PIECE
from psij.staging import StageIn, StageOut, StageOutFlags, StagingMode


class Wire:
    """Calls of the client's side answered by a ServerStaging, through JSON both ways."""

    def __init__(self, server: _staging.ServerStaging) -> None:
        self.server = server
        self.calls: List[Tuple[str, Dict[str, Any]]] = []

    def __call__(self, op: str, fields: Dict[str, Any]) -> Any:
        fields = json.loads(json.dumps(fields))
        self.calls.append((op, fields))
        handler = {"put": self.server.put, "get": self.server.get, "drop": self.server.drop}[op]
        return json.loads(json.dumps(handler(fields)))


@pytest.fixture
def wire(tmp_path: Path) -> Wire:
    return Wire(_staging.ServerStaging(tmp_path / "remote-work"))


def test_files_and_folders_go_over_in_pieces_and_the_spec_points_at_them(
        wire: Wire, tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(2 * PIECE + 17))
    tool = tmp_path / "tool.sh"
    tool.write_text("#!/bin/sh\necho hi\n")
    tool.chmod(0o755)
    folder = tmp_path / "inputs"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "a.txt").write_text("A")
    (folder / "empty.txt").write_text("")
    spec = JobSpec("/bin/true", stage_in=[StageIn(big, "big.bin"), StageIn(tool, "tool"),
                                          StageIn(f"file://{folder}", "in", StagingMode.MOVE)],
                   stage_out=[StageOut("result.txt", tmp_path / "back" / "result.txt",
                                       StageOutFlags.IF_PRESENT)])
    _staging.send_inputs(wire, "job-1", spec)
    puts = [fields for op, fields in wire.calls if op == "put"]
    assert sum(1 for p in puts if p["path"] == "big.bin") == 3  # two full pieces and a rest
    job_dir = wire.server.root / "job-1"
    assert (job_dir / "in" / "0" / "big.bin").read_bytes() == big.read_bytes()
    assert os.access(job_dir / "in" / "1" / "tool.sh", os.X_OK)
    assert (job_dir / "in" / "2" / "inputs" / "sub" / "a.txt").read_text() == "A"
    assert (job_dir / "in" / "2" / "inputs" / "empty.txt").read_bytes() == b""
    assert oct(job_dir.stat().st_mode & 0o777) == "0o700"
    sent = wire.server.rewrite("job-1", spec)
    assert [str(i.source) for i in sent.stage_in] == [
        str(job_dir / "in" / "0" / "big.bin"), str(job_dir / "in" / "1" / "tool.sh"),
        str(job_dir / "in" / "2" / "inputs")]
    assert [str(i.target) for i in sent.stage_in] == ["big.bin", "tool", "in"]
    assert sent.stage_in[2].mode is StagingMode.MOVE
    [out] = sent.stage_out
    assert str(out.target) == str(job_dir / "out" / "0" / "result.txt")
    assert out.flags == spec.stage_out[0].flags and str(out.source) == "result.txt"
    # The caller's spec is left as it was.
    assert spec.stage_in[0].source.path == str(big)


def test_outputs_come_back_to_their_targets_and_the_folder_is_dropped(
        wire: Wire, tmp_path: Path) -> None:
    spec = JobSpec("/bin/true", stage_out=[
        StageOut("result.txt", tmp_path / "back" / "result.txt"),
        StageOut("outdir", tmp_path / "back" / "copy"),
        StageOut("missing.txt", tmp_path / "back" / "missing.txt", StageOutFlags.IF_PRESENT)])
    sent = wire.server.rewrite("job-2", spec)
    # What the remote executor's stage-out step would leave there.
    Path(sent.stage_out[0].target.path).write_bytes(b"x" * (PIECE + 5))
    outdir = Path(sent.stage_out[1].target.path)
    (outdir / "deep").mkdir(parents=True)
    (outdir / "deep" / "f").write_text("deep")
    (outdir / "run.sh").write_text("#!/bin/sh\n")
    (outdir / "run.sh").chmod(0o700)
    assert _staging.fetch_outputs(wire, "job-2", spec) == []
    assert (tmp_path / "back" / "result.txt").read_bytes() == b"x" * (PIECE + 5)
    assert (tmp_path / "back" / "copy" / "deep" / "f").read_text() == "deep"
    assert os.access(tmp_path / "back" / "copy" / "run.sh", os.X_OK)
    assert not (tmp_path / "back" / "missing.txt").exists()
    assert not list((tmp_path / "back").glob(".*psij-part"))
    wire("drop", {"job": "job-2"})
    assert not (wire.server.root / "job-2").exists()


def test_an_input_not_sent_and_sources_that_are_not_local_files_are_refused(
        wire: Wire, tmp_path: Path) -> None:
    spec = JobSpec("/bin/true", stage_in=[StageIn(tmp_path / "nothing-here", "x")])
    with pytest.raises(InvalidJobException, match=r"stage_in\[0\].*does not exist"):
        _staging.send_inputs(wire, "job-3", spec)
    with pytest.raises(InvalidJobException, match=r"stage_in\[0\].*was not sent"):
        wire.server.rewrite("job-3", spec)
    other = JobSpec("/bin/true", stage_in=[StageIn("file://otherhost/data", "x")])
    with pytest.raises(InvalidJobException, match="not a file of this machine"):
        _staging.send_inputs(wire, "job-3", other)
    back = JobSpec("/bin/true", stage_out=[StageOut("r", "gsiftp://host/r")])
    wire.server.rewrite("job-3", back)
    [problem] = _staging.fetch_outputs(wire, "job-3", back)
    assert problem.startswith("stage_out[0] to gsiftp://host/r") and "not a file" in problem


@pytest.mark.parametrize("fields, words", [
    ({"job": "../../etc", "n": 0, "path": "x", "offset": 0, "data": ""}, "job id"),
    ({"job": "j", "n": -1, "path": "x", "offset": 0, "data": ""}, "n: expected"),
    ({"job": "j", "n": True, "path": "x", "offset": 0, "data": ""}, "n: expected"),
    ({"job": "j", "n": 0, "path": "../x", "offset": 0, "data": ""}, "one file name"),
    ({"job": "j", "n": 0, "path": "/etc/passwd", "offset": 0, "data": ""}, "one file name"),
    ({"job": "j", "n": 0, "path": "a/./b", "offset": 0, "data": ""}, "one file name"),
    ({"job": "j", "n": 0, "path": "a\0b", "offset": 0, "data": ""}, "one file name"),
    ({"job": "j", "n": 0, "path": "x", "offset": -5, "data": ""}, "offset"),
    ({"job": "j", "n": 0, "path": "x", "offset": 0.5, "data": ""}, "offset"),
    ({"job": "j", "n": 0, "path": "x", "offset": 0, "data": "**not base64**"}, "data: not base64"),
    ({"job": "j", "n": 0, "path": "x", "offset": 0, "data": None}, "data"),
])
def test_hostile_pieces_are_refused_and_write_nothing_outside(
        wire: Wire, fields: Dict[str, Any], words: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=words):
        wire.server.put(fields)
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written == []


def test_a_planted_link_in_place_of_an_output_folder_gives_nothing(
        wire: Wire, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text("private")
    spec = JobSpec("/bin/true", stage_out=[StageOut("r", tmp_path / "back" / "r")])
    sent = wire.server.rewrite("job-4", spec)
    place = Path(sent.stage_out[0].target.path).parent
    place.rmdir()
    place.symlink_to(secret)
    assert wire("get", {"job": "job-4", "n": 0}) == {"files": []}
    with pytest.raises(ValueError, match="one file name"):
        wire("get", {"job": "job-5", "n": 0, "path": "r/../key", "offset": 0})
    with pytest.raises(ValueError, match="nothing was staged out"):  # nor under the link
        wire("get", {"job": "job-4", "n": 0, "path": "key", "offset": 0})
