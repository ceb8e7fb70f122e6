"""Generated code (docs/codegen.md): the kernels LLVM compiles from the plan, against the
reference interpreter and NumPy, op by op, on the values where their semantics are subtle
(integer division by zero and of the smallest int, float remainders' signs, casts of nan and
infinities, rounding half to even, nan in min/max/argmax), and the whole-item functions of
the loop tree (failures, callbacks, the budget of loop steps)."""

from __future__ import annotations

import itertools
import math
import os
from pathlib import Path

import numpy as np
import pytest
from rtl_helpers import src, table

from timerlc.codegen import kir
from timerlc.compiler import compile_plan, generate_code, run_passes
from timerlc.diagnostics import RunError, Source
from timerlc.frontend.check import check_source
from timerlc.llvm.render import const
from timerlc.plan.items import PlanError
from timerlc.reference.interpreter import outputs, run_graph
from timerlc.runtime.cpu import CpuRuntime

FLOATS = [
    0.0,
    -0.0,
    1.5,
    -1.5,
    2.5,
    -2.5,
    7.0,
    -7.0,
    0.5,
    1e30,
    -1e-30,
    math.inf,
    -math.inf,
    math.nan,
]
INTS = [0, 1, -1, 7, -7, 2, -2, 3, -(2**31), 2**31 - 1, 100, -100]


def native(text: str, reference: bool = True, **sets):
    """Run a program natively and on the reference: (native runtime, reference outputs,
    the generated code); without ``reference``, natively only (its outputs None)."""
    overrides = {k: str(v) for k, v in sets.items()}
    graph = check_source(Source("p.rtl", src(text)), overrides=overrides)
    want = outputs(run_graph(graph)) if reference else None
    gen = generate_code(compile_plan(run_passes(graph)))
    rt = CpuRuntime(gen.plan, native=gen.text)
    rt.run()
    return rt, want, gen


def pairs(values):
    a = [x for x in values for _ in values]
    b = [y for _ in values for y in values]
    return a, b


def assert_same(got: np.ndarray, want: np.ndarray, what: str):
    assert got.dtype == want.dtype and got.shape == want.shape, what
    if want.dtype.kind == "f":
        same = (got == want) | (np.isnan(got) & np.isnan(want))
        assert same.all(), f"{what}: {got[~same][:5]} != {want[~same][:5]}"
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def test_every_example_program_runs_almost_all_natively():
    """Guards against statements falling back to the interpreter unnoticed (the ones left:
    environment calls, random draws, donated memory)."""
    from pathlib import Path

    programs = Path(__file__).resolve().parent.parent / "programs"
    for path in sorted(programs.glob("*.rtl")):
        graph = check_source(Source(str(path), path.read_text()))
        gen = generate_code(compile_plan(run_passes(graph)))
        reasons = set(gen.interpreted.values())
        known = {  # what the code generator does not lower yet (docs/codegen.md)
            "an environment call runs in Python",
            "a slice whose length depends on the point",
            "the orthogonal initializer (a QR on the host)",
        }
        assert reasons <= known, (path.stem, reasons - known)
        assert len(gen.kernels) >= 0.9 * len(gen.plan.statements), (path.stem, reasons)


@pytest.mark.parametrize("op", ["+", "-", "*", "//", "%", "minimum", "maximum", "**"])
def test_integer_binary_ops_equal_numpy(op):
    a, b = pairs(INTS)
    if op == "**":
        a, b = pairs([0, 1, -1, 2, -2, 3, 7, -7])
    expr = f"{op}(a, b)" if op.isalpha() else f"a {op} b"
    text = f"config K = {len(a)}\ndim k < K\n" + table("a", a, "i32") + table("b", b, "i32")
    text += f"y[k] = {expr}\nout y\n"
    rt, want, gen = native(text)
    assert any(k.name == f"s{gen.plan.tensor('y')[0]}" for k in gen.kernels)
    assert_same(rt.value("y"), want["y"], op)


@pytest.mark.parametrize("op", ["+", "-", "*", "/", "//", "%", "minimum", "maximum", "**"])
def test_float_binary_ops_equal_numpy(op):
    a, b = pairs(FLOATS)
    if op == "**":  # NumPy's x ** 0.5 at one point is sqrt(x): nan, not C's inf, at -inf
        a, b = zip(*[(x, y) for x, y in zip(a, b) if not (y == 0.5 and x in (-math.inf, 0.0))])
    expr = f"{op}(a, b)" if op.isalpha() else f"a {op} b"
    for dtype in ("f32", "f64"):
        text = f"config K = {len(a)}\ndim k < K\n" + table("a", a, dtype) + table("b", b, dtype)
        text += f"y[k] = {expr}\nout y\n"
        rt, want, _ = native(text)
        if op == "**":  # libm's pow and NumPy's may differ in the last place
            np.testing.assert_allclose(
                rt.value("y"), want["y"], rtol=2e-7 if dtype == "f64" else 1e-6
            )
        else:
            assert_same(rt.value("y"), want["y"], f"{op} {dtype}")


@pytest.mark.parametrize("op", ["<", "<=", ">", ">=", "==", "!="])
def test_comparisons_with_nan_equal_numpy(op):
    a, b = pairs(FLOATS)
    text = f"config K = {len(a)}\ndim k < K\n" + table("a", a, "f32") + table("b", b, "f32")
    text += f"y[k] = a {op} b\nout y\n"
    rt, want, _ = native(text)
    assert_same(rt.value("y"), want["y"], op)


@pytest.mark.parametrize(
    "fn, exact",
    [
        ("floor", True),
        ("ceil", True),
        ("round", True),
        ("sqrt", True),
        ("abs", True),
        ("sign", True),
        ("exp", False),
        ("log", False),
        ("tanh", False),
        ("sigmoid", False),
        ("sin", False),
        ("cos", False),
        ("log1p", False),
    ],
)
def test_float_unary_ops_equal_numpy(fn, exact):
    values = FLOATS + [0.49999997, 1.5000001, 3.5, -3.5, 100.0, -100.0, 1e-8]
    for dtype in ("f32", "f64"):
        text = f"config K = {len(values)}\ndim k < K\n" + table("a", values, dtype)
        text += f"y[k] = {fn}(a)\nout y\n"
        rt, want, _ = native(text)
        if exact:
            assert_same(rt.value("y"), want["y"], f"{fn} {dtype}")
        else:  # libm against NumPy's own: within a few units in the last place
            np.testing.assert_allclose(
                rt.value("y"), want["y"], rtol=4e-7 if dtype == "f32" else 1e-15, atol=1e-30
            )


