"""``psij wait`` shows its progress over many jobs: a live line on a real terminal (a tmux pane,
read back with ``capture-pane``) and plain whole lines in a pipe."""

import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import List

from test_cli_jobs import PSIJ, env, home, psij_cmd  # noqa: F401  (home is a fixture)

PLAIN = re.compile(r"^(\d+)/(\d+) final \[[0-9:]+<[0-9:?]+, +[^,\]]+(, [A-Z]+ \d+)*\]$")


def submit(home: Path, tag: str, seconds: List[float]) -> List[str]:  # noqa: F811
    ids = []
    for s in seconds:
        done = psij_cmd(home, "submit", "--tag", tag, "--", "/bin/sleep", str(s))
        assert done.returncode == 0, done.stderr
        ids.append(done.stdout.strip())
    return ids


def test_in_a_pipe_progress_is_plain_lines_and_a_last_one(home: Path) -> None:  # noqa: F811
    submit(home, "p", [0.2, 1.5, 3])
    quiet = psij_cmd(home, "wait", "--tag", "p", "--no-progress")
    assert quiet.returncode == 0 and quiet.stderr == ""
    submit(home, "q", [0.2, 1.5, 3])
    # Plain lines are the default when standard error is not a terminal.
    shown = psij_cmd(home, "wait", "--tag", "q", "--progress-every", "0.5")
    assert shown.returncode == 0, shown.stderr
    assert "\r" not in shown.stderr and "\x1b" not in shown.stderr
    lines = shown.stderr.splitlines()
    assert len(lines) >= 3, lines
    for line in lines:
        assert PLAIN.match(line), line
    assert not lines[0].startswith("3/3") and "ACTIVE" in lines[0]
    assert lines[-1].startswith("3/3 final") and lines[-1].endswith(", COMPLETED 3]")
    finals = [int(PLAIN.match(line).group(1)) for line in lines]  # type: ignore[union-attr]
    assert finals == sorted(finals)
    # The table on standard output is as without progress.
    assert shown.stdout.splitlines()[0].split()[:2] == ["ID", "EXECUTOR"]
    assert len(shown.stdout.splitlines()) == 4
    bad = psij_cmd(home, "wait", "--tag", "q", "--progress-every", "nan")
    assert bad.returncode == 2 and "--progress-every" in bad.stderr and "'nan'" in bad.stderr
    both = psij_cmd(home, "wait", "--tag", "q", "--progress", "--no-progress")
    assert both.returncode == 2 and "not allowed with" in both.stderr


def test_on_a_terminal_progress_is_one_live_line(home: Path, tmp_path: Path) -> None:  # noqa: F811
    tmux = shutil.which("tmux")
    assert tmux, "tmux is missing: tests/setup/system-deps.sh installs it"
    submit(home, "t", [0.2, 3, 6])
    socket = f"psij-test-{os.getpid()}"
    marker = tmp_path / "ended"
    out = tmp_path / "table"
    script = (f'HOME="{home}" "{PSIJ}" wait --tag t > "{out}"; echo $? > "{marker}"; '
              "sleep 600")
    base = [tmux, "-L", socket, "-f", "/dev/null"]
    subprocess.run([*base, "new-session", "-d", "-x", "150", "-y", "12", script], check=True,
                   env=env(home), timeout=60)

    def screen() -> str:
        return subprocess.run([*base, "capture-pane", "-p"], capture_output=True, text=True,
                              check=True, timeout=60).stdout

    try:
        seen_running = ""
        deadline = time.monotonic() + 240
        while not marker.exists() and time.monotonic() < deadline:
            text = screen()
            if re.search(r"[12]/3 final \|", text) and "ACTIVE" in text:
                seen_running = text
            time.sleep(0.1)
        assert marker.exists(), f"psij wait did not end; the terminal shows:\n{screen()}"
        assert marker.read_text().strip() == "0"
        last = screen()
    finally:
        subprocess.run([*base, "kill-server"], capture_output=True, timeout=60)
    # While jobs ran: one line with the bar, counts per state, rate and time left.
    assert seen_running, "no live progress line seen"
    running = [line for line in seen_running.splitlines() if "final |" in line]
    assert len(running) == 1, seen_running
    assert re.search(r"job/s|s/job", running[0]) and "<" in running[0]
    # At the end the same line, redrawn in place, says all are final.
    done = [line for line in last.splitlines() if "final" in line]
    assert len(done) == 1, last
    assert done[0].startswith("3/3 final |") and "COMPLETED 3" in done[0]
    assert out.read_text().splitlines()[0].split()[:2] == ["ID", "EXECUTOR"]
