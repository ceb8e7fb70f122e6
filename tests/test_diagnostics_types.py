"""Diagnostics (LANGUAGE.md section 11): shape and dtype mismatches, and config errors.

A shape mismatch must show both shapes. The caret goes under the operator of a binary
operation, under the function of a call, under the right side of an equation that
disagrees with an earlier one. See test_diagnostics.py for the helpers.
"""

from __future__ import annotations

import pytest
from test_diagnostics import diagnose, expect_error


# ----------------------------------------------------------------------------- shapes
def test_broadcast_mismatch_points_at_the_operator(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = zeros([3]) + ones([4])
    """,
        3,
        19,
        "[3]",
        "[4]",
        "broadcast",
    )


def test_broadcast_mismatch_of_two_tensor_reads(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        u[t] = zeros([2, 3])
        v[t] = zeros([3, 2])
        x[t] = u[t] * v[t]
    """,
        5,
        13,
        "[2, 3]",
        "[3, 2]",
    )


def test_broadcast_mismatch_through_a_recurrence(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[0] = zeros([3])
        x[t+1] = x[t] + ones([4])
    """,
        4,
        15,
        "[3]",
        "[4]",
    )


def test_broadcast_mismatch_of_a_slice_read(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4, B = 2
        dim b < B
        dim t < T
        r[b, t] = f32(t)
        x = r[0:B, 0:T] - zeros([T, B])
    """,
        5,
        17,
        "[2, 4]",
        "[4, 2]",
    )


def test_matmul_mismatch(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = zeros([3, 4]) @ zeros([3, 4])
    """,
        3,
        22,
        "[3, 4]",
        "@",
    )


def test_matmul_of_a_scalar(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = 2.0 @ zeros([3])
    """,
        3,
        12,
        "@",
        "[3]",
    )


def test_matmul_mismatch_inside_a_def_points_into_the_def(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        params p { w : f32[5, 2] = zeros }
        def lin(q, x) { x @ q.w }
        y[t] = lin(p, zeros([4]))
    """,
        4,
        19,
        "[4]",
        "[5, 2]",
    )


def test_equations_of_one_tensor_disagree_on_its_shape(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[0] = zeros([3])
        x[t+1] = zeros([4])
    """,
        4,
        10,
        "'x'",
        "[3]",
        "[4]",
        "line 3",
    )


def test_equations_of_one_tensor_disagree_record_vs_tensor(tmp_path):
    expect_error(
        tmp_path,
        """
        config I = 3
        dim i < I
        params p[i] { w : f32[3] = zeros }
        p[i+1] = zeros([3])
    """,
        4,
        10,
        "'p'",
        "record",
        "f32[3]",
    )


def test_reshape_to_a_different_size(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = reshape(zeros([3, 4]), [5, 2])
    """,
        3,
        8,
        "reshape",
        "[3, 4]",
        "[5, 2]",
    )


def test_concat_mismatch(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = concat([zeros([3, 2]), zeros([3, 5])], 0)
    """,
        3,
        8,
        "concat",
        "[3, 2]",
        "[3, 5]",
    )


def test_stack_mismatch(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = stack([zeros([3]), zeros([2])], 0)
    """,
        3,
        8,
        "stack",
        "[3]",
        "[2]",
    )


def test_broadcast_builtin_to_an_incompatible_shape(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = broadcast(zeros([3]), [2])
    """,
        3,
        8,
        "[3]",
        "[2]",
    )


def test_transpose_with_a_bad_permutation(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = transpose(zeros([3, 2]), [0, 0])
    """,
        3,
        8,
        "transpose",
        "[0, 0]",
    )


def test_arange_of_bools_and_with_step_zero(tmp_path):
    expect_error(tmp_path, "x = arange(4, dtype=bool)\nout x\n", 1, 21, "arange", "bool")
    expect_error(tmp_path, "x = arange(0, 4, 0)\nout x\n", 1, 18, "step", "0")


def test_reduction_axis_out_of_range(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = sum(zeros([3]), 5)
    """,
        3,
        24,
        "axis 5",
    )


def test_too_many_spatial_indices(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = zeros([3])[0, 1]
    """,
        3,
        8,
        "too many indices",
        "[3]",
    )


def test_constant_spatial_index_out_of_range(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = zeros([3])[5]
    """,
        3,
        19,
        "index 5",
        "length 3",
    )


