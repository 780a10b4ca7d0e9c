"""What a Slurm job submitted through ``slurmrestd`` is given, worked out as ``sbatch`` would.

``sbatch`` reads the ``#SBATCH`` directives of its script (the lines before the first command),
takes the submitter's environment and adds a few variables of its own. A job given to
``slurmrestd`` (``POST /slurm/v0.0.38/job/submit``) gets neither for free: its directives and
its environment are in the request. This module builds that request from the script that
``sbatch`` would have been given, so that the job is the same either way
(:mod:`psij.executors.batch._slurm_rest_child` sends it):

- each directive is mapped by its long option name (``_VALUED``, ``_BARE``); its value is
  passed as written, which slurmrestd parses with sbatch's own option parsers (``--mem=1500K``
  becomes 2 MB there too, ``--time`` rounds up to minutes);
- the environment is the submitter's whole environment (``--export=ALL``) plus what sbatch
  adds: ``SLURM_PRIO_PROCESS`` (the nice value), ``SLURM_SUBMIT_DIR``, ``SLURM_SUBMIT_HOST``,
  ``SLURM_UMASK`` (unless set), ``SLURM_CONF``, ``SLURM_JOB_NAME`` and, for the limits the
  site propagates (``PropagateResourceLimits``), ``SLURM_RLIMIT_<name>``.

Nothing is guessed: ``None`` (the job then goes to sbatch) for a directive not in the tables,
a short option, a value with quotes, backslashes or spaces inside, ``--export`` other than
``ALL``, an environment with variables that change what sbatch does (``SBATCH_*`` and
``_SBATCH_INPUTS``), an environment too large for sbatch to be started with (sbatch would
fail, so the job must not get through here), text that is not valid UTF-8, or a site with
``CliFilterPlugins`` (sbatch runs those filters; slurmrestd does not). Nothing here runs
commands.
"""

import json
import os
import re
import resource
import socket
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from psij._line_framing import BadLine, decode_line
from psij.executors._process import fits_exec
from psij.executors.batch._runner import CommandResult

__all__ = ["API", "SiteSettings", "job_environment", "job_fields", "parse_response",
           "request_bytes", "site_settings", "submitted"]

API = "/slurm/v0.0.38/job/submit"

# sbatch long option -> field of the job description, value passed as written.
_VALUED = {
    "job-name": "name", "nodes": "nodes", "ntasks": "tasks", "ntasks-per-node": "tasks_per_node",
    "cpus-per-task": "cpus_per_task", "mem": "memory_per_node", "mem-per-cpu": "memory_per_cpu",
    "time": "time_limit", "time-min": "time_minimum", "partition": "partition",
    "account": "account", "nice": "nice", "output": "standard_output",
    "error": "standard_error", "array": "array", "begin": "begin_time", "qos": "qos",
    "comment": "comment", "dependency": "dependency", "chdir": "current_working_directory",
}
# sbatch options without a value -> (field, value).
_BARE: Dict[str, Tuple[str, Union[str, bool]]] = {
    "exclusive": ("exclusive", "exclusive"), "hold": ("hold", True),
}
# Variables sbatch reads as options besides SBATCH_*.
_SBATCH_INPUTS = frozenset(("SLURM_HINT", "SLURM_DEBUG_FLAGS", "SLURM_EXPORT_ENV",
                            "SLURM_CLUSTERS", "SLURM_EXIT_ERROR", "SLURM_EXIT_IMMEDIATE"))
# The limits sbatch may propagate, as slurm.conf names them.
_RLIMITS = ("CPU", "FSIZE", "DATA", "STACK", "CORE", "RSS", "NPROC", "NOFILE", "MEMLOCK", "AS")

_DIRECTIVE = re.compile(r'#SBATCH --([a-z][a-z0-9-]*)(?:=(?:"([^"\\\t\n]+)"|([^"\'\\\s]+)))?[ \t]*')


def job_fields(script: str) -> Optional[Dict[str, Any]]:
    """The job description fields of ``script``'s directives, or None when one of them
    cannot be given to slurmrestd exactly as sbatch would take it."""
    fields: Dict[str, Any] = {}
    export = None
    lines = script.split("\n")
    for line in lines[1:] if lines and lines[0].startswith("#!") else lines:
        if line.startswith("#SBATCH"):
            match = _DIRECTIVE.fullmatch(line)
            if match is None:
                return None
            option, quoted, plain = match.groups()
            value = quoted if quoted is not None else plain
            if option == "export":
                export = value
            elif option in _VALUED and value is not None:
                fields[_VALUED[option]] = value
            elif option in _BARE and value is None:
                name, given = _BARE[option]
                fields[name] = given
            else:
                return None
        elif line.strip() and not line.lstrip().startswith("#"):
            break  # sbatch reads no directive after the first command
    if export not in (None, "ALL"):
        return None
    return fields


