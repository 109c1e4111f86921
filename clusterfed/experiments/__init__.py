"""Presets reproducing the papers' experiments, and the runner behind the command line."""