@pytest.mark.parametrize("index", ["[0]", "[t]", "[a]"])
def test_an_index_into_an_empty_axis(tmp_path, index):
    """No index is in range of an axis of length 0 (a config of 0 actions: attention.rtl with
    A = 0 crashed the type rule); an index tensor of no elements is (NumPy's too)."""
    expect_error(
        tmp_path,
        f"""
        config A = 0, T = 4
        dim t < T
        a[t] = t % 3
        x[t] = zeros([A]){index}
    """,
        4,
        19,  # (under the index)
        "axis 0",
        "f32[0]",
        "empty",
    )


@pytest.mark.parametrize("index", ["[0]", "[0:2]", "[arange(2)]"])
def test_an_index_into_an_axis_past_the_limits(tmp_path, index):
    """An extent past 2^63 (a config of 10^30) is past timerlc's limits, said at the tensor,
    where the index type rule crashed (NumPy refuses such an array: fuzz.py). (``check``
    leaves the limits to ``compile``, which plans the buffers.)"""
    expect_error(
        tmp_path,
        f"""
        config A = 999999999999999999999999999999
        dim t < 2
        x[t] = zeros([A]){index}
        out x
    """,
        3,
        8,
        "999999999999999999999999999999",
        "limits",
        cmd="compile",
    )


def test_an_empty_index_tensor_into_an_empty_axis_is_empty(tmp_path):
    out = diagnose(tmp_path, "config A = 0\ndim t < 2\nx[t] = zeros([A])[arange(A)]\nout x\n")
    assert out.status == 0, out.stderr


def test_params_initializer_of_the_wrong_shape(tmp_path):
    expect_error(
        tmp_path,
        """
        config I = 3
        dim i < I
        params net[i] { w : f32[3] = zeros([4]) }
    """,
        3,
        30,
        "net.w",
        "[4]",
        "[3]",
    )


def test_params_update_from_a_record_of_other_shapes(tmp_path):
    expect_error(
        tmp_path,
        """
        config I = 3
        dim i < I
        params a[i] { w : f32[3] = zeros }
        params b[i] { w : f32[4] = zeros }
        b[i+1] = b[i]
        a[i+1] = b[i]
    """,
        6,
        10,
        "a.w",
        "f32[3]",
        "f32[4]",
    )


def test_record_arithmetic_shape_mismatch_points_at_the_operator(tmp_path):
    expect_error(
        tmp_path,
        """
        config I = 3
        dim i < I
        params net[i] { w : f32[3] = zeros }
        net[i+1] = net[i] * ones([2])
    """,
        4,
        19,
        "[3]",
        "[2]",
    )


def test_records_with_different_fields_point_at_the_operator(tmp_path):
    expect_error(
        tmp_path,
        """
        config I = 3
        dim i < I
        params a[i] { w : f32[3] = zeros }
        params b[i] { v : f32[3] = zeros }
        b[i+1] = b[i]
        a[i+1] = a[i] + b[i]
    """,
        6,
        15,
        "field",
    )


# ----------------------------------------------------------------------------- dtypes
def test_gather_with_a_float_index(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        v[t] = zeros([5])
        x[t] = v[t][0.5 * f32(t)]
    """,
        4,
        13,
        "integer",
        "f32",
    )


def test_gather_with_a_bool_index(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        v[t] = zeros([5])
        x[t] = v[t][v[t] > 0.0]
    """,
        4,
        13,
        "bool",
    )


def test_take_with_a_float_index(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = take(zeros([5]), f32(t), 0)
    """,
        3,
        25,
        "integer",
        "f32",
    )


def test_one_hot_of_a_float(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = one_hot(f32(t), 4)
    """,
        3,
        16,
        "integer",
        "f32",
    )


def test_params_field_updated_with_another_dtype(tmp_path):
    expect_error(
        tmp_path,
        """
        config I = 3
        dim i < I
        params a[i] { w : f32[3] = zeros }
        params b[i] { w : i32[3] = zeros }
        b[i+1] = b[i]
        a[i+1] = b[i]
    """,
        6,
        10,
        "a.w",
        "f32[3]",
        "i32[3]",
    )


