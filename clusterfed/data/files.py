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
    return gunzip(raw, path) if path.suffix == ".gz" else raw


def read_checked(root: Path, spec: RemoteFile, *, download: bool, home: str) -> bytes:
    """Read and verify one file, downloading it first when asked and missing."""
    path = root / spec.relpath
    if not path.exists() and download:
        fetch(path, spec.urls)
    if not path.exists():
        raise missing_file(path, spec.content_md5, home)
    data = content_bytes(path)
    check_md5(data, path, spec.content_md5, home)
    return data


def check_md5(data: bytes, where: str | Path, md5: str, home: str, *,
              of: str = "its content") -> None:
    """Raise the corrupt-file DataError unless `data` has the md5 `md5`."""
    digest = hashlib.md5(data).hexdigest()
    if digest != md5:
        raise DataError(f"corrupt data file {where}: md5 of {of} is {digest}, expected {md5}; "
                        f"replace it with the official file from {home}")


def missing_file(path: Path, md5: str, home: str, *, of: str = "its content",
                 alternative: str = "") -> DataError:
    """The missing-file DataError, worded as read_checked words it."""
    instead = f" (or {alternative})" if alternative else ""
    return DataError(
        f"missing data file {path} (md5 of {of} {md5}); put the file there{instead}, set "
        f"--data-dir or CLUSTERFED_DATA, or use data.download=true to fetch it from {home}")


def gunzip(data: bytes, where: str | Path) -> bytes:
    """Decompress gzip bytes; a damaged stream is a DataError naming `where`."""
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as err:
        raise DataError(f"{where} is not a valid gzip file ({err})") from err


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
