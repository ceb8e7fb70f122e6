"""Conformance tests of the built-in functions of LANGUAGE.md section 6 that this version
runs (everything but random draws, environments, gradients and optimizers), with default
and explicit axis arguments. Expected values follow NumPy.
"""

import math

import numpy as np
import pytest
from rtl_helpers import close, run, run1

X = "x = (f32(arange(6)) - 2.5) * 0.75\n"
XV = (np.arange(6, dtype=np.float32) - 2.5) * np.float32(0.75)
P = "p = f32(arange(6)) * 0.5 + 0.25\n"  # positive values
PV = np.arange(6, dtype=np.float32) * np.float32(0.5) + np.float32(0.25)


def _sigmoid(x):
    return 1 / (1 + np.exp(-x.astype(np.float64)))


# ============================================================================ elementwise

FLOAT_UNARY = [
    ("exp(x)", lambda: np.exp(XV)),
    ("log(p)", lambda: np.log(PV)),
    ("log1p(p)", lambda: np.log1p(PV)),
    ("sqrt(p)", lambda: np.sqrt(PV)),
    ("rsqrt(p)", lambda: 1 / np.sqrt(PV)),
    ("abs(x)", lambda: np.abs(XV)),
    ("sign(x)", lambda: np.sign(XV)),
    ("tanh(x)", lambda: np.tanh(XV)),
    ("sigmoid(x)", lambda: _sigmoid(XV)),
    ("relu(x)", lambda: np.maximum(XV, 0)),
    ("elu(x)", lambda: np.where(XV > 0, XV, np.expm1(XV))),
    ("softplus(x)", lambda: np.log1p(np.exp(XV.astype(np.float64)))),
    ("sin(x)", lambda: np.sin(XV)),
    ("cos(x)", lambda: np.cos(XV)),
    ("floor(x)", lambda: np.floor(XV)),
    ("ceil(x)", lambda: np.ceil(XV)),
    ("round(x)", lambda: np.round(XV)),
]


@pytest.mark.parametrize("expr, expected", FLOAT_UNARY, ids=[e for e, _ in FLOAT_UNARY])
def test_elementwise_float_functions(expr, expected):
    y = run1(X + P + f"y = {expr}\nout y\n")
    close(y, np.asarray(expected(), np.float32), np.float32, rtol=1e-5, atol=1e-6)


def test_round_half_to_even_like_numpy():
    y = run1("y = round(f32(arange(6)) - 2.5)\nout y\n")
    close(y, np.round(np.arange(6, dtype=np.float32) - 2.5), np.float32)


def test_sign_of_zero_is_zero_and_abs_sign_keep_int_dtype():
    out = run(
        "a = arange(5) - 2\ns = sign(a)\nb = abs(a)\nr = relu(a)\nz = sign(0.0)\nout s, b, r, z\n"
    )
    a = np.arange(5, dtype=np.int32) - 2
    close(out["s"], np.sign(a), np.int32)
    close(out["b"], np.abs(a), np.int32)
    close(out["r"], np.maximum(a, 0), np.int32)
    close(out["z"], np.float32(0.0))


def test_elementwise_functions_on_f64_stay_f64():
    out = run("x = f64(arange(3)) * 0.1\na = exp(x)\nb = tanh(x)\nc = sigmoid(x)\nout a, b, c\n")
    x = np.arange(3) * 0.1
    close(out["a"], np.exp(x), np.float64, rtol=1e-12)
    close(out["b"], np.tanh(x), np.float64, rtol=1e-12)
    close(out["c"], _sigmoid(x), np.float64, rtol=1e-12)


def test_float_functions_of_ints_give_floats():
    out = run("a = exp(arange(3))\nb = sqrt(4)\nout a, b\n")
    assert out["a"].dtype.kind == "f" and out["b"].dtype.kind == "f"
    close(out["a"], np.exp(np.arange(3)), rtol=1e-6)
    close(out["b"], 2.0)


def test_elu_with_alpha():
    y = run1(X + "y = elu(x, 0.5)\nout y\n")
    close(y, np.where(XV > 0, XV, 0.5 * np.expm1(XV)).astype(np.float32), rtol=1e-5)


def test_softplus_is_stable_for_large_inputs():
    y = run1("y = softplus(f32(arange(3)) * 50.0 - 50.0)\nout y\n")
    x = np.arange(3) * 50.0 - 50.0
    close(y, np.logaddexp(0, x).astype(np.float32), rtol=1e-6, atol=1e-30)


