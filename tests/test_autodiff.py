"""Gradient checks of the autodiff pass (LANGUAGE.md sections 6 and 8), op by op: every
differentiable built-in and operator, broadcasting, reductions with axes and keepdims,
matmul in every rank combination, shape functions, spatial indexing and gathers, the nn
helpers and casts. Each case compares ``grad(loss, p)`` with central finite differences in
f64 (tests/grad_helpers.py). Recurrences, temporal reads and diagnostics are in
test_autodiff_temporal.py.
"""

import numpy as np
import pytest
from grad_helpers import gradcheck, run

W = np.array([0.7, -0.4, 1.3, 0.25])  # mixed signs, away from 0 and from each other
POS = np.array([0.7, 0.4, 1.3, 2.25])  # positive
M = np.array([[0.3, -1.2, 0.8], [1.1, 0.45, -0.6]])  # 2 x 3
M3 = np.array([[[0.2, -0.5], [0.9, 0.35], [-1.1, 0.6]], [[0.4, 0.75], [-0.3, 1.25], [0.15, -0.8]]])
C4 = "c = f64(arange(4)) * 0.3 + 0.7\n"  # weights, so that no two elements look alike
C23 = "c = reshape(f64(arange(6)) * 0.3 + 0.7, [2, 3])\n"


def check(body, params, **kw):
    return gradcheck(body, params, **kw)


# ============================================================================ elementwise

UNARY = [
    ("exp(p.w)", W),
    ("log(p.w)", POS),
    ("log1p(p.w)", POS),
    ("sqrt(p.w)", POS),
    ("rsqrt(p.w)", POS),
    ("abs(p.w)", W),
    ("tanh(p.w)", W),
    ("sigmoid(p.w)", W),
    ("relu(p.w)", W),
    ("elu(p.w)", W),
    ("elu(p.w, alpha=0.5)", W),
    ("softplus(p.w)", W),
    ("sin(p.w)", W),
    ("cos(p.w)", W),
    ("-p.w", W),
    ("+p.w", W),
    ("p.w * p.w", W),
    ("p.w ** 2", W),
    ("p.w ** 3.5", POS),
    ("pow(p.w, -1.5)", POS),
    ("2.0 ** p.w", W),
    ("pow(f64(3.0), p.w)", W),
    ("1.0 / p.w", W),
    ("p.w / 3.0", W),
    ("3.0 - p.w", W),
    ("p.w - 3.0", W),
    ("p.w + 1", W),
    ("p.w * 2", W),
    ("floor(p.w * 2.0) * p.w", W),
    ("ceil(p.w) * p.w + round(p.w * 3.0)", W),
    ("sign(p.w) * p.w", W),
    ("minimum(p.w, 0.5)", W),
    ("maximum(p.w, 0.5)", W),
    ("minimum(0.5, p.w)", W),
    ("clip(p.w, -0.5, 1.0)", W),
    ("where(p.w > 0.0, p.w * p.w, -p.w)", W),
    ("where(c > 1.0, exp(p.w), 2.0)", W),
    ("where(f64(arange(4)) < 2.0, 1.0, p.w ** 3)", W),
    ("f64(p.w > 0.5) * p.w", W),
    ("tanh(p.w) * sigmoid(p.w) / (1.0 + exp(p.w))", W),
]


@pytest.mark.parametrize("expr, value", UNARY, ids=[e for e, _ in UNARY])
def test_elementwise_one_argument(expr, value):
    check(C4 + f"loss = sum(({expr}) * c)\n", {"w": value})


BINARY = [
    "p.a + p.b",
    "p.a - p.b",
    "p.a * p.b",
    "p.a / p.b",
    "p.a ** p.b",
    "pow(p.a, p.b)",
    "minimum(p.a, p.b)",
    "maximum(p.a, p.b)",
    "clip(p.b, p.a, 2.0)",
    "clip(c, p.a, p.b)",
    "where(p.a < p.b, p.a, p.b * p.b)",
    "where(p.a < p.b, exp(p.b), 2.0 * p.a)",
]


