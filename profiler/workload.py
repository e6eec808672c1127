"""The work of a run's operators, from the shapes its traces recorded (`record_shapes=True`, as
every ptprof runner profiles): per operator, the FLOPs of matmul-class ops and attention, the bytes
an elementwise (memory-bound) op moves, with the measured duration. `ptprof project` re-times
these on a target cluster; docs/whatif.md, "Project".

Counting rule (no double counting of nested ops): an operator is counted when it is a *work op*
and no operator enclosing it on its thread is one. Work ops are `aten::` CPU operators other than
views, allocations and casts' wrappers (NO_WORK) and other than collectives; a wrapper that is
not a work op (autograd's `MmBackward0`, `aten::to`, `aten::contiguous`) passes the count to the
ops inside it. So `aten::linear` counts once with its FLOPs (its `aten::matmul`/`aten::mm` inside
are not counted again), and the backward's `aten::mm` under `MmBackward0` counts.

FLOPs (2 per multiply-add): mm [m,k]x[k,n] 2mkn; addmm and _addmm_activation (bias, a, b) 2mkn; bmm/baddbmm 2·b·mkn;
matmul/linear 2·(rows of the input)·k·n; scaled_dot_product_attention (q, k, v of [B,H,S,D])
4·B·H·Sq·Sk·D (QK^T and PV, causal masking not subtracted), its backward twice that.
Bytes of a memory-bound op: the elements of its tensor inputs times their dtype size, plus one
output the size of its first tensor input (in-place ops write it; out-of-place ops write a new
one of about that size) -- an approximation, said in the projection's assumptions.

An op that a tensor subclass dispatches again inside itself (DTensor: `aten::add_` > `PythonSubclass` >
`aten::add_`) counts as the inner op; the outer op's extra time is dispatch, of unknown work.
A collective inside a counted op (DTensor's `aten::add` waiting in `_c10d_functional::wait_tensor`)
is not that op's work: its time is taken off the op's duration. Outermost functional-collective
ops (`_c10d_functional::*`) are kept as class "wait": profiler.breakdown counts them as compute,
project moves them to communication.

einsum/tensordot/chain_matmul/multi_dot pass the count to the bmm/mm they run. Convolutions are
class "conv", work unknown (their FLOPs need strides and padding the trace does not record).
An op whose `Input Dims` hold a dimension no tensor has (negative, over 2^40, or over 2^44
elements) is class "bad_shape" with no work; `ptprof project` refuses the file (a damaged trace).

The event frame (profiler.parse) keeps shapes of collectives only; the shapes of compute ops are
read here from the trace file itself, once per file, into a small frame.
"""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import msgspec
import numpy as np
import polars as pl

from profiler.errors import TraceError
from profiler.collectives import DTYPE_BYTES

MATMUL = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
          "aten::_addmm_activation"}
# GEMM wrappers whose own shapes do not give the product but whose inner aten::bmm/mm do: no work
# of their own, the count passes to the GEMMs inside (as for aten::matmul's backward)
GEMM_WRAPPERS = {"aten::einsum", "aten::tensordot", "aten::chain_matmul", "aten::linalg_multi_dot"}
# Convolutions: their FLOPs need stride/padding/output shape, not in `Input Dims`: class "conv",
# work unknown (scaled like the rest; the projection's coverage says how much time that is)
CONV_PREFIXES = ("aten::conv", "aten::_convolution", "aten::cudnn_convolution", "aten::mkldnn_convolution",
                 "aten::miopen_convolution", "aten::_conv_depthwise", "aten::slow_conv", "aten::thnn_conv")
ATTENTION = {"aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention",
             "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_efficient_attention",
             "aten::_scaled_dot_product_cudnn_attention", "aten::_flash_attention_forward"}
ATTENTION_BACKWARD = {"aten::_scaled_dot_product_flash_attention_for_cpu_backward",
                      "aten::_scaled_dot_product_flash_attention_backward",
                      "aten::_scaled_dot_product_efficient_attention_backward",
                      "aten::_scaled_dot_product_cudnn_attention_backward", "aten::_flash_attention_backward"}