def test_sigmoid_is_stable_for_large_inputs():
    y = run1("y = sigmoid(f32(arange(3)) * 100.0 - 100.0)\nout y\n")
    assert np.all(np.isfinite(y))
    close(y, np.array([0.0, 0.5, 1.0], np.float32), atol=1e-30)


def test_minimum_maximum_clip_where_pow():
    out = run(
        X
        + """
        a = minimum(x, 0.5)
        b = maximum(x, reshape(f32(arange(2)), [2, 1]))
        c = clip(x, -1.0, 1.0)
        d = where(x > 0.0, x, 0.0 - x)
        e = where(arange(6) % 2 == 0, 1, 2.5)
        f = pow(abs(x), 2.0)
        g = pow(2, arange(4))
        h = clip(arange(6), 1, 3)
        out a, b, c, d, e, f, g, h
        """.replace("        ", "")
    )
    close(out["a"], np.minimum(XV, 0.5), np.float32)
    close(out["b"], np.maximum(XV, np.arange(2, dtype=np.float32).reshape(2, 1)))
    close(out["c"], np.clip(XV, -1, 1))
    close(out["d"], np.abs(XV))
    close(out["e"], np.where(np.arange(6) % 2 == 0, 1.0, 2.5).astype(np.float32), np.float32)
    close(out["f"], np.abs(XV) ** 2, rtol=1e-6)
    close(out["g"], 2 ** np.arange(4), np.int32)
    close(out["h"], np.clip(np.arange(6), 1, 3), np.int32)


def test_where_broadcasts_condition_and_branches():
    y = run1("c = arange(3) > 0\ny = where(c, reshape(f32(arange(2)), [2, 1]), -1.0)\nout y\n")
    close(
        y,
        np.where(np.arange(3) > 0, np.arange(2, dtype=np.float32).reshape(2, 1), -1.0).astype(
            np.float32
        ),
    )


@pytest.mark.parametrize(
    "expr, expected, dtype",
    [
        ("f32(3)", 3.0, np.float32),
        ("f64(0.1)", np.float64(np.float32(0.1)), None),
        ("i32(2.7)", 2, np.int32),
        ("i32(-2.7)", -2, np.int32),
        ("i64(7)", 7, np.int64),
        ("bool(0)", False, np.bool_),
        ("bool(3)", True, np.bool_),
        ("bool(0.5)", True, np.bool_),
        ("f32(true)", 1.0, np.float32),
        ("i32(false)", 0, np.int32),
        ("f32(i64(5))", 5.0, np.float32),
    ],
)
def test_casts(expr, expected, dtype):
    y = run1(f"y = {expr}\nout y\n")
    if dtype is None:
        # f64(0.1): either the f64 or the f32 value of 0.1 is defensible; it must be an f64
        assert y.dtype == np.float64
        assert float(y) in (0.1, float(np.float32(0.1)))
    else:
        close(y, np.asarray(expected, dtype), dtype)


def test_casts_of_arrays():
    out = run(X + "a = i32(x)\nb = bool(x)\nc = f64(x)\nd = f32(a)\nout a, b, c, d\n")
    close(out["a"], XV.astype(np.int32), np.int32)
    close(out["b"], XV.astype(bool), np.bool_)
    close(out["c"], XV.astype(np.float64), np.float64)
    close(out["d"], XV.astype(np.int32).astype(np.float32), np.float32)


# ============================================================================ reductions

M = "m = reshape(f32(arange(24)) * 0.25 - 3.0, [2, 3, 4])\n"
MV = (np.arange(24, dtype=np.float32) * np.float32(0.25) - 3).reshape(2, 3, 4)


def _lse(x, axis=None):
    x = x.astype(np.float64)
    mx = np.max(x, axis=axis, keepdims=True)
    return np.squeeze(np.log(np.sum(np.exp(x - mx), axis=axis, keepdims=True)) + mx, axis=axis)


REDUCTIONS = {
    "sum": np.sum,
    "mean": np.mean,
    "max": np.max,
    "min": np.min,
    "prod": lambda x, axis=None: np.prod(x.astype(np.float64) * 0 + 1 + x * 0.01, axis=axis),
    "std": np.std,
    "var": np.var,
    "logsumexp": _lse,
}


