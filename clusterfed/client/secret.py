"""The clients' privacy secret: a file of random bytes, shared among clients out of band.

CFL's permutation privacy (`client/privacy.py`) is derived from it on the clients' side; the
server never reads it. `clusterfed secret new FILE` makes one. Its id (a hash with another
domain than the transform's) lets sites and the server compare secrets without revealing them.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

from clusterfed.errors import ConfigError

SECRET_BYTES = 32
# Below this a secret could be guessed from what the server sees (a P-mapped model).
MIN_SECRET_BYTES = 16
_TRANSFORM_DOMAIN = b"clusterfed/privacy-transform/v1\0"
_ID_DOMAIN = b"clusterfed/privacy-secret-id/v1\0"


def new_secret_file(path: str | Path) -> Path:
    """Write SECRET_BYTES random bytes to a new file readable by its owner only."""
    path = Path(path).expanduser()
    try:
        # O_EXCL: never overwrite, so a federation's secret cannot be replaced by accident.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ConfigError(f"{path} exists: a secret file is never overwritten") from None
    with os.fdopen(fd, "wb") as out:
        out.write(secrets.token_bytes(SECRET_BYTES))
    os.chmod(path, 0o600)     # whatever the umask
    return path


def read_secret_file(path: str | Path) -> bytes:
    path = Path(path).expanduser()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"privacy secret file {path} does not exist") from None
    except OSError as err:
        raise ConfigError(f"cannot read the privacy secret file {path}: {err}") from None
    if len(data) < MIN_SECRET_BYTES:
        raise ConfigError(f"privacy secret file {path} holds {len(data)} bytes; a secret "
                          f"needs at least {MIN_SECRET_BYTES} bytes (make one with clusterfed "
                          f"secret new)")
    return data


def transform_entropy(secret: bytes) -> int:
    """The privacy transform's generator seed: a cryptographic hash of the secret."""
    return int.from_bytes(hashlib.sha256(_TRANSFORM_DOMAIN + secret).digest(), "big")


def secret_id(secret: bytes) -> str:
    """A short public name of a secret: equal ids, equal secrets; it reveals nothing else."""
    return hashlib.sha256(_ID_DOMAIN + secret).hexdigest()[:16]
