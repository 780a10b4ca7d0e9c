"""The flow service (``psij flow serve``): the flow machine on a controller loop, listening on
a Unix socket, its state journaled in SQLite.

What the service adds to the pure :class:`~psij.flows.machine.FlowMachine`:

- **The files.** The machine's own actions (journal records, sandboxes, payloads, output,
  signals) are carried out here, on the loop's thread, as the machine emits them; what they
  learn goes back to the machine at once, before any other event. Every journal record of one
  event is written in one SQLite transaction (WAL, ``synchronous=FULL``) before any action of
  that event reaches the loop: a submission starts only once its record is on disk, and an
  answer is sent only once what it reports is.
- **The restart.** At start the journal is given back to the machine
  (:meth:`~psij.flows.machine.FlowMachine.restore`), which attaches every instance that was
  running and submits nothing again.
- **The users.** Run by a user, the service serves that user alone, on a socket only they can
  open (0600, in a 0700 folder). Run by root, it serves every local user on a socket all can
  open (0666, in a 0755 folder): each connection is identified by the kernel (``SO_PEERCRED``),
  each user sees only their own handles, and each user's instances run as that user: the
  instance is started through ``setpriv --reuid=UID --regid=GID --init-groups``, which also
  opens the output files (as the user, so that no link a user plants makes root write
  anywhere). The same wrapping applies on a batch executor, whose job then runs as root until
  ``setpriv`` changes to the user: the scheduler accounts the job to root.
- **Signals.** PSI/J has no verb to signal a job: the service sends it to the process group on
  ``local``, through the executor's ``signal`` on a batch executor (``scancel --batch`` on
  Slurm, ``qdel`` after ``-notify`` on Grid Engine, ...); elsewhere the machine falls back to
  cancelling.
"""

import collections
import copy
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, Deque, Dict, Hashable, List, Optional, Union

from psij._clock import MonotonicClock, wall_time
from psij._private_dirs import ensure_private_dir
from psij.controller import ActionDone, ActionFailed, ActionKind, Call, ControllerLoop, Send, Submit
from psij.flows import _flow_values as fv
from psij.flows._areas import AreaError, Areas
from psij.flows._journal import Journal, JournalError
from psij.flows.machine import FlowConfig, FlowMachine

__all__ = ["FlowService", "WallClock", "add_serve_options", "default_state_dir", "serve_main"]

logger = logging.getLogger("psij.flows")

ROOT_STATE_DIR = "/var/lib/psij-flow"
_SIGNAL_KEY = "flow-signal"


class WallClock(MonotonicClock):
    """Unix epoch seconds: the flow machine keeps leases and records across restarts (waits
    are measured as on the monotonic clock)."""

    def now(self) -> float:
        return wall_time()


def default_state_dir() -> Path:
    """``/var/lib/psij-flow`` for root, ``~/.psij/flow`` for anyone else."""
    if os.geteuid() == 0:
        return Path(ROOT_STATE_DIR)
    return Path.home() / ".psij" / "flow"