@pytest.mark.parametrize(
    "axis", [None, "0", "1", "2", "-1", "[0, 2]", "[1, 2]", "[0, 1, 2]", "[-1, 0]"]
)
@pytest.mark.parametrize("fn", list(REDUCTIONS))
def test_reductions_with_default_and_explicit_axes(fn, axis):
    arg = "1.0 + m * 0.01" if fn == "prod" else "m"
    call = f"{fn}({arg})" if axis is None else f"{fn}({arg}, {axis})"
    y = run1(M + f"y = {call}\nout y\n")
    np_axis = (
        None if axis is None else (int(axis) if not axis.startswith("[") else tuple(eval(axis)))
    )
    expected = REDUCTIONS[fn](MV, axis=np_axis)
    close(y, np.asarray(expected, np.float32), np.float32, rtol=1e-5, atol=1e-5)


def test_reductions_with_axis_keyword():
    out = run(
        M + "a = sum(m, axis=0)\nb = max(m, axis=[1, 2])\nc = logsumexp(m, axis=-1)\nout a, b, c\n"
    )
    close(out["a"], MV.sum(0))
    close(out["b"], MV.max((1, 2)))
    close(out["c"], _lse(MV, -1), rtol=1e-5)


def test_sum_max_min_prod_of_ints_stay_ints():
    out = run(
        "a = reshape(arange(6) + 1, [2, 3])\ns = sum(a)\nm = max(a, 0)\nn = min(a)\np = prod(a, "
        "1)\nout s, m, n, p\n"
    )
    a = np.arange(6).reshape(2, 3) + 1
    assert out["s"].dtype.kind == "i" and out["m"].dtype.kind == "i" and out["p"].dtype.kind == "i"
    close(out["s"], a.sum())
    close(out["m"], a.max(0))
    close(out["n"], a.min())
    close(out["p"], a.prod(1))


def test_mean_of_ints_is_a_float():
    y = run1("y = mean(arange(4))\nout y\n")
    assert y.dtype.kind == "f"
    close(y, 1.5)


def test_sum_of_bools_counts():
    y = run1("y = sum(arange(5) > 1)\nout y\n")
    close(y, 3)


@pytest.mark.parametrize("fn", ["argmax", "argmin"])
@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1])
def test_argmax_argmin(fn, axis):
    # a permuted array so that every axis has a different answer
    text = "m = reshape(f32((arange(24) * 7) % 24), [2, 3, 4])\n"
    call = f"{fn}(m)" if axis is None else f"{fn}(m, {axis})"
    y = run1(text + f"y = {call}\nout y\n")
    mv = ((np.arange(24) * 7) % 24).reshape(2, 3, 4).astype(np.float32)
    expected = getattr(np, fn)(mv, axis=axis)
    assert y.dtype.kind == "i"
    close(y, expected)


def test_argmax_first_occurrence_on_ties():
    y = run1("y = argmax(f32(arange(6) % 3))\nout y\n")
    close(y, 2)


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_cumsum(axis):
    call = "cumsum(a)" if axis is None else f"cumsum(a, {axis})"
    y = run1(f"a = reshape(f32(arange(6)) + 1.0, [2, 3])\ny = {call}\nout y\n")
    a = np.arange(6, dtype=np.float32).reshape(2, 3) + 1
    close(y, np.cumsum(a, axis=axis))


def test_cumsum_of_ints():
    y = run1("y = cumsum(arange(5), 0)\nout y\n")
    assert y.dtype.kind == "i"
    close(y, np.cumsum(np.arange(5)))


def test_discounted_sum_along_axis_0():
    out = run(
        """
        config gamma = 0.9
        v = f32(arange(5)) + 1.0
        m = reshape(f32(arange(8)), [4, 2])
        a = discounted_sum(v, gamma)
        b = discounted_sum(m, 0.5)
        c = discounted_sum(v, 1.0)
        out a, b, c
        """
    )
    v = np.arange(5, dtype=np.float32) + 1
    m = np.arange(8, dtype=np.float32).reshape(4, 2)
    close(out["a"], np.float32(sum(0.9**k * v[k] for k in range(5))), rtol=1e-6)
    close(out["b"], sum(0.5**k * m[k] for k in range(4)).astype(np.float32))
    close(out["c"], v.sum())


def test_std_var_are_population_statistics():
    out = run("a = f32(arange(4))\ns = std(a)\nv = var(a)\nout s, v\n")
    close(out["s"], np.std(np.arange(4.0)))
    close(out["v"], np.var(np.arange(4.0)))


