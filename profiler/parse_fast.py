"""The C parser's column buffers -> the event frame's columns, for one file or a batch's files.

`_kineto.parse` (profiler/_kineto.c) reads the JSON straight into typed buffers: numbers with
validity masks, text as codes into a table of interned strings, the few values kept as raw JSON
(process-group ranks, collectives' shapes), thread-name metadata. Here they become the polars
columns `parse._finish` takes, the same as the msgspec parser's (parse._columns); for several
files (parse_batch.py) the files' rows one after the other, each file's codes shifted into one
string table, and a `file` column.
"""

from __future__ import annotations

import msgspec
import numpy as np
import polars as pl

from profiler.damaged import MAX_TEXT_BYTES
from profiler.errors import TraceError
from profiler.parse import (_COLUMN_ORDER, _COMM_NAME_PREFIXES, SCHEMA, _arg_shapes, _finish, _group_ranks_text,
                            _sparse)


def _raw_slices(parsed: dict) -> dict[str, tuple[list[int], list[bytes]]]:
    """The C parser's sparse raw values (row, byte range in its `raw_text`) -> (rows, JSON bytes) per field."""
    out, raw = {}, parsed.pop("raw_text")
    for name, bufs in parsed["raws"].items():
        rows, starts, ends = (np.frombuffer(b, np.int64).tolist() for b in bufs)
        out[name] = (rows, [raw[s:e] for s, e in zip(starts, ends)])
    return out


def _fast_columns(parsed: dict, slices: dict) -> tuple[pl.DataFrame, dict[tuple[int, int], str], dict[str, int]]:
    """The C parser's buffers -> the same frame, thread names and counts as `_columns`."""
    cols, (thread_names,) = _fast_cols([(parsed, slices)])
    frame, dropped = _finish(cols)
    counts = parsed["counts"]
    return frame, thread_names, {"flow": counts["flow"], **dropped, "other_ph": counts["other"], "meta": counts["meta"]}


def _fast_cols(parts: list[tuple[dict, dict]]) -> tuple[dict[str, pl.Series], list[dict[tuple[int, int], str]]]:
    """The C parser's buffers of one file, or of several (parse_batch.py) -> `_finish`'s columns
    (the files' rows one after the other, a `file` column of each row's part where several) and
    each part's thread names. Raises TraceError (no path) for text over MAX_TEXT_BYTES."""
    many = len(parts) > 1
    ns = [p["n"] for p, _ in parts]
    n = sum(ns)
    starts = np.cumsum([0, *ns[:-1]]).tolist()
    tables = [p["strings"] for p, _ in parts]  # interned text: code k -> strings[k], 0 -> null
    if many and any(t[:1] != [None] for t in tables):
        raise ValueError("a string table without its null code")  # never from _kineto: parse_batch parses alone
    # Several files: one table of all their strings, each file's codes shifted into it.
    strings = [None, *(s for t in tables for s in t[1:])] if many else tables[0]
    shifts = np.cumsum([0] + [len(t) - 1 for t in tables[:-1]]).tolist()
    table = pl.Series(strings, dtype=pl.String)
    # Text columns are built categorical straight from the codes (a gather of the few distinct
    # values), never as 300,000 strings hashed again by a cast; _finish's size check on String
    # columns is done here on the distinct values, column by column in the same order.
    lengths, categories = table.str.len_bytes(), table.cast(pl.Categorical)

    def joined(get, dtype) -> np.ndarray:
        if not many:
            return np.frombuffer(get(parts[0][0]), dtype)
        return np.concatenate([np.frombuffer(get(p), dtype) for p, _ in parts])

    def masked(name: str, values: np.ndarray, valid: np.ndarray, dtype: pl.DataType) -> pl.Series:
        s = pl.Series(name, values)
        if not valid.all():
            s = pl.select(pl.when(pl.Series(valid)).then(s).alias(name)).to_series()
        return s.cast(dtype, strict=False)  # Int32 columns: outside int32 -> null, as polars' lenient cast

    first = parts[0][0]
    cols: dict[str, pl.Series] = {}
    for name in first["ints"]:
        cols[name] = masked(name, joined(lambda p: p["ints"][name][0], np.int64), joined(lambda p: p["ints"][name][1], np.bool_),
                            SCHEMA[name])
    for name in first["floats"]:
        cols[name] = masked(name, joined(lambda p: p["floats"][name][0], np.float64),
                            joined(lambda p: p["floats"][name][1], np.bool_), pl.Float64)
    cols["ph"] = pl.Series("ph", joined(lambda p: p["ph"], np.uint8)).replace_strict({0: "X", 1: "i"}, return_dtype=pl.String)

    def codes(p: dict, name: str, shift: int) -> np.ndarray:
        c = np.frombuffer(p["strs"][name], np.int32)
        return np.where(c > 0, c + np.int32(shift), np.int32(0)) if shift else c

    texts = {name: pl.Series(name, np.concatenate([codes(p, name, sh) for (p, _), sh in zip(parts, shifts)]) if many
                             else codes(first, name, 0)) for name in first["strs"]}
    for name in (c for c in _COLUMN_ORDER if c in texts):  # the order check_text_sizes reports in
        longest = lengths.gather(texts[name]).max()
        if longest is not None and longest > MAX_TEXT_BYTES:
            raise TraceError(None, f"an event's {name} is {longest:,} bytes long, over the {MAX_TEXT_BYTES:,}-byte limit "
                                   "on one text value (a damaged file?)")
    for name, c in texts.items():
        cols[name] = categories.gather(c).alias(name)

    rows, values, comm = [], [], []
    for (p, slices), start, t in zip(parts, starts, tables):
        r, v = slices["group_ranks"]
        rows += [start + i for i in r]
        values += [_group_ranks_text(msgspec.json.decode(x)) for x in v]
        # Shapes were kept for events whose name looks like communication; the exact test is here.
        name_codes = np.frombuffer(p["strs"]["name"], np.int32)
        dims, typs = (dict(zip(*slices[k])) for k in ("input_dims", "input_type"))
        comm += [(start + i, dims.get(i), typs.get(i)) for i in sorted(set(dims) | set(typs))
                 if (nm := t[name_codes[i]]) is not None and nm.startswith(_COMM_NAME_PREFIXES)]
    cols["group_ranks"] = _sparse(n, rows, values, pl.String)
    cols["arg_nelems"], cols["arg_types"] = _arg_shapes(n, comm)
    cols = {c: cols[c] for c in _COLUMN_ORDER}
    if many:
        cols["file"] = pl.Series("file", np.repeat(np.arange(len(parts), dtype=np.int32), ns))
    return cols, [_thread_names(p, t) for (p, _), t in zip(parts, tables)]


def _thread_names(parsed: dict, strings: list) -> dict[tuple[int | None, int | None], str]:
    pid, pid_ok, tid, tid_ok, name_codes = parsed["threads"]
    keys = zip(np.frombuffer(pid, np.int64).tolist(), np.frombuffer(pid_ok, np.bool_).tolist(),
               np.frombuffer(tid, np.int64).tolist(), np.frombuffer(tid_ok, np.bool_).tolist())
    return {(p if po else None, t if to else None): strings[c]
            for (p, po, t, to), c in zip(keys, np.frombuffer(name_codes, np.int32).tolist())}
