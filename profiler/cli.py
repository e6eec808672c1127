"""`ptprof analyze PATH... [--json FILE] [--rank R] [--step S] [--hta] [...]`: tables and a JSON report (README).

    python -m profiler analyze traces/ddp-2r-20261122-210000 --json report.json

Bad input (empty, truncated or non-Kineto files, folders without traces, duplicate ranks, a rank
that cannot be told, `--gpu` on CPU-only traces, odd paths and values: docs/profiler.md, "Odd
input") ends with one line per problem and exit status 2, never a traceback. Where some ranks load
and others do not, the report covers the good ones and names the bad ones. Names from the outside
(files, runs, events) are printed with their control characters escaped (`errors.printable`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from profiler.errors import TraceError, collapsed_problems, printable
from profiler.startup import collector_paused, ctrl_c_held

# polars, numpy and the analyses (~0.2 s of imports) are imported in _run, after the worker
# processes the load will need are started (pool.LocalEngine.start_early), so both import at once.

EXIT_BAD_INPUT = 2
MAX_RANK = 2**31 - 1  # ranks are Int32 (profiler.damaged.MAX_RANK; not imported: it pulls in polars)
MAX_TOP = 100_000
HTA_SKIPPED = "HTA skipped: no GPU activity"  # the --hta entry of a run without kernels (docs/report.md)


def _whole_number(low: int, high: int):
    """An argparse type: a whole number in [low, high], else argparse's one-line error (exit 2)."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= n <= high:
            raise argparse.ArgumentTypeError(f"{n} is outside {low}..{high:,}")
        return n
    return parse


class _Parser(argparse.ArgumentParser):
    # argparse prints its usage block before the error; a bad option value gets one line, as
    # `ptprof run` does (runners/cli.py). --help still prints the whole help.
    def error(self, message: str):
        self.exit(EXIT_BAD_INPUT, printable(f"{self.prog}: error: {message} (see `{self.prog} --help`)") + "\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="ptprof analyze",
        description="Analyze PyTorch profiler (Kineto) traces of a distributed job: step times, temporal breakdown, "
                    "comm/compute overlap, collectives and stragglers, pipeline bubbles, memory, top operators.",
        epilog="PATH is a trace file (.json or .json.gz), a folder of per-rank traces (ours: rank<R>.json.gz + "
               "run.json; torch's tensorboard_trace_handler: *.pt.trace.json[.gz]; torchtitan: rank<R>_trace.json.gz), "
               "or a folder of such run folders. Two or more runs are shown side by side. "
               "Parsed traces are cached under $PTPROF_CACHE_DIR (default ~/.cache/ptprof).",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="trace files or run folders")
    p.add_argument("--json", metavar="FILE", help="write the JSON report (schema ptprof.report/1, docs/report.md) here; "
                                                  "- for standard output (then no tables)")
    p.add_argument("--rank", type=_whole_number(0, MAX_RANK), metavar="R",
                   help="report only rank R (every file is still read, to find its rank; name rank R's file to read only it)")
    p.add_argument("--step", type=_whole_number(-1, 2**63 - 1), metavar="S",
                   help="analyze only ProfilerStep#S (-1: the single window of a trace without steps)")
    p.add_argument("--hta", action="store_true",
                   help="also run HolisticTraceAnalysis and show its breakdown and overlap beside ours, on the runs with GPU "
                        "activity (a run with a rank without kernels is skipped, with a note)")
    p.add_argument("--gpu", action="store_true", help="require GPU activity in every trace (fail clearly if there is none)")
    p.add_argument("--trace-rank", type=_whole_number(0, MAX_RANK), metavar="R",
                   help="rank of a trace that names none (no distributedInfo, no rank in its file name)")
    p.add_argument("--rank-from-filename", action="store_true",
                   help="take ranks from file names (rank<R>...) even where distributedInfo has one")
    p.add_argument("--top", type=_whole_number(1, MAX_TOP), default=15, metavar="N",
                   help="rows of the top operator/kernel tables (default 15): each rank's N largest, and N rows in the "
                        "table over ranks (the other long tables stop at 12)")
    p.add_argument("--full", action="store_true",
                   help="every rank as a row (and every step, and each collective's message sizes and dtypes) instead "
                        "of min / median / max over ranks naming the ranks at each end; operator tables keep --top rows per rank")
    p.add_argument("--no-cache", action="store_true", help="parse every trace again, ignoring the parquet cache")
    p.add_argument("--cluster", metavar="ADDRESS",
                   help="run the per-rank work (parse + per-rank analyses) on a Dask distributed cluster, e.g. "
                        "tcp://scheduler:8786; the traces must be on a filesystem the workers share (same paths). Without "
                        "it, local worker processes do the same work (one per core, --workers)")
    p.add_argument("--workers", type=_whole_number(1, 4096), metavar="N",
                   help="local worker processes (default: one per CPU core, or none for a set small enough that "
                        "this process is quicker alone; at most two per core)")
    p.add_argument("-q", "--quiet", action="store_true", help="no tables on stdout (with --json FILE; alone, it only checks the traces and, when they are fine, warns on stderr that nothing was written)")
    return p


