"""Diagnostics (LANGUAGE.md sections 3, 11 and 12): out/metric, def recursion, --set and
--env, features this version does not support, run-time failures and usage errors.

Exit statuses (section 12): 1 an error in the program, 2 a usage error, 3 a failure while
running. How a bad ``--set`` is classified:

* ``--set NAME=VALUE`` that is well formed but wrong for the program (no config NAME,
  VALUE of the wrong type, a value that makes the program invalid such as a dim bound of
  0) is an error of the program as configured: section 11 lists "a bad --set or --env"
  among the program errors, so exit status 1 and the section 11 format. A wrong type is
  reported at the config's declaration (the caret under its name); an unknown name has no
  token in the source, so only the format is pinned down.
* ``--set T`` (no ``=``) or ``--set =3`` cannot be read as an override at all whatever the
  program says: that is a malformed command line, a usage error, exit status 2 (as click
  reports any other malformed option value). The same holds for ``--env E``.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess

import pytest
from rtl_helpers import timerlc_cmd
from test_diagnostics import (
    assert_diagnostic,
    assert_no_traceback,
    diagnose,
    expect_error,
    expect_format,
    invoke,
    src,
)

VALID = """
    config T = 4, gamma = 0.9
    dim t < T
    r[t] = f32(t)
    g[T-1] = r[T-1]
    g[t] = r + gamma * g[t+1]
    out g
"""

# a gather whose index leaves its axis at t = 2 (exp(2) = 7.4 >= 3): only visible at run time
RUNTIME_FAILURE = """
    config T = 4
    dim t < T
    v[t] = zeros([3])
    k[t] = i32(floor(exp(f32(t))))
    x[t] = v[t][k[t]]
    out x
"""

_HAS_SERIALIZE = importlib.util.find_spec("timerlc.ir.serialize") is not None


# ----------------------------------------------------------------------------- out and metric
def test_metric_that_is_not_a_scalar(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        v[t] = zeros([3])
        metric v
    """,
        4,
        8,
        "metric",
        "scalar",
        "'v'",
        "[3]",
    )


def test_metric_that_is_a_record(tmp_path):
    expect_error(
        tmp_path,
        """
        config I = 3
        dim i < I
        params net[i] { w : f32[3] = zeros }
        net[i+1] = net[i]
        metric net
    """,
        5,
        8,
        "metric",
        "scalar",
        "'net'",
    )


def test_second_name_of_a_metric_list(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        s[t] = f32(t)
        v[t] = zeros([2])
        metric s, v
    """,
        5,
        11,
        "scalar",
        "'v'",
    )


def test_out_of_an_unknown_name(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        value[t] = f32(t)
        out valu
    """,
        4,
        5,
        "'valu'",
        "did you mean 'value'",
    )


def test_metric_of_an_unknown_name(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        value[t] = f32(t)
        metric vlaue
    """,
        4,
        8,
        "'vlaue'",
        "did you mean 'value'",
    )


def test_out_of_a_config(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        value[t] = f32(t)
        out T
    """,
        4,
        5,
        "'T'",
        "config",
    )


def test_out_of_a_dim(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        value[t] = f32(t)
        out value, t
    """,
        4,
        12,
        "'t'",
        "dim",
    )


# ----------------------------------------------------------------------------- def recursion
def test_def_calling_itself(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        def f(v) { f(v) + 1.0 }
        x[t] = f(f32(t))
    """,
        3,
        12,
        "recursi",
        "'f'",
    )


def test_defs_calling_each_other(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        def f(v) { g(v) + 1.0 }
        def g(v) { f(v) * 2.0 }
        x[t] = f(f32(t))
    """,
        4,
        12,
        "recursi",
        "f -> g -> f",
    )


def test_recursive_def_that_is_never_called(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        def f(v) { f(v) + 1.0 }
        x[t] = f32(t)
    """,
        3,
        12,
        "recursi",
        "'f'",
    )


