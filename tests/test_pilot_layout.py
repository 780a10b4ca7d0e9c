"""How the pilot package is cut: no module past 700 lines, one framing of socket lines, one
schema for the journal (written by its line builders, read back by ReplayPlan)."""

import json
from pathlib import Path

import psij.executors.pilot as pilot
from psij._line_framing import LineFramer, encode_line
from psij.executors.pilot.journal import (
    ReplayPlan,
    cancel_line,
    end_line,
    forget_line,
    read_journal,
    start_line,
    submit_lines,
)

FOLDER = Path(pilot.__file__).parent


def test_no_pilot_module_is_over_700_lines() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in FOLDER.glob("*.py")}
    assert {name: n for name, n in sizes.items() if n > 700} == {}


def test_every_pilot_peer_frames_lines_with_the_one_helper() -> None:
    for name in ("agent.py", "_remote_nodes.py", "service.py", "engine.py"):
        text = (FOLDER / name).read_text()
        assert 'split(b"\\n")' not in text and "separators=" not in text, name
    message = {"op": "exited", "id": "t\u00e9\n", "code": None, "message": "\ud800"}
    line = encode_line(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1 and b" " not in line
    framer = LineFramer()
    assert framer.feed(line[:5]) == []
    assert [json.loads(x) for x in framer.feed(line[5:] + line)] == [message, message]


def test_the_journal_builders_write_what_a_resume_reads(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    tasks = [{"name": "a\"\u00e9", "executable": "/bin/true"},
             {"name": "b", "executable": "/bin/false"},
             {"name": "c", "executable": "/bin/true"}]
    lines = [*submit_lines(tasks), start_line('a"\u00e9', "n1", 4242, "f00d"),
             end_line('a"\u00e9', "SUCCEEDED", 0), start_line("b", "far"),
             end_line("b", "FAILED", None), cancel_line("c"), forget_line("b")]
    path.write_text("".join(lines))
    records = read_journal(path)
    assert len(records) == len(lines)  # every line is one JSON object
    assert records[3] == {"e": "start", "id": 'a"\u00e9', "node": "n1", "pid": 4242,
                          "run": "f00d"}
    assert records[5] == {"e": "start", "id": "b", "node": "far"}
    plan = ReplayPlan(records)
    assert list(plan.submitted) == ['a"\u00e9', "c"]
    assert plan.final == {'a"\u00e9': "SUCCEEDED"}
    assert plan.canceled == {"c"} and plan.leftovers == {}
    unfinished = ReplayPlan(read_journal(path)[:4])
    assert unfinished.leftovers == {'a"\u00e9': (4242, "f00d")}
