"""A real ``psij flow serve`` process for the flow tests, and polling with a deadline."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence

from psij.flows.client import FlowClient, FlowError


def wait_for(what: str, check: Callable[[], Any], timeout: float = 30.0,
             every: float = 0.2) -> Any:
    """``check()``'s first true value; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
        except (FlowError, OSError) as ex:
            last = ex
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout} s (last: {last!r})")
        time.sleep(every)


class Service:
    """``psij flow serve`` in its own process (so that it can be killed with -9)."""

    def __init__(self, state_dir: Path, socket_path: str, options: Sequence[str] = (),
                 single_user: bool = True, extra: Sequence[str] = ()) -> None:
        self.state_dir = state_dir
        self.socket = socket_path
        self.options = list(options)
        self.single_user = single_user
        self.extra = list(extra)
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.log = state_dir.parent / f"{state_dir.name}-serve.log"

    def argv(self) -> List[str]:
        argv = [sys.executable, "-m", "psij", "flow", "serve", "--state-dir",
                str(self.state_dir), "--socket", self.socket, "--log-level", "DEBUG"]
        if self.single_user:
            argv.append("--single-user")
        for option in self.options:
            argv += ["--set", option]
        return argv + self.extra

    def start(self) -> "Service":
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=log,
                                         start_new_session=True)
        wait_for("the flow service answers", self._answers, timeout=30.0)
        return self

    def _answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"psij flow serve exited with {self.proc.returncode}:\n"
                                 + self.log.read_text(errors="replace")[-3000:])
        try:
            with FlowClient(self.socket, timeout=5.0) as client:
                client.list()
        except FlowError:
            return False
        return True

    def client(self) -> FlowClient:
        return FlowClient(self.socket, timeout=30.0)

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def destroy_all(self) -> None:
        """Destroy every handle left (the instances of a stopped service keep running)."""
        try:
            with self.client() as client:
                for entry in client.list():
                    name = entry["handle"] if isinstance(entry, dict) else entry
                    if isinstance(entry, dict) and not entry.get("valid", True):
                        continue
                    try:
                        client.destroy(name)
                    except FlowError:
                        pass
        except FlowError:
            pass

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def processes_with(marker: str) -> List[int]:
    """Pids of live processes whose command line holds ``marker`` (zombies excluded)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if marker.encode() in cmdline and ") Z " not in stat \
                and b"flow_helpers" not in cmdline and b"pytest" not in cmdline:
            pids.append(int(entry))
    return sorted(pids)
