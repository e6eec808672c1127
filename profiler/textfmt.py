"""Formatting for the text report (profiler.text): human units at 3 significant digits, aligned
tables cut to WIDTH columns, sparklines, and per-rank values collapsed to min / median / max."""

from __future__ import annotations

import math
import textwrap

import polars as pl

from profiler.discover import model_of
from profiler.errors import printable

WIDTH = 100
SPARK = "▁▂▃▄▅▆▇█"
NONE = "—"  # a value that is absent or cannot be a number (never 0, NaN or inf)


# ---------------------------------------------------------------------------------------------
# Units


def _number(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def sig3(x) -> str:
    """`x` to 3 significant digits, trailing zeros kept ("1.50", "12.3", "456", "1230")."""
    x = _number(x)
    if x is None:
        return NONE
    if x == 0:
        return "0"
    digits = 2 - math.floor(math.log10(abs(x)))
    rounded = round(x, digits)
    if rounded != 0 and math.floor(math.log10(abs(rounded))) > math.floor(math.log10(abs(x))):
        digits -= 1  # 9.996 -> "10.0", not "10.00"
    return f"{rounded:.{max(digits, 0)}f}"


def _scaled(x, steps: list[tuple[float, str]], *, zero: int = 0, whole: bool = False) -> str:
    x = _number(x)
    if x is None:
        return NONE
    for factor, unit in reversed(steps):
        if abs(x) >= factor * 0.9995:  # what rounds to 1000 of a unit is 1.00 of the next
            break
    if x == 0:
        factor, unit = steps[zero]
    if factor == 1 and whole:  # bytes: a whole number, not "64.0 B"
        return f"{round(x):,} {unit}"
    return f"{sig3(x / factor)} {unit}"


def fmt_time(us) -> str:
    """Microseconds as µs, ms or s, 3 significant digits."""
    return _scaled(us, [(1.0, "µs"), (1e3, "ms"), (1e6, "s")], zero=1)


def fmt_bytes(n) -> str:
    """Bytes in binary units: B, KiB, MiB, GiB, TiB (1536 KiB -> "1.50 MiB")."""
    return _scaled(n, [(1.0, "B"), (2.0**10, "KiB"), (2.0**20, "MiB"), (2.0**30, "GiB"), (2.0**40, "TiB")], whole=True)


def fmt_bw(gbps) -> str:
    """A bandwidth given in GB/s (1e9 bytes/s) in the unit that shows it: never "0.0" for a slow link."""
    x = _number(gbps)
    return NONE if x is None else _scaled(x * 1e9, [(1.0, "B/s"), (1e3, "kB/s"), (1e6, "MB/s"), (1e9, "GB/s"), (1e12, "TB/s")])


def fmt_count(x) -> str:
    """A count (or a median of counts): whole numbers as such, "1,234"; else 3 significant digits."""
    x = _number(x)
    return NONE if x is None else f"{int(x):,}" if x == int(x) else sig3(x)


def fmt_pct(p) -> str:
    """A percentage, 3 significant digits."""
    return NONE if _number(p) is None else f"{sig3(p)} %"


def fmt_unit(x, unit: str | None) -> str:
    """A theory-check value in its unit (profiler.theory.CHECK_COLUMNS `unit`)."""
    u = (unit or "").lower()
    if u in ("bytes", "byte", "b"):
        return fmt_bytes(x)
    if u in ("us", "µs"):
        return fmt_time(x)
    if u == "ms":
        return fmt_time(None if _number(x) is None else x * 1e3)
    if u in ("pct", "%"):
        return fmt_pct(x)
    if u in ("gbps", "gb/s"):
        return fmt_bw(x)
    if u in ("phi", "φ"):
        return NONE if _number(x) is None else f"{sig3(x)} Φ"
    return sig3(x) if not unit or _number(x) is None else f"{sig3(x)} {unit}"


def fmt_since(us) -> str:
    """A time relative to a step's start: "+5.30 ms", or "-1.20 ms" before it."""
    x = _number(us)
    return NONE if x is None else ("-" if x < 0 else "+") + fmt_time(abs(x))


def model_label(manifest: dict | None) -> str:
    """run.json's model: its preset and parameter count ("tiny 134k"), so that runs of different
    models are not read as one model run two ways; "—" for a foreign trace."""
    model = model_of(manifest) or {"preset": None, "n_params": None}
    preset, n = model["preset"], model["n_params"]
    count = _scaled(n, [(1.0, ""), (1e3, "k"), (1e6, "M"), (1e9, "B"), (1e12, "T")], whole=True).replace(" ", "") if n else None
    words = [printable(preset)[:16] if preset else None, count]
    return " ".join(w for w in words if w) or NONE


# ---------------------------------------------------------------------------------------------
# Layout


def truncate(text: str, n: int, *, tail: bool = False) -> str:
    """`text` in at most n characters, an ellipsis where it was cut (at the end, or the start with tail=True)."""
    if len(text) <= n:
        return text
    if n <= 1:
        return "…"[:n]
    if not tail:
        return text[:n - 1] + "…"
    kept = text[-(n - 1):]
    # A path cut at its start restarts at a separator ("…/traces/x.json", not "…aces/x.json"),
    # where a name follows it and at least half of what fits is left: a long folder name cut
    # short stays rather than leave "…/x.json", and a folder's "…/ (2 files)" never loses its name.
    sep = kept.find("/")
    if sep > 0 and kept[sep + 1:sep + 2].strip() and len(kept) - sep >= (n - 1) // 2:
        kept = kept[sep:]
    return "…" + kept


def table(header: list[str], rows: list[list[str]], align: str, *, shrink: int | tuple[int, ...] | None = 0,
          tail: bool = False, least: int = 8, indent: int = 2, width: int = WIDTH) -> list[str]:
    """Aligned columns ("l"/"r" per column), cells made printable; the columns `shrink` names are
    cut in turn (with an ellipsis, down to `least` characters) until the lines fit `width`. Without a
    column to shrink (None) a table may be wider."""
    cells = [[printable(NONE if c is None else str(c)) for c in row] for row in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    cols = (shrink,) if isinstance(shrink, int) else shrink or ()
    for col, floor in [(c, f) for f in sorted({least, 8}, reverse=True) for c in cols]:
        over = indent + sum(widths) + 2 * (len(widths) - 1) - width
        if over > 0:
            widths[col] = max(min(len(cells[0][col]), widths[col]), floor, widths[col] - over)
            cells = [[truncate(c, widths[col], tail=tail) if i == col else c for i, c in enumerate(r)]
                     for r in cells]
            widths[col] = max(len(r[col]) for r in cells)  # a path cut at a separator is shorter
    lines = []
    for k, row in enumerate(cells):
        parts = [c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(row, widths, align)]
        lines.append((" " * indent + "  ".join(parts)).rstrip())
        if k == 0:
            lines.append(" " * indent + "  ".join("─" * w for w in widths))
    return lines


def title(name: str, meaning: str) -> str:
    """A section title and what its numbers mean, on one line."""
    return truncate(f"\n== {name}: {meaning}", WIDTH + 1)  # +1: the leading newline is no column


def plural(n, noun: str) -> str:
    """"1 microbatch", "4 microbatches", "1 rank", "2,048 ranks" (n a whole number)."""
    if n == 1:
        return f"1 {noun}"
    return f"{n:,} {noun}{'es' if noun.endswith(('s', 'sh', 'ch', 'x')) else 's'}"


def wrap(text: str, first: str, rest: str) -> list[str]:
    """Text wrapped at WIDTH, made printable first (a name from a trace never starts a line)."""
    # Paths and names stay whole where they fit: no break at their hyphens.
    return (textwrap.wrap(printable(text), WIDTH, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False)
            or [first.rstrip()])


def sparkline(values: list[float], *, low: float | None = None, high: float | None = None, width: int = 64) -> str:
    """One character per value (▁ = low, █ = high; low/high default to the values' own), at most
    `width` characters: neighbouring values merge by their maximum (a peak is never lost)."""
    vals = [v for v in values if _number(v) is not None]
    if not vals:
        return ""
    if len(vals) > width:
        n = len(vals)
        vals = [max(vals[i * n // width:(i + 1) * n // width]) for i in range(width)]
    lo = min(vals) if low is None else low
    hi = max(vals) if high is None else high
    if hi <= lo:
        return SPARK[0] * len(vals)
    return "".join(SPARK[min(7, max(0, round((v - lo) / (hi - lo) * 7)))] for v in vals)


# ---------------------------------------------------------------------------------------------
# Collapsing ranks


def collapse(frame: pl.DataFrame, columns: list[str], keys: list[str] | None = None) -> pl.DataFrame:
    """Per keys (default: run) and column: n ranks, min, min_rank, median, max, max_rank over ranks.
    Nulls and non-finite values are left out; ties name the lowest rank."""
    keys = keys or ["run"]
    long = (frame.select(*keys, "rank", *[pl.col(c).cast(pl.Float64) for c in columns])
            .unpivot(index=[*keys, "rank"], on=columns, variable_name="metric")
            .filter(pl.col("value").is_finite())
            .sort("rank"))
    return long.group_by(*keys, "metric", maintain_order=True).agg(
        n=pl.len(),
        min=pl.col("value").min(), min_rank=pl.col("rank").sort_by("value", maintain_order=True).first(),
        median=pl.col("value").median(),
        max=pl.col("value").max(), max_rank=pl.col("rank").sort_by("value", descending=True, maintain_order=True).first(),
    )


def collapsed_table(stats: pl.DataFrame, labels: dict[str, str], fmt) -> list[str]:
    """A table label | min (rank) | median | max (rank) for the metrics of `labels`, in its order
    (`fmt` formats the values, or is a dict metric -> formatter); one rank: label | its value;
    a value the same on every rank (as printed) once; where every row is, the header says so once
    ("every rank") rather than each cell."""
    by = {r["metric"]: r for r in stats.to_dicts()}
    rows = [(label, by[m], fmt[m] if isinstance(fmt, dict) else fmt) for m, label in labels.items() if m in by]
    if rows and all(r["n"] == 1 for _, r, _ in rows) and len({r["min_rank"] for _, r, _ in rows}) == 1:
        return table(["", f"rank {rows[0][1]['min_rank']}"], [[label, f(r["min"])] for label, r, f in rows], "lr", shrink=None)
    if not rows:
        return []
    cells = [[label, *min_median_max(r, f)] for label, r, f in rows]
    most = max(r["n"] for _, r, _ in rows)
    # A row some ranks lack: "(every rank)" would be said of ranks that have no value.
    cells = [[c[0], c[1].replace(" (every rank)", f" ({r['n']} of {most} ranks)"), *c[2:]] if r["n"] < most else c
             for c, (_, r, _) in zip(cells, rows)]
    # Every rank agrees on every row, and every row has every rank (else a row missing on some would be said of all).
    if all(c[2:] == ["", ""] for c in cells) and len({r["n"] for _, r, _ in rows}) == 1 and rows[0][1]["n"] > 1:
        return table(["", f"every rank ({rows[0][1]['n']})"], [[label, f(r["min"])] for label, r, f in rows], "lr", shrink=None)
    if all(c[2:] == ["", ""] for c in cells):  # agreeing rows and lone ranks: each cell says which
        return table(["", "value"], [c[:2] for c in cells], "lr", shrink=None)
    return table(["", "min", "median", "max"], cells, "lrrr", shrink=None)


def device_word(kind: str | None) -> str:
    """A device in a sentence, from its `device_kind` (classify.device_kind): "MTIA device" for
    Meta's MTIA (device activity that is no GPU's), else "GPU" (CUDA, ROCm)."""
    return "MTIA device" if kind == "mtia" else "GPU"


def min_median_max(r: dict, f) -> list[str]:
    """Three cells of a collapse() row: "min (rank r)", median, "max (rank r)"; one cell where
    the ranks agree (as printed): "v (every rank)", or "v (rank r)" for a lone rank."""
    if r["n"] == 1:
        return [f"{f(r['min'])} (rank {r['min_rank']})", "", ""]
    if f(r["min"]) == f(r["max"]):
        return [f"{f(r['min'])} (every rank)", "", ""]
    return [f"{f(r['min'])} (rank {r['min_rank']})", f(r["median"]), f"{f(r['max'])} (rank {r['max_rank']})"]


def fmt_r2(r2: float | None) -> str:
    """r² cut (not rounded) to 3 decimals, as the α–β fit's note words it (alphabeta.py): rounded,
    0.7979 read 0.798 beside "r² 0.797 < 0.8", and 0.7996 would read 0.800 under a threshold of 0.8."""
    return NONE if r2 is None or not math.isfinite(r2) else f"{math.floor(r2 * 1000) / 1000:.3f}"


def fmt_range(lo, hi, fmt) -> str:
    """"v" or "lo–hi", the unit said once where both share it ("16.0–96.0 MiB")."""
    a, b = fmt(lo), fmt(hi)
    if a == b:
        return a
    (x, _, ua), (y, _, ub) = a.partition(" "), b.partition(" ")
    return f"{x}–{b}" if ua == ub else f"{a}–{b}"


MMM = ["min", "median", "max"]


def per_run(runs: list[str], frame: pl.DataFrame | None, render) -> list[str]:
    """`render` of each run's rows, under a subtitle per run when there are several; a run with
    no rows (or no lines) is left out."""
    out = []
    for run in runs:
        part = None if frame is None else frame.filter(pl.col("run").cast(pl.String) == run)
        if part is None or part.is_empty():
            continue
        lines = render(part)
        if lines:
            out += ([printable(truncate(f"  -- run {run}", WIDTH))] if len(runs) > 1 else []) + lines
    return out


def strings(frame: pl.DataFrame) -> pl.DataFrame:
    """Categorical columns as strings (run names compare with str)."""
    return frame.with_columns(pl.col(pl.Categorical).cast(pl.String))


def more(n: int, shown: int) -> list[str]:
    """The line saying how many rows a collapsed table left out."""
    return [f"  … {n - shown:,} more (ptprof analyze --full)"] if n > shown else []
