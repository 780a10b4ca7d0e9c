"""The one signal-stop helper used by ``psij run``, ``psij pilot run`` and ``psij pilot serve``."""

import os
import signal
import threading
from typing import List

import pytest

from psij._stop_signals import StopSignals


class Stop(Exception):
    pass


def raise_stop(signum: int) -> None:
    raise Stop(signum)


def test_a_signal_calls_on_stop_in_the_main_thread_and_handlers_are_restored() -> None:
    before = signal.getsignal(signal.SIGTERM)
    seen: List[int] = []
    with StopSignals(seen.append) as stop:
        assert signal.getsignal(signal.SIGTERM) is not before
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGHUP)
        assert stop.stopping
    assert seen == [signal.SIGTERM, signal.SIGHUP]
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_held_signal_is_delivered_when_the_hold_ends() -> None:
    with StopSignals(raise_stop, hold=True) as stop:
        os.kill(os.getpid(), signal.SIGINT)  # during "submission": kept, nothing raised
        assert not stop.stopping
        with pytest.raises(Stop) as caught:
            stop.release()
        assert caught.value.args == (signal.SIGINT,)
        with pytest.raises(Stop):
            os.kill(os.getpid(), signal.SIGTERM)  # not held any more: raised at once
        with pytest.raises(Stop):  # without ``once`` every signal is delivered
            with stop.held():
                os.kill(os.getpid(), signal.SIGTERM)


def test_held_block_raises_at_its_end_and_once_delivers_only_the_first() -> None:
    with StopSignals(raise_stop, once=True) as stop:
        with pytest.raises(Stop):
            with stop.held():
                os.kill(os.getpid(), signal.SIGTERM)
                reached_end_of_block = True
        assert reached_end_of_block
        os.kill(os.getpid(), signal.SIGTERM)  # a second signal: ignored
        with stop.held():
            os.kill(os.getpid(), signal.SIGHUP)  # also ignored at the end of the block


def test_only_the_signals_asked_for_are_taken() -> None:
    before = signal.getsignal(signal.SIGHUP)
    with StopSignals(raise_stop, signals=(signal.SIGTERM,)):
        assert signal.getsignal(signal.SIGHUP) is before


def test_off_the_main_thread_nothing_is_installed() -> None:
    before = signal.getsignal(signal.SIGTERM)
    seen = []

    def other() -> None:
        with StopSignals(raise_stop):
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen == [before]
