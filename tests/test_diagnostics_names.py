"""Diagnostics (LANGUAGE.md section 11): unknown names and wrong arity.

The caret goes under the unknown name itself; for arity errors under the function, def or
tensor name. See test_diagnostics.py for the helpers and the xfail convention.
"""

from __future__ import annotations

from test_diagnostics import expect_error


# ----------------------------------------------------------------------------- unknown names
def test_unknown_tensor_read_with_did_you_mean(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        reward[t] = f32(t)
        x[t] = rewrd[t] * 2.0
    """,
        4,
        8,
        "unknown",
        "'rewrd'",
        "did you mean 'reward'",
    )


def test_unknown_bare_tensor_with_did_you_mean(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        reward[t] = f32(t)
        x[t] = rewards * 2.0
    """,
        4,
        8,
        "unknown",
        "'rewards'",
        "did you mean 'reward'",
    )


def test_unknown_name_without_a_close_match_has_no_suggestion(tmp_path):
    msg = expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = f32(t) + zzzqqq
    """,
        3,
        17,
        "unknown",
        "'zzzqqq'",
    )
    assert "did you mean" not in msg


def test_unknown_function_with_did_you_mean(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = tahn(f32(t))
    """,
        3,
        8,
        "unknown function",
        "'tahn'",
        "did you mean 'tanh'",
    )


def test_unknown_def_with_did_you_mean(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        def double(v) { v * 2.0 }
        x[t] = doubel(f32(t))
    """,
        4,
        8,
        "unknown",
        "'doubel'",
        "did you mean 'double'",
    )


def test_unknown_name_inside_a_def_body_points_into_the_def(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4, gamma = 0.9
        dim t < T
        def disc(v) { v * gama }
        x[t] = disc(f32(t))
    """,
        3,
        19,
        "unknown",
        "'gama'",
        "did you mean 'gamma'",
    )


def test_unknown_config_in_an_expression(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4, gamma = 0.9
        dim t < T
        x[t] = gamm * f32(t)
    """,
        3,
        8,
        "unknown",
        "'gamm'",
        "did you mean 'gamma'",
    )


def test_unknown_config_in_a_config(tmp_path):
    expect_error(
        tmp_path,
        """
        config Tmax = 4, U = Tmx * 2
    """,
        1,
        22,
        "unknown config",
        "'Tmx'",
        "did you mean 'Tmax'",
    )


def test_config_using_a_later_config(tmp_path):
    expect_error(
        tmp_path,
        """
        config U = T * 2, T = 4
    """,
        1,
        12,
        "'T'",
        "earlier",
    )


def test_unknown_config_in_a_dim_bound(tmp_path):
    expect_error(
        tmp_path,
        """
        config Tmax = 4
        dim t < Tmx
    """,
        2,
        9,
        "unknown",
        "'Tmx'",
        "did you mean 'Tmax'",
    )


def test_unknown_dim_on_the_left_side(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim time < T
        x[tim] = 1.0
    """,
        3,
        3,
        "unknown",
        "'tim'",
        "did you mean 'time'",
    )


def test_unknown_dim_in_a_temporal_index(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        y[t] = f32(t)
        x[t] = y[tt]
    """,
        4,
        10,
        "unknown",
        "'tt'",
        "did you mean 't'",
    )


def test_unknown_dim_in_a_when_clause(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = 1.0 when tt < 2
    """,
        3,
        17,
        "unknown",
        "'tt'",
        "did you mean 't'",
    )


def test_unknown_dim_of_a_params_declaration(tmp_path):
    expect_error(
        tmp_path,
        """
        config I = 4
        dim iter < I
        params net[itr] { w : f32[3] = zeros }
    """,
        3,
        12,
        "unknown dim",
        "'itr'",
        "did you mean 'iter'",
    )


def test_unknown_batch_dim_of_an_env(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4, B = 2
        dim b < B
        dim t < T
        env E = "cartpole" batch bb
    """,
        4,
        26,
        "unknown dim",
        "'bb'",
        "did you mean 'b'",
    )


def test_unknown_field_with_did_you_mean(tmp_path):
    expect_error(
        tmp_path,
        """
        config I = 3
        dim i < I
        params net[i] { weight : f32[3] = zeros
          bias : f32[3] = zeros }
        net[i+1] = net[i]
        y[i] = sum(net[i].wieght)
    """,
        6,
        19,
        "'wieght'",
        "did you mean 'weight'",
    )


def test_attribute_of_a_tensor(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        v[t] = zeros([3, 2])
        x[t] = v.shape
    """,
        4,
        10,
        "'shape'",
    )


def test_unknown_dtype_with_did_you_mean(tmp_path):
    expect_error(
        tmp_path,
        """
        config I = 3
        dim i < I
        params net[i] { w : f23[3] = zeros }
    """,
        3,
        21,
        "unknown dtype",
        "'f23'",
        "did you mean 'f32'",
    )