# ----------------------------------------------------------------------------- --set
def _head(out, *words):
    """Exit 1 and a first line FILE:LINE:COL: error: MESSAGE holding ``words``."""
    assert_no_traceback(out)
    assert out.status == 1, out.stderr
    head = re.match(re.escape(out.file) + r":(\d+):(\d+): error: (\S.*)$", out.lines[0])
    assert head, out.stderr
    for w in words:
        assert w in head[3], out.stderr


def test_set_of_an_unknown_config_message(tmp_path):
    out = diagnose(tmp_path, VALID, "--set", "gama=0.5")
    _head(out, "--set", "'gama'", "did you mean 'gamma'")


def test_set_of_an_unknown_config(tmp_path):
    out = diagnose(tmp_path, VALID, "--set", "gama=0.5")
    expect_format(out, "--set", "'gama'", "did you mean 'gamma'")


def test_set_with_a_value_that_is_not_a_number(tmp_path):
    out = diagnose(tmp_path, VALID, "--set", "T=abc")
    assert_diagnostic(out, 1, 8, "T=abc", "'abc'")


def test_set_of_an_int_config_to_a_float(tmp_path):
    out = diagnose(tmp_path, VALID, "--set", "T=2.5")
    assert_diagnostic(out, 1, 8, "T=2.5", "int")


def test_set_of_an_int_config_to_a_bool(tmp_path):
    out = diagnose(tmp_path, VALID, "--set", "T=true")
    assert_diagnostic(out, 1, 8, "T=true", "bool")


def test_set_of_a_float_config_to_a_bool(tmp_path):
    out = diagnose(tmp_path, VALID, "--set", "gamma=false")
    assert_diagnostic(out, 1, 15, "gamma=false", "bool")


def test_set_that_makes_a_dim_bound_zero(tmp_path):
    out = diagnose(tmp_path, VALID, "--set", "T=0")
    assert_diagnostic(out, 2, 9, "'t'", "bound 0")


def test_set_of_a_float_config_to_an_int_is_fine(tmp_path):
    out = diagnose(tmp_path, VALID, "--set", "gamma=1", "--set", "T=6")
    assert (out.status, out.stderr) == (0, "")


def test_set_of_the_implicit_seed(tmp_path):
    out = diagnose(tmp_path, VALID, "--set", "seed=7")
    assert (out.status, out.stderr) == (0, "")


def test_set_of_the_implicit_seed_to_a_float_message(tmp_path):
    out = diagnose(tmp_path, VALID, "--set", "seed=0.5")
    _head(out, "seed", "0.5")


def test_set_of_the_implicit_seed_to_a_float(tmp_path):
    out = diagnose(tmp_path, VALID, "--set", "seed=0.5")
    expect_format(out, "seed")


def test_set_of_a_declared_seed_to_a_float(tmp_path):
    out = diagnose(tmp_path, "config seed = 3\n" + src(VALID), "--set", "seed=0.5", raw=True)
    assert_diagnostic(out, 1, 8, "seed", "0.5")


@pytest.mark.parametrize("value", ["T", "=3", "T="])
def test_malformed_set_is_a_usage_error(tmp_path, value):
    out = diagnose(tmp_path, VALID, "--set", value)
    assert_no_traceback(out)
    assert out.status == 2, out.stderr
    assert "--set" in out.stderr and "NAME=VALUE" in out.stderr, out.stderr


def test_env_for_a_program_without_that_env_message(tmp_path):
    out = diagnose(tmp_path, VALID, "--env", "E=cartpole")
    _head(out, "--env", "'E'")


def test_env_for_a_program_without_that_env(tmp_path):
    out = diagnose(tmp_path, VALID, "--env", "E=cartpole")
    expect_format(out, "--env", "'E'")


def test_malformed_env_is_a_usage_error(tmp_path):
    out = diagnose(tmp_path, VALID, "--env", "E")
    assert_no_traceback(out)
    assert out.status == 2, out.stderr
    assert "--env" in out.stderr, out.stderr


def test_set_on_run_reports_the_same_error(tmp_path):
    out = diagnose(tmp_path, VALID, "--set", "T=2.5", cmd="run")
    assert_diagnostic(out, 1, 8, "T=2.5", "int")


