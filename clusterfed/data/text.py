"""Text datasets: AG News as next-word language modelling, Shakespeare as next-character.

Word level (AG News). `clean_ag_news` undoes the markup of the official csv files, `tokenize`
lower-cases and keeps maximal runs of letters and digits, `build_vocab` keeps the most frequent
training words after the specials <pad> <unk> <bos> <eos> (ids 0..3), and `lm_windows` cuts each
article, framed as <bos> words <eos>, into rows of `seq_len` inputs and the same tokens shifted
by one as targets. Windows never cross an article boundary, so every row has one topic; the
last window of an article is padded: inputs with <pad>, targets with IGNORE_INDEX (-100,
torch's cross_entropy default ignore_index), so each real token is a target exactly once.

Character level (Shakespeare), following LEAF (github.com/TalwalkarLab/leaf):
`data/shakespeare/preprocess/shake_utils.py` turns a role's text into samples by replacing
newlines with spaces, collapsing runs of two or more spaces into one, and taking every 80
characters at stride 1 as an input and the next character as its target;
`models/utils/language_utils.py` maps characters to their index in the 80-character
ALL_LETTERS. A character outside it gets id 79 ('}'): LEAF's `ALL_LETTERS.find` returns -1
there, and its one-hot `vec[-1] = 1` lands on the last letter.
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
import re
import tarfile
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from clusterfed.data.datasets import DATASETS, Dataset
from clusterfed.data.files import RemoteFile, fetch, read_checked
from clusterfed.errors import ConfigError, DataError

# ---------------------------------------------------------------- word level

SPECIALS = ("<pad>", "<unk>", "<bos>", "<eos>")
PAD, UNK, BOS, EOS = range(4)
IGNORE_INDEX = -100

_WORD = re.compile(r"[^\W_]+")  # \w minus "_": exactly the characters with str.isalnum()
# AG News writes "&" of an HTML entity as a space (" #39;" for "&#39;", " quot;") or keeps it
# ("&lt;"); only these names occur, and a wider pattern would eat words ending in ";".
_ENTITY = re.compile(r"[ &](#\d+|quot|amp|lt|gt|apos|hellip);")
_TAG = re.compile(r"<[^<>]*>")


def clean_ag_news(text: str) -> str:
    """Undo the AG News csv markup: a backslash marks a line break, entities are decoded.

    The readme says line breaks are written "\\n", but the files hold a lone backslash
    ("social\\network", "\\no indication"), so every backslash becomes a space. Entities become
    their characters ("it #39;s" -> "it's"), and the HTML tags they spell ("<A HREF=...>",
    "<TXN.N>") are removed.
    """
    text = text.replace("\\", " ")
    text = _ENTITY.sub(lambda m: html.unescape(f"&{m.group(1)};"), text)
    return _TAG.sub(" ", text)


def tokenize(text: str) -> list[str]:
    """Lower-case, then the maximal runs of characters c with c.isalnum(); the rest separates.

    "It's 3:30pm, café_au lait" -> ["it", "s", "3", "30pm", "café", "au", "lait"].
    """
    return _WORD.findall(text.lower())


def build_vocab(docs: Iterable[Sequence[str]], size: int) -> list[str]:
    """SPECIALS, then the `size` most frequent words of `docs`; ties go to the smaller string."""
    if size < 0:
        raise ValueError(f"vocabulary size must be >= 0, got {size}")
    counts: Counter[str] = Counter()
    for doc in docs:
        counts.update(doc)
    for special in SPECIALS:
        counts.pop(special, None)
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return list(SPECIALS) + [word for word, _ in ranked[:size]]


def encode_words(tokens: Sequence[str], index: Mapping[str, int]) -> np.ndarray:
    """<bos> ids <eos> as int64; words outside `index` become <unk>."""
    ids = np.fromiter((index.get(t, UNK) for t in tokens), dtype=np.int64, count=len(tokens))
    return np.concatenate([[BOS], ids, [EOS]]).astype(np.int64)


def lm_windows(stream: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut one article's token stream into (x, y) rows of `seq_len`, y = x shifted by one.

    Rows start every `seq_len` tokens, so consecutive rows share one token (the last target
    of a row is the first input of the next) and each token after the first is a target
    once. The last row is padded: x with PAD and y with IGNORE_INDEX at the same positions.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    targets = len(stream) - 1
    if targets < 1:
        return np.zeros((0, seq_len), np.int64), np.zeros((0, seq_len), np.int64)
    rows = math.ceil(targets / seq_len)
    x = np.full(rows * seq_len, PAD, dtype=np.int64)
    y = np.full(rows * seq_len, IGNORE_INDEX, dtype=np.int64)
    x[:targets] = stream[:-1]
    y[:targets] = stream[1:]
    return x.reshape(rows, seq_len), y.reshape(rows, seq_len)


# ---------------------------------------------------------------- character level

# LEAF's models/utils/language_utils.py ALL_LETTERS; a character's id is its index here.
ALL_LETTERS = (
    "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
)
UNKNOWN_CHAR_ID = len(ALL_LETTERS) - 1  # where LEAF's find() == -1 lands, see the module doc
_CHAR_TABLE = np.full(128, UNKNOWN_CHAR_ID, dtype=np.int64)
_CHAR_TABLE[[ord(c) for c in ALL_LETTERS]] = np.arange(len(ALL_LETTERS))
_SPACES = re.compile(r"  +")


def leaf_clean(text: str) -> str:
    """LEAF's shake_utils: newlines become spaces, then runs of 2+ spaces become one."""
    return _SPACES.sub(" ", text.replace("\n", " "))


