"""Collectives: one row per collective a rank ran, their statistics, and cross-rank skew.

GPU (NCCL/RCCL): each communication kernel is one collective. Sizes, dtype and group come from the
kernel's args where the trace has them (torch >= 2.2 records `Collective name`, `In msg nelems`,
...). Otherwise (older torch, most traces in the wild) they come from the CPU spans around the
runtime call that launched the kernel (same `correlation`, same thread, the call inside the span):
`record_param_comms` (its collective args), `nccl:<op>` (the op; `Input Dims` / `Input type` of its
input) and `c10d::<op>_` (output and input shapes). The collective is the annotation's, not the
kernel's: NCCL runs an all-to-all as a `SendRecv` kernel (whose name says int8_t). The group size
is the args', else output/input for all-gather (input/output for reduce-scatter), else the
process group of that name in the trace's distributedInfo `pg_config`, else its only group;
otherwise it is unknown (null) and so is busbw. Only then are the kind and dtype read from the
kernel name. Comm kernels and gloo spans outside every profiled step (no step from `assign_steps`:
launched before profiling, or run between steps) are left out, as the temporal breakdown leaves
them out of comm time.

CPU (gloo): gloo records no collective args. Each collective is a `gloo:<op>` span on a gloo worker
thread plus the main thread's `c10d::<op>_` enqueue; within a process the k-th enqueue of an op
pairs with the k-th gloo span of the op gloo runs for it (gloo queues work first in, first out).
Sizes come from the enqueue's `Input Dims` / `Input type`, else from the gloo span's own. gloo runs
reduce-scatter as an all-reduce of the whole input, so such rows have `algo` "all_reduce" and their
bus bandwidth uses the all-reduce factor (`note` says so).

Phase: the step phase (`ptprof/forward|backward|optimizer`, a pipeline action span, or "recompute"
for a `ptprof/recompute` span nested in one: the innermost span wins) whose
main-thread span holds the collective's enqueue (gloo) or its kernel's launch (NCCL), by time.

Bandwidths follow nccl-tests: `size_bytes` is its "size" (the all-reduce buffer, the all-gather
output, the reduce-scatter input), algbw = size / time, busbw = algbw * factor(kind, group size);
none for gloo's send and recv, whose spans run from the post to the wait (GLOO_P2P_NOTE).
"""

from __future__ import annotations

import json

import polars as pl

from profiler.intervals import union, varying
from profiler.steps import KEYS, assign_steps

# Kernel-name and arg spellings -> our collective kinds.
KIND_ALIASES = {
    "allreduce": "all_reduce", "all_reduce": "all_reduce",
    "allgather": "all_gather", "all_gather": "all_gather", "allgather_base": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather", "allgather_coalesced": "all_gather",
    "reducescatter": "reduce_scatter", "reduce_scatter": "reduce_scatter", "reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "broadcast": "broadcast", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
    "alltoall": "all_to_all", "all_to_all": "all_to_all", "alltoall_base": "all_to_all", "all_to_allv": "all_to_all",
    "sendrecv": "send_recv", "send": "send", "recv": "recv", "recvanysource": "recv", "barrier": "barrier",
}
# Heads of op names (underscores removed) -> kinds; the first head that matches wins.
OP_HEADS = [("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
            ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("gather", "gather"), ("scatter", "scatter"),
            ("reduce", "reduce"), ("sendrecv", "send_recv"), ("send", "send"), ("recv", "recv"), ("barrier", "barrier")]
_OP_HEAD_RE = "^(" + "|".join(head for head, _ in OP_HEADS) + ")"
# The CPU spans a collective's launch sits in, innermost first (see the module docstring).
NCCL_ANNOTATION_RE = r"^nccl:"
C10D_RE = r"^c10d::"
RECORD_PARAM_COMMS = "record_param_comms"
# What gloo actually runs for each kind (the name of its gloo:<op> span).
GLOO_ALGO = {"reduce_scatter": "all_reduce"}
# c10d enqueue ops whose first argument is both input and output; the rest are (output, input, ...).
IN_PLACE_OPS = {"all_reduce", "broadcast", "reduce", "barrier"}
# nccl-tests bus-bandwidth factor by kind, n = group size.
BUSBW_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
}
DTYPE_BYTES = {
    "float": 4, "float32": 4, "f32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "f16": 2,
    "bfloat16": 2, "bf16": 2, "long": 8, "long int": 8, "int64": 8, "int64_t": 8, "uint64_t": 8,
    "int": 4, "int32": 4, "int32_t": 4, "uint32_t": 4, "short": 2, "int16": 2,
    "char": 1, "signed char": 1, "unsigned char": 1, "byte": 1, "int8": 1, "uint8": 1, "int8_t": 1, "uint8_t": 1,
    "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "short int": 2, "complex<float>": 8, "complex<double>": 16,
}
POINT_TO_POINT = ["send", "recv", "send_recv"]
NCCL_KERNEL_KIND_RE = r"^nccl(?:Dev)?Kernel_([A-Za-z]+)"
NCCL_KERNEL_DTYPE_RE = r"_([a-z0-9]+_?t?)\("
GLOO_NOTE = "gloo runs reduce_scatter as an all_reduce of the whole input; busbw uses the all-reduce factor"
# gloo's send and recv are asynchronous: a span runs from the post (isend / irecv) to the wait that
# completes it, so its length is the program's, not the transfer's (a pipeline's 16 KiB sends on
# gloo "take" ~10 ms each: the stage computes until it waits). Their time is kept (what the rank
# had in flight); a bandwidth over it would mean nothing: null, and this note says why.
GLOO_P2P_NOTE = ("gloo send/recv: a span runs from the post to the wait that completes it, not only the transfer: "
                 "no bandwidth")

