"""Worker process of the local engine (pool.py): summarize the tasks on stdin.

    python -m profiler._worker < TASKS        # one JSON line per task: [index, RankTask.to_json()]

Writes to stdout, as each file finishes, one JSON line {"index", "path", "error"} or {"index",
"path", "summary_bytes": N} followed by the N bytes of the encoded summary (rankmap.encode).
"""

from __future__ import annotations

import json
import sys

from profiler.errors import TraceError
from profiler.rankmap import RankTask, encode, summarize


def main(argv: list[str]) -> None:
    out = sys.stdout.buffer
    # All of stdin first: the parent writes every task, then reads our answers.
    lines = (open(argv[0]).read() if argv else sys.stdin.read()).splitlines()
    for line in lines:
        index, text = json.loads(line)
        task = RankTask.from_json(text)
        res = summarize(task)
        payloads = []
        if isinstance(res, TraceError):
            msg = {"index": index, "path": task.path, "error": res.problem}
        else:
            payloads.append(encode(res))
            # Never the events (a full disk left them uncached): the parent would hold every
            # rank's; it parses the file again if a view needs them (load.RankPart.events).
            msg = {"index": index, "path": task.path, "summary_bytes": len(payloads[0])}
        out.write(json.dumps(msg).encode() + b"\n" + b"".join(payloads))
        out.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
