"""Tests of the op records' kernels (``timerlc.ops``): every op evaluated over a batch of
points at once must equal, at each batch point, the same kernel run at that one point (as
the reference interpreter runs it), for batches of one and two axes, with inputs shared
along a batch axis; and the package the runtime imports never imports the compiler."""

import ast
from pathlib import Path

import numpy as np
import pytest
import sympy

from timerlc.ir import index as ix
from timerlc.ops import REGISTRY
from timerlc.types import TensorType, numpy_dtype
from timerlc.plan.items import Ix
from timerlc.ops import run_op

ROOT = Path(__file__).resolve().parent.parent
B, T, K = ix.sym("b"), ix.sym("t"), ix.sym("k")
BOUNDS = {"b": 4, "t": 5, "k": 3}
SPACE_BT = (("b", 4), ("t", 5))
NOT_KERNELS = {"merge", "grad", "env_reset", "env_step"}


def _points(batch):
    """b and t vary over the batch (when it has axes), k is the same everywhere."""
    nb = len(batch)
    if nb == 0:
        return {"b": 1, "t": 2, "k": 2}
    if nb == 1:
        return {"b": np.arange(batch[0]), "t": 2, "k": 2}
    return {
        "b": np.arange(batch[0]).reshape(batch[0], 1),
        "t": np.arange(batch[1]).reshape(1, batch[1]) + 1,
        "k": 2,
    }


def _arg_batches(batch, n_args, broadcast):
    """Each input's batch shape: the full one, or alternately a size-1 first/second axis."""
    if not broadcast:
        return [batch] * n_args
    return [
        (1,) + batch[1:] if k % 2 == 0 else batch[:1] + (1,) * (len(batch) - 1)
        for k in range(n_args)
    ]


BATCHES = [((3,), False), ((2, 3), False), ((2, 3), True), ((), False)]


def _value(gen, dtype, shape, kind):
    dt = numpy_dtype(dtype)
    if isinstance(kind, tuple):  # ("idx", n): indices in [-n, n); ("pos", n): in [0, n)
        lo = -kind[1] if kind[0] == "idx" else 0
        return gen.integers(lo, kind[1], shape).astype(dt)
    if kind == "n":
        return gen.standard_normal(shape).astype(dt)
    if kind == "p":
        return gen.uniform(0.5, 2.0, shape).astype(dt)
    if kind == "u":
        return gen.uniform(0.0, 1.0, shape).astype(dt)
    if kind == "ninf":  # normal, with -inf entries and an all -inf first row
        x = gen.standard_normal(shape)
        x[gen.uniform(size=shape) < 0.2] = -np.inf
        x[..., 0, :] = -np.inf
        return x.astype(dt)
    if kind == "i":
        return gen.integers(-5, 6, shape).astype(dt)
    if kind == "nz":
        return (gen.integers(1, 6, shape) * gen.choice([-1, 1], shape)).astype(dt)
    if kind == "e":
        return gen.integers(-3, 4, shape).astype(dt)
    if kind == "b":
        return gen.uniform(size=shape) < 0.5
    raise ValueError(kind)


def _reference(name, attrs, args, batch, point, out_dtype, out_shape):
    """The per-point meaning at every batch point, stacked."""
    outs = []
    for bix in np.ndindex(*batch):
        at = [a[tuple(i if s != 1 else 0 for i, s in zip(bix, a.shape))] for a in args]
        p = {
            d: int(v) if np.ndim(v) == 0 else int(np.broadcast_to(v, batch)[bix])
            for d, v in point.items()
        }
        out = run_op(name, attrs, at, (), p, out_dtype, out_shape)
        outs.append(out)
    return np.stack(outs).reshape(batch + outs[0].shape)