COLUMNS = ["run", "rank", "step", "seq", "collective", "algo", "group", "group_size", "dtype", "in_bytes", "out_bytes",
           "size_bytes", "start_us", "end_us", "dur_us", "source", "note", "phase"]
# After start_us (and the kernel's correlation id), what orders a rank's collectives: every column
# but seq, so rows that tie on all of them are identical and their order cannot show.
TIE_COLUMNS = ["end_us", "collective", "algo", "group", "dtype", "in_bytes", "out_bytes", "source", "step", "note",
               "group_size", "dur_us", "size_bytes", "phase"]
# Step phases (docs/run-layout.md, runners/harness.py PHASES): CPU annotations on the main thread.
PHASE_SPANS = {"ptprof/forward": "forward", "ptprof/backward": "backward", "ptprof/optimizer": "optimizer"}
# Pipeline action spans `ptprof/pp/{kind} s{stage} mb{microbatch}`: F (and the loss L) are forward,
# B, I and W backward. Sends and receive waits fall between these spans (phase null).
# pipedream's U (its AdamW step after each backward) is the optimizer phase.
PP_PHASE_RE = r"^ptprof/pp/([FBIWLU]) "
PP_PHASE = {"F": "forward", "L": "forward", "B": "backward", "I": "backward", "W": "backward", "U": "optimizer"}
# Activation checkpointing (--recompute): a block's forward run again inside backward (or inside a
# pipeline B action), nested in that phase's span. The innermost span wins: its collectives are "recompute".
RECOMPUTE_SPAN = "ptprof/recompute"


def _kind(name: pl.Expr) -> pl.Expr:
    return name.str.to_lowercase().str.strip_chars("_").replace_strict(KIND_ALIASES, default=None)


def _op_kind(name: pl.Expr) -> pl.Expr:
    """Our kind of an op name in any spelling (`_all_gather_base`, `allgather_into_tensor_coalesced`,
    `all_to_allv`): by its head with underscores removed, longest heads first."""
    flat = name.str.to_lowercase().str.replace_all("_", "")
    # One anchored alternation: the regex takes the first alternative that matches, in OP_HEADS'
    # order (a chain of starts_with tests would lowercase the names once per head).
    return flat.str.extract(_OP_HEAD_RE, 1).replace_strict(dict(OP_HEADS), default=None, return_dtype=pl.String)


def _dtype_bytes(dtype: pl.Expr) -> pl.Expr:
    return dtype.str.to_lowercase().str.replace("^c10::", "").replace_strict(DTYPE_BYTES, default=None, return_dtype=pl.Int64)


