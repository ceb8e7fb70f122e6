"""Conformance tests from LANGUAGE.md section 5: operators and their precedence, integer
division and modulo, matmul, broadcasting, dtype promotion and the float-literal rule,
min/max in both roles, keyword arguments.
"""

import numpy as np
import pytest
from rtl_helpers import close, run, run1

# ============================================================================ operators


@pytest.mark.parametrize(
    "expr, expected",
    [
        ("10 - 3 - 2", 5),
        ("2 + 3 * 4", 14),
        ("(2 + 3) * 4", 20),
        ("2 * 3 % 4", 2),
        ("7 // 2 * 2", 6),
        ("100 // 10 // 3", 3),
        ("2 ** 3 ** 2", 512),
        ("-2 ** 2", -4),
        ("(-2) ** 2", 4),
        ("- 3 * 2", -6),
        ("2 * -3", -6),
        ("2 - -3", 5),
        ("-7 // 2", -4),
        ("-7 % 2", 1),
        ("7 % -2", -1),
        ("7 // -2", -4),
        ("-7 % -2", -1),
    ],
)
def test_integer_arithmetic_and_precedence(expr, expected):
    close(run1(f"y = {expr}\nout y\n"), np.int32(expected), np.int32)


@pytest.mark.parametrize(
    "expr, expected",
    [
        ("2.0 ** -1", 0.5),
        ("2.0 ** -1.0", 0.5),
        ("-2.0 ** 2", -4.0),
        ("-x ** 2", -9.0),
        ("x ** 2 * 2.0", 18.0),
        ("2.0 * x ** 2", 18.0),
        ("x - 1.0 - 1.0", 1.0),
        ("x / 2.0 / 3.0", 0.5),
        ("x // 2.0", 1.0),
        ("-x // 2.0", -2.0),
        ("x % 2.0", 1.0),
        ("-x % 2.0", 1.0),
        ("x % -2.0", -1.0),
        ("-7.5 % 2.0", 0.5),
        ("7 / 2", 3.5),
        ("x ** 0.5", 3.0**0.5),
        ("+x", 3.0),
    ],
)
def test_float_arithmetic_and_precedence(expr, expected):
    close(run1(f"x = 3.0\ny = {expr}\nout y\n"), np.float32(expected), np.float32)


@pytest.mark.parametrize(
    "expr, expected",
    [
        ("not 1 < 2", False),
        ("not 2 < 1", True),
        ("1 < 2 and 2 < 1", False),
        ("1 < 2 or 2 < 1", True),
        ("true or false and false", True),
        ("(true or false) and false", False),
        ("not true or true", True),
        ("not (true or true)", False),
        ("1 + 1 == 2", True),
        ("2 * 3 > 5 and not 1 >= 2", True),
        ("1 < 2 < 3", True),
        ("1 < 3 < 2", False),
        ("3 > 2 > 1", True),
        ("1 == 1 != 2", True),
        ("true == true", True),
        ("1 != 1.0", False),
    ],
)
def test_boolean_operators_comparisons_and_precedence(expr, expected):
    close(run1(f"y = {expr}\nout y\n"), np.bool_(expected), np.bool_)


def test_chained_comparisons_on_tensors():
    out = run(
        """
        config T = 6
        dim t < T
        y[t] = 1 < t <= 4
        z[t] = not t < 2 and t != 5
        out y, z
        """
    )
    t = np.arange(6)
    close(out["y"], (1 < t) & (t <= 4), np.bool_)
    close(out["z"], ~(t < 2) & (t != 5), np.bool_)


def test_logical_operators_on_bool_arrays():
    out = run(
        """
        a = arange(4) < 2
        b = arange(4) % 2 == 0
        c = a and b
        d = a or b
        e = not a
        out c, d, e
        """
    )
    a = np.arange(4) < 2
    b = np.arange(4) % 2 == 0
    close(out["c"], a & b, np.bool_)
    close(out["d"], a | b, np.bool_)
    close(out["e"], ~a, np.bool_)