class _ServiceMachine:
    """The flow machine with its own actions carried out (see the module notes)."""

    def __init__(self, machine: FlowMachine, journal: Journal, areas: Areas) -> None:
        self.machine = machine
        self.journal = journal
        self.areas = areas
        self.loop: Optional[ControllerLoop] = None
        self._euid = os.geteuid()
        self._handlers: Dict[type, Callable[[Any, List[Any]], Any]] = {
            fv.MakeSandbox: self._make_sandbox, fv.MeasureSandbox: self._measure,
            fv.DeleteFiles: self._delete_files, fv.StorePayload: self._store_payload,
            fv.VerifyPayload: self._verify_payload, fv.DeletePayload: self._delete_payload,
            fv.ReadOutput: self._read_output, fv.SignalJob: self._signal,
        }
        self._ops: List[Union[fv.JournalPut, fv.JournalDelete]] = []

    def step(self, event: Any, now: float) -> List[Any]:
        queue: Deque[Any] = collections.deque([self._incoming(event)])
        out: List[Any] = []
        try:
            while queue:
                for action in self.machine.step(queue.popleft(), now):
                    follow = self._carry_out(action, out)
                    if follow is not None:
                        queue.append(follow)
        finally:
            if self._ops:
                ops, self._ops = self._ops, []
                try:
                    self.journal.apply(ops)
                except (JournalError, TypeError, ValueError):
                    logger.exception("flow service: the journal could not be written; a "
                                     "restart now would lose these changes")
        return out

    def _carry_out(self, action: Any, out: List[Any]) -> Any:
        """Journal ``action``, run it, or pass it on in ``out``; the event it gives back."""
        kind = type(action)
        if kind is fv.JournalPut or kind is fv.JournalDelete:
            self._ops.append(action)
        elif kind is Submit:
            out.append(self._submit(action))
        else:
            handler = self._handlers.get(kind)
            if handler is None:
                out.append(action)
                return None
            try:
                return handler(action, out)
            except Exception:
                logger.exception("flow service: %r failed", action)
        return None

    @staticmethod
    def _incoming(event: Any) -> Any:
        """The loop's answer to a signal :class:`Call`, as the machine asked it."""
        if type(event) in (ActionDone, ActionFailed) and isinstance(event.key, tuple) \
                and len(event.key) == 2 and event.key[0] == _SIGNAL_KEY:
            if type(event) is ActionDone:
                return ActionDone(event.key[1], ActionKind.SIGNAL, None)
            return ActionFailed(event.key[1], ActionKind.SIGNAL, event.message, event.error)
        return event

    # -- submissions ------------------------------------------------------------------------

    def _submit(self, action: Submit) -> Submit:
        name, _, uid_text = action.executor.partition("@")
        if not uid_text:
            return action
        uid = int(uid_text)
        if uid == self._euid:
            return Submit(action.key, action.spec, name)
        return Submit(action.key, as_user(action.spec, uid), action.executor)

    # -- the machine's own actions ----------------------------------------------------------

    def _owner(self, path: str) -> int:
        rel = os.path.relpath(os.path.abspath(path), self.areas.top)
        first = Path(rel).parts[0] if rel else ""
        if not first.isdigit():
            raise AreaError(f"{path}: not in a user's flow area under {self.areas.top}")
        return int(first)

    def _make_sandbox(self, action: fv.MakeSandbox, out: List[Any]) -> None:
        self.areas.make_dir(action.uid, action.path)

    def _measure(self, action: fv.MeasureSandbox, out: List[Any]) -> Any:
        size = 0
        for path in action.paths:
            try:
                size += self.areas.size(self._owner(path), [path])
            except (AreaError, OSError) as ex:
                logger.warning("flow service: measuring %s: %s", path, ex)
        return fv.SandboxMeasured(action.handle, action.instance, size)

    def _delete_files(self, action: fv.DeleteFiles, out: List[Any]) -> None:
        for path in action.paths:
            self.areas.delete(self._owner(path), [path], [])
        for path in action.dirs:
            self.areas.delete(self._owner(path), [], [path])

    def _store_payload(self, action: fv.StorePayload, out: List[Any]) -> Any:
        try:
            self.areas.upload(action.uid, action.data, action.sha256)
        except Exception as ex:  # the client is answered whatever went wrong
            message = f"payload {action.sha256}: cannot be stored: {ex}"
            out.append(Send(action.conn, {"id": action.request_id, "ok": False, "error": {
                "code": "store_failed", "message": message}}))
            return fv.PayloadStored(action.uid, action.sha256, False, message)
        out.append(Send(action.conn, {"id": action.request_id, "ok": True,
                                      "sha256": action.sha256}))
        return fv.PayloadStored(action.uid, action.sha256, True, "")

    def _verify_payload(self, action: fv.VerifyPayload, out: List[Any]) -> Any:
        try:
            path = self.areas.payload(action.uid, action.sha256)
        except Exception as ex:  # the machine must hear back whatever went wrong
            return fv.PayloadVerified(action.key, False, None, str(ex))
        return fv.PayloadVerified(action.key, True, path, "")

    def _delete_payload(self, action: fv.DeletePayload, out: List[Any]) -> None:
        self.areas.delete_payload(action.uid, action.sha256)

    def _read_output(self, action: fv.ReadOutput, out: List[Any]) -> None:
        try:
            data, size = self.areas.read(action.uid, action.path, int(action.max_bytes))
        except Exception as ex:  # the client is answered whatever went wrong
            out.append(Send(action.conn, {"id": action.request_id, "ok": False, "error": {
                "code": "output_unavailable", "message": f"output: {ex}"}}))
            return
        out.append(Send(action.conn, {
            "id": action.request_id, "ok": True, "data": data.decode("utf-8", "replace"),
            "size": size, "truncated": len(data) < size}))

    def _signal(self, action: fv.SignalJob, out: List[Any]) -> None:
        loop = self.loop
        job = loop.job(action.key) if loop is not None else None
        key: Hashable = (_SIGNAL_KEY, action.key)
        out.append(Call(key, lambda: signal_job(job, int(action.signum))))


