"""FEMNIST from the json files that LEAF's preprocessing writes, one group per writer.

LEAF (github.com/TalwalkarLab/leaf, data/femnist) builds the files itself from NIST Special
Database 19; they depend on its sampling flags, so no per-file checksum exists (its
meta/dir-checksum.md5 covers one reference sampling run only) and none is checked here.
"""

from __future__ import annotations

import json
from collections.abc import Container, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from clusterfed.data.datasets import DATASETS, Dataset
from clusterfed.errors import ConfigError, DataError

FEMNIST_CLASSES = 62  # digits 0-9, then A-Z as 10-35, then a-z as 36-61
_LEAF_HOME = "https://github.com/TalwalkarLab/leaf/tree/master/data/femnist"

# One split: writer name -> (images (n, 28, 28) uint8, labels (n,) int64).
_Writers = dict[str, tuple[np.ndarray, np.ndarray]]


@DATASETS.register("femnist")
def load_femnist(root: Path, download: bool = False, max_writers: int | None = None,
                 invert: bool = False) -> Dataset:
    """FEMNIST from LEAF's `<root>/femnist/train/*.json` and `<root>/femnist/test/*.json`.

    Each writer gets one id, the same in train and test: its rank among the sorted writer
    names, which meta["groups"] lists. `max_writers` keeps the first N writers in that order.
    LEAF stores pixels as the grey level / 255 of NIST's scans, black ink on a white
    background (1.0), and that polarity is kept: pixels are round(x * 255). `invert=True`
    gives MNIST's polarity (white ink on black) instead.
    """
    if max_writers is not None and (isinstance(max_writers, bool)
                                    or not isinstance(max_writers, int) or max_writers < 1):
        raise ConfigError(f"data.max_writers must be a positive integer, got {max_writers!r}")
    base = root / "femnist"
    folders = {part: base / part for part in ("train", "test")}
    files = {part: sorted(folder.glob("*.json")) for part, folder in folders.items()}
    for part, found in files.items():
        if not found:
            fetch_note = (" FEMNIST cannot be downloaded as files: LEAF builds them."
                          if download else "")
            raise DataError(
                f"missing FEMNIST data: no LEAF json files in {folders[part]}.{fetch_note} "
                f"Run LEAF's data/femnist/preprocess.sh (e.g. ./preprocess.sh -s niid --sf 1.0 "
                f"-k 0 -t sample) from {_LEAF_HOME}, then copy its data/train and data/test "
                f"folders to {base}/, or set --data-dir or CLUSTERFED_DATA. LEAF publishes no "
                f"checksum of these files, so they are not md5-verified.")
    writers: dict[str, _Writers] = {"train": {}, "test": {}}
    for part in ("train", "test"):
        for path in files[part]:
            _read_leaf_file(path, writers[part])
            if max_writers is not None:
                _keep_first(writers, max_writers)
    names = sorted(set(writers["train"]) | set(writers["test"]))
    ids = {name: i for i, name in enumerate(names)}
    arrays = {}
    for part in ("train", "test"):
        order = sorted(writers[part], key=ids.__getitem__)
        x = [writers[part][w][0] for w in order]
        y = [writers[part][w][1] for w in order]
        groups = [np.full(len(writers[part][w][1]), ids[w], dtype=np.int64) for w in order]
        images = np.concatenate(x) if x else np.zeros((0, 28, 28), np.uint8)
        if invert:
            images = 255 - images
        arrays[part] = (images[:, None],
                        np.concatenate(y) if y else np.zeros(0, np.int64),
                        np.concatenate(groups) if groups else np.zeros(0, np.int64))
    (train_x, train_y, train_g), (test_x, test_y, test_g) = arrays["train"], arrays["test"]
    return Dataset("femnist", train_x, train_y, test_x, test_y, FEMNIST_CLASSES,
                   train_groups=train_g, test_groups=test_g, meta={"groups": names})


class LeafUser(NamedTuple):
    name: str
    record: Any               # the user's entry of user_data: {"x": [...], "y": [...]}
    count: int | None         # its num_samples entry, if the file has them
    hierarchy: str | None     # its hierarchies entry (Shakespeare's play), if any


def leaf_users(path: Path, seen: Container[str], kind: str) -> Iterator[LeafUser]:
    """The users of one LEAF json file ({"users", "num_samples", "user_data", "hierarchies"}),
    in the file's order. DataError for a file that is not LEAF's, counts that do not match its
    users, or a user already in `seen` (the caller's users so far: a folder mixing outputs of
    different LEAF runs); `kind` names a user in messages (writer, role)."""
    try:
        content = json.loads(path.read_bytes())
        user_data = content["user_data"]
        users = list(content.get("users", user_data))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise DataError(f"{path} is not a LEAF json file with users and user_data "
                        f"({err!r})") from err
    if not isinstance(user_data, dict) or not all(isinstance(u, str) for u in users):
        raise DataError(f"{path} is not a LEAF json file with users and user_data")
    counts = content.get("num_samples")
    if counts is not None and (not isinstance(counts, list) or len(counts) != len(users)):
        raise DataError(f"{path}: num_samples does not give one count per user")
    hierarchies = content.get("hierarchies")
    hierarchies = hierarchies if isinstance(hierarchies, list) else []
    for i, user in enumerate(users):
        if user in seen:
            raise DataError(f"{path}: {kind} {user} appears in two files of {path.parent}; "
                            f"the folder mixes outputs of different LEAF runs")
        yield LeafUser(user, user_data.get(user), None if counts is None else counts[i],
                       str(hierarchies[i]) if i < len(hierarchies) else None)


def _read_leaf_file(path: Path, out: _Writers) -> None:
    for user in leaf_users(path, out, "writer"):
        try:
            x = np.asarray(user.record["x"], dtype=np.float64)
            y = np.asarray(user.record["y"], dtype=np.int64).reshape(-1)
        except (KeyError, TypeError, ValueError) as err:
            raise DataError(f"{path}: writer {user.name} has no valid x and y "
                            f"({err!r})") from err
        if x.size != len(y) * 784 or (user.count is not None and user.count != len(y)):
            raise DataError(f"{path}: writer {user.name} does not have {len(y)} images of 784 "
                            f"pixels")
        if len(y) and (y.min() < 0 or y.max() >= FEMNIST_CLASSES):
            raise DataError(f"{path}: writer {user.name} has labels outside 0..61")
        if not np.all((x >= 0) & (x <= 1)):  # also catches NaN
            raise DataError(f"{path}: writer {user.name} has pixels outside [0, 1]")
        pixels = np.rint(x.reshape(len(y), 28, 28) * 255).astype(np.uint8)
        out[user.name] = (pixels, y)


def _keep_first(writers: dict[str, _Writers], n: int) -> None:
    """Drop every writer after the first n names of train and test together."""
    names = sorted(set(writers["train"]) | set(writers["test"]))
    for name in names[n:]:
        for split in writers.values():
            split.pop(name, None)
