"""Running a study: the output directory, the executor, the listener, the loop.

Everything here is I/O around the pure :class:`~psij.supervise.Supervisor`: it makes the
executor from the configuration (its errors are configuration errors, raised before anything
is submitted), listens where the server will connect, records each submission's script as
``submit.<uid>.sh`` on the worker thread that submits it, and runs the
:class:`~psij.controller.ControllerLoop` until the machine stops it.
"""

import json
import logging
import os
import re
import shlex
import socket
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from psij._clock import Clock
from psij._private_dirs import ensure_private_dir
from psij.controller import ControllerLoop
from psij.supervise._config import ConfigError, SuperviseConfig
from psij.supervise._machine import Journal, Settings, Supervisor
from psij.supervise._messages import ENV_UID

__all__ = ["make_executor", "run"]

logger = logging.getLogger("psij.supervise")

# A Unix socket's path must fit in sun_path (108 bytes on Linux, with its NUL).
_SUN_PATH = 100


class RecordingExecutor:
    """An executor that writes each job's submit script to ``submit.<uid>.sh`` in the output
    directory (the executor's own script where it makes one, else the command line as a
    shell script), then submits through ``inner``."""

    def __init__(self, inner: Any, output_dir: Path) -> None:
        self.inner = inner
        self.output_dir = output_dir

    def submit(self, job: Any) -> None:
        spec = job.spec
        uid = (spec.environment or {}).get(ENV_UID)
        if uid is not None:
            try:
                self._write_script(job, str(uid))
            except Exception as error:  # the record is a help, not a condition
                logger.warning("supervisor: cannot write submit.%s.sh: %s", uid, error)
        self.inner.submit(job)

    def _write_script(self, job: Any, uid: str) -> None:
        maker = getattr(self.inner, "submit_script", None)
        if maker is not None:
            text = maker(job)
        else:
            spec = job.spec
            env = " ".join(f"{k}={shlex.quote(str(v))}"
                           for k, v in sorted((spec.environment or {}).items()))
            words = " ".join(shlex.quote(str(w))
                             for w in [spec.executable, *(spec.arguments or [])])
            where = f"cd {shlex.quote(str(spec.directory))} && " if spec.directory else ""
            name = getattr(self.inner, "name", type(self.inner).__name__)
            text = (f"#!/bin/sh\n# job uid {uid} for the {name} executor\n"
                    f"{where}exec env {env} {words}\n")
        path = self.output_dir / f"submit.{uid}.sh"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as out:
            out.write(text)

    def cancel(self, job: Any) -> None:
        self.inner.cancel(job)

    def attach(self, job: Any, native_id: str) -> None:
        self.inner.attach(job, native_id)


def make_executor(config: SuperviseConfig) -> Any:
    """The executor ``config`` names, with its settings (``job_update_interval`` as a batch
    executor's polling interval unless the settings give one); :class:`ConfigError` when it
    cannot be made."""
    from psij._plugins import REGISTRY
    from psij.executors.batch._batch_config import BatchSchedulerExecutorConfig
    from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutor
    from psij.job_executor import JobExecutor
    from psij.job_executor_config import JobExecutorConfig

    settings = dict(config.executor_config)
    try:
        names = JobExecutor.get_executor_names()
        if config.executor not in names:
            raise ConfigError([f"executor: {config.executor!r} is not an installed executor "
                               f"(installed: {', '.join(sorted(names))})"])
        cls = REGISTRY.select("executor", config.executor, base=JobExecutor).cls
        executor_config: JobExecutorConfig
        if isinstance(cls, type) and issubclass(cls, BatchSchedulerExecutor):
            executor_config = BatchSchedulerExecutorConfig(**{
                "queue_polling_interval": config.job_update_interval,
                "initial_queue_polling_delay": min(2.0, config.job_update_interval),
                **settings})
        else:
            executor_config = JobExecutorConfig(**{
                k: v for k, v in settings.items() if k in ("launcher_log_file",
                                                           "work_directory")})
        return JobExecutor.get_instance(config.executor, url=config.executor_url,
                                        config=executor_config)
    except (ValueError, TypeError, OSError) as error:
        if isinstance(error, ConfigError):
            raise
        raise ConfigError([f"executor: cannot make the {config.executor!r} executor: "
                           f"{error}"]) from None


