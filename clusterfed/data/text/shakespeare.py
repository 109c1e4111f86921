"""Shakespeare next-character prediction, one group per role (LEAF's users), from three
sources: LEAF's raw texts, LEAF's own json split (read by `leaf.py`'s reader), or
tiny-shakespeare as one role. Characters become ids as `tokens.py` says."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from clusterfed.data.datasets import DATASETS, Dataset, fraction_option, positive_option
from clusterfed.data.files import RemoteFile, read_checked
from clusterfed.data.leaf import leaf_users
from clusterfed.data.text.tokens import ALL_LETTERS, char_ids, char_rows, leaf_clean
from clusterfed.errors import ConfigError, DataError


def split_samples(n: int, train_fraction: float, mode: str, rng: np.random.Generator
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) indices of one role's n >= 2 samples, each in increasing order.

    LEAF's split_data.py --by_sample count: max(1, int(train_fraction * n)) train samples,
    so at least one each side. "positional" takes the first ones: no test target then appears
    in any training window. "random" draws them uniformly as LEAF does, which leaks: test
    windows share 79 of 80 characters with training windows.
    """
    if n < 2:
        raise ValueError(f"a split needs at least 2 samples, got {n}")
    n_train = max(1, int(train_fraction * n))
    if mode == "positional":
        return np.arange(n_train), np.arange(n_train, n)
    if mode == "random":
        chosen = np.zeros(n, dtype=bool)
        chosen[rng.choice(n, size=n_train, replace=False)] = True
        return np.flatnonzero(chosen), np.flatnonzero(~chosen)
    raise ValueError(f"unknown split mode {mode!r}")


_TINY_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/"
_LEAF_HOME = "https://github.com/TalwalkarLab/leaf/tree/master/data/shakespeare"
# tiny-shakespeare's md5 as published with karpathy/char-rnn's input.txt. LEAF's Shakespeare
# files are built locally by LEAF's scripts and have no official md5.
FILES: dict[str, RemoteFile] = {
    "shakespeare/tinyshakespeare.txt": RemoteFile(
        "shakespeare/tinyshakespeare.txt", "6fb458f1232090904fb40fe944165e91",
        (_TINY_URL + "input.txt",)),
}
_SOURCES = ("leaf_raw", "leaf_json", "tiny")
_LEAF_BUILD = (f"LEAF builds these files itself: run data/shakespeare/preprocess.sh from "
               f"{_LEAF_HOME} (it fetches Project Gutenberg's complete works) and copy the "
               f"result; LEAF publishes no checksum of them, so they are not md5-verified")

# A role's samples as rows of seq_len inputs then the target, and its train and test rows.
_RoleRows = tuple[np.ndarray, np.ndarray, np.ndarray]


def _decode(data: bytes, name: object) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{name} is not UTF-8 text ({err})") from err


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError) as err:
        raise DataError(f"{path} is not a valid json file ({err})") from err


def _leaf_raw_texts(base: Path, download: bool) -> tuple[dict[str, str], dict[str, str]]:
    """Role name -> raw text, and role -> play, from LEAF's raw_data layout under `base`."""
    plays_path = base / "users_and_plays.json"
    text_dir = base / "by_play_and_character"
    files = sorted(text_dir.glob("*.txt")) if text_dir.is_dir() else []
    if not plays_path.is_file() or not files:
        note = " They cannot be downloaded as files." if download else ""
        raise DataError(
            f"missing LEAF Shakespeare data under {base}: expected users_and_plays.json and "
            f"by_play_and_character/*.txt.{note} {_LEAF_BUILD}. Put LEAF's data/raw_data "
            f"folder there (or name yours with data.raw_dir), set --data-dir or "
            f"CLUSTERFED_DATA, or use data.source=tiny")
    plays = _read_json(plays_path)
    if not isinstance(plays, dict) or not all(isinstance(v, str) for v in plays.values()):
        raise DataError(f"{plays_path} is not LEAF's users_and_plays.json (role -> play)")
    texts = {}
    for path in files:
        if path.stem not in plays:  # LEAF itself fails here (KeyError)
            raise DataError(f"{path}: role {path.stem} is not in {plays_path}; the folder "
                            f"mixes outputs of different LEAF runs")
        texts[path.stem] = _decode(path.read_bytes(), path)
    return texts, {role: plays[role] for role in texts}


