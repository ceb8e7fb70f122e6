"""Tests of timerlc.llvm.philox: the LLVM IR of the random draws, compiled for this CPU
the way the runtime compiles kernels (``NativeModule``: O3, vectorized), must give the bit
patterns of ``timerlc.rng`` for every draw (LANGUAGE.md section 7)."""

import ctypes
import math
import re

import numpy as np
import pytest
from test_rng import GOLDEN, KAT

from timerlc import rng
from timerlc.llvm import philox
from timerlc.runtime.native import NativeModule

M32 = 0xFFFFFFFF
BOUNDS = (None, 2**32)  # a point (P >> 32, P mod 2**32) has the point index P
P_EDGES = [0, 1, M32, 2**32, 2**32 + 1, 2**63 - 1, 2**63, 2**64 - 1]
KEYS = [  # (seed, site) of the public API
    (0, 0),
    (-1, M32),
    (1234, "policy/act"),
    (2**40 + 7, "actor.w"),
    (987654321, 2**31),
]
NP_TYPE = {"i1": np.bool_, "i32": np.int32, "i64": np.int64, "float": np.float32}
NP_TYPE["double"] = np.float64
BITS = {np.float32: np.uint32, np.float64: np.uint64, np.int32: np.uint32, np.bool_: np.bool_}
KEY = ["i32", "i32", "i64", "i64"]  # seed, site, P, E


# ------------------------------------------------------------------ native wrappers
def _loop(fn: str, ret: str, params: list[str]) -> str:
    """``void @t_<fn>(i64 %n, ptr %a0, ..., ptr %out)``: ``out[i] = fn(a0[i], ...)``."""
    ptrs = "".join(f", ptr %a{k}" for k in range(len(params)))
    body = []
    for k, t in enumerate(params):
        body += [
            f"  %q{k} = getelementptr {t}, ptr %a{k}, i64 %i",
            f"  %v{k} = load {t}, ptr %q{k}",
        ]
    args = ", ".join(f"{t} %v{k}" for k, t in enumerate(params))
    body.append(f"  %r = call {ret} @{fn}({args})")
    store_t, value = ret, "%r"
    if ret == "i1":
        store_t, value = "i8", "%r8"
        body.append("  %r8 = zext i1 %r to i8")
    body += [
        f"  %o = getelementptr {store_t}, ptr %out, i64 %i",
        f"  store {store_t} {value}, ptr %o, align 4",
    ]
    return "\n".join(
        [
            f"define void @t_{fn}(i64 %n{ptrs}, ptr %out) {{",
            "entry:",
            "  %none = icmp eq i64 %n, 0",
            "  br i1 %none, label %done, label %loop",
            "loop:",
            "  %i = phi i64 [ 0, %entry ], [ %i1, %loop ]",
            *body,
            "  %i1 = add i64 %i, 1",
            "  %more = icmp ult i64 %i1, %n",
            "  br i1 %more, label %loop, label %done",
            "done:",
            "  ret void",
            "}",
        ]
    )


LOOPS = {  # function -> (return type, parameter types)
    "tl_rng_philox": ("<4 x i32>", ["i32"] * 6),
    "tl_rng_block": ("<4 x i32>", KEY),
    "tl_rng_log64": ("double", ["double"]),
    "tl_rng_sincos_turns53": ("{ double, double }", ["i64"]),
    "tl_rng_normal_lanes": ("double", ["i32"] * 4),
    "tl_rng_bits": ("i32", KEY),
    "tl_rng_uniform_f32": ("float", KEY),
    "tl_rng_uniform_f64": ("double", KEY),
    "tl_rng_uniform_range_f32": ("float", KEY + ["float", "float"]),
    "tl_rng_uniform_range_f64": ("double", KEY + ["double", "double"]),
    "tl_rng_normal_f32": ("float", KEY),
    "tl_rng_normal_f64": ("double", KEY),
    "tl_rng_normal_affine_f32": ("float", KEY + ["float", "float"]),
    "tl_rng_normal_affine_f64": ("double", KEY + ["double", "double"]),
    "tl_rng_gumbel_f64": ("double", KEY),
    "tl_rng_bernoulli": ("i1", KEY + ["double"]),
}