# ----------------------------------------------------------------------------- errors while running
def test_run_time_failure_is_exit_3_one_paragraph(tmp_path):
    out = diagnose(tmp_path, RUNTIME_FAILURE, cmd="run")
    assert_no_traceback(out)
    assert out.status == 3, out.stderr
    text = out.stderr.strip()
    assert text and "\n\n" not in text, out.stderr
    assert "out of range" in text and "t=2" in text and "x" in text, out.stderr


def test_a_failing_op_is_named_at_its_line_by_either_backend(tmp_path):
    """A tensor of two equations whose second fails at a point: the reference interpreter
    names the line of the op that failed (the take's), as the cpu runtime does, not the
    tensor's first equation."""
    program = """
    config T = 12, B = 4
    dim t < T
    dim b < B
    c[b] = f32(b) * 0.5
    s[0, b] = c[b]
    s[t, b] = s[t-1, b] * 0.5 + take(c[0:B], (t // 6) * 100)
    out s
    """
    said = []
    for backend in ("reference", "cpu"):
        out = diagnose(tmp_path, program, "--backend", backend, "--no-progress", cmd="run")
        assert out.status == 3, out.stderr
        said.append(out.stderr.strip())
    assert said[0] == said[1]
    assert "while computing s at t=6, b=0 (line 6): take: index 100" in said[0]


def test_run_time_failure_saves_outputs_and_is_still_exit_3(tmp_path):
    npz = tmp_path / "o.npz"
    out = diagnose(tmp_path, RUNTIME_FAILURE, "--outputs", str(npz), cmd="run")
    assert_no_traceback(out)
    assert out.status == 3, out.stderr
    assert "\n\n" not in out.stderr.strip()