@pytest.mark.parametrize("expr", BINARY)
def test_elementwise_two_arguments(expr):
    check(C4 + f"loss = sum(({expr}) * c)\n", {"a": POS, "b": np.array([1.2, 0.1, 0.9, 1.7])})


def test_minimum_maximum_ties_split_the_gradient():
    # d/da of minimum(a, b) where a == b: what the implementation chooses must agree for
    # both arguments (their sum is the derivative along a = b, here 1 per element)
    out = run(
        "params p {\n  a : f64[2] = stack([f64(1.0), f64(2.0)])\n"
        "  b : f64[2] = stack([f64(1.0), f64(2.0)])\n}\n"
        "loss = sum(minimum(p.a, p.b)) + sum(maximum(p.a, p.b))\n"
        "g = grad(loss, p)\nout g\n"
    )
    np.testing.assert_allclose(out["g.a"] + out["g.b"], [2.0, 2.0])


def test_relu_at_zero_has_zero_gradient_like_pytorch():
    out = run("params p {\n  w : f64[3] = stack([f64(0.5), f64(0.0), f64(-3.0)])\n}\n"
              "loss = sum(relu(p.w))\ng = grad(loss, p)\nout g\n")
    np.testing.assert_array_equal(out["g.w"], [1.0, 0.0, 0.0])


COL = np.array([[0.5], [1.5]])
BROADCAST = [
    ("p.m * p.v + p.s", {"m": M, "v": np.array([0.5, -1.5, 2.0]), "s": np.array(0.3)}),
    ("p.m / p.v - p.s", {"m": M, "v": np.array([0.5, -1.5, 2.0]), "s": np.array(0.3)}),
    ("p.s / p.m", {"m": M, "s": np.array(0.3)}),
    ("p.col * p.row", {"col": np.array([[0.5], [1.5]]), "row": np.array([[0.2, -0.7, 1.1]])}),
    ("p.col - p.row", {"col": np.array([[0.5], [1.5]]), "row": np.array([0.2, -0.7, 1.1])}),
    ("p.col ** p.row", {"col": np.array([[0.5], [1.5]]), "row": np.array([0.2, -0.7, 1.1])}),
    ("maximum(p.col, p.row)", {"col": COL, "row": np.array([0.2, 0.7, 1.1])}),
    ("minimum(p.m, p.v)", {"m": M, "v": np.array([0.5, -1.5, 2.0])}),
    ("where(c > 1.5, p.v, p.col)", {"col": COL, "v": np.array([0.1, 0.2, 0.3])}),
    ("clip(p.m, p.lo, p.hi)",
     {"m": M, "lo": np.array([[-0.5], [0.0]]), "hi": np.array([0.6, 0.7, 0.9])}),
    ("p.m * 2.0 + f32(1.5)", {"m": M}),
]


@pytest.mark.parametrize("expr, params", BROADCAST, ids=[e for e, _ in BROADCAST])
def test_broadcasting_sums_the_gradient_back(expr, params):
    check(C23 + f"loss = sum(({expr}) * c)\n", params)


# ============================================================================ reductions

REDUCTIONS = [
    "sum(p.m)", "sum(p.m, 0)", "sum(p.m, 1)", "sum(p.m, [0, 1])", "sum(p.m, -1)",
    "sum(p.m, 1, keepdims=true)", "sum(p.m, axis=0, keepdims=true)",
    "mean(p.m)", "mean(p.m, 0)", "mean(p.m, 1, keepdims=true)", "mean(p.m, [1, 0])",
    "prod(p.m)", "prod(p.m, 0)", "prod(p.m, 1, keepdims=true)",
    "max(p.m)", "max(p.m, 0)", "max(p.m, 1)", "max(p.m, 1, keepdims=true)",
    "min(p.m)", "min(p.m, 0)", "min(p.m, -1, keepdims=true)",
    "logsumexp(p.m)", "logsumexp(p.m, 0)", "logsumexp(p.m, 1, keepdims=true)",
    "std(p.m)", "std(p.m, 0)", "std(p.m, 1, keepdims=true)", "std(p.m, ddof=1)",
    "var(p.m)", "var(p.m, 1)", "var(p.m, 0, keepdims=true)", "var(p.m, 1, ddof=1)",
    "cumsum(p.m, 0)", "cumsum(p.m, 1)", "cumsum(p.m)",
    "discounted_sum(p.m, 0.9)", "discounted_sum(p.m[0], f64(0.5))",
    "discounted_sum(transpose(p.m), 0.8)",
]