def check(name, attrs, specs, seed=0):
    """``specs``: one (dtype, spatial shape, kind) per input."""
    spatial = [TensorType(dt, tuple(shape)) for dt, shape, _ in specs]
    out_t = REGISTRY[name].infer(attrs, spatial)
    declared = REGISTRY[name].attrs
    assert set(attrs) <= set(declared), f"{name} reads undeclared attributes"
    assert {k for k, v in declared.items() if not v.endswith("?")} <= set(attrs), name
    exact = not out_t.dtype.startswith("f") or name.startswith("random_")
    for batch, broadcast in BATCHES:
        gen = np.random.default_rng(seed)
        bshapes = _arg_batches(batch, len(specs), broadcast)
        args = [
            _value(gen, dt, bs + tuple(shape), kind)
            for (dt, shape, kind), bs in zip(specs, bshapes)
        ]
        point = _points(batch)
        got = run_op(name, plan_attrs(attrs), args, batch, point, out_t.dtype, out_t.shape)
        want = _reference(name, plan_attrs(attrs), args, batch, point, out_t.dtype, out_t.shape)
        where = f"{name} {attrs} batch {batch} broadcast {broadcast}"
        assert got.shape == batch + out_t.shape, where
        assert got.dtype == numpy_dtype(out_t.dtype), where
        if exact:
            np.testing.assert_array_equal(got, want, err_msg=where)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=where)


def plan_attrs(v):
    """PDG attribute values as a plan holds them: index expressions as ``Ix``."""
    if isinstance(v, dict):
        return {k: plan_attrs(x) for k, x in v.items()}
    if isinstance(v, tuple):
        return tuple(plan_attrs(x) for x in v)
    if isinstance(v, sympy.Basic) and not isinstance(v, sympy.logic.boolalg.BooleanAtom):
        return int(v) if v.is_Integer else Ix(ix.to_plan(v))
    return v


def C(name, attrs=None, *specs, id=None):
    return pytest.param(name, attrs or {}, list(specs), id=id or name)


F = "f32"
UNARY = [
    C(n, {}, (F, (4,), kind), id=f"{n}")
    for n, kind in [
        ("exp", "n"),
        ("log", "p"),
        ("log1p", "p"),
        ("sqrt", "p"),
        ("tanh", "n"),
        ("sigmoid", "n"),
        ("sin", "n"),
        ("cos", "n"),
        ("floor", "n"),
        ("ceil", "n"),
        ("round", "n"),
        ("neg", "n"),
        ("abs", "n"),
        ("sign", "n"),
        ("stop_grad", "n"),
        ("copy", "n"),
    ]
] + [
    C("sigmoid", {}, ("f64", (2, 3), "n"), id="sigmoid-f64"),
    C("neg", {}, ("i32", (3,), "i"), id="neg-i32"),
    C("neg", {}, ("f64", (), "n"), id="neg-scalar"),
    C("abs", {}, ("i32", (3, 2), "i"), id="abs-i32"),
    C("sign", {}, ("i64", (4,), "i"), id="sign-i64"),
    C("copy", {}, ("bool", (3,), "b"), id="copy-bool"),
    C("copy", {}, ("i64", (), "i"), id="copy-scalar"),
    C("logical_not", {}, ("bool", (3,), "b")),
    C("cast", {"dtype": "i32"}, (F, (5,), "n"), id="cast-f32-i32"),
    C("cast", {"dtype": "f32"}, ("i32", (5,), "i"), id="cast-i32-f32"),
    C("cast", {"dtype": "bool"}, ("f64", (5,), "i"), id="cast-f64-bool"),
    C("cast", {"dtype": "i64"}, ("bool", (2, 2), "b"), id="cast-bool-i64"),
    C("cast", {"dtype": "f64"}, (F, (), "n"), id="cast-f32-f64"),
]

