"""A federation written as client folders (`clusterfed scenario export`), one per client.

`DIR/client-K/` holds client K's data in a format `own.load_client_data` reads back to the same
arrays, in the same order: `npz` (float32 kept exactly), `images` (PNG per class folder under
`train/` and `test/`, files named by sample index) or `csv` (`train.csv`, `test.csv`: one
column per input value, then `label`; the values written as the exact float32 numbers).
`DIR/truth.json` keeps what the folders cannot say (true clusters, the scenario): a side file
that no runtime reads.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from clusterfed.data.federation import ClientData, Federation
from clusterfed.errors import DataError

EXPORT_FORMATS = ("npz", "images", "csv")
TRUTH_FILE = "truth.json"
LABEL_COLUMN = "label"


def client_dir(root: Path, k: int) -> Path:
    return root / f"client-{k}"


def check_exportable(federation: Federation, fmt: str) -> None:
    """Refuse what own data cannot hold, or `fmt` cannot hold without loss, before writing."""
    if fmt not in EXPORT_FORMATS:
        raise DataError(f"unknown export format {fmt!r}; valid: {', '.join(EXPORT_FORMATS)}")
    if federation.drift is not None:
        raise DataError(f"the federation drifts at round {federation.drift.round} "
                        f"(scenario.drift): own data holds one set of client data; drop "
                        f"scenario.drift to export")
    for k, c in enumerate(federation.clients):
        for x, y in ((c.train_x, c.train_y), (c.test_x, c.test_y)):
            if not np.issubdtype(x.dtype, np.floating):
                raise DataError(f"client-{k}'s inputs are {x.dtype} (token ids): own data "
                                f"holds images or feature vectors, which export writes")
            if y.ndim != 1:
                raise DataError(f"client-{k}'s labels are sequences {list(y.shape[1:])}: own "
                                f"data holds one label per sample")
            if fmt == "images":
                _check_images(x, f"client-{k}")


def _check_images(x: np.ndarray, where: str) -> None:
    if x.ndim != 4 or x.shape[1] not in (1, 3):
        raise DataError(f"{where}: inputs shaped {list(x.shape[1:])} are not grey or colour "
                        f"images (1 or 3, H, W); use --format npz or csv")
    # PNG holds 8-bit pixels: only inputs that are k/255 come back exactly.
    if not np.array_equal(_pixels(x).astype(np.float32) / 255.0, x):
        raise DataError(f"{where}: inputs are not 8-bit pixels (k/255, e.g. they are "
                        f"normalised or interpolated), which PNG would round; use --format npz")


def _pixels(x: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(x * 255.0), 0, 255).astype(np.uint8)


def write_npz(data: ClientData, folder: Path) -> None:
    np.savez_compressed(folder / "data.npz", x_train=data.train_x, y_train=data.train_y,
                        x_test=data.test_x, y_test=data.test_y)


def write_images(data: ClientData, folder: Path) -> None:
    from PIL import Image

    for split, x, y in (("train", data.train_x, data.train_y),
                        ("test", data.test_x, data.test_y)):
        width = max(5, len(str(max(len(y) - 1, 0))))
        pixels = _pixels(x)
        for i, (image, label) in enumerate(zip(pixels, y, strict=True)):
            target = folder / split / str(int(label))
            target.mkdir(parents=True, exist_ok=True)
            array = image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0)
            Image.fromarray(np.ascontiguousarray(array)).save(target / f"{i:0{width}d}.png")


def write_csv(data: ClientData, folder: Path) -> None:
    n_features = int(np.prod(data.train_x.shape[1:]))
    header = [f"x{i}" for i in range(n_features)] + [LABEL_COLUMN]
    for split, x, y in (("train", data.train_x, data.train_y),
                        ("test", data.test_x, data.test_y)):
        with (folder / f"{split}.csv").open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(header)
            # repr of the float64 of each float32 is exact, and reads back to the same float32.
            for row, label in zip(x.reshape(len(x), -1).astype(np.float64).tolist(),
                                  y.tolist(), strict=True):
                writer.writerow([*map(repr, row), label])


WRITERS: dict[str, Callable[[ClientData, Path], None]] = {
    "npz": write_npz, "images": write_images, "csv": write_csv}


def export_federation(federation: Federation, root: str | Path, fmt: str = "npz", *,
                      on_client: Callable[[int, Path], None] | None = None) -> list[Path]:
    """Write `root/client-K/` for every client in `fmt`; `on_client(k, folder)` after each."""
    check_exportable(federation, fmt)
    root = Path(root)
    folders = []
    for k, data in enumerate(federation.clients):
        folder = client_dir(root, k)
        folder.mkdir(parents=True, exist_ok=True)
        WRITERS[fmt](data, folder)
        folders.append(folder)
        if on_client is not None:
            on_client(k, folder)
    return folders


def truth_record(federation: Federation, source: str, overrides: Sequence[str],
                 scenario: Mapping[str, Any]) -> dict[str, Any]:
    """truth.json's content: what the exported folders do not say themselves."""
    return {"true_clusters": [int(c) for c in federation.true_clusters],
            "n_classes": int(federation.n_classes),
            "input_shape": [int(s) for s in federation.input_shape],
            "source": source, "overrides": list(overrides), "scenario": _plain(scenario),
            "info": _plain(federation.info),
            "groupings": {name: [int(v) for v in g] for name, g in federation.groupings.items()}}


def write_truth(root: str | Path, record: Mapping[str, Any]) -> Path:
    path = Path(root) / TRUTH_FILE
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def _plain(value: Any) -> Any:
    """JSON-ready: numpy numbers and arrays become Python ones, tuples lists."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)
