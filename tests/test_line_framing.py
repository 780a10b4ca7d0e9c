"""Reading a line from a peer (:func:`psij._line_framing.decode_line`): what it refuses, what it
names, that it raises nothing but :class:`~psij._line_framing.BadLine`, and that every process
reading JSON from another one reads it through it. (The framing's own tests are with the
served pilot's, in ``test_pilot_service_limits.py``.)"""

import json
import math
from pathlib import Path
from typing import Any, Optional

import pytest

import psij
from psij._line_framing import MAX_DEPTH, BadLine, decode_line, encode_line, path_of
from support.hostile_lines import hostile_lines

SRC = Path(psij.__file__).parent


@pytest.mark.parametrize(("line", "value"), [
    (b'{"op": "list", "id": 3}', {"op": "list", "id": 3}),
    (b"[" * MAX_DEPTH + b"]" * MAX_DEPTH, json.loads("[" * MAX_DEPTH + "]" * MAX_DEPTH)),
    (b'{"a": "' + b"[" * 500 + b'"}', {"a": "[" * 500}),  # brackets in strings do not count
    (b'{"a": "\\\\", "b": "\\"[[["}', {"a": "\\", "b": '"[[['}),
    (b'{"x": ' + b"9" * 100 + b"}", {"x": int("9" * 100)}),
    (b'{"x": "' + b"9" * 1000 + b'"}', {"x": "9" * 1000}),  # digits in a string are text
    (b'{"x": 1e308, "y": 1e-999}', {"x": 1e308, "y": 0.0}),
    (b'{"a": "\\ud83d\\ude00"}', {"a": "\U0001F600"}),  # a surrogate pair is one character
    (b'{"a": "\\udcff"}', {"a": "\udcff"}),  # an undecodable byte, as os.fsdecode holds it
    (b'{"a": "\xc3\xa9"}', {"a": "\u00e9"}),
    (b"  12\r", 12),
])
def test_what_is_read(line: bytes, value: Any) -> None:
    assert decode_line(line) == value


@pytest.mark.parametrize(("line", "field", "words"), [
    (b"[" * 1100 + b"]" * 1100, "line", "nested more than 64"),
    (b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), "line", "nested more than 64"),
    (b'{"a": "' + b"]" * 100 + b'", "b": ' + b"[" * 65 + b"]" * 65 + b"}", "line", "nested"),
    (b'{"a": "\\"", "b": ' + b"[" * 65 + b"]" * 65 + b"}", "line", "nested"),
    (b"[[]," * 100 + b"]" * 100, "line", "nested"),
    (b"][" * 100, "line", "do not pair up"),
    (b'{"id": 1, "intervals": {"unknown": NaN}}', "intervals.unknown", "NaN is not a finite"),
    (b'{"x": [1, -Infinity]}', "x[1]", "-Infinity is not a finite"),
    (b'{"x": {"y": 1e999}}', "x.y", "1e999 is not a finite"),
    (b"Infinity", "line", "not a finite"),
    (b'{"x": ' + b"9" * 101 + b"}", "line", "more than 100 digits"),
    (b'{"x": ' + b"1" * 400 + b".5}", "line", "more than 100 digits"),
    (b'{"x": "\xff"}', "line", "not UTF-8"),
    (b'{"x": "\xed\xa0\x80"}', "line", "not UTF-8"),
    (b'{"a": {"b": ["ok", "\\ud800"]}}', "a.b[1]", "lone surrogate"),
    (b'{"a": {"\\udfff": 1}}', "a.<key>", "lone surrogate"),
    (b'"\\ud83d x"', "line", "lone surrogate"),
    (b"{{{", "line", "not JSON"),
    (b'{"a": "\x01"}', "line", "not JSON"),
    (b"", "line", "not JSON"),
])
def test_what_is_refused_names_where(line: bytes, field: str, words: str) -> None:
    with pytest.raises(BadLine) as info:
        decode_line(line)
    assert info.value.field == field
    assert words in str(info.value)
    assert isinstance(info.value, ValueError)
    if field != "line":
        assert str(info.value).startswith(field + ":")
        assert isinstance(info.value.value, dict)  # what was read, for the request's id


def test_lone_surrogates_may_be_left_to_the_reader() -> None:
    line = b'{"tasks": [{"arguments": ["\\ud800"]}], "x": NaN}'
    with pytest.raises(BadLine, match="x: NaN"):  # the other checks still hold
        decode_line(line, surrogates=True)
    assert decode_line(line.replace(b"NaN", b"1"), surrogates=True) == {
        "tasks": [{"arguments": ["\ud800"]}], "x": 1}


@pytest.mark.parametrize(("name", "line"), hostile_lines(huge=False))
def test_a_hostile_line_is_read_or_refused_and_nothing_else(name: str, line: bytes) -> None:
    try:
        value = decode_line(line)
    except BadLine as bad:
        assert str(bad), name
        return
    assert name in ("a bare string", "a bare number", "null", "a very long key"), name
    assert encode_line(value)  # what is read can be written back


def test_the_path_of_a_value_is_found_without_recursion() -> None:
    deep: Any = ["x"]
    for _ in range(10_000):  # far deeper than Python's recursion limit
        deep = {"k": [deep]}
    assert path_of(deep, lambda v: v == "x") == ".".join(["k[0]"] * 10_000) + "[0]"
    assert path_of({"a": 1}, lambda v: False) is None
    assert path_of(math.nan, lambda v: isinstance(v, float)) == ""


def _reads_peers(module: str) -> Optional[str]:
    text = (SRC / module).read_text()
    if "decode_line(" not in text:
        return "does not call decode_line"
    for bad in ("json.loads(line", "json.loads(self._lines", "json.loads(data",
                "json.loads(body"):
        if bad in text:
            return bad
    return None


@pytest.mark.parametrize("module", [
    "controller/_loop.py", "flows/client.py", "supervise/client.py",
    "executors/pilot/service.py", "executors/pilot/_remote_nodes.py",
    "executors/pilot/agent.py", "executors/batch/_slurm_rest.py",
])
def test_every_reader_of_a_peer_reads_through_the_one_decoder(module: str) -> None:
    assert _reads_peers(module) is None, module