def test_f32_tanh_is_within_8_ulp_everywhere():
    # the generated f32 tanh is a rational approximation in f32 (llvm/render.py), not
    # NumPy's: within 8 units in the last place of the exact value, odd, nan for nan
    text = "config K = 40001\ndim k < K\ny[k] = tanh((f32(k) - 20000.0) * 0.0005)\nout y\n"
    rt, _, _ = native(text, reference=False)  # (against the exact values)
    x = (np.arange(40001, dtype=np.float32) - np.float32(20000.0)) * np.float32(0.0005)
    exact = np.tanh(x.astype(np.float64))
    ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    err = np.abs(rt.value("y").astype(np.float64) - exact) / ulp
    assert err.max() <= 8, f"{err.max()} ulp at x = {x[err.argmax()]}"
    special = [0.0, -0.0, 1e-30, -1e-8, 20.0, 100.0, -100.0, math.inf, -math.inf, math.nan]
    text = f"config K = {len(special)}\ndim k < K\n" + table("a", special, "f32")
    rt, want, _ = native(text + "y[k] = tanh(a)\nout y\n")
    assert_same(rt.value("y"), want["y"], "tanh at special values")


@pytest.mark.parametrize("fn", ["log", "log1p"])
def test_f32_log_and_log1p_are_within_1_ulp_everywhere(fn):
    # the generated f32 log and log1p are computed in f64 from the bits (llvm/render.py),
    # not by the C library: within an ulp of the exact value from the smallest subnormal
    # to the largest f32, and NumPy's values at zero, -1, negatives, infinities and nan
    text = (
        "config K = 60001\ndim k < K\n"
        "x[k] = 2.0 ** ((f32(k) - 32500.0) * 0.0045) * (1.0 + f32(k % 7) * 0.1234567)\n"
        f"y[k] = {fn}(x)\nout x, y\n"
    )
    rt, _, _ = native(text, reference=False)  # (against the exact values, not the reference)
    x = rt.value("x").astype(np.float64)
    exact = np.log(x) if fn == "log" else np.log1p(x)
    ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    err = np.abs(rt.value("y").astype(np.float64) - exact) / ulp
    assert err.max() <= 1, f"{err.max()} ulp at x = {x[err.argmax()]}"
    special = [0.0, -0.0, -1.0, -0.5, -2.0, 1e-45, 1e-30, -1e-30, 1.0, 3e38, math.inf]
    special += [-math.inf, math.nan, 1e-8, -1e-8, 0.9999999, 1.0000001]
    text = f"config K = {len(special)}\ndim k < K\n" + table("a", special, "f32")
    rt, want, _ = native(text + f"y[k] = {fn}(a)\nout y\n")
    got, ref = rt.value("y"), want["y"]
    np.testing.assert_allclose(got, ref, rtol=2e-7, atol=0, err_msg=f"{fn} at special values")
    nan = np.isnan(ref)
    assert (np.isnan(got) == nan).all() and (np.signbit(got) == np.signbit(ref))[~nan].all()


def test_powers_of_constants_equal_numpy():
    # x ** 2 is x * x and x ** 1 is x (NumPy's fast path): exact, nan, infinities and -0
    values = FLOATS + [3e-23, 1e20, 1e-40]
    text = f"config K = {len(values)}\ndim k < K\n" + table("a", values, "f32")
    text += "y[k] = a ** 2.0\nz[k] = a ** (2.0 - 1.0)\nw[k] = (a + 1.0) ** 2\nout y, z, w\n"
    rt, want, gen = native(text)
    for name in ("y", "z", "w"):
        assert_same(rt.value(name), want[name], name)
    assert "pow(" not in "\n".join(kir.text(k) for k in gen.kernels)


@pytest.mark.parametrize("to", ["i32", "i64", "bool", "f32", "f64"])
def test_casts_equal_numpy(to):
    values = FLOATS + [2.0**31, -(2.0**31), 2.0**31 - 1, 3e9, -3e9, 2.0**63, -(2.0**63), 0.9, -0.9]
    for src_t in ("f32", "f64"):
        text = f"config K = {len(values)}\ndim k < K\n" + table("a", values, src_t)
        text += f"y[k] = {to}(a)\nout y\n"
        rt, want, _ = native(text)
        assert_same(rt.value("y"), want["y"], f"{src_t} -> {to}")
    text = f"config K = {len(INTS)}\ndim k < K\n" + table("a", INTS, "i64")
    text += f"y[k] = {to}(a)\nout y\n"
    rt, want, _ = native(text)
    assert_same(rt.value("y"), want["y"], f"i64 -> {to}")


def test_reductions_and_argmax_with_nan_equal_numpy():
    rows = [
        [1.0, 3.0, 3.0, -1.0],
        [math.nan, 2.0, math.nan, 0.0],
        [-math.inf] * 4,
        [2.0, 2.0, 1.0, 2.0],
    ]
    flat = [v for r in rows for v in r]
    text = f"config K = {len(flat)}\ndim k < K\n" + table("a", flat, "f32")
    text += "m = reshape(a[0:K], [4, 4])\n"
    text += "mx[r < 4] = max(take(m, r, 0))\nmn[r < 4] = min(take(m, r, 0))\n"
    text += "am[r < 4] = argmax(take(m, r, 0))\nan[r < 4] = argmin(take(m, r, 0))\n"
    text += "s[r < 4] = sum(take(m, r, 0))\nme[r < 4] = mean(take(m, r, 0))\n"
    text += "ls[r < 4] = logsumexp(take(m, r, 0))\n"
    # over the first axis (a column at a time: the kernel's other loop order)
    text += "cs = sum(m, 0)\ncm = max(m, 0)\ncn = min(m, 0)\nce = mean(m, 0)\ncp = prod(m, 0)\n"
    text += "out mx, mn, am, an, s, me, ls, cs, cm, cn, ce, cp\n"
    text = (
        text.replace("[r < 4]", "[r]")
        .replace("config K", "config R = 4, K")
        .replace("dim k < K", "dim k < K\ndim r < R")
    )
    rt, want, _ = native(text)
    for name in ("mx", "mn", "am", "an", "s", "cm", "cn", "cp"):
        assert_same(rt.value(name), want[name], name)
    np.testing.assert_allclose(rt.value("cs"), want["cs"], rtol=1e-6)
    np.testing.assert_allclose(rt.value("ce"), want["ce"], rtol=1e-6)
    np.testing.assert_allclose(rt.value("me"), want["me"], rtol=1e-6)
    np.testing.assert_allclose(rt.value("ls"), want["ls"], rtol=1e-6)


