"""Runs over several configs (compare, sweep, reproduce, benchmark); presets/ holds the presets
of no single method (each method's own are in its folder, clusterfed/algorithms/NAME/presets)."""
