"""Stop signals: ^C (SIGINT), SIGTERM (kill, a CI job's timeout, systemd) and SIGHUP (a closed terminal or SSH
session) all end a command the same way: the signal becomes an exception (`Stopped`, a KeyboardInterrupt) at the
point the main thread is at, every `with` and `finally` on the way out removes what it made (temporary files and
directories, partial outputs, worker processes), and the command exits 128 + the signal's number with one line.

Only the first signal interrupts: one arriving while that cleanup runs, or while the command reports a failure,
is ignored, so a second ^C or a SIGTERM following a SIGHUP cannot cut the removal short.

Where no exception can pass (a callback from C, such as llvmlite's while numba compiles) Python swallows the
exception as "unraisable" and prints it: that one is not printed and the signal is sent again a moment later,
when the main thread is back in Python code.
"""

import contextlib
import os
import signal
import sys
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """A stop signal arrived (signum)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


REDELIVER_AFTER = 0.05     # seconds: the callback that swallowed the interruption has returned by then


class StopState:
    signum: int | None = None       # the signal that interrupted
    swallowed: bool = False         # its exception was swallowed: the signal is to be raised again
    closing: bool = False           # the command is ending (cleaning up, reporting): signals are ignored


@contextlib.contextmanager
def stop_signals_interrupt():
    """Within: the first stop signal raises Stopped, unless the command is already closing; yields the
    StopState."""
    state = StopState()

    def interrupt(signum, frame):
        if state.closing or (state.signum is not None and not state.swallowed):
            return
        state.signum, state.swallowed = state.signum or signum, False
        raise Stopped(state.signum)

    if threading.current_thread() is not threading.main_thread():      # only the main thread may set handlers
        yield state
        return
    previous_hook = sys.unraisablehook
    timers = []

    def raise_again():
        if state.swallowed and not state.closing:
            os.kill(os.getpid(), state.signum)

    def unraisable(info):
        if isinstance(info.exc_value, Stopped):
            state.swallowed = True
            timers.append(threading.Timer(REDELIVER_AFTER, raise_again))
            timers[-1].daemon = True
            timers[-1].start()
            return
        previous_hook(info)

    previous = {s: signal.signal(s, interrupt) for s in STOP_SIGNALS}
    sys.unraisablehook = unraisable
    try:
        yield state
    finally:
        state.closing = True
        for t in timers:
            t.cancel()
        sys.unraisablehook = previous_hook
        for s, handler in previous.items():
            signal.signal(s, handler)


def exit_code(signum: int) -> int:
    return 128 + signum


def interrupted(signum: int) -> str:
    """The one line: 'interrupted' for ^C, 'interrupted by SIGTERM' for the others."""
    return "interrupted" if signum == signal.SIGINT else f"interrupted by {signal.Signals(signum).name}"