# Metadata, views, allocations and conversion wrappers: no work of their own (their children's counts).
NO_WORK = {"aten::view", "aten::as_strided", "aten::t", "aten::transpose", "aten::reshape", "aten::_unsafe_view",
           "aten::expand", "aten::expand_as", "aten::slice", "aten::select", "aten::detach", "aten::detach_",
           "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::resolve_conj", "aten::resolve_neg",
           "aten::alias", "aten::unsqueeze", "aten::squeeze", "aten::permute", "aten::split", "aten::split_with_sizes",
           "aten::chunk", "aten::unbind", "aten::narrow", "aten::contiguous", "aten::item", "aten::_local_scalar_dense",
           "aten::is_nonzero", "aten::lift_fresh", "aten::to", "aten::_to_copy", "aten::zeros", "aten::ones",
           "aten::flatten", "aten::unflatten", "aten::view_as", "aten::_reshape_alias", "aten::new_empty",
           "aten::new_empty_strided", "aten::set_", "aten::resize_", "aten::numpy_T", "aten::chalf",
           "aten::embedding", "aten::matmul_backward", "aten::linear_backward"}
COMM_PREFIXES = ("c10d::", "gloo:", "nccl:", "record_param_comms")
# torch's functional collectives (DTensor, tensor parallel): their waits are operators to
# profiler.breakdown (compute time), kept here as class "wait" so project can move them to communication
FUNCTIONAL_COMM_PREFIX = "_c10d_functional::"
PYTHON_SUBCLASS = "PythonSubclass"  # the profiler's span of a tensor subclass's __torch_dispatch__ (DTensor)
# Input type names of traces -> bytes per element
def type_bytes(name) -> int | None:
    """Bytes per element of a trace's `Input type` name ("float", "c10::BFloat16"): collectives'
    table and rule (lowercase, no "c10::"), one for every reader of trace dtypes."""
    return DTYPE_BYTES.get(name.lower().removeprefix("c10::")) if isinstance(name, str) else None
OP_COLUMNS = {"pid": pl.Int64, "tid": pl.Int64, "ts_us": pl.Float64, "dur_us": pl.Float64, "name": pl.String,
              "klass": pl.String, "flops": pl.Float64, "bytes": pl.Float64, "batch": pl.Int64, "m": pl.Int64,
              "n": pl.Int64, "k": pl.Int64, "elem_bytes": pl.Int64}
KLASSES = ("matmul", "attention", "memory", "conv", "unknown", "wait", "bad_shape")


class _Args(msgspec.Struct, gc=False):
    dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Dims")
    types: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input type")


class _Ev(msgspec.Struct, gc=False):
    ph: object = None
    cat: object = None
    name: object = None
    pid: object = None
    tid: object = None
    ts: object = None
    dur: object = None
    args: _Args | None = None


class _Doc(msgspec.Struct, gc=False):
    traceEvents: list[_Ev] = []  # noqa: N815 (the trace's own key)


MAX_DIM = 1 << 40  # a tensor dimension beyond this (or below 0) is a damaged trace, not a shape
MAX_ELEMENTS = 1 << 44


def _shape(d) -> list[int] | None:
    """A tensor's dims, None unless a list of whole numbers in [0, MAX_DIM] of at most MAX_ELEMENTS."""
    ok = isinstance(d, list) and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_DIM for x in d)
    return d if ok and math.prod(d) <= MAX_ELEMENTS else None


def bad_dims(dims) -> bool:
    """Whether an op's `Input Dims` hold a dimension no tensor has (negative, or absurdly large)."""
    def bad(d) -> bool:
        if isinstance(d, list) and d and all(isinstance(x, list) for x in d):  # a TensorList
            return any(bad(x) for x in d)
        return isinstance(d, list) and all(isinstance(x, int) for x in d) and _shape(d) is None
    return isinstance(dims, list) and any(bad(d) for d in dims)


def gemm_shape(name: str, dims: list) -> tuple[int, int, int, int] | None:
    """(batch, m, n, k) of one matmul-class op from its `Input Dims` (module docstring), None if unreadable."""
    s = [_shape(d) for d in dims]
    try:
        if name == "aten::mm":
            (m, k), (_, n) = s[0], s[1]
            return 1, m, n, k
        if name in ("aten::addmm", "aten::_addmm_activation"):
            (m, k), (_, n) = s[1], s[2]
            return 1, m, n, k
        if name == "aten::bmm":
            (b, m, k), (_, _, n) = s[0], s[1]
            return b, m, n, k
        if name == "aten::baddbmm":
            (b, m, k), (_, _, n) = s[1], s[2]
            return b, m, n, k
        if name == "aten::linear":  # x [..., k], weight [n, k]
            x, w = s[0], s[1]
            return 1, math.prod(x[:-1]), w[0], x[-1]
        if name == "aten::matmul":  # a [..., m, k] @ b [..., k, n]; a 1-D b as a vector
            a, b = s[0], s[1]
            if len(b) == 1:
                return 1, math.prod(a[:-1]), 1, a[-1]
            batch = a[:-2] if len(a) >= len(b) else b[:-2]
            return math.prod(batch), (a[-2] if len(a) >= 2 else 1), b[-1], a[-1]
    except (TypeError, ValueError, IndexError):
        return None
    return None