def _listen(loop: ControllerLoop, config: SuperviseConfig, output_dir: Path) -> Tuple[str, str]:
    """Listen where the server will connect; returns its address and the socket's folder
    made for it ("" when none)."""
    if config.protocol == "tcp":
        host, port = "0.0.0.0", 0
        if config.bind:
            text = config.bind
            if text.count(":") == 1:
                host, _, port_text = text.partition(":")
                try:
                    port = int(port_text)
                except ValueError:
                    raise ConfigError([f"bind: expected HOST or HOST:PORT, got {text!r}"]) \
                        from None
            else:
                host = text
        try:
            bound, bound_port = loop.listen_tcp(host, port, name="tcp")
        except (OSError, OverflowError, ValueError) as error:
            raise ConfigError([f"bind: cannot listen on {config.bind!r}: {error}"]) from None
        shown = socket.gethostname() if bound in ("0.0.0.0", "::") else bound
        return f"tcp:{shown}:{bound_port}", ""
    path = str(output_dir / "supervisor.sock")
    made = ""
    if len(os.fsencode(path)) > _SUN_PATH:
        made = tempfile.mkdtemp(prefix="psij-sup-")
        path = os.path.join(made, "s")
    try:
        loop.listen_unix(path, name="unix")
    except OSError as error:
        if made:
            os.rmdir(made)
        raise ConfigError([f"output_dir: cannot listen on {path}: {error}"]) from None
    return f"unix:{path}", made


_SUBMIT_FILE = re.compile(r"submit\.(\d+)\.sh")


class JournalFile:
    """The output directory's ``supervise.journal``: one JSON object a line, appended as
    jobs are submitted and end, read back by the next supervisor of the same directory."""

    def __init__(self, output_dir: Path) -> None:
        self.path = output_dir / "supervise.journal"

    def read(self) -> Tuple[List[Tuple[int, str]], List[Tuple[int, str]], int, int]:
        """The jobs submitted and not seen ending (uid, native id), the submissions not seen
        returning (uid, job name: they may have queued their job), the next free uid and the
        last generation."""
        jobs: Dict[int, str] = {}
        named: Dict[int, str] = {}
        last_uid, generation = -1, 0
        try:
            with open(self.path, encoding="utf-8", errors="replace") as f:
                lines = f.readlines()
        except FileNotFoundError:
            lines = []
        for number, line in enumerate(lines, 1):
            try:
                entry = json.loads(line)
                uid = entry["uid"]
                if isinstance(uid, bool) or not isinstance(uid, int) or uid < 0:
                    raise ValueError(f"uid {uid!r}")
            except (ValueError, KeyError, TypeError) as error:
                logger.warning("supervisor: %s line %d is unreadable (%s); skipped", self.path,
                               number, error)
                continue
            last_uid = max(last_uid, uid)
            if "final" in entry:
                jobs.pop(uid, None)
                named.pop(uid, None)
                continue
            if isinstance(entry.get("native_id"), str):
                jobs[uid] = entry["native_id"]
                named.pop(uid, None)
            elif isinstance(entry.get("name"), str) and entry["name"] \
                    and "\n" not in entry["name"]:
                named[uid] = entry["name"]  # journaled before its submit command ran
            else:
                continue
            if isinstance(entry.get("generation"), int):
                generation = max(generation, entry["generation"])
        for name in os.listdir(self.path.parent):
            match = _SUBMIT_FILE.fullmatch(name)
            if match:
                last_uid = max(last_uid, int(match.group(1)))
        return sorted(jobs.items()), sorted(named.items()), last_uid + 1, generation

    def open(self) -> None:
        """Open for appending, and hold its lock while this supervisor runs: a second one in
        the same directory would cancel the first one's jobs as leftovers."""
        import fcntl

        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
                           0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._fd)
            raise ConfigError([f"output_dir: another supervisor runs in "
                               f"{self.path.parent}"]) from None

    def write(self, action: Journal) -> None:
        os.write(self._fd, (json.dumps(action.entry, separators=(",", ":")) + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


def _log_to_file(output_dir: Path, verbose: int) -> logging.Handler:
    path = output_dir / "supervise.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    handler = logging.StreamHandler(os.fdopen(fd, "a", encoding="utf-8",
                                              errors="backslashreplace"))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    handler.setLevel(logging.DEBUG if verbose else logging.INFO)
    return handler