BINARY = (
    [
        C("add", {}, (F, (3, 4), "n"), (F, (4,), "n"), id="add-f32"),
        C("add", {}, ("i32", (4,), "i"), ("i32", (), "i"), id="add-i32"),
        C("sub", {}, (F, (3, 1), "n"), (F, (4,), "n"), id="sub-f32"),
        C("sub", {}, ("i64", (), "i"), ("i64", (2, 3), "i"), id="sub-i64"),
        C("mul", {}, ("f64", (2, 3), "n"), ("f64", (2, 3), "n"), id="mul-f64"),
        C("mul", {}, ("i32", (3,), "i"), ("i32", (2, 3), "i"), id="mul-i32"),
        C("div", {}, (F, (3,), "n"), (F, (3,), "p")),
        C("floordiv", {}, (F, (4,), "n"), (F, (4,), "p"), id="floordiv-f32"),
        C("floordiv", {}, ("i32", (4,), "i"), ("i32", (4,), "nz"), id="floordiv-i32"),
        C("mod", {}, ("i32", (4,), "i"), ("i32", (4,), "nz"), id="mod-i32"),
        C("mod", {}, (F, (4,), "n"), (F, (), "p"), id="mod-f32"),
        C("pow", {}, ("i32", (6,), "i"), ("i32", (6,), "e"), id="pow-i32"),
        C("pow", {}, ("i64", (2, 3), "i"), ("i64", (3,), "e"), id="pow-i64"),
        C("pow", {}, (F, (4,), "p"), (F, (4,), "n"), id="pow-f32"),
        C("minimum", {}, (F, (3, 4), "n"), (F, (4,), "n"), id="minimum-f32"),
        C("maximum", {}, ("i64", (4,), "i"), ("i64", (3, 1), "i"), id="maximum-i64"),
        C("logical_and", {}, ("bool", (2, 3), "b"), ("bool", (3,), "b")),
        C("logical_or", {}, ("bool", (3,), "b"), ("bool", (), "b")),
        C("where", {}, ("bool", (3, 1), "b"), (F, (4,), "n"), (F, (), "n"), id="where-f32"),
        C(
            "where",
            {},
            ("bool", (), "b"),
            ("i32", (2, 2), "i"),
            ("i32", (2,), "i"),
            id="where-i32",
        ),
    ]
    + [
        C(n, {}, ("i32", (3, 4), "i"), ("i32", (4,), "i"), id=n)
        for n in ("lt", "le", "gt", "ge", "eq", "ne")
    ]
    + [C("lt", {}, (F, (3,), "n"), (F, (), "n"), id="lt-f32")]
)

REDUCTIONS = [
    C("sum", {"axes": (1,)}, (F, (3, 4), "n"), id="sum-axis1"),
    C("sum", {"axes": None, "keepdims": True}, ("i32", (3, 4), "i"), id="sum-all-keep"),
    C("sum", {"axes": (0, 2)}, ("f64", (2, 3, 4), "n"), id="sum-axes02"),
    C("sum", {"axes": ()}, (F, (3,), "n"), id="sum-none"),
    C("prod", {"axes": (0,)}, (F, (3, 4), "p"), id="prod-f32"),
    C("prod", {}, ("i64", (4,), "i"), id="prod-i64"),
    C("max", {"axes": (1,), "keepdims": True}, (F, (3, 4), "n"), id="max-keep"),
    C("min", {"axes": (0, 2)}, ("i32", (2, 3, 4), "i"), id="min-i32"),
    C("mean", {"axes": (0, 1)}, (F, (3, 4), "n"), id="mean-f32"),
    C("mean", {"keepdims": True}, ("f64", (5,), "n"), id="mean-f64-keep"),
    C("logsumexp", {"axes": (1,)}, (F, (3, 4), "n"), id="logsumexp"),
    C("logsumexp", {"axes": (1,), "keepdims": True}, ("f64", (3, 4), "ninf"), id="lse-inf"),
    C("logsumexp", {"axes": (0, 1)}, ("f64", (2, 3), "n"), id="logsumexp-all"),
    C("argmax", {"axis": None}, (F, (3, 4), "n"), id="argmax-flat"),
    C("argmax", {"axis": 1}, ("i32", (3, 4), "i"), id="argmax-axis1"),
    C("argmin", {"axis": 0}, ("i32", (3, 4), "i"), id="argmin-axis0"),
    C("argmin", {"axis": None}, ("f64", (2, 3, 2), "n"), id="argmin-flat"),
    C("discounted_sum", {}, (F, (5,), "n"), (F, (), "u"), id="discounted"),
    C("discounted_sum", {"reverse": True}, ("f64", (4, 3), "n"), ("f64", (), "u"), id="disc-rev"),
    C("cumsum", {"axis": None}, (F, (3, 4), "n"), id="cumsum-flat"),
    C("cumsum", {"axis": 1}, ("i32", (3, 4), "i"), id="cumsum-axis1"),
]