def test_random_draws_in_kernels_are_bit_identical_to_rng():
    """The draws of generated code (llvm/philox.py) are rng.py's, bit for bit, at every
    point: uniform, normal, gumbel, the initializers, a permutation, bernoulli (a uniform
    draw and a comparison after the noise pass)."""
    text = """
    config I = 3, B = 5, seed = 11
    dim i < I
    dim b < B
    u[i, b] = uniform([3])
    n[i, b] = normal([2])
    g[i, b] = categorical(f32(b) * stack([0.5, -1.0, 2.0, 0.0]))
    w[i] = glorot([3, 4])
    z[i] = uniform([2], lo=-2.0, hi=3.0)
    p[i] = permutation(7)
    c[i, b] = bernoulli(f32(b) * stack([0.1, 0.2, 0.25]))
    out u, n, g, w, z, p, c
    """
    rt, want, gen = native(text)
    assert not gen.interpreted, gen.interpreted
    assert want["c"].any() and not want["c"].all()
    for name in ("u", "n", "g", "w", "z", "p", "c"):
        got = rt.value(name)
        assert got.dtype == want[name].dtype and got.shape == want[name].shape, name
        assert got.tobytes() == want[name].tobytes(), name


def test_a_failing_index_in_a_kernel_names_the_point():
    text = """
    config K = 5
    dim k < K
    x[k] = f32(k)
    y[k] = take(x[0:K], 3 * k)
    out y
    """
    graph = check_source(Source("p.rtl", src(text)))
    with pytest.raises(RunError) as ref:
        run_graph(graph)
    gen = generate_code(compile_plan(run_passes(graph)))
    sid = gen.plan.tensor("y")[0]
    assert sid not in gen.interpreted  # the take runs in a kernel, which fails
    with pytest.raises(RunError) as got:
        CpuRuntime(gen.plan, native=gen.text).run()
    assert "k=2" in str(got.value) and "out of range" in str(got.value)
    assert "k=2" in str(ref.value)


def test_a_kernel_file_is_checked_against_its_plan():
    gen = generate_code(
        compile_plan(run_passes(check_source(Source("p.rtl", "y = 1.0\nout y\n"))))
    )
    with pytest.raises(PlanError, match="does not match the plan's hash"):
        CpuRuntime(gen.plan, native=gen.text + " ")
    other = generate_code(
        compile_plan(run_passes(check_source(Source("p.rtl", "y = 2.0\nout y\n"))))
    )
    with pytest.raises(PlanError, match="generated for another plan"):
        CpuRuntime(
            gen.plan.__class__(**{**_fields(gen.plan), "kernels": other.plan.kernels}),
            native=other.text,
        )


def _fields(plan) -> dict:
    import dataclasses

    return {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan) if f.init}


def test_an_exception_in_a_callback_stops_the_native_loop():
    """An environment's exception inside a native tree function comes out as itself, and
    nothing runs after it."""
    text = """
    config I = 4, B = 2, T = 3
    dim i < I
    dim b < B
    dim t < T
    env E = "tests.env_plugins:make_interrupts?at=5" batch b
    o[i, b, 0] = E.reset()
    o[i, b, t+1], r[i, b, t], d[i, b, t] = E.step((t + b) % 3)
    s[i] = sum(r[i, 0:B, 0:T])
    out s
    """
    graph = check_source(Source("p.rtl", src(text)))
    gen = generate_code(compile_plan(run_passes(graph)))
    assert gen.trees
    rt = CpuRuntime(gen.plan, native=gen.text)
    with pytest.raises(KeyboardInterrupt):
        rt.run()
    interpreted = CpuRuntime(gen.plan)
    with pytest.raises(KeyboardInterrupt):
        interpreted.run()
    np.testing.assert_array_equal(rt.computed("s"), interpreted.computed("s"))
    np.testing.assert_array_equal(rt.value("s"), interpreted.value("s"))


def test_loops_in_a_native_tree_function_cannot_run_on_and_on():
    text = """
    config I = 3, T = 4
    dim i < I
    dim t < T
    x[i, 0] = 0.0
    x[i, t+1] = x[i, t] + 1.0
    out x
    """
    gen = generate_code(compile_plan(run_passes(check_source(Source("p.rtl", src(text))))))
    rt = CpuRuntime(gen.plan, native=gen.text)
    rt.steps_left = 2
    with pytest.raises(PlanError, match="far more steps"):
        rt.run()


@pytest.mark.parametrize(
    "v, dtype",
    [(0.1, "f32"), (-0.0, "f64"), (math.inf, "f32"), (1e-45, "f32"), (7, "i64"), (True, "bool")],
)
def test_constants_render_exactly(v, dtype):
    text = const(v, dtype)
    if dtype in ("f32", "f64"):
        import struct

        bits = int(text, 16) if text.startswith("0x") else 0
        back = struct.unpack(">d", struct.pack(">Q", bits))[0]
        want = float(np.float32(v)) if dtype == "f32" else v
        assert back == want and math.copysign(1, back) == math.copysign(1, want)
    else:
        assert text in ("7", "true")


def test_the_listing_shows_kernels_and_trees():
    gen = generate_code(
        compile_plan(
            run_passes(
                check_source(
                    Source(
                        "p.rtl",
                        src("""
    config K = 4
    dim k < K
    x[k] = f32(k) * 2.0
    s = sum(x[0:K])
    out s
    """),
                    )
                )
            )
        )
    )
    text = "\n".join(kir.text(k) for k in gen.kernels)
    assert "for k in 0 ..< 4 (parallel):" in text and "s_" not in text