@pytest.mark.parametrize("expr", REDUCTIONS)
def test_reductions(expr):
    check(f"y = {expr}\nloss = sum(y * exp(y * 0.5))\n", {"m": M})


def test_reduction_of_a_3d_tensor_over_middle_axes():
    check("loss = sum(exp(sum(p.x, 1)) * 0.5) + sum(max(p.x, [0, 2]) ** 2)"
          " + sum(logsumexp(p.x, [0, 1]))\n", {"x": M3})


def test_prod_with_a_zero_element():
    check("loss = prod(p.w) + sum(prod(p.m, 1) * stack([1.0, 2.0]))\n",
          {"w": np.array([0.5, 0.0, 3.0]), "m": np.array([[0.0, 2.0, 0.0], [1.5, 0.0, 2.0]])})


def test_max_with_ties_gives_a_subgradient():
    # torch/jax split or pick; whatever is chosen, the gradient entries sum to 1
    out = run("params p {\n  w : f64[3] = stack([f64(2.0), f64(2.0), f64(1.0)])\n}\n"
              "loss = max(p.w)\ng = grad(loss, p)\nout g\n")
    assert abs(out["g.w"].sum() - 1.0) < 1e-12 and out["g.w"][2] == 0.0


# ============================================================================ matmul

V2 = np.array([0.5, -1.5])
V3 = np.array([0.5, -1.5, 2.0])
N34 = np.arange(12.0).reshape(3, 4) * 0.1 - 0.5
B234 = np.arange(24.0).reshape(2, 3, 4) * 0.05 - 0.4
B23 = np.arange(6.0).reshape(2, 3) * 0.2 - 0.3
MATMUL = [
    ("1-D @ 1-D", {"a": V3, "b": np.array([0.3, 0.2, -0.7])}),
    ("1-D @ 2-D", {"a": V2, "b": M}),
    ("2-D @ 1-D", {"a": M, "b": V3}),
    ("2-D @ 2-D", {"a": M, "b": N34}),
    ("3-D @ 3-D", {"a": M3, "b": B234[:, :2, :]}),
    ("3-D @ 2-D", {"a": M3, "b": np.array([[0.3, -0.1, 0.7], [0.2, 0.5, -0.4]])}),
    ("2-D @ 3-D", {"a": np.array([[0.3, -0.1, 0.7], [0.2, 0.5, -0.4]]), "b": M3}),
    ("1-D @ 3-D", {"a": V3, "b": M3}),
    ("3-D @ 1-D", {"a": M3, "b": V2}),
    ("4-D @ 3-D", {"a": np.arange(24.0).reshape(2, 2, 3, 2) * 0.1 - 1.0,
                       "b": M3.transpose(0, 2, 1)}),
    ("[1,3,2] @ [2,2,3]", {"a": M3[:1], "b": M3.transpose(0, 2, 1)}),
]


@pytest.mark.parametrize("what, params", [pytest.param(w, p, id=w) for w, p in MATMUL])
def test_matmul(what, params):
    check("y = p.a @ p.b\nloss = sum(y * exp(y * 0.5))\n", params)


def test_matmul_of_a_layer_with_bias_and_nonlinearity():
    check("x = reshape(f64(arange(6)) * 0.2 - 0.5, [2, 3])\n"
          "h = tanh(x @ p.w1 + p.b1)\nloss = mean((h @ p.w2 + p.b2) ** 2)\n",
          {"w1": N34, "b1": np.array([0.1, -0.2, 0.3, 0.05]), "w2": N34.T[:, :2],
               "b2": np.array([0.25, -0.5])})


# ============================================================================ shapes