_CATEGORICAL = """
define void @t_categorical_T(i64 %rows, ptr %seed, ptr %site, ptr %p, ptr %e0, ptr %logits,
                             i64 %stride, i64 %n, ptr %out) {
entry:
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %i1, %loop ]
  %sq = getelementptr i32, ptr %seed, i64 %i
  %s = load i32, ptr %sq
  %tq = getelementptr i32, ptr %site, i64 %i
  %t = load i32, ptr %tq
  %pq = getelementptr i64, ptr %p, i64 %i
  %pv = load i64, ptr %pq
  %eq = getelementptr i64, ptr %e0, i64 %i
  %ev = load i64, ptr %eq
  %row = mul i64 %i, %n
  %off = mul i64 %row, %stride
  %at = getelementptr LT, ptr %logits, i64 %off
  %r = call i32 @tl_rng_categorical_T(i32 %s, i32 %t, i64 %pv, i64 %ev, ptr %at,
                                      i64 %stride, i64 %n)
  %oq = getelementptr i32, ptr %out, i64 %i
  store i32 %r, ptr %oq
  %i1 = add i64 %i, 1
  %more = icmp ult i64 %i1, %rows
  br i1 %more, label %loop, label %done
done:
  ret void
}
"""
_EXTRA = "".join(
    _CATEGORICAL.replace("LT", lt).replace("_T", f"_{t}")
    for t, lt in [("f32", "float"), ("f64", "double")]
)
_EXTRA += """
define void @t_permutation(i64 %rows, ptr %seed, ptr %site, ptr %p, i64 %n, ptr %out,
                           ptr %scratch) {
entry:
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %i1, %loop ]
  %sq = getelementptr i32, ptr %seed, i64 %i
  %s = load i32, ptr %sq
  %tq = getelementptr i32, ptr %site, i64 %i
  %t = load i32, ptr %tq
  %pq = getelementptr i64, ptr %p, i64 %i
  %pv = load i64, ptr %pq
  %row = mul i64 %i, %n
  %oq = getelementptr i32, ptr %out, i64 %row
  call void @tl_rng_permutation(i32 %s, i32 %t, i64 %pv, i64 %n, ptr %oq, ptr %scratch)
  %i1 = add i64 %i, 1
  %more = icmp ult i64 %i1, %rows
  br i1 %more, label %loop, label %done
done:
  ret void
}

define void @t_sort(ptr %a, ptr %b, i64 %n) {
  call void @tl_rng_sort_hi32(ptr %a, ptr %b, i64 %n)
  ret void
}
"""


@pytest.fixture(scope="module")
def native():
    # The renderer declares the intrinsics its kernels use: the library must still parse.
    text = "declare double @llvm.sqrt.f64(double)\n" + philox.LIBRARY
    text += "\n".join(_loop(f, r, ps) for f, (r, ps) in LOOPS.items()) + _EXTRA
    return NativeModule(text)


def _run(native, fn: str, *args) -> np.ndarray:
    """``fn`` over equal-length arrays ``args`` (cast to its parameter types)."""
    ret, params = LOOPS[fn]
    arrays = [
        np.ascontiguousarray(np.asarray(a).astype(NP_TYPE[t], casting="unsafe"))
        if t != "i64"
        else np.ascontiguousarray(np.asarray(a, np.uint64))
        for a, t in zip(args, params)
    ]
    n = len(arrays[0])
    assert all(len(a) == n for a in arrays)
    if ret == "<4 x i32>":
        out = np.zeros((n, 4), np.uint32)
    elif ret == "{ double, double }":
        out = np.zeros((n, 2), np.float64)
    else:
        out = np.zeros(n, NP_TYPE[ret])
    sig = ctypes.CFUNCTYPE(None, ctypes.c_int64, *[ctypes.c_void_p] * (len(arrays) + 1))
    sig(native.address(f"t_{fn}"))(n, *[a.ctypes.data for a in arrays], out.ctypes.data)
    return out


def _key(seed, site) -> tuple[int, int]:
    """(seed32, site32) as the uint32 words the native functions take."""
    return rng.seed32(seed), rng.site_id(site) if isinstance(site, str) else site


def _as_i32(words) -> np.ndarray:
    return np.asarray(words, np.uint64).astype(np.uint32).view(np.int32)


