"""How far a gzipped trace may inflate, and the inflater: shared by the whole-file reader
(damaged.py) and the streaming scan (parse_stream.py).

Light on purpose (no polars, no numpy): the streaming scan runs in a process that has imported
nothing else yet (prescan.py).
"""

from __future__ import annotations

try:  # python-isal: ISA-L's inflate, ~1.7x zlib's; zlib where it is not installed
    from isal import isal_zlib as _isal_zlib
except ImportError:
    _isal_zlib = None

# Limits on damaged or hostile input (docs/profiler.md, "Odd input"). Real Kineto JSON gzips 10-30x.
MAX_INFLATE_RATIO = 100  # a gzip may hold at most 100x its size in JSON ...
INFLATE_FLOOR_BYTES = 64 << 20  # ... or 64 MiB, whichever is more; past that it is refused as a bomb