SHAPES = [
    ("reshape(p.m, [3, 2])", {"m": M}),
    ("reshape(p.m, [-1])", {"m": M}),
    ("reshape(p.x, [6, 2])", {"x": M3}),
    ("flatten(p.m)", {"m": M}),
    ("flatten(p.x)", {"x": M3}),
    ("transpose(p.m)", {"m": M}),
    ("transpose(p.x, [1, 2, 0])", {"x": M3}),
    ("transpose(p.x, [2, 0, 1])", {"x": M3}),
    ("p.m.T", {"m": M}),
    ("concat([p.m, p.n], 0)", {"m": M, "n": M[:1] * 2.0}),
    ("concat([p.m, p.n, p.m], 1)", {"m": M, "n": M[:, :2] - 1.0}),
    ("concat([p.v, p.v * 2.0])", {"v": V3}),
    ("stack([p.v, p.u])", {"v": V3, "u": -V3 + 0.1}),
    ("stack([p.v, p.u, p.v], 1)", {"v": V3, "u": -V3 + 0.1}),
    ("stack([p.s, p.s * p.s])", {"s": np.array(0.7)}),
    ("expand(p.v, 0)", {"v": V3}),
    ("expand(p.v, 1)", {"v": V3}),
    ("expand(p.m, -1)", {"m": M}),
    ("squeeze(p.col, 1)", {"col": np.array([[0.5], [1.5]])}),
    ("squeeze(p.z)", {"z": np.array([[[0.5], [1.5], [-0.2]]])}),
    ("broadcast(p.v, [2, 3])", {"v": V3}),
    ("broadcast(p.col, [2, 4])", {"col": np.array([[0.5], [1.5]])}),
    ("broadcast(p.s, [3])", {"s": np.array(0.7)}),
]


@pytest.mark.parametrize("expr, params", SHAPES, ids=[e for e, _ in SHAPES])
def test_shape_functions(expr, params):
    check(f"y = {expr}\nloss = sum(y * exp(y * 0.5) * 0.75)\n", params)


# ============================================================================ spatial indexing

INDEXING = [
    ("p.v[1]", {"v": V3}),
    ("p.v[-1]", {"v": V3}),
    ("p.v[1:3]", {"v": V3}),
    ("p.v[0:2] * p.v[1:3]", {"v": V3}),
    ("p.m[1]", {"m": M}),
    ("p.m[1, 2]", {"m": M}),
    ("p.m[0:2, 1]", {"m": M}),
    ("p.m[:, 1:3]", {"m": M}),
    ("p.m[1][0:2]", {"m": M}),
    ("p.x[1, 0:2, 1]", {"x": M3}),
    ("p.v[idx]", {"v": V3}),
    ("p.m[idx]", {"m": np.array([[0.3, -1.2], [0.8, 1.1], [0.45, -0.6]])}),
    ("p.m[1, idx]", {"m": M}),
    ("log_softmax(p.v)[k]", {"v": V3}),
    ("log_softmax(p.m)[1][k]", {"m": M}),
    ("take(p.v, idx, 0)", {"v": V3}),
    ("take(p.m, idx, 1)", {"m": M}),
    ("take(p.m, idx)", {"m": M}),
    ("take(p.m, idx2, 0)", {"m": M}),
    ("take_along(p.m, ia, 1)", {"m": M}),
    ("take_along(p.m, ib, 0)", {"m": M}),
    ("take_along(log_softmax(p.m), ic, 1)", {"m": M}),
    ("take_along(p.x, ia3, 2)", {"x": M3}),
    ("take(p.x, idx4, 1)", {"x": M3}),
    ("take(p.x, idx4)", {"x": M3}),
    ("p.x[idx4, 1]", {"x": M3}),
    ("p.x[0:2, 1:3, idx4]", {"x": M3}),
    ("p.m[0:2, idx]", {"m": M}),
    ("log_softmax(p.x)[idx4]", {"x": M3}),
    ("log_softmax(p.x, 1)[1, k]", {"x": M3}),
    ("p.v[0] * p.v[1:3] + p.v[-2]", {"v": V3}),
    ("one_hot(idx, 3) * p.v", {"v": V3}),
]
IDX = (
    "idx = stack([2, 0, 2, 1])\nk = 2\nidx2 = reshape(stack([1, 1, 0]), [3, 1])\n"
    "ia = reshape(stack([2, 0, 0, 1, 1, 1]), [2, 3])\nib = reshape(stack([1, 0, 1]), [1, 3])\n"
    "ic = reshape(stack([2, 1]), [2, 1])\nidx4 = reshape(stack([1, 0, 1, 1]), [2, 2])\n"
    "ia3 = reshape(stack([1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0]), [2, 3, 2])\n"
)


