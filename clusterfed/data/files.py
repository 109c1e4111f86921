"""Checked file access: md5 of decompressed content, clear errors, optional download."""

from __future__ import annotations

import gzip
import hashlib
import shutil
import urllib.request
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from clusterfed.errors import DataError


@dataclass(frozen=True)
class RemoteFile:
    """A data file: where it lives under the root, its content md5, and where to fetch it."""

    relpath: str
    content_md5: str
    urls: tuple[str, ...] = ()


def content_bytes(path: Path) -> bytes:
    """The file's content, decompressed when it is gzip."""
    raw = path.read_bytes()
    if path.suffix == ".gz":
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as err:
            raise DataError(f"{path} is not a valid gzip file ({err})") from err
    return raw


def read_checked(root: Path, spec: RemoteFile, *, download: bool, home: str) -> bytes:
    """Read and verify one file, downloading it first when asked and missing."""
    path = root / spec.relpath
    if not path.exists() and download:
        fetch(path, spec.urls)
    if not path.exists():
        raise DataError(
            f"missing data file {path} (md5 of its content {spec.content_md5}); "
            f"put the file there, set --data-dir or CLUSTERFED_DATA, or use data.download=true "
            f"to fetch it from {home}"
        )
    data = content_bytes(path)
    digest = hashlib.md5(data).hexdigest()
    if digest != spec.content_md5:
        raise DataError(
            f"corrupt data file {path}: md5 of its content is {digest}, expected "
            f"{spec.content_md5}; replace it with the official file from {home}"
        )
    return data


def fetch(path: Path, urls: Sequence[str]) -> None:
    """Download to `path` from the first URL that answers; a partial file never stays behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    errors = []
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as out:
                shutil.copyfileobj(response, out)
            tmp.replace(path)
            return
        except OSError as err:
            errors.append(f"{url}: {err}")
            tmp.unlink(missing_ok=True)
    raise DataError(f"could not download {path.name}: " + "; ".join(errors))
