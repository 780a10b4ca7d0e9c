"""What the tests of the script-based launchers share: hostile strings, a program that
prints what it was given, and running a launch command the way executors do. The fixtures
``config``, ``job_dir`` and ``argv_dump`` are in ``tests/conftest.py``."""

import os
import subprocess
import textwrap
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import psij
from psij.launchers.script_based_launcher import LAUNCHER_DONE_MARKER, ScriptBasedLauncher

MARKER = LAUNCHER_DONE_MARKER

# Strings a shell would mangle or execute if anything on the way were unquoted or evaluated.
HOSTILE = [
    "plain",
    "two words",
    "  leading and trailing  ",
    "",
    "'single quoted'",
    '"double quoted"',
    "$(touch pwned_subst)",
    "`touch pwned_backtick`",
    "$HOME ${HOME} $1 $@",
    "line one\nline two\n",
    "tab\there",
    "* ? [a-z] ~ **/*",
    "{{mustache}} {a,b}",
    "; touch pwned_semicolon && echo x | cat > pwned_pipe",
    "back\\slash \\n",
    "%s %n %%",
    "-n",
    "--",
    "!bang !!",
    "unicode: h\u00e9llo \u2713 \u65e5\u672c",
    "$'\\x41' <(echo) >(cat)",
]

# Prints its arguments and the variables named in ECHO_ENV, each NUL-terminated.
# One write() per run, so copies sharing an output file never interleave inside a record.
ARGV_DUMP = """\
import os, sys
parts = [os.fsencode(word) + b"\\0" for word in sys.argv[1:]]
for name in os.environ.get("ECHO_ENV", "").split(","):
    if name:
        parts.append(b"ENV " + os.fsencode(name) + b"=" + os.environb[os.fsencode(name)] + b"\\0")
os.write(1, b"".join(parts))
"""


def nul_joined(words: Sequence[str]) -> bytes:
    return b"".join(os.fsencode(w) + b"\0" for w in words)


def write_script(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    path.chmod(0o755)
    return path


def run(argv: List[str], cwd: Path, env: Optional[Dict[str, str]] = None,
        timeout: float = 60) -> "subprocess.CompletedProcess[str]":
    """Runs a launch command the way executors do: launcher stdout and stderr in one capture."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(argv, cwd=cwd, env=full_env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


def bash_job(script: str, **spec_fields: object) -> psij.Job:
    return psij.Job(psij.JobSpec(executable="bash", arguments=["-c", script],
                                 **spec_fields))  # type: ignore[arg-type]


def launched_ok(launcher: ScriptBasedLauncher, output: str) -> bool:
    lines = output.splitlines()
    return (not launcher.is_launcher_failure(output)) and bool(lines) and lines[-1] == MARKER
