"""Bad programs (LANGUAGE.md section 11): each error is reported before anything runs as
`FILE:LINE:COL: error: MESSAGE`, then the source line and a caret under the offending
token, on stderr, with exit status 1 and no traceback.
"""

import re

import pytest
from rtl_helpers import cli, src, write

H = """
config I = 2, B = 2, T = 3
dim i < I
dim b < B
dim t < T
"""

# (id, program, line of the error, words the message must contain)
BAD = [
    ("syntax_dangling_operator", "y = 1.0 +\nout y\n", 1, []),
    ("syntax_unclosed_paren", "y = (1.0 + 2.0\nout y\n", None, []),
    ("syntax_bad_character", "y = 1.0 $ 2.0\nout y\n", 1, []),
    ("unknown_name", "y = zz + 1.0\nout y\n", 1, ["zz"]),
    ("unknown_function", "y = frobnicate(1.0)\nout y\n", 1, ["frobnicate"]),
    ("unknown_config_in_config", "config A = B + 1\nconfig B = 1\n", 1, ["B"]),
    ("arity_builtin", "y = exp(1.0, 2.0)\nout y\n", 1, []),
    ("arity_def", "def f(a) { a }\ny = f(1.0, 2.0)\nout y\n", 2, []),
    ("missing_argument_def", "def f(a, b) { a + b }\ny = f(1.0)\nout y\n", 2, []),
    ("shape_mismatch_broadcast", "y = zeros([2]) + zeros([3])\nout y\n", 1, ["[2]", "[3]"]),
    ("shape_mismatch_matmul", "y = zeros([2, 3]) @ zeros([2, 3])\nout y\n", 1, ["[2, 3]"]),
    (
        "shape_mismatch_between_equations",
        H + "x[0] = zeros([2])\nx[t+1] = zeros([3])\nout x\n",
        6,
        ["[2]", "[3]"],
    ),
    ("dims_out_of_canonical_order", H + "x[t, i] = 1.0\nout x\n", 5, []),
    ("rhs_dim_not_iterated", H + "x[i] = f32(t)\nout x\n", 5, ["t"]),
    ("basis_shorthand_dim_not_iterated", H + "x[i, t] = 1.0\ny[i] = x\nout y\n", 6, []),
    ("read_outside_domain", H + "x[t] = 1.0\ny[t] = x[t+1]\nout y\n", 6, ["x", "t=2"]),
    ("read_outside_domain_below", H + "x[t] = 1.0\ny[t] = x[t-1]\nout y\n", 6, ["x", "t=0"]),
    ("read_outside_domain_slice", H + "x[t] = 1.0 when t > 0\ny = x[0:T]\nout y\n", 6, ["x"]),
    ("read_of_a_recurrence_without_base", H + "y[t+1] = y[t] + 1.0\nout y\n", 5, ["y"]),
    ("equation_defines_nothing_overlap", H + "x[t] = 1.0\nx[1] = 2.0\nout x\n", 6, []),
    ("equation_defines_nothing_when", H + "x[t] = 1.0 when t > 5\nout x\n", 5, []),
    ("defined_point_below_zero", H + "x[t-1] = 1.0\nout x\n", 5, []),
    ("cyclic_self", H + "x[t] = x[t] + 1.0\nout x\n", 5, []),
    ("cyclic_pair", H + "a[t] = b[t] + 1.0\nb[t] = a[t] * 2.0\nout a\n", None, []),
    ("dynamic_slice_outside_reduction", H + "x[t] = 1.0\ny[t] = x[t:T] * 2.0\nout y\n", 6, []),
    (
        "dynamic_slice_inside_an_expression_in_a_reduction",
        H + "x[t] = 1.0\ny[t] = sum(x[t:T] * 2.0)\nout y\n",
        6,
        [],
    ),
    (
        "dynamic_slice_in_a_non_reduction_function",
        H + "x[t] = 1.0\ny[t] = softmax(x[t:T])\nout y\n",
        6,
        [],
    ),
    ("metric_not_scalar", "y = zeros([2])\nmetric y\n", 2, []),
    ("recursion_in_defs", "def f(a) { g(a) }\ndef g(a) { f(a) }\ny = f(1.0)\nout y\n", None, []),
    ("keyword_as_name", "when = 1.0\nout when\n", 1, []),
    ("two_dims_in_one_position", H + "x[i] = 1.0\nx[t] = 2.0\nout x\n", 6, []),
    ("lhs_not_affine_offset", H + "x[2*t] = 1.0\nout x\n", 5, []),
    ("slice_on_lhs", H + "x[0:T] = 1.0\nout x\n", 5, []),
    ("when_on_values", H + "x[t] = 1.0 when f32(t) < 1.0\nout x\n", 5, []),
    ("too_many_temporal_indices", H + "x[t] = 1.0\ny[t] = x[t, 0]\nout y\n", 6, []),
    ("tuple_arity_mismatch", "def f() { (1.0, 2.0) }\na, b, c = f()\nout a\n", 2, []),
    ("unknown_record_field", "params p { w : f32[2] = zeros }\ny = p.q\nout y\n", 2, ["q"]),
    (
        "params_equation_gives_a_tensor",
        H + "params p[i] { w : f32[2] = zeros }\np[i+1] = 1.0\nout p\n",
        6,
        [],
    ),
    ("out_of_unknown_tensor", "y = 1.0\nout z\n", 2, ["z"]),
    (
        "dtype_in_where_condition_shape",
        "y = where(zeros([2]) > 0.0, zeros([3]), 1.0)\nout y\n",
        1,
        [],
    ),
    ("reshape_bad_size", "y = reshape(zeros([6]), [4, -1])\nout y\n", 1, []),
    ("axis_out_of_range", "y = sum(zeros([2]), 3)\nout y\n", 1, []),
    ("gather_with_a_float_index", "y = zeros([2])[zeros([1])]\nout y\n", 1, []),
    ("spatial_index_out_of_range", "y = zeros([2])[2]\nout y\n", 1, []),
    ("spatial_slice_with_varying_length", H + "y[t] = zeros([4])[t:2*t]\nout y\n", 5, []),
]


