"""The local executor: runs jobs as processes of this machine.

How a job runs:

- With the ``single`` launcher and no pre/post-launch script the job's process is spawned
  directly (its redirections, directory and environment given to the spawn call); otherwise the
  launcher's bash script is run and the script does the redirections.
- Every job gets its own process group; cancel sends TERM to the group and KILL after
  ``cancel_grace_period`` seconds (at once when it is 0). The job is CANCELED when ``cancel``
  returns, as in psij-python (a job with stage-out or cleanup to do on cancel only once they
  are done, after its processes ended). The KILL is sent by the job's keeper, which outlives
  this process: a job that ignores TERM is killed even if this process exits right after the
  cancel.
- Jobs are started by this process's keepers (``_keeper``: the first started with the
  first job, another when those running are busy, up to one per 2 cores;
  ``PSIJ_LOCAL_KEEPERS=N`` runs N and spreads the jobs over them), each the parent of the
  jobs it started: it reaps them, reports each exit to this process, and goes on after this
  process ends (even by ``kill -9``), so that a job ending later still has its exit code and
  final state recorded in the job registry. A keeper that dies (``kill -9``) ends its
  running jobs FAILED, naming it and how it ended, after killing their process groups (no
  one would see them end), and the jobs it was sent but had not answered FAILED too (it may
  have started some: those run on unwatched); the jobs of a ``submit_many`` not sent to it
  yet, and the next ones, go to the other keepers or a new one. Without a
  keeper (it could not be started, or ``keeper=False``) jobs are spawned here as this
  process's children.
- With a keeper, ``submit`` does not wait for the job's process: it checks the job, writes
  its start on the keeper's socket with the job's registry row (``_handover``; a
  ``submit_many`` writes the starts of its jobs in one message per keeper) and returns, the
  job still QUEUED (psij-python has it ACTIVE on return). The keeper reads its socket ahead
  of its starts and even after this process died, so a job ``submit`` returned for runs,
  once, and is recorded, even after a ``kill -9`` the next instant; the job is ACTIVE once
  its keeper answered with its pid (or FAILED, with the words a synchronous start would have
  given, if it could not start). ``job.native_id`` waits for that answer, so the pid is
  there whenever it is read after ``submit``; cancel before it marks the job, which is
  killed as soon as it started. A job no keeper takes has its registry row committed before
  ``submit`` returns.
- One thread per Python process (``ProcessWatch``) learns of every exit without polling, and one
  worker thread per Python process does what follows an exit (launcher output, staging, final
  status and callbacks), so a slow callback never delays reaping. The ACTIVE statuses of
  jobs started by a keeper are set on threads of their own (one, and spares while it is
  busy), and a job that ends before its ACTIVE was set has its end handled after it: a slow
  callback on one job's ACTIVE delays neither the other jobs' ACTIVE nor their ends.
- Every job started has a record (pid, kernel start time, job id, exit code once it ended)
  in the job registry of the work directory, so ``list()`` and ``attach()`` work from any
  executor instance or process: one store per user, however many processes and executors,
  written in batches (never a commit per job) by the keeper or the registry's writer thread.
  When the registry is off or cannot be written, the records go to a journal file of the
  process in ``<work_directory>/local/`` (see ``_journal``).
- A job ends with its run's resource use in its final status's metadata and registry row
  (``started_at``, ``ended_at``, ``cpu_seconds``, ``max_rss_bytes``): the figures the system
  gives for its process group's leader as its keeper (or, without one, the process watch:
  ``reap_use``) reaps it, which include the descendants that were waited for, not those left
  running or daemonized (the user guide's "Resource use" says more).
- Staging (``stage_in``/``stage_out``/``cleanup``) is done by the executor with local file
  operations; the STAGE_IN, STAGE_OUT and CLEANUP states are entered only when there is staging.
  A job is held by psij in the submitting process (in the registry) until its stage-in is
  done and a keeper has its start, so ``psij release`` runs it if that process is killed first
  (see ``_stage_in``).

Everything a job gets is checked before anything runs: a missing directory, an unreadable
stdin, an unwritable output directory or a string no process can receive (a lone surrogate)
raises SubmitException naming the field and leaves the job NEW and unbound. An executable that
is missing or cannot be executed is not an error of ``submit``: the job ends FAILED with exit
code 127 or 126 and a message naming it, as it would on a batch system.

Layout: :class:`LocalJobExecutor` and :class:`LocalJobExecutorConfig` are defined in
``_executor`` and importable from here, as they were from the single module this package once
was. Its other modules:

- ``_checks``, ``_env``, ``_prepared``, ``_start`` and ``_handover``: what is checked and
  computed for a job at submit time (its texts and program, its environment, its spawn
  inputs) and how its start and registry row are handed to a keeper before ``submit`` returns;
- ``_keeper_client`` (this process's side), ``_keeper`` (the keeper process itself, run from
  its file with the standard library only), ``_keeper_rows`` (what it writes to the job
  registry) and ``_keeper_kills`` (its signals and KILL timers): the process that starts the
  jobs, is their parent and records how each ended;
- ``_journal``: the records of the runs (job registry or journal files) that ``list()`` and
  ``attach()`` read;
- ``_worker``: the threads that run what follows a job's start and exit;
- ``_time_limit`` and ``_transfer``: the opt-in time limit and the local staging;
- ``_reruns``: a job's next run (``psij.requeue``, ``psij.retry``), a new process of the same
  job, and a cancel between two runs;
- ``_pool_machine`` (the resource pool as a pure machine: events in, actions out),
  ``_pool_driver`` (which feeds it an executor's jobs and carries out its actions) and
  ``_pool_gpus`` (the GPUs a pool hands out): the ``resource_pool`` setting.

The process layer, the exit watch, the staging reports, GPU detection and the checks of texts
a process can receive are shared with the pilot and batch executors and stay in
``psij.executors``; they import nothing of this package when they run (the exit watch names
the keeper's client for type checks only). This module only re-exports: it defines nothing.
"""

from typing import TYPE_CHECKING

from psij._reexports import lazy_names
from psij.executors.local._executor import LocalJobExecutor as LocalJobExecutor
from psij.executors.local._executor import LocalJobExecutorConfig as LocalJobExecutorConfig

# The executor's worker thread, which tests wait on, importable from here as before.
from psij.executors.local._worker import WORKER as _WORKER  # noqa: F401

__all__ = ["LocalJobExecutor", "LocalJobExecutorConfig"]


# Names that psij-python's module of the same path also offers (imported there).
if not TYPE_CHECKING:
    __getattr__ = lazy_names(__name__, {
        "InvalidJobException": "psij.exceptions",
        "SubmitException": "psij.exceptions",
        "Job": "psij.job",
        "JobExecutor": "psij.job_executor",
        "JobExecutorConfig": "psij.job_executor_config",
        "JobSpec": "psij.job_spec",
        "JobState": "psij.job_state",
        "JobStatus": "psij.job_status",
        "Launcher": "psij.job_launcher",
        "ResourceSpecV1": "psij.resource_spec",
        "SingletonThread": "psij.utils",
    })