def test_a_build_keeps_its_machine_code(tmp_path):
    """`timerlc compile` leaves the machine code for this CPU in kernels/ (with the hash of
    its bytes), a run of the build loads it instead of compiling again, and a corrupt one
    is compiled again, not run."""
    from pathlib import Path

    from rtl_helpers import cli

    from timerlc.runtime.native import NativeModule
    from timerlc.runtime.plan import load_kernels, load_plan

    build = tmp_path / "build"
    program = Path(__file__).resolve().parent.parent / "programs" / "returns.rtl"
    assert cli("compile", program, "-o", build).exit_code == 0
    objs = sorted((build / "kernels").glob("cpu-*.o"))  # one per part compiled at once
    assert objs and all((build / "kernels" / (o.name + ".sha256")).is_file() for o in objs)
    plan = load_plan(build)
    text = load_kernels(build, plan)
    assert NativeModule(text, build / "kernels").cached
    obj = objs[-1]
    good = obj.read_bytes()
    obj.write_bytes(good[: len(good) // 2])  # a truncated object: its hash no longer holds
    again = NativeModule(text, build / "kernels")
    assert not again.cached and obj.read_bytes() == good
    assert cli("run", build, "--no-progress").exit_code == 0


def test_perf_map_names_each_kernel_at_its_address(tmp_path, monkeypatch):
    """With ``TIMERLC_PERF_MAP=1`` a module appends ``ADDRESS SIZE NAME`` lines for its
    functions to ``/tmp/perf-PID.map`` (Linux perf names code made at run time from it):
    each kernel at the address the module calls it at, the spans apart and in order."""
    from pathlib import Path

    from rtl_helpers import cli

    from timerlc.runtime import native
    from timerlc.runtime.plan import load_kernels, load_plan

    build = tmp_path / "build"
    program = Path(__file__).resolve().parent.parent / "programs" / "returns.rtl"
    assert cli("compile", program, "-o", build).exit_code == 0
    plan = load_plan(build)
    text = load_kernels(build, plan)
    maps = tmp_path / "perf.map"
    monkeypatch.setattr(native, "write_perf_map", _perf_map_to(native.write_perf_map, maps))
    monkeypatch.setenv("TIMERLC_PERF_MAP", "1")
    module = native.NativeModule(text, build / "kernels")
    rows = [line.split(" ") for line in maps.read_text().splitlines()]
    spans = [(int(a, 16), int(n, 16), name) for a, n, name in rows]
    names = {name: a for a, _, name in spans}
    kernels = [name for _, name, _ in plan.kernels.statements]
    assert kernels and all(names[k] == module.address(k) for k in kernels)
    assert all(a + n <= b for (a, n, _), (b, _, _) in itertools.pairwise(spans))
    assert all(n > 0 for _, n, _ in spans)
    monkeypatch.delenv("TIMERLC_PERF_MAP")
    maps.unlink()
    native.NativeModule(text, build / "kernels")
    assert not maps.exists()  # (only where asked)


def _perf_map_to(write, path):
    return lambda engine, text, _=None: write(engine, text, str(path))


def test_a_run_of_a_program_keeps_its_machine_code_in_the_user_s_cache(tmp_path, monkeypatch):
    """`timerlc run FILE.rtl` (no build folder) keeps the machine code in the user's cache
    (``$XDG_CACHE_HOME/timerlc/llvm``): the same run again loads it, and prints the same
    outputs; the cache keeps only the newest objects."""
    from pathlib import Path

    from rtl_helpers import cli

    from timerlc.runtime import native

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    program = Path(__file__).resolve().parent.parent / "programs" / "returns.rtl"
    lines, outs = [], []
    for k in range(2):
        out = tmp_path / f"o{k}.npz"
        r = cli("run", program, "--no-progress", "--profile", "--outputs", out)
        assert r.exit_code == 0, r.output
        lines.append(next(x for x in r.output.splitlines() if x.startswith("cpu runtime")))
        outs.append(dict(np.load(out)))
    assert "the kernels compiled for this CPU" in lines[0]
    assert "the kernels loaded, not compiled," in lines[1]
    assert outs[0].keys() == outs[1].keys() and all(
        np.array_equal(outs[0][k], outs[1][k]) for k in outs[0]
    )
    folder = tmp_path / "cache" / "timerlc" / "llvm"
    objs = sorted(folder.glob("cpu-*.o"))
    assert objs and all(Path(f"{o}.sha256").is_file() for o in objs)
    # the newest SHARED_KEPT objects stay (an object's hash goes with it)
    for k in range(5):
        old = folder / f"cpu-old{k}-0.o"
        old.write_bytes(b"x")
        Path(f"{old}.sha256").write_text("0\n")
        os.utime(old, (1000 + k, 1000 + k))
    monkeypatch.setattr(native, "SHARED_KEPT", len(objs) + 2)
    assert native.shared_cache() == folder
    left = sorted(o.name for o in folder.glob("cpu-*.o"))
    assert left == sorted([o.name for o in objs] + ["cpu-old3-0.o", "cpu-old4-0.o"])
    assert not (folder / "cpu-old0-0.o.sha256").exists()


def _program_plan(name: str, **sets):
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "programs" / f"{name}.rtl"
    overrides = {k: str(v) for k, v in sets.items()}
    graph = check_source(Source(str(path), path.read_text()), overrides=overrides)
    return generate_code(compile_plan(run_passes(graph)))


@pytest.mark.parametrize(
    "name, sets",
    [
        ("ppo", {"total_steps": 64, "B": 2, "T": 16}),
        ("reinforce", {"I": 2, "B": 4, "T": 8}),
        ("rnn_reinforce", {"I": 2, "B": 2, "T": 6}),
    ],
)
def test_a_run_compiles_only_what_its_trees_and_lone_statements_call(name, sets):
    """The kernels of statements that run only inside fused kernels are left out of the
    machine code a run compiles (``native.lean_text``: a fifth of PPO's functions), and a
    whole run never asks for one of them (else its first call would compile the whole
    text again: ``NativeModule.whole``)."""
    gen = _program_plan(name, **sets)
    rt = CpuRuntime(gen.plan, native=gen.text)
    fused = {sid for group in gen.plan.kernels.fused for sid in group}
    names = {n for sid, n, _ in gen.plan.kernels.statements if sid in fused}
    assert rt.module.left_out and rt.module.left_out <= names | {
        n
        for n in rt.module.left_out
        if n.startswith("k")  # (bodies only they call)
    }
    rt.run()
    assert rt.module._whole is None


def test_a_kernel_left_out_is_compiled_with_the_whole_text_at_its_first_call():
    """Where the runtime runs the fused statements one by one (the loop tree in Python, not
    as its native functions), their own kernels come from the whole text, compiled at the
    first call of one of them, and compute what the fused kernels do."""
    gen = _program_plan("ppo", total_steps=64, B=2, T=16)
    fused = CpuRuntime(gen.plan, native=gen.text)
    fused.run()
    alone = CpuRuntime(gen.plan, native=gen.text)
    assert alone.module.left_out and alone.module._whole is None
    alone.trees = {}
    alone.tree = alone._build(gen.plan.tree, ())
    alone.run()
    assert alone.module._whole is not None and not alone.module._whole.left_out
    for name, _, _ in gen.plan.outputs:
        np.testing.assert_allclose(alone.value(name), fused.value(name), rtol=1e-5, atol=1e-6)


def test_lean_text_keeps_what_the_roots_reach():
    from timerlc.runtime.native import lean_text

    text = """declare void @ext()
define internal void @tl_helper() {
  ret void
}

define void @k1(ptr %t) {
  call void @tl_helper()
  ret void
}

define void @s1(ptr %t) {
  call void @k1(ptr %t)
  ret void
}

define void @s2(ptr %t) {
  call void @k2(ptr %t)
  ret void
}

define void @k2(ptr %t) {
  ret void
}

define void @tl_cycles() {
  ret void
}

define void @tree0(ptr %t) {
  call void @s1(ptr %t)
  ret void
}
"""
    lean, out = lean_text(text, {"tree0"})
    assert out == {"s2", "k2"}
    assert "@s2(" not in lean and "define void @k2" not in lean
    for kept in ("@tree0(", "define void @s1", "define void @k1", "@tl_helper()", "@tl_cycles"):
        assert kept in lean, kept
    assert lean_text(text, {"tree0", "s2"}) == (text, frozenset())
    pointed = text + "@table = global ptr @s2\n"  # (a global that points at s2 keeps it)
    assert lean_text(pointed, {"tree0"})[1] == frozenset()  # (s2, and k2 that it calls)


def test_a_large_module_compiles_in_parts_that_link():
    """A module of many functions is split into parts compiled at once (forked processes);
    the parts' objects link: tree functions call kernels of the other part."""
    from timerlc.runtime.native import SPLIT_MIN_FUNCTIONS, split_module

    text = "config K = 3\ndim k < K\n"
    text += "".join(f"y{j}[k] = f32(k) * {j}.0 + 1.0\n" for j in range(SPLIT_MIN_FUNCTIONS))
    text += "z[k] = " + " + ".join(f"y{j}" for j in range(SPLIT_MIN_FUNCTIONS)) + "\nout z\n"
    rt, want, gen = native(text)
    assert len(split_module(gen.text, 2)) == 2
    assert_same(rt.value("z"), want["z"], "z")


def test_a_large_module_without_a_blas_compiles_its_gemm_loops_in_the_first_part(monkeypatch):
    """The gemm loops for a machine without a BLAS are compiled only there: in the first
    part of a split module, which the kernels of the other parts reach through the pointer
    the runtime sets; with a BLAS they are not compiled at all."""
    from timerlc.runtime import native as nat

    text = "config K = 8\ndim k < K\nw = reshape(f32(arange(4096)) * 0.001 - 2.0, [64, 64])\n"
    text += "".join(
        f"y{j}[k] = (f32(arange(64)) * 0.01 * {j}.0 + f32(k)) @ w\n"
        for j in range(nat.SPLIT_MIN_FUNCTIONS)
    )
    text += "z[k] = " + " + ".join(f"y{j}" for j in range(nat.SPLIT_MIN_FUNCTIONS)) + "\nout z\n"
    monkeypatch.setattr(nat, "cblas", lambda: None)
    rt, want, gen = native(text)
    assert rt.module.blas is None
    parts = nat.split_module(gen.text, 2)
    assert len(parts) == 2 and "@tl_gemm_loops_float(" in parts[0]
    assert "tl_gemm_loops" not in parts[1]
    np.testing.assert_allclose(rt.value("z"), want["z"], rtol=1e-5)
    assert all("tl_gemm_loops" not in p for p in nat.split_module(gen.text, 2, False))


def test_a_merge_checks_and_reads_only_where_its_input_applies():
    """`y[i]`'s second equation indexes out of range at i = 0, where the first applies: its
    check (and its reads) run inside its branch, not once for every call of the loop over
    i (a recurrence)."""
    text = """
    config I = 4
    dim i < I
    x[i] = f32(i) * stack([1.0, 2.0])
    y[0] = 0.0
    y[i] = y[i-1] + take(stack([1.0, 2.0, 3.0]), 3 - i) + sum(x[i-1])
    out y
    """
    rt, want, gen = native(text)
    assert gen.plan.tensor("y")[0] not in gen.interpreted
    np.testing.assert_array_equal(rt.value("y"), want["y"])


def test_matmuls_without_a_blas_run_the_library_loops(monkeypatch):
    """Where the runtime finds no CBLAS, a kernel's gemm calls go to the runtime library's
    loops (``tl_gemm_loops_*``, either operand transposed or not): the same results (tested
    here by hiding the BLAS; everywhere else it is found)."""
    from timerlc.runtime import native as nat

    monkeypatch.setattr(nat, "cblas", lambda: None)
    text = """
    config B = 8, K = 64
    dim b < B
    w = reshape(f32(arange(4096)) * 0.001 - 2.0, [64, 64])
    x[b] = f32(b) * 0.1 + f32(arange(64)) * 0.01
    y[b] = x[b] @ w
    z = reshape(f32(arange(2048)) * 0.01, [32, 64]) @ w
    zt = w.T @ reshape(f32(arange(2048)) * 0.01, [64, 32])
    out y, z, zt
    """
    rt, want, gen = native(text)
    assert rt.module.blas is None
    assert "gemm." in "\n".join(kir.text(k) for k in gen.kernels)  # the calls are there
    for name in ("y", "z", "zt"):
        np.testing.assert_allclose(rt.value(name), want[name], rtol=1e-5, atol=1e-5)


def test_a_product_in_a_branch_of_a_merge_computes_into_the_buffer():
    """A tensor of two equations, one a product (a weight's gradient ``where(j < J,
    x^T @ dy, 0)``): where the product's branch applies, the BLAS writes straight into the
    buffer (``lower._direct_input``), where it wrote a temporary that a loop then copied."""
    text = """
    config I = 5
    dim i < I
    x[i] = reshape(f32(arange(256)) * f32(i) * 0.01, [8, 32])
    w[0] = reshape(f32(arange(512)) * 0.002 - 0.5, [32, 16])
    w[i+1] = w[i] * 0.5 + 0.0001 * sum(g[i])
    g[0] = reshape(f32(arange(128)), [8, 16])
    g[i] = x[i] @ w[i]
    out g, w
    """
    rt, want, gen = native(text)
    (k,) = [k for k in gen.kernels if gen.plan.buffer(k.sid).name == "g"]
    listing = kir.text(k)
    (line,) = [x for x in listing.splitlines() if "= gemm." in x]
    assert line.strip().startswith(f"b{k.sid}_0["), listing  # (into the buffer)
    assert not [t for t in k.temps if t.size == 8 * 16], listing  # (no product's temporary)
    for name in ("g", "w"):
        np.testing.assert_allclose(rt.value(name), want[name], rtol=1e-6, atol=1e-6)


def _gemm_lines(k) -> tuple[list[str], list[str]]:
    """The gemm lines of kernel ``k``'s listing before its first vector loop (once a call,
    over the points at once) and after it (one product a point)."""
    lines = kir.text(k).splitlines()
    first = next((n for n, x in enumerate(lines) if "(parallel)" in x), len(lines))
    gemms = [(n, x) for n, x in enumerate(lines) if "= gemm." in x]
    return [x for n, x in gemms if n < first], [x for n, x in gemms if n > first]


def test_products_of_a_step_taken_at_all_points_or_none_run_over_the_points_at_once():
    """A recurrence's product per point under a condition that names no vector dim (its
    domain ``t >= 1``, a merge's inputs by ``t``: each holds at every ``b`` of a call or at
    none) is one product over the points, before the vector loops, under that condition
    (``lower._uniform_branch``; RNN REINFORCE's step back through time, 3.8 -> 0.3 us a
    call); the inputs in order, first match winning (``y``'s product at ``t < 3`` before
    the one at ``t < 5``). A condition that names a vector dim (``b == 0``) keeps one
    product a point. The values are the reference's."""
    text = """
    config T = 7, B = 12, H = 16
    dim b < B
    dim t < T
    w = reshape(f32(arange(H * H)) * 0.003 - 0.3, [H, H])
    v = reshape(f32(arange(H * H)) * 0.002 - 0.25, [H, H])
    x[b, t] = sin(f32(arange(H)) * 0.3 + f32(b) * 0.7 + f32(t) * 0.11)
    h[b, 0] = x[b, 0]
    h[b, t+1] = tanh(y[b, t] + q[b, t] + x[b, t]) when t == 0
    h[b, t+1] = tanh(y[b, t] + q[b, t] + u[b, t] + x[b, t])
    y[b, t] = h[b, t] @ w when t < 3
    y[b, t] = h[b, t] @ v.T when t < 5
    y[b, t] = zeros([H])
    u[b, t+1] = h[b, t+1] @ v * 0.5
    q[b, t] = h[b, t] @ w * 0.1 when b == 0
    q[b, t] = h[b, t] @ v * 0.1
    out h, y, q
    """
    rt, want, gen = native(text)
    by_name = {gen.plan.buffer(k.sid).name: k for k in gen.kernels}
    listing = kir.text(by_name["y"])
    once, each = _gemm_lines(by_name["y"])
    assert len(once) == 1 and "@ b1_0[0:]T" in once[0] and not each, listing  # (h @ v.T)
    assert "if (not((t < 3)) && ((t >= 3) && (t < 5))):" in listing, listing  # (its guard)
    assert _gemm_lines(by_name["q"]) == ([], []), kir.text(by_name["q"])  # (loops a point)
    for name in ("h", "y", "q"):
        np.testing.assert_allclose(rt.value(name), want[name], rtol=1e-5, atol=1e-6)
    # RNN REINFORCE's step back through time: its domain t >= 1 and its merge's input by t
    path = Path(__file__).resolve().parent.parent / "programs" / "rnn_reinforce.rtl"
    rt, _, gen = native(path.read_text(), reference=False, B=16, T=20, I=2)
    graph = check_source(Source("p.rtl", path.read_text()), {"B": "16", "T": "20", "I": "2"})
    ref = run_graph(run_passes(graph, optimize=False))
    want = {name: ref.value(name) for name in ("loss", "gnorm")}
    guarded = [k for k in gen.kernels if _gemm_lines(k)[0] and "  if (t >= 1):" in kir.text(k)]
    assert guarded and all(not _gemm_lines(k)[1] for k in guarded)
    for name in ("loss", "gnorm"):  # (the gradient goes through the step)
        np.testing.assert_allclose(rt.value(name), want[name], rtol=1e-4, atol=1e-6)


def test_the_ops_after_a_product_work_in_place_in_its_buffer():
    """A layer ``tanh(h @ w + c)``: the product goes straight into the statement's buffer
    and the bias and ``tanh`` are applied there in place (``lower._epilogue_product``), where
    it went into a temporary the size of the output; the product of a point and over the
    points of a vector dim. A product that the value reads twice, or at other elements (a
    transpose), keeps its temporary. The values are the reference's."""
    text = """
    config I = 3, B = 6
    dim i < I
    dim b < B
    w = reshape(f32(arange(64 * 32)) * 0.0005 - 0.5, [64, 32])
    c = f32(arange(32)) * 0.01
    h[i] = reshape(f32(arange(40 * 64)) * 0.001 * f32(i + 1), [40, 64])
    y[i] = tanh(h[i] @ w + c)
    v[i, b] = reshape(f32(arange(8 * 64)) * 0.002 - f32(b) * 0.1, [8, 64]) * f32(i + 1)
    z[i, b] = (1.0 - v[i, b][:, 0:32] * 2.0) * (v[i, b] @ w)
    p[i] = h[i][0:32] @ w
    q[i] = transpose(p[i]) + 1.0
    r[i] = tanh(h[i] @ (w * 2.0)) * (h[i] @ (w * 2.0))
    out y, z, q, r, h, v
    """
    rt, want, gen = native(text)
    by_name = {gen.plan.buffer(k.sid).name: k for k in gen.kernels}
    for name in ("y", "z"):
        k = by_name[name]
        listing = kir.text(k)
        (line,) = [x for x in listing.splitlines() if "= gemm." in x]
        assert line.strip().startswith(f"b{k.sid}_0["), listing  # (into the buffer)
        assert not [t for t in k.temps if t.size >= 8 * 32], listing  # (no temporary)
    for name in ("q", "r"):
        assert [t for t in by_name[name].temps if t.size >= 32 * 32]
    for name in ("y", "z", "q", "r"):
        np.testing.assert_allclose(rt.value(name), want[name], rtol=1e-5, atol=1e-6)


def test_a_check_that_cannot_fail_is_not_made():
    """A slice whose start its ops bound inside the array (PPO's minibatch at
    ``MBS * (j % MB)``) makes no check (``lower._holds``), nor one whose start the range of
    a vector dim's loop bounds (``_Lowering.dim_ranges``: ``j * 2`` for ``j < 8``, an
    environment's observation ``obs[b]`` at each of a rollout's ``b``; the index taken as it
    is, not wrapped from the end); an index computed from values keeps its check."""
    text = """
    config J = 8
    dim j < J
    x = f32(arange(20))
    y[j] = x[(j % 4) * 5 : (j % 4) * 5 + 5] * f32(j)
    z[j] = x[j * 2 : j * 2 + 5] * f32(j)
    u[j] = x[j] * 2.0
    k[j] = i32(floor(f32(j) * 1.5))
    v[j] = x[k[j]] * f32(j)
    out y, z, u, v
    """
    graph = check_source(Source("p.rtl", src(text)))
    gen = generate_code(compile_plan(run_passes(graph)))
    by_name = {gen.plan.buffer(k.sid).name: k for k in gen.kernels}
    fails = {
        name: any(isinstance(x, kir.Fail) for x in kir.walk_tree(k.body))
        for name, k in by_name.items()
    }
    assert [fails[n] for n in "yzuv"] == [False, False, False, True]
    assert "? " not in kir.text(by_name["u"])  # (no wrap of a negative index)
    rt = CpuRuntime(gen.plan, native=gen.text)
    rt.run()
    want = outputs(run_graph(graph))
    for name in "yzuv":
        np.testing.assert_array_equal(rt.value(name), want[name])


def test_a_gather_at_a_permutation_s_indices_needs_no_check():
    """Indices that are a permutation of ``range(n)`` (or a slice of one, as PPO's
    minibatches are) lie in range: a take at them makes no check of them
    (``lower.IntRanges``; the index is clamped into range instead, so a wrong value, a bug
    elsewhere, still reads inside the array); indices computed otherwise keep theirs, but
    where the ranges of the values stored decide them (``codegen.checks``: a floor modulo
    by N lies in ``[0, N)``), and there the check goes after lowering."""
    text = """
    config I = 3, N = 12
    dim i < I
    x[i] = f32(arange(N)) * f32(i + 1)
    p[i] = permutation(N)
    s[i] = p[i][2:8]
    y[i] = take(x[i], s[i], 0)
    q[i] = (i32(arange(6)) * 2 + i) % N
    z[i] = take(x[i], q[i], 0)
    u[i] = i32(f32(arange(6)) * 1.5) + i
    w[i] = take(x[i], u[i], 0)
    out y, z, w
    """
    rt, want, gen = native(text)

    def checks_elements(k) -> bool:  # (a failure inside a loop: a check per element)
        loops = [s for s in kir.walk_tree(k.body) if isinstance(s, kir.For)]
        return any(isinstance(x, kir.Fail) for s in loops for x in kir.walk_tree(s.body))

    fails = {gen.plan.buffer(k.sid).name: checks_elements(k) for k in gen.kernels}
    assert fails["y"] is False and fails["z"] is False and fails["w"] is True
    for name in ("y", "z", "w"):
        np.testing.assert_array_equal(rt.value(name), want[name])


def test_kernels_of_the_same_shape_share_one_body():
    # the same ops on other buffers (each parameter's update) compile once: a body that
    # finds its buffers through a list of table entries, called by each kernel with its own
    text = (
        "config I = 5\ndim i < I\n"
        "x[0] = 1.0\nx[i+1] = x[i] * 0.5 + 1.0\n"
        "y[0] = 3.0\ny[i+1] = y[i] * 0.5 + 1.0\n"
        "out x, y\n"
    )
    rt, want, gen = native(text)
    for name in ("x", "y"):
        assert_same(rt.value(name), want[name], name)
    bodies = [line for line in gen.text.splitlines() if line.startswith("define i32 @k")]
    assert bodies, "no shared body"
    body = bodies[0].split("@", 1)[1].split("(", 1)[0]
    callers = [line for line in gen.text.splitlines() if f"call i32 @{body}(" in line]
    assert len(callers) >= 2


def test_a_profile_counts_the_native_calls_of_each_statement():
    # run --profile keeps the native tree functions: tl_launch counts each kernel call's
    # cycles, turned into seconds at the rate the counter ran during the run
    text = "config I = 50\ndim i < I\nx[0] = 1.0\nx[i+1] = tanh(x[i] * 0.5 + 1.0)\nout x\n"
    graph = check_source(Source("p.rtl", src(text)))
    gen = generate_code(compile_plan(run_passes(graph)))
    rt = CpuRuntime(gen.plan, native=gen.text, profile=True)
    assert rt.trees and rt.cycles is not None
    rt.run()
    np.testing.assert_allclose(rt.value("x"), outputs(run_graph(graph))["x"], rtol=1e-6)
    looped = [s.id for s in gen.plan.statements if s.loops and s.id in rt.calls]
    assert looped, rt.calls
    assert any(rt.calls[s] == 50 for s in looped), rt.calls
    assert all(rt.seconds[s] >= 0.0 for s in rt.calls)
    assert sum(rt.seconds.values()) > 0.0


@pytest.mark.parametrize("nb, nt", [(48, 70), (37, 64), (3, 1500)])
def test_layers_over_many_points_run_block_by_block(nb, nt):
    """A statement whose layers run over every point of its vector dims at once runs them
    block by block of its outermost vector dim (``lower._block``: each block's rows stay in
    the cache): the same values as the reference, with blocks that divide the extent
    (48 = 4 x 12 rows of 70 points), one value per block where the extent is prime (37),
    and blocks of one value larger than ``BLOCK_ROWS`` (3 x 1500)."""
    text = f"""
    config NB = {nb}, NT = {nt}
    dim b < NB
    dim t < NT
    w1 = reshape(f32(arange(512)) * 0.0015 - 0.4, [8, 64])
    w2 = reshape(f32(arange(4096)) * 0.0002 - 0.4, [64, 64])
    w3 = reshape(f32(arange(64)) * 0.01 - 0.3, [64, 1])
    x[b, t] = f32(b) * 0.01 - f32(t) * 0.001 + f32(arange(8)) * 0.1
    v[b, t] = squeeze(tanh(tanh(x[b, t] @ w1) @ w2) @ w3, 0)
    p[b, t] = x[b, t] @ w1
    out v, p
    """
    rt, want, gen = native(text)
    listing = "\n".join(kir.text(k) for k in gen.kernels)
    assert "for blk$ in" in listing
    for name in ("v", "p"):
        np.testing.assert_allclose(rt.value(name), want[name], rtol=2e-5, atol=2e-6)


def test_products_of_a_few_terms_are_expressions_per_element():
    """A product over at most ``SMALL_K`` terms (a layer over four observations, the
    gradient through two actions) is computed per element inside what reads it, with no
    gemm and no temporary: the same values as the reference, at a point and over a
    matrix, a vector times a matrix, a product whose operand is an expression."""
    text = """
    config B = 6
    dim b < B
    w = reshape(f32(arange(256)) * 0.003 - 0.4, [4, 64])
    m = reshape(f32(arange(200)) * 0.01 - 1.0, [100, 2])
    u = reshape(f32(arange(128)) * 0.02 - 1.3, [2, 64])
    x[b] = f32(b) * 0.1 - 0.2 + f32(arange(4)) * 0.3
    h[b] = tanh(x[b] @ w + 0.5)
    g = (m * 2.0 + 1.0) @ u * (1.0 - tanh(m @ u) * tanh(m @ u))
    one[b] = (f32(arange(1)) + f32(b)) @ reshape(f32(arange(64)), [1, 64])
    out h, g, one
    """
    rt, want, gen = native(text)
    listing = "\n".join(kir.text(k) for k in gen.kernels)
    assert "gemm" not in listing
    for name in ("h", "g", "one"):
        np.testing.assert_allclose(rt.value(name), want[name], rtol=2e-5, atol=2e-6)


def test_reductions_of_slices_whose_length_depends_on_the_point():
    """``sum``/``mean``/``max``/``min``/``discounted_sum`` of a slice whose length
    depends on the point (a window that grows, the rest of a rollout, a slice empty at some
    points) run in the kernel, a loop from the slice's start to its end: the reference's
    values (floats and ints; the mean of an empty slice is nan, as NumPy's)."""
    text = """
    config B = 3, T = 9
    dim b < B
    dim t < T
    x[b, t] = cos(0.7 * f32(t) + f32(b)) + 0.1 * f32(t)
    n[b, t] = (t * 3 + b) % 5 - 2
    grow[b, t] = mean(x[b, max(0, t - 3):t + 1])
    rest[b, t] = sum(x[b, t:T])
    late[b, t] = mean(x[b, t + 1:T])
    hi[b, t] = max(x[b, 0:t + 1])
    lo[b, t] = min(x[b, t:T])
    ds[b, t] = discounted_sum(x[b, t:min(t + 4, T)], 0.9)
    ni[b, t] = sum(n[b, 0:t])
    out grow, rest, late, hi, lo, ds, ni
    """
    rt, want, gen = native(text)
    assert "length depends" not in " ".join(gen.interpreted.values())
    for name in ("grow", "rest", "late", "hi", "lo", "ds", "ni"):
        got, ref = rt.value(name), want[name]
        assert got.dtype == ref.dtype, name
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6, err_msg=name)


def test_a_sum_over_an_axis_of_length_one_of_one_element():
    """The sum over axis 0 of a [1, 1] array (a value head's [B, 1] output over one
    environment: REINFORCE-TD at B = 1) is one term and no loop: the kernel adds it in
    (the code generator took the term for a loop to mark as the reduction's, and every
    compile of the program stopped on a TypeError). The reference's values, with the
    means and maxima of the same shapes."""
    text = """
    config I = 3
    dim i < I
    y[i] = reshape(f32(arange(1)) + 2.5 + f32(i), [1, 1])
    z[i] = reshape(f32(arange(2)) - 0.5 * f32(i), [1, 2])
    g[i] = sum(y[i], 0)
    m[i] = mean(z[i], 0)
    h[i] = max(y[i], 1)
    out g, m, h
    """
    rt, want, _ = native(text)
    for name in ("g", "m", "h"):
        got, ref = rt.value(name), want[name]
        assert got.dtype == ref.dtype and got.shape == ref.shape, name
        np.testing.assert_allclose(got, ref, rtol=1e-7, err_msg=name)


def test_a_reduction_that_no_point_changes_is_computed_once_per_call():
    """``max(x[0:K])`` and ``mean(x[0:K])`` in ``y[k] = x[k] - max(x[0:K]) + mean(x[0:K])``
    do not depend on ``k``: the kernel computes them before its loop over ``k``, once, not at
    each of the K points (K^2 terms)."""
    text = """
    config K = 300
    dim k < K
    x[k] = sin(f32(k) * 0.01)
    y[k] = x[k] - max(x[0:K]) + mean(x[0:K])
    out y
    """
    rt, want, gen = native(text)
    (k,) = [k for k in gen.kernels if gen.plan.buffer(k.sid).name == "y"]
    loop = next(s for s in k.body if isinstance(s, kir.For) and s.parallel)
    before = k.body[: k.body.index(loop)]
    sums = [s for s in before if isinstance(s, kir.For)]
    assert len(sums) == 2, kir.text(k)  # the max's and the mean's loops over x

    def loops(body) -> int:
        n = 0
        for s in body:
            if isinstance(s, kir.For):
                n += 1 + loops(s.body)
            elif isinstance(s, kir.If):
                n += loops(s.then) + loops(s.orelse)
        return n

    assert loops(loop.body) == 0, kir.text(k)  # nothing is summed at a point
    np.testing.assert_allclose(rt.value("y"), want["y"], rtol=1e-5, atol=1e-6)


def test_a_block_of_a_prime_extent_near_the_limit_is_found_at_once(tmp_path):
    """The blocks of a statement over many points take the largest divisor of its extent
    that fits a block (``lower.largest_divisor``); counting every number up to the extent
    took minutes at attention's B = 2^31 - 1 (a prime: no divisor but 1), a size within the
    limits (``cfgsweep``: every program's configs at extreme values). The compile for the
    cuda backend, whose blocks follow the scratch memory, in a minute at most."""
    import subprocess
    from pathlib import Path

    from rtl_helpers import timerlc_cmd

    from timerlc.codegen.lower import largest_divisor

    for n in (1, 2, 12, 97, 360, 1024, 4096, 65535):
        for cap in (0, 1, 5, 64, 1024, n, n + 1):
            want = max([d for d in range(1, n + 1) if n % d == 0 and d <= cap] or [1])
            assert largest_divisor(n, cap) == want, (n, cap)
    program = Path(__file__).parent.parent / "programs" / "attention.rtl"
    r = subprocess.run(
        timerlc_cmd()
        + ["compile", str(program), "--set", "B=2147483647", "--backend", "cuda"]
        + ["-o", str(tmp_path / "b")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr


def test_a_tiny_innermost_loop_is_written_out_so_the_loop_around_it_is_innermost():
    """A loop of at most ``TINY_TRIPS`` iterations over constants, with no loop inside, is
    rendered iteration by iteration (``render._tiny``): the two Gumbel draws of each of a
    rollout's points then sit in the points' loop, which LLVM's vectorizer takes. The draws
    are those of the loop, bit for bit (the same statements in the same order)."""
    from timerlc.codegen.kir import Bin, Const, Fn, For, Ref, Store
    from timerlc.llvm import render

    def i(n):
        return Const("i64", n)

    def loop(var, n, body):
        return For(var, i(0), i(n), tuple(body), True)

    draw = Fn("tl_rng_gumbel_f64", (Const("i32", 0), Const("i32", 7), Ref("p"), Ref("e")), "f64")
    store = Store("y", Bin("add", Bin("mul", Ref("p"), i(2), "i64"), Ref("e"), "i64"), draw)
    assert render._tiny(loop("e", 2, [store]))
    assert render._tiny(loop("e", render.TINY_TRIPS, [store]))
    assert not render._tiny(loop("e", render.TINY_TRIPS + 1, [store]))  # too many
    assert not render._tiny(loop("e", 2, [loop("f", 2, [store])]))  # a loop inside
    assert not render._tiny(For("e", i(0), Ref("n"), (store,)))  # not constant
    assert not render._tiny(loop("e", 2, [store] * (render.TINY_BODY + 1)))  # too long
    # a program's two draws a point (a categorical's noise): equal to the reference
    text = src(
        """
        config B = 300
        dim b < B
        logits[b] = f32(arange(2)) * 0.1 + f32(b) * 0.001
        a[b] = categorical(logits[b])
        out a
        """
    )
    graph = check_source(Source("p.rtl", text))
    gen = generate_code(compile_plan(run_passes(graph)))
    # (the kernel of the noise: its loop of two draws a point written out, two calls)
    (k,) = [k for k in gen.kernels if "tl_rng_gumbel_f64" in repr(k.body)]
    fn = gen.text.split(f"define i32 @{k.name}(", 1)[1].split("\n}\n", 1)[0]
    assert fn.count("call double @tl_rng_gumbel_f64(") == 2
    rt = CpuRuntime(gen.plan, native=gen.text)
    rt.run()
    np.testing.assert_array_equal(rt.value("a"), outputs(run_graph(graph))["a"])
