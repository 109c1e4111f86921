"""Tokenising text into int64 ids, word level (AG News) and character level (Shakespeare).

Word level. `tokenize` lower-cases and keeps maximal runs of letters and digits,
`build_vocab` keeps the most frequent training words after the specials <pad> <unk> <bos>
<eos> (ids 0..3), and `lm_windows` cuts each article, framed as <bos> words <eos>, into rows
of `seq_len` inputs and the same tokens shifted by one as targets. Windows never cross an
article boundary, so every row has one topic; the last window of an article is padded: inputs
with <pad>, targets with IGNORE_INDEX (-100, torch's cross_entropy default ignore_index), so
each real token is a target exactly once.

Character level, following LEAF (github.com/TalwalkarLab/leaf):
`data/shakespeare/preprocess/shake_utils.py` turns a role's text into samples by replacing
newlines with spaces, collapsing runs of two or more spaces into one, and taking every 80
characters at stride 1 as an input and the next character as its target;
`models/utils/language_utils.py` maps characters to their index in the 80-character
ALL_LETTERS. A character outside it gets id 79 ('}'): LEAF's `ALL_LETTERS.find` returns -1
there, and its one-hot `vec[-1] = 1` lands on the last letter.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

# ---------------------------------------------------------------- word level

SPECIALS = ("<pad>", "<unk>", "<bos>", "<eos>")
PAD, UNK, BOS, EOS = range(4)
IGNORE_INDEX = -100

_WORD = re.compile(r"[^\W_]+")  # \w minus "_": exactly the characters with str.isalnum()


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
