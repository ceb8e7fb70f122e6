"""Conformance tests from LANGUAGE.md sections 2-3: lexical rules, configs and --set,
dims and their canonical order. Expected values are computed with NumPy.
"""

import numpy as np
import pytest
from rtl_helpers import close, run, run1

# ============================================================================ §2 lexical


def test_comments_full_line_and_trailing():
    out = run(
        """
        # a comment on its own line
        config T = 3   # a trailing comment
        dim t < T      # another
        # y is t squared
        y[t] = f32(t) * f32(t)   # the value
        out y          # done
        """
    )
    close(out["y"], np.arange(3, dtype=np.float32) ** 2, np.float32)


def test_comment_containing_operators_and_keywords_is_ignored():
    y = run1(
        """
        y = 1.0 # + 5 ** when config dim ( [ {
        out y
        """
    )
    close(y, np.float32(1.0), np.float32)


def test_newlines_inside_parentheses_and_brackets_do_not_end_statements():
    out = run(
        """
        config T = 2
        dim t < T
        m = reshape(arange(6),
                    [2,
                     3])
        y[t] = maximum(
            f32(t),
            0.5
        )
        z = sum(m,
                1)
        out m, y, z
        """
    )
    close(out["m"], np.arange(6).reshape(2, 3))
    close(out["y"], np.maximum(np.arange(2, dtype=np.float32), 0.5))
    close(out["z"], np.arange(6).reshape(2, 3).sum(1))


def test_comment_inside_a_parenthesized_continuation():
    y = run1(
        """
        y = (1.0 +   # first part
             2.0)    # second part
        out y
        """
    )
    close(y, np.float32(3.0))


def test_semicolons_separate_items_in_params_and_def_bodies():
    out = run(
        """
        params p { a : f32[] = 1.5; b : f32[2] = 2.0 }
        def f(x) { y = x * 2.0; z = y + 1.0; z * y }
        v = f(3.0) + p.a
        w = p.b
        out v, w
        """
    )
    close(out["v"], np.float32(7.0 * 6.0 + 1.5))
    close(out["w"], np.full(2, 2.0, np.float32))


def test_multiline_def_and_params_bodies():
    out = run(
        """
        params p {
          a : f32[] = 0.5
          b : f32[3] = 1.0
        }
        def f(x) {
          y = x + 1.0
          z = y * y
          z - 1.0
        }
        v = f(p.a)
        out v
        """
    )
    close(out["v"], np.float32(1.5 * 1.5 - 1.0))


@pytest.mark.parametrize(
    "literal, value",
    [
        ("3", 3),
        ("-2", -2),
        ("0.5", 0.5),
        ("1e-3", 1e-3),
        ("2.5e-4", 2.5e-4),
        ("1e3", 1000.0),
        ("-2.5", -2.5),
    ],
)
def test_number_forms(literal, value):
    y = run1(f"y = {literal}\nout y\n")
    if isinstance(value, int):
        close(y, np.int32(value), np.int32)
    else:
        close(y, np.float32(value), np.float32, rtol=1e-7)


def test_float_literal_is_f32_and_int_literal_is_i32():
    out = run("a = 0.1\nb = 7\nc = true\nd = false\nout a, b, c, d\n")
    close(out["a"], np.float32(0.1), np.float32, rtol=0)
    close(out["b"], np.int32(7), np.int32)
    close(out["c"], np.bool_(True), np.bool_)
    close(out["d"], np.bool_(False), np.bool_)


def test_float_literal_in_f64_context_is_f64():
    # "f32 unless a context of f64": 0.1 next to an f64 keeps its f64 value, not f32(0.1)
    out = run(
        """
        config T = 3
        dim t < T
        y[t] = f64(t) + 0.1
        z = zeros([2], dtype=f64) + 0.1
        w = f64(1) * 1e-3
        out y, z, w
        """
    )
    close(out["y"], np.arange(3, dtype=np.float64) + 0.1, np.float64, rtol=1e-15, atol=0)
    close(out["z"], np.full(2, 0.1, np.float64), np.float64, rtol=1e-15, atol=0)
    close(out["w"], np.float64(1e-3), np.float64, rtol=1e-15, atol=0)


def test_names_with_underscores_and_digits():
    out = run("_a1 = 2.0\nB_2c = _a1 * 3.0\nout B_2c\n")
    close(out["B_2c"], np.float32(6.0))


def test_blank_lines_and_leading_trailing_whitespace():
    out = run("\n\n   config T = 2   \n\n dim t < T\n\n  y[t] = f32(t)  \n\nout y\n\n\n")
    close(out["y"], np.arange(2, dtype=np.float32))


# ============================================================================ §3 configs