LINALG_SHAPES = [
    C("matmul", {}, (F, (3, 4), "n"), (F, (4, 2), "n"), id="mm-2d"),
    C("matmul", {}, (F, (4,), "n"), (F, (4, 2), "n"), id="mm-vec-mat"),
    C("matmul", {}, (F, (3, 4), "n"), (F, (4,), "n"), id="mm-mat-vec"),
    C("matmul", {}, ("f64", (4,), "n"), ("f64", (4,), "n"), id="mm-dot"),
    C("matmul", {}, ("f64", (2, 3, 4), "n"), ("f64", (4, 5), "n"), id="mm-stacked"),
    C("matmul", {}, ("i32", (2, 1, 3, 4), "i"), ("i32", (5, 4, 2), "i"), id="mm-bcast-i32"),
    C("reshape", {"shape": (2, 6)}, (F, (3, 4), "n"), id="reshape"),
    C("reshape", {"shape": (12,)}, ("i32", (2, 3, 2), "i"), id="reshape-flat"),
    C("reshape", {"shape": (1, 1)}, (F, (), "n"), id="reshape-scalar"),
    C("transpose", {"perm": (2, 0, 1)}, (F, (2, 3, 4), "n")),
    C("broadcast_to", {"shape": (2, 3)}, (F, (3,), "n"), id="bcast-vec"),
    C("broadcast_to", {"shape": (4, 3)}, ("i32", (1, 3), "i"), id="bcast-row"),
    C("broadcast_to", {"shape": (2,)}, ("bool", (), "b"), id="bcast-scalar"),
    C("expand_dims", {"axis": 0}, (F, (3,), "n"), id="expand0"),
    C("expand_dims", {"axis": 1}, (F, (3,), "n"), id="expand1"),
    C("squeeze", {"axes": (1,)}, (F, (3, 1, 2), "n"), id="squeeze"),
    C("squeeze", {"axes": (0,)}, ("i64", (1,), "i"), id="squeeze-all"),
    C("concat", {"axis": 0}, (F, (2, 3), "n"), (F, (1, 3), "n"), (F, (4, 3), "n"), id="concat0"),
    C("concat", {"axis": 1}, ("i32", (2, 1), "i"), ("i32", (2, 3), "i"), id="concat1"),
]

