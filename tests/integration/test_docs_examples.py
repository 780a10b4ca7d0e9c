"""Every code example in README.md and docs/*.rst either runs here, as written, or says why not.

Marker convention (also described in docs/troubleshooting.rst, "Documentation examples"): each
literal block (an RST ``::`` block or ``.. code-block::``, a Markdown fenced block) is preceded
by a marker, an RST comment ``.. test: <what>`` or, in Markdown, ``<!-- test: <what> -->``,
somewhere after the previous block. ``<what>`` is one of:

``python``
    run as a Python script in a fresh interpreter, in an empty temporary directory;
``shell``
    run with ``bash -e`` in an empty temporary directory, with this interpreter's ``bin`` (the
    ``psij`` command) first on ``PATH``;
``doctest``
    a ``>>>`` session, checked with :mod:`doctest` (ELLIPSIS on), ``psij`` already imported;
``python slurm``, ``python sge`` (or ``shell ...``)
    as above, on the real scheduler started by tests/setup (pytest markers ``slurm``/``sge``),
    with the placeholders ``<SHARED DIR>``, ``<QUEUE>`` and ``<ACCOUNT>`` replaced by a
    temporary directory and the test scheduler's queue and an account name;
``python ssh``, ``shell ssh``
    as above, over SSH to this machine: a user made for the test logs in to the test sshd
    (tests/setup/start-sshd.sh; skipped with the reason without it) and is removed after;
    ``<USER>`` is replaced by its name and ``<HOST>`` by its host alias, and the environment
    gives ``PSIJ_SSH_COMMAND`` (``ssh -F`` its client configuration) and ``PSIJ_REMOTE_PSIJ``
    (a psij of this checkout it can run), so that the example reads as a user writes it
    (``url="ssh://<USER>@<HOST>"``, ``psij --host <USER>@<HOST> ...``);
``skip <reason>``
    not run; the reason (required) says why (not an example, needs a cluster we lack, ...).

In every runnable block ``<PSIJ CHECKOUT>`` stands for the source tree, and ``HOME`` is the
temporary directory, so that ``~`` writes nothing outside it.

A block without a marker, or with a marker this file does not know, fails
``test_every_example_is_marked``; the runnable ones are each a test of their own.
"""

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

from support.ssh_server import (
    make_ssh_user,
    remote_psij_command,
    remote_psij_reason,
    sshd_reason,
)

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.rst"))]

_RST_MARKER = re.compile(r"^\s*\.\. test:(.*)$")
_MD_MARKER = re.compile(r"^\s*<!-- test:(.*?)-->\s*$")
_DIRECTIVE = re.compile(r"^\s*\.\. ([\w:-]+)::")
_FENCE = re.compile(r"^\s*```")
_KINDS = ("python", "shell", "doctest")
_SCHEDULERS = {"slurm": {"<QUEUE>": "debug", "<ACCOUNT>": "psij-docs"},
               "sge": {"<QUEUE>": "all.q", "<ACCOUNT>": "psij-docs"}}
_SSH = "ssh"
_TIMEOUT = 120


@dataclass
class Block:
    source: Path
    line: int
    code: str
    marker: Optional[str]

    @property
    def where(self) -> str:
        return f"{self.source.relative_to(ROOT)}:{self.line}"

    def problem(self) -> Optional[str]:
        """What is wrong with the marker, or None."""
        if self.marker is None:
            return "no marker (.. test: python|shell|doctest [slurm|sge|ssh] | skip <reason>)"
        words = self.marker.split()
        if words[:1] == ["skip"]:
            return None if len(words) > 1 else "'skip' needs a reason"
        if not words or words[0] not in _KINDS:
            return f"unknown marker {self.marker!r}"
        if len(words) > 2 or (len(words) == 2 and words[1] not in (*_SCHEDULERS, _SSH)):
            return f"unknown marker {self.marker!r} (scheduler: slurm or sge; or ssh)"
        if words[1:] == [_SSH] and "<HOST>" not in self.code:
            return "an ssh example names no <HOST> to reach"
        return None


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _rst_blocks(path: Path) -> Iterator[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    marker: Optional[str] = None
    i = 0
    while i < len(lines):
        line = lines[i]
        found = _RST_MARKER.match(line)
        if found:
            marker = found.group(1).strip()
            i += 1
            continue
        directive = _DIRECTIVE.match(line)
        if directive:
            starts = directive.group(1) in ("code-block", "code", "sourcecode")
        else:
            starts = line.rstrip().endswith("::")
        if not starts:
            i += 1
            continue
        level = _indent(line)
        j = i + 1
        body: List[str] = []
        while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > level):
            body.append(lines[j])
            j += 1
        if directive:  # drop the directive's options (":caption: ...") before its content
            while body and body[0].lstrip().startswith(":"):
                body.pop(0)
        code = textwrap.dedent("\n".join(body)).strip("\n")
        if code:
            yield Block(path, i + 1, code + "\n", marker)
            marker = None
        i = j


