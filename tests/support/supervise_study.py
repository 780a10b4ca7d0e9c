"""Running ``psij supervise`` on the example study (examples/supervised_study.py) as a real
process, for the tests on ``local``, a pilot and the real Slurm."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, List, Optional, Set

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "supervised_study.py"


def wait_for(condition: Callable[[], Any], seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.05)


class Study:
    """One run of the example study under ``psij supervise``, writing into ``results``."""

    def __init__(self, results: Path, executor: str = "local", clients: int = 50,
                 wave: int = 10, executor_url: Optional[str] = None,
                 **options: Any) -> None:
        self.results = results
        words = [sys.executable, str(EXAMPLE), "config", str(results), "--executor", executor,
                 "--clients", str(clients), "--wave", str(wave)]
        if executor_url:
            words += ["--executor-url", executor_url]
        made = subprocess.run(words, capture_output=True, text=True, check=True)
        config = json.loads(made.stdout)
        config["verbose"] = 1
        config.update(options)
        self.config = config
        self.count = clients
        self.output = Path(config["output_dir"])
        self.path = results / "study.json"
        self.path.write_text(json.dumps(config))
        self.process: Optional[subprocess.Popen[bytes]] = None

    def start(self) -> "Study":
        with open(self.results / "stderr.txt", "wb") as stderr:
            self.process = subprocess.Popen([sys.executable, "-m", "psij", "supervise",
                                             str(self.path)], stderr=stderr, cwd=ROOT)
        return self

    def wait(self, seconds: float) -> int:
        assert self.process is not None
        try:
            return self.process.wait(seconds)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"psij supervise still running after {seconds} s:\n"
                                 f"{self.errors()}") from None

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def errors(self) -> str:
        return (self.results / "stderr.txt").read_text(errors="replace")

    def log(self) -> str:
        try:
            return (self.output / "supervise.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_time(self, words: str) -> Optional[float]:
        """When the log first says ``words`` (seconds since the epoch)."""
        for line in self.log().splitlines():
            if words in line:
                stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                return stamp.timestamp()
        return None

    def native_ids(self, generation: Optional[int] = None, kind: str = "") -> Set[str]:
        """The native ids of the jobs the log says were submitted."""
        found = set()
        for match in re.finditer(r"\((client '[^']*'|server) of generation (\d+)\) is job "
                                 r"(\S+)", self.log()):
            if generation is not None and int(match.group(2)) != generation:
                continue
            if kind and not match.group(1).startswith(kind):
                continue
            found.add(match.group(3))
        return found

    def unsettled(self) -> Set[int]:
        """The uids the journal shows submitted (or being submitted) and not ended."""
        open_uids: Set[int] = set()
        for line in (self.output / "supervise.journal").read_text().splitlines():
            entry = json.loads(line)
            if "final" in entry:
                open_uids.discard(entry["uid"])
            else:
                open_uids.add(entry["uid"])
        return open_uids

    def server_pid(self, generation: int) -> int:
        path = self.results / f"server.{generation}.pid"
        return int(wait_for(lambda: path.exists() and path.read_text().strip(), 60,
                            f"server generation {generation} running"))

    def results_done(self) -> List[int]:
        return [i for i in range(self.count) if (self.results / f"result.{i}.txt").exists()]

    def check_finished(self) -> None:
        """All results there, combined right, and the uid-named files in the output."""
        assert self.results_done() == list(range(self.count))
        total = sum(i * i for i in range(self.count))
        assert (self.results / "combined.txt").read_text().strip() == str(total)
        names = set(os.listdir(self.output))
        assert "submit.0.sh" in names and "supervise.log" in names
        uids = {int(n.split(".")[1]) for n in names if n.startswith("submit.")}
        assert len(uids) >= self.count + 1
        assert "job.0.study-server.out" in names
        for i in range(self.count):  # clients cancelled before they ran have no output
            assert any(n.startswith("job.") and n.endswith(f".c{i}.out") for n in names), i
        assert (os.stat(self.output).st_mode & 0o777) == 0o700
        assert (os.stat(self.output / "submit.0.sh").st_mode & 0o777) == 0o600


def squeue_ids() -> Set[str]:
    """The ids of every job in the Slurm queue."""
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True,
                         check=True).stdout
    return set(out.split())


def stop_process(pid: int, signum: int = signal.SIGKILL) -> float:
    os.kill(pid, signum)
    return time.time()


def squeue_in(directory: Path) -> Set[str]:
    """The ids of the jobs in the Slurm queue that run in ``directory``."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %Z"], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[0] for line in out.splitlines()
            if line.split(maxsplit=1)[1:] == [str(directory)]}


def sleeping(results: Path) -> List[int]:
    """The example's clients writing into ``results`` that are in their sleep (so they have
    read how long to sleep), on this machine."""
    found = subprocess.run(["pgrep", "-f", f"supervised_study.py client {results} "],
                           capture_output=True, text=True).stdout.split()
    asleep = []
    for pid in found:
        try:
            with open(f"/proc/{pid}/wchan") as f:
                if "nanosleep" in f.read():
                    asleep.append(int(pid))
        except OSError:
            pass
    return asleep