def matmul_flops(gemm: tuple[int, int, int, int] | None) -> float | None:
    """2·batch·m·n·k of a matmul of shape (batch, m, n, k) (gemm_shape), None if unreadable."""
    return None if gemm is None else 2.0 * math.prod(gemm)


def attention_shape(dims: list, *, backward: bool) -> tuple[int, int, int, int] | None:
    """(B·H, Sq, Sk, D) of q [B,H,Sq,D] and k [B,H,Sk,D]; the backward kernels take grad_out first."""
    s = [_shape(d) for d in dims]
    try:
        q, k = (s[1], s[2]) if backward else (s[0], s[1])
        *lead, sq, d = q
        return math.prod(lead), sq, k[-2], d
    except (TypeError, ValueError, IndexError):
        return None


def attention_flops(attn: tuple[int, int, int, int] | None, *, backward: bool) -> float | None:
    """4·B·H·Sq·Sk·D of attention of shape (B·H, Sq, Sk, D) (attention_shape): QK^T and PV; twice
    that for the backward. None if unreadable."""
    return None if attn is None else (2 if backward else 1) * 4.0 * math.prod(attn)


def memory_bytes(dims: list, types: list) -> float | None:
    """Bytes a memory-bound op moves: its tensor inputs read, one output of its first input's size written."""
    sizes = []
    for d, t in zip(dims, types):
        if t == "TensorList" and isinstance(d, list) and d and all(_shape(x) is not None for x in d):
            sizes.append(sum(math.prod(x) for x in d) * 4)  # a TensorList's dtype is not recorded: 4 B assumed
            continue
        shape = _shape(d)
        if shape is None or type_bytes(t) is None:
            continue
        sizes.append(math.prod(shape) * type_bytes(t))
    return float(sum(sizes) + sizes[0]) if sizes else None


def op_work(name: str, dims, types) -> tuple[str, float | None, float | None, tuple | None, int | None]:
    """(class, flops, bytes, shape, element bytes) of one work op (module docstring); shape:
    (batch, m, n, k) of a matmul, (B·H, Sq, Sk, D) of attention."""
    dims = dims if isinstance(dims, list) else []
    types = types if isinstance(types, list) else []
    if bad_dims(dims):  # no tensor has such a dim: class "bad_shape", work unknown (project refuses the file)
        return "bad_shape", None, None, None, None
    elem = next((type_bytes(t) for t in types if type_bytes(t) is not None), None)
    if name in MATMUL:
        g = gemm_shape(name, dims)
        return "matmul", matmul_flops(g), memory_bytes(dims, types), g, elem
    if name in ATTENTION or name in ATTENTION_BACKWARD:
        bwd = name in ATTENTION_BACKWARD
        a = attention_shape(dims, backward=bwd)
        return "attention", attention_flops(a, backward=bwd), memory_bytes(dims, types), a, elem
    if name.startswith(CONV_PREFIXES):
        return "conv", None, None, None, elem
    b = memory_bytes(dims, types)
    return ("memory" if b is not None else "unknown"), None, b, None, elem


def _is_work(name: str) -> bool:
    return name.startswith("aten::") and name not in NO_WORK and name not in GEMM_WRAPPERS


def _decode(raw) -> list:
    try:
        return msgspec.json.decode(raw) if raw else []
    except (msgspec.DecodeError, UnicodeDecodeError):
        return []