def test_config_arithmetic_and_dependence_on_earlier_configs():
    out = run(
        """
        config A = 7, B = A * 2 + 1, C = B // 4, D = B % 4, E = A / 2
        config F = min(A, C), G = max(A, B) - 1, H = A - B - C
        a = A
        b = B
        c = C
        d = D
        e = E
        f = F
        g = G
        h = H
        out a, b, c, d, e, f, g, h
        """
    )
    assert int(out["a"]) == 7 and int(out["b"]) == 15 and int(out["c"]) == 3 and int(out["d"]) == 3
    close(out["e"], np.float32(3.5))
    assert int(out["f"]) == 3 and int(out["g"]) == 14 and int(out["h"]) == 7 - 15 - 3


def test_config_floor_division_and_modulo_of_negatives_follow_python():
    out = run(
        """
        config A = -7, B = A // 2, C = A % 2, D = 7 % -2, E = 7 // -2
        b = B
        c = C
        d = D
        e = E
        out b, c, d, e
        """
    )
    assert (int(out["b"]), int(out["c"]), int(out["d"]), int(out["e"])) == (-4, 1, -1, -4)


def test_config_floats_negative_and_exponent_forms():
    out = run(
        """
        config lr = 1e-3, eps = 2.5e-4, g = 0.99, n = -2, k = -0.5
        a = lr
        b = eps
        c = g
        d = n
        e = k
        out a, b, c, d, e
        """
    )
    close(out["a"], np.float32(1e-3), np.float32, rtol=1e-7)
    close(out["b"], np.float32(2.5e-4), np.float32, rtol=1e-7)
    close(out["c"], np.float32(0.99), np.float32, rtol=1e-7)
    close(out["d"], np.int32(-2), np.int32)
    close(out["e"], np.float32(-0.5), np.float32)


def test_config_bool():
    out = run("config flag = true\ny = flag\nout y\n")
    close(out["y"], np.bool_(True), np.bool_)


def test_set_overrides_a_config_and_propagates_to_later_configs():
    text = """
    config T = 3, U = T * 2
    dim t < U
    y[t] = f32(t) + f32(T)
    out y
    """
    close(run1(text), np.arange(6, dtype=np.float32) + 3)
    close(run1(text, T=5), np.arange(10, dtype=np.float32) + 5)


def test_set_overrides_a_float_config():
    text = "config gamma = 0.5\ny = gamma * 2.0\nout y\n"
    close(run1(text), np.float32(1.0))
    close(run1(text, gamma=0.25), np.float32(0.5))


def test_set_an_int_value_on_a_float_config():
    close(run1("config gamma = 0.5\ny = gamma * 2.0\nout y\n", gamma=1), np.float32(2.0))


def test_seed_exists_by_default_and_is_zero():
    out = run("y = seed\nout y\n")
    assert int(out["y"]) == 0
    assert int(run("y = seed\nout y\n", seed=7)["y"]) == 7


def test_seed_declared_by_the_program():
    assert int(run("config seed = 4\ny = seed\nout y\n")["y"]) == 4


def test_dim_bound_is_a_config_expression():
    out = run(
        """
        config N = 5
        dim k < N * 2 - 3
        y[k] = k
        out y
        """
    )
    close(out["y"], np.arange(7), np.int32)


# ============================================================================ §3 dims, canonical or


def test_tensor_dims_follow_canonical_order_in_outputs():
    out = run(
        """
        config I = 2, T = 3
        dim i < I
        dim t < T
        y[i, t] = f32(10 * i + t)
        z[t] = f32(t)
        w[i, t] = z + f32(i)      # basis shorthand: z[t]
        out y, w
        """
    )
    ii, tt = np.meshgrid(np.arange(2), np.arange(3), indexing="ij")
    close(out["y"], (10 * ii + tt).astype(np.float32), np.float32)
    close(out["w"], (tt + ii).astype(np.float32))


def test_tensor_over_a_subset_of_dims_skipping_one():
    out = run(
        """
        config A = 2, B = 3, C = 4
        dim a < A
        dim b < B
        dim c < C
        y[a, c] = f32(a * 100 + c)
        z[a, b, c] = y + f32(b * 10)
        out y, z
        """
    )
    a, b, c = np.meshgrid(np.arange(2), np.arange(3), np.arange(4), indexing="ij")
    close(out["y"], (a[:, 0, :] * 100 + c[:, 0, :]).astype(np.float32))
    close(out["z"], (a * 100 + b * 10 + c).astype(np.float32))


def test_position_named_only_by_a_later_equation():
    # g[T-1] names no dim; the second equation names position 1 as t
    out = run(
        """
        config T = 4
        dim t < T
        g[T-1] = 1.0
        g[t] = g[t+1] * 2.0
        out g
        """
    )
    close(out["g"], np.array([8, 4, 2, 1], np.float32))
