"""What the ``psij`` command does when the reader of its output goes away (``psij ... | head``).

Only the standard output is considered: a broken pipe elsewhere (a socket to a served pilot) is
an error of its own and is not hidden. Nothing here writes output, and it imports no other
module of :mod:`psij.cli`.
"""

import os
import select
import sys


def stdout_reader_gone() -> bool:
    """True if standard output is a pipe or socket whose reading end has been closed."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def silence_stdout() -> None:
    """Send later writes to standard output (the interpreter's last flush included) nowhere,
    so that they do not fail a second time."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