def collectives(events: pl.DataFrame, ranks: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per collective per rank (COLUMNS), both GPU kernels and gloo spans.

    ranks: the `Traces.ranks` frame, for world sizes and process groups where the events carry none.
    `seq` numbers the collectives of one (run, rank, group, algo) in time order, so the k-th of a
    group on every rank is the same collective.
    """
    with_steps = assign_steps(events)
    frames = [f for f in (_gpu(with_steps, ranks), _gloo(with_steps, ranks)) if f.height]
    if not frames:
        return _empty()
    out = pl.concat([f.select(COLUMNS[:3] + COLUMNS[4:-1] + ["anchor_us", "_tie"]) for f in frames], how="vertical_relaxed")
    out = _with_phase(out, events)
    # A total order (kernels starting at the same time on two streams: the earlier launch, by
    # correlation id, first), so a rank's rows and seq do not depend on what else is in the frame
    # (the batched map analyses several ranks at once: profiler/batchmap.py).
    return (
        out.sort(*KEYS, "start_us", "_tie", *TIE_COLUMNS, maintain_order=True)
        .with_columns(seq=pl.int_range(pl.len()).over(*KEYS, "group", "algo"))
        .select(COLUMNS)
    )


def _empty() -> pl.DataFrame:
    schema = {c: pl.Float64 for c in COLUMNS} | {
        "run": pl.Categorical, "rank": pl.Int32, "step": pl.Int64, "seq": pl.Int64, "collective": pl.String, "algo": pl.String,
        "group": pl.String, "group_size": pl.Int64, "dtype": pl.String, "in_bytes": pl.Int64, "out_bytes": pl.Int64,
        "size_bytes": pl.Int64, "source": pl.String, "note": pl.String, "phase": pl.String,
    }
    return pl.DataFrame(schema=schema)


def _with_phase(colls: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
    """`phase`: the step phase (forward / backward / optimizer) whose span on the main thread holds
    the collective's `anchor_us` (its enqueue, or its kernel's launch); null where none does.

    By time, not thread: CUDA runs backward (and so DDP/FSDP's launches) on autograd threads while
    the `ptprof/backward` span is on the main thread. The phase spans of a rank never overlap each
    other; `ptprof/recompute` spans nest inside them (and never in each other), and the innermost
    span wins: a collective inside one is "recompute".
    """
    name = pl.col("name").cast(pl.String)
    spans = (
        events.filter((pl.col("kind") == "annotation") & (pl.col("device") == "cpu"))
        .with_columns(_n=name)
        .with_columns(phase=pl.coalesce(
            pl.col("_n").replace_strict(PHASE_SPANS, default=None),
            pl.col("_n").str.extract(PP_PHASE_RE, 1).replace_strict(PP_PHASE, default=None),
            pl.when(pl.col("_n") == RECOMPUTE_SPAN).then(pl.lit("recompute"))))
        .filter(pl.col("phase").is_not_null())
        .select(pl.col("run").cast(pl.String).alias("_run"), "rank", _ph_ts="ts_us", _ph_end="end_us", phase="phase")
        .sort("_ph_ts", maintain_order=True)  # spans starting together: in trace order, whatever else is in the frame
    )
    out = colls.with_columns(_run=pl.col("run").cast(pl.String), _anchor=pl.coalesce("anchor_us", "start_us"))
    out = out.sort("_anchor")
    # Two levels, each a set of non-overlapping spans: the phases, then the recompute spans in them.
    for level, part in (("_outer", spans.filter(pl.col("phase") != "recompute")),
                        ("_inner", spans.filter(pl.col("phase") == "recompute"))):
        out = out.join_asof(part, left_on="_anchor", right_on="_ph_ts", by=["_run", "rank"],
                            strategy="backward", check_sortedness=False)
        out = out.with_columns(pl.when(pl.col("_ph_end") >= pl.col("_anchor")).then(pl.col("phase")).alias(level))
        out = out.drop("_ph_ts", "_ph_end", "phase")
    return (out.with_columns(phase=pl.coalesce("_inner", "_outer"))
            .drop("_run", "_anchor", "_outer", "_inner", "anchor_us"))


def _size_bytes(kind: pl.Expr, in_b: pl.Expr, out_b: pl.Expr) -> pl.Expr:
    # nccl-tests "size": the larger buffer for gathers/scatters, the buffer itself otherwise.
    return pl.when(kind.is_in(["all_gather", "gather"])).then(out_b).otherwise(in_b)


def _gpu(events: pl.DataFrame, ranks: pl.DataFrame | None) -> pl.DataFrame:
    # Only kernels in a profiled step: the breakdown's comm time counts exactly these.
    k = events.filter((pl.col("device") == "gpu") & (pl.col("kind") == "comm") & pl.col("step").is_not_null())
    if k.is_empty():
        return k
    keys = varying(events, KEYS)  # matched on these and correlation: one rank's events on correlation alone
    k = k.join(_launch_context(events, k, keys), on=[*keys, "correlation"], how="left")
    name = pl.col("name").cast(pl.String)
    c = pl.col
    kind = pl.coalesce(
        _op_kind(c("collective").cast(pl.String)), _op_kind(c("rpc_collective")),
        _op_kind(c("nccl_name").str.strip_prefix("nccl:")), _op_kind(c("c10d_name").str.strip_prefix("c10d::")),
        _op_kind(name.str.extract(NCCL_KERNEL_KIND_RE, 1)),
    )
    dtype = pl.coalesce(c("dtype").cast(pl.String), c("rpc_dtype"), c("nccl_type"), c("c10d_type"),
                        name.str.extract(NCCL_KERNEL_DTYPE_RE, 1))
    # c10d ops are (output, input, ...) except the in-place ones; an unrecorded TensorList reads 0.
    c10d_in_place = _op_kind(c("c10d_name").str.strip_prefix("c10d::")).is_in(list(IN_PLACE_OPS))
    c10d_out = pl.when(c("c10d_arg0") > 0).then(c("c10d_arg0"))
    c10d_in = pl.when(c10d_in_place).then(c10d_out).otherwise(pl.when(c("c10d_arg1") > 0).then(c("c10d_arg1")))
    in_n = pl.coalesce(c("in_nelems"), c("rpc_in_nelems"), c10d_in, c("nccl_nelems"))
    known_out = pl.coalesce(c("out_nelems"), c("rpc_out_nelems"), c10d_out)
    group_name = pl.coalesce(c("group_name").cast(pl.String), c("rpc_group_name"))
    k = k.with_columns(collective=kind, dtype=dtype, _in=in_n, _out=known_out, _gname=group_name)
    k = _with_group_size(k, ranks)
    same = pl.col("collective").is_in(["all_reduce", "broadcast", "reduce", "send", "recv", "send_recv"])
    out_n = pl.coalesce(
        "_out",
        pl.when(same).then("_in"),
        pl.when(c("collective") == "all_gather").then(c("_in") * c("_gsize")),
        pl.when(c("collective") == "reduce_scatter").then(c("_in") // c("_gsize")),
    )
    size = _dtype_bytes(pl.col("dtype"))
    return k.select(
        *KEYS, "step", "collective",
        algo=pl.col("collective"),
        group=pl.coalesce(c("group_ranks").cast(pl.String), c("rpc_group_ranks"), c("_granks"), "_gname"),
        group_size="_gsize",
        dtype=pl.col("dtype"),
        in_bytes=c("_in") * size,
        out_bytes=out_n * size,
        start_us="ts_us", end_us="end_us", dur_us="dur_us",
        source=pl.lit("nccl"), note=pl.lit(None, pl.String), anchor_us="launch_us", _tie="correlation",
    ).with_columns(size_bytes=_size_bytes(pl.col("collective"), pl.col("in_bytes"), pl.col("out_bytes")))


def _launch_context(events: pl.DataFrame, kernels: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """(run, rank, correlation) of each kernel's launch -> the collective args of the CPU spans
    around that launch: `rpc_*` (record_param_comms), `nccl_*` (nccl:<op>), `c10d_*` (c10d::<op>_).

    A span holds the launch when it is on the launch's thread and the call starts inside it; of
    each kind the latest-starting such span is taken (they nest c10d > record_param_comms > nccl).
    keys: the columns of KEYS that vary in `events` (profiler.intervals.varying): the result has
    those, and the others are not matched on.
    """
    thread = [*keys, "pid", "tid"]
    # Lazy: the runtime calls and enqueues are filtered on the few columns used, not copied whole.
    launches = (
        events.lazy().filter((pl.col("device") == "cpu") & (pl.col("kind") == "runtime") & pl.col("correlation").is_not_null())
        .select(*keys, "correlation", "pid", "tid", "ts_us")
        .join(kernels.lazy().select(*keys, "correlation").unique(), on=[*keys, "correlation"], how="semi", maintain_order="left")
        .group_by(*keys, "correlation").agg(pl.col("pid", "tid", "ts_us").first())
        .with_columns(launch_us="ts_us")
        .sort("ts_us")
        .collect()
    )
    spans = (events.lazy().filter(pl.col("kind") == "enqueue")
             .select(*thread, "ts_us", "end_us", "collective", "in_nelems", "out_nelems", "dtype", "group_name",
                     "group_ranks", "group_size", "arg_nelems", "arg_types", _name=pl.col("name").cast(pl.String))
             .collect())
    first_arg = pl.col("arg_nelems").list.get(0, null_on_oob=True)
    real_type = pl.col("arg_types").list.eval(pl.element().filter(~pl.element().is_in(["", "Scalar", "TensorList"]))).list.first()
    kinds = {
        "rpc": (pl.col("_name") == RECORD_PARAM_COMMS, {
            "rpc_collective": pl.col("collective").cast(pl.String), "rpc_in_nelems": pl.col("in_nelems"),
            "rpc_out_nelems": pl.col("out_nelems"), "rpc_dtype": pl.col("dtype").cast(pl.String),
            "rpc_group_name": pl.col("group_name").cast(pl.String), "rpc_group_ranks": pl.col("group_ranks").cast(pl.String),
            "rpc_group_size": pl.col("group_size").cast(pl.Int64)}),
        "nccl": (pl.col("_name").str.contains(NCCL_ANNOTATION_RE), {
            "nccl_name": pl.col("_name"), "nccl_nelems": first_arg, "nccl_type": real_type}),
        "c10d": (pl.col("_name").str.contains(C10D_RE), {
            "c10d_name": pl.col("_name"), "c10d_arg0": first_arg,
            "c10d_arg1": pl.col("arg_nelems").list.get(1, null_on_oob=True), "c10d_type": real_type}),
    }
    out = launches
    for prefix, (is_kind, cols) in kinds.items():
        table = spans.filter(is_kind).select(*thread, **{f"{prefix}_ts": "ts_us", f"{prefix}_end": "end_us"}, **cols)
        out = out.join_asof(table.sort(f"{prefix}_ts", maintain_order=True), left_on="ts_us", right_on=f"{prefix}_ts", by=thread,
                            strategy="backward", check_sortedness=False)
        inside = pl.col(f"{prefix}_end") >= pl.col("ts_us")
        out = out.with_columns([pl.when(inside).then(pl.col(c)).alias(c) for c in [*cols, f"{prefix}_ts"]])
        # A span around several comm launches (a coalesced group) gives no one kernel its sizes.
        shared = pl.col(f"{prefix}_ts").is_not_null() & (pl.len().over(*thread, f"{prefix}_ts") > 1)
        sizes = [c for c in cols if "nelems" in c or "_arg" in c]
        out = out.with_columns([pl.when(~shared).then(pl.col(c)).alias(c) for c in sizes]).drop(f"{prefix}_ts", f"{prefix}_end")
    return out.drop("pid", "tid", "ts_us")


def _with_group_size(k: pl.DataFrame, ranks: pl.DataFrame | None) -> pl.DataFrame:
    """`_gsize` and `_granks`: the group size from the args, from output/input (gathers and
    scatters), from pg_config by the group's name, or from pg_config's only group; else null."""
    c = pl.col
    ratio = (
        pl.when((c("collective") == "all_gather") & (c("_in") > 0) & (c("_out") % c("_in") == 0)).then(c("_out") // c("_in"))
        .when((c("collective") == "reduce_scatter") & (c("_out") > 0) & (c("_in") % c("_out") == 0)).then(c("_in") // c("_out"))
    )
    pgs = _process_groups(ranks, k.select(KEYS).unique())
    named = pgs.select(*KEYS, _gname="pg_name", _named_size="pg_size", _named_ranks="pg_ranks")
    only = pgs.filter(pl.len().over(KEYS) == 1).select(*KEYS, _only_size="pg_size", _only_ranks="pg_ranks")
    k = k.join(named, on=[*KEYS, "_gname"], how="left").join(only, on=KEYS, how="left")
    by_pg = pl.coalesce("_named_size", pl.when(c("_gname").is_null()).then(c("_only_size")))
    return k.with_columns(
        _gsize=pl.coalesce(c("group_size").cast(pl.Int64), c("rpc_group_size"), ratio, by_pg),
        _granks=pl.coalesce("_named_ranks", pl.when(c("_gname").is_null()).then(c("_only_ranks"))),
    )


def _process_groups(ranks: pl.DataFrame | None, here: pl.DataFrame | None = None) -> pl.DataFrame:
    """(run, rank, pg_name, pg_size, pg_ranks) of every group in the distributedInfo of `here`'s
    (run, rank) pairs (every rank's when None)."""
    schema = {"run": pl.Categorical, "rank": pl.Int32, "pg_name": pl.String, "pg_size": pl.Int64, "pg_ranks": pl.String}
    if ranks is None or "pg_config" not in ranks.columns:
        return pl.DataFrame(schema=schema)
    if here is not None:  # selected in polars: a per-rank call must not walk every rank's row in Python
        ranks = _only(ranks, here)
    rows = []
    for run, rank, cfg in ranks.select("run", "rank", "pg_config").filter(pl.col("pg_config").is_not_null()).iter_rows():
        if not cfg:
            continue
        pgs = json.loads(cfg)
        for pg in pgs if isinstance(pgs, list) else []:
            if isinstance(pg, dict):
                size = pg.get("pg_size")
                rows.append((run, rank, None if pg.get("pg_name") is None else str(pg.get("pg_name")),
                             size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None,
                             None if pg.get("ranks") is None else str(pg.get("ranks"))))
    return pl.DataFrame(rows, schema=schema, orient="row")


def _only(ranks: pl.DataFrame, here: pl.DataFrame) -> pl.DataFrame:
    """The rows of `ranks` whose (run, rank) is in `here` (keys compared as text and integer: the
    two frames' run categories need not agree), in `ranks`' order."""
    key = [pl.col("run").cast(pl.String).alias("_r"), pl.col("rank").cast(pl.Int64).alias("_k")]
    wanted = here.select(key).unique()
    return ranks.with_columns(key).join(wanted, on=["_r", "_k"], how="semi", maintain_order="left").drop("_r", "_k")


def _gloo(events: pl.DataFrame, ranks: pl.DataFrame | None) -> pl.DataFrame:
    spans = events.filter((pl.col("device") == "cpu") & (pl.col("kind") == "comm"))
    if spans.is_empty():
        return spans
    name = pl.col("name").cast(pl.String)
    # Pairing key: process, the op gloo ran, the elements it ran on, and the k-th such; the element
    # count keeps one lost span (the profiler drops some at its warmup edge) from shifting the rest.
    spans = (
        spans.drop("collective")
        .with_columns(algo=_kind(name.str.replace("^gloo:", "")), n_key=pl.col("arg_nelems").list.get(0, null_on_oob=True).fill_null(-1))
        .sort("ts_us", maintain_order=True)
        .with_columns(k=pl.int_range(pl.len()).over(*KEYS, "pid", "algo", "n_key"))
    )
    enq = (
        events.filter(pl.col("kind") == "enqueue")  # the few enqueues first: the name test casts every name
        .filter(name.str.starts_with("c10d::"))
        .with_columns(collective=_kind(name.str.replace("^c10d::", "").str.strip_suffix("_")))
        .filter(pl.col("collective").is_not_null())
        .with_columns(algo=pl.col("collective").replace(GLOO_ALGO))
        .with_columns(
            in_place=pl.col("collective").is_in(list(IN_PLACE_OPS)),
            arg0=pl.col("arg_nelems").list.get(0, null_on_oob=True),
            arg1=pl.col("arg_nelems").list.get(1, null_on_oob=True),
            enq_dtype=pl.col("arg_types").list.eval(pl.element().filter(~pl.element().is_in(["", "Scalar", "TensorList"]))).list.first(),
        )
        .with_columns(n_key=pl.when(pl.col("in_place")).then(pl.col("arg0")).otherwise(pl.col("arg1")).fill_null(-1))
        .sort("ts_us", maintain_order=True)
        .with_columns(k=pl.int_range(pl.len()).over(*KEYS, "pid", "algo", "n_key"))
        .select(*KEYS, "pid", "algo", "n_key", "k", "collective", "in_place", "arg0", "arg1", "enq_dtype", enq_us="ts_us")
    )
    if ranks is not None:  # only these spans' ranks: every other rank's pg_config would be parsed for nothing
        ranks = _only(ranks, spans.select(KEYS).unique())
    groups = _single_groups(ranks)
    paired = spans.join(enq, on=[*KEYS, "pid", "algo", "n_key", "k"], how="left").join(groups, on=KEYS, how="left")
    own = pl.col("arg_nelems").list.get(0, null_on_oob=True)  # what the gloo span itself processed
    dtype = pl.coalesce(
        pl.col("arg_types").list.first().replace({"TensorList": None, "": None}), pl.col("enq_dtype")
    )
    kind = pl.coalesce("collective", "algo")
    in_n = pl.when(pl.col("in_place")).then(pl.col("arg0")).otherwise(pl.col("arg1"))
    out_n = pl.col("arg0")
    n = pl.col("g_size")
    own_out = pl.when(pl.col("algo") == "all_gather").then(own * n).otherwise(own)
    size = _dtype_bytes(dtype)
    # Paired first (the k-th span and enqueue of a kind match), then only spans in a profiled step:
    # the breakdown's comm time counts exactly these, as for GPU kernels.
    return paired.filter(pl.col("step").is_not_null()).select(
        *KEYS, "step",
        collective=kind,
        algo="algo",
        group="g_ranks",
        group_size="g_size",
        dtype=dtype,
        in_bytes=pl.coalesce(in_n, own) * size,
        out_bytes=pl.coalesce(out_n, own_out) * size,
        start_us="ts_us", end_us="end_us", dur_us="dur_us",
        source=pl.lit("gloo"),
        note=pl.when((kind == "reduce_scatter") & (pl.col("algo") == "all_reduce")).then(pl.lit(GLOO_NOTE))
        .when(kind.is_in(POINT_TO_POINT)).then(pl.lit(GLOO_P2P_NOTE)),
        anchor_us="enq_us", _tie=pl.lit(None, pl.Int64),
    ).with_columns(size_bytes=_size_bytes(pl.col("collective"), pl.col("in_bytes"), pl.col("out_bytes")))


def _single_groups(ranks: pl.DataFrame | None) -> pl.DataFrame:
    """(run, rank) -> g_ranks, g_size where the trace's distributedInfo lists exactly one process
    group (gloo spans cannot say which group they ran in when there are several)."""
    # Without pg_config the group is unknown: the world size is not assumed (sub-groups are common).
    return (_process_groups(ranks).filter(pl.len().over(KEYS) == 1)
            .select(*KEYS, g_ranks="pg_ranks", g_size="pg_size"))


def collective_stats(colls: pl.DataFrame) -> pl.DataFrame:
    """Per (run, rank, collective, algo, group, dtype, size_bytes): count, total/mean time, bytes,
    algbw_gbps and busbw_gbps (GB/s = 1e9 bytes/s).

    total_us sums the calls' durations: calls in flight together (a ring's or a pipeline's isend /
    irecv) each count, so it can exceed the window. wall_us is the union of the calls' intervals,
    the time at least one was in flight; the bandwidths are over wall_us (bytes moved together share
    the time: over the sum they would be understated)."""
    by = [*KEYS, "collective", "algo", "group", "group_size", "dtype", "size_bytes"]
    keyed = colls.with_columns(_key=pl.struct(*by).hash())  # by holds nulls (dtype, group): one key column
    wall = (union(keyed.select("_key", "start_us", "end_us").filter(pl.col("end_us") >= pl.col("start_us")), ["_key"])
            .group_by("_key").agg(wall_us=(pl.col("end_us") - pl.col("start_us")).sum()))
    stats = keyed.group_by(by).agg(
        count=pl.len(),
        total_us=pl.col("dur_us").sum(),
        mean_us=pl.col("dur_us").mean(),
        total_bytes=pl.when(pl.col("size_bytes").is_not_null().any()).then(pl.col("size_bytes").sum()),
        note=pl.col("note").drop_nulls().first(),
        _untimed=(pl.col("note") == GLOO_P2P_NOTE).any(),
        _key=pl.col("_key").first(),
    ).join(wall, on="_key", how="left").drop("_key").with_columns(
        # No positive union (zero-length or inverted intervals in an odd trace): the summed durations.
        wall_us=pl.coalesce(pl.when(pl.col("wall_us") > 0).then("wall_us"), "total_us"))
    # No time, no bandwidth: never an infinite one. Nor over a time that is not the transfer's (GLOO_P2P_NOTE).
    stats = stats.with_columns(algbw_gbps=pl.when((pl.col("wall_us") > 0) & ~pl.col("_untimed"))
                               .then(pl.col("total_bytes") / pl.col("wall_us") / 1e3)).drop("_untimed")
    n = pl.col("group_size").cast(pl.Float64)
    factor = pl.lit(1.0)
    for kind, f in BUSBW_FACTOR.items():
        factor = pl.when(pl.col("algo") == kind).then(f(n)).otherwise(factor)
    # Ties in total_us (equal calls of two dtypes) are ordered by the other keys: the same order every load.
    tie = ["collective", "algo", "group", "group_size", "dtype", "size_bytes"]
    return stats.with_columns(busbw_gbps=pl.col("algbw_gbps") * factor).sort(
        *KEYS, "total_us", *tie, descending=[False, False, True] + [False] * len(tie), nulls_last=True)


def collective_skew(colls: pl.DataFrame) -> pl.DataFrame:
    """Per collective instance seen on 2+ ranks: spread of start times across ranks and the last rank.

    Instances are matched by (run, group, algo, seq): the k-th collective of a group is the same
    one on every rank that ran it. Point-to-point send/recv (pipelines) are left out: the k-th
    send of two ranks are different transfers. An all-to-all is matched like any collective,
    also where NCCL ran it as a SendRecv kernel (its kind is the annotation's). Clocks of ranks on
    different hosts are only NTP-aligned.
    """
    by = ["run", "group", "algo", "seq"]
    return (
        colls.filter(~pl.col("algo").is_in(POINT_TO_POINT))
        .group_by(by)
        .agg(
            n_ranks=pl.len(),
            collective=pl.col("collective").first(),
            first_start_us=pl.col("start_us").min(),
            spread_us=pl.col("start_us").max() - pl.col("start_us").min(),
            last_rank=pl.col("rank").sort_by("start_us").last(),
        )
        .filter(pl.col("n_ranks") > 1)
        .sort("run", "first_start_us")
    )


def unpaired_group_runs(ranks: pl.DataFrame | None) -> list[str]:
    """Runs whose collectives of no known group cannot be paired across ranks: a rank there is in
    two or more process groups of different ranks (distributedInfo's pg_config: a hybrid run's tp
    and pp groups, or a sub-group beside the world), so the k-th call of two ranks may be two
    groups' collectives (a trial: rank 0's "mean wait" of 79 ms × 87 calls in a 0.7 s window). gloo
    records no group on its spans; NCCL's carry it, and are paired by it."""
    pgs = _process_groups(ranks)
    if pgs.is_empty():
        return []
    multi = pgs.filter((pl.col("pg_size") > 1) & pl.col("pg_ranks").is_not_null())
    many = multi.group_by("run", "rank").agg(sets=pl.col("pg_ranks").n_unique()).filter(pl.col("sets") > 1)
    return sorted(set(many["run"].cast(pl.String).to_list()))


def stragglers(skew: pl.DataFrame) -> pl.DataFrame:
    """Per (run, group): how often each rank was the last to start a collective, most often first."""
    return (
        skew.group_by("run", "group", "last_rank")
        .agg(times_last=pl.len(), mean_spread_us=pl.col("spread_us").mean())
        .with_columns(share_pct=100 * pl.col("times_last") / pl.col("times_last").sum().over("run", "group"))
        .rename({"last_rank": "rank"})
        .sort("run", "group", "times_last", descending=[False, False, True])
    )