def _leaf_json_part(folder: Path, download: bool, seq_len: int, plays: dict[str, str]
                    ) -> dict[str, np.ndarray]:
    """Role -> rows (x ids then y id) from LEAF's json files in one split's folder."""
    files = sorted(folder.glob("*.json"))
    if not files:
        note = " They cannot be downloaded as files." if download else ""
        raise DataError(
            f"missing LEAF Shakespeare data: no json files in {folder}.{note} {_LEAF_BUILD}; "
            f"copy its data/train and data/test folders to {folder.parent}/ or set "
            f"--data-dir or CLUSTERFED_DATA")
    rows: dict[str, np.ndarray] = {}
    for path in files:
        for user in leaf_users(path, rows, "role"):
            record = user.record
            xs = record.get("x") if isinstance(record, dict) else None
            ys = record.get("y") if isinstance(record, dict) else None
            valid = (isinstance(xs, list) and isinstance(ys, list) and len(xs) == len(ys)
                     and all(isinstance(s, str) and len(s) == seq_len for s in xs)
                     and all(isinstance(c, str) and len(c) == 1 for c in ys))
            if not valid:
                raise DataError(f"{path}: role {user.name} does not have x, a list of {seq_len}-"
                                f"character strings, and y, as many single characters")
            rows[user.name] = np.concatenate(
                [char_ids("".join(xs)).reshape(len(xs), seq_len),
                 char_ids("".join(ys)).reshape(len(ys), 1)], axis=1)
            if user.hierarchy is not None:
                plays[user.name] = user.hierarchy
    return rows


def _choose_roles(names: list[str], max_roles: int | None, seed: int) -> list[str]:
    if max_roles is None or len(names) <= max_roles:
        return names
    # A seeded sample rather than the first names: sorted names run play by play.
    keep = np.sort(np.random.default_rng(seed).choice(len(names), size=max_roles, replace=False))
    return [names[i] for i in keep]


