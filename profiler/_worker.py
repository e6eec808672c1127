"""Worker process of `load_traces`: parse the files named on the command line into `out_dir`.

    python -m profiler._worker OUT_DIR FILE...

Writes one JSON line per file to stdout as it finishes: {"path", "error"}, or {"path", "meta",
"parquet", "unstored"}. Where the frame could not be written to OUT_DIR (a full disk), "parquet" is
null and "frame_bytes": N says that the line is followed by N bytes of the frame as Arrow IPC.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

from profiler.errors import TraceError
from profiler.cache import load_one_safe


def main(argv: list[str]) -> None:
    out_dir, files = Path(argv[0]), argv[1:]
    out = sys.stdout.buffer
    for f in files:
        res = load_one_safe(Path(f), out_dir)
        payload = b""
        if isinstance(res, TraceError):
            msg = {"path": f, "error": res.problem}
        else:
            msg = {"path": f, "meta": res.meta, "parquet": res.parquet, "unstored": res.unstored}
            if res.frame is not None:
                buf = io.BytesIO()
                res.frame.write_ipc(buf)
                payload = buf.getvalue()
                msg["frame_bytes"] = len(payload)
        out.write(json.dumps(msg).encode() + b"\n" + payload)
        out.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