def char_ids(text: str) -> np.ndarray:
    """Each character's index in ALL_LETTERS as int64; others get UNKNOWN_CHAR_ID."""
    points = np.frombuffer(text.encode("utf-32-le"), dtype="<u4").astype(np.int64)
    return np.where(points < 128, _CHAR_TABLE[np.minimum(points, 127)], UNKNOWN_CHAR_ID)


def char_rows(ids: np.ndarray, seq_len: int, stride: int = 1) -> np.ndarray:
    """LEAF's samples as a read-only view: row i is ids[i * stride:i * stride + seq_len + 1].

    Its first seq_len ids are the input, the last one the target. As LEAF's
    `range(0, len(text) - seq_len)`: a text of n characters gives ceil((n - seq_len) / stride)
    rows, none when n <= seq_len.
    """
    if seq_len < 1 or stride < 1:
        raise ValueError(f"seq_len and stride must be >= 1, got {seq_len}, {stride}")
    if len(ids) <= seq_len:
        return np.zeros((0, seq_len + 1), np.int64)
    return np.lib.stride_tricks.sliding_window_view(ids, seq_len + 1)[::stride]


def next_char_windows(ids: np.ndarray, seq_len: int, stride: int = 1
                      ) -> tuple[np.ndarray, np.ndarray]:
    """x = ids[i:i + seq_len], y = ids[i + seq_len] for i = 0, stride, ... (see char_rows)."""
    rows = char_rows(ids, seq_len, stride)
    return np.ascontiguousarray(rows[:, :-1]), np.ascontiguousarray(rows[:, -1])


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


# ---------------------------------------------------------------- files

_AG_HOME = ("Zhang et al.'s ag_news_csv archive (https://s3.amazonaws.com/fast-ai-nlp/"
            "ag_news_csv.tgz)")
_TINY_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/"
_LEAF_HOME = "https://github.com/TalwalkarLab/leaf/tree/master/data/shakespeare"

# Content md5s: AG News's as torchtext's AG_NEWS checks them (test.csv agrees with the copy in
# ../shared/data), tiny-shakespeare's as published with karpathy/char-rnn's input.txt. LEAF's
# Shakespeare files are built locally by LEAF's scripts and have no official md5.
TEXT_FILES: dict[str, RemoteFile] = {
    "ag_news/train.csv": RemoteFile(
        "ag_news/train.csv", "b1a00f826fdfbd249f79597b59e1dc12",
        ("https://raw.githubusercontent.com/mhjabreel/CharCnn_Keras/master/data/ag_news_csv/"
         "train.csv",)),
    "ag_news/test.csv": RemoteFile(
        "ag_news/test.csv", "d52ea96a97a2d943681189a97654912d",
        ("https://raw.githubusercontent.com/mhjabreel/CharCnn_Keras/master/data/ag_news_csv/"
         "test.csv",)),
    "shakespeare/tinyshakespeare.txt": RemoteFile(
        "shakespeare/tinyshakespeare.txt", "6fb458f1232090904fb40fe944165e91",
        (_TINY_URL + "input.txt",)),
}
# The usual archive of the csv files (Zhang et al.'s ag_news_csv, as fast.ai mirrors it); tried
# before the single-file mirrors above. Its own md5 is not checked: the csv content is.
AG_NEWS_ARCHIVE_URLS: tuple[str, ...] = ("https://s3.amazonaws.com/fast-ai-nlp/ag_news_csv.tgz",)
AG_NEWS_TOPICS = ("World", "Sports", "Business", "Sci/Tech")


