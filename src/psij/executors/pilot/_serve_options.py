"""The command-line options of ``psij pilot serve``.

Kept apart from the server (:mod:`.service`) so that building the command line loads nothing of
the pilot. Parsing only: the values are checked again where they are used.
"""

from typing import Any, Callable

from psij._line_framing import DEFAULT_MAX_LINE_BYTES

__all__ = ["GPUS_HELP", "add_serve_options", "gpus_option"]

GPUS_HELP = ("GPUs of this node: a count (the first ones found, else ids 0 to N-1) or a list "
             "of ids such as 0,2,3 (default: those found: visible-devices variables, Slurm's, "
             "nvidia-smi, rocm-smi, /proc/driver/nvidia/gpus)")


def add_serve_options(serve: Any, count: Callable[[str], int]) -> None:
    """Add the options of ``pilot serve`` to its argparse ``serve`` parser; ``count`` reads a
    number of cores."""
    serve.add_argument("--socket", required=True, metavar="PATH", help="Unix socket path")
    serve.add_argument("--cores", type=count, metavar="N",
                       help="local cores to use when not inside a batch allocation")
    serve.add_argument("--gpus", type=gpus_option, metavar="N|IDS", help=GPUS_HELP)
    serve.add_argument("--nodes", metavar="SPEC",
                       help="explicit nodes, NAME:CORES separated by commas (Slurm host "
                            "lists allowed, e.g. n[1-4]:8); nodes other than this host are "
                            "reached through agents")
    serve.add_argument("--wd", metavar="DIR",
                       help="working directory: base of relative task directories and home "
                            "of the journal psij-pilot.journal (default: the current one)")
    serve.add_argument("--resume", action="store_true",
                       help="read the journal of an earlier run first: tasks that succeeded "
                            "are not run again, the others are")
    serve.add_argument("--allocation-policy", metavar="FILE",
                       help="make the pilot elastic: a JSON object of the allocation policy's "
                            "fields (executor, nodes, cores_per_node, duration, queue, "
                            "max_allocations, idle_timeout, ...; see the pilot "
                            "documentation): allocations are asked for as tasks wait and "
                            "given back when idle")
    serve.add_argument("--agent-host", metavar="HOST",
                       help="the address (host name or IP) on which the pilot listens for "
                            "its agents, one that the allocations' nodes can reach (default: "
                            "this host's name when agents run elsewhere)")
    serve.add_argument("--max-request-bytes", type=_byte_count, metavar="N",
                       default=DEFAULT_MAX_LINE_BYTES,
                       help="longest request line accepted, in bytes; a longer one gets an "
                            "error and its connection is closed (default: %(default)s, "
                            "64 MiB)")


def gpus_option(text: str) -> str:
    """``text`` when it is a ``--gpus`` value (a count, or a list of ids), checked."""
    from psij.executors._gpu_detect import GpuSet, gpus_from_setting

    try:
        gpus_from_setting("--gpus", text, GpuSet(()))
    except (TypeError, ValueError) as ex:
        import argparse

        raise argparse.ArgumentTypeError(str(ex).replace("--gpus: ", "", 1)) from None
    return text


def _byte_count(text: str) -> int:
    if text.isascii() and text.isdigit() and int(text) >= 1:
        return int(text)
    import argparse

    raise argparse.ArgumentTypeError(f"expected a whole number of bytes of at least 1, got "
                                     f"{text!r}")
