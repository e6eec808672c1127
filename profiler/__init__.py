"""ptprof.profiler: load Kineto traces into polars frames and analyze them (see docs/)."""