def _md_blocks(path: Path) -> Iterator[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    marker: Optional[str] = None
    i = 0
    while i < len(lines):
        found = _MD_MARKER.match(lines[i])
        if found:
            marker = found.group(1).strip()
        elif _FENCE.match(lines[i]):
            j = i + 1
            while j < len(lines) and not _FENCE.match(lines[j]):
                j += 1
            yield Block(path, i + 1, "\n".join(lines[i + 1:j]) + "\n", marker)
            marker = None
            i = j
        i += 1


def all_blocks() -> List[Block]:
    blocks: List[Block] = []
    for source in SOURCES:
        blocks.extend(_md_blocks(source) if source.suffix == ".md" else _rst_blocks(source))
    return blocks


def _runnable() -> List[object]:
    params: List[object] = []
    for block in all_blocks():
        if block.problem() is not None or block.marker is None:
            continue
        words = block.marker.split()
        if words[0] == "skip":
            continue
        marks = [getattr(pytest.mark, words[1])] if words[1:] not in ([], [_SSH]) else []
        params.append(pytest.param(block, marks=marks, id=block.where))
    return params


def test_every_example_is_marked() -> None:
    blocks = all_blocks()
    assert len(blocks) > 20  # the extraction found the examples
    problems = [f"{b.where}: {b.problem()}" for b in blocks if b.problem() is not None]
    assert problems == []


def test_the_convention_finds_blocks_of_every_form(tmp_path: Path) -> None:
    rst = tmp_path / "x.rst"
    rst.write_text("Text::\n\n    a = 1\n\n.. test: shell\n\n.. code-block:: bash\n"
                   "   :caption: c\n\n   echo hi\n\n.. toctree::\n\n   page\n")
    md = tmp_path / "x.md"
    md.write_text("<!-- test: skip why -->\n```sh\nls\n```\n")
    found = [(b.line, b.code, b.marker) for b in _rst_blocks(rst)]
    assert found == [(1, "a = 1\n", None), (7, "echo hi\n", "shell")]
    assert [(b.code, b.marker) for b in _md_blocks(md)] == [("ls\n", "skip why")]


@pytest.mark.parametrize("marker, code, problem", [
    ("python ssh", "url = 'ssh://<USER>@<HOST>'\n", None),
    ("shell ssh", "psij --host <HOST> status\n", None),
    ("shell ssh", "psij status\n", "an ssh example names no <HOST> to reach"),
    ("python ftp", "x\n", "unknown marker 'python ftp' (scheduler: slurm or sge; or ssh)"),
    ("python ssh slurm", "<HOST>\n", "unknown marker 'python ssh slurm' (scheduler: slurm or "
                                      "sge; or ssh)"),
])
def test_the_ssh_kind_is_known_and_must_name_a_host(marker: str, code: str,
                                                    problem: Optional[str]) -> None:
    assert Block(ROOT / "x.rst", 1, code, marker).problem() == problem


@pytest.mark.parametrize("block", _runnable())
def test_example_runs(block: Block, tmp_path: Path) -> None:
    assert block.marker is not None
    words = block.marker.split()
    if words[1:] == [_SSH]:
        reason = sshd_reason() or remote_psij_reason()
        if reason is not None:
            pytest.skip(reason)
        user = make_ssh_user("psijdoc")
        try:
            _run_block(block, tmp_path, {"<USER>": user.name, "<HOST>": user.alias},
                       {"PSIJ_SSH_COMMAND": f"ssh -F {user.config}",
                        "PSIJ_REMOTE_PSIJ": remote_psij_command()})
        finally:
            user.remove()
        return
    values: Dict[str, str] = {}
    if len(words) == 2:
        values = dict(_SCHEDULERS[words[1]], **{"<SHARED DIR>": str(tmp_path)})
    _run_block(block, tmp_path, values, {})


def _run_block(block: Block, tmp_path: Path, values: Dict[str, str],
               environ: Dict[str, str]) -> None:
    """Run ``block`` with ``values`` put in place of their placeholders, ``environ`` added to
    its environment."""
    assert block.marker is not None
    words = block.marker.split()
    code = block.code
    for placeholder, value in values.items():
        code = code.replace(placeholder, value)
    code = code.replace("<PSIJ CHECKOUT>", str(ROOT))
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               HOME=str(tmp_path))
    for name in ("PSIJ_LOG", "PSIJ_SSH_COMMAND", "PSIJ_REMOTE_PSIJ"):
        env.pop(name, None)
    env.update(environ)
    if words[0] == "python":
        script = tmp_path / "example.py"
        script.write_text(code)
        argv = [sys.executable, str(script)]
    elif words[0] == "shell":
        script = tmp_path / "example.sh"
        script.write_text(code)
        argv = ["bash", "-e", str(script)]
    else:
        script = tmp_path / "example.txt"
        script.write_text(">>> import psij\n" + code)
        argv = [sys.executable, "-m", "doctest", "-o", "ELLIPSIS", str(script)]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=_TIMEOUT, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, (f"{block.where} exited with {done.returncode}\n--- code\n"
                                  f"{code}--- stdout\n{done.stdout}--- stderr\n{done.stderr}")
