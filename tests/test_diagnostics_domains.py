"""Diagnostics (LANGUAGE.md sections 4, 5 and 11): dims, left sides, domains and cycles.

Dims out of canonical order, a right side using a dim its equation does not iterate, reads
outside a tensor's domain (with an example point), equations that define nothing, cycles,
dynamic slices outside reductions, malformed left sides, negative defined points, and
`when` clauses that are not conditions on dims. See test_diagnostics.py for the helpers.
"""

from __future__ import annotations

import re
import textwrap

from click.testing import CliRunner

from timerlc.cli import cli

from test_diagnostics import diagnose, expect_error, expect_format


# ----------------------------------------------------------------------------- canonical order
def test_dims_out_of_canonical_order(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4, B = 2
        dim b < B
        dim t < T
        x[t, b] = 1.0
    """,
        4,
        6,
        "canonical order",
        "'b'",
        "'t'",
    )


def test_params_dims_out_of_canonical_order(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4, B = 2
        dim b < B
        dim t < T
        params p[t, b] { w : f32[] = zeros }
    """,
        4,
        13,
        "'p'",
        "order",
    )


def test_position_named_by_two_different_dims(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4, B = 2
        dim b < B
        dim t < T
        x[b, 0] = 1.0
        x[t, b] = 2.0
    """,
        5,
        3,
        "position 1",
        "'b'",
        "'t'",
    )


def test_same_dim_twice_on_a_left_side(tmp_path):
    msg = expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t, t] = 1.0
    """,
        3,
        6,
        "'t'",
        ("twice", "more than once", "repeated"),
    )
    assert "canonical order" not in msg


def test_position_never_named_by_a_dim(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t, 0] = 1.0
    """,
        3,
        6,
        "position 2",
        "'x'",
    )


def test_tuple_left_sides_with_different_dims(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4, B = 2
        dim b < B
        dim t < T
        a[b, t], c[b] = (1.0, 2.0)
    """,
        4,
        10,
        "same dims",
    )


# ----------------------------------------------------------------------------- non-iterated dims
def test_non_iterated_dim_as_an_index(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4, B = 2
        dim b < B
        dim t < T
        y[b, t] = 1.0
        x[t] = y[b, t]
    """,
        5,
        10,
        "does not iterate",
        "'b'",
    )


def test_non_iterated_dim_as_a_value(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4, B = 2
        dim b < B
        dim t < T
        x[t] = f32(b)
    """,
        4,
        12,
        "does not iterate",
        "'b'",
    )


def test_non_iterated_dim_through_basis_shorthand(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4, B = 2
        dim b < B
        dim t < T
        y[b, t] = 1.0
        x[t] = y * 2.0
    """,
        5,
        8,
        "'y'",
        "does not iterate",
        "b",
    )


def test_non_iterated_dim_in_a_when_clause(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4, B = 2
        dim b < B
        dim t < T
        x[t] = 1.0 when b > 0
    """,
        4,
        17,
        "does not iterate",
        "'b'",
    )


def test_dim_used_by_an_equation_with_no_dims(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x = f32(t)
    """,
        3,
        9,
        "does not iterate",
        "'t'",
    )


def test_non_iterated_dim_in_a_slice_bound(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4, B = 2
        dim b < B
        dim t < T
        y[t] = 1.0
        x[b] = sum(y[0:t])
    """,
        5,
        16,
        "does not iterate",
        "'t'",
    )


def test_non_iterated_dim_inside_a_def_body(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4, B = 2
        dim b < B
        dim t < T
        def f(v) { v + f32(b) }
        x[t] = f(1.0)
    """,
        4,
        20,
        "does not iterate",
        "'b'",
    )


# ----------------------------------------------------------------------------- reads outside the do
def _point(msg: str, **dims):
    for d, v in dims.items():
        assert re.search(rf"\b{d}\s*=\s*{v}\b", msg), f"no example point {d}={v} in: {msg}"


def test_read_of_the_previous_step_without_a_base_case(tmp_path):
    msg = expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = x[t-1] + 1.0
    """,
        3,
        8,
        "outside",
        "'x'",
        "x[-1]",
    )
    _point(msg, t=0)