def test_unknown_keyword_argument_of_a_builtin(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = sum(zeros([3]), axs=0)
    """,
        3,
        24,
        "'axs'",
        "did you mean 'axis'",
    )


def test_unknown_keyword_argument_of_a_def(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        def f(alpha, beta) { alpha + beta }
        x[t] = f(1.0, bta=2.0)
    """,
        4,
        15,
        "'bta'",
        "did you mean 'beta'",
    )


def test_tensor_called_like_a_function(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        r[t] = f32(t)
        x[t] = r(t)
    """,
        4,
        8,
        "'r'",
        "not a function",
    )


def test_def_used_as_a_value(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        def f(v) { v }
        x[t] = f + 1.0
    """,
        4,
        8,
        "'f'",
        "function",
    )


def test_name_declared_twice(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        dim t < T
    """,
        3,
        5,
        "'t'",
        "already declared",
    )


def test_config_declared_twice(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        config T = 5
    """,
        2,
        8,
        "'T'",
        "twice",
    )


def test_equation_defining_a_config(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        T = 5
    """,
        3,
        1,
        "'T'",
        "config",
    )


# ----------------------------------------------------------------------------- arity
def test_builtin_with_too_many_arguments(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = tanh(f32(t), 2.0)
    """,
        3,
        8,
        "tanh",
        "1 argument",
        "got 2",
    )


def test_builtin_with_too_few_arguments(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = clip(f32(t), 0.0)
    """,
        3,
        8,
        "clip",
        "3 arguments",
        "got 2",
    )


def test_where_with_two_arguments(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = where(t > 1, 1.0)
    """,
        3,
        8,
        "where",
        "3 arguments",
    )


def test_builtin_with_no_arguments(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = exp()
    """,
        3,
        8,
        "exp",
        "1 argument",
        "got 0",
    )


def test_keyword_argument_given_twice(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = sum(zeros([3, 2]), 0, axis=1)
    """,
        3,
        30,
        "'axis'",
        "twice",
    )


def test_def_with_too_many_arguments(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        def f(a, b) { a + b }
        x[t] = f(1.0, 2.0, 3.0)
    """,
        4,
        8,
        "'f'",
        "2 arguments",
        "got 3",
    )


def test_def_with_too_few_arguments(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        def f(a, b) { a + b }
        x[t] = f(1.0)
    """,
        4,
        8,
        "'f'",
        "2 arguments",
        "missing b",
    )


def test_def_parameter_repeated(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        def f(a, a) { a }
        x[t] = f(1.0, 2.0)
    """,
        3,
        10,
        "'a'",
        "repeated",
    )


def test_def_binding_unpacked_into_the_wrong_count(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        def f(v) {
          a, b, c = (v, v)
          a + b + c
        }
        x[t] = f(1.0)
    """,
        4,
        3,
        "2 values",
        "3 names",
    )


def test_temporal_index_with_too_few_entries(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4, B = 2
        dim b < B
        dim t < T
        y[b, t] = f32(t)
        x[b, t] = y[t] + 1.0
    """,
        5,
        11,
        "'y'",
        "2 dims",
        "indexed with 1",
    )


def test_temporal_index_with_too_many_entries(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        y[t] = f32(t)
        x[t] = y[t, t]
    """,
        4,
        8,
        "'y'",
        "1 dim",
        "indexed with 2",
    )


def test_params_read_with_the_wrong_number_of_dims(tmp_path):
    expect_error(
        tmp_path,
        """
        config I = 3, T = 4
        dim i < I
        dim t < T
        params net[i] { w : f32[3] = zeros }
        net[i+1] = net[i]
        y[i, t] = sum(net[i, t].w)
    """,
        6,
        15,
        "'net'",
        "1 dim",
        "indexed with 2",
    )


def test_left_sides_of_one_tensor_with_different_numbers_of_dims(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4, B = 2
        dim b < B
        dim t < T
        y[b, 0] = 1.0
        y[b, t+1] = y[b, t] + 1.0
        y[t] = 2.0
    """,
        6,
        1,
        "'y'",
        "2 dims",
        "1",
    )


def test_tuple_equation_with_too_few_values(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        def two(v) { v, v * 2.0 }
        a[t], b[t], c[t] = two(f32(t))
    """,
        4,
        20,
        "gives 2 values",
        "3 tensors",
    )


def test_tuple_equation_with_too_many_values(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        def three(v) { v, v * 2.0, v * 3.0 }
        a[t], b[t] = three(f32(t))
    """,
        4,
        14,
        "gives 3 values",
        "2 tensors",
    )


def test_single_left_side_given_a_tuple(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        def two(v) { v, v * 2.0 }
        a[t] = two(f32(t))
    """,
        4,
        8,
        "2 values",
        "1 tensor",
    )


def test_tuple_equation_given_one_value(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        a[t], b[t] = f32(t)
    """,
        3,
        14,
        "1 value",
        "2 tensors",
    )


def test_same_tensor_twice_on_a_tuple_left_side(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        a[t], a[t] = (1.0, 2.0)
    """,
        3,
        7,
        "'a'",
        "twice",
    )


def test_min_in_a_config_with_one_argument(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4, U = min(T)
    """,
        1,
        19,
        "min",
        "2",
    )