def _same_bits(got, ref):
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.shape == ref.shape and got.dtype == ref.dtype, (got.dtype, ref.dtype)
    view = BITS.get(ref.dtype.type, ref.dtype.type)
    g, r = got.view(view), ref.view(view)
    bad = np.flatnonzero(g.ravel() != r.ravel())[:5]
    assert bad.size == 0, (
        f"elements {bad.tolist()} differ: {[hex(v) for v in g.ravel()[bad].tolist()]} != "
        f"{[hex(v) for v in r.ravel()[bad].tolist()]}"
    )


def _random_points(gen, count: int) -> np.ndarray:
    """Point indices: the edges, then uniform 64-bit, 32-bit and small ones."""
    r = gen.integers(0, 2**64, count, dtype=np.uint64, endpoint=False)
    r[1::3] >>= np.uint64(32)
    r[2::3] >>= np.uint64(56)
    return np.concatenate([np.array(P_EDGES, np.uint64), r])


def _inputs(seed, site, pidx: np.ndarray, m: int):
    """Flattened (seed, site, P, E) arrays for every point x element 0..m-1."""
    s32, t32 = _key(seed, site)
    n = len(pidx) * m
    return (
        np.full(n, s32, np.uint32).view(np.int32),
        _as_i32(np.full(n, t32, np.uint64)),
        np.repeat(pidx, m),
        np.tile(np.arange(m, dtype=np.uint64), len(pidx)),
    )


def _pts(pidx: np.ndarray) -> np.ndarray:
    return np.stack([pidx >> np.uint64(32), pidx & np.uint64(M32)], axis=-1)


def _lanes(s32: int, t32: int, pidx, eidx) -> list:
    """The 4 Philox lanes of rng's counter layout (E lo, E hi, P lo, P hi), key (s, t)."""
    p, e, sh = np.asarray(pidx, np.uint64), np.asarray(eidx, np.uint64), np.uint64(32)
    m = np.uint64(M32)
    return list(rng._philox(e & m, e >> sh, p & m, p >> sh, s32, t32))


def _normal_of_lanes(x) -> np.ndarray:
    """The specification's Box-Muller on lanes, from rng's own pieces (f64)."""
    a, b = rng._n53(x[0], x[1]), rng._n53(x[2], x[3])
    u1 = (np.uint64(2**53) - a).astype(np.float64) * 2.0**-53
    _, c = rng.sincos_turns53(b)
    return np.sqrt(-2.0 * rng.log64(u1)) * c


def _gumbel_of_lanes(x) -> np.ndarray:
    n = rng._n53(x[0], x[1])
    u = ((n >> np.uint64(1)) * np.uint64(2) + np.uint64(1)).astype(np.float64) * 2.0**-53
    return -rng.log64(-rng.log64(u))


OF_LANES = {  # native function -> its draw from the lanes of one block
    "tl_rng_bits": lambda x: x[0].astype(np.uint32).view(np.int32),
    "tl_rng_uniform_f32": lambda x: rng._unit(x, np.dtype(np.float32)),
    "tl_rng_uniform_f64": lambda x: rng._unit(x, np.dtype(np.float64)),
    "tl_rng_normal_f32": lambda x: _normal_of_lanes(x).astype(np.float32),
    "tl_rng_normal_f64": _normal_of_lanes,
    "tl_rng_gumbel_f64": _gumbel_of_lanes,
}
PUBLIC = {  # native function -> the public draw over points x elements 0..m-1
    "tl_rng_bits": lambda s, t, pts, m: rng.bits(s, t, pts, BOUNDS, (m,)).view(np.int32),
    "tl_rng_uniform_f32": lambda s, t, pts, m: rng.uniform(s, t, pts, BOUNDS, (m,), "f32"),
    "tl_rng_uniform_f64": lambda s, t, pts, m: rng.uniform(s, t, pts, BOUNDS, (m,), "f64"),
    "tl_rng_normal_f32": lambda s, t, pts, m: rng.normal(s, t, pts, BOUNDS, (m,), "f32"),
    "tl_rng_normal_f64": lambda s, t, pts, m: rng.normal(s, t, pts, BOUNDS, (m,), "f64"),
    "tl_rng_gumbel_f64": lambda s, t, pts, m: rng.gumbel(s, t, pts, BOUNDS, (m,)),
}