def test_read_of_another_tensor_before_its_start(tmp_path):
    msg = expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        r[t] = f32(t)
        x[t] = r[t-1] + 1.0
    """,
        4,
        8,
        "outside",
        "'r'",
        "r[-1]",
    )
    _point(msg, t=0)


def test_read_past_the_end(tmp_path):
    msg = expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        r[t] = f32(t)
        x[t] = r[t+1]
    """,
        4,
        8,
        "outside",
        "'r'",
        "r[4]",
    )
    _point(msg, t=3)


def test_read_past_the_end_in_the_second_of_two_dims(tmp_path):
    msg = expect_error(
        tmp_path,
        """
        config B = 2, T = 4
        dim b < B
        dim t < T
        r[b, t] = f32(t)
        x[b, t] = r[b, t] + r[b, t+2]
    """,
        5,
        21,
        "outside",
        "'r'",
    )
    _point(msg, t=2)


def test_read_outside_a_domain_restricted_by_when(tmp_path):
    msg = expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        r[t] = f32(t) when t >= 2
        x[t] = r[t] * 2.0
    """,
        4,
        8,
        "outside",
        "'r'",
    )
    _point(msg, t=0)


def test_slice_longer_than_the_tensor(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        r[t] = f32(t)
        s = sum(r[0:T+1])
    """,
        4,
        9,
        "outside",
        "'r'",
        "r[4]",
    )


def test_slice_starting_before_zero(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        r[t] = f32(t)
        s = sum(r[0-1:T])
    """,
        4,
        9,
        "outside",
        "'r'",
        "r[-1]",
    )


def test_dynamic_slice_past_the_end(tmp_path):
    msg = expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        r[t] = f32(t)
        g[t] = sum(r[t:t+3])
    """,
        4,
        12,
        "outside",
        "'r'",
        "r[4]",
    )
    _point(msg, t=2)


def test_constant_read_past_the_end(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        r[t] = f32(t)
        s = r[T]
    """,
        4,
        5,
        "outside",
        "'r'",
        "r[4]",
    )


def test_slice_with_negative_length(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        r[t] = f32(t)
        s = sum(r[3:1])
    """,
        4,
        11,
        "negative length",
    )


def test_spatial_slice_longer_than_its_axis(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        v[t] = zeros([3])
        x[t] = v[t][t:t+5]
    """,
        4,
        13,
        "length 5",
        "length 3",
    )


def test_dim_dependent_spatial_index_out_of_its_axis(tmp_path):
    msg = expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        v[t] = zeros([3])
        x[t] = v[t][t]
    """,
        4,
        8,
        "outside",
        "length 3",
    )
    _point(msg, t=3)


# ----------------------------------------------------------------------------- equations that defin
def test_when_clause_that_is_never_true(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = 1.0 when t > T
    """,
        3,
        1,
        "defines no point",
        "'x'",
    )


def test_an_equation_a_config_leaves_empty_says_the_dims_bounds(tmp_path):
    """PPO over one iteration (``--set total_steps`` of ``B * T``): ``run[i, b, 0]`` for
    i >= 1 defines nothing, an error as LANGUAGE.md asks; the message gives the bounds the
    configs made (``dim i < 1``), the cause a user looks for."""
    expect_error(
        tmp_path,
        """
        config I = 3, T = 4
        dim i < I
        dim t < T
        run[0, t] = 1.0
        run[i, t] = run[i-1, t] * 0.5
    """,
        5,
        1,
        "defines no point",
        "'run'",
        "(line 4), with dims i < 1, t < 4",
        args=("--set", "I=1"),
    )
    expect_error(
        tmp_path,
        """
        config T = 4, N = 2
        dim t < T
        x[t] = 1.0 when t + N < T
        y[t] = 2.0
    """,
        3,
        1,
        "its domain is empty, with dim t < 2",
        args=("--set", "T=2"),
    )


def test_contradictory_when_clause(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        y[t] = 0.0
        x[t] = 1.0 when t < 1 and t > 2
    """,
        4,
        1,
        "defines no point",
        "'x'",
    )


