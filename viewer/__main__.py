"""`ptprof view [--traces DIR] [--host 127.0.0.1] [--port 8050]`: serve the viewer.

    python -m viewer view --traces traces      # what `ptprof view` execs

Binds 127.0.0.1 unless told otherwise: the viewer reads any run under the traces root and
accepts uploads, so exposing it on a network is a decision to make explicitly (--host 0.0.0.0).
"""

from __future__ import annotations

import argparse
import sys


def parse_args(argv: list[str]) -> argparse.Namespace:
    """`view` (as `ptprof` hands it over) is optional; the rest are the viewer's own flags."""
    argv = list(argv)
    if argv[:1] == ["view"]:
        argv = argv[1:]
    parser = argparse.ArgumentParser(prog="ptprof view", description="Browse and compare runs in a Dash app.")
    parser.add_argument("--traces", default="traces", metavar="DIR", help="folder of runs (default traces/)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8050, help="port (default 8050)")
    parser.add_argument("--debug", action="store_true", help="Dash debug mode (reloader, error pop-ups)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)

    from pathlib import Path

    from viewer.app import create_app

    root = Path(args.traces)
    if not root.is_dir():
        print(f"ptprof view: {root} is not a folder (make runs with `ptprof run`, or pass --traces DIR)", file=sys.stderr)
        return 2
    print(f"ptprof view: serving {root.resolve()} at http://{args.host}:{args.port}/", flush=True)
    create_app(root).run(host=args.host, port=args.port, debug=args.debug)
    return 0


if __name__ == "__main__":
    sys.exit(main())