def _subprocess(tmp_path, program, *args):
    path = tmp_path / "bad.rtl"
    path.write_text(src(program))
    return subprocess.run(
        timerlc_cmd() + [args[0], str(path), *args[1:]],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_run_time_failure_with_debug_shows_the_traceback_and_exits_3(tmp_path):
    proc = _subprocess(tmp_path, RUNTIME_FAILURE, "run", "--debug")
    assert "Traceback" in proc.stderr, proc.stderr
    assert proc.returncode == 3, proc.stderr


def test_program_error_in_a_real_process(tmp_path):
    proc = _subprocess(
        tmp_path,
        """
        config T = 4
        dim t < T
        reward[t] = f32(t)
        x[t] = rewrd[t] * 2.0
    """,
        "check",
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith(f"{tmp_path / 'bad.rtl'}:4:8: error: "), proc.stderr
    assert "'rewrd'" in lines[0] and "did you mean 'reward'" in lines[0], proc.stderr
    assert lines[1] == "x[t] = rewrd[t] * 2.0" and lines[2] == "       ^~~~~", proc.stderr
    assert proc.stdout == ""


def test_program_error_on_run_is_exit_1(tmp_path):
    out = diagnose(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = x[t-1] + 1.0
    """,
        cmd="run",
    )
    assert_diagnostic(out, 3, 8, "outside", "x[-1]")


@pytest.mark.xfail(
    not _HAS_SERIALIZE,
    strict=True,
    reason="BUG: `timerlc compile` crashes with ImportError (timerlc.ir.serialize does "
    "not exist) before it even reads the program (cli.compile imports it first)",
)
def test_program_error_on_compile_is_exit_1(tmp_path):
    out = diagnose(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = x[t-1] + 1.0
    """,
        "-o",
        str(tmp_path / "build"),
        cmd="compile",
    )
    assert_diagnostic(out, 3, 8, "outside", "x[-1]")
    assert not (tmp_path / "build" / "build.json").exists()


# ----------------------------------------------------------------------------- usage errors
def _usage(status, stderr, *words):
    assert "Traceback" not in stderr, stderr
    assert status == 2, stderr
    for w in words:
        assert w in stderr, stderr


@pytest.mark.parametrize("cmd", ["check", "run", "compile"])
def test_unknown_option(tmp_path, cmd):
    out = diagnose(tmp_path, VALID, "--bogus", cmd=cmd)
    _usage(out.status, out.stderr, "--bogus")


@pytest.mark.parametrize("cmd", ["check", "run"])
def test_missing_file(tmp_path, cmd):
    status, _, err = invoke(cmd, str(tmp_path / "nothere.rtl"))
    _usage(status, err, "nothere.rtl")


@pytest.mark.xfail(
    not _HAS_SERIALIZE,
    strict=True,
    reason="BUG: `timerlc compile` crashes with ImportError (timerlc.ir.serialize) "
    "before it reads the file",
)
def test_missing_file_on_compile(tmp_path):
    status, _, err = invoke("compile", str(tmp_path / "nothere.rtl"), "-o", str(tmp_path / "b"))
    _usage(status, err, "nothere.rtl")


def test_missing_file_argument(tmp_path):
    status, _, err = invoke("check")
    _usage(status, err)


def test_unknown_command(tmp_path):
    status, _, err = invoke("chek", "x.rtl")
    _usage(status, err, "chek")


def _gpu_here() -> bool:
    from timerlc.runtime.cuda import CupyDevice, DeviceUnavailable

    try:
        CupyDevice()
        return True
    except DeviceUnavailable:
        return False


@pytest.mark.skipif(_gpu_here(), reason="a GPU is here")
def test_run_on_a_backend_that_cannot_run_here(tmp_path):
    out = diagnose(tmp_path, VALID, "--backend", "cuda", cmd="run")
    _usage(out.status, out.stderr, "the cuda backend cannot run here")
    assert out.stderr.count("\n") == 1, out.stderr


def test_compile_for_the_cuda_backend_needs_no_gpu(tmp_path):
    out = diagnose(tmp_path, VALID, "--backend", "cuda", "-o", str(tmp_path / "b"), cmd="compile")
    assert out.status == 0, out.stderr
    assert (tmp_path / "b" / "kernels" / "cuda.cu").is_file()


def test_unknown_backend(tmp_path):
    out = diagnose(tmp_path, VALID, "--backend", "tpu", cmd="run")
    _usage(out.status, out.stderr, "tpu")


def test_bad_seed(tmp_path):
    out = diagnose(tmp_path, VALID, "--seed", "x", cmd="run")
    _usage(out.status, out.stderr, "--seed")


def test_bad_metrics_file_extension(tmp_path):
    out = diagnose(tmp_path, VALID, "--metrics", str(tmp_path / "m.txt"), cmd="run")
    _usage(out.status, out.stderr, "--metrics")


def test_run_of_a_folder_that_is_not_a_build(tmp_path):
    folder = tmp_path / "notabuild"
    folder.mkdir()
    status, _, err = invoke("run", str(folder))
    _usage(status, err, "notabuild")


# ----------------------------------------------------------------------------- files and failures
def test_program_file_that_is_not_utf8_is_a_usage_error(tmp_path):
    path = tmp_path / "bad.rtl"
    path.write_bytes(b"config T = 3\xff\ndim t < T\n")
    status, _, err = invoke("check", str(path))
    _usage(status, err, "UTF-8")


def test_a_utf8_byte_order_mark_is_ignored(tmp_path):
    path = tmp_path / "bom.rtl"
    path.write_bytes(b"\xef\xbb\xbf" + src(VALID).encode())
    status, _, err = invoke("check", str(path))
    assert status == 0, err


@pytest.mark.parametrize("option, name", [("--outputs", "o.npz"), ("--metrics", "m.csv")])
def test_a_file_in_a_missing_folder_is_a_usage_error_before_the_run(tmp_path, option, name):
    out = diagnose(tmp_path, VALID, option, str(tmp_path / "nodir" / name), cmd="run")
    _usage(out.status, out.stderr, "nodir")


def test_running_out_of_memory_is_a_run_failure(tmp_path, monkeypatch):
    program = "config N = 1000000\ndim t < 2\nx[t] = sum(ones([N, N]))\nout x\n"
    out = diagnose(tmp_path, program, cmd="run")  # known before the run
    assert_no_traceback(out)
    assert out.status == 3 and "needs 7450.6 GiB" in out.stderr, out.stderr
    from timerlc import files

    monkeypatch.setattr(files, "memory_available", lambda: None)  # found while running
    # (a buffer the run allocates: ``ones([N, N])`` alone is computed where it is read, a
    # view of one value, and its sum would run for hours)
    program = "config N = 500000\ndim t < 2\ny[t] = ones([N, N]) * f32(t)\nout y\n"
    out = diagnose(tmp_path, program, cmd="run")
    assert_no_traceback(out)
    assert out.status == 3 and "out of memory" in out.stderr, out.stderr


def test_a_recurrence_too_big_to_schedule_is_a_program_error_on_run(tmp_path):
    # outward from a seed in the middle: no loop orders it, and it has too many points to
    # run one by one
    program = """
        config T = 300001
        dim t < T
        x[t] = 1.0 when t == T // 2
        x[t] = x[t+1] * 0.5 when t < T // 2
        x[t] = x[t-1] * 0.5
        out x
    """
    out = diagnose(tmp_path, program, cmd="run")
    assert_diagnostic(out, 3, 1, "cannot schedule", "points")


def test_an_environment_returning_the_wrong_shape_is_a_run_failure(tmp_path):
    program = """
        config T = 3
        dim b < 2
        dim t < T
        env E = "env_plugins:make_wrong_obs_shape" batch b
        o[b, 0] = E.reset()
        o[b, t+1], r[b, t], d[b, t] = E.step(0)
        out o
    """
    for backend in ("cpu", "reference"):
        out = diagnose(tmp_path, program, "--backend", backend, cmd="run")
        assert_no_traceback(out)
        assert out.status == 3, out.stderr
        assert "'E'" in out.stderr and "[2, 2]" in out.stderr and "[2, 1]" in out.stderr
        assert "while computing o" in out.stderr and "(line 5)" in out.stderr, out.stderr


def test_compiling_into_a_build_folder_drops_what_an_earlier_build_left(tmp_path):
    build = tmp_path / "b"
    diagnose(tmp_path, VALID, "-o", str(build), "--dump-ir", cmd="compile")
    assert (build / "plan.json").exists() and (build / "ir").is_dir()
    out = diagnose(tmp_path, VALID, "-o", str(build), "--backend", "reference", cmd="compile")
    assert out.status == 0, out.stderr
    assert not (build / "plan.json").exists() and not (build / "ir").exists()


def test_a_run_failure_names_the_tensor_on_both_backends(tmp_path):
    # v's node is also read by s: the cpu plan stores it (not v's copy of it), under v's name
    program = """
        config T = 6
        dim t < T
        idx[t] = t
        v[t] = arange(4)[idx]
        s[t] = f32(v)
        out v
        metric s
    """
    for backend in ("cpu", "reference"):
        out = diagnose(tmp_path, program, "--backend", backend, cmd="run")
        assert out.status == 3, out.stderr
        assert "while computing v at t=4 (line 4)" in out.stderr, (backend, out.stderr)


def _a_bug(*args, **kwargs):
    raise TypeError("unsupported operand type(s) for +: 'int' and 'NoneType'")


def test_an_internal_error_is_one_line_and_exit_3_not_a_traceback(tmp_path, monkeypatch):
    """A bug of the compiler's own (an exception no stage turned into a diagnostic) is not the
    program's error: one line naming it an internal error, exit 3 (a failure, not status 1, the
    program's errors', which Python's uncaught exception would give), the traceback only on
    request (TIMERLC_DEBUG=1, or ``run --debug``)."""
    from timerlc import compiler

    monkeypatch.delenv("TIMERLC_DEBUG", raising=False)
    monkeypatch.setattr(compiler, "compile_source", _a_bug)
    for cmd in ("compile", "run"):
        out = diagnose(tmp_path, VALID, cmd=cmd)
        assert_no_traceback(out)
        assert out.status == 3, out.stderr
        assert out.stderr == (
            "timerlc: internal error: TypeError: unsupported operand type(s) for +: 'int' and "
            "'NoneType'; this is a bug in timerlc, not in your program; please report it "
            "(TIMERLC_DEBUG=1 shows the traceback)\n"
        )
    out = diagnose(tmp_path, VALID, "--debug", cmd="run")
    assert out.status == 3 and "Traceback" in out.stderr and "in _a_bug" in out.stderr
    assert out.stderr.endswith("please report it\n"), out.stderr
    monkeypatch.setenv("TIMERLC_DEBUG", "1")
    out = diagnose(tmp_path, VALID, cmd="compile")
    assert out.status == 3 and "Traceback" in out.stderr and "in _a_bug" in out.stderr


def test_running_out_of_host_memory_while_compiling_is_exit_3_in_one_line(tmp_path, monkeypatch):
    """A MemoryError outside a run (the compile's: a run's own are run failures) is a failure,
    not the program's error nor timerlc's: one line, exit 3."""
    from timerlc import compiler

    def no_memory(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(compiler, "compile_source", no_memory)
    out = diagnose(tmp_path, VALID, cmd="compile")
    assert_no_traceback(out)
    assert (out.status, out.stderr) == (3, "timerlc: error: out of memory\n")


def test_an_internal_error_while_running_keeps_the_metrics_and_the_outputs(tmp_path, monkeypatch):
    """A bug of timerlc's in the middle of a run loses nothing either: the metrics written so
    far stay, the outputs computed so far are saved with their masks (as after a run
    failure), and the error is the internal error's one line, exit 3."""
    from timerlc.runtime import cpu

    calls = {"n": 0}
    real = cpu.CpuRuntime.emit

    def flaky(self, *args, **kwargs):  # (a metric's point: one an iteration of t's loop)
        calls["n"] += 1
        if calls["n"] == 10:
            raise TypeError("a bug at the tenth point")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cpu.CpuRuntime, "emit", flaky)
    monkeypatch.delenv("TIMERLC_DEBUG", raising=False)
    npz, csv = tmp_path / "o.npz", tmp_path / "m.csv"
    program = """
        config T = 30
        dim t < T
        x[0] = 1.0
        x[t+1] = x[t] * 0.5 + 1.0
        out x
        metric x
    """
    out = diagnose(tmp_path, program, "--outputs", str(npz), "--metrics", str(csv), cmd="run")
    assert_no_traceback(out)
    assert out.status == 3, out.stderr
    lines = out.stderr.splitlines()
    assert lines[-1].startswith("timerlc: internal error: TypeError: a bug at the tenth point")
    assert "saved to" in lines[0] and "__valid__" in lines[0], out.stderr
    import numpy as np

    saved = np.load(npz)
    assert saved["x.__valid__"].any() and not saved["x.__valid__"].all()
    rows = csv.read_text().splitlines()
    assert rows[0] == "name,t,value" and len(rows) == 10, rows  # (the header, 9 points)


def test_the_console_script_exits_with_its_command_s_status_and_all_it_wrote(tmp_path):
    """``cli.main`` ends the process at once (``os._exit``) once its output is flushed:
    each exit status as the command gave it (0, 1 a program error, 2 a usage error), a long
    output through a pipe whole; under a profiler, Python's own exit (the profile is
    written)."""
    import sys
    from pathlib import Path

    from rtl_helpers import cli

    def run(*args, cmd=None):
        return subprocess.run(
            (cmd or timerlc_cmd()) + [str(a) for a in args],
            capture_output=True,
            text=True,
            check=False,
        )

    bad = tmp_path / "bad.rtl"
    bad.write_text("dim i < \n")
    got = run("check", bad)
    assert got.returncode == 1 and "bad.rtl:1" in got.stderr, got.stderr
    got = run("run", tmp_path / "none.rtl")
    assert got.returncode == 2 and "none.rtl" in got.stderr
    program = Path(__file__).resolve().parent.parent / "programs" / "ppo.rtl"
    build = tmp_path / "build"
    assert run("compile", program, "-o", build).returncode == 0
    got = run("inspect", build / "plan.json", "--format", "json")  # (past a pipe's 64 KB)
    want = cli("inspect", build / "plan.json", "--format", "json").stdout
    assert got.returncode == 0 and got.stdout == want and len(want) > 100_000
    prof = tmp_path / "check.prof"
    profiled = [sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "timerlc"]
    assert run("check", program, cmd=profiled).returncode == 0 and prof.stat().st_size > 0
