"""AG News as next-word language modelling (CFL's VI-C), one group per topic: the csv files,
their markup, and the dataset (tokenised by `tokens.py`)."""

from __future__ import annotations

import csv
import html
import io
import re
import tarfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from clusterfed.data.datasets import DATASETS, Dataset, fraction_option, positive_option
from clusterfed.data.files import RemoteFile, fetch, read_checked
from clusterfed.data.text.tokens import (
    IGNORE_INDEX,
    build_vocab,
    encode_words,
    lm_windows,
    tokenize,
)
from clusterfed.errors import ConfigError, DataError

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


_AG_HOME = ("Zhang et al.'s ag_news_csv archive (https://s3.amazonaws.com/fast-ai-nlp/"
            "ag_news_csv.tgz)")

# Content md5s as torchtext's AG_NEWS checks them (test.csv agrees with the copy in
# ../shared/data).
FILES: dict[str, RemoteFile] = {
    "ag_news/train.csv": RemoteFile(
        "ag_news/train.csv", "b1a00f826fdfbd249f79597b59e1dc12",
        ("https://raw.githubusercontent.com/mhjabreel/CharCnn_Keras/master/data/ag_news_csv/"
         "train.csv",)),
    "ag_news/test.csv": RemoteFile(
        "ag_news/test.csv", "d52ea96a97a2d943681189a97654912d",
        ("https://raw.githubusercontent.com/mhjabreel/CharCnn_Keras/master/data/ag_news_csv/"
         "test.csv",)),
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
    spec = FILES[f"ag_news/{name}"]
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
    seq_len = positive_option("seq_len", seq_len)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 0:
        raise ConfigError(f"data.vocab_size must be an integer >= 0, got {vocab_size!r}")
    if train_from_test is not None:
        train_from_test = fraction_option("train_from_test", train_from_test)
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