def analyze_main(argv: list[str] | None = None) -> int:
    try:
        return _run(build_parser().parse_args(argv))
    except (TraceError, ValueError) as e:  # ValueError: --rank / --step not in the traces
        _print_line(f"ptprof analyze: error: {e}", sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # Ctrl-C: the workers are stopped (pool.py), nothing half-written is kept
        _print_line("ptprof analyze: interrupted", sys.stderr)
        return 130


def _print_line(text: str, file=None) -> None:
    # One message, one line: a newline from a file, run, key or event name is printed as `\n`
    # (else it would start a line that poses as ours), terminal escapes escaped too.
    print(printable(text), file=file)


def _print_table(text: str) -> None:
    # The tables' own newlines are kept; each line is made printable (format_tables escapes cells).
    print("\n".join(printable(line) for line in text.split("\n")))


def _run(args: argparse.Namespace) -> int:
    to_stdout = args.json == "-"
    if to_stdout:  # stdout carries the JSON alone: no tables; notes and warnings on stderr, as with --quiet
        args.quiet = True
    if args.json and not to_stdout:  # before the work, not after it
        from profiler.jsonfile import unwritable

        if why := unwritable(args.json):
            raise TraceError(Path(args.json), f"--json: {why}")
    if args.cluster is not None and args.workers:
        raise TraceError(None, "--workers counts local worker processes; with --cluster the cluster's workers do the work "
                               "(size them with `dask worker --nworkers`): give one or the other")
    if args.cluster is not None and args.hta:
        raise TraceError(None, "--hta needs the events on this machine; leave out --cluster to compare with HTA")
    from profiler.pool import WORKERS_PER_CORE, capped_workers_note, cores  # import neither polars nor numpy

    most = WORKERS_PER_CORE * cores()
    if args.workers and args.workers > most:  # each holds its own imports (~0.1 GB): 1,000 of them would not fit
        _print_line(f"ptprof analyze: note: {capped_workers_note(f'--workers {args.workers}')}", sys.stderr)
        args.workers = most
    if args.cluster is not None:  # --cluster '' is a malformed address, not no cluster
        from profiler.dask_pool import DaskEngine

        engine = DaskEngine(args.cluster)
    else:
        from profiler.pool import LocalEngine, uncached_files

        engine = LocalEngine(args.workers)
    try:
        # A Ctrl-C in here comes at the block's end (startup.ctrl_c_held): one while the imports run
        # could land in a callback of Python's import machinery, which drops it and goes on.
        with ctrl_c_held():
            if hasattr(engine, "start_early"):  # inside the try: a Ctrl-C while they start still stops them
                engine.start_early(uncached_files(args.paths, cache=not args.no_cache))
            # The reduce's modules too, now: the early workers are still importing theirs (they are
            # ready ~50 ms after this process), so these cost nothing here and nothing after the map.
            with collector_paused(freeze=True):  # profiler.startup: ~20 ms, and the walks of them after it
                import polars as pl

                from profiler import jsonfile
                from profiler.load import load_traces
                from profiler.rankmap import MapOptions
                from profiler.report import analyze, build_report
                from profiler.text import format_tables

        traces = load_traces(args.paths, default_rank=args.trace_rank, rank_from_filename_first=args.rank_from_filename,
                             cache=not args.no_cache, options=MapOptions(step=args.step, top_n=args.top), engine=engine)
    finally:
        if hasattr(engine, "close"):  # the workers started early and not used (a warm load, an error, Ctrl-C)
            engine.close()
    if args.gpu:  # --gpu is the demand "every trace is a GPU trace"; --hta skips the runs without GPU activity
        no_gpu = traces.ranks.filter(~pl.col("has_gpu"))
        if no_gpu.height:
            files = ", ".join(no_gpu["file"])
            raise TraceError(None, f"no GPU events in {files}: --gpu needs kernels recorded with ProfilerActivity.CUDA")
    analysis = analyze(traces, rank=args.rank, step=args.step, top_n=args.top)
    report = build_report(analysis)
    if args.hta:
        report["hta"] = _hta_section(traces, analysis, rank=args.rank, step=args.step)
    if not args.quiet:
        _print_table(format_tables(analysis, full=args.full))
        if args.hta:
            _print_hta(report["hta"])
    for entry in report.get("hta", []):  # said with --quiet too: the run has no HTA column
        if entry.get("error", "").startswith(HTA_SKIPPED):
            _print_line(f"ptprof analyze: note: run {entry['run']}: {entry['error']}", sys.stderr)
    if args.quiet:  # else the tables' warnings say them, wrapped: a second, unwrapped copy was noise
        for note in traces.notes:  # with --quiet on stderr, so that it still says what was assumed
            _print_line(f"ptprof analyze: note: {note}", sys.stderr)
    for problem in collapsed_problems(traces.problems):
        _print_line(f"ptprof analyze: skipped {problem}", sys.stderr)
    if to_stdout:
        jsonfile.write_stdout(report)
    elif args.json:
        try:
            Path(args.json).write_bytes(jsonfile.dumps(report))
        except OSError as e:
            raise TraceError(Path(args.json), f"--json: cannot write the report ({e.strerror})") from None
        if not args.quiet:
            print("\nreport: " + printable(args.json))
    elif args.quiet and not traces.problems:  # a silent exit 0 would read as "done" with nothing to show for it
        _print_line("ptprof analyze: warning: --quiet without --json: the traces were checked; no tables printed, "
                    "no report written", sys.stderr)
    return EXIT_BAD_INPUT if traces.problems else 0


def _hta_section(traces, analysis, *, rank: int | None, step: int | None) -> list[dict]:
    import polars as pl

    from profiler.hta import compare_with_hta, hta_breakdown, rounded_breakdown

    rounded = rounded_breakdown(traces.rank_events(rank), step=step)
    out = []
    for run in traces.ranks["run"].cast(pl.String).unique(maintain_order=True):
        rows = traces.ranks.filter(pl.col("run") == run)
        files = dict(zip(rows["rank"].to_list(), rows["file"].to_list()))
        no_gpu = rows.filter(~pl.col("has_gpu"))["rank"].to_list()
        if no_gpu:  # HTA's breakdown is of GPU kernels; a CPU run (or rank) has none to compare
            which = "" if len(no_gpu) == rows.height else f" on rank(s) {', '.join(map(str, no_gpu))}"
            out.append({"run": run, "error": f"{HTA_SKIPPED}{which} (CPU/gloo trace)"})
            continue
        try:
            hta = hta_breakdown(files)
        except TraceError as e:
            out.append({"run": run, "error": str(e)})
            continue
        ours = analysis.breakdown.filter(pl.col("run") == run)
        out.append({"run": run, "ranks": compare_with_hta(ours, hta, rounded.filter(pl.col("run") == run)).to_dicts()})
    return out


def _print_hta(section: list[dict]) -> None:
    from profiler.hta import format_hta

    print(format_hta(section))


def main(argv: list[str] | None = None) -> int:
    """`python -m profiler analyze|project|plan ...`."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m profiler {analyze,project,plan} ...   (see: python -m profiler COMMAND --help)")
        return 0 if argv else EXIT_BAD_INPUT
    if argv[0] in ("project", "plan"):
        from profiler.cli_whatif import plan_main, project_main

        return (project_main if argv[0] == "project" else plan_main)(argv[1:])
    if argv[0] != "analyze":
        _print_line(f"python -m profiler: unknown command {argv[0]!r}; the commands are analyze, project, plan", sys.stderr)
        return EXIT_BAD_INPUT
    return analyze_main(argv[1:])
