"""The tests run the compiler with its checks between stages (``timerlc.compiler``): every
graph a pass returns is verified, and every plan must read back through the runtime's own
checks. Subprocesses the tests start inherit it."""

import os

os.environ["TIMERLC_VERIFY"] = "1"
