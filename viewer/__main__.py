"""`ptprof view [--traces DIR] [--host 127.0.0.1] [--port 8050]`: serve the viewer.

    python -m viewer view --traces traces      # what `ptprof view` execs

Binds 127.0.0.1 unless told otherwise: the viewer reads any run under the traces root and
accepts uploads, so exposing it on a network is a decision to make explicitly (--host 0.0.0.0).
"""

from __future__ import annotations

import argparse
import errno
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


def port_problem(host: str, port: int) -> str | None:
    """Why the viewer could not listen on host:port (one line), or None. Checked before the server
    starts, which would otherwise print its banner and then a multi-line error."""
    import socket

    if not 0 < port < 65536:
        return f"--port {port} is not a port (1-65535)"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        return f"--host {host!r} is not an address of this machine ({e.strerror})"
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will: a closed port in TIME_WAIT is free
        try:
            s.bind(addr)
        except OSError as e:
            hint = " (another server is using it: pick another with --port)" if e.errno == errno.EADDRINUSE else ""
            return f"cannot listen on {host}:{port}: {e.strerror}{hint}"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)

    from pathlib import Path

    from viewer.app import create_app

    root = Path(args.traces)
    if not root.is_dir():
        print(f"ptprof view: {root} is not a folder (make runs with `ptprof run`, or pass --traces DIR)", file=sys.stderr)
        return 2
    problem = port_problem(args.host, args.port)
    if problem:
        print(f"ptprof view: {problem}", file=sys.stderr)
        return 2
    print(f"ptprof view: serving {root.resolve()} at http://{args.host}:{args.port}/", flush=True)
    create_app(root).run(host=args.host, port=args.port, debug=args.debug)
    return 0


if __name__ == "__main__":
    sys.exit(main())