INDEXING = [
    C("index", {"items": (("int", T),)}, (F, (6, 4), "n"), id="index-int-dim"),
    C("index", {"items": (("int", sympy.Integer(-1)),)}, (F, (6,), "n"), id="index-int-neg"),
    C("index", {"items": (("slice", B, 2), ("int", T))}, (F, (5, 6), "n"), id="index-slice-int"),
    C("index", {"items": (("full",), ("slice", T - 1, 3))}, ("i32", (3, 6), "i"), id="idx-sl"),
    C(
        "index",
        {"items": (("full",), ("slice", sympy.Integer(1), 2))},
        (F, (3, 4), "n"),
        id="index-const-slice",
    ),
    C(
        "index",
        {"items": (("gather",),)},
        (F, (5,), "n"),
        ("i32", (3, 2), ("idx", 5)),
        id="index-gather",
    ),
    C(
        "index",
        {"items": (("full",), ("gather",))},
        (F, (3, 5), "n"),
        ("i64", (4,), ("idx", 5)),
        id="index-full-gather",
    ),
    C(
        "index",
        {"items": (("int", B), ("full",), ("gather",))},
        (F, (4, 3, 5), "n"),
        ("i32", (2,), ("idx", 5)),
        id="index-gather-apart",
    ),
    C(
        "index",
        {"items": (("full",), ("int", T), ("gather",))},
        (F, (2, 4, 5), "n"),
        ("i32", (3,), ("idx", 5)),
        id="index-gather-adjacent",
    ),
    C(
        "index",
        {"items": (("gather",), ("int", ix.floordiv(T + B, 2)))},
        (F, (5, 4), "n"),
        ("i32", (2,), ("idx", 5)),
        id="index-gather-floor",
    ),
    C("index", {"items": (("int", ix.mod(T + 3 * B, 3)),)}, (F, (3, 2), "n"), id="index-mod"),
    C(
        "index",
        {"items": (("int", sympy.Min(T, 2)), ("int", sympy.Max(B, 1) - 1))},
        ("i64", (3, 2), "i"),
        id="index-min-max",
    ),
    C("index", {"items": (("int", K),)}, (F, (3, 2), "n"), id="index-unbatched-dim"),
    C("index_add", {"items": (("int", T),), "shape": (6, 4)}, (F, (4,), "n"), id="ia-int"),
    C(
        "index_add",
        {"items": (("slice", B, 2), ("int", T)), "shape": (5, 6)},
        (F, (2,), "n"),
        id="ia-slice-int",
    ),
    C(
        "index_add",
        {"items": (("full",), ("slice", sympy.Integer(1), 2)), "shape": (3, 4)},
        (F, (3, 2), "n"),
        id="ia-const-slice",
    ),
    C(
        "index_add",
        {"items": (("gather",),), "shape": (5,)},
        (F, (3, 2), "n"),
        ("i32", (3, 2), ("idx", 5)),
        id="ia-gather-dups",
    ),
    C(
        "index_add",
        {"items": (("gather",),), "shape": (4,)},
        ("i32", (6,), "i"),
        ("i64", (6,), ("pos", 4)),
        id="ia-gather-i32",
    ),
    C(
        "index_add",
        {"items": (("full",), ("gather",)), "shape": (3, 5)},
        (F, (3, 4), "n"),
        ("i32", (4,), ("idx", 5)),
        id="ia-full-gather",
    ),
    C(
        "index_add",
        {"items": (("int", B), ("full",), ("gather",)), "shape": (4, 3, 5)},
        (F, (2, 3), "n"),
        ("i32", (2,), ("idx", 5)),
        id="ia-gather-apart",
    ),
    C(
        "index_add",
        {"items": (("full",), ("int", T), ("gather",)), "shape": (2, 4, 5)},
        ("f64", (2, 3), "n"),
        ("i32", (3,), ("idx", 5)),
        id="ia-gather-adjacent",
    ),
    C("take", {"axis": None}, (F, (3, 4), "n"), ("i32", (2, 5), ("idx", 12)), id="take-flat"),
    C("take", {"axis": 0}, (F, (3, 4), "n"), ("i64", (2,), ("idx", 3)), id="take-axis0"),
    C("take", {"axis": 1}, ("i32", (3, 4), "i"), ("i32", (2, 3), ("idx", 4)), id="take-axis1"),
    C("take_along", {"axis": 1}, (F, (3, 4), "n"), ("i32", (3, 2), ("idx", 4)), id="tal-1"),
    C("take_along", {"axis": 1}, (F, (1, 4), "n"), ("i32", (3, 2), ("idx", 4)), id="tal-bc"),
    C("take_along", {"axis": 0}, ("i64", (3, 4), "i"), ("i64", (2, 4), ("idx", 3)), id="tal-0"),
    C(
        "take_along_add",
        {"axis": 1, "shape": (3, 4)},
        (F, (3, 2), "n"),
        ("i32", (3, 2), ("idx", 4)),
        id="taa-1",
    ),
    C(
        "take_along_add",
        {"axis": 1, "shape": (1, 4)},
        (F, (3, 2), "n"),
        ("i32", (3, 2), ("idx", 4)),
        id="taa-broadcast",
    ),
    C(
        "take_along_add",
        {"axis": 0, "shape": (3, 4)},
        ("f64", (2, 4), "n"),
        ("i64", (2, 1), ("idx", 3)),
        id="taa-0",
    ),
]

SOURCES = [
    C("const", {"value": 1.5, "dtype": "f32", "shape": (2, 3)}, id="const-f32"),
    C("const", {"value": ((1, 2), (3, 4)), "dtype": "i32", "shape": (2, 2)}, id="const-nested"),
    C("const", {"value": True, "dtype": "bool", "shape": ()}, id="const-bool"),
    C("arange", {"start": 0, "stop": 5, "step": 1, "dtype": "i32"}, id="arange"),
    C("arange", {"start": 2, "stop": 11, "step": 3, "dtype": "f32"}, id="arange-f32"),
    C("arange", {"start": 5, "stop": 0, "step": -2, "dtype": "i64"}, id="arange-down"),
    C("dimval", {"dim": "t"}, id="dimval-t"),
    C("dimval", {"dim": "b"}, id="dimval-b"),
    C("dimval", {"dim": "k"}, id="dimval-unbatched"),
    C("index_value", {"expr": T + 2 * B - 1}, id="ixval-affine"),
    C("index_value", {"expr": ix.floordiv(T + 1, 2) - ix.mod(3 * B + T, 4)}, id="ixval-floor"),
    C("index_value", {"expr": sympy.Min(T, B) + sympy.Max(T, 2)}, id="ixval-min-max"),
    C("index_value", {"expr": sympy.Integer(7)}, id="ixval-const"),
    C("index_value", {"expr": ix.floordiv(-T, 2) + 2 * ix.floordiv(B + 1, 2)}, id="ixval-neg"),
]


