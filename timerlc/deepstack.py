"""Running a command on a deep stack, with signals forwarded to it.

The compiler's walks over expressions and the runtimes' evaluation of fused expressions are
recursive. A valid program can nest deeply (a sum of 1,000 terms is a tree 1,000 levels
deep), so the CLI runs each command in a worker thread with a large stack and a high
recursion limit (``call``). A program nested deeper than the parser accepts is a
``ProgramError`` before any walk (``frontend.parser``); a ``RecursionError`` that still
escapes becomes ``TooDeep``.

Python delivers signals to the main thread only. While the worker runs, the main thread
waits, and a SIGINT or SIGTERM it receives is raised in the worker as ``KeyboardInterrupt``
or ``Terminated`` (a ``KeyboardInterrupt``), at the worker's next Python instruction; so a
run stopped by Ctrl-C, ``timeout``, Slurm or ``docker stop`` saves what it computed the
same way (``runner``). Each later signal is raised there too.

Where the worker runs native code that calls back into Python (``runtime.cpu``'s tree
functions), an exception raised at an arbitrary instruction of a callback could escape it
before its ``try`` (ctypes would print and drop it, and the native code would go on). Such
code runs inside ``held()``: a signal that arrives then is kept, and raised by ``check()``
(which the callbacks call first, inside their ``try``) or when the block ends; a second
signal before that is raised at once (a callback that hangs can still be stopped).
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import sys
import threading
from typing import Any, Callable

STACK_BYTES = 512 << 20
RECURSION_LIMIT = 30_000  # Python frames; also bounds C recursion (json, repr) to fit the stack


class TooDeep(Exception):
    """A walk ran out of stack on a program nested too deeply."""


class Terminated(KeyboardInterrupt):
    """SIGTERM: stop as on Ctrl-C (save what was computed), then exit 143."""


_EXCEPTION_OF = {signal.SIGINT: KeyboardInterrupt, signal.SIGTERM: Terminated}

# per thread inside ``held()``: [depth, the exception class of a signal kept, or None]
_HELD: dict[int, list] = {}
_HELD_LOCK = threading.Lock()


@contextlib.contextmanager
def held():
    """Signals forwarded to this thread during the block are kept, not raised at once:
    ``check()`` raises one, and so does the end of the block (unless it ends by another
    exception)."""
    ident = threading.get_ident()
    state = None
    failed = True
    try:
        with _HELD_LOCK:
            state = _HELD.setdefault(ident, [0, None])
            state[0] += 1
        yield
        failed = False
    finally:
        kept = None
        if state is not None:
            with _HELD_LOCK:
                state[0] -= 1
                if state[0] == 0:
                    del _HELD[ident]
                    kept, state[1] = state[1], None
        if kept is not None and not failed:
            raise kept()


def check():
    """Raise the signal kept for this thread in ``held()``, if one came."""
    with _HELD_LOCK:
        state = _HELD.get(threading.get_ident())
        kept = None
        if state is not None:
            kept, state[1] = state[1], None
    if kept is not None:
        raise kept()


def call(fn: Callable[..., Any], *args, **kwargs) -> Any:
    """``fn(*args, **kwargs)`` in a thread with a ``STACK_BYTES`` stack and a recursion
    limit of ``RECURSION_LIMIT``: its result, or the exception it raised (a
    ``RecursionError`` as ``TooDeep``). Outside the main thread, ``fn`` runs in place."""
    if threading.current_thread() is not threading.main_thread():
        return fn(*args, **kwargs)
    box: dict[str, Any] = {}

    def work():
        try:
            box["value"] = fn(*args, **kwargs)
        except RecursionError:
            box["error"] = TooDeep()
        except BaseException as e:  # noqa: BLE001 - handed to the calling thread
            box["error"] = e

    old_size = threading.stack_size()
    try:
        threading.stack_size(STACK_BYTES)
        worker = threading.Thread(target=work, name="timerlc", daemon=True)
    except (ValueError, RuntimeError):  # no such stack here: run in place
        return fn(*args, **kwargs)
    finally:
        threading.stack_size(old_size)
    old_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old_limit, RECURSION_LIMIT))
    old_handlers = {}

    def forward(signum, frame):
        if worker.is_alive():
            with _HELD_LOCK:  # the worker does not enter nor leave held() meanwhile
                state = _HELD.get(worker.ident)
                if state is not None and state[1] is None:
                    state[1] = _EXCEPTION_OF[signum]
                else:  # not held, or a second signal: at once (a callback that hangs)
                    _raise_in(worker, _EXCEPTION_OF[signum])
        else:
            raise _EXCEPTION_OF[signum]()

    try:
        for signum in _EXCEPTION_OF:
            old_handlers[signum] = signal.signal(signum, forward)
        worker.start()
        while worker.is_alive():
            worker.join(0.2)  # wakes up for signals
    finally:
        for signum, handler in old_handlers.items():
            signal.signal(signum, handler)
        sys.setrecursionlimit(old_limit)
    if "error" in box:
        raise box["error"]
    return box["value"]


def _raise_in(thread: threading.Thread, exc: type[BaseException]):
    """Raise ``exc`` in ``thread`` at its next Python instruction."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(exc))