def trace_ops(path: str | Path) -> pl.DataFrame:
    """OP_COLUMNS: the counted work ops of one trace file (module docstring), in time order.
    TraceError when the file cannot be read as a trace."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        doc = msgspec.json.decode(raw, type=_Doc | list[_Ev])  # the JSON-array form of a Chrome trace too
    except (OSError, EOFError, msgspec.DecodeError, UnicodeDecodeError) as e:
        raise TraceError(path, f"cannot read its operators' shapes ({e})") from None
    by_thread: dict[tuple, list[_Ev]] = {}
    for e in (doc if isinstance(doc, list) else doc.traceEvents):
        if e.ph == "X" and e.cat == "cpu_op" and isinstance(e.name, str) and isinstance(e.ts, (int, float)) \
                and isinstance(e.dur, (int, float)) and e.dur >= 0:
            by_thread.setdefault((e.pid, e.tid), []).append(e)
    rows: list[list] = []
    for (pid, tid), evs in by_thread.items():
        evs.sort(key=lambda e: (e.ts, -e.dur))
        # [end, covered: a work or comm op at or above this level, row of the counted op it is, in comm]
        stack: list[list] = []
        for e in evs:
            end = e.ts + e.dur
            while stack and stack[-1][0] <= e.ts:
                stack.pop()
            if e.name == PYTHON_SUBCLASS and stack and stack[-1][2] is not None:
                # a tensor subclass (DTensor) dispatching the op again inside: the op counted is the
                # inner one, the outer's time is dispatch (compute to the breakdown, work unknown)
                rows[stack[-1][2]][5] = "wrapper"
                stack[-1][1], stack[-1][2] = False, None
            covered = bool(stack) and stack[-1][1]
            in_comm = bool(stack) and stack[-1][3]
            comm = e.name.startswith(COMM_PREFIXES) or e.name.startswith(FUNCTIONAL_COMM_PREFIX)
            work = not comm and _is_work(e.name)
            row = None
            p, t = (pid if isinstance(pid, int) else None), (tid if isinstance(tid, int) else None)
            if work and not covered:
                args = e.args or _Args()
                klass, flops, nbytes, shape, elem = op_work(e.name, _decode(args.dims), _decode(args.types))
                row = len(rows)
                rows.append([p, t, float(e.ts), float(e.dur), e.name, klass, flops, nbytes, *(shape or (None,) * 4), elem])
            elif comm and not in_comm:
                # a collective inside a counted op (DTensor's add waiting for its all-reduce): not the op's work
                owner = next((f[2] for f in reversed(stack) if f[2] is not None), None)
                if owner is not None:
                    rows[owner][3] = max(0.0, rows[owner][3] - float(e.dur))
                if e.name.startswith(FUNCTIONAL_COMM_PREFIX):  # an operator to the breakdown: its compute
                    rows.append([p, t, float(e.ts), float(e.dur), e.name, "wait", None, None, None, None, None, None, None])
            stack.append([end, covered or work or comm, row, in_comm or comm])
    rows = [r for r in rows if r[5] != "wrapper"]
    frame = pl.DataFrame(rows, schema=OP_COLUMNS, orient="row")
    return frame.sort("ts_us")


def ops_in_steps(ops: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """`ops` of one rank with the `step` whose [start_us, end_us) holds each op's start; ops outside
    every step dropped. steps: profiler_steps' rows of that rank."""
    if ops.is_empty() or steps.is_empty():
        return ops.with_columns(step=pl.lit(None, pl.Int64)).clear()
    st = steps.sort("start_us")
    starts, ends, ids = (st[c].to_numpy() for c in ("start_us", "end_us", "step"))
    ts = ops["ts_us"].to_numpy()
    i = np.searchsorted(starts, ts, side="right") - 1
    ok = (i >= 0) & (ts < ends[np.clip(i, 0, None)])
    step = np.where(ok, ids[np.clip(i, 0, None)], -1)
    return ops.with_columns(step=pl.Series(step, dtype=pl.Int64)).filter(pl.col("step") >= 0)


def coverage(ops: pl.DataFrame, compute_us: float) -> dict:
    """How much of a compute time the counted ops explain, by class: {klass: µs}, known_us (ops with
    FLOPs or bytes), and known_pct = known_us / compute_us."""
    by = dict(ops.group_by("klass").agg(pl.col("dur_us").sum()).iter_rows()) if ops.height else {}
    known = ops.filter(pl.col("flops").is_not_null() | pl.col("bytes").is_not_null())["dur_us"].sum() if ops.height else 0.0
    return {"by_class_us": {k: float(by.get(k, 0.0)) for k in KLASSES}, "known_us": float(known),
            "known_pct": 100.0 * known / compute_us if compute_us > 0 else None}