def _draw(**kw):
    return {"seed": 7, "site": 123456, **kw}


RANDOM = [
    C("random_uniform", _draw(space=SPACE_BT, shape=(2, 3), dtype="f32"), id="uniform-f32"),
    C("random_uniform", _draw(space=(("t", 5),), shape=(), dtype="f64"), id="uniform-f64"),
    C("random_uniform", _draw(space=(), shape=(4,), dtype="f32"), id="uniform-nospace"),
    C("random_uniform", _draw(space=(("k", 3), ("b", 4)), shape=(3,), dtype="f32"), id="u-k"),
    C("random_normal", _draw(space=SPACE_BT, shape=(2, 3), dtype="f32"), id="normal-f32"),
    C("random_normal", _draw(space=(("b", 4),), shape=(5,), dtype="f64"), id="normal-f64"),
    C("random_gumbel", _draw(space=SPACE_BT, shape=(2, 3), dtype="f64"), id="gumbel"),
    C("random_uniform_at", _draw(shape=(2, 3), dtype="f32"), ("i64", (), "i"), id="uniform-at"),
    C("random_normal_at", _draw(shape=(3,), dtype="f64"), ("i64", (), "i"), id="normal-at"),
    C("random_categorical", _draw(space=SPACE_BT), (F, (3, 5), "n"), id="categorical"),
    C("random_categorical", _draw(space=()), ("f64", (4,), "n"), id="categorical-nospace"),
    C("random_bernoulli", _draw(space=SPACE_BT), ("f64", (2, 3), "u"), id="bernoulli"),
    C("random_bernoulli", _draw(space=()), ("f64", (4,), "u"), id="bernoulli-nospace"),
    C("random_permutation", _draw(space=SPACE_BT, n=6), id="permutation"),
    C("random_permutation", _draw(space=(), n=5), id="permutation-nospace"),
    C("random_init", _draw(kind="glorot", space=(), shape=(3, 4), dtype="f32"), id="glorot"),
    C(
        "random_init",
        _draw(kind="glorot", space=(("b", 4),), shape=(2, 3, 4), dtype="f64"),
        id="glorot-3d",
    ),
    C(
        "random_init",
        _draw(kind="orthogonal", gain=1.0, space=SPACE_BT, shape=(3, 4), dtype="f32"),
        id="orthogonal-wide",
    ),
    C(
        "random_init",
        _draw(kind="orthogonal", gain=0.5, space=(("t", 5),), shape=(4, 2), dtype="f64"),
        id="orthogonal-tall",
    ),
    C(
        "random_init",
        _draw(kind="orthogonal", gain=2.0, space=(), shape=(2, 2, 3), dtype="f32"),
        id="orthogonal-nospace",
    ),
    C(
        "random_init",
        _draw(kind="normal", std=0.1, space=SPACE_BT, shape=(5,), dtype="f32"),
        id="init-normal",
    ),
    C(
        "random_init",
        _draw(kind="uniform", lo=-0.5, hi=0.25, space=SPACE_BT, shape=(2, 2), dtype="f64"),
        id="init-uniform",
    ),
]

CASES = UNARY + BINARY + REDUCTIONS + LINALG_SHAPES + INDEXING + SOURCES + RANDOM


@pytest.mark.parametrize("name,attrs,specs", CASES)
def test_kernel_matches_per_point_meaning(name, attrs, specs):
    check(name, attrs, specs)


# ops whose gradient is not defined (they are themselves transposes, made by autodiff)
NO_VJP = {"index_add", "take_along_add"}