def signal_job(job: Any, signum: int) -> None:
    """Send ``signum`` to ``job`` where its executor allows it (local: the process group;
    batch executors: their ``signal``, which the job's script passes on); raise otherwise."""
    if job is None or job.native_id is None:
        raise ValueError("no such job, or not submitted yet")
    from psij.executors.local import LocalJobExecutor

    executor = job.executor
    if isinstance(executor, LocalJobExecutor):
        os.killpg(int(job.native_id), signum)
        return
    send = getattr(executor, "signal", None)
    if callable(send):
        send(job, signum)
        return
    name = getattr(executor, "name", "") or type(executor).__name__
    raise NotImplementedError(f"the {name} executor cannot send a signal to a job; it is "
                              "cancelled instead")


_AS_USER = 'o=$1; e=$2; shift 2; exec "$@" >>"$o" 2>>"$e"'


def as_user(spec: Any, uid: int) -> Any:
    """A copy of ``spec`` that runs as ``uid`` through ``setpriv``, with only the spec's
    environment (and the user's ``HOME``, ``USER``, ``LOGNAME``, a plain ``PATH``); its output
    files are opened by a shell that already runs as ``uid``."""
    import pwd

    entry = pwd.getpwuid(uid)
    new = copy.copy(spec)
    out = spec.stdout_path or "/dev/null"
    err = spec.stderr_path or "/dev/null"
    new.stdout_path = None
    new.stderr_path = None
    env = {str(k): str(v) for k, v in (spec.environment or {}).items()}
    env.setdefault("HOME", entry.pw_dir)
    env.setdefault("USER", entry.pw_name)
    env.setdefault("LOGNAME", entry.pw_name)
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    new.environment = None
    new.executable = "setpriv"
    new.arguments = [f"--reuid={uid}", f"--regid={entry.pw_gid}", "--init-groups", "--",
                     "/usr/bin/env", "-i", *(f"{k}={v}" for k, v in sorted(env.items())),
                     "/bin/sh", "-c", _AS_USER, "flow", str(out), str(err),
                     str(spec.executable), *(spec.arguments or [])]
    return new


class FlowService:
    """A flow service: its journal, its files, its machine and its loop.

    :param state_dir: where the journal and the user areas live (0700; made when missing).
    :param socket_path: where to listen (None: ``<state_dir>/flow.sock`` for a user,
        :data:`~psij.flows.client.ROOT_SOCKET` for root).
    :param multi_user: serve every user (None: when running as root).
    :param poll_interval: seconds between two status commands of a batch executor.
    :param sync: ``"full"`` (every journal transaction on disk before the service goes on)
        or ``"normal"`` (safe against the service's crash, not the machine's).
    :param options: more :class:`~psij.flows.machine.FlowConfig` fields (limits, leases).
    """

    def __init__(self, state_dir: Optional[Path] = None, socket_path: Optional[str] = None,
                 multi_user: Optional[bool] = None, workers: int = 8,
                 poll_interval: float = 5.0, sync: str = "full", **options: Any) -> None:
        from psij.flows.client import ROOT_SOCKET

        self.multi_user = os.geteuid() == 0 if multi_user is None else bool(multi_user)
        if isinstance(poll_interval, bool) or not isinstance(poll_interval, (int, float)) \
                or not 0.1 <= poll_interval <= 3600:
            raise ValueError(f"poll_interval: expected seconds from 0.1 to 3600, got "
                             f"{poll_interval!r}")
        self.poll_interval = float(poll_interval)
        self.state_dir = ensure_private_dir(state_dir or default_state_dir(),
                                            "flow state directory")
        if self.multi_user:
            # Users' instances reach their own area through it (and list nothing).
            os.chmod(self.state_dir, 0o711)
        self.journal = Journal(self.state_dir, sync)
        self.areas = Areas(self.state_dir / "areas", self.multi_user)
        if options.get("executors") is None:
            # Every executor but this service's own client: a flow of flows would feed itself.
            from psij.job_executor import JobExecutor

            options["executors"] = tuple(sorted(JobExecutor.get_executor_names() - {"flow"}))
        elif "flow" in options["executors"]:
            raise ValueError("executors: 'flow' cannot run a flow's instances (its handles "
                             "would feed this service itself)")
        self.config = FlowConfig(sandbox_root=str(self.areas.top), multi_user=self.multi_user,
                                 **options)
        self.machine = FlowMachine(self.config)
        self._service = _ServiceMachine(self.machine, self.journal, self.areas)
        self._executors: Dict[str, Any] = {}
        clock = WallClock()
        self.loop = ControllerLoop(self._service, clock=clock, workers=workers,
                                   executor_factory=self._executor_for,
                                   max_line_bytes=max(1 << 20,
                                                      self.config.max_payload_bytes * 2))
        self._service.loop = self.loop
        self.machine.restore(self.journal.records(), clock.now())
        if socket_path is None:
            socket_path = ROOT_SOCKET if self.multi_user else str(self.state_dir / "flow.sock")
        self.socket_path = socket_path
        parent = Path(socket_path).parent
        if self.multi_user:
            parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            info = os.lstat(parent)
            if info.st_uid != os.geteuid() or info.st_mode & 0o022:
                raise PermissionError(f"{parent}: the socket's folder must be root's and not "
                                      f"writable by others")
            self.loop.listen_unix(socket_path, mode=0o666)
        else:
            ensure_private_dir(parent, "flow socket folder")
            self.loop.listen_unix(socket_path, mode=0o600)

    def _executor_for(self, name: str) -> Any:
        """One executor per name (``name@uid`` shares ``name``'s: the uid is in the spec);
        batch executors poll their queue every ``poll_interval`` seconds."""
        base = name.partition("@")[0]
        executor = self._executors.get(base)
        if executor is None:
            from psij._plugins import REGISTRY
            from psij.executors.batch._batch_config import BatchSchedulerExecutorConfig
            from psij.job_executor import JobExecutor

            cls = REGISTRY.select("executor", base, None, base=JobExecutor).cls
            config_class = getattr(cls, "CONFIG_CLASS", None)
            config = None
            if isinstance(config_class, type) and \
                    issubclass(config_class, BatchSchedulerExecutorConfig):
                config = config_class(queue_polling_interval=self.poll_interval,
                                      initial_queue_polling_delay=min(1.0, self.poll_interval))
            executor = JobExecutor.get_instance(base, config=config)
            self._executors[base] = executor
        return executor

    def run(self) -> int:
        try:
            return self.loop.run()
        finally:
            self.journal.close()


