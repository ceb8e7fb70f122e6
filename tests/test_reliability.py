"""Nothing lost, nothing clobbered, no traceback: build folders, interruptions, atomic saves,
bad files and sizes, bad environment values and bad ``--set`` values (docs/interruptions.md).

Each test reproduces one way a run or a compile used to lose data, clobber files or print a
traceback, and checks what happens now.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from test_diagnostics import assert_diagnostic, assert_no_traceback, diagnose, invoke

TESTS = Path(__file__).parent
SWAPS = str(TESTS / "programs" / "swaps.rtl")

# an environment run: g is an output over (i, b, t), s a metric per iteration; the actions
# of iteration i depend on s of the iterations before, so each is computed in its turn
RUN = """
config I = 4, B = 2, T = 3
dim i < I
dim b < B
dim t < T
env E = "PLUGIN" batch b
acc[0] = 0.0
acc[i+1] = acc[i] + s[i]
o[i, b, 0] = E.reset()
o[i, b, t+1], r[i, b, t], d[i, b, t] = E.step((t + b + i32(acc[i])) % 3)
g[i, b, t] = r[i, b, t] * 2.0 + o[i, b, t][0]
s[i] = sum(g[i, 0:B, 0:T])
out g, s
metric s
"""


def program(tmp_path: Path, plugin: str, text: str = RUN) -> str:
    path = tmp_path / "p.rtl"
    path.write_text(text.replace("PLUGIN", plugin))
    return str(path)


def _status(code: int, err: str, want: int, *words: str):
    assert "Traceback" not in err, err
    assert code == want, f"exit {code}, expected {want}:\n{err}"
    for w in words:
        assert w in err, f"{w!r} not in:\n{err}"


# ----------------------------------------------------------------------------- build folders
def test_compile_refuses_a_folder_that_is_not_a_build(tmp_path):
    project = tmp_path / "project"
    (project / "ir").mkdir(parents=True)
    (project / "ir" / "notes.txt").write_text("mine")
    (project / "plan.json").write_text("{}")
    code, _, err = invoke("compile", "programs/returns.rtl", "-o", str(project))
    _status(code, err, 2, "not empty", ".timerlc-build")
    assert (project / "ir" / "notes.txt").read_text() == "mine"
    assert (project / "plan.json").read_text() == "{}"


def test_compile_refuses_a_file_as_its_folder(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    code, _, err = invoke("compile", "programs/returns.rtl", "-o", str(f))
    _status(code, err, 2, "not a folder")
    assert f.read_text() == "x"


def test_compile_replaces_its_own_build_and_writes_into_an_empty_folder(tmp_path):
    out = tmp_path / "b"
    out.mkdir()
    code, _, err = invoke("compile", "programs/returns.rtl", "-o", str(out), "--dump-ir")
    assert code == 0, err
    assert (out / ".timerlc-build").is_file() and (out / "ir").is_dir()
    code, _, err = invoke("compile", "programs/returns.rtl", "-o", str(out))
    assert code == 0, err
    assert not (out / "ir").exists()  # the earlier dump does not stay behind
    assert sorted(p.name for p in out.iterdir()) == [
        ".timerlc-build",
        "build.json",
        "kernels",
        "plan.json",
        "program.pdg.json",
    ]


def test_a_reference_build_runs_on_the_reference_backend(tmp_path):
    out = tmp_path / "b"
    code, _, err = invoke("compile", "programs/returns.rtl", "--backend", "reference", "-o", out)
    assert code == 0, err
    assert not (out / "plan.json").exists()
    code, _, err = invoke("run", str(out), "--outputs", str(tmp_path / "o.npz"))
    assert code == 0, err
    code, _, err = invoke("run", str(out), "--backend", "cpu")
    _status(code, err, 2, "reference backend", "--backend cpu")


# ----------------------------------------------------------------------------- interruptions
BACKENDS = ["reference", "cpu"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_interrupted_run_saves_its_outputs_with_masks_of_the_points_computed(tmp_path, backend):
    full = tmp_path / "full.npz"
    code, _, err = invoke(
        "run", program(tmp_path, "env_plugins:make_interrupts"), "--backend", backend,
        "--outputs", str(full),
    )  # fmt: skip
    assert code == 0, err
    with np.load(full) as z:
        assert sorted(z.files) == ["g", "s"]  # a complete run: the outputs only
        whole = {k: z[k] for k in z.files}
    part = tmp_path / "part.npz"
    metrics = tmp_path / "m.csv"
    code, _, err = invoke(
        "run", program(tmp_path, "env_plugins:make_interrupts?at=5"), "--backend", backend,
        "--outputs", str(part), "--metrics", str(metrics),
    )  # fmt: skip
    _status(code, err, 130, "interrupted", str(part), "g.__valid__")
    with np.load(part) as z:
        assert sorted(z.files) == ["g", "g.__valid__", "s", "s.__valid__"]
        saved = {k: z[k] for k in z.files}
    # the 3 steps of iteration 0 ran, then 1 of iteration 1; the 5th step was interrupted
    np.testing.assert_array_equal(saved["s.__valid__"], [True, False, False, False])
    for name in ("g", "s"):
        valid = saved[name + ".__valid__"]
        assert valid.shape == whole[name].shape[: valid.ndim]
        np.testing.assert_array_equal(saved[name][valid], whole[name][valid])
        assert not saved[name][~valid].any()
    assert metrics.read_text().splitlines() == ["name,i,value", f"s,0,{whole['s'][0]}"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failed_run_saves_its_outputs_with_masks(tmp_path, backend):
    out = tmp_path / "o.npz"
    code, _, err = invoke(
        "run", program(tmp_path, "env_plugins:make_bad_values?at=4&value=boom"),
        "--backend", backend, "--outputs", str(out),
    )  # fmt: skip
    _status(code, err, 3, "could not convert", "saved to", "__valid__")
    with np.load(out) as z:
        np.testing.assert_array_equal(z["s.__valid__"], [True, False, False, False])


def test_a_second_interrupt_during_the_save_leaves_the_earlier_file(tmp_path, monkeypatch):
    out = tmp_path / "o.npz"
    np.savez(out, g=np.arange(3))
    before = out.read_bytes()
    real = np.savez

    def interrupted_savez(file, **arrays):
        real(file, **arrays)  # the data are written, then Ctrl-C comes before the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez", interrupted_savez)
    code, _, err = invoke(
        "run", program(tmp_path, "env_plugins:make_interrupts?at=5"), "--outputs", str(out)
    )
    _status(code, err, 130, "interrupted again", "unchanged")
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.npz", "p.rtl"]  # no temporary


def test_a_failed_save_leaves_the_earlier_file(tmp_path, monkeypatch):
    out = tmp_path / "o.npz"
    out.write_bytes(b"earlier")

    def full_disk(file, **arrays):
        file.write(b"PK\x03\x04partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", full_disk)
    code, _, err = invoke("run", program(tmp_path, "env_plugins:make_counter"), "--outputs", out)
    _status(code, err, 3, "cannot write the outputs", "No space left")
    assert out.read_bytes() == b"earlier"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.npz", "p.rtl"]


def _start(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    """A long run in a subprocess, once it has written its first metric."""
    text = RUN.replace("I = 4", "I = 400")
    metrics = tmp_path / "m.csv"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "timerlc.cli", "run",
         program(tmp_path, "env_plugins:make_interrupts?delay=0.01", text),
         "--metrics", str(metrics), *args],
        env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            return proc, metrics
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"the run did not start: {proc.communicate()}")


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_stops_the_run_and_saves_what_it_computed(tmp_path, signum, status):
    out = tmp_path / "o.npz"
    proc, metrics = _start(tmp_path, "--outputs", str(out))
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    _status(proc.returncode, err, status, "saved to", str(out))
    with np.load(out) as z:
        valid = z["s.__valid__"]
    rows = len(metrics.read_text().splitlines()) - 1
    assert valid[:rows].all() and not valid[rows + 1 :].any()


# ----------------------------------------------------------------------------- files and sizes
@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
@pytest.mark.parametrize("option, name", [("--outputs", "o.npz"), ("--metrics", "m.csv")])
def test_a_file_that_cannot_be_created_is_a_usage_error_before_the_run(tmp_path, option, name):
    code, _, err = invoke(
        "run", program(tmp_path, "env_plugins:make_interrupts?at=1"), option, f"/proc/{name}"
    )
    _status(code, err, 2, option, "cannot create")  # before the run: no interruption


def test_a_name_too_long_for_a_file_is_a_program_error_before_the_run(tmp_path):
    # an npz member name has at most 65535 bytes: names have at most 100 characters
    name = "g" * 70000
    out = diagnose(tmp_path, f"dim t < 2\n{name}[t] = 1.0\nout {name}\n", cmd="run")
    assert_diagnostic(out, 2, 1, "70000 characters", "at most 100")
    name = "h" * 100
    out = diagnose(tmp_path, f"dim t < 2\n{name}[t] = 1.0\nout {name}\n")
    assert out.status == 0, out.stderr


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "text",
    [
        "dim t < 2\nx[t] = zeros([100000, 100000])\nout x\n",
        "config T = 2000000000\ndim t < T\nx[t] = f32(t)\ny = sum(x[0:T])\nout y\n",
    ],
    ids=["huge-shape", "huge-dim"],
)
def test_a_run_larger_than_memory_stops_before_allocating(tmp_path, backend, text):
    out = tmp_path / "o.npz"
    status = diagnose(tmp_path, text, "--backend", backend, "--outputs", str(out), cmd="run")
    _status(status.status, status.stderr, 3, "needs", "GiB", "available")
    assert "saved" not in status.stderr and not out.exists()


# ----------------------------------------------------------------------------- environments
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "options, words",
    [
        ("field=reward&value=nan", ["non-finite reward", "nan", "instance 1"]),
        ("field=obs&value=inf", ["non-finite obs", "inf"]),
        ("field=reward&value=-inf", ["non-finite reward", "-inf"]),
        ("field=done", ["done of float32", "must be bool"]),
    ],
)
def test_bad_environment_values_stop_the_run(tmp_path, backend, options, words):
    path = program(tmp_path, f"env_plugins:make_bad_values?{options}&at=2")
    code, _, err = invoke("run", path, "--backend", backend)
    _status(code, err, 3, "environment 'E'", "step", "i=0, t=1", *words)


@pytest.mark.parametrize("backend", BACKENDS)
def test_allow_nonfinite_accepts_nan_from_environments(tmp_path, backend):
    out = tmp_path / "o.npz"
    path = program(tmp_path, "env_plugins:make_bad_values?value=nan&at=2")
    code, _, err = invoke("run", path, "--backend", backend, "--allow-nonfinite", "--outputs", out)
    assert code == 0, err
    with np.load(out) as z:
        assert np.isnan(z["g"]).any()


def test_a_plugin_whose_close_raises_is_named_at_compile(tmp_path):
    out = diagnose(tmp_path, RUN.replace("PLUGIN", "env_plugins:make_close_raises"))
    assert_diagnostic(out, 5, 5, "env_plugins:make_close_raises", "close()", "socket")


# ----------------------------------------------------------------------------- --set values
@pytest.mark.parametrize(
    "value, words",
    [
        ("nan", ["not a finite number"]),
        ("-inf", ["not a finite number"]),
        ("1e999", ["not a finite number"]),
        ("５", ["ASCII digits"]),
        ("1_6", ["ASCII digits"]),
        ("0x10", ["ASCII digits"]),
    ],
)
def test_a_set_value_must_be_a_finite_ascii_number(tmp_path, value, words):
    out = diagnose(tmp_path, "config g = 0.5\ndim t < 2\nx[t] = g\nout x\n", "--set", f"g={value}")
    assert_diagnostic(out, 1, 8, *words)


@pytest.mark.parametrize("value", ["2.5", "-3", ".5", "1e-3", "2E+2", "7."])
def test_a_set_value_may_be_any_rtl_number(tmp_path, value):
    out = diagnose(tmp_path, "config g = 0.5\ndim t < 2\nx[t] = g\nout x\n", "--set", f"g={value}")
    assert out.status == 0, out.stderr


def test_a_literal_beyond_f64_is_not_a_finite_number(tmp_path):
    out = diagnose(tmp_path, "config g = 1e99999\ndim t < 2\nx[t] = g\nout x\n")
    assert_diagnostic(out, 1, 12, "not a finite number")


def test_a_config_expression_that_overflows_is_not_a_finite_number(tmp_path):
    out = diagnose(tmp_path, "config g = 1e300 * 1e300\ndim t < 2\nx[t] = g\nout x\n")
    assert_diagnostic(out, 1, 18, "not a finite number")


@pytest.mark.parametrize(
    "args, words",
    [
        (["--set", "T=4", "--set", "T=5"], ["--set T=5", "--set T=4", "two values"]),
        (["--seed", "1", "--set", "seed=2"], ["--seed 1", "--set seed=2"]),
    ],
)
def test_conflicting_values_are_a_usage_error(tmp_path, args, words):
    out = diagnose(tmp_path, "config T = 3\ndim t < T\nx[t] = 1.0\nout x\n", *args, cmd="run")
    _status(out.status, out.stderr, 2, *words)


def test_the_same_value_given_twice_is_no_conflict(tmp_path):
    program_text = "config T = 3\ndim t < T\nx[t] = 1.0\nout x\n"
    out = diagnose(tmp_path, program_text, "--set", "T=4", "--set", "T=4", "--seed", "2",
                   "--set", "seed=2", cmd="run")  # fmt: skip
    assert out.status == 0, out.stderr


@pytest.mark.parametrize("seed", ["５", "1_6", "0x1"])
def test_a_seed_must_be_ascii_digits(tmp_path, seed):
    out = diagnose(tmp_path, "dim t < 2\nx[t] = 1.0\nout x\n", "--seed", seed, cmd="run")
    _status(out.status, out.stderr, 2, "ASCII digits")
    assert_no_traceback(out)


# ----------------------------------------------------------------------------- memory budgets
@pytest.mark.parametrize(
    "path, budget",
    [("programs/returns.rtl", "1K"), ("programs/reinforce.rtl", "2M"), (SWAPS, "1M")],
)
def test_a_budget_not_met_names_the_buffers_in_the_way_and_the_smallest_budget(
    tmp_path, path, budget
):
    code, _, err = invoke("compile", path, "-o", str(tmp_path / "b"), "--memory-budget", budget)
    assert code == 0, err
    head, *rows = err.strip().splitlines()
    assert head.startswith("timerlc: warning: the memory budget of") and "cannot be met" in head
    smallest = int(re.search(r"the smallest this plan can meet is .*?\((\d+) bytes\)", head)[1])
    assert "these must be on the device" in head and rows, err
    assert all(re.match(r"  (\S.*: .*bytes.*|and \d+ smaller buffers?)$", r) for r in rows), err
    # that budget is met: no warning
    code, _, err = invoke(
        "compile", path, "-o", str(tmp_path / "c"), "--memory-budget", str(smallest)
    )
    assert code == 0 and err == "", err


# --- signals during native code (timerlc.deepstack.held) ---
def _kill_later(*delays: float):
    import threading

    for d in delays:
        threading.Timer(d, os.kill, (os.getpid(), signal.SIGINT)).start()


def test_a_signal_during_held_code_is_kept_until_the_next_check():
    # the native tree functions run held: a Ctrl-C that comes during a callback is raised
    # by the callback's first check, inside its try, never at an arbitrary instruction
    from timerlc import deepstack

    seen = []

    def work():
        with deepstack.held():
            _kill_later(0.05)
            started = time.monotonic()
            while time.monotonic() - started < 0.5:
                pass  # Python code while held: not interrupted
            seen.append("ran to the end")
            deepstack.check()
            seen.append("not raised")

    with pytest.raises(KeyboardInterrupt):
        deepstack.call(work)
    assert seen == ["ran to the end"]


def test_a_signal_kept_in_held_code_is_raised_when_it_ends():
    from timerlc import deepstack

    def work():
        with deepstack.held():
            _kill_later(0.05)
            started = time.monotonic()
            while time.monotonic() - started < 0.3:
                pass
        return "not raised"

    with pytest.raises(KeyboardInterrupt):
        deepstack.call(work)


def test_a_second_signal_interrupts_held_code_at_once():
    # a callback that hangs (a plugin's step) can still be stopped: press Ctrl-C twice
    from timerlc import deepstack

    def work():
        with deepstack.held():
            _kill_later(0.05, 0.2)
            started = time.monotonic()
            while time.monotonic() - started < 20:
                pass

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        deepstack.call(work)
    assert time.monotonic() - started < 10


def test_the_parsers_tables_are_kept_in_the_users_own_cache_folder(tmp_path, monkeypatch):
    """Lark's ``cache=True`` kept the parser's tables (a pickle, loaded as code) in the shared
    temporary folder under a name anyone can work out: a file another user put there first
    would have run in our process. They are in ``$XDG_CACHE_HOME/timerlc/lark`` now, a folder
    of the user's own (0700), and not cached at all where that folder is another's to
    write."""
    import tempfile

    from timerlc.files import user_cache
    from timerlc.frontend import parser

    def shared():
        return set(Path(tempfile.gettempdir()).glob(".lark_cache_*"))

    before = shared()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    parser._parser.cache_clear()
    try:
        parser.parse("dim t < 2\nx[t] = 1.0\n")
        kept = list((tmp_path / "cache" / "timerlc" / "lark").iterdir())
        assert len(kept) == 1 and kept[0].name.startswith("rtl-"), kept
        assert (kept[0].parent.stat().st_mode & 0o777) == 0o700
        parser._parser.cache_clear()
        parser.parse("dim t < 2\nx[t] = 2.0\n")  # (from the cache)
        assert shared() == before
        open_folder = tmp_path / "open"
        (open_folder / "timerlc" / "lark").mkdir(parents=True)
        (open_folder / "timerlc" / "lark").chmod(0o777)
        monkeypatch.setenv("XDG_CACHE_HOME", str(open_folder))
        assert user_cache("lark") is None
        parser._parser.cache_clear()
        parser.parse("dim t < 2\nx[t] = 3.0\n")  # (no cache)
        assert list((open_folder / "timerlc" / "lark").iterdir()) == []
        assert shared() == before
    finally:
        parser._parser.cache_clear()


def test_no_cache_where_another_user_may_write_a_folder_above_it(tmp_path, monkeypatch):
    """The cache folder's own folder (``timerlc/``) and the base must be the user's alone
    too: where another user may write ``timerlc/``, they could put a folder of theirs in
    place of ``lark/`` (a ``timerlc/`` of the user's own that others may write, as an older
    version made it under a umask of 002, is made private first). A base that others may
    write is refused unless its sticky bit keeps them from moving what is ours (a shared
    temporary folder's)."""
    from timerlc.files import user_cache

    base = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(base))
    assert user_cache("lark") == base / "timerlc" / "lark"
    (base / "timerlc").chmod(0o777)  # (ours: made private again, as an older version's)
    assert user_cache("lark") == base / "timerlc" / "lark"
    assert (base / "timerlc").stat().st_mode & 0o777 == 0o700
    base.chmod(0o777)
    assert user_cache("lark") is None
    base.chmod(0o1777)
    assert user_cache("lark") == base / "timerlc" / "lark"
    base.chmod(0o775)  # (the user's private group, a umask of 002)
    assert user_cache("lark") == base / "timerlc" / "lark"
    fresh = tmp_path / "fresh"
    monkeypatch.setenv("XDG_CACHE_HOME", str(fresh))
    assert user_cache("emu") == fresh / "timerlc" / "emu"
    assert (fresh / "timerlc").stat().st_mode & 0o777 == 0o700
    if hasattr(os, "getuid") and os.getuid() == 0:  # (only root may give a folder away)
        os.chown(fresh / "timerlc", 54321, -1)  # (another user's timerlc/)
        assert user_cache("emu") is None
        os.chown(fresh / "timerlc", 0, -1)
        os.chown(fresh / "timerlc" / "emu", 54321, -1)  # (another user's emu/)
        assert user_cache("emu") is None


def test_no_home_folder_means_no_cache_not_a_crash(monkeypatch):
    """Without ``XDG_CACHE_HOME`` and a home folder (``Path.home()`` raises), there is no
    user cache: None, where the lookup of the home folder escaped the ``try``."""
    from timerlc.files import user_cache

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert user_cache("lark") is None