def _extract_member(archive: Path, member: str, path: Path) -> None:
    """Write one file of a .tgz to `path` (never extracts names the archive chooses)."""
    tmp = path.with_name(path.name + ".part")
    try:
        with tarfile.open(archive, "r:gz") as tar:
            source = tar.extractfile(member)
            if source is None:
                raise KeyError(member)
            tmp.write_bytes(source.read())
        tmp.replace(path)
    except (OSError, EOFError, KeyError, tarfile.TarError) as err:
        tmp.unlink(missing_ok=True)
        raise DataError(f"could not take {member} from {archive} ({err!r})") from err


def _fetch_ag_news(root: Path, spec: RemoteFile) -> None:
    """The archive first (one download serves both files), then the single-file mirrors."""
    path = root / spec.relpath
    archive = path.parent / "ag_news_csv.tgz"
    errors = []
    try:
        if not archive.exists():
            fetch(archive, AG_NEWS_ARCHIVE_URLS)
        _extract_member(archive, f"ag_news_csv/{path.name}", path)
        return
    except DataError as err:
        errors.append(str(err))
    try:
        fetch(path, spec.urls)
    except DataError as err:
        raise DataError("; ".join([*errors, str(err)])) from err


def _ag_news_bytes(root: Path, name: str, download: bool, hint: str = "") -> bytes:
    spec = TEXT_FILES[f"ag_news/{name}"]
    path = root / spec.relpath
    if download and not path.exists():
        _fetch_ag_news(root, spec)
    try:
        return read_checked(root, spec, download=False, home=_AG_HOME)
    except DataError as err:
        if hint and not path.exists():
            raise DataError(f"{err}; {hint}") from None
        raise


def parse_ag_news_csv(data: bytes, name: str) -> tuple[np.ndarray, list[str]]:
    """Topics 0..3 and "title description" texts of an AG News csv file.

    Rows are "class","title","description" with class 1..4 and "" for a quote inside a field.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{name} is not UTF-8 text ({err})") from err
    labels, texts = [], []
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        for row in reader:
            if len(row) != 3 or row[0] not in ("1", "2", "3", "4"):
                raise DataError(f"{name} line {reader.line_num}: expected \"class 1-4\","
                                f"\"title\",\"description\", got {row!r:.80}")
            labels.append(int(row[0]) - 1)
            texts.append(f"{row[1]} {row[2]}")
    except csv.Error as err:
        raise DataError(f"{name} line {reader.line_num}: not valid csv ({err})") from err
    return np.asarray(labels, dtype=np.int64), texts


def _stratified_split(labels: np.ndarray, fraction: float, seed: int
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Per topic, a seeded round(fraction * n) of its articles for training (file order kept)."""
    rng = np.random.default_rng(seed)
    train = np.zeros(len(labels), dtype=bool)
    for topic in np.unique(labels):
        members = np.flatnonzero(labels == topic)
        n_train = min(max(int(round(fraction * len(members))), 1), len(members) - 1)
        train[rng.permutation(members)[:n_train]] = True
    return np.flatnonzero(train), np.flatnonzero(~train)