# ---------------------------------------------------------------------------- tests
def test_library_is_plain_ieee_and_documented():
    text = philox.LIBRARY
    defined = re.findall(r"^define internal [^@]*@(\w+)\(", text, re.MULTILINE)
    assert sorted(defined) == sorted(philox.FUNCTIONS)
    assert all(name.startswith("tl_rng_") for name in defined)
    for flag in ["fast", "contract", "reassoc", "afn", "arcp", "nnan", "ninf", "nsz"]:
        assert not re.search(rf"\bf(add|sub|mul|div|neg|cmp)\s+{flag}\b", text), flag
    called = set(re.findall(r"@(llvm\.[\w.]+)", text))
    assert called == {"llvm.sqrt.f64", "llvm.memset.p0.i64"}  # no fma, fmuladd or libm


def test_compiled_code_fuses_no_multiply_add(native):
    asm = native.tm.emit_assembly(native.module)
    assert not re.search(r"\bv?fn?m(add|sub)\d", asm)


def test_philox_known_answers(native):
    rows = np.array([[int(x, 16) for x in r.split()] for r in KAT.strip().splitlines()])
    out = _run(native, "tl_rng_philox", *(rows[:, k] for k in range(6)))
    assert out.tolist() == rows[:, 6:10].tolist()


def test_golden_bit_patterns(native):
    s32, t32 = _key(1234, "policy/act")
    args = ([s32] * 4, [t32] * 4, [rng.point_index((2, 3), (10, 5))] * 4, range(4))
    assert _run(native, "tl_rng_bits", *args).view(np.uint32).tolist() == GOLDEN["bits"]
    for draw in ["uniform", "normal"]:
        for t, view in [("f32", np.uint32), ("f64", np.uint64)]:
            got = _run(native, f"tl_rng_{draw}_{t}", *args).view(view)
            assert got.tolist() == GOLDEN[f"{draw}_{t}"]


def test_block_counter_layout_with_wide_indices(native):
    gen = np.random.default_rng(1)
    pidx, eidx = _random_points(gen, 3000), _random_points(gen, 3000)[::-1].copy()
    for seed, site in KEYS:
        s32, t32 = _key(seed, site)
        n = len(pidx)
        got = _run(native, "tl_rng_block", [s32] * n, [t32] * n, pidx, eidx)
        ref = np.stack(_lanes(s32, t32, pidx, eidx), axis=-1).astype(np.uint32)
        assert np.array_equal(got, ref)


@pytest.mark.parametrize("fn", list(PUBLIC))
def test_draws_match_the_reference(native, fn):
    gen = np.random.default_rng(2)
    m = 7
    for seed, site in KEYS:
        pidx = _random_points(gen, 300)
        ref = PUBLIC[fn](seed, site, _pts(pidx), m).ravel()
        inputs = _inputs(seed, site, pidx, m)
        _same_bits(_run(native, fn, *inputs), ref)
        # the lanes' formulas of the next test are rng's draws
        _same_bits(OF_LANES[fn](_lanes(*_key(seed, site), inputs[2], inputs[3])), ref)


@pytest.mark.parametrize("fn", list(OF_LANES))
def test_draws_at_wide_element_indices(native, fn):
    gen = np.random.default_rng(3)
    eidx = _random_points(gen, 4000)
    pidx = gen.permutation(_random_points(gen, 4000))
    for seed, site in KEYS[:3]:
        s32, t32 = _key(seed, site)
        n = len(eidx)
        got = _run(native, fn, [s32] * n, [t32] * n, pidx, eidx)
        _same_bits(got, OF_LANES[fn](_lanes(s32, t32, pidx, eidx)))


def test_log64_kernel(native):
    gen = np.random.default_rng(4)
    split = rng._LOG_SPLIT
    grid = gen.integers(1, 2**53, 4000, dtype=np.uint64, endpoint=True)
    normal = gen.integers(0x0010000000000000, 0x7FF0000000000000, 4000, dtype=np.uint64)
    near = [((1023 + e) << 52) | (split + d) for e in (-60, -1, 0, 1, 30) for d in range(-3, 4)]
    edges = [
        1.0,
        2.0,
        0.5,
        2.0**-53,
        1 - 2.0**-53,
        1 + 2.0**-52,
        2.0**-1022,
        1.7976931348623157e308,
    ]
    x = np.concatenate(
        [
            grid.astype(np.float64) * 2.0**-53,
            normal.view(np.float64),
            np.array(near, np.uint64).view(np.float64),
            np.array(edges),
        ]
    )
    _same_bits(_run(native, "tl_rng_log64", x), rng.log64(x))


