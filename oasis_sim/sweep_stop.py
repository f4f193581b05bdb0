"""Stopping a sweep: SIGINT (Ctrl-C) and SIGTERM end it within a second or two, whichever way it runs.

``stop_signals()`` turns either signal in the sweep's own process into ``SweepInterrupted`` (a ``BaseException``,
so a point's ``except Exception`` never swallows it) for as long as the sweep runs. The local pool's workers ignore
SIGINT (a terminal's Ctrl-C reaches the whole process group; the parent decides) and die with their parent on Linux
(``PR_SET_PDEATHSIG``), so even a parent killed with SIGKILL leaves no worker blocked on the task pipe.
``stop_pool`` cancels the queued points and terminates the running ones; Ray tasks are cancelled with
``ray.cancel(force=True)``. The sweep then writes the rows that finished (the others say ``not run``) and exits
``128 + signal`` (130 for SIGINT, 143 for SIGTERM).
"""

from __future__ import annotations

import contextlib
import signal
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class SweepInterrupted(BaseException):
    """A stop signal arrived while the sweep ran; ``signum`` is which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)  # args == (signum,): code that re-raises ``type(e)(*e.args)`` (simpy) keeps it
        self.signum = signum
        self.note = ""  # what the sweep wrote before stopping, set by ``run_sweep``

    def __str__(self) -> str:
        return self.note or f"interrupted by {signal_name(self.signum)}"

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class StopFlag:
    """Where ``stop_signals(raise_=False)`` notes the signal that arrived (``signum``; 0 while none)."""

    signum = 0

    def check(self) -> None:
        if self.signum:
            raise SweepInterrupted(self.signum)


@contextlib.contextmanager
def stop_signals(raise_: bool = True):
    """SIGINT and SIGTERM raise ``SweepInterrupted`` inside the block (the main thread only: signal handlers
    cannot be set elsewhere, and a sweep run from another thread keeps the process's own handling). With
    ``raise_=False`` the handler only notes the signal in the ``StopFlag`` the block gets, for a loop that checks it
    (an exception raised inside a Cython call such as ``ray.wait`` turns into a ``SystemError``)."""
    flag = StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def raise_stop(signum, frame):
        for s in STOP_SIGNALS:  # a second signal while stopping is not a second exception
            signal.signal(s, signal.SIG_IGN)
        flag.signum = signum
        if raise_:
            raise SweepInterrupted(signum)

    old = {s: signal.signal(s, raise_stop) for s in STOP_SIGNALS}
    try:
        yield flag
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def init_worker() -> None:
    """A pool worker's initializer: ignore SIGINT, die of SIGTERM (a forked worker inherits the parent's handler),
    and on Linux receive SIGKILL when the parent dies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def stop_pool(pool, timeout_s: float = 1.0) -> None:
    """Cancel every queued point of ``pool`` (a ``ProcessPoolExecutor``), terminate its workers (SIGTERM, then
    SIGKILL after ``timeout_s``) and release it without waiting for the points that were running."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        with contextlib.suppress(Exception):
            p.terminate()
    for p in procs:
        with contextlib.suppress(Exception):
            p.join(timeout_s)
            if p.is_alive():
                p.kill()
                p.join(timeout_s)
