"""ptprof.viewer: the Dash app (`ptprof view`) over a folder of runs."""
