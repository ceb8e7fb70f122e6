"""The tests run the compiler with its checks between stages (``timerlc.compiler``): every
graph a pass returns is verified, and every plan must read back through the runtime's own
checks. Subprocesses the tests start inherit it. ``timerlc run FILE.rtl`` keeps no builds
(``timerlc.buildcache``).

The session's emulated CUDA modules (``timerlc.cuda.emu``) are kept in one folder: a module
one test compiled (or one xdist worker: the workers inherit the controller's environment,
and subprocesses the tests start too) is loaded by the others that run the same text."""

import os
import shutil
import tempfile

from timerlc.cuda.emu import MODULES_ENV

os.environ["TIMERLC_VERIFY"] = "1"
# (no builds kept between runs of a program: a test that changes the compiler, as many
# monkeypatch it, must see its own compile; tests/test_buildcache.py turns it on)
os.environ["TIMERLC_BUILD_CACHE"] = "0"


def pytest_configure(config):
    if not hasattr(config, "workerinput") and not os.environ.get(MODULES_ENV):
        config._timerlc_emu_modules = tempfile.mkdtemp(prefix="timerlc-emu-modules-")
        os.environ[MODULES_ENV] = config._timerlc_emu_modules


def pytest_unconfigure(config):
    folder = getattr(config, "_timerlc_emu_modules", None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
        del os.environ[MODULES_ENV]