def test_equation_fully_shadowed_by_an_earlier_one(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = 1.0
        x[t] = 2.0 when t > 0
    """,
        4,
        1,
        "defines no point",
        "'x'",
        "earlier",
        "line 3",
    )


def test_base_case_after_the_general_equation(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = 1.0
        x[0] = 2.0
    """,
        4,
        1,
        "defines no point",
        "'x'",
        "line 3",
    )


def test_equation_shadowed_by_two_earlier_ones(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = 1.0 when t < 2
        x[t] = 2.0 when t >= 2
        x[t] = 3.0
    """,
        5,
        1,
        "defines no point",
        "'x'",
        "lines 3, 4",
    )


def test_params_update_shadowed_by_its_initializers(tmp_path):
    expect_error(
        tmp_path,
        """
        config I = 3
        dim i < I
        params p[i] { w : f32[] = zeros }
        p[0] = p[0]
    """,
        4,
        1,
        "defines no point",
        "'p'",
    )


# ----------------------------------------------------------------------------- cycles
# These pin the line, the words and the example point; which token of the line gets the caret
# is pinned by the two xfail tests below (the read that closes the cycle).
def _cycle(tmp_path, program, line, *words) -> str:
    got, _, msg = expect_format(diagnose(tmp_path, program), "cyclic", *words)
    assert got == line, msg
    return msg


def test_cycle_of_a_point_on_itself(tmp_path):
    msg = _cycle(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = x[t] + 1.0
    """,
        3,
        "'x'",
    )
    _point(msg, t=0)


def test_cycle_through_two_tensors(tmp_path):
    msg = _cycle(
        tmp_path,
        """
        config T = 4
        dim t < T
        a[t] = b[t] + 1.0
        b[t] = a[t] * 2.0
    """,
        3,
        "'a'",
        "b",
    )
    _point(msg, t=0)


def test_cycle_through_a_slice(tmp_path):
    _cycle(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = sum(x[0:T])
    """,
        3,
        "'x'",
    )


def test_cycle_through_a_growing_slice(tmp_path):
    _cycle(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[0] = 0.0
        x[t+1] = sum(x[0:t+2])
    """,
        4,
        "'x'",
    )


def test_cycle_of_a_tensor_with_no_dims(tmp_path):
    _cycle(
        tmp_path,
        """
        x = x + 1.0
    """,
        1,
        "'x'",
    )


def test_cycle_only_in_the_second_equation(tmp_path):
    msg = _cycle(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[0] = 0.0
        x[t+1] = x[t+1] * 0.5
    """,
        4,
        "'x'",
    )
    _point(msg, t=1)


def test_cycle_points_at_the_read_that_closes_it(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = x[t] + 1.0
    """,
        3,
        8,
        "cyclic",
        "'x'",
    )


