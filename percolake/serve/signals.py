"""The signals that stop ``percolake serve``, noticed by its main thread however the
kernel delivers them (docs/operations.md).

Python runs a signal's handler in the main thread only, when that thread next runs
bytecode; the C-level handler that records the signal runs in whichever thread the
kernel picked, which may be any thread of the process (gRPC's, the server's workers).
A main thread blocked in an untimed wait (``threading.Event.wait()`` is a futex wait
in C) is interrupted only when the signal lands on it: landed on another thread, the
signal is recorded and its handler never runs. That is how a SIGTERM'd ``percolake
serve`` on a loaded machine went on admitting Begin for 30 s and more (issue 29; the
main thread was seen still in that wait), and, the same way, most likely why one took
over 60 s to exit in a benchmark. :class:`StopSignals` never waits without a bound and
is woken at once: the C-level handler writes to a wakeup socket from whatever thread
it runs on (:func:`signal.set_wakeup_fd`), and the main thread waits on that socket.
"""

from __future__ import annotations

import select
import signal
import socket
import time
from collections import deque
from types import FrameType

#: The longest the main thread waits without returning to the interpreter (which runs
#: pending handlers): a bound in case the wakeup socket is ever missed, not the
#: expected delay (the socket wakes the wait at once).
_WAIT_BOUND_S = 0.25


class StopSignals:
    """Catches ``signals`` from construction until :meth:`close` and hands them to the
    main thread in the order they came (:meth:`wait`). Construct it in the main thread.

    The handler only appends the signal's name to a deque: it takes no lock, since it
    runs between two bytecodes of the main thread, which may hold the very lock (a
    handler calling ``Event.set`` while the main thread is inside ``Event.wait``
    deadlocks on the event's own lock), and it does not log (a record written from a
    handler can land in the middle of one the main thread is writing). What a signal
    means is decided by the caller of :meth:`wait`, in ordinary code.
    """

    def __init__(self, signals: tuple[signal.Signals, ...]) -> None:
        self._signals = signals
        self._received: deque[str] = deque()
        self._wake_reader, wake_writer = socket.socketpair()
        self._wake_writer = wake_writer
        for sock in (self._wake_reader, wake_writer):
            sock.setblocking(False)  # set_wakeup_fd needs it; a full buffer is no loss
        self._previous_wakeup = signal.set_wakeup_fd(
            wake_writer.fileno(), warn_on_full_buffer=False
        )
        for signum in signals:
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._received.append(signal.Signals(signum).name)

    def wait(self, timeout_s: float | None = None) -> str | None:
        """The name of the next signal received (``SIGTERM``), waiting for one up to
        ``timeout_s`` (None: until one comes); None if none came in time."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._received:
            bound = _WAIT_BOUND_S
            if deadline is not None:
                bound = min(bound, deadline - time.monotonic())
                if bound <= 0:
                    return None
            select.select([self._wake_reader], [], [], bound)
            self._empty_wakeups()  # a call: the interpreter runs pending handlers here
        return self._received.popleft()

    def _empty_wakeups(self) -> None:
        try:
            while self._wake_reader.recv(512):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def close(self) -> None:
        """Stop catching: the signals are ignored from now on (the server has stopped,
        and a late signal must not turn a clean exit 0 into death by signal, as
        Python's default handlers, restored while it shuts down, would)."""
        for signum in self._signals:
            signal.signal(signum, signal.SIG_IGN)
        signal.set_wakeup_fd(self._previous_wakeup)
        self._wake_reader.close()
        self._wake_writer.close()
