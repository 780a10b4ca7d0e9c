"""The ``--help`` description of a benchmark script: the first paragraph of its docstring, whole
(its first line alone stops mid-sentence when the paragraph wraps); and how they run a child
in a session of its own."""

import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple


def description(doc: str) -> str:
    return " ".join(doc.strip().split("\n\n")[0].split())


def run_in_session(command: List[str], env: Dict[str, str], timeout: float,
                   prefix: str) -> Tuple[Optional[int], str, str]:
    """Run ``command`` in a session of its own, in a new temporary directory, and return its
    exit status (None: killed, with everything it started, after ``timeout`` seconds) and what
    it printed. Output goes to files, not pipes: a job still holding them cannot keep us
    waiting."""
    with tempfile.TemporaryDirectory(prefix=prefix) as cwd:
        out_path, err_path = Path(cwd) / "stdout", Path(cwd) / "stderr"
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    env=env, cwd=cwd, start_new_session=True)
        returncode: Optional[int]
        try:
            returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            returncode = None
        return (returncode, out_path.read_text(errors="replace"),
                err_path.read_text(errors="replace"))