def test_sincos_turns53_kernel(native):
    gen = np.random.default_rng(5)
    edges = [
        q * 2**51 + d
        for q in range(5)
        for d in (-(2**50) - 1, -(2**50), -(2**50) + 1, -1, 0, 1, 2**50 - 1, 2**50)
    ]
    n = np.concatenate(
        [
            np.array([v for v in edges if 0 <= v < 2**53], np.uint64),
            gen.integers(0, 2**53, 8000, dtype=np.uint64),
        ]
    )
    got = _run(native, "tl_rng_sincos_turns53", n)
    sin, cos = rng.sincos_turns53(n)
    _same_bits(got[:, 0].copy(), sin)
    _same_bits(got[:, 1].copy(), cos)


def test_normal_at_extreme_lanes(native):
    # u1 = 1 (log 0, sqrt(-0.0)), u1 = 2**-53 (the largest |z|), quadrant edges of the angle
    words = [0, 31, 32, 63, 64, 2**31, M32 - 63, M32]
    x = np.array(np.meshgrid(words, words, words, words)).reshape(4, -1).astype(np.uint64)
    got = _run(native, "tl_rng_normal_lanes", *x)
    _same_bits(got, _normal_of_lanes(list(x)))


RANGES = [(-2.0, 3.0), (0.0, 1.0), (3.0, -2.0), (1e-3, 1e3), (-1e30, 1e30), (0.1, 0.1)]


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_uniform_range_and_initializers(native, dtype):
    dt = np.dtype(np.float32 if dtype == "f32" else np.float64).type
    gen = np.random.default_rng(6)
    fn = f"tl_rng_uniform_range_{dtype}"
    for k, (lo, hi) in enumerate(RANGES):
        seed, site = KEYS[k % len(KEYS)]
        pidx = _random_points(gen, 200)
        inputs = _inputs(seed, site, pidx, 6)
        n = len(inputs[0])
        ref = rng.uniform(seed, site, _pts(pidx), BOUNDS, (6,), dtype, lo=lo, hi=hi)
        _same_bits(_run(native, fn, *inputs, [dt(lo)] * n, [dt(hi)] * n), ref.ravel())
    for shape in [(3, 4), (7,), (2, 3, 5)]:  # glorot: lo = -hi, hi the limit in the dtype
        pidx = _random_points(gen, 50)
        m = math.prod(shape)
        limit = math.sqrt(6.0 / sum(rng.glorot_fans(shape)))
        inputs = _inputs(7, "w", pidx, m)
        n = len(inputs[0])
        ref = rng.glorot_uniform(7, "w", _pts(pidx), BOUNDS, shape, dtype)
        got = _run(native, fn, *inputs, [dt(-limit)] * n, [dt(limit)] * n)
        _same_bits(got, ref.reshape(-1))
        ref = rng.uniform_init(7, "w", _pts(pidx), BOUNDS, shape, -0.5, 0.25, dtype)
        got = _run(native, fn, *inputs, [dt(-0.5)] * n, [dt(0.25)] * n)
        _same_bits(got, ref.reshape(-1))


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_normal_init(native, dtype):
    dt = np.dtype(np.float32 if dtype == "f32" else np.float64).type
    gen = np.random.default_rng(7)
    for k, (std, mean) in enumerate([(1.0, 0.0), (0.01, 0.0), (2.5, -1.0), (1e-3, 1e3)]):
        seed, site = KEYS[k]
        pidx = _random_points(gen, 200)
        inputs = _inputs(seed, site, pidx, 6)
        n = len(inputs[0])
        ref = rng.normal_init(seed, site, _pts(pidx), BOUNDS, (6,), std, mean, dtype)
        got = _run(native, f"tl_rng_normal_affine_{dtype}", *inputs, [dt(mean)] * n, [dt(std)] * n)
        _same_bits(got, ref.ravel())