# ============================================================================ shape functions


def test_reshape_flatten_with_minus_one():
    out = run(
        """
        a = arange(24)
        b = reshape(a, [2, 3, 4])
        c = reshape(a, [-1, 6])
        d = reshape(b, [4, -1])
        e = reshape(b, [-1])
        f = flatten(b)
        g = reshape(arange(1), [])
        out b, c, d, e, f, g
        """
    )
    a = np.arange(24)
    close(out["b"], a.reshape(2, 3, 4), np.int32)
    close(out["c"], a.reshape(-1, 6))
    close(out["d"], a.reshape(4, -1))
    close(out["e"], a)
    close(out["f"], a)
    close(out["g"], np.int32(0))


def test_transpose_and_dot_t():
    out = run(
        """
        b = reshape(arange(24), [2, 3, 4])
        m = reshape(arange(6), [2, 3])
        v = arange(3)
        t0 = transpose(b)
        t1 = transpose(b, [1, 0, 2])
        t2 = transpose(b, [2, 0, 1])
        mt = m.T
        bt = b.T
        vt = v.T
        tt = (m.T @ m).T
        out t0, t1, t2, mt, bt, vt, tt
        """
    )
    b = np.arange(24).reshape(2, 3, 4)
    m = np.arange(6).reshape(2, 3)
    close(out["t0"], np.transpose(b))
    close(out["t1"], np.transpose(b, (1, 0, 2)))
    close(out["t2"], np.transpose(b, (2, 0, 1)))
    close(out["mt"], m.T)
    close(out["bt"], b.T)
    close(out["vt"], np.arange(3))
    close(out["tt"], (m.T @ m).T)


def test_concat_and_stack():
    out = run(
        """
        a = reshape(arange(6), [2, 3])
        b = reshape(arange(6) + 10, [2, 3])
        c0 = concat([a, b])
        c1 = concat([a, b], 1)
        cm = concat([a, b, a], -1)
        s0 = stack([a, b])
        s1 = stack([a, b], 1)
        s2 = stack([a, b], 2)
        sm = stack([a, b], -1)
        sv = stack([1.0, 2.0, 3.0])
        mix = concat([f32(arange(2)), ones([1])])
        out c0, c1, cm, s0, s1, s2, sm, sv, mix
        """
    )
    a = np.arange(6).reshape(2, 3)
    b = a + 10
    close(out["c0"], np.concatenate([a, b]))
    close(out["c1"], np.concatenate([a, b], 1))
    close(out["cm"], np.concatenate([a, b, a], -1))
    close(out["s0"], np.stack([a, b]))
    close(out["s1"], np.stack([a, b], 1))
    close(out["s2"], np.stack([a, b], 2))
    close(out["sm"], np.stack([a, b], -1))
    close(out["sv"], np.array([1, 2, 3], np.float32), np.float32)
    close(out["mix"], np.array([0, 1, 1], np.float32), np.float32)


def test_expand_squeeze_broadcast():
    out = run(
        """
        a = reshape(arange(6), [2, 3])
        e0 = expand(a, 0)
        e1 = expand(a, 1)
        e2 = expand(a, 2)
        em = expand(a, -1)
        q = reshape(arange(6), [1, 2, 1, 3])
        s = squeeze(q)
        s0 = squeeze(q, 0)
        s2 = squeeze(q, 2)
        sl = squeeze(q, [0, 2])
        b = broadcast(arange(3), [2, 3])
        b2 = broadcast(reshape(arange(2), [2, 1]), [4, 2, 3])
        bs = broadcast(5, [2])
        out e0, e1, e2, em, s, s0, s2, sl, b, b2, bs
        """
    )
    a = np.arange(6).reshape(2, 3)
    q = np.arange(6).reshape(1, 2, 1, 3)
    close(out["e0"], np.expand_dims(a, 0))
    close(out["e1"], np.expand_dims(a, 1))
    close(out["e2"], np.expand_dims(a, 2))
    close(out["em"], np.expand_dims(a, -1))
    close(out["s"], np.squeeze(q))
    close(out["s0"], np.squeeze(q, 0))
    close(out["s2"], np.squeeze(q, 2))
    close(out["sl"], np.squeeze(q, (0, 2)))
    close(out["b"], np.broadcast_to(np.arange(3), (2, 3)))
    close(out["b2"], np.broadcast_to(np.arange(2).reshape(2, 1), (4, 2, 3)))
    close(out["bs"], np.array([5, 5]))