def _name_canceller(executor: Any) -> Any:
    """The executor's ``cancel_jobs_named`` where it can look jobs up by name, else None."""
    cancel = getattr(executor, "cancel_jobs_named", None)
    named_list = getattr(executor, "get_named_list_command", None)
    if cancel is None or named_list is None:
        return None
    try:
        named_list("psij")
    except NotImplementedError:
        return None
    return cancel


def run(config: SuperviseConfig, clock: Optional[Clock] = None, cleanup: bool = False) -> int:
    """Run the study ``config`` describes until it ends; returns the exit code (0: the server
    finished; 1: the study failed; 130/143: stopped by SIGINT/SIGTERM).

    With ``cleanup``, only cancel the jobs the journal of ``output_dir`` names as left behind
    (and those whose submission may have queued them), wait for them to end (at most
    ``stop_grace`` seconds) and return 0, or 1 when some could not be settled."""
    if cleanup and not os.path.isdir(config.output_dir):
        raise ConfigError([f"output_dir: {config.output_dir} does not exist: nothing to clean "
                           f"up"])
    executor = make_executor(config)
    try:
        output_dir = ensure_private_dir(config.output_dir, "output_dir")
    except (OSError, ValueError) as error:
        raise ConfigError([f"output_dir: {error}"]) from None
    handler = _log_to_file(output_dir, config.verbose)
    loggers = [logging.getLogger("psij.controller"), logger]
    for each in loggers:
        each.addHandler(handler)
        if each.level == logging.NOTSET or each.level > handler.level:
            each.setLevel(handler.level)
    made = ""
    journal = JournalFile(output_dir)
    try:
        loop = ControllerLoop(_Placeholder(), RecordingExecutor(executor, output_dir),
                              clock=clock, tick=config.timer_delay, workers=config.workers,
                              action_handlers={Journal: journal.write})
        address = ""
        if not cleanup:
            address, made = _listen(loop, config, output_dir)
        journal.open()
        try:
            leftovers, unsure, first_uid, generation = journal.read()
            loop.machine = Supervisor(Settings(
                config.server, config.client_template, str(output_dir), address,
                config.job_limit, config.timer_delay, config.fault_tolerance,
                config.max_server_restarts, config.std_output, config.connect_timeout,
                config.stop_grace), leftovers=leftovers, first_uid=first_uid,
                first_generation=generation, unsure=unsure,
                cancel_named=_name_canceller(executor), cleanup=cleanup)
            try:
                return loop.run()
            finally:
                # A submit command still running (stop_grace passed, or a second signal) is
                # killed, and those not started yet never start: no job is queued once the
                # supervisor is gone. Each was journaled first, with its job name, so the
                # next supervisor (or --cleanup) looks for it and cancels it.
                stop_submitting = getattr(executor, "stop_submitting", None)
                if stop_submitting is not None:
                    try:
                        stop_submitting()
                    except Exception as error:
                        logger.warning("supervisor: stopping the submissions in flight "
                                       "failed: %s", error)
        finally:
            journal.close()
    finally:
        for each in loggers:
            each.removeHandler(handler)
        handler.close()
        if made:
            try:
                os.rmdir(made)
            except OSError:
                pass


class _Placeholder:
    """The loop's machine until the address is known (it never gets an event)."""

    def step(self, event: Any, now: float) -> Any:
        return []