def test_bernoulli(native):
    gen = np.random.default_rng(8)
    m = 8
    for seed, site in KEYS:
        pidx = _random_points(gen, 300)
        inputs = _inputs(seed, site, pidx, m)
        u = rng.uniform(seed, site, _pts(pidx), BOUNDS, (m,), "f64").ravel()
        p = gen.uniform(size=u.shape)
        # the draw itself and its neighbours, and the edges 0, 1, nan
        p[0::7], p[1::7] = u[0::7], np.nextafter(u[1::7], 2.0)
        p[2::7], p[3::7] = np.nextafter(u[2::7], -1.0), [0.0, 1.0, np.nan][seed % 3]
        ref = rng.bernoulli(seed, site, _pts(pidx), BOUNDS, p.reshape(-1, m)).ravel()
        got = _run(native, "tl_rng_bernoulli", *inputs, p)
        assert np.array_equal(got, ref)


@pytest.mark.parametrize("c", [5, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_categorical(native, dtype, c):
    gen = np.random.default_rng(9)
    r = 3
    for seed, site in KEYS:
        pidx = _random_points(gen, 100)
        npts = len(pidx)
        logits = gen.normal(size=(npts, r, c)).astype(dtype)
        flat = logits.reshape(-1, c)
        flat[0::6] = -np.inf  # every category -inf: the first
        flat[1::6, 1::2] = np.inf  # several +inf: the first of them
        flat[2::6, c // 2] = np.nan  # a nan wins, as in np.argmax
        flat[3::6, 1:3] = np.nan
        flat[4::6] = 0.0
        ref = rng.categorical(seed, site, _pts(pidx), BOUNDS, logits).ravel()
        s32, t32 = _key(seed, site)
        rows = npts * r
        buf = np.zeros((rows * c, 2), dtype)  # stride 2: the logits interleaved with junk
        buf[:, 0], buf[:, 1] = flat.ravel(), 1e30
        args = [
            np.full(rows, s32, np.uint32),
            _as_i32([t32] * rows),
            np.repeat(pidx, r),
            np.tile(np.arange(r, dtype=np.uint64) * np.uint64(c), npts),
        ]
        out = np.zeros(rows, np.int32)
        fn = ctypes.CFUNCTYPE(
            None,
            ctypes.c_int64,
            *[ctypes.c_void_p] * 5,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_void_p,
        )
        t = "f32" if dtype == np.float32 else "f64"
        fn(native.address(f"t_categorical_{t}"))(
            rows, *[a.ctypes.data for a in args], buf.ctypes.data, 2, c, out.ctypes.data
        )
        assert np.array_equal(out, ref)


@pytest.mark.parametrize("n", [0, 1, 2, 10, 300])
def test_permutation(native, n):
    gen = np.random.default_rng(10)
    for seed, site in KEYS:
        pidx = _random_points(gen, 40)
        ref = rng.permutation(seed, site, _pts(pidx), BOUNDS, n)
        s32, t32 = _key(seed, site)
        seeds, sites = np.full(len(pidx), s32, np.uint32), _as_i32([t32] * len(pidx))
        out = np.full((len(pidx), n), -1, np.int32)
        scratch = np.zeros(2 * n + 1, np.int64)
        fn = ctypes.CFUNCTYPE(
            None,
            ctypes.c_int64,
            *[ctypes.c_void_p] * 3,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.c_void_p,
        )
        fn(native.address("t_permutation"))(
            len(pidx),
            seeds.ctypes.data,
            sites.ctypes.data,
            pidx.ctypes.data,
            n,
            out.ctypes.data,
            scratch.ctypes.data,
        )
        assert np.array_equal(out, ref)


def test_sort_keeps_ties_in_index_order(native):
    gen = np.random.default_rng(11)
    n = 5000
    keys = gen.integers(0, 4, n, dtype=np.uint64)
    keys[::5] = gen.integers(0, 2**32, n // 5, dtype=np.uint64)
    keys[1::9] = M32
    a = (keys << np.uint64(32)) | np.arange(n, dtype=np.uint64)
    b = np.zeros(n, np.uint64)
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
    fn(native.address("t_sort"))(a.ctypes.data, b.ctypes.data, n)
    order = (a & np.uint64(M32)).astype(np.int64)
    assert np.array_equal(order, np.argsort(keys, kind="stable"))
