"""Beam selection of a draft tree level: the best `width` children by cumulative draft log-probability.

Kernel card
-----------
What: one level of LongSpec's dynamic beam search (§3.3; `tree.grow_tree`). Given the draft's logits for the n
    nodes of a level and each node's cumulative log-probability, return the `width` best (node, column) pairs by

        score[r, c] = parent_scores[r] + log_softmax(logits[r] + bias)[c]

    in descending order, ties to the smaller (r, c) in row-major order. The result feeds the next level's nodes:
    their scores, parents (row r) and tokens (column c, or the draft vocabulary's id of slot c).
Layout: logits (n, V) float16, bfloat16 or float32, last dim contiguous (the LM head's output, not yet cast);
    parent_scores (n,) fp32; bias (V,) fp32 or None (a draft vocabulary's 0 / -inf padding slots). Returns scores
    (width,) fp32, rows (width,) int64 in [0, n), columns (width,) int64 in [0, V).
Why a kernel: at each level the torch form runs a cast, a bias add, a log-softmax, a top-k per row (multi-block
    radix select over 16 x 36,864 columns), and a second top-k with a sort over the n·width survivors: ~10
    launches and ~45 µs per level on an H200, five levels per step. The kernel reads the logits once and launches
    three small programs per level.
Algorithm: three launches, all fp32 math.
    1. `_slice_top_kernel`, grid (n, S): one program per row and slice of BLOCK columns. It computes the slice's
       max m and Σ exp(x - m), and its `width` best columns by `width` rounds of a max over ordering keys. A key
       is one int64 per column: the float's bits mapped to a signed int that orders like the float (high 32 bits)
       and 2³¹ - 1 - column (low 32 bits), so keys are distinct, the max is unique and a tie goes to the smaller
       column; a taken key is replaced by the int64 minimum, below every real key (even -inf logits).
    2. `_row_top_kernel`, grid (n,): the row's LSE from the slices' (m, Σ) (the max-shifted merge of
       `lse_merge.py`), then the row's `width` best keys among its S·width survivors; their logits are re-read,
       so a score is parent + (x + bias) - lse computed once, not decoded from a key.
    3. `_beam_top_kernel`, grid (1,): the `width` best of the n·width row winners, keyed by score and by flat
       index row·width + rank (so ties keep the row-major order).
    The best `width` of the level are among the per-row best `width`, which are among the per-slice best `width`:
    the same set as a top-k over all n·V scores.
Departures from `beam_select_ref`: the LSE sums per slice then merges (summation order), so scores may differ from
    torch's log_softmax by float rounding (~1e-6 relative); selection and ties follow the ref's rule exactly on the
    kernel's own scores. The torch path (`kernel=False`, the CPU default) keeps torch.topk's tie order, which torch
    does not specify.
Sizes: any n ≥ 1 (programs hold BLOCK_C ≥ S·width keys of a row, and n·width scores in the last program: meant for
    tree levels of up to ~64 nodes), n · V < 2³¹, 1 ≤ width ≤ 64 (compile-time: one compiled kernel per width; a
    wider level takes the torch path).
    BLOCK = max(1,024, V / 32 rounded up to a power of two).
Launch: through `torch.library.triton_op` ("transformers_longspec::beam_select") with `wrap_triton`, so CUDA graphs
    and torch.compile take it; interpreted kernels (TRITON_INTERPRET=1) are launched directly.
Devices: CUDA GPUs; CPU tensors only under TRITON_INTERPRET=1 (slow; for CI).
Tested: CPU under TRITON_INTERPRET=1 (triton 3.6, torch 2.13): fp32/bf16/fp16 logits, with and without a padding
    bias, one to 17 rows, widths 1 to 16, V below, at and above one slice, ties inside a row and across rows,
    -inf logits and levels with fewer finite scores than `width`; trees grown with it equal the torch path's.
    NVIDIA H200 (triton 3.6, torch 2.11): bf16 logits at V = 36,864 (with the padding bias) and 151,936, 1 / 4 / 16
    rows, eager and replayed from a CUDA graph (`-m gpu`, session 12).
Speed (H200, Qwen2.5-1.5B's shape at 16k, tree [4,16,16,16,16], `benchmarks/kernel_profile.py`): the draft phase
    0.99 ms per step against 1.20 ms with the torch path; `_slice_top_kernel` ~9 µs per level.
"""