def _caret_column(caret_line: str) -> int:
    return len(caret_line) - len(caret_line.lstrip()) + 1


@pytest.mark.parametrize("name, text, line, words", BAD, ids=[b[0] for b in BAD])
def test_bad_program_is_reported_with_position_and_caret(tmp_path, name, text, line, words):
    p = write(tmp_path, text)
    r = cli("check", p)
    assert r.exit_code == 1, (r.exit_code, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    m = re.match(re.escape(str(p)) + r":(\d+):(\d+): error: (.+)", lines[0])
    assert m, lines[0]
    ln, col, message = int(m.group(1)), int(m.group(2)), m.group(3)
    if line is not None:
        assert ln == line, (ln, message)
    source_lines = src(text).splitlines()
    assert lines[1] == source_lines[ln - 1]
    assert "^" in lines[2] and _caret_column(lines[2]) == col
    for w in words:
        assert w in message, (w, message)
    # run refuses it the same way, before running anything
    r2 = cli("run", p, "--no-progress")
    assert r2.exit_code == 1 and "Traceback" not in r2.stderr
    assert r2.stderr.splitlines()[0] == lines[0]


def test_bad_set_of_an_unknown_config_is_an_error(tmp_path):
    p = write(tmp_path, "config T = 3\ny = T\nout y\n")
    r = cli("check", p, "--set", "Q=2")
    assert r.exit_code in (1, 2) and "Traceback" not in r.stderr and "Q" in r.stderr


def test_bad_set_value_is_an_error(tmp_path):
    p = write(tmp_path, "config T = 3\ny = T\nout y\n")
    r = cli("check", p, "--set", "T=abc")
    assert r.exit_code in (1, 2) and "Traceback" not in r.stderr and "T" in r.stderr


def test_bad_set_float_for_an_int_config_is_an_error(tmp_path):
    p = write(tmp_path, "config T = 3\ndim t < T\ny[t] = 1.0\nout y\n")
    r = cli("check", p, "--set", "T=2.5")
    assert r.exit_code in (1, 2) and "Traceback" not in r.stderr


def test_malformed_set_is_an_error(tmp_path):
    p = write(tmp_path, "config T = 3\ny = T\nout y\n")
    r = cli("check", p, "--set", "T")
    assert r.exit_code in (1, 2) and "Traceback" not in r.stderr


def test_bad_env_override_is_an_error(tmp_path):
    p = write(tmp_path, "config T = 3\ny = T\nout y\n")
    r = cli("check", p, "--env", "E=cartpole")
    assert r.exit_code in (1, 2) and "Traceback" not in r.stderr


def test_missing_file_is_a_usage_error(tmp_path):
    r = cli("check", tmp_path / "nope.rtl")
    assert r.exit_code == 2 and "Traceback" not in r.stderr
