"""mkdocs hooks: the method option reference is generated from the code at every build."""

from __future__ import annotations

from typing import Any

from mkdocs.structure.files import File, Files

from clusterfed.docs_gen import options_reference


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, "options.md", content=options_reference()))
    return files
