"""The Flower app folder: a pyproject.toml naming clusterfed's ServerApp and ClientApp.

`examples/flower/pyproject.toml` is this text (a test keeps them equal); `clusterfed flower local`
writes it into its work folder, so an installed clusterfed needs no checkout.
"""

from __future__ import annotations

from pathlib import Path

APP_TOML = '''# A Flower app that runs any clusterfed experiment on SuperNodes (see docs/flower.md).
#   flwr run examples/flower CONNECTION --run-config 'preset="quickstart" out-dir="/abs/dir"'
# `clusterfed flower local` submits this same app (written from clusterfed.flower.app).

[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "clusterfed-flower"
version = "0.1.0"
description = "clusterfed's ServerApp and ClientApp: any registered algorithm on Flower"
license = "Apache-2.0"
dependencies = ["clusterfed[flower]"]

[tool.flwr.app]
publisher = "clusterfed"

[tool.flwr.app.components]
serverapp = "clusterfed.flower.server_app:app"
clientapp = "clusterfed.flower.client_app:app"

[tool.flwr.app.config]
# The experiment: a preset name, or `config` = the YAML/JSON text of a whole config; then
# space-separated key=value overrides, as for `clusterfed run`.
preset = "quickstart"
config = ""
overrides = ""
# The run folder, on the machine that runs the ServerApp (the SuperLink's); an absolute path.
out-dir = "runs/flower"
# true: continue the run folder from its checkpoint (after a crash), with its own config.yaml.
resume = false
# Seconds one step waits for replies; clients that did not answer are left out of the step.
reply-timeout = 600.0
# Seconds the ServerApp waits, before round 0, for a node to serve each client.
join-timeout = 300.0
'''


def write_app(folder: str | Path) -> Path:
    """Write the app folder (just its pyproject.toml); returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(APP_TOML)
    return folder
