"""How far a gzipped trace may inflate, and the inflater: shared by the whole-file reader
(damaged.py) and the streaming scan (parse_stream.py).

Light on purpose (no polars, no numpy): the streaming scan runs in a process that has imported
nothing else yet (prescan.py).
"""

from __future__ import annotations

import os

try:  # python-isal: ISA-L's inflate, ~1.7x zlib's; zlib where it is not installed
    from isal import isal_zlib as _isal_zlib
except ImportError:
    _isal_zlib = None

# Limits on damaged or hostile input (docs/profiler.md, "Odd input"). Real Kineto JSON gzips 10-30x.
MAX_INFLATE_RATIO = 100  # a gzip may hold at most 100x its size in JSON ...
INFLATE_FLOOR_BYTES = 64 << 20  # ... or 64 MiB, whichever is more; past that it is refused as a bomb


def json_bytes(path) -> int:
    """The JSON a trace file holds, read cheaply: a gzip's own record of it (its last member's
    size mod 4 GiB, believed up to MAX_INFLATE_RATIO x the file: a damaged trailer is any 4 bytes;
    never less than the file, so a file of 4 GiB of JSON or more is still large), else the file's
    size. Raises OSError. For planning only (pool.py, batchmap.py): the parse itself checks."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 18 or f.read(2) != b"\x1f\x8b":
            return size
        f.seek(-4, os.SEEK_END)
        return max(size, min(int.from_bytes(f.read(4), "little"), MAX_INFLATE_RATIO * size))