def _lm_rows(streams: Sequence[np.ndarray], topics: np.ndarray, docs: np.ndarray,
             seq_len: int, drop_partial: bool
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    xs, ys, groups, doc_ids = [], [], [], []
    for stream, topic, doc in zip(streams, topics, docs, strict=True):
        x, y = lm_windows(stream, seq_len)
        if drop_partial:
            full = (y != IGNORE_INDEX).all(axis=1)
            x, y = x[full], y[full]
        xs.append(x)
        ys.append(y)
        groups.append(np.full(len(x), topic, dtype=np.int64))
        doc_ids.append(np.full(len(x), doc, dtype=np.int64))
    if not xs:
        empty = np.zeros((0, seq_len), np.int64)
        return empty, empty.copy(), np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(xs), np.concatenate(ys), np.concatenate(groups), np.concatenate(doc_ids)


def _positive_int(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"data.{key} must be a positive integer, got {value!r}")
    return value


def _fraction(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ConfigError(f"data.{key} must be a number in (0, 1), got {value!r}")
    return float(value)


@DATASETS.register("ag_news")
def load_ag_news(root: Path, download: bool = False, seq_len: int = 35,
                 vocab_size: int = 10000, train_from_test: float | None = None,
                 seed: int = 0, drop_partial: bool = False) -> Dataset:
    """AG News as next-word language modelling (CFL's VI-C), one group per topic.

    Reads `<root>/ag_news/train.csv` and `test.csv`. `train_from_test` (e.g. 0.8) builds both
    splits from test.csv alone, a seeded per-topic split of its 7,600 articles (train.csv is
    then not read): for machines without the training split. The vocabulary is the
    `vocab_size` most frequent training words plus the 4 specials (n_classes = vocab_size + 4;
    defaults from CFL ambiguity A13: top-10k words, BPTT length 35). x and y are (N, seq_len)
    int64, y the next token of each input or IGNORE_INDEX after an article's end;
    `drop_partial` keeps only rows without padding. meta: "groups" (topic names), "vocab",
    "ignore_index", and "train_docs" / "test_docs", each row's article (row of its csv file).
    """
    seq_len = _positive_int("seq_len", seq_len)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 0:
        raise ConfigError(f"data.vocab_size must be an integer >= 0, got {vocab_size!r}")
    if train_from_test is not None:
        train_from_test = _fraction("train_from_test", train_from_test)
    test_labels, test_texts = parse_ag_news_csv(
        _ag_news_bytes(root, "test.csv", download), str(root / "ag_news" / "test.csv"))
    if train_from_test is None:
        hint = "or set data.train_from_test (e.g. 0.8) to build both splits from test.csv"
        train_labels, train_texts = parse_ag_news_csv(
            _ag_news_bytes(root, "train.csv", download, hint), str(root / "ag_news" / "train.csv"))
        train_docs, test_docs = np.arange(len(train_labels)), np.arange(len(test_labels))
    else:
        train_docs, test_docs = _stratified_split(test_labels, train_from_test, seed)
        train_labels, train_texts = test_labels[train_docs], [test_texts[i] for i in train_docs]
        test_labels, test_texts = test_labels[test_docs], [test_texts[i] for i in test_docs]
    train_tokens = [tokenize(clean_ag_news(t)) for t in train_texts]
    test_tokens = [tokenize(clean_ag_news(t)) for t in test_texts]
    vocab = build_vocab(train_tokens, vocab_size)
    index = {word: i for i, word in enumerate(vocab)}
    train = _lm_rows([encode_words(t, index) for t in train_tokens], train_labels, train_docs,
                     seq_len, drop_partial)
    test = _lm_rows([encode_words(t, index) for t in test_tokens], test_labels, test_docs,
                    seq_len, drop_partial)
    meta = {"groups": list(AG_NEWS_TOPICS), "vocab": vocab, "ignore_index": IGNORE_INDEX,
            "train_docs": train[3], "test_docs": test[3]}
    return Dataset("ag_news", train[0], train[1], test[0], test[1], len(vocab),
                   train_groups=train[2], test_groups=test[2], meta=meta)


# ---------------------------------------------------------------- Shakespeare

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
        content = _read_json(path)
        user_data = content.get("user_data") if isinstance(content, dict) else None
        if not isinstance(content, dict) or not isinstance(user_data, dict):
            raise DataError(f"{path} is not a LEAF json file with users and user_data")
        users = content.get("users", list(user_data))
        hierarchies = content.get("hierarchies")
        if not isinstance(users, list) or not all(isinstance(u, str) for u in users):
            raise DataError(f"{path}: users is not a list of role names")
        if not isinstance(hierarchies, list):
            hierarchies = []
        for i, user in enumerate(users):
            record = user_data.get(user)
            xs = record.get("x") if isinstance(record, dict) else None
            ys = record.get("y") if isinstance(record, dict) else None
            valid = (isinstance(xs, list) and isinstance(ys, list) and len(xs) == len(ys)
                     and all(isinstance(s, str) and len(s) == seq_len for s in xs)
                     and all(isinstance(c, str) and len(c) == 1 for c in ys))
            if not valid:
                raise DataError(f"{path}: role {user} does not have x, a list of {seq_len}-"
                                f"character strings, and y, as many single characters")
            if user in rows:
                raise DataError(f"{path}: role {user} appears in two files of {folder}")
            rows[user] = np.concatenate(
                [char_ids("".join(xs)).reshape(len(xs), seq_len),
                 char_ids("".join(ys)).reshape(len(ys), 1)], axis=1)
            if i < len(hierarchies):
                plays[user] = str(hierarchies[i])
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
    seq_len = _positive_int("seq_len", seq_len)
    stride = _positive_int("stride", stride)
    train_fraction = _fraction("train_fraction", train_fraction)
    if max_roles is not None:
        max_roles = _positive_int("max_roles", max_roles)
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
            spec = TEXT_FILES["shakespeare/tinyshakespeare.txt"]
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