def test_every_op_is_declared_once_with_all_its_rules():
    for name, op in REGISTRY.items():
        assert op.name == name and callable(op.infer), name
        assert op.kernel is not None or name in NOT_KERNELS, f"{name} has no kernel"
        assert op.vjp is not None or name in NO_VJP, f"{name} has no vjp (nor NO_GRAD)"
        assert all(k.rstrip("?") in ATTR_KINDS for k in op.attrs.values()), name
    kernels = {n for n, op in REGISTRY.items() if op.kernel is not None}
    tested = {c.values[0] for c in CASES}
    assert kernels <= tested, sorted(kernels - tested)
    assert {n for n, op in REGISTRY.items() if op.kind == "env"} == {"env_reset", "env_step"}


ATTR_KINDS = {
    "dtype", "shape", "int", "ints", "axes", "bool", "float", "const", "dim", "ix", "items",
    "space", "init", "env", "key", "names",
}  # fmt: skip
SHARED = ("timerlc.rng", "timerlc.types", "timerlc.diagnostics", "timerlc.plan.items")
SHARED += (
    "timerlc.plan.expr",
    "timerlc.plan.arena",
    "timerlc.ops",
    "timerlc.runtime",
    "timerlc.envs",
    "timerlc.deepstack",
)


@pytest.mark.parametrize(
    "path",
    sorted((ROOT / "timerlc" / "runtime").glob("*.py"))
    + sorted((ROOT / "timerlc" / "ops").glob("*.py")),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_the_runtime_and_the_ops_do_not_import_the_compiler(path):
    """Module-level imports only (a vjp rule, which only the compiler runs, may import sympy
    inside itself); ``test_cpu_backend`` checks what a run really imports."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import"
            names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for n in names:
            assert n.split(".")[0] not in ("sympy", "islpy", "lark"), f"{path.name} imports {n}"
            if n.split(".")[0] == "timerlc" and n != "timerlc":
                assert n.startswith(SHARED), f"{path.name} imports {n}"


def test_index_expressions_of_a_plan():
    x = np.arange(2 * 3 * 5 * 4, dtype=np.float32).reshape(2, 3, 5, 4)
    point = _points((2, 3))
    b, t = point["b"], point["t"]
    for expr, want in [
        (ix.floordiv(T + B, 2), (t + b) // 2),
        (4 - T, 4 - t + 0 * b),
        (ix.mod(3 * B + T, 5), (3 * b + t) % 5),
        (sympy.Min(T, 2), np.minimum(t, 2) + 0 * b),
        (sympy.Max(B, T - 1, 1), np.maximum(b, np.maximum(t - 1, 1))),
    ]:
        args = ([x], (2, 3), point, "f32", (4,))
        got = run_op("index", {"items": (("int", Ix(ix.to_plan(expr))),)}, *args)
        rows = np.arange(2).reshape(2, 1)
        cols = np.arange(3).reshape(1, 3)
        np.testing.assert_array_equal(got, x[rows, cols, want % 5], err_msg=str(expr))


def test_errors_as_at_one_point():
    x = np.zeros((3, 4), np.float32)
    point = {"t": np.array([1, 2, 4])}
    with pytest.raises(IndexError, match="out of range"):
        run_op("index", {"items": (("int", Ix("t")),)}, [x], (3,), point, "f32", ())
    with pytest.raises(IndexError, match="out of range"):
        idx = np.array([[0], [4], [1]], np.int32)
        run_op("take", {"axis": 0}, [x, idx], (3,), {}, "f32", (1,))
    with pytest.raises(ValueError, match="empty"):
        run_op("max", {"axes": (0,)}, [np.zeros((3, 0))], (3,), {}, "f64", ())
    with pytest.raises(ValueError, match="no batched kernel"):
        run_op("merge", {}, [x], (3,), {}, "f32", (4,))
    with pytest.raises(ValueError, match="batch"):
        run_op("neg", {}, [np.zeros((2, 4), np.float32)], (3,), {}, "f32", (4,))


def test_results_are_fresh_arrays():
    x = np.ones((3, 4), np.float32)
    out = run_op("copy", {}, [x], (3,), {}, "f32", (4,))
    assert not np.shares_memory(out, x) and out.flags.writeable
    out = run_op("const", {"value": 2, "dtype": "i32", "shape": (2,)}, [], (3, 2), {}, "i32", (2,))
    assert out.shape == (3, 2, 2) and out.flags.writeable and out.flags.c_contiguous
    assert (out == 2).all()
