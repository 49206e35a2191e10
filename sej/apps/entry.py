"""The console scripts' entry points: Ctrl-C exits 130 without a traceback, also while a program loads.

pip's wrapper of each console script imports this module first, and its import is cheap (the
`sej` package loads its names lazily). From then on, SIGINT ends the process with exit 130 and
nothing on stderr: while the program's modules load (about 0.1 s: click, watchdog, the library),
through a handler that raises SystemExit(130); once the program runs, as the KeyboardInterrupt
it handles itself (closing what it holds; the error shell exits 130), and 130 if one escapes it.

An interrupt whose exception Python would ignore (raised in a weakref callback or a __del__, where
Python prints "Exception ignored" and goes on) is delivered again (`_unraisable`), so it is never lost.

Before this module runs, Python handles Ctrl-C itself, as for any program: the process is killed by
the signal while the interpreter starts (a shell shows 130 too), and ends with a KeyboardInterrupt
traceback while Python imports its `site` module and the environment's .pth files (2 ms in a fresh
venv, 20 ms measured with an editable install and other .pth files) or pip's wrapper imports this
module (well under 1 ms).
"""

from __future__ import annotations

# _signal: the C module under `signal`, loaded with the interpreter (`signal` itself builds enums: 1-2 ms
# here, with Ctrl-C still unhandled). Its handlers are the very objects `signal.getsignal` returns.
import _signal
import _thread
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType

INTERRUPTED = 130  # sej.apps.shell.INTERRUPTED, which is too costly to import here


_interrupted = False


def interrupted() -> bool:
    """Whether SIGINT came (through this module's handlers): an error raised since may be its doing."""
    return _interrupted


def _exit_interrupted(signum: int, frame: FrameType | None) -> None:
    global _interrupted
    _interrupted = True
    raise SystemExit(INTERRUPTED)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """The program's SIGINT handler: a KeyboardInterrupt, as Python's own, and remembered (`interrupted`)."""
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt


# At import, not in run(): pip's wrapper runs a few lines of its own between the two. Not if SIGINT is
# ignored (started in the background with `&` or nohup): that must stay so.
if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
    _signal.signal(_signal.SIGINT, _exit_interrupted)

_TERMINATED = 143  # sej.apps.cli.follow.TERMINATED: SIGTERM's exit


def _unraisable(unraisable: sys.UnraisableHookArgs) -> None:
    """A signal handler's exception raised where Python ignores exceptions, and so lost: in a weakref
    callback (the import system's module locks have one: an interrupt while a module loads landed there,
    and `sej scan -f` then followed on as if never interrupted) or a __del__. The signal is delivered
    again, to the handler in force, from another thread: called here, the handler would run at once, inside
    this hook, and be lost again. Anything else goes to Python's own hook."""
    exc = unraisable.exc_value
    if isinstance(exc, KeyboardInterrupt) or (isinstance(exc, SystemExit) and exc.code == INTERRUPTED):
        _thread.start_new_thread(_thread.interrupt_main, (_signal.SIGINT,))
    elif isinstance(exc, SystemExit) and exc.code == _TERMINATED:
        _thread.start_new_thread(_thread.interrupt_main, (_signal.SIGTERM,))
    else:
        sys.__unraisablehook__(unraisable)


sys.unraisablehook = _unraisable


def run(module: str) -> None:
    """Import `module` and run its main(); Ctrl-C exits 130 quietly wherever it comes."""
    import importlib

    main = importlib.import_module(module).main
    try:
        if _signal.getsignal(_signal.SIGINT) is _exit_interrupted:
            _signal.signal(_signal.SIGINT, _interrupt)  # the program's own: KeyboardInterrupt
        main()
    except KeyboardInterrupt:
        sys.exit(INTERRUPTED)


def sej() -> None:
    run("sej.apps.cli.main")


def hub() -> None:
    run("sej.apps.hub")


def hub_cron() -> None:
    run("sej.apps.hub_cron")


def pipeline() -> None:
    run("sej.apps.pipeline")


def retention() -> None:
    run("sej.apps.retention")


def archive() -> None:
    run("sej.apps.archive")