def test_take_and_take_along():
    out = run(
        """
        m = reshape(f32(arange(12)), [3, 4])
        i = arange(2) + 1
        t0 = take(m, i, 0)
        t1 = take(m, i, 1)
        tm = take(m, i, -1)
        tf = take(m, i)
        ts = take(m, 2, 1)
        j = reshape(arange(3) % 4, [3, 1])
        a1 = take_along(m, j, 1)
        k = reshape(arange(4) % 3, [1, 4])
        a0 = take_along(m, k, 0)
        am = take_along(m, reshape(i, [1, 2]), -1)
        out t0, t1, tm, tf, ts, a1, a0, am
        """
    )
    m = np.arange(12, dtype=np.float32).reshape(3, 4)
    i = np.arange(2) + 1
    close(out["t0"], np.take(m, i, 0))
    close(out["t1"], np.take(m, i, 1))
    close(out["tm"], np.take(m, i, -1))
    close(out["tf"], np.take(m, i))
    close(out["ts"], np.take(m, 2, 1))
    close(out["a1"], np.take_along_axis(m, (np.arange(3) % 4).reshape(3, 1), 1))
    close(out["a0"], np.take_along_axis(m, (np.arange(4) % 3).reshape(1, 4), 0))
    close(out["am"], np.take_along_axis(m, i.reshape(1, 2), -1))


def test_take_along_with_argmax_pattern():
    y = run1(
        """
        q = reshape(f32((arange(12) * 5) % 12), [3, 4])
        a = argmax(q, 1)
        y = squeeze(take_along(q, expand(a, 1), 1), 1)
        out y
        """
    )
    q = ((np.arange(12) * 5) % 12).reshape(3, 4).astype(np.float32)
    close(y, q.max(1))


def test_one_hot():
    out = run(
        """
        config T = 3
        dim t < T
        a = one_hot(arange(3) % 2, 4)
        b[t] = one_hot(t, 3)
        c = one_hot(2, 3)
        out a, b, c
        """
    )
    close(out["a"], np.eye(4)[np.arange(3) % 2])
    close(out["b"], np.eye(3))
    close(out["c"], np.eye(3)[2])
    assert out["a"].shape == (3, 4)


# ============================================================================ creation


def test_zeros_ones_full_arange():
    out = run(
        """
        config N = 3
        a = zeros([2, 3])
        b = ones([N])
        c = zeros([2], dtype=i32)
        d = ones([2, 2], dtype=bool)
        e = full(2.5, [2, N])
        f = full(7, [2])
        g = full(1.5, [2], dtype=f64)
        h = arange(5)
        i = arange(N + 1)
        s = zeros([])
        out a, b, c, d, e, f, g, h, i, s
        """
    )
    close(out["a"], np.zeros((2, 3)), np.float32)
    close(out["b"], np.ones(3), np.float32)
    close(out["c"], np.zeros(2), np.int32)
    close(out["d"], np.ones((2, 2), bool), np.bool_)
    close(out["e"], np.full((2, 3), 2.5), np.float32)
    close(out["f"], np.full(2, 7), np.int32)
    close(out["g"], np.full(2, 1.5), np.float64)
    close(out["h"], np.arange(5), np.int32)
    close(out["i"], np.arange(4), np.int32)
    close(out["s"], np.float32(0), np.float32)


def test_full_with_a_tensor_value():
    out = run(
        """
        config T = 3
        dim t < T
        y[t] = full(f32(t) * 2.0, [2])
        out y
        """
    )
    close(out["y"], np.repeat(np.arange(3, dtype=np.float32)[:, None] * 2, 2, 1))


# ============================================================================ nn


def _log_softmax(x, axis=-1):
    x = x.astype(np.float64)
    return x - np.expand_dims(_lse(x, axis=axis), axis)


def test_softmax_log_softmax_default_and_explicit_axis():
    out = run(
        M
        + """
        a = softmax(m)
        b = log_softmax(m)
        c = softmax(m, 0)
        d = log_softmax(m, 1)
        e = softmax(m, axis=-1)
        f = log_softmax(m, axis=0)
        out a, b, c, d, e, f
        """.replace("        ", "")
    )
    close(out["a"], np.exp(_log_softmax(MV, -1)), np.float32, rtol=1e-5)
    close(out["b"], _log_softmax(MV, -1), np.float32, rtol=1e-5, atol=1e-5)
    close(out["c"], np.exp(_log_softmax(MV, 0)), rtol=1e-5)
    close(out["d"], _log_softmax(MV, 1), rtol=1e-5, atol=1e-5)
    close(out["e"], np.exp(_log_softmax(MV, -1)), rtol=1e-5)
    close(out["f"], _log_softmax(MV, 0), rtol=1e-5, atol=1e-5)