def _gather(parts: Sequence[tuple[np.ndarray, np.ndarray]], seq_len: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x, y and group of the chosen rows of each role, copied once into the final arrays."""
    total = sum(len(idx) for _, idx in parts)
    x = np.empty((total, seq_len), dtype=np.int64)
    y = np.empty(total, dtype=np.int64)
    groups = np.empty(total, dtype=np.int64)
    start = 0
    for group, (rows, idx) in enumerate(parts):
        stop = start + len(idx)
        chosen = rows[idx]  # one role's copy at a time: the roles' rows are views
        x[start:stop] = chosen[:, :-1]
        y[start:stop] = chosen[:, -1]
        groups[start:stop] = group
        start = stop
    return x, y, groups


@DATASETS.register("shakespeare")
def load_shakespeare(root: Path, download: bool = False, source: str = "leaf_raw",
                     raw_dir: str = "raw_data", seq_len: int = 80, stride: int = 1,
                     train_fraction: float = 0.9, split: str = "positional", seed: int = 0,
                     max_roles: int | None = None, min_samples: int = 0) -> Dataset:
    """Shakespeare next-character prediction, one group per role (LEAF's users).

    x is (N, seq_len) int64 character ids, y (N,) the next character's id, n_classes 80
    (meta["vocab"] is LEAF's ALL_LETTERS as a list). `source`:

    - "leaf_raw": LEAF's raw layout under `<root>/shakespeare/<raw_dir>/`
      (users_and_plays.json and by_play_and_character/<ROLE>.txt): each role's samples as
      LEAF's shake_utils builds them (every `stride`-th; LEAF's stride is 1), then a per-role
      split by `split_samples` (`train_fraction` as LEAF's 0.9 default, `split` "positional"
      or LEAF's "random", drawn from `seed`). Roles with fewer than max(2, min_samples)
      samples are dropped, as LEAF drops users without samples and its split those below 2.
    - "leaf_json": LEAF's own split, the json files of `<root>/shakespeare/train/` and
      `test/` ({"users", "num_samples", "user_data": {role: {"x": [...], "y": [...]}}});
      roles without training samples, or with fewer than `min_samples` in all, are dropped.
    - "tiny": `<root>/shakespeare/tinyshakespeare.txt` (md5-checked, downloadable from
      karpathy/char-rnn), cleaned and cut as one LEAF role: one group, split as leaf_raw.

    `max_roles` keeps a `seed`-drawn sample of that many roles. Groups are numbered in sorted
    role order; meta["groups"] names them and meta["plays"] gives each one's play where known.
    At stride 1 a role of n characters gives n - seq_len samples of seq_len int64 each (all
    of LEAF's Shakespeare is about 4.2 million samples, 2.7 GB), so small runs raise `stride`.
    """
    if source not in _SOURCES:
        raise ConfigError(f"data.source must be one of {', '.join(_SOURCES)}, got {source!r}")
    if split not in ("positional", "random"):
        raise ConfigError(f"data.split must be 'positional' or 'random', got {split!r}")
    seq_len = positive_option("seq_len", seq_len)
    stride = positive_option("stride", stride)
    train_fraction = fraction_option("train_fraction", train_fraction)
    if max_roles is not None:
        max_roles = positive_option("max_roles", max_roles)
    if isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 0:
        raise ConfigError(f"data.min_samples must be an integer >= 0, got {min_samples!r}")
    base = root / "shakespeare"
    roles: dict[str, _RoleRows] = {}
    plays: dict[str, str] = {}
    if source == "leaf_json":
        if stride != 1:
            raise ConfigError("data.stride applies to the leaf_raw and tiny sources; "
                              "leaf_json's samples are those of LEAF's files")
        train = _leaf_json_part(base / "train", download, seq_len, plays)
        test = _leaf_json_part(base / "test", download, seq_len, plays)
        empty = np.zeros((0, seq_len + 1), np.int64)
        for role, rows in train.items():
            both = np.concatenate([rows, test.get(role, empty)])
            if len(rows) >= 1 and len(both) >= min_samples:
                roles[role] = (both, np.arange(len(rows)), np.arange(len(rows), len(both)))
    else:
        if source == "tiny":
            spec = FILES["shakespeare/tinyshakespeare.txt"]
            data = read_checked(root, spec, download=download, home=_TINY_URL)
            texts = {"tinyshakespeare": _decode(data, root / spec.relpath)}
        else:
            texts, plays = _leaf_raw_texts(base / raw_dir, download)
        rng = np.random.default_rng(seed)
        for role in sorted(texts):
            rows = char_rows(char_ids(leaf_clean(texts[role])), seq_len, stride)
            if len(rows) < max(2, min_samples):
                continue
            roles[role] = (rows, *split_samples(len(rows), train_fraction, split, rng))
    names = _choose_roles(sorted(roles), max_roles, seed)
    if not names:
        raise DataError(f"no Shakespeare role under {base} has enough samples "
                        f"(seq_len {seq_len}, min_samples {min_samples})")
    train_x, train_y, train_g = _gather([(roles[r][0], roles[r][1]) for r in names], seq_len)
    test_x, test_y, test_g = _gather([(roles[r][0], roles[r][2]) for r in names], seq_len)
    meta = {"groups": names, "plays": [plays.get(r, "") for r in names],
            "vocab": list(ALL_LETTERS), "source": source}
    return Dataset("shakespeare", train_x, train_y, test_x, test_y, len(ALL_LETTERS),
                   train_groups=train_g, test_groups=test_g, meta=meta)