class SiteSettings:
    """What ``scontrol show config`` says that changes a submission."""

    __slots__ = ("cli_filters", "conf_path", "propagated")

    def __init__(self, cli_filters: bool, conf_path: str, propagated: Tuple[str, ...]) -> None:
        self.cli_filters = cli_filters
        self.conf_path = conf_path
        self.propagated = propagated


def site_settings(out: str) -> SiteSettings:
    """Read ``scontrol show config``'s output (``Key = value`` lines)."""
    values: Dict[str, str] = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values.setdefault(key.strip(), value.strip())
    filters = values.get("CliFilterPlugins", "(null)")
    if "PropagateResourceLimits" not in values and "SLURM_CONF" not in values:
        raise ValueError("scontrol show config: no PropagateResourceLimits or SLURM_CONF line")
    return SiteSettings(cli_filters=filters not in ("", "(null)"),
                        conf_path=values.get("SLURM_CONF", ""),
                        propagated=_propagated(values.get("PropagateResourceLimits", "ALL"),
                                               values.get("PropagateResourceLimitsExcept", "")))


def _names(text: str) -> List[str]:
    names = [part.strip().upper() for part in text.split(",") if part.strip()]
    return [name[7:] if name.startswith("RLIMIT_") else name for name in names]


def _propagated(limits: str, exceptions: str) -> Tuple[str, ...]:
    except_names = set(_names(exceptions)) if exceptions not in ("", "(null)") else set()
    if except_names:
        return tuple(name for name in _RLIMITS if name not in except_names)
    names = _names(limits) if limits not in ("", "(null)") else ["ALL"]
    if "NONE" in names:
        return ()
    if "ALL" in names:
        return _RLIMITS
    return tuple(name for name in _RLIMITS if name in names)


def job_environment(env: Mapping[str, str], fields: Mapping[str, Any], site: SiteSettings,
                    umask: str) -> Optional[Dict[str, str]]:
    """The environment sbatch would give the job, from the submitter's ``env``; None when
    ``env`` has variables that would change the submission itself."""
    for key in env:
        if key.startswith("SBATCH_") or key in _SBATCH_INPUTS:
            return None
    if not fits_exec(env):
        return None
    out = dict(env)
    out.setdefault("SLURM_UMASK", umask)
    out["SLURM_PRIO_PROCESS"] = str(os.getpriority(os.PRIO_PROCESS, 0))
    out["SLURM_SUBMIT_DIR"] = os.getcwd()
    out["SLURM_SUBMIT_HOST"] = socket.gethostname().split(".")[0]
    if site.conf_path and "SLURM_CONF" not in out:
        out["SLURM_CONF"] = site.conf_path
    if "name" in fields:
        out["SLURM_JOB_NAME"] = fields["name"]
    for name in site.propagated:
        soft = resource.getrlimit(getattr(resource, "RLIMIT_" + name))[0]
        out["SLURM_RLIMIT_" + name] = str(soft & 0xFFFFFFFFFFFFFFFF)  # unlimited: all ones
    return out


def request_bytes(script: str, fields: Mapping[str, Any], environment: Mapping[str, str],
                  cwd: str) -> Optional[bytes]:
    """The HTTP request submitting ``script`` (None when some text is not valid UTF-8); the
    job runs in ``cwd`` unless its ``--chdir`` says otherwise, as with sbatch."""
    job = {"current_working_directory": cwd, **fields, "environment": environment}
    try:
        body = json.dumps({"script": script, "job": job}, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: bytes that are not text
        return None
    head = (f"POST {API} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Accept: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode("ascii") + body


def parse_response(status: int, body: bytes) -> Tuple[Optional[int], str]:
    """The job id slurmrestd gave (None if it refused the job) and its errors as text."""
    try:
        # Text that is not UTF-8 only in an error's words must not lose the job id.
        data = decode_line(body.decode("utf-8", "replace").encode())
    except BadLine as bad:
        return None, f"HTTP {status}, not JSON that can be read ({bad}): {body[:200]!r}"
    errors = data.get("errors") if isinstance(data, dict) else None
    said = "; ".join(str(e.get("error") or e.get("description") or e)
                     for e in errors if isinstance(e, dict)) if isinstance(errors, list) else ""
    job_id = data.get("job_id") if isinstance(data, dict) else None
    if status != 200 or isinstance(job_id, bool) or not isinstance(job_id, int) or job_id <= 0:
        return None, f"HTTP {status}: {said or 'no job id'}"
    return job_id, said


def submitted(job_id: int) -> CommandResult:
    """What ``sbatch --parsable`` would have printed for ``job_id``."""
    return CommandResult(("slurmrestd", "POST", API), 0, f"{job_id}\n")