import operator

import torch
from torch.library import triton_op, wrap_triton

from ._triton_utils import is_interpreted, require_triton, tl, triton, triton_available

MAX_WIDTH = 64
# Inside the kernels (Triton reads no plain globals): -9223372036854775808, the int64 minimum, marks a taken or
# missing key (below every column's key, even a -inf logit's); 0x7FFFFFFF - index is a key's low half.


def _check_inputs(logits, parent_scores, width, bias, *, caller: str) -> int:
    """Raise TypeError / ValueError naming the bad argument and the fix; return `width` as a Python int."""
    original_width = width
    if not isinstance(logits, torch.Tensor) or not isinstance(parent_scores, torch.Tensor):
        raise TypeError(f"{caller}: `logits` and `parent_scores` must be torch.Tensors.")
    if logits.dim() != 2 or logits.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(
            f"{caller}: `logits` must be (n, V) float16/bfloat16/float32, got {tuple(logits.shape)} {logits.dtype}."
        )
    n, vocab = logits.shape
    if parent_scores.shape != (n,) or parent_scores.dtype != torch.float32:
        raise ValueError(
            f"{caller}: `parent_scores` must be ({n},) float32 (one cumulative log-prob per row), got "
            f"{tuple(parent_scores.shape)} {parent_scores.dtype}."
        )
    if bias is not None and (
        not isinstance(bias, torch.Tensor) or bias.shape != (vocab,) or bias.dtype != torch.float32
    ):
        got = f"{tuple(bias.shape)} {bias.dtype}" if isinstance(bias, torch.Tensor) else type(bias).__name__
        raise ValueError(f"{caller}: `bias` must be None or ({vocab},) float32, got {got}.")
    try:
        width = None if isinstance(width, bool) else operator.index(width)  # numpy / 0-dim tensor ints too
    except TypeError:
        width = None
    if width is None or width < 1:
        raise ValueError(f"{caller}: `width` must be a positive int, got {original_width!r}.")
    if n * min(width, vocab) < width:
        raise ValueError(
            f"{caller}: {n} row(s) of {vocab} columns hold fewer than width={width} candidates; lower "
            "the tree's width at this depth."
        )
    devices = {t.device for t in (logits, parent_scores, bias) if t is not None}
    if len(devices) != 1:
        raise ValueError(f"{caller}: tensors must be on one device, got {sorted(map(str, devices))}.")
    return width


