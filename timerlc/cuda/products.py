"""Our own kernels for skinny float32 products: the alternative to the device's BLAS that a
``GemmCall`` carries (``own``, docs/cuda.md "Products of ours").

PPO's minibatch step makes products of 65,536 rows by 64 columns or fewer: ``x @ W`` and
``dy @ W^T`` (a 64 x 64 or 4 x 64 weight) and the weights' gradients ``x^T @ dy`` (the rows
summed). On an H100 cuBLAS took 25-32 us for each in float32 where their bytes take about 10
(docs/performance.md, eleventh session). Two forms:

- ``rows``: ``C[m x n] = A[m x k] @ op(B)`` with k and n at most ``MAX_SIDE``: the weight
  in shared memory once a block; the block's rows of A a tile at a time in shared memory
  (transposed: a thread's rows side by side); each thread a ``TM x TN`` tile of C summed
  over k in registers, in k's order: its rows side by side, its columns every CT-th (the
  tiles across n), so that a warp's threads store a row's consecutive columns together
  (side by side, each store of a warp touched 32 sectors of 32 bytes, a float of each).
- ``gram``: ``C[m x n] = op(A) @ op(B)`` summed over k, the rows, with m and n at most
  ``MAX_SIDE`` (``x^T @ dy``: A is rows x m, read transposed), two launches:
  ``parts(rows)`` copies, each the sum over its chunk of rows (whole stages of
  ``STAGE_ROWS``; a block a copy at a time; each thread a tile of C, or a tile and every
  G-th row of the chunk where C has fewer tiles than the block has threads, its groups
  then added in order), into the statement's scratch memory (C itself where there is one
  copy: one launch); then the copies added in a fixed order (``lanes`` threads an
  element, each every lanes-th copy, then the lanes in order); a gram of at most
  ``MERGED_SUMS`` elements adds them in its first launch, by its last blocks
  (``_merged_sums``: one launch).

Both copy their operands into shared memory 8 loads of a thread at a time, 16 bytes each
where the operands are aligned (``_copy``).

In a chain (``render._Kernel._chains``: steps over the same rows as one function, each
block a chunk of the rows through all of them) each is a step over the chain's tile of
rows ``tl_rb ..< tl_re``: a rows product ``CHAIN_TILE`` rows at a time, op(B) the chain's
copy (``rows_chain_head``) and A's tile in the chain's pool of shared memory
(``rows_lines(..., chain=)``); a gram's tile added into the chunk's copy, ``CHAIN_STAGE``
rows at a time in the pool (``gram_part_lines(..., chain=True)``), the copies of all the
chain's grams added at its end by tickets (``chain_sums_lines``).

Each sum's order is fixed by the shapes (and the block's threads): the same values whatever
the grid. The runtime times each against the device's BLAS at its first call and keeps the
faster (``runtime.cuda``); the emulated device runs ours.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

MAX_SIDE = 64  # the most columns of a product's narrow sides (k and n; m and n for gram)
MIN_ROWS = 16  # the fewest rows (m for rows, k for gram) a product of ours is made for
MAX_THREADS = 128  # of a block (render.THREADS; the emulation's at most)
SMEM_FLOATS = 12000  # the shared memory a function of ours uses (48 KB static at most)
STAGE_ROWS = 64  # gram: the rows of A and B a block holds in shared memory at a time
PART_ROWS = 256  # gram: the fewest rows a copy sums
MAX_PARTS = 256  # gram: the most copies
MAX_LANES = 32  # gram: the most threads that add an element's copies
COPY_BATCH = 8  # the loads into shared memory a thread issues before it waits for them
VEC_ROWS = True  # rows functions read their shared memory 16 bytes at a time (_rows_vec_lines)
VEC_GRAMS = True  # grams' parts read their operands 16 bytes at a time (_gram_operands)
# a gram of at most this many elements (and more than one copy) adds its copies in its part
# function, the last copy of each group of copies adding the group's, the last group's
# the groups' (``_merged_sums``): no launch of their own; 0: never
MERGED_SUMS = 256
CHAIN_STAGE = 32  # gram: the rows of A and B in shared memory at a time in a chain's pool
CHAIN_TILE = 64  # rows: the most rows of A in shared memory at a time in a chain's pool


def _divisor(n: int, options) -> int:
    return next(d for d in options if n % d == 0)


def form(dtype: str, m: int, n: int, k: int, ta: bool, tb: bool) -> str | None:
    """Which kernel of ours computes the product (``rows`` or ``gram``), or None (the
    device's BLAS alone)."""
    if dtype != "f32":
        return None
    if not ta and k <= MAX_SIDE and n <= MAX_SIDE and m >= MIN_ROWS:
        return "rows"
    if m <= MAX_SIDE and n <= MAX_SIDE and k >= MIN_ROWS:
        return "gram"
    return None


def parts(rows: int) -> int:
    """A gram product's copies (each the sum over ``PART_ROWS`` rows or more)."""
    return max(1, min(MAX_PARTS, rows // PART_ROWS))


def scratch_bytes(m: int, n: int, k: int, ta: bool, tb: bool, sums: bool = False) -> int:
    """The scratch memory the product's kernels of ours need (a gram's copies, where it
    has more than one; with ``sums``, its B's column sums' too, float64)."""
    if form("f32", m, n, k, ta, tb) != "gram" or parts(k) == 1:
        return 0
    return parts(k) * (m * n * 4 + (n * 8 if sums else 0))


def launches(m: int, n: int, k: int, ta: bool, tb: bool) -> tuple[str, ...]:
    """The functions of ours a product launches one after another: ``rows``; a gram's
    ``part`` and ``sum`` (its one copy C itself where it has one, or its copies added in
    its last blocks, ``merged``: ``part`` alone)."""
    what = form("f32", m, n, k, ta, tb)
    if what == "rows":
        return ("rows",)
    return ("part",) if parts(k) == 1 or merged(m, n, k) else ("part", "sum")


def merged(m: int, n: int, k: int) -> bool:
    """Whether a gram (``form``) of C ``m x n`` over ``k`` rows adds its copies in its part
    function (``_merged_sums``): more than one copy, at most ``MERGED_SUMS`` elements."""
    return parts(k) > 1 and m * n <= MERGED_SUMS


def copy_groups(k: int) -> tuple[int, int]:
    """``(GS, NG)``: a merged gram's copies (``parts(k)``) in ``NG`` groups of ``GS`` (the
    last may have fewer), about the square root of their number (as ``tl_group_size``
    groups a reduction's blocks)."""
    p = parts(k)
    gs = math.isqrt(p - 1) + 1 if p > 1 else 1
    gs = gs if gs < p else 1
    return gs, -(-p // gs)


def _merged_sums(s, c: str, sums: str | None, final: list[str]) -> list[str]:
    """The lines (at the depth of a gram's loop over its copies, after copy ``p``'s
    elements are stored) that add a merged gram's copies (``merged``) where a launch of its
    own (``gram_sum_lines``) did: the block that stores the last copy of a group
    (``copy_groups``: its ticket, ``tl_groups``) adds the group's copies in order into its
    first; the one that adds the last group's (``tl_count``) adds the groups' first copies
    in order into C (and B's column sums into ``sums``), then runs ``final`` (lines: the
    steps after the sums, ``render._Kernel._sums_tail``). The order of every sum is fixed
    by the copies, whatever the grid; the tickets are set back to 0 by the block that read
    them last (``_ticket_sums``)."""
    m, n = s.m, s.n
    arrays = [("float", "tl_pp", m * n, f"({c})[e / {n} * {s.ldc} + e % {n}]")]
    if sums is not None:
        arrays.append(("double", "tl_pd", n, f"({sums})[e]"))
    return _ticket_sums(s.k, arrays, final)


def chain_sums_lines(k: int, arrays: list, final: list[str]) -> list[str]:
    """The lines (at depth 0, at the end of a chain's loop over its copies ``tl_p``, one a
    chunk of its ``k`` rows: ``render._Kernel.chain_body``) that add the copies of every
    gram of the chain as a merged gram's (``_ticket_sums``): ``arrays``, each ``(C type,
    copies, elements a copy, destination)`` (the destination a C expression of the
    element ``e``); then ``final``."""
    mine = ["    const long long p = tl_p;"] if copy_groups(k)[0] > 1 else []  # (its group)
    return ["  {", *mine, *_ticket_sums(k, arrays, final), "  }"]


def _ticket_sums(k: int, arrays: list, final: list[str]) -> list[str]:
    """``_merged_sums``' lines for copies of ``k`` rows' chunks (``parts``) of the arrays
    ``arrays`` (``(C type, copies, elements a copy, destination of element e)``), all
    with one ticket a copy."""
    p = parts(k)
    gs, ng = copy_groups(k)

    def added(t: str, arr: str, size: int, first: str, step: str, terms: str, dst: str):
        return [
            f"      for (int e = threadIdx.x; e < {size}; e += blockDim.x) {{",
            f"        {t} v = {arr}[({first}) * {size} + e];",
            "#pragma unroll 4",
            f"        for (long long q = 1; q < {terms}; q++)",
            f"          v += {arr}[(({first}) + q * {step}) * {size} + e];",
            f"        {dst} = v;",
            "      }",
        ]

    group = ["    {"]
    if gs > 1:
        group = [
            f"    const long long tl_f = p / {gs} * {gs};  // (the group's first copy)",
            f"    const long long tl_in = {p} - tl_f < {gs} ? {p} - tl_f : {gs};",
            "    if (threadIdx.x == 0)",
            f"      tl_last = atomicAdd(tl_groups(err) + p / {gs}, 1u) == tl_in - 1;",
            "    __syncthreads();",
            "    if (tl_last) {  // (the group's last copy: the group's copies into its first)",
            "      __threadfence();",
            f"      if (threadIdx.x == 0) tl_groups(err)[p / {gs}] = 0;",
            *(
                x
                for t, arr, size, _ in arrays
                for x in added(t, arr, size, "tl_f", "1", "tl_in", f"{arr}[tl_f * {size} + e]")
            ),
            "      __threadfence();  // (the group's sums, then the ticket)",
            "      __syncthreads();",
        ]
    final_sum = [
        f"      if (threadIdx.x == 0) tl_last = atomicAdd(tl_count(err), 1u) == {ng} - 1;",
        "      __syncthreads();",
        "      if (tl_last) {  // (the last group: the groups' first copies into C)",
        "        __threadfence();",
        "        if (threadIdx.x == 0) *tl_count(err) = 0;",
        *(
            "  " + x
            for t, arr, size, dst in arrays
            for x in added(t, arr, size, "0", str(gs), str(ng), dst)
        ),
        *("        " + x for x in final),
        "      }",
    ]
    return [
        "    __threadfence();  // (this copy's elements, then its ticket)",
        "    __syncthreads();",
        *group,
        *final_sum,
        "    }",
        "    __syncthreads();  // (tl_last read before the next copy's ticket)",
    ]


def _rows_tiling(n: int, k: int, chain: bool = False) -> tuple[int, int, int, int, int]:
    """``(TM, TN, CT, BM, BMP)``: a thread's tile; the tiles across n; a block's rows of A
    at a time, and their stride in shared memory (BMP = 1 mod 32: a column's writes and a
    warp's reads in distinct banks). In a chain (``chain``), ``CHAIN_TILE`` rows at the
    most: a narrow product's (a head's 1 or 2 columns, 128 rows a thread's each, 33 KB of
    tile) then takes half the chain's shared memory, as a 64-wide layer's does."""
    tn = _divisor(n, (8, 4, 2, 1))
    ct = n // tn
    rt = max(1, MAX_THREADS // ct)
    if chain:
        rt = min(rt, CHAIN_TILE)
    for tm in (4, 2, 1):
        bm = rt * tm
        bmp = bm + (1 - bm) % 32
        if k * n + k * bmp <= SMEM_FLOATS and not (chain and bm > CHAIN_TILE):
            return tm, tn, ct, bm, bmp
    raise AssertionError("no tiling fits")  # pragma: no cover - k, n <= MAX_SIDE fit


def rows_threads(m: int, n: int, k: int) -> int:
    """The threads a rows product asks for: a block a tile of rows."""
    bm = _rows_tiling(n, k)[3]
    return -(-m // bm) * MAX_THREADS


def rows_tile(s, tf32: bool = False) -> tuple[int, int]:
    """``(BM, floats)``: the rows a rows product of ours takes at a time in a chain, and the
    floats its tile of A takes in shared memory (the chain's pool holds the largest:
    ``rows_lines(..., chain=)``; with ``tf32``, ``rows_tf32_lines(..., chain=)``'s: A's
    tile, then C's in its place)."""
    n, k = s.n, s.k
    if tf32:
        return TF32_ROWS, TF32_ROWS * max(_stride(k, 4), n + 4)
    _, tn, _, bm, bmp = _rows_tiling(n, k, True)
    if _rows_vec(tn, bm, n, k):
        return bm, bm * _vec_stride(k)
    return bm, k * bmp


def weights_floats(s, tf32: bool = False) -> int:
    """The floats a chain's copy of op(B) of rows product ``s`` takes (``rows_chain_head``)."""
    return s.k * (_stride(s.n, 8) if tf32 else s.n)


def rows_chain_head(s, b: str, j: int, tf32: bool = False, at: str | None = None) -> list[str]:
    """The lines (indented from depth 0) that declare ``tl_w{j}``, the chain's copy of op(B)
    of rows product ``s`` (its ``j``-th: ``rows_lines(..., chain=j)`` reads it, or with
    ``tf32`` ``rows_tf32_lines(..., chain=j)``, its rows ``_stride(n, 8)`` apart), and copy
    it from ``b`` (the C expression of B's first element) once a block, as a rows function
    copies it (``_weights``), before the chain's first rows. With ``at`` (a C expression
    of a ``float4 *`` into the chain's dynamic shared memory), a pointer there."""
    n, k = s.n, s.k
    w = f"tl_w{j}"
    note = f"  // op(B) of the chain's product {j}"

    def declare(dtype: str, count: int) -> str:
        if at is None:
            return f"__shared__ {dtype} {w}[{count}];{note}"
        return f"{dtype} *{w} = ({dtype} *)({at});{note}"

    if tf32:
        nb = _stride(n, 8)
        declared, alias = declare("float", k * nb), f"float *tl_bs = {w};"
        copy = _weights(s, "B", nb)[1:]
    else:
        _, tn, ct, bm, _ = _rows_tiling(n, k, True)
        vec = _rows_vec(tn, bm, n, k)
        weights = _weights(s, "B", n, _vec_column(ct) if vec else None)
        declared = declare("float4", k * n // 4) if vec else declare("float", k * n)
        alias = f"float *tl_bs = (float *){w};"
        copy = weights[2:] if vec else weights[1:]
    return [declared, "{", f"  const float *B = {b};", f"  {alias}", *copy, "}"]


def _rows_head(
    s,
    a: str,
    b: str,
    c: str,
    bm: int,
    nb: int,
    a_tile: list,
    a_dst,
    column=None,
    a_dst4=None,
    chain: int | None = None,
) -> list[str]:
    """A rows function's start: A, B and C (the operands' first elements ``a``, ``b``,
    ``c``); op(B) once a block into ``tl_bs`` by ``_copy`` (one load at a time, each a round
    trip to memory, were some 10 us before a block's first tile), k rows ``nb`` apart; the
    declaration ``a_tile`` of ``tl_as`` (its lines); then the loop over the block's tiles of
    ``bm`` rows of A opened, each tile's rows copied into ``tl_as`` by ``a_dst`` (``_copy``'s
    destination) between two barriers. The caller closes the loop and the block. In a
    chain (``chain``: the product's number in it, ``rows_chain_head``), op(B) is the
    chain's copy ``tl_w{chain}``, A's tile the chain's pool ``tl_sm4`` (``a_tile`` says
    how), and the loop is over the chain's rows ``tl_rb ..< tl_re``."""
    m, k = s.m, s.k
    copy_a = _copy(
        Lines(bm, k, lambda o: f"A + (r0 + {o}) * {s.lda}", s.lda),
        a_dst,
        line_ok=lambda o: f"r0 + {o} < {m}LL",
        indent="    ",
        dst4=a_dst4,
    )
    if chain is not None:
        w = f"tl_w{chain}"
        weights = (
            [f"  const float4 *tl_bs4 = {w};"]
            if column is not None
            else [f"  const float *tl_bs = {w};"]
        )
        return [
            "{",
            f"  const float *A = {a};",
            f"  float *C = {c};",
            *weights,
            *(f"  {x}" for x in a_tile),
            f"  for (long long r0 = tl_rb; r0 < tl_re; r0 += {bm}) {{",
            "    __syncthreads();  // (the chain's step before done; the last tile read)",
            *copy_a,
            "    __syncthreads();",
        ]
    weights = _weights(s, "B", nb, column)
    return [
        "{",
        f"  const float *A = {a};",
        f"  const float *B = {b};",
        f"  float *C = {c};",
        weights[0],
        *(f"  {x}" for x in a_tile),
        *weights[1:],
        (
            f"  for (long long r0 = (long long)blockIdx.x * {bm}; r0 < {m}LL;"
            f" r0 += (long long)gridDim.x * {bm}) {{"
        ),
        "    __syncthreads();  // (op(B) written; the last tile done)",
        *copy_a,
        "    __syncthreads();",
    ]


def _weights(s, b: str, nb: int, column=None) -> list[str]:
    """The declaration of ``tl_bs`` (op(B) of rows product ``s``, k x n, its rows ``nb``
    floats apart) and the lines (indented from depth 0) that copy it from ``b`` (the C
    pointer to B's first element) by ``_copy``, a line of B at a time (a row of op(B), or a
    column where B is stored transposed). With ``column`` (a C expression of a column's
    number: its place in its row), the columns in that order, the array 16 bytes aligned
    (``_rows_vec_lines``)."""
    n, k = s.n, s.k
    b_lines = Lines(n if s.tb else k, k if s.tb else n, lambda o: f"{b} + ({o}) * {s.ldb}", s.ldb)
    place = column or (lambda x: x)
    if s.tb:
        b_dst = lambda o, i: f"tl_bs[({i}) * {nb} + {place(o)}]"
    else:
        b_dst = lambda o, i: f"tl_bs[({o}) * {nb} + {place(i)}]"
    declared = [f"  __shared__ float tl_bs[{k * nb}];  // op(B), k x n, rows {nb} apart"]
    if column is not None:
        declared = [
            f"  __shared__ float4 tl_bs4[{k * nb // 4}];  // op(B), k x n, rows {nb} apart",
            "  float *tl_bs = (float *)tl_bs4;",
        ]
    return [*declared, *_copy(b_lines, b_dst, indent="  ")]


def rows_lines(
    s, a: str, b: str, c: str, store: tuple[str, str, str] | None = None, chain=None
) -> list[str]:
    """The lines (indented from depth 0) of ``C = A @ op(B)`` for gemm ``s`` (``form``
    rows), A, B and C the C expressions of the operands' first elements. With ``store``
    (``(rows, column, value)``: an epilogue's, ``render._Kernel._rows_epilogues``), each
    element of C is ``value`` instead, a C expression of the product's value ``tl_v``, of
    the long long ``column`` (the element's column, which the lines define) and of what
    the C line ``rows`` defines from the element's row ``r``. With ``chain`` (the
    product's number in a chain, ``rows_chain_head``), the rows ``tl_rb ..< tl_re`` only,
    op(B) the chain's copy and A's tile in its pool (``_rows_head``)."""
    n, k = s.n, s.k
    tm, tn, ct, bm, bmp = _rows_tiling(n, k, chain is not None)
    if _rows_vec(tn, bm, n, k):
        return _rows_vec_lines(s, a, b, c, store, (tm, tn, ct, bm), chain)
    tiles = (bm // tm) * ct
    fma = []
    for i in range(tm):
        for j in range(tn):
            fma.append(f"tl_c[{i}][{j}] = fmaf(tl_a[{i}], tl_b[{j}], tl_c[{i}][{j}]);")
    return [
        *_rows_head(
            s,
            a,
            b,
            c,
            bm,
            n,
            [f"__shared__ float tl_as[{k * bmp}];  // a tile of A's rows, transposed"]
            if chain is None
            else ["float *tl_as = (float *)tl_sm4;"],
            lambda o, i: f"tl_as[({i}) * {bmp} + {o}]",
            chain=chain,
        ),
        f"    for (int t = threadIdx.x; t < {tiles}; t += blockDim.x) {{",
        f"      const int ty = t / {ct}, tx = t % {ct};",
        f"      float tl_c[{tm}][{tn}] = {{}};",
        "#pragma unroll 8",
        f"      for (int kk = 0; kk < {k}; kk++) {{",
        f"        float tl_a[{tm}], tl_b[{tn}];",
        "#pragma unroll",
        f"        for (int i = 0; i < {tm}; i++) tl_a[i] = tl_as[kk * {bmp} + ty * {tm} + i];",
        "#pragma unroll",
        f"        for (int j = 0; j < {tn}; j++) tl_b[j] = tl_bs[kk * {n} + tx + j * {ct}];",
        *("        " + x for x in fma),
        "      }",
        *_rows_stores(s, tm, tn, ct, store, f"r0 + ty * {tm} + i"),
    ]


def _vec_column(ct: int):
    """Where a vector rows function keeps op(B)'s column ``x`` in its row (a C expression of
    the C expression ``x``): each thread's 8 columns (``tx + j * CT``) two runs of 4."""
    return lambda x: f"(({x}) / {4 * ct}) * {4 * ct} + (({x}) % {ct}) * 4 + (({x}) / {ct}) % 4"


def _vec_stride(k: int) -> int:
    """The floats between two rows of A's tile in a vector rows function's shared memory:
    a multiple of 4 (16 bytes) whose quarter is odd, so that a warp's rows side by side
    (4 or more, 16 bytes each) fall in distinct banks."""
    return k + 4 if (k // 4) % 2 == 0 else k + 8


def _rows_vec(tn: int, bm: int, n: int, k: int) -> bool:
    """Whether a rows product has the vector form (``_rows_vec_lines``): each thread's
    columns 8, k a multiple of 4, both tiles within ``SMEM_FLOATS``."""
    return VEC_ROWS and tn == 8 and k % 4 == 0 and k * n + bm * _vec_stride(k) <= SMEM_FLOATS


def _rows_vec_lines(s, a: str, b: str, c: str, store, tiling: tuple, chain=None) -> list[str]:
    """``rows_lines``'s product with the shared memory read 16 bytes at a time: A's tile
    row by row (``_vec_stride`` floats apart), each thread's rows ``RT`` apart (``ty``,
    ``ty + RT``, ...: a warp's rows side by side, in distinct banks), four k's of each of
    its rows a load; op(B)'s columns placed so that each thread's 8 (``tx + j * CT``) are
    two runs of 4, a load each. A k of a thread's 4 x 8 tile was 12 loads of 4 bytes for
    its 32 FMAs (a rows product of 65,536 x 64 x 64 issued 0.67 instructions a cycle a
    scheduler on the H200, bound by its instructions); now 3 for 32 and a quarter of A's
    loads. Each element is summed over k in order, as ``rows_lines`` sums it: the same C.
    ``tiling``: ``_rows_tiling``'s TM, TN, CT and BM."""
    n, k = s.n, s.k
    tm, tn, ct, bm = tiling
    rt, kp = bm // tm, _vec_stride(k)
    tiles = rt * ct
    column = _vec_column(ct)
    fma = []
    for q, part in enumerate("xyzw"):
        fma += [
            "{",
            f"  const float4 tl_b0 = tl_b4[(k0 + {q}) * {n // 4}];",
            f"  const float4 tl_b1 = tl_b4[(k0 + {q}) * {n // 4} + {ct}];",
        ]
        for i in range(tm):
            for j in range(tn):
                bj = f"tl_b{j // 4}.{'xyzw'[j % 4]}"
                fma.append(f"  tl_c[{i}][{j}] = fmaf(tl_a[{i}].{part}, {bj}, tl_c[{i}][{j}]);")
        fma.append("}")
    return [
        *_rows_head(
            s,
            a,
            b,
            c,
            bm,
            n,
            [
                f"__shared__ float4 tl_as4[{bm * kp // 4}];  // a tile of A's rows, {kp} apart",
                "float *tl_as = (float *)tl_as4;",
            ]
            if chain is None
            else ["float4 *tl_as4 = tl_sm4;", "float *tl_as = (float *)tl_sm4;"],
            lambda o, i: f"tl_as[({o}) * {kp} + {i}]",
            column,
            lambda o, i: f"tl_as4[(({o}) * {kp} + ({i})) / 4]",
            chain=chain,
        ),
        f"    for (int t = threadIdx.x; t < {tiles}; t += blockDim.x) {{",
        f"      const int ty = t / {ct}, tx = t % {ct};",
        f"      float tl_c[{tm}][{tn}] = {{}};",
        f"      const float4 *tl_a4 = tl_as4 + ty * {kp // 4};",
        "      const float4 *tl_b4 = tl_bs4 + tx;",
        "#pragma unroll 2",
        f"      for (int k0 = 0; k0 < {k}; k0 += 4) {{",
        f"        float4 tl_a[{tm}];",
        "#pragma unroll",
        f"        for (int i = 0; i < {tm}; i++) tl_a[i] = tl_a4[i * {rt * kp // 4} + k0 / 4];",
        *("        " + x for x in fma),
        "      }",
        *_rows_stores(s, tm, tn, ct, store, f"r0 + ty + i * {rt}"),
    ]


def _rows_stores(s, tm: int, tn: int, ct: int, store, row: str) -> list[str]:
    """The end of a rows function: a thread's tile made its epilogue's values
    (``_epilogue``), then stored, row ``row`` (a C expression of the tile's row ``i``) and
    column ``tx + j * CT`` of each element; the loops and the block closed."""
    return [
        *_epilogue(s, tm, tn, ct, store, row),
        "#pragma unroll",
        f"      for (int i = 0; i < {tm}; i++) {{",
        f"        const long long r = {row};",
        f"        if (r >= {s.m}LL) break;",
        "#pragma unroll",
        f"        for (int j = 0; j < {tn}; j++) C[r * {s.ldc} + tx + j * {ct}] = tl_c[i][j];",
        "      }",
        "    }",
        "  }",
        "}",
    ]


def _epilogue(
    s, tm: int, tn: int, ct: int, store: tuple[str, str, str] | None, row: str
) -> list[str]:
    """A rows thread's tile made an epilogue's values in its registers (``rows_lines``),
    before any is stored: every load the epilogue makes (a ``1 - h^2``'s h) issued before
    the first is waited for, where a load after each store (which may write what it reads,
    for all the compiler knows) waited for the one before."""
    if store is None:
        return []
    rows, col, value = store
    return [
        "#pragma unroll",
        f"      for (int i = 0; i < {tm}; i++) {{",
        f"        const long long r = {row};",
        f"        if (r >= {s.m}LL) break;",
        f"        {rows}",
        "#pragma unroll",
        f"        for (int j = 0; j < {tn}; j++) {{",
        f"          const long long {col} = tx + j * {ct};",
        "          const float tl_v = tl_c[i][j];",
        f"          tl_c[i][j] = {value};",
        "        }",
        "      }",
    ]


def _gram_tiling(m: int, n: int) -> tuple[int, int, int, int]:
    """``(TM, TN, CT, TILES)`` of a gram product: a thread's tile, the tiles across n, all."""
    tm = _divisor(m, (4, 2, 1))
    tn = _divisor(n, (8, 4, 2, 1))
    return tm, tn, n // tn, (m // tm) * (n // tn)


def gram_chain_floats(s, tf32: bool = False) -> int:
    """The floats of a chain's pool a gram's rows take (``gram_part_lines(..., chain=True)``:
    a stage of A's and B's rows, or the threads' tiles of C in turn; with ``tf32``,
    ``gram_part_tf32_lines(..., chain=True)``'s stage, lines ``_stride`` apart)."""
    if tf32:
        return CHAIN_STAGE * (_stride(s.m, 8) + _stride(s.n, 8))
    tm, tn, _, _ = _gram_tiling(s.m, s.n)
    return max(CHAIN_STAGE * (s.m + s.n), MAX_THREADS * tm * tn)


def gram_part_threads(k: int) -> int:
    return parts(k) * MAX_THREADS


def _copies(s, copies: str, c: str, sums: str | None) -> list[str]:
    """The lines that point ``tl_pp`` at a gram's copies of C (floats) and, with ``sums``,
    ``tl_pd`` at its copies of B's column sums (doubles, first: aligned): in the scratch
    memory at ``copies`` (a ``char *``), or C and the sums themselves where it has one."""
    p = parts(s.k)
    if p == 1:
        return [f"  float *tl_pp = {c};"] + ([f"  double *tl_pd = {sums};"] if sums else [])
    if sums is None:
        return [f"  float *tl_pp = (float *)({copies});"]
    return [
        f"  double *tl_pd = (double *)({copies});",
        f"  float *tl_pp = (float *)({copies} + {p * s.n * 8});",
    ]


def gram_part_lines(
    s,
    a: str,
    b: str,
    copies: str,
    c: str,
    sums: str | None = None,
    final=(),
    chain: bool = False,
) -> list[str]:
    """The first launch of gram ``s``: each copy (of ``parts(k)``, at ``copies``, m x n
    floats each) the sum of its chunk of rows; C itself (at ``c``) where it has one. With
    ``sums`` (a float64 array of n), B's column sums too, in float64: the threads of the
    first row of tiles add the B values they read (``_copies``). A merged gram's copies
    added into C by its last blocks, then ``final`` (``_merged_sums``). In a chain
    (``chain``, ``render._Kernel.chain_body``): the rows ``tl_rb ..< tl_re`` of copy
    ``tl_p``'s chunk alone, ``CHAIN_STAGE`` rows at a time in the chain's pool, added
    into the copy (stored into it at the chunk's first rows, ``tl_first``); the chain
    adds the copies (``chain_sums_lines``)."""
    m, n, k = s.m, s.n, s.k
    tm, tn, ct, tiles = _gram_tiling(m, n)
    p = parts(k)
    sr = CHAIN_STAGE if chain else STAGE_ROWS
    chunk = -(-k // p // sr) * sr  # (whole stages: a stage's first row 16 bytes aligned)
    size = max(sr * (m + n), MAX_THREADS * tm * tn)
    ld = s.ldc if p == 1 else n  # (C's rows, or a copy's)
    fma = []
    for i in range(tm):
        for j in range(tn):
            fma.append(f"tl_c[{i}][{j}] = fmaf(tl_a[{i}], tl_b[{j}], tl_c[{i}][{j}]);")
    with_sums, keep, group, total = [], [], [], []
    if sums is not None:
        with_sums = [
            f"  __shared__ double tl_sd[{MAX_THREADS * tn}];  // the groups' column sums",
        ]
        keep = [
            "            if (ty == 0)",
            "#pragma unroll",
            f"              for (int j = 0; j < {tn}; j++) tl_s[j] += (double)tl_b[j];",
        ]
        group = [
            "      if (mine && tl_g > 1 && ty == 0)",
            "#pragma unroll",
            f"        for (int j = 0; j < {tn}; j++) tl_sd[threadIdx.x * {tn} + j] = tl_s[j];",
        ]
        at = f"tl_pd[p * {n} + tx * {tn} + j]"
        total = [
            "      if (mine && g == 0 && ty == 0) {",
            "#pragma unroll",
            f"        for (int j = 0; j < {tn}; j++) {{",
            "          double v = tl_s[j];",
            "#pragma unroll 1",
            f"          for (int h = 1; h < tl_g; h++) v += tl_sd[(h * {tiles} + tile) * {tn} + j];",
            f"          {at} = {f'tl_first ? v : {at} + v' if chain else 'v'};",
            "        }",
            "      }",
        ]
    at = f"tl_pp[p * {m * n} + (ty * {tm} + e / {tn}) * {ld} + tx * {tn} + e % {tn}]"
    if chain:  # (the chain's pool and its groups' column sums; one chunk's rows)
        with_sums = []
        head = [
            "  float *tl_sm = (float *)tl_sm4;",
            f"  const int tl_g = blockDim.x >= {tiles} ? blockDim.x / {tiles} : 1;  // row groups",
            "  {",
            "    const long long p = tl_p, lo = tl_rb, hi = tl_re;",
        ]
    else:
        head = [
            f"  __shared__ float4 tl_sm4[{-(-size // 4)}];  // A's and B's rows; the groups' sums",
            "  float *tl_sm = (float *)tl_sm4;",
            f"  const int tl_g = blockDim.x >= {tiles} ? blockDim.x / {tiles} : 1;  // row groups",
            f"  for (long long p = blockIdx.x; p < {p}; p += gridDim.x) {{",
            f"    const long long lo = p * {chunk}, hi = lo + {chunk} < {k}LL ? lo + {chunk} : {k}LL;",
        ]
    return [
        "{",
        f"  const float *A = {a};",
        f"  const float *B = {b};",
        *_copies(s, copies, c, sums),
        *(
            ["  __shared__ int tl_last;  // (a ticket's: _merged_sums)"]
            if merged(m, n, k) and not chain
            else []
        ),
        *with_sums,
        *head,
        f"    for (int t0 = 0; t0 < {tiles} * tl_g; t0 += blockDim.x) {{  // (same on every thread)",
        "      const int t = t0 + threadIdx.x;",
        f"      const bool mine = t < {tiles} * tl_g;",
        f"      const int tile = t % {tiles}, g = t / {tiles};",
        f"      const int ty = tile / {ct}, tx = tile % {ct};",
        f"      float tl_c[{tm}][{tn}] = {{}};",
        *([f"      double tl_s[{tn}] = {{}};"] if sums is not None else []),
        *_stages(
            (s.ta, "A", s.lda, m, sr, "0"),
            (not s.tb, "B", s.ldb, n, sr, str(sr * m)),
            [
                "        if (mine) {",
                "#pragma unroll 4",
                f"          for (int r = g; r < {sr}; r += tl_g) {{",
                *("            " + x for x in _gram_operands(m, n, sr, tm, tn)),
                *("            " + x for x in fma),
                *keep,
                "          }",
                "        }",
            ],
        ),
        "      __syncthreads();  // (the rows read: the groups' sums in their place)",
        *group,
        "      if (mine && tl_g > 1)",
        "#pragma unroll",
        (
            f"        for (int e = 0; e < {tm * tn}; e++)"
            f" tl_sm[threadIdx.x * {tm * tn} + e] = tl_c[e / {tn}][e % {tn}];"
        ),
        "      __syncthreads();",
        "      if (mine && g == 0) {",
        "#pragma unroll",
        f"        for (int e = 0; e < {tm * tn}; e++) {{",
        f"          float v = tl_c[e / {tn}][e % {tn}];",
        "#pragma unroll 1",
        (
            "          for (int h = 1; h < tl_g; h++)"
            f" v += tl_sm[(h * {tiles} + tile) * {tm * tn} + e];"
        ),
        f"          {at} = {f'tl_first ? v : {at} + v' if chain else 'v'};",
        "        }",
        "      }",
        *total,
        "    }",
        *(_merged_sums(s, c, sums, list(final)) if merged(m, n, k) and not chain else []),
        "  }",
        "}",
    ]


def _gram_operands(m: int, n: int, sr: int, tm: int, tn: int) -> list[str]:
    """A gram thread's ``tl_a`` (its tile's ``tm`` rows of op(A)^T at row ``r`` of the
    stage) and ``tl_b`` (its ``tn`` columns of op(B)) out of the stage in shared memory:
    16 bytes a load where each run is a multiple of 4 floats from a multiple of 4 (each
    thread's columns are side by side: a 4 x 64's 8 columns a thread were 8 loads of 4
    bytes, each 8-way in conflict among a warp's 4 rows and two halves of 32 columns; the
    4 x 64 grams of PPO's first layers took 30 us each on the H200 for 17 MB)."""
    b0 = f"{sr * m} + r * {n} + tx * {tn}"
    if not VEC_GRAMS or tm % 4 or tn % 4 or m % 4 or n % 4:
        return [
            f"float tl_a[{tm}], tl_b[{tn}];",
            "#pragma unroll",
            f"for (int i = 0; i < {tm}; i++) tl_a[i] = tl_sm[r * {m} + ty * {tm} + i];",
            "#pragma unroll",
            f"for (int j = 0; j < {tn}; j++) tl_b[j] = tl_sm[{b0} + j];",
        ]

    def runs(dst: str, count: int, at: str, v: str) -> list[str]:  # (count floats at ``at``)
        return [
            "#pragma unroll",
            f"for (int {v} = 0; {v} < {count // 4}; {v}++) {{",
            f"  const float4 tl_v = tl_sm4[{at} / 4 + {v}];",
            f"  {dst}[4 * {v}] = tl_v.x; {dst}[4 * {v} + 1] = tl_v.y;",
            f"  {dst}[4 * {v} + 2] = tl_v.z; {dst}[4 * {v} + 3] = tl_v.w;",
            "}",
        ]

    return [
        f"float tl_a[{tm}], tl_b[{tn}];",
        *runs("tl_a", tm, f"(r * {m} + ty * {tm})", "i"),
        *runs("tl_b", tn, f"({b0})", "j"),
    ]


def tf32_form(m: int, n: int, k: int, ta: bool, tb: bool) -> bool:
    """Whether a float32 product of ours has TF32 functions too (``rows_tf32_lines``,
    ``gram_part_tf32_lines``: the tensor cores' ``mma.sync`` of 16 x 8 x 8, for
    ``--matmul-precision tensorfloat32``): a rows product whose k and n are multiples of 8,
    a gram whose m is of 16 and n of 8."""
    what = form("f32", m, n, k, ta, tb)
    if what == "rows":
        return k % 8 == 0 and n % 8 == 0
    return what == "gram" and m % 16 == 0 and n % 8 == 0


def _stride(w: int, mod: int) -> int:
    """The floats between two lines of ``w`` in shared memory for the tensor cores'
    fragments: ``mod`` more than a multiple of 32 (4: a fragment of A, whose lanes read 8
    lines at 4 places each; 8: one of B, 4 lines at 8 places: no two in one bank)."""
    return w + (mod - w) % 32


TF32_ROWS = 64  # a TF32 rows function's rows of A a tile: a warp's 16 each


def rows_tf32_threads(m: int) -> int:
    """The threads a TF32 rows product asks for: a block a tile of rows."""
    return -(-m // TF32_ROWS) * MAX_THREADS


def rows_tf32_lines(
    s, a: str, b: str, c: str, store: tuple[str, str, str] | None = None, chain=None
) -> list[str]:
    """``rows_lines``'s product with TF32 operands (``tf32_form``): a block a tile of
    ``TF32_ROWS`` rows of A at a time, each warp 16 of them by all of op(B)'s columns,
    ``mma.sync`` over k 8 at a time (``tl_mma_tf32``: each operand rounded to TF32 as it
    leaves shared memory, ``tl_tf32``; float32 sums), then the tile through shared memory
    and stored a row's columns together (``store``: an epilogue's, as ``rows_lines``).
    With other than 128 threads a block (the emulation's default) each element is summed
    by one thread over k in order, as the tensor cores' path sums it on the emulation.
    With ``chain`` (as ``rows_lines``'): the chain's rows, its copy of op(B)
    (``rows_chain_head(..., tf32=True)``) and its pool for the tiles (``rows_tile``)."""
    m, n, k = s.m, s.n, s.k
    bm, nt = TF32_ROWS, n // 8
    ka, nb, cs = _stride(k, 4), _stride(n, 8), n + 4
    rows, col, value = store if store is not None else ("(void)r;", "tl_col", "tl_v")
    tile = [f"__shared__ float tl_as[{bm * max(ka, cs)}];  // A's tile, rows {ka} apart; then C's"]
    if chain is not None:
        tile = ["float *tl_as = (float *)tl_sm4;  // A's tile, then C's (the chain's pool)"]
    return [
        *_rows_head(
            s, a, b, c, bm, nb, tile, lambda o, i: f"tl_as[({o}) * {ka} + {i}]", chain=chain
        ),
        "    const int tl_w = threadIdx.x / 32, tl_g = threadIdx.x % 32 / 4, tl_t = threadIdx.x % 4;",
        f"    if (blockDim.x == {MAX_THREADS}) {{",
        f"      float tl_d[{nt}][4] = {{}};",
        f"      const float *tl_a0 = tl_as + (tl_w * 16 + tl_g) * {ka} + tl_t;",
        "#pragma unroll 2",
        f"      for (int kk = 0; kk < {k}; kk += 8) {{",
        "        unsigned tl_a[4], tl_b[2];",
        f"        tl_a[0] = tl_tf32(tl_a0[kk]), tl_a[1] = tl_tf32(tl_a0[kk + {8 * ka}]);",
        f"        tl_a[2] = tl_tf32(tl_a0[kk + 4]), tl_a[3] = tl_tf32(tl_a0[kk + {8 * ka + 4}]);",
        "#pragma unroll",
        f"        for (int j = 0; j < {nt}; j++) {{",
        f"          tl_b[0] = tl_tf32(tl_bs[(kk + tl_t) * {nb} + j * 8 + tl_g]);",
        f"          tl_b[1] = tl_tf32(tl_bs[(kk + tl_t + 4) * {nb} + j * 8 + tl_g]);",
        "          tl_mma_tf32(tl_d[j], tl_a, tl_b);",
        "        }",
        "      }",
        "      __syncthreads();  // (A's tile read: C's in its place)",
        f"      float *tl_c0 = tl_as + (tl_w * 16 + tl_g) * {cs} + 2 * tl_t;",
        "#pragma unroll",
        f"      for (int j = 0; j < {nt}; j++) {{",
        "        tl_c0[j * 8] = tl_d[j][0], tl_c0[j * 8 + 1] = tl_d[j][1];",
        f"        tl_c0[{8 * cs} + j * 8] = tl_d[j][2], tl_c0[{8 * cs} + j * 8 + 1] = tl_d[j][3];",
        "      }",
        "      __syncthreads();",
        # (the epilogue's loads of 8 elements out before their stores: _epilogue's reason)
        f"      for (int e0 = threadIdx.x; e0 < {bm * n}; e0 += {8 * MAX_THREADS}) {{",
        "        float tl_o[8];",
        "#pragma unroll",
        "        for (int u = 0; u < 8; u++) {",
        f"          const int e = e0 + u * {MAX_THREADS};",
        f"          const long long r = r0 + e / {n};",
        f"          if (e >= {bm * n} || r >= {m}LL) break;",
        f"          {rows}",
        f"          const long long {col} = e % {n};  (void){col};",
        f"          const float tl_v = tl_as[e / {n} * {cs} + e % {n}];",
        f"          tl_o[u] = {value};",
        "        }",
        "#pragma unroll",
        "        for (int u = 0; u < 8; u++) {",
        f"          const int e = e0 + u * {MAX_THREADS};",
        f"          const long long r = r0 + e / {n};",
        f"          if (e >= {bm * n} || r >= {m}LL) break;",
        f"          C[r * {s.ldc} + e % {n}] = tl_o[u];",
        "        }",
        "      }",
        "    } else {  // (each element over k in order, as the emulation's tensor cores sum)",
        f"      for (int e = threadIdx.x; e < {bm * n}; e += blockDim.x) {{",
        f"        const long long r = r0 + e / {n};",
        f"        if (r >= {m}LL) break;",
        "        float tl_v = 0.0f;",
        f"        for (int kk = 0; kk < {k}; kk++)",
        (
            f"          tl_v = fmaf(tl_tf32_value(tl_as[e / {n} * {ka} + kk]),"
            f" tl_tf32_value(tl_bs[kk * {nb} + e % {n}]), tl_v);"
        ),
        f"        {rows}",
        f"        const long long {col} = e % {n};  (void){col};",
        f"        C[r * {s.ldc} + e % {n}] = {value};",
        "      }",
        "    }",
        "  }",
        "}",
    ]


def gram_part_tf32_lines(
    s, a: str, b: str, copies: str, c: str, sums: str | None = None, final=(), chain=False
) -> list[str]:
    """``gram_part_lines``'s copies with TF32 operands (``tf32_form``): each stage's rows
    of A and B in shared memory (lines apart so that no two lanes of a fragment read one
    bank, ``_stride``; the next stage's loads issued before this one's compute, ``_stages``),
    warp w the 16 rows of C from 16 w (of every 16 w-th: all warps run alike, those past
    C's rows storing nothing), by all of its columns, ``mma.sync`` over the stage's rows 8
    at a time (``_gram_mma``); B's column sums (float64) each stage's rows in order into the
    copy's. With other than 128 threads a block each element of the copy is summed by one
    thread over the rows in order (into the copy's memory), as the tensor cores' path sums
    it on the emulation. A merged gram's copies added as ``gram_part_lines`` adds them. In
    a chain (``chain``, as ``gram_part_lines``'): the rows ``tl_rb ..< tl_re`` of copy
    ``tl_p``'s chunk alone, ``CHAIN_STAGE`` rows at a time in the chain's pool, added into
    the copy (stored into it at the chunk's first rows, ``tl_first``)."""
    m, n = s.m, s.n
    sr = CHAIN_STAGE if chain else STAGE_ROWS
    ms, ns = _stride(m, 8), _stride(n, 8)
    last = merged(m, n, s.k) and not chain
    stage = [
        f"  __shared__ float tl_ga[{sr * ms}];  // a stage's rows of A: a row's m, {ms} apart",
        f"  __shared__ float tl_gb[{sr * ns}];  // and of B: a row's n, {ns} apart",
    ]
    if chain:
        stage = [
            f"  float *tl_ga = (float *)tl_sm4;  // a stage's rows of A: a row's m, {ms} apart",
            f"  float *tl_gb = tl_ga + {sr * ms};  // and of B: a row's n, {ns} apart",
        ]
    return [
        "{",
        f"  const float *A = {a};",
        f"  const float *B = {b};",
        *_copies(s, copies, c, sums),
        *(["  __shared__ int tl_last;  // (a ticket's: _merged_sums)"] if last else []),
        *stage,
        *_gram_tf32_copies(
            s,
            sr,
            sums is not None,
            [
                f"        if (blockDim.x == {MAX_THREADS}) {{",
                *_indented(_gram_mma(m, n, sr), "          "),
                "        } else {",
                *_indented(_gram_loops(s, sr), "          "),
                "        }",
                *_indented(_column_sums(n, sr) if sums is not None else [], "        "),
            ],
            _merged_sums(s, c, sums, list(final)) if last else [],
            chain,
        ),
        "}",
    ]


def _gram_tf32_copies(
    s, sr: int, sums: bool, compute: list[str], after=(), chain: bool = False
) -> list[str]:
    """A TF32 gram's loop over its copies (``gram_part_tf32_lines``, ``joint_tf32_lines``):
    each copy's chunk of rows (as the float32 gram's) a stage of ``sr`` rows at a time into
    ``tl_ga`` and ``tl_gb`` (``_stages``), then ``compute`` on it (lines at the stage's
    depth); the copy's ``tl_d`` (``_gram_mma``'s) stored after its last stage, then the
    lines ``after`` (at the loop's depth). Lines at depth 1. In a chain (``chain``): copy
    ``tl_p``'s rows ``tl_rb ..< tl_re`` alone, added into the copy but at the chunk's first
    rows (``tl_first``: the copy and its sums stored, zeros first where they are summed in
    their memory)."""
    m, n, k = s.m, s.n, s.k
    p = parts(k)
    chunk = -(-k // p // STAGE_ROWS) * STAGE_ROWS  # (whole stages of the float32 gram's)
    ld = s.ldc if p == 1 else n
    ms, ns, nt, mt = _stride(m, 8), _stride(n, 8), n // 8, m // 16
    loop = [
        f"  for (long long p = blockIdx.x; p < {p}; p += gridDim.x) {{",
        f"    const long long lo = p * {chunk}, hi = lo + {chunk} < {k}LL ? lo + {chunk} : {k}LL;",
    ]
    first, zeros, zero = "", f"blockDim.x != {MAX_THREADS}", f"tl_pd[p * {n} + j] = 0.0;"
    stores = [
        "        tl_c0[j * 8] = tl_d[j][0], tl_c0[j * 8 + 1] = tl_d[j][1];",
        f"        tl_c0[{8 * ld} + j * 8] = tl_d[j][2], tl_c0[{8 * ld} + j * 8 + 1] = tl_d[j][3];",
    ]
    if chain:
        loop = ["  {", "    const long long p = tl_p, lo = tl_rb, hi = tl_re;"]
        first, zeros = "if (tl_first) ", f"{zeros} && tl_first"
        places = ("tl_c0[j * 8]", "tl_c0[j * 8 + 1]", f"tl_c0[{8 * ld} + j * 8]")
        places += (f"tl_c0[{8 * ld} + j * 8 + 1]",)
        stores = [
            f"        {at} = tl_first ? tl_d[j][{q}] : {at} + tl_d[j][{q}];"
            for q, at in enumerate(places)
        ]
    return [
        "  const int tl_w = threadIdx.x / 32, tl_g = threadIdx.x % 32 / 4, tl_t = threadIdx.x % 4;",
        f"  const int tl_mi = tl_w % {mt};  // (this warp's 16 rows of C)",
        *loop,
        f"    float tl_d[{nt}][4] = {{}};",
        f"    if ({zeros}) {{  // (the copy summed in its memory)",
        "      __syncthreads();  // (the copy before read)",
        f"      for (int e = threadIdx.x; e < {m * n}; e += blockDim.x)",
        f"        tl_pp[p * {m * n} + e / {n} * {ld} + e % {n}] = 0.0f;",
        "    }",
        *([f"    {first}for (int j = threadIdx.x; j < {n}; j += blockDim.x) {zero}"] * sums),
        *_stages(
            (s.ta, "A", s.lda, m, sr, "0", ms, "tl_ga"),
            (not s.tb, "B", s.ldb, n, sr, "0", ns, "tl_gb"),
            compute,
        ),
        f"    if (blockDim.x == {MAX_THREADS} && tl_w < {mt}) {{",
        f"      float *tl_c0 = tl_pp + p * {m * n} + (tl_mi * 16 + tl_g) * {ld} + 2 * tl_t;",
        "#pragma unroll",
        f"      for (int j = 0; j < {nt}; j++) {{",
        *stores,
        "      }",
        "    }",
        *after,
        "  }",
    ]


def _gram_mma(m: int, n: int, sr: int) -> list[str]:
    """A TF32 gram's stage on the tensor cores (lines from depth 0): warp w's 16 rows of C
    (``tl_mi``'s) by all n columns, ``mma.sync`` over the stage's ``sr`` rows 8 at a time,
    into ``tl_d``; A's rows in ``tl_ga`` and B's in ``tl_gb`` (``_stride`` apart)."""
    ms, ns, nt = _stride(m, 8), _stride(n, 8), n // 8
    return [
        f"const float *tl_a0 = tl_ga + tl_t * {ms} + tl_mi * 16 + tl_g;",
        f"const float *tl_b0 = tl_gb + tl_t * {ns} + tl_g;",
        "#pragma unroll 2",
        f"for (int kk = 0; kk < {sr}; kk += 8) {{",
        "  unsigned tl_a[4], tl_b[2];",
        f"  tl_a[0] = tl_tf32(tl_a0[kk * {ms}]), tl_a[1] = tl_tf32(tl_a0[kk * {ms} + 8]);",
        f"  tl_a[2] = tl_tf32(tl_a0[(kk + 4) * {ms}]);",
        f"  tl_a[3] = tl_tf32(tl_a0[(kk + 4) * {ms} + 8]);",
        "#pragma unroll",
        f"  for (int j = 0; j < {nt}; j++) {{",
        f"    tl_b[0] = tl_tf32(tl_b0[kk * {ns} + j * 8]);",
        f"    tl_b[1] = tl_tf32(tl_b0[(kk + 4) * {ns} + j * 8]);",
        "    tl_mma_tf32(tl_d[j], tl_a, tl_b);",
        "  }",
        "}",
    ]


def _gram_loops(s, sr: int) -> list[str]:
    """``_gram_mma``'s stage with other than 128 threads a block (lines from depth 0): each
    element of the copy (in its memory) its stage's ``sr`` products added in order, as the
    emulation's tensor cores add them."""
    m, n = s.m, s.n
    ld = s.ldc if parts(s.k) == 1 else n
    ms, ns = _stride(m, 8), _stride(n, 8)
    return [
        f"for (int e = threadIdx.x; e < {m * n}; e += blockDim.x) {{",
        f"  float v = tl_pp[p * {m * n} + e / {n} * {ld} + e % {n}];",
        f"  for (int r = 0; r < {sr}; r++)",
        (
            f"    v = fmaf(tl_tf32_value(tl_ga[r * {ms} + e / {n}]),"
            f" tl_tf32_value(tl_gb[r * {ns} + e % {n}]), v);"
        ),
        f"  tl_pp[p * {m * n} + e / {n} * {ld} + e % {n}] = v;",
        "}",
    ]


def _column_sums(n: int, sr: int) -> list[str]:
    """A TF32 gram's stage's column sums of B (lines from depth 0): each column's ``sr``
    values in ``tl_gb`` added in float64, in order, into the copy's (``tl_pd``)."""
    ns = _stride(n, 8)
    return [
        f"for (int j = threadIdx.x; j < {n}; j += blockDim.x) {{",
        "  double v = 0.0;",
        f"  for (int r = 0; r < {sr}; r++) v += (double)tl_gb[r * {ns} + j];",
        f"  tl_pd[p * {n} + j] += v;",
        "}",
    ]


JOINT_ROWS = 32  # a joint function's stage: the rows of A and B in shared memory at a time


def joint_form(r, g) -> bool:
    """Whether rows product ``r`` and gram ``g`` of the same rows, ``g``'s B being ``r``'s A
    (a layer's ``dh = dz @ W^T`` and its weight's gradient ``x^T @ dz``: the caller checks
    that they read the same memory), have a TF32 function of ours that makes both in one
    pass over the rows (``joint_tf32_lines``): both of TF32 forms (``tf32_form``), and
    ``r``'s n a multiple of 16 (each warp the same tiles of C: the emulation's
    ``mma.sync`` meets the block's threads at a barrier)."""
    return (
        form("f32", r.m, r.n, r.k, r.ta, r.tb) == "rows"
        and form("f32", g.m, g.n, g.k, g.ta, g.tb) == "gram"
        and tf32_form(r.m, r.n, r.k, r.ta, r.tb)
        and tf32_form(g.m, g.n, g.k, g.ta, g.tb)
        and not g.tb
        and (g.k, g.n) == (r.m, r.k)
        and r.n % 16 == 0
        and not merged(g.m, g.n, g.k)  # (the joint's copies are added by the gram's sum)
    )


def joint_tf32_lines(
    r,
    g,
    ga: str,
    b: str,
    w: str,
    c: str,
    copies: str,
    gc: str,
    store: tuple[str, str, str] | None = None,
    sums: str | None = None,
) -> list[str]:
    """The first launch of a rows product ``r`` (``C = B @ op(W)``, ``store`` its epilogue's
    as ``rows_lines``) and a gram ``g`` (``op(A)^T @ B`` summed over the same rows, as
    ``gram_part_tf32_lines``: its copies at ``copies``, or C itself at ``gc``; with
    ``sums``, B's column sums) in one pass over the rows of B (``joint_form``; ``ga``, ``b``,
    ``w``, ``c``: the C expressions of A's, B's, W's and the rows' C's first elements), with
    TF32 operands: each block a copy of the gram's at a time, its chunk of rows (as the
    gram's) a stage of ``JOINT_ROWS`` at a time in shared memory (the next stage's loads
    issued before this one's compute, ``_stages``), on which the gram's warps add their
    ``mma.sync`` products as the gram's do and the rows product's C is made (warp w its 16
    rows from 16 (w % 2), every other tile of 8 columns), put through shared memory in the
    stage's A's place and stored a row's columns together with the epilogue. B's bytes and
    A's are read from the device's memory once, where the two functions read B twice and A
    twice (the epilogue's ``1 - h^2`` reads A's rows when A is the layer's h: this block's
    stage just read them). With other than 128 threads a block each element of either is
    summed by one thread over its terms in order, as the tensor cores' path sums it on the
    emulation: the same bits as the two functions' either way."""
    rows_n, k, m = r.n, r.k, g.m
    sr = JOINT_ROWS
    ms, ns, nb, cs = _stride(m, 8), _stride(k, 8), _stride(rows_n, 8), rows_n + 4
    rt, slabs = rows_n // 8, sr // 16
    per = MAX_THREADS // 32 // slabs  # (the warps of a stage's 16 rows)
    rows, col, value = store if store is not None else ("(void)r;", "tl_col", "tl_v")
    weights = _weights(r, "W", nb)
    rows_mma = [
        f"float tl_e[{rt // per}][4] = {{}};",
        f"const float *tl_r0 = tl_gb + (tl_ri * 16 + tl_g) * {ns} + tl_t;",
        "#pragma unroll 2",
        f"for (int kk = 0; kk < {k}; kk += 8) {{  // (the rows product's)",
        "  unsigned tl_a[4], tl_b[2];",
        f"  tl_a[0] = tl_tf32(tl_r0[kk]), tl_a[1] = tl_tf32(tl_r0[kk + {8 * ns}]);",
        f"  tl_a[2] = tl_tf32(tl_r0[kk + 4]), tl_a[3] = tl_tf32(tl_r0[kk + {8 * ns + 4}]);",
        "#pragma unroll",
        f"  for (int j = 0; j < {rt // per}; j++) {{",
        f"    const int jj = j * {per} + tl_rj;",
        f"    tl_b[0] = tl_tf32(tl_bs[(kk + tl_t) * {nb} + jj * 8 + tl_g]);",
        f"    tl_b[1] = tl_tf32(tl_bs[(kk + tl_t + 4) * {nb} + jj * 8 + tl_g]);",
        "    tl_mma_tf32(tl_e[j], tl_a, tl_b);",
        "  }",
        "}",
        "__syncthreads();  // (the stage's A read: the rows' C in its place)",
        f"float *tl_c0 = tl_ga + (tl_ri * 16 + tl_g) * {cs} + 2 * tl_t;",
        "#pragma unroll",
        f"for (int j = 0; j < {rt // per}; j++) {{",
        f"  const int jj = j * {per} + tl_rj;",
        "  tl_c0[jj * 8] = tl_e[j][0], tl_c0[jj * 8 + 1] = tl_e[j][1];",
        f"  tl_c0[{8 * cs} + jj * 8] = tl_e[j][2], tl_c0[{8 * cs} + jj * 8 + 1] = tl_e[j][3];",
        "}",
    ]
    rows_loops = [
        "__syncthreads();  // (the stage's A read: the rows' C in its place)",
        f"for (int e = threadIdx.x; e < {sr * rows_n}; e += blockDim.x) {{",
        "  float v = 0.0f;",
        f"  for (int kk = 0; kk < {k}; kk++)",
        (
            f"    v = fmaf(tl_tf32_value(tl_gb[e / {rows_n} * {ns} + kk]),"
            f" tl_tf32_value(tl_bs[kk * {nb} + e % {rows_n}]), v);"
        ),
        f"  tl_ga[e / {rows_n} * {cs} + e % {rows_n}] = v;",
        "}",
    ]
    # (the epilogue's loads of 8 elements out before their stores: _epilogue's reason)
    stores = [
        "__syncthreads();  // (the rows' C in shared memory)",
        f"for (int e0 = threadIdx.x; e0 < {sr * rows_n}; e0 += 8 * blockDim.x) {{",
        "  float tl_o[8];",
        "#pragma unroll",
        "  for (int u = 0; u < 8; u++) {",
        "    const int e = e0 + u * blockDim.x;",
        f"    const long long r = r0 + e / {rows_n};",
        f"    if (e >= {sr * rows_n} || r >= hi) break;",
        f"    {rows}",
        f"    const long long {col} = e % {rows_n};  (void){col};",
        f"    const float tl_v = tl_ga[e / {rows_n} * {cs} + e % {rows_n}];",
        f"    tl_o[u] = {value};",
        "  }",
        "#pragma unroll",
        "  for (int u = 0; u < 8; u++) {",
        "    const int e = e0 + u * blockDim.x;",
        f"    const long long r = r0 + e / {rows_n};",
        f"    if (e >= {sr * rows_n} || r >= hi) break;",
        f"    C[r * {r.ldc} + e % {rows_n}] = tl_o[u];",
        "  }",
        "}",
    ]
    compute = [
        f"if (blockDim.x == {MAX_THREADS}) {{",
        *_indented(_gram_mma(m, k, sr) + rows_mma, "  "),
        "} else {",
        *_indented(_gram_loops(g, sr) + rows_loops, "  "),
        "}",
        *(_column_sums(k, sr) if sums is not None else []),
        *stores,
    ]
    return [
        "{",
        f"  const float *A = {ga};",
        f"  const float *B = {b};",
        f"  const float *W = {w};",
        f"  float *C = {c};",
        *_copies(g, copies, gc, sums),
        weights[0],
        f"  __shared__ float tl_ga[{sr * max(ms, cs)}];  // a stage's A: a row's m, {ms} apart; C",
        f"  __shared__ float tl_gb[{sr * ns}];  // and B: a row's k, {ns} apart",
        *weights[1:],
        f"  const int tl_ri = threadIdx.x / 32 % {slabs}, tl_rj = threadIdx.x / 32 / {slabs};",
        *_gram_tf32_copies(g, sr, sums is not None, _indented(compute, "        ")),
        "}",
    ]


def _stage(
    rows_first: bool, x: str, ld: int, w: int, sr: int, at: str, stride=None, buf="tl_sm"
) -> list[str]:
    """The lines that copy the stage's rows of operand ``x`` (``w`` columns of it a row of
    the sum; stored a row of the sum a row of ``x`` where ``rows_first``, else a column)
    into ``buf`` (``tl_sm``) from ``at``, a row after another, ``stride`` floats apart (``w``);
    zeros past the chunk's rows. The threads take consecutive elements of ``x``'s memory."""
    src, dst, line_ok, inner_ok = _stage_args(rows_first, x, ld, w, sr, at, stride, buf)
    return _copy(src, dst, line_ok, inner_ok, indent="        ")


def _stage_args(
    rows_first: bool, x: str, ld: int, w: int, sr: int, at: str, stride=None, buf="tl_sm"
) -> tuple:
    """``_copy``'s arguments for ``_stage``: the lines, the destination, the conditions."""
    stride = w if stride is None else stride
    if rows_first:  # (lines: the stage's rows, w elements each)
        return (
            Lines(sr, w, lambda o: f"{x} + (r0 + {o}) * {ld}", ld),
            lambda o, i: f"{buf}[{at} + ({o}) * {stride} + {i}]",
            lambda o: f"r0 + {o} < hi",
            lambda i: "1",
        )
    return (  # (lines: the columns, sr rows each)
        Lines(w, sr, lambda o: f"{x} + ({o}) * {ld} + r0", ld),
        lambda o, i: f"{buf}[{at} + ({i}) * {stride} + {o}]",
        lambda o: "1",
        lambda i: f"r0 + {i} < hi",
    )


@dataclass(frozen=True)
class Lines:
    """What ``_copy`` copies: ``count`` lines of ``width`` consecutive floats, line ``o``
    from ``start(o)`` (a C pointer expression), lines ``ld`` floats apart."""

    count: int
    width: int
    start: Callable[[str], str]
    ld: int


def _copy(
    src: Lines,
    dst,
    line_ok=lambda o: "1",
    inner_ok=lambda i: "1",
    indent: str = "",
    dst4=None,
) -> list[str]:
    """The lines that set ``dst(o, i)`` (a C lvalue) to element ``i`` of line ``o`` of
    ``src`` where ``line_ok(o)`` and ``inner_ok(i)`` hold, else 0, the block's threads
    taking consecutive elements. With the GPU's blocks (``MAX_THREADS``) each thread issues
    ``COPY_BATCH`` loads before it stores the first (in the SASS of sm_90 a loop over the
    elements had each load wait for the one before it, even unrolled: 32 round trips to
    the device's memory a tile; all 32 at once took 255 registers a thread), 16 bytes each
    where the lines' starts are (``float4``: four times the bytes in flight a thread, where
    a block's copies were a quarter of what keeps the memory busy); with ``dst4`` (the
    ``float4`` lvalue of ``dst(o, i)`` to ``dst(o, i + 3)``, 16 bytes aligned where ``i`` is
    a multiple of 4), stored 16 bytes at a time too."""
    w, total = src.width, src.count * src.width
    turns = -(-total // MAX_THREADS)
    batch = min(turns, COPY_BATCH)
    q_oi = f"const int o = q / {w}, i = q % {w};"
    lines = []
    if w % 4 == 0:
        turns4 = -(-total // 4 // MAX_THREADS)
        batch4 = min(turns4, COPY_BATCH)
        load, store = _vector_bodies(src, dst, line_ok, inner_ok, "tl_v", "u0 + u", dst4)
        lines += [
            f"if (blockDim.x == {MAX_THREADS} && {_aligned(src)}) {{",
            "#pragma unroll 1",
            f"  for (int u0 = 0; u0 < {turns4}; u0 += {batch4}) {{",
            f"    float4 tl_v[{batch4}];",
            "#pragma unroll",
            f"    for (int u = 0; u < {batch4}; u++) {{",
            *("      " + x for x in load),
            "    }",
            "#pragma unroll",
            f"    for (int u = 0; u < {batch4}; u++) {{",
            *("      " + x for x in store),
            "    }",
            "  }",
            "} else ",
        ]
    ok = f"{line_ok('o')} && {inner_ok('i')}"
    lines += [
        f"if (blockDim.x == {MAX_THREADS}) {{",
        "#pragma unroll 1",
        f"  for (int u0 = 0; u0 < {turns}; u0 += {batch}) {{",
        f"    float tl_v[{batch}];",
        "#pragma unroll",
        f"    for (int u = 0; u < {batch}; u++) {{",
        f"      const int q = threadIdx.x + (u0 + u) * {MAX_THREADS};",
        f"      {q_oi}",
        f"      tl_v[u] = q < {total} && {ok} ? ({src.start('o')})[i] : 0.0f;",
        "    }",
        "#pragma unroll",
        f"    for (int u = 0; u < {batch}; u++) {{",
        f"      const int q = threadIdx.x + (u0 + u) * {MAX_THREADS};",
        f"      {q_oi}",
        f"      if (q < {total}) {dst('o', 'i')} = tl_v[u];",
        "    }",
        "  }",
        "} else {",
        f"  for (int q = threadIdx.x; q < {total}; q += blockDim.x) {{",
        f"    {q_oi}",
        f"    {dst('o', 'i')} = {ok} ? ({src.start('o')})[i] : 0.0f;",
        "  }",
        "}",
    ]
    if w % 4 == 0:  # (the else of the first if joined to the second)
        at = lines.index("} else ")
        lines[at : at + 2] = ["} else " + lines[at + 1]]
    block = ["{", *(x if x.startswith("#") else "  " + x for x in lines), "}"]
    return [x if x.startswith("#") else indent + x for x in block]


def _aligned(src: Lines) -> str:
    """The C condition that every line of ``src`` starts 16 bytes aligned."""
    return f"(((unsigned long long)({src.start('0')}) | {4 * src.ld}ULL) & 15) == 0"


def _vector_bodies(src: Lines, dst, line_ok, inner_ok, var: str, turn: str, dst4=None):
    """The body of the loop that loads a thread's ``turn``-th 16 bytes of ``src`` into
    ``var[u]`` (zeros where ``line_ok``/``inner_ok`` do not hold; elementwise where only
    some of the four do), and of the loop that stores them (``_copy``'s)."""
    w, total4 = src.width, src.count * src.width // 4
    where = [
        f"const int q = threadIdx.x + ({turn}) * {MAX_THREADS};",
        f"const int o = q / {w // 4}, i = q % {w // 4} * 4;",
    ]
    part = " ".join(
        f"if ({inner_ok(f'i + {e}')}) tl_w.{f} = tl_s[{e}];" for e, f in enumerate("xyz")
    )
    partial = [] if inner_ok("i") == "1" else [f"else {{ {part} }}"]
    stores = " ".join(f"{dst('o', f'i + {e}')} = {var}[u].{f};" for e, f in enumerate("xyzw"))
    if dst4 is not None:
        stores = f"{dst4('o', 'i')} = {var}[u];"
    load = [
        *where,
        "float4 tl_w = {0.0f, 0.0f, 0.0f, 0.0f};",
        f"if (q < {total4} && {line_ok('o')}) {{",
        f"  const float *tl_s = {src.start('o')} + i;",
        f"  if ({inner_ok('i + 3')}) tl_w = *(const float4 *)tl_s;",
        *("  " + x for x in partial),
        "}",
        f"{var}[u] = tl_w;",
    ]
    return load, [*where, f"if (q < {total4}) {{ {stores} }}"]


def _stage_pair(a: tuple, b: tuple, indent: str) -> list[str]:
    """A stage's copies of two operands (``_stage``'s arguments each): where both are
    aligned and each is one batch of 16-byte loads a thread, every load of both issued
    before the first store (one round trip to memory a stage, where the two copies one
    after another were two); else one copy after the other."""
    separate = [*_stage(*a), *_stage(*b)]
    pair = _pair_batches(a, b)
    if pair is None:
        return separate
    aligned, decls, loads, stores = pair
    lines = [
        f"if (blockDim.x == {MAX_THREADS} && {aligned}) {{",
        *_indented(decls + loads + stores, "  "),
        "} else {",
    ]
    return _indented(lines, indent) + separate + [indent + "}"]


def _pair_batches(a: tuple, b: tuple) -> tuple | None:
    """A stage's copies of two operands (``_stage``'s arguments each) as one batch of
    16-byte loads a thread each: ``(the C condition that both are aligned, the registers'
    declarations, the loads of both, the stores of both)`` (lines from depth 0), or None
    where either is not one such batch (``_stage_pair``, ``_stages``)."""
    both = [_stage_args(*x) for x in (a, b)]
    turns = [-(-src.count * src.width // 4 // MAX_THREADS) for src, *_ in both]
    if any(src.width % 4 for src, *_ in both) or max(turns) > COPY_BATCH:
        return None
    aligned = " && ".join(_aligned(src) for src, *_ in both)
    decls, loads, stores = [], [], []
    for j, ((src, dst, line_ok, inner_ok), n) in enumerate(zip(both, turns)):
        var = f"tl_v{j}"
        load, store = _vector_bodies(src, dst, line_ok, inner_ok, var, "u")
        decls.append(f"float4 {var}[{n}];")
        for out, body in ((loads, load), (stores, store)):
            out += ["#pragma unroll", f"for (int u = 0; u < {n}; u++) {{"]
            out += ["  " + x for x in body] + ["}"]
    return aligned, decls, loads, stores


def _indented(lines: list[str], indent: str) -> list[str]:
    """``lines`` with ``indent`` before each but the pragmas (which start a line)."""
    return [x if x.startswith("#") else indent + x for x in lines]


def _stages(a: tuple, b: tuple, compute: list[str]) -> list[str]:
    """A gram's loop over its chunk's stages (``r0`` from ``lo`` to ``hi``): each stage's
    rows of the two operands (``_stage``'s arguments each) into shared memory, then
    ``compute`` (lines at the loop body's depth) on them. Where both are aligned and each
    is one batch of 16-byte loads a thread (``_stage_pair``), the next stage's loads are
    issued into registers before this stage's compute and stored after it: the compute
    waits for memory once a chunk, where it waited once a stage (about 2 blocks an SM:
    nothing else there to run meanwhile); else one stage after another."""
    plain = [
        f"      for (long long r0 = lo; r0 < hi; r0 += {a[4]}) {{",
        "        __syncthreads();",
        *_stage_pair(a, b, "        "),
        "        __syncthreads();",
        *compute,
        "      }",
    ]
    pair = _pair_batches(a, b)
    if pair is None:
        return plain
    sr = a[4]
    aligned, decls, loads, stores = pair
    at = _indented
    return [
        "      bool tl_fast;  // (every stage's rows aligned as the first's: 64 rows apart)",
        "      {",
        "        const long long r0 = lo;",
        f"        tl_fast = blockDim.x == {MAX_THREADS} && {aligned};",
        "      }",
        "      if (tl_fast) {",
        *at(decls, "        "),
        "        if (lo < hi) {  // (the first stage's loads)",
        "          const long long r0 = lo;",
        *at(loads, "          "),
        "        }",
        f"        for (long long r0 = lo; r0 < hi; r0 += {sr}) {{",
        "          __syncthreads();  // (the stage before read)",
        *at(stores, "          "),
        "          __syncthreads();",
        f"          if (r0 + {sr} < hi) {{  // (the next stage's loads, in flight meanwhile)",
        f"            const long long tl_next = r0 + {sr};",
        "            {",
        "              const long long r0 = tl_next;",
        *at(loads, "              "),
        "            }",
        "          }",
        *at(compute, "  "),
        "        }",
        "      } else {",
        *at(plain, "  "),
        "      }",
    ]


def lanes(m: int, n: int, k: int) -> int:
    """The threads that add each element's copies in a gram's second launch (a power of
    two, at most the copies)."""
    want = max(1, min(MAX_LANES, parts(k), 32768 // (m * n)))
    return 1 << (want.bit_length() - 1)


def gram_sum_threads(m: int, n: int, k: int) -> int:
    return m * n * lanes(m, n, k)


def gram_sum_lines(s, c: str, copies: str, sums: str | None = None) -> list[str]:
    """The second launch of gram ``s``: each element of C the sum of its copies, in a fixed
    order: ``lanes`` threads an element (where the block's threads divide into them), each
    every lanes-th copy, then the lanes in order; with ``sums``, each of B's column sums
    likewise, in float64."""
    m, n, k = s.m, s.n, s.k
    p, ln = parts(k), lanes(m, n, k)
    out = [
        "{",
        f"  float *C = {c};",
        *_copies(s, copies, c, sums),
        f"  const int lanes = blockDim.x % {ln} == 0 ? {ln} : 1, per = blockDim.x / lanes;",
    ]
    out += _lanes_sum("float", m * n, p, "tl_pp", f"C[e / {n} * {s.ldc} + e % {n}]")
    if sums is not None:
        out += _lanes_sum("double", n, p, "tl_pd", f"({sums})[e]")
    return out + ["}"]


def _lanes_sum(t: str, count: int, p: int, copies: str, dst: str) -> list[str]:
    """The lines that set ``dst`` (over ``e``) to the sum of element ``e``'s ``p`` copies of
    ``count`` (``copies[c * count + e]``), in ``t``: ``lanes`` threads an element, each
    every lanes-th copy, then the lanes in order."""
    red = f"tl_red_{t}"
    return [
        "  {",
        f"    __shared__ {t} {red}[{MAX_THREADS}];",
        (
            f"    for (long long e0 = (long long)blockIdx.x * per; e0 < {count}LL;"
            " e0 += (long long)gridDim.x * per) {"
        ),
        "      const long long e = e0 + threadIdx.x % per;",
        "      const int lane = threadIdx.x / per;",
        f"      {t} v = 0;",
        f"      if (e < {count}LL)",
        "#pragma unroll 8",
        f"        for (long long c = lane; c < {p}; c += lanes) v += {copies}[c * {count} + e];",
        f"      {red}[threadIdx.x] = v;",
        "      __syncthreads();",
        f"      if (lane == 0 && e < {count}LL) {{",
        f"        {t} total = 0;",
        f"        for (int l = 0; l < lanes; l++) total += {red}[threadIdx.x + l * per];",
        f"        {dst} = total;",
        "      }",
        "      __syncthreads();",
        "    }",
        "  }",
    ]


def standalone(
    s,
    name: str,
    offsets=(0, 0, 0),
    sums: bool = False,
    epilogue: str | None = None,
    tf32: bool = False,
) -> list[tuple[str, str]]:
    """Gemm ``s``'s functions of ours as functions of a module of their own (a benchmark's
    or a test's; the caller adds the emulation's entries): A, B and C at the table's entries
    0, 1 and 2, from elements ``offsets``; a gram's copies at the scratch memory
    (``scratch_bytes``); with ``sums``, B's column sums (float64) at entry 3; a rows
    product's C with ``epilogue`` stored instead (a C expression of the product's value
    ``tl_v`` and the column ``tl_col``: ``rows_lines``); with ``tf32``, the TF32 functions
    (``tf32_form``). Each ``(name, text)``, named ``name`` and its launch's first letter
    (``launches``)."""
    oa, ob, oc = offsets
    a, b = f"(const float *)table[0] + {oa}", f"(const float *)table[1] + {ob}"
    c, copies = f"(float *)table[2] + {oc}", "scratch"
    d = "(double *)table[3]" if sums else None
    out = []
    for kind in launches(s.m, s.n, s.k, s.ta, s.tb):
        if kind == "rows":
            store = None if epilogue is None else ("(void)r;", "tl_col", epilogue)
            lines = (rows_tf32_lines if tf32 else rows_lines)(s, a, b, c, store)
        elif kind == "part":
            lines = (gram_part_tf32_lines if tf32 else gram_part_lines)(s, a, b, copies, c, d)
        else:
            lines = gram_sum_lines(s, c, copies, d)
        out.append(_function(f"{name}{kind[0]}", lines))
    return out


def _function(fname: str, lines: list[str]) -> tuple[str, str]:
    """``(fname, text)``: the lines (``rows_lines``'s and the others') as a function of a
    module of their own, as the renderer's functions are called (``standalone``)."""
    body = "\n".join(x if x.startswith("#") else "  " + x for x in lines)
    head = (
        f'extern "C" __global__ void {fname}(void **table, const tl_args args_in, '
        "char *scratch, int *err, const long long *shift) {"
    )
    return fname, f"{head}\n{body}\n}}\n"


def joint_standalone(
    r, g, name: str, offsets=(0, 0, 0, 0, 0), sums: bool = False, epilogue: str | None = None
) -> list[tuple[str, str]]:
    """A joint function (``joint_tf32_lines``: rows product ``r``, ``C = B @ op(W)``, and
    gram ``g``, ``op(A)^T @ B``) and the gram's sum of copies (where it has more than one)
    as functions of a module of their own (a test's or a benchmark's; the caller adds the
    emulation's entries): A, B, W, the rows' C and the gram's at the table's entries 0 to
    4, from elements ``offsets``; the copies at the scratch memory (``scratch_bytes`` of
    ``g``); with ``sums``, B's column sums (float64) at entry 5; the rows' C with
    ``epilogue`` stored instead (as ``standalone``'s). Named ``name`` and ``j``, ``s``."""
    oa, ob, ow, oc, og = offsets
    a, b = f"(const float *)table[0] + {oa}", f"(const float *)table[1] + {ob}"
    w, c, gc = (
        f"(const float *)table[2] + {ow}",
        f"(float *)table[3] + {oc}",
        f"(float *)table[4] + {og}",
    )
    d = "(double *)table[5]" if sums else None
    store = None if epilogue is None else ("(void)r;", "tl_col", epilogue)
    texts = [("j", joint_tf32_lines(r, g, a, b, w, c, "scratch", gc, store, d))]
    if parts(g.k) > 1:
        texts.append(("s", gram_sum_lines(g, gc, "scratch", d)))
    return [_function(f"{name}{suffix}", lines) for suffix, lines in texts]