def test_params_field_updated_with_a_cast_record(tmp_path):
    expect_error(
        tmp_path,
        """
        config I = 3
        dim i < I
        params a[i] { w : f32[3] = zeros }
        a[i+1] = f64(a[i])
    """,
        4,
        10,
        "a.w",
        "f32[3]",
        "f64[3]",
    )


def test_params_field_initialized_with_another_dtype(tmp_path):
    expect_error(
        tmp_path,
        """
        config I = 3
        dim i < I
        params net[i] { w : i32[3] = zeros([3], dtype=f32) }
    """,
        3,
        30,
        "net.w",
        "i32[3]",
        "f32[3]",
    )


def test_unknown_dtype_keyword(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = zeros([3], dtype=float32)
    """,
        3,
        25,
        "dtype",
    )


def test_integer_literal_too_large(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = 99999999999 + t
    """,
        3,
        8,
        "99999999999",
        "i32",
    )


def test_string_as_a_value(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = "abc"
    """,
        3,
        8,
        "string",
    )


# ----------------------------------------------------------------------------- config errors
def test_bool_config_in_arithmetic(tmp_path):
    expect_error(
        tmp_path,
        """
        config flag = true, T = flag + 1
    """,
        1,
        25,
        "bool",
    )


def test_config_integer_division_by_zero(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4, U = T // 0
    """,
        1,
        21,
        "division by zero",
    )


def test_config_division_by_a_zero_config(tmp_path):
    expect_error(
        tmp_path,
        """
        config Z = 0, T = 4 / Z
    """,
        1,
        21,
        "division by zero",
    )


def test_config_modulo_zero(tmp_path):
    expect_error(
        tmp_path,
        """
        config Z = 0, T = 4 % Z
    """,
        1,
        21,
        "division by zero",
    )


def test_config_with_a_string(tmp_path):
    expect_error(
        tmp_path,
        """
        config S = "abc"
    """,
        1,
        12,
        "config",
    )


def test_config_calling_a_function(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4, U = sum(T)
    """,
        1,
        19,
        "config",
    )


def test_float_config_as_a_dim_bound(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4.5
        dim t < T
    """,
        2,
        9,
        "'T'",
        "int",
    )


def test_dim_bound_of_zero(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 0
        dim t < T
    """,
        2,
        9,
        "'t'",
        "bound 0",
    )


@pytest.mark.parametrize("cmd", ["check", "compile"])
def test_dim_bound_past_the_limit(tmp_path, cmd):
    """A dim of more than 2^31 points is past timerlc's limits: known from the configs
    alone, so ``check`` says it too (it said nothing, and ``compile`` named no line), at
    the bound. (The limits of an array's size need the plan: ``compile``'s.)"""
    expect_error(
        tmp_path,
        """
        config B = 2147483649
        dim b < B
        x[b] = 1.0
    """,
        2,
        9,
        "'b'",
        "bound 2147483649",
        "limit is 2147483648",
        cmd=cmd,
    )


def test_float_config_as_a_shape(tmp_path):
    expect_error(
        tmp_path,
        """
        config H = 2.5
        params p { w : f32[H] = zeros }
    """,
        2,
        20,
        "'H'",
        "int",
    )


def test_negative_shape(tmp_path):
    expect_error(
        tmp_path,
        """
        config H = 0 - 2
        params p { w : f32[H] = zeros }
    """,
        2,
        20,
        "negative",
    )


def test_division_by_zero_in_a_constant_expression(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = 1 // 0
    """,
        3,
        10,
        "division by zero",
    )


def test_division_by_zero_in_an_index(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        r[t] = f32(t)
        x[t] = r[t // 0]
    """,
        4,
        12,
        "division by zero",
    )


def test_division_by_a_config_that_is_zero_in_an_index_names_it(tmp_path):
    """cumsum.rtl at T < 4: its P = T // 4 is 0, and ``t % P`` divides by it."""
    expect_error(
        tmp_path,
        """
        config T = 4, P = T // 4
        dim t < T
        x[t] = 1.0 when t % P == 0
        x[t] = 2.0
    """,
        3,
        19,
        "division by zero in an index expression: 'P' is 0",
        args=("--set", "T=3"),
    )