def beam_select(
    logits: torch.Tensor,
    parent_scores: torch.Tensor,
    width: int,
    bias: torch.Tensor | None = None,
    *,
    kernel: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The `width` best children of a draft tree level by cumulative log-probability.

    Args:
        logits: (n, V) float16, bfloat16 or float32: the draft's LM-head output for the level's n nodes.
        parent_scores: (n,) fp32: each node's cumulative draft log-probability.
        width: children to keep, ≥ 1, with n · min(width, V) ≥ width (the kernels: ≤ 64, and n · V < 2³¹).
        bias: optional (V,) fp32 added to the logits first (-inf masks a column).
        kernel: True runs the Triton kernels (CUDA, or CPU under TRITON_INTERPRET=1); False the torch top-k path;
            None (default) the kernels on CUDA when Triton is installed and the level fits them, torch otherwise.
    Returns: (scores (width,) fp32 descending, rows (width,) int64, columns (width,) int64): score = parent_scores[row]
        + log_softmax(logits[row] + bias)[column]. NaN inputs give NaN scores and unspecified picks (not checked:
        a check would read a value back to the host at every level).
    Raises:
        TypeError: if logits or parent_scores is not a tensor.
        ValueError: on a bad shape, dtype, width, `kernel` value or device mix; ImportError for kernel=True without
            Triton.
    Reference: LongSpec §3.3 (dynamic beam search over the draft tree); see the module's kernel card.
    """
    width = _check_inputs(logits, parent_scores, width, bias, caller="beam_select")
    if kernel is not None and not isinstance(kernel, bool):
        raise ValueError(f"beam_select: `kernel` must be True, False or None, got {kernel!r}.")
    if kernel is None:
        kernel = logits.is_cuda and triton_available() and width <= MAX_WIDTH and logits.numel() < 2**31
    if not kernel:
        return _beam_select_torch(logits, parent_scores, width, bias)
    require_triton("beam_select")
    if width > MAX_WIDTH or logits.numel() >= 2**31:
        raise ValueError(
            f"beam_select: the kernels take width ≤ {MAX_WIDTH} and n · V < 2**31 (32-bit indices), got width={width} "
            f"and n · V = {logits.numel()}; pass kernel=False for the torch path."
        )
    if not logits.is_cuda and not is_interpreted(_slice_top_kernel):
        raise ValueError(
            "beam_select: the Triton kernels need CUDA tensors (or TRITON_INTERPRET=1 set before "
            "importing triton); pass kernel=False for the torch path."
        )
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    parent_scores = parent_scores.contiguous()  # the kernels read both with unit stride
    bias = None if bias is None else bias.contiguous()
    return _beam_select_op(logits, parent_scores, bias, width)


def _beam_select_torch(logits, parent_scores, width, bias):
    """Torch path: log-softmax, a top-k per row, then one top-k over the n · width survivors."""
    logits = logits.float() if bias is None else logits.float() + bias
    row_best, row_columns = torch.log_softmax(logits, dim=-1).topk(min(width, logits.shape[-1]), dim=-1)
    best, pick = (parent_scores[:, None] + row_best).flatten().topk(width)
    return best, pick // row_best.shape[1], row_columns.flatten()[pick]


def beam_select_ref(
    logits: torch.Tensor, parent_scores: torch.Tensor, width: int, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Readable twin of `beam_select` (same arguments but `kernel`, same returns and errors): a stable descending sort
    of all n · V scores, so ties go to the smaller (row, column) in row-major order, as in the kernels.

    Reference: LongSpec §3.3.
    """
    width = _check_inputs(logits, parent_scores, width, bias, caller="beam_select_ref")
    logits = logits.float() if bias is None else logits.float() + bias
    scores = (parent_scores[:, None] + torch.log_softmax(logits, dim=-1)).flatten()
    order = torch.sort(scores, descending=True, stable=True).indices[:width]
    vocab = logits.shape[1]
    return scores[order], order // vocab, order % vocab


@triton.jit
def _order_key(x, index):
    """int64 keys that order like (x, -index): the float's bits as an ordered int32 above, 2³¹ - 1 - index below."""
    bits = x.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return (ordered.to(tl.int64) << 32) | (0x7FFFFFFF - index.to(tl.int64))


@triton.jit
def _slice_top_kernel(
    logits_ptr, bias_ptr, keys_ptr, max_ptr, sum_ptr, stride_row, n_cols, n_slices,
    HAS_BIAS: tl.constexpr, WIDTH: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    piece = tl.program_id(1)
    cols = piece * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + cols, mask=ok, other=float("-inf")).to(tl.float32)
    if HAS_BIAS:
        x += tl.load(bias_ptr + cols, mask=ok, other=0.0)
    m = tl.max(x, 0)
    shift = tl.where(m == float("-inf"), 0.0, m)  # an all -inf slice sums to 0, never exp(nan)
    slot = row * n_slices + piece
    tl.store(max_ptr + slot, m)
    tl.store(sum_ptr + slot, tl.sum(tl.exp(x - shift), 0))
    key = tl.where(ok, _order_key(x, cols), -9223372036854775808)
    for i in tl.static_range(WIDTH):
        best = tl.max(key, 0)
        tl.store(keys_ptr + slot * WIDTH + i, best)
        key = tl.where(key == best, -9223372036854775808, key)


@triton.jit
def _row_top_kernel(
    logits_ptr, bias_ptr, parent_ptr, keys_ptr, max_ptr, sum_ptr, score_ptr, col_ptr, stride_row, n_slices,
    HAS_BIAS: tl.constexpr, WIDTH: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    s = tl.arange(0, BLOCK_S)
    m = tl.load(max_ptr + row * n_slices + s, mask=s < n_slices, other=float("-inf"))
    total = tl.load(sum_ptr + row * n_slices + s, mask=s < n_slices, other=0.0)
    big = tl.max(m, 0)
    shift = tl.where(big == float("-inf"), 0.0, big)
    lse = shift + tl.log(tl.sum(total * tl.exp(m - shift), 0))
    parent = tl.load(parent_ptr + row)
    c = tl.arange(0, BLOCK_C)
    key = tl.load(keys_ptr + row * n_slices * WIDTH + c, mask=c < n_slices * WIDTH, other=-9223372036854775808)
    for i in tl.static_range(WIDTH):
        best = tl.max(key, 0)
        valid = best != -9223372036854775808
        col = tl.where(valid, 0x7FFFFFFF - (best & 0x7FFFFFFF), 0)
        x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + col).to(tl.float32)
        if HAS_BIAS:
            x += tl.load(bias_ptr + col)
        tl.store(score_ptr + row * WIDTH + i, tl.where(valid, parent + (x - lse), float("-inf")))
        tl.store(col_ptr + row * WIDTH + i, tl.where(valid, col, -1))
        key = tl.where(key == best, -9223372036854775808, key)


@triton.jit
def _beam_top_kernel(
    score_ptr, col_ptr, out_score_ptr, out_row_ptr, out_col_ptr, n_rows,
    WIDTH: tl.constexpr, BLOCK_J: tl.constexpr,
):  # fmt: skip
    j = tl.arange(0, BLOCK_J)
    ok = j < n_rows * WIDTH
    score = tl.load(score_ptr + j, mask=ok, other=float("-inf"))
    col = tl.load(col_ptr + j, mask=ok, other=-1)
    key = tl.where(ok & (col >= 0), _order_key(score, j), -9223372036854775808)
    for i in tl.static_range(WIDTH):
        best = tl.max(key, 0)
        # (a missing key is never the best: the launcher checks that n · min(width, V) >= width)
        pick = tl.where(best != -9223372036854775808, 0x7FFFFFFF - (best & 0x7FFFFFFF), 0)
        tl.store(out_score_ptr + i, tl.load(score_ptr + pick))
        tl.store(out_row_ptr + i, pick // WIDTH)
        tl.store(out_col_ptr + i, tl.load(col_ptr + pick))
        key = tl.where(key == best, -9223372036854775808, key)


def _beam_select_impl(
    logits: torch.Tensor, parent_scores: torch.Tensor, bias: torch.Tensor | None, width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the three kernels (inputs checked by `beam_select`)."""
    n, vocab = logits.shape
    block = max(1024, triton.next_power_of_2(triton.cdiv(vocab, 32)))
    n_slices = triton.cdiv(vocab, block)
    device = logits.device
    keys = torch.empty((n, n_slices, width), dtype=torch.int64, device=device)
    slice_max = torch.empty((n, n_slices), dtype=torch.float32, device=device)
    slice_sum = torch.empty((n, n_slices), dtype=torch.float32, device=device)
    row_scores = torch.empty((n, width), dtype=torch.float32, device=device)
    row_cols = torch.empty((n, width), dtype=torch.int64, device=device)
    scores = torch.empty(width, dtype=torch.float32, device=device)
    rows = torch.empty(width, dtype=torch.int64, device=device)
    columns = torch.empty(width, dtype=torch.int64, device=device)
    has_bias = bias is not None
    bias = bias if has_bias else slice_max  # never read
    interpreted = is_interpreted(_slice_top_kernel)
    launch = (lambda k: k) if interpreted else wrap_triton
    launch(_slice_top_kernel)[(n, n_slices)](
        logits, bias, keys, slice_max, slice_sum, logits.stride(0), vocab, n_slices,
        HAS_BIAS=has_bias, WIDTH=width, BLOCK=block,
    )  # fmt: skip
    launch(_row_top_kernel)[(n,)](
        logits, bias, parent_scores, keys, slice_max, slice_sum, row_scores, row_cols, logits.stride(0), n_slices,
        HAS_BIAS=has_bias, WIDTH=width, BLOCK_S=triton.next_power_of_2(n_slices),
        BLOCK_C=triton.next_power_of_2(n_slices * width),
    )  # fmt: skip
    launch(_beam_top_kernel)[(1,)](
        row_scores, row_cols, scores, rows, columns, n, WIDTH=width, BLOCK_J=triton.next_power_of_2(n * width),
    )  # fmt: skip
    return scores, rows, columns


if triton_available():
    _beam_select_op = triton_op("transformers_longspec::beam_select", _beam_select_impl, mutates_args=())
else:
    _beam_select_op = None


__all__ = ["MAX_WIDTH", "beam_select", "beam_select_ref"]