def add_serve_options(parser: Any) -> None:
    """``psij flow serve``'s options."""
    parser.add_argument("--socket", metavar="PATH",
                        help="where to listen (default: ~/.psij/flow/flow.sock; for root "
                             "/run/psij-flow/flow.sock)")
    parser.add_argument("--state-dir", metavar="DIR",
                        help="journal and files (default: ~/.psij/flow; for root "
                             f"{ROOT_STATE_DIR})")
    parser.add_argument("--single-user", action="store_true",
                        help="as root, serve root alone on a 0600 socket")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=JSON",
                        help="a limit or default of the service (repeatable), e.g. "
                             "max_per_handle=100 or max_lease=3600")
    parser.add_argument("--poll-interval", type=float, default=5.0, metavar="S",
                        help="seconds between two queue status commands of a batch executor "
                             "(default: 5)")
    parser.add_argument("--sync", choices=("full", "normal"), default="full",
                        help="journal durability: full (default) survives a crash of the "
                             "machine, normal only of the service (one fsync per checkpoint "
                             "instead of per transaction)")
    parser.add_argument("--log-level", default="INFO", metavar="LEVEL")


def _check_options(options: Dict[str, Any]) -> None:
    fields = set(FlowConfig._fields) - {"sandbox_root", "multi_user"}
    for key in options:
        if key not in fields:
            raise ValueError(f"--set {key}: not a setting of the service; accepted: "
                             f"{', '.join(sorted(fields))}")


def serve_main(args: Any) -> int:
    """Run ``psij flow serve``."""
    import sys

    logging.basicConfig(level=str(args.log_level).upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    options: Dict[str, Any] = {}
    for text in args.set:
        key, sep, value = text.partition("=")
        try:
            if not sep:
                raise ValueError("expected FIELD=JSON")
            options[key] = json.loads(value)
        except ValueError as ex:
            print(f"psij flow serve: --set {text!r}: {ex}", file=sys.stderr)
            return 2
    try:
        _check_options(options)
        service = FlowService(Path(args.state_dir) if args.state_dir else None, args.socket,
                              False if args.single_user else None,
                              poll_interval=args.poll_interval, sync=args.sync, **options)
    except (OSError, ValueError, TypeError, JournalError) as ex:
        print(f"psij flow serve: {ex}", file=sys.stderr)
        return 1
    print(f"psij flow serve: listening on {service.socket_path}", file=sys.stderr, flush=True)
    return service.run()
