"""``StopSignals`` (issue 29): a stop signal reaches ``percolake serve``'s main thread
whichever thread of the process the kernel hands it to. The real process is in
``tests/integration/test_drain.py``; here SIGUSR1 stands in for SIGTERM, so that a
broken handler cannot end the test process."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import pytest

from percolake.serve.signals import StopSignals

pytestmark = pytest.mark.unit

#: Bounds of the waits below, generous for a loaded machine (never a timing assertion).
_WAIT_S = 10.0


@pytest.fixture
def usr1() -> Iterator[None]:
    """SIGUSR1's handler and the wakeup fd as they were, whatever the test did."""
    previous = signal.getsignal(signal.SIGUSR1)
    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup)
    yield
    signal.signal(signal.SIGUSR1, previous)
    signal.set_wakeup_fd(wakeup)


def _signal_from_another_thread(signum: signal.Signals) -> None:
    """Send ``signum`` to a thread other than the main thread, which takes it there (its
    C-level handler runs in that thread, as with a process's signal the kernel handed to
    a gRPC thread)."""
    thread = threading.Thread(target=lambda: signal.pthread_kill(threading.get_ident(), signum))
    thread.start()
    thread.join()


def test_a_signal_another_thread_takes_reaches_wait(usr1: None) -> None:
    """Before issue 29's fix ``serve`` waited in an untimed ``Event.wait()``, which such a
    signal never wakes: its handler never ran (``test_drain.py`` shows the server going
    on serving). :meth:`StopSignals.wait` returns it."""
    signals = StopSignals((signal.SIGUSR1,))
    try:
        _signal_from_another_thread(signal.SIGUSR1)
        assert signals.wait(_WAIT_S) == "SIGUSR1"
        assert signals.wait(0.01) is None  # each signal is handed out once
    finally:
        signals.close()


def test_signals_come_out_in_order_and_none_without_one(usr1: None) -> None:
    signals = StopSignals((signal.SIGUSR1, signal.SIGUSR2))
    previous_usr2 = signal.getsignal(signal.SIGUSR2)
    try:
        assert signals.wait(0.01) is None
        signal.raise_signal(signal.SIGUSR2)
        _signal_from_another_thread(signal.SIGUSR1)
        assert signals.wait(_WAIT_S) == "SIGUSR2"
        assert signals.wait(_WAIT_S) == "SIGUSR1"
    finally:
        signals.close()
        signal.signal(signal.SIGUSR2, previous_usr2)


def test_close_ignores_the_signals_and_restores_the_wakeup_fd(usr1: None) -> None:
    """After the stop a late signal must not end the process (exit 0 would become death
    by signal), and the wakeup fd is the one before."""
    before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(before)
    signals = StopSignals((signal.SIGUSR1,))
    signals.close()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
    signal.raise_signal(signal.SIGUSR1)  # ignored: the test goes on
    assert signal.set_wakeup_fd(before) == before
