"""Worker process of the local engine (pool.py): summarize the tasks in TASK_FILE.

    python -m profiler._worker TASK_FILE      # one JSON line per task: [index, RankTask.to_json()]

Writes to stdout, as each file finishes, one JSON line {"index", "path", "error"} or {"index",
"path", "summary_bytes": N[, "frame_bytes": M]} followed by the N bytes of the encoded summary
(rankmap.encode) and, where the events could not be cached (a full disk), the M bytes of the
event frame as Arrow IPC.
"""

from __future__ import annotations

import io
import json
import sys

from profiler.errors import TraceError
from profiler.rankmap import RankTask, encode, summarize


def main(argv: list[str]) -> None:
    out = sys.stdout.buffer
    with open(argv[0]) as f:
        lines = f.read().splitlines()
    for line in lines:
        index, text = json.loads(line)
        task = RankTask.from_json(text)
        res = summarize(task)
        payloads = []
        if isinstance(res, TraceError):
            msg = {"index": index, "path": task.path, "error": res.problem}
        else:
            payloads.append(encode(res))
            msg = {"index": index, "path": task.path, "summary_bytes": len(payloads[0])}
            if res.frame is not None:
                buf = io.BytesIO()
                res.frame.write_ipc(buf)
                payloads.append(buf.getvalue())
                msg["frame_bytes"] = len(payloads[1])
        out.write(json.dumps(msg).encode() + b"\n" + b"".join(payloads))
        out.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