def test_softmax_is_stable_for_large_logits():
    y = run1("y = softmax(f32(arange(3)) * 1000.0)\nout y\n")
    close(y, np.array([0, 0, 1], np.float32), atol=1e-30)


def test_mse_huber():
    out = run(
        """
        a = f32(arange(6)) * 0.7
        b = reshape(f32(arange(6)) * 0.2 + 0.5, [6])
        e = mse(a, b)
        h = huber(a, b, 1.0)
        h2 = huber(a, b, 0.5)
        s = mse(2.0, 1.0)
        out e, h, h2, s
        """
    )
    a = np.arange(6, dtype=np.float32) * np.float32(0.7)
    b = np.arange(6, dtype=np.float32) * np.float32(0.2) + np.float32(0.5)
    d = np.abs(a - b).astype(np.float64)

    def huber(delta):
        return np.mean(np.where(d <= delta, 0.5 * d * d, delta * (d - 0.5 * delta)))

    close(out["e"], np.mean((a - b) ** 2), np.float32, rtol=1e-5)
    close(out["h"], huber(1.0), np.float32, rtol=1e-5)
    close(out["h2"], huber(0.5), rtol=1e-5)
    close(out["s"], 1.0)


def test_entropy_logits():
    out = run(
        """
        l = reshape(f32(arange(6)) * 0.3, [2, 3])
        e = entropy_logits(l)
        u = entropy_logits(zeros([4]))
        out e, u
        """
    )
    l = (np.arange(6) * 0.3).reshape(2, 3)
    lsm = _log_softmax(l)
    close(out["e"], -(np.exp(lsm) * lsm).sum(-1), np.float32, rtol=1e-5)
    close(out["u"], math.log(4), rtol=1e-6)


def test_normal_logp_of_scalars():
    out = run(
        """
        a = normal_logp(0.5, 0.0, 0.0)
        b = normal_logp(1.5, 1.0, -0.5)
        out a, b
        """
    )

    def logp(x, mu, log_std):
        return -0.5 * ((x - mu) / np.exp(log_std)) ** 2 - log_std - 0.5 * np.log(2 * np.pi)

    close(out["a"], logp(0.5, 0.0, 0.0), np.float32, rtol=1e-6)
    close(out["b"], logp(1.5, 1.0, -0.5), rtol=1e-6)


def test_stop_grad_is_the_identity():
    out = run(X + "y = stop_grad(x) * 2.0\nz = stop_grad(3)\nout y, z\n")
    close(out["y"], XV * 2, np.float32)
    close(out["z"], 3)


def test_creation_with_f64_keeps_the_f64_value_of_literals():
    out = run("y = full(0.1, [2], dtype=f64)\nz = ones([2], dtype=f64) * 0.1\nout y, z\n")
    close(out["y"], np.full(2, 0.1), np.float64, rtol=1e-15, atol=0)
    close(out["z"], np.full(2, 0.1), np.float64, rtol=1e-15, atol=0)


def test_reductions_of_f64_stay_f64():
    out = run(
        "x = f64(arange(3)) * 0.1\na = mean(x)\nb = sum(x)\nc = logsumexp(x)\nd = std(x)\nout a, "
        "b, c, d\n"
    )
    x = np.arange(3) * 0.1
    close(out["a"], x.mean(), np.float64, rtol=1e-12)
    close(out["b"], x.sum(), np.float64, rtol=1e-12)
    close(out["c"], np.log(np.exp(x).sum()), np.float64, rtol=1e-12)
    close(out["d"], x.std(), np.float64, rtol=1e-12)


def test_logsumexp_and_softmax_with_very_negative_entries():
    out = run("x = f32(arange(3)) * -1000.0\na = logsumexp(x)\nb = softmax(x)\nout a, b\n")
    close(out["a"], np.float32(0.0), atol=1e-6)
    close(out["b"], np.array([1, 0, 0], np.float32), atol=1e-30)