def test_two_tensor_cycle_points_at_a_read(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        a[t] = b[t] + 1.0
        b[t] = a[t] * 2.0
    """,
        3,
        8,
        "cyclic",
    )


def test_cycle_across_dims_of_different_rates(tmp_path):
    """y[i] needs x[2i+1], which needs y[(2i+1) // 2] = y[i]: the cheap level-by-level proof
    (x's j against y's i scaled by K) must not accept it, and the exact check reports it."""
    _cycle(
        tmp_path,
        """
        config I = 3, K = 2
        dim i < I
        dim j < I * K
        x[j] = y[j // K] + 1.0
        y[i] = x[i * K + 1] * 2.0
    """,
        4,
        "'x'",
    )


def test_reads_across_dims_of_different_rates_are_not_a_cycle(tmp_path):
    """The same two tensors one iteration apart: no cycle (the level proof scales i by K)."""
    path = tmp_path / "p.rtl"
    path.write_text(
        textwrap.dedent(
            """
            config I = 3, K = 2
            dim i < I
            dim j < I * K
            x[j] = 1.0 when j < K
            x[j] = y[j // K - 1] + 1.0
            y[i] = x[i * K + 1] * 2.0
            out y
            """
        )
    )
    result = CliRunner().invoke(cli, ["check", str(path)])
    assert result.exit_code == 0, result.output


# ----------------------------------------------------------------------------- dynamic slices
_DYN = ("dynamic slice", "depends on a dim")


def test_dynamic_slice_in_arithmetic(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        r[t] = f32(t)
        g[t] = r[t:T] * 2.0
    """,
        4,
        8,
        _DYN,
        ("reduction", "sum"),
    )


def test_dynamic_slice_as_a_whole_right_side(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        r[t] = f32(t)
        g[t] = r[t:T]
    """,
        4,
        8,
        _DYN,
    )


def test_dynamic_slice_into_cumsum(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        r[t] = f32(t)
        g[t] = cumsum(r[t:T], 0)
    """,
        4,
        15,
        _DYN,
    )


def test_dynamic_slice_nested_inside_a_reduction_argument(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        r[t] = f32(t)
        g[t] = sum(r[t:T] * 2.0)
    """,
        4,
        12,
        _DYN,
    )


def test_spatial_slice_of_dim_dependent_length(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        v[t] = zeros([5])
        g[t] = v[t][0:t]
    """,
        4,
        13,
        "constant",
    )


# ----------------------------------------------------------------------------- left sides
_LHS = ("dim with a constant offset", "left-hand index", "left side")


def test_left_index_scaled_dim(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[2*t] = 1.0
    """,
        3,
        3,
        _LHS,
    )


def test_left_index_sum_of_two_dims(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4, B = 2
        dim b < B
        dim t < T
        x[t+b] = 1.0
    """,
        4,
        3,
        _LHS,
    )


def test_left_index_floor_division(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t // 2] = 1.0
    """,
        3,
        3,
        _LHS,
    )


def test_left_index_float(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[1.5] = 1.0
    """,
        3,
        3,
        _LHS,
    )


def test_left_slice(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[0:T] = 1.0
    """,
        3,
        3,
        "slice",
        "left",
    )


def test_left_side_a_call(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        f(x) = 1.0
    """,
        3,
        1,
        "left side",
    )


def test_left_side_spatially_indexed(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t][0] = 1.0
    """,
        3,
        1,
        "left side",
    )


def test_left_side_a_field(tmp_path):
    expect_error(
        tmp_path,
        """
        config I = 3
        dim i < I
        params net[i] { w : f32[3] = zeros }
        net[i+1].w = zeros([3])
    """,
        4,
        1,
        "left side",
    )


def test_left_side_a_literal(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        3 = 1.0
    """,
        3,
        1,
        "left side",
    )


def test_left_index_negative_constant(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[0-1] = 1.0
    """,
        3,
        3,
        "negative",
        "-1",
    )


# ----------------------------------------------------------------------------- negative defined poi
def test_defined_point_below_zero(tmp_path):
    msg = expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t-1] = 1.0
    """,
        3,
        3,
        "'x'",
        "negative",
    )
    _point(msg, t=-1)


def test_defined_point_below_zero_in_the_second_dim(tmp_path):
    msg = expect_error(
        tmp_path,
        """
        config T = 4, B = 2
        dim b < B
        dim t < T
        x[b, t-2] = 1.0
    """,
        4,
        6,
        "'x'",
        "negative",
    )
    _point(msg, t=-2)


# ----------------------------------------------------------------------------- when clauses
_COND = ("condition", "when")


def test_when_reading_a_tensor(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        r[t] = f32(t)
        x[t] = 1.0 when r[t] > 0.5
    """,
        4,
        17,
        _COND,
        "dims",
    )


def test_when_reading_a_bare_tensor(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        r[t] = f32(t)
        x[t] = 1.0 when r > 0.5
    """,
        4,
        17,
        _COND,
        "'r'",
    )


def test_when_calling_a_function(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = 1.0 when f32(t) > 0.5
    """,
        3,
        17,
        _COND,
    )


def test_when_with_a_float_config(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4, thr = 0.5
        dim t < T
        x[t] = 1.0 when t > thr
    """,
        3,
        21,
        _COND,
        "'thr'",
    )


def test_when_that_is_not_a_comparison(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = 1.0 when t
    """,
        3,
        17,
        _COND,
    )


def test_a_long_cycle_through_the_parameters_is_found_in_seconds(tmp_path):
    """PPO with the gradient taken at ``net[I]`` (fuzz.py: ``j`` renamed ``I``): every update
    reads the parameters of iteration I, which the updates before make, a cycle through 69
    tensors. isl's scheduler took 10 s to find no order for the group and its closure 7 s
    (inexact: a step-by-step search then confirmed the cycle, which multiplied its sets'
    pieces until it did not answer in minutes, before each step's sets were coalesced); a
    group this large is now searched from the first point of each tensor first
    (``checks._search_cycle``: the cycle in 26 steps, the check some 3 s), and the caret
    goes to the read that closes the cycle, ``net[I]`` (the closure's answer pointed at
    ``loss[j]``)."""
    import subprocess
    from pathlib import Path

    from rtl_helpers import timerlc_cmd

    text = (Path(__file__).parent.parent / "programs" / "ppo.rtl").read_text()
    old = "clip_norm(grad(loss[j], net[j]), max_grad_norm)"
    assert old in text
    path = tmp_path / "bad.rtl"
    path.write_text(text.replace(old, "clip_norm(grad(loss[j], net[I]), max_grad_norm)"))
    r = subprocess.run(
        timerlc_cmd() + ["check", str(path)],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert r.returncode == 1, r.stderr[:500]
    assert "cyclic definition: 'net.pi_w1' at j=1 depends on itself" in r.stderr
    line, caret = r.stderr.splitlines()[1:3]
    assert line[caret.index("^") :].startswith("net[I]"), r.stderr[-400:]


def _chain(n: int, dims: list[str], head: str) -> str:
    """A program whose ``x1`` is defined by ``head`` (reading ``x{n}``), and each ``x{k}`` is
    ``x{k-1}`` + 1: a group of ``n`` tensors, as many as ``checks.SEARCH_FIRST_NODES`` or
    more."""
    at = ", ".join(d for d, _ in dims)
    lines = ["config N = 5", *(f"dim {d} < N" for d, _ in dims), head.strip()]
    lines += [f"x{k}[{at}] = x{k - 1}[{at}] + 1.0" for k in range(2, n + 1)]
    return "\n".join(lines + [f"out x{n}"]) + "\n"


def _searches(monkeypatch) -> list:
    """What each ``checks._search_cycle`` call returned."""
    from timerlc.poly import checks

    assert checks.SEARCH_FIRST_NODES <= 20
    found: list = []
    search = checks._search_cycle
    monkeypatch.setattr(checks, "_search_cycle", lambda *a: found.append(search(*a)) or found[-1])
    return found


def test_a_cycle_through_a_large_group_is_found_by_the_search(tmp_path, monkeypatch):
    found = _searches(monkeypatch)
    # x1[t] reads x20[t] at t = 2, which reads x19[t], ... x1[t]: a cycle through 20 tensors
    head = """
x1[t] = x20[t] + 1.0 when t == 2
x1[t] = 0.0
"""
    out = diagnose(tmp_path, _chain(20, [("t", "N")], head), raw=True)
    line, col, msg = expect_format(out, "cyclic", "'x1'", "x20")
    assert found and found[-1] is not None
    _point(msg, t=2)
    assert (line, col) == (3, 9), out.stderr  # (x20[t]: the read that closes the cycle)


def test_an_acyclic_large_group_only_a_skewed_order_splits_checks(tmp_path, monkeypatch):
    """A wavefront through 20 tensors (tests/test_cpu_backend.py's, through one): the search
    finds no cycle from any start, and isl's scheduler orders the group."""
    found = _searches(monkeypatch)
    head = """
x1[0, j] = f32(j)
x1[i, N-1] = f32(i)
x1[i, j] = x20[i-1, j+1] + 0.5 * x20[i+1, j-2] when i + 1 < N and j >= 2
x1[i, j] = x20[i-1, j+1] + 1.0
"""
    out = diagnose(tmp_path, _chain(20, [("i", "N"), ("j", "N")], head), raw=True)
    assert out.status == 0, out.stderr
    assert found == [None]