def test_integer_floor_division_and_modulo_on_tensors():
    out = run(
        """
        a = arange(9) - 4
        q = a // 3
        r = a % 3
        qn = a // -3
        rn = a % -3
        out q, r, qn, rn
        """
    )
    a = np.arange(9, dtype=np.int32) - 4
    close(out["q"], a // 3, np.int32)
    close(out["r"], a % 3, np.int32)
    close(out["qn"], a // -3, np.int32)
    close(out["rn"], a % -3, np.int32)


def test_float_floor_division_and_modulo_on_tensors():
    out = run(
        """
        a = f32(arange(9)) - 4.5
        q = a // 2.0
        r = a % 2.0
        rn = a % -2.0
        out q, r, rn
        """
    )
    a = np.arange(9, dtype=np.float32) - 4.5
    close(out["q"], np.floor_divide(a, np.float32(2)), np.float32)
    close(out["r"], np.mod(a, np.float32(2)), np.float32)
    close(out["rn"], np.mod(a, np.float32(-2)), np.float32)


def test_true_division_of_ints_gives_a_float():
    out = run(
        """
        a = arange(5)
        y = a / 2
        z = 7 / 2
        out y, z
        """
    )
    assert out["y"].dtype.kind == "f" and out["z"].dtype.kind == "f"
    close(out["y"], np.arange(5) / 2)
    close(out["z"], 3.5)


def test_matmul_shapes_and_batching():
    out = run(
        """
        a = reshape(f32(arange(6)), [2, 3])
        b = reshape(f32(arange(12)), [3, 4])
        v = f32(arange(3))
        c = reshape(f32(arange(24)), [2, 3, 4])
        d = reshape(f32(arange(8)), [4, 2])
        mm = a @ b
        mv = a @ v
        vm = v @ b
        vv = v @ v
        bm = c @ d
        cc = c @ reshape(f32(arange(16)), [2, 4, 2])
        pre = 2.0 * a @ b
        out mm, mv, vm, vv, bm, cc, pre
        """
    )
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(12, dtype=np.float32).reshape(3, 4)
    v = np.arange(3, dtype=np.float32)
    c = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    d = np.arange(8, dtype=np.float32).reshape(4, 2)
    close(out["mm"], a @ b, np.float32)
    close(out["mv"], a @ v)
    close(out["vm"], v @ b)
    close(out["vv"], v @ v)
    close(out["bm"], c @ d)
    close(out["cc"], c @ np.arange(16, dtype=np.float32).reshape(2, 4, 2))
    close(out["pre"], (2 * a) @ b)


def test_matmul_of_ints():
    out = run("a = reshape(arange(4), [2, 2])\ny = a @ a\nout y\n")
    a = np.arange(4).reshape(2, 2)
    close(out["y"], a @ a, np.int32)


def test_numpy_broadcasting():
    out = run(
        """
        a = f32(arange(3))
        b = reshape(f32(arange(2)), [2, 1])
        c = reshape(f32(arange(6)), [2, 1, 3])
        s = a + b
        p = c * reshape(f32(arange(4)), [4, 1])
        q = a - 1.0
        r = 10.0 - b
        out s, p, q, r
        """
    )
    a = np.arange(3, dtype=np.float32)
    b = np.arange(2, dtype=np.float32).reshape(2, 1)
    c = np.arange(6, dtype=np.float32).reshape(2, 1, 3)
    close(out["s"], a + b)
    close(out["p"], c * np.arange(4, dtype=np.float32).reshape(4, 1))
    close(out["q"], a - 1)
    close(out["r"], 10 - b)


def test_comparison_broadcasts_and_gives_bool():
    out = run("a = arange(3)\nb = reshape(arange(2), [2, 1])\ny = a > b\nout y\n")
    close(out["y"], np.arange(3) > np.arange(2).reshape(2, 1), np.bool_)


# ============================================================================ dtype promotion


@pytest.mark.parametrize(
    "expr, dtype, value",
    [
        ("i32(2) + i64(3)", np.int64, 5),
        ("i64(2) + f32(0.5)", np.float32, 2.5),
        ("f32(2.0) + f64(0.5)", np.float64, 2.5),
        ("i32(2) * f64(1.5)", np.float64, 3.0),
        ("true + i32(1)", np.int32, 2),
        ("(1 < 2) + i64(1)", np.int64, 2),
        ("(1 < 2) * 2.5", np.float32, 2.5),
        ("i64(5) + 1", np.int64, 6),
        ("i64(5) * 2", np.int64, 10),
        ("i32(5) + 0.5", np.float32, 5.5),
        ("i64(5) + 0.5", np.float32, 5.5),
        ("f64(5) + 1", np.float64, 6.0),
        ("f32(5) + 1", np.float32, 6.0),
        ("f64(1) / 3", np.float64, 1 / 3),
        ("i64(7) // 2", np.int64, 3),
        ("i64(7) % 4", np.int64, 3),
        ("i32(2) ** 3", np.int32, 8),
        ("f64(2) ** 0.5", np.float64, 2**0.5),
        ("-i64(3)", np.int64, -3),
    ],
)
def test_dtype_promotion(expr, dtype, value):
    y = run1(f"y = {expr}\nout y\n")
    close(y, np.asarray(value, dtype), dtype, rtol=1e-12 if dtype == np.float64 else 1e-6)


def test_promotion_of_arrays_with_weak_literals_keeps_the_array_dtype():
    out = run(
        """
        a = i64(arange(3)) + 1
        b = f64(arange(3)) * 0.1
        c = zeros([3], dtype=f64) + 1e-3
        d = arange(3) * 2
        e = f32(arange(3)) + 1
        out a, b, c, d, e
        """
    )
    close(out["a"], np.arange(3, dtype=np.int64) + 1, np.int64)
    close(out["b"], np.arange(3, dtype=np.float64) * 0.1, np.float64, rtol=1e-15, atol=0)
    close(out["c"], np.full(3, 1e-3), np.float64, rtol=1e-15, atol=0)
    close(out["d"], np.arange(3, dtype=np.int32) * 2, np.int32)
    close(out["e"], np.arange(3, dtype=np.float32) + 1, np.float32)


def test_recurrence_tensor_promotes_over_its_equations():
    out = run(
        """
        config T = 3
        dim t < T
        x[0] = 0
        x[t+1] = x[t] + 0.5
        out x
        """
    )
    close(out["x"], np.arange(4) * 0.5, np.float32)


# ============================================================================ min / max


def test_min_max_in_value_expressions_are_reductions():
    out = run(
        """
        m = reshape(f32(arange(6)) * (0.0 - 1.0) + 2.0, [2, 3])
        a = max(m)
        b = min(m)
        c = max(m, 0)
        d = min(m, 1)
        e = max(m, -1)
        f = minimum(m, 0.0)
        g = maximum(m, reshape(f32(arange(3)), [3]))
        out a, b, c, d, e, f, g
        """
    )
    m = -np.arange(6, dtype=np.float32).reshape(2, 3) + 2
    close(out["a"], m.max())
    close(out["b"], m.min())
    close(out["c"], m.max(0))
    close(out["d"], m.min(1))
    close(out["e"], m.max(-1))
    close(out["f"], np.minimum(m, 0))
    close(out["g"], np.maximum(m, np.arange(3, dtype=np.float32)))


def test_min_max_in_index_expressions_are_binary():
    out = run(
        """
        config T = 5, W = min(3, T), V = max(T, 8)
        dim t < T
        x[t] = f32(t)
        y[t] = x[min(t + 2, T - 1)] + x[max(t - W, 0)] + f32(V)
        out y
        """
    )
    t = np.arange(5)
    close(out["y"], (np.minimum(t + 2, 4) + np.maximum(t - 3, 0) + 8).astype(np.float32))


def test_minimum_maximum_of_ints_and_dims():
    out = run(
        """
        config T = 5
        dim t < T
        y[t] = minimum(t, 2)
        z[t] = maximum(t, 3)
        out y, z
        """
    )
    t = np.arange(5)
    close(out["y"], np.minimum(t, 2), np.int32)
    close(out["z"], np.maximum(t, 3), np.int32)


# ============================================================================ keyword arguments


def test_keyword_arguments_of_builtins():
    out = run(
        """
        m = reshape(f32(arange(6)), [2, 3])
        a = zeros([3], dtype=f64)
        b = ones([2], dtype=i32)
        c = sum(m, axis=1)
        d = softmax(m, axis=0)
        e = full(2.5, [2], dtype=f64)
        out a, b, c, d, e
        """
    )
    m = np.arange(6, dtype=np.float32).reshape(2, 3)
    close(out["a"], np.zeros(3), np.float64)
    close(out["b"], np.ones(2), np.int32)
    close(out["c"], m.sum(1))
    close(out["d"], np.exp(m) / np.exp(m).sum(0, keepdims=True), rtol=1e-5)
    close(out["e"], np.full(2, 2.5), np.float64)


def test_matmul_broadcasts_batch_axes_and_vector_operands():
    out = run(
        """
        a = reshape(f32(arange(24)), [2, 1, 3, 4])
        b = reshape(f32(arange(40)), [5, 4, 2])
        c = reshape(f32(arange(40)), [2, 4, 5])
        v = f32(arange(4))
        ab = a @ b
        vc = v @ c
        cv = transpose(c, [0, 2, 1]) @ v
        out ab, vc, cv
        """
    )
    a = np.arange(24, dtype=np.float32).reshape(2, 1, 3, 4)
    b = np.arange(40, dtype=np.float32).reshape(5, 4, 2)
    c = np.arange(40, dtype=np.float32).reshape(2, 4, 5)
    v = np.arange(4, dtype=np.float32)
    close(out["ab"], a @ b)
    close(out["vc"], v @ c)
    close(out["cv"], np.transpose(c, (0, 2, 1)) @ v)


def test_matmul_promotes_dtypes():
    out = run(
        """
        a = reshape(arange(4), [2, 2])
        y = a @ i64(a)
        z = f32(a) @ f64(a)
        out y, z
        """
    )
    a = np.arange(4).reshape(2, 2)
    close(out["y"], a @ a, np.int64)
    close(out["z"], a @ a, np.float64)