@pytest.mark.parametrize("expr, params", INDEXING, ids=[e for e, _ in INDEXING])
def test_spatial_indexing_and_gathers(expr, params):
    # repeated gather indices must accumulate
    check(IDX + f"y = {expr}\nloss = sum(y * exp(y * 0.5) * 0.75)\n", params)


def test_take_along_with_broadcast_indices():
    check("ib = reshape(stack([1, 0, 2]), [3, 1])\ny = take_along(p.r, ib, 1)\n"
          "loss = sum(y * exp(y))\n", {"r": np.array([[0.5, -1.0, 0.25]])})


# ============================================================================ nn helpers

NN = [
    ("sum(softmax(p.m) * c)", {"m": M}),
    ("sum(softmax(p.m, axis=0) * c)", {"m": M}),
    ("sum(log_softmax(p.m) * c)", {"m": M}),
    ("sum(log_softmax(p.m, 0) * c)", {"m": M}),
    ("mse(p.m, c)", {"m": M}),
    ("mse(c, p.m)", {"m": M}),
    ("mse(p.m, p.n)", {"m": M, "n": M[::-1] * 0.5}),
    ("huber(p.m, c)", {"m": M}),
    ("huber(p.m, c, delta=0.5)", {"m": M}),
    ("huber(p.m, c, 2.0)", {"m": M}),
    ("sum(entropy_logits(p.m))", {"m": M}),
    ("entropy_logits(p.v)", {"v": V3}),
    ("sum(normal_logp(c, p.mu, p.ls))", {"mu": M, "ls": M * 0.3}),
    ("sum(normal_logp(p.x, 0.5, -0.3))", {"x": M}),
    ("sum(normal_logp(p.x, p.mu, f64(0.2)) * c)", {"x": M, "mu": M.T.reshape(2, 3)}),
]


@pytest.mark.parametrize("expr, params", NN, ids=[e for e, _ in NN])
def test_nn_helpers(expr, params):
    check(C23 + f"loss = {expr}\n", params)


# ============================================================================ casts and dtypes


def test_cast_to_f32_and_back_passes_the_gradient():
    # d/dw sum(f64(f32(w)) * c) = c, exactly (finite differences in f32 are too coarse)
    out = gradcheck(C4 + "loss = sum(f64(f32(p.w) * f32(c)))\n", {"w": W},
                    expected={"w": np.float32(np.arange(4) * 0.3 + 0.7).astype(np.float64)},
                    rtol=1e-12)
    assert out["loss"].dtype == np.float64


def test_int_and_bool_casts_pass_no_gradient():
    check(C4 + "loss = sum(f64(i32(p.w * 3.0)) * p.w + f64(bool(p.w > 0.5)) * c)\n", {"w": W})


def test_f32_params_get_an_f32_gradient():
    out = run("params p {\n  w : f32[3] = stack([0.5, -1.0, 2.0])\n}\n"
              "loss = sum(f64(p.w) ** 2)\ng = grad(loss, p)\nout g\n")
    assert out["g.w"].dtype == np.float32
    np.testing.assert_allclose(out["g.w"], [1.0, -2.0, 4.0])


def test_f32_loss_gradient():
    out = run("params p {\n  w : f32[3] = stack([0.5, -1.0, 2.0])\n}\n"
              "loss = sum(p.w * p.w * 1.5)\ng = grad(loss, p)\nout g, loss\n")
    assert out["g.w"].dtype == np.float32 and out["loss"].dtype == np.float32
    np.testing.assert_allclose(out["g.w"], np.float32([1.5, -3.0, 6.0]), rtol=1e-6)
