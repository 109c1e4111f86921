"""Text readers: the word and character vocabularies, AG News LM rows, LEAF's Shakespeare."""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest

from clusterfed.data import load_dataset
from clusterfed.data.files import RemoteFile
from clusterfed.data.text import ag_news, shakespeare
from clusterfed.data.text.ag_news import clean_ag_news, parse_ag_news_csv
from clusterfed.data.text.shakespeare import split_samples
from clusterfed.data.text.tokens import (
    ALL_LETTERS,
    BOS,
    EOS,
    IGNORE_INDEX,
    PAD,
    SPECIALS,
    UNK,
    UNKNOWN_CHAR_ID,
    build_vocab,
    char_ids,
    char_rows,
    encode_words,
    leaf_clean,
    lm_windows,
    next_char_windows,
    tokenize,
)
from clusterfed.errors import ConfigError, DataError

pytestmark = pytest.mark.fast


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def register(monkeypatch: pytest.MonkeyPatch, relpath: str, content: bytes,
             urls: tuple[str, ...] = ()) -> str:
    """Point the checksum table at generated content; return its md5."""
    digest = md5(content)
    table = ag_news.FILES if relpath.startswith("ag_news/") else shakespeare.FILES
    monkeypatch.setitem(table, relpath, RemoteFile(relpath, digest, urls))
    return digest


def ag_csv(rows: list[tuple[int, str, str]]) -> bytes:
    """The official layout: every field quoted, an inner quote doubled, LF line ends."""
    def quote(field: str) -> str:
        return '"' + field.replace('"', '""') + '"'

    return "".join(f"{quote(str(c))},{quote(t)},{quote(d)}\n" for c, t, d in rows).encode()


def leaf_reference(text: str, n: int) -> tuple[list[str], list[str]]:
    """LEAF's shake_utils procedure, written out plainly to check the vectorised reader."""
    t = text.replace("\n", " ")
    while "  " in t:
        t = t.replace("  ", " ")
    return [t[i:i + n] for i in range(len(t) - n)], [t[i + n] for i in range(len(t) - n)]


def decode(ids: np.ndarray) -> str:
    return "".join(ALL_LETTERS[i] for i in ids)


# ---------------------------------------------------------------- tokenizer and vocabulary


def test_tokenize_by_hand() -> None:
    assert tokenize("It's 3:30pm, café_au lait!") == ["it", "s", "3", "30pm", "café", "au",
                                                      "lait"]
    assert tokenize("  U.S. -- GDP\tup 2.5%\n") == ["u", "s", "gdp", "up", "2", "5"]
    assert tokenize("") == [] and tokenize("--- ... ___") == []


def test_clean_ag_news_markup() -> None:
    # A lone backslash is a line break; "\n" is not an escape ("social\network").
    assert clean_ag_news("social\\network, \\no end") == "social network,  no end"
    assert clean_ag_news("over \\$1 billion") == "over  $1 billion"
    # "&" of an entity written as a space, or kept.
    assert clean_ag_news("it #39;s the  #36;10 deal") == "it's the $10 deal"
    assert clean_ag_news("say  quot;no quot; now") == 'say "no" now'
    assert clean_ag_news("Johnson  amp; Johnson") == "Johnson & Johnson"
    # Tags spelled with entities are removed; other words ending in ";" are kept.
    assert clean_ag_news("Dell Inc. &lt;DELL.O&gt;, said") == "Dell Inc.  , said"
    assert clean_ag_news("a forecast; then") == "a forecast; then"
    assert tokenize(clean_ag_news("it #39;s")) == ["it", "s"]


def test_build_vocab_frequency_then_alphabet() -> None:
    docs = [["b", "a", "c", "a"], ["c", "b", "d"], ["e"]]
    assert build_vocab(docs, 2) == [*SPECIALS, "a", "b"]  # a, b, c all twice: a and b first
    assert build_vocab(docs, 3) == [*SPECIALS, "a", "b", "c"]
    assert build_vocab(docs, 100) == [*SPECIALS, "a", "b", "c", "d", "e"]
    assert build_vocab(docs, 0) == list(SPECIALS)
    assert build_vocab([["<unk>", "z", "z"]], 5) == [*SPECIALS, "z"]
    assert SPECIALS.index("<pad>") == PAD == 0 and SPECIALS.index("<unk>") == UNK
    assert SPECIALS.index("<bos>") == BOS and SPECIALS.index("<eos>") == EOS


def test_encode_words_frames_and_unknowns() -> None:
    index = {w: i for i, w in enumerate([*SPECIALS, "oil", "up"])}
    ids = encode_words(["up", "zebra", "oil"], index)
    assert ids.dtype == np.int64
    assert ids.tolist() == [BOS, 5, UNK, 4, EOS]
    assert encode_words([], index).tolist() == [BOS, EOS]


def test_lm_windows_by_hand() -> None:
    x, y = lm_windows(np.array([2, 5, 6, 7, 3]), 2)
    assert x.tolist() == [[2, 5], [6, 7]]
    assert y.tolist() == [[5, 6], [7, 3]]
    x, y = lm_windows(np.array([2, 5, 6, 3]), 2)
    assert x.tolist() == [[2, 5], [6, PAD]]
    assert y.tolist() == [[5, 6], [3, IGNORE_INDEX]]
    x, y = lm_windows(np.array([2, 3]), 4)
    assert x.tolist() == [[2, PAD, PAD, PAD]] and y.tolist() == [[3] + [IGNORE_INDEX] * 3]
    x, y = lm_windows(np.array([2]), 4)
    assert x.shape == (0, 4) and y.shape == (0, 4)


@pytest.mark.parametrize("seq_len", [1, 3, 7, 35])
def test_lm_windows_shift_and_cover(seq_len: int) -> None:
    stream = np.random.default_rng(seq_len).integers(4, 50, 40)
    x, y = lm_windows(stream, seq_len)
    real = y != IGNORE_INDEX
    np.testing.assert_array_equal(x == PAD, ~real)
    # Inside a row the targets are the inputs shifted by one ...
    np.testing.assert_array_equal(y[:, :-1][real[:, 1:]], x[:, 1:][real[:, 1:]])
    # ... across rows the last target is the next row's first input ...
    np.testing.assert_array_equal(y[:-1, -1], x[1:, 0])
    # ... and every token after the first is a target exactly once, in order.
    np.testing.assert_array_equal(y[real], stream[1:])
    np.testing.assert_array_equal(x[real], stream[:-1])


# ---------------------------------------------------------------- characters, LEAF samples


def test_all_letters_is_leafs() -> None:
    assert len(ALL_LETTERS) == 80 and len(set(ALL_LETTERS)) == 80
    assert ALL_LETTERS[:3] == "\n !" and ALL_LETTERS[-1] == "}" and UNKNOWN_CHAR_ID == 79
    assert char_ids("\n !A a}").tolist() == [0, 1, 2, 25, 1, 53, 79]  # "?" is 24
    # '$', 'é' and a tab are not in LEAF's alphabet: where its find() == -1 lands.
    assert char_ids("$é\t").tolist() == [79, 79, 79]
    assert char_ids("").shape == (0,)
    assert decode(char_ids("To be, or not: 'tis [2]?")) == "To be, or not: 'tis [2]?"


def test_leaf_clean_by_hand() -> None:
    assert leaf_clean("To be,\n  or not\n\nto be") == "To be, or not to be"
    assert leaf_clean("  lead\nand trail \n") == " lead and trail "
    assert leaf_clean("one space stays") == "one space stays"


def test_next_char_windows_by_hand() -> None:
    ids = char_ids("abcdef")
    x, y = next_char_windows(ids, 3)
    assert [decode(r) for r in x] == ["abc", "bcd", "cde"] and decode(y) == "def"
    x, y = next_char_windows(ids, 3, stride=2)
    assert [decode(r) for r in x] == ["abc", "cde"] and decode(y) == "df"
    x, y = next_char_windows(ids, 6)
    assert x.shape == (0, 6) and y.shape == (0,)
    assert char_rows(ids, 5).shape == (1, 6)


def test_split_samples_counts_and_modes() -> None:
    rng = np.random.default_rng(0)
    train, test = split_samples(10, 0.9, "positional", rng)
    assert train.tolist() == list(range(9)) and test.tolist() == [9]
    assert [a.tolist() for a in split_samples(2, 0.9, "positional", rng)] == [[0], [1]]
    assert [a.tolist() for a in split_samples(3, 0.5, "positional", rng)] == [[0], [1, 2]]
    assert [a.tolist() for a in split_samples(5, 0.1, "positional", rng)] == [[0], [1, 2, 3, 4]]
    a = split_samples(50, 0.9, "random", np.random.default_rng(3))
    b = split_samples(50, 0.9, "random", np.random.default_rng(3))
    c = split_samples(50, 0.9, "random", np.random.default_rng(4))
    assert len(a[0]) == 45 and len(a[1]) == 5
    assert sorted(a[0].tolist() + a[1].tolist()) == list(range(50))
    assert all(np.all(np.diff(part) > 0) for part in a)
    np.testing.assert_array_equal(a[0], b[0])
    assert not np.array_equal(a[0], c[0])
    with pytest.raises(ValueError):
        split_samples(1, 0.9, "positional", rng)


# ---------------------------------------------------------------- AG News, generated files

TRAIN_ROWS = [
    (1, "Oil up", "Oil up\\again  #36;5"),                      # World
    (2, 'Cup "final"', "Cup final won &lt;b&gt;today&lt;/b&gt;"),  # Sports
    (4, "Web", "web it #39;s web"),                              # Sci/Tech
]
TEST_ROWS = [(3, "Up", "oil zebra")]  # Business


@pytest.fixture
def fake_ag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "root"
    (root / "ag_news").mkdir(parents=True)
    for name, rows in (("train.csv", TRAIN_ROWS), ("test.csv", TEST_ROWS)):
        content = ag_csv(rows)
        (root / "ag_news" / name).write_bytes(content)
        register(monkeypatch, f"ag_news/{name}", content)
    return root


def test_parse_ag_news_csv_quotes_and_escapes() -> None:
    data = ag_csv([(2, 'He said "go"', "a\\b, c"), (4, "", 'x ""y""')])
    labels, texts = parse_ag_news_csv(data, "f.csv")
    assert labels.tolist() == [1, 3] and labels.dtype == np.int64
    assert texts == ['He said "go" a\\b, c', ' x ""y""']


@pytest.mark.parametrize("bad, where", [
    (b'"5","t","d"\n', "line 1"),
    (b'"1","t","d"\n"2","only two"\n', "line 2"),
    (b'"1","t","d"x\n', "line 1"),
    (b'"1","t","\xff"\n', "UTF-8"),
])
def test_parse_ag_news_csv_rejects(bad: bytes, where: str) -> None:
    with pytest.raises(DataError, match=rf"my\.csv.*{where}|{where}.*my\.csv"):
        parse_ag_news_csv(bad, "my.csv")


def test_ag_news_by_hand(fake_ag: Path) -> None:
    ds = load_dataset("ag_news", fake_ag, seq_len=3, vocab_size=4)
    # Train counts: web 3; cup, final, oil, up 2 each (alphabetical: cup, final, oil).
    assert ds.meta["vocab"] == [*SPECIALS, "web", "cup", "final", "oil"]
    assert ds.n_classes == 8 and ds.name == "ag_news"
    assert ds.meta["groups"] == ["World", "Sports", "Business", "Sci/Tech"]
    assert ds.meta["ignore_index"] == IGNORE_INDEX
    # "Oil up Oil up again $5": oil=7, every other word unknown.
    assert ds.train_x[:3].tolist() == [[BOS, 7, UNK], [7, UNK, UNK], [UNK, PAD, PAD]]
    assert ds.train_y[:3].tolist() == [[7, UNK, 7], [UNK, UNK, UNK],
                                       [EOS, IGNORE_INDEX, IGNORE_INDEX]]
    # 'Cup "final" Cup final won today' (the tags are gone): 6 words, 7 targets, 3 rows.
    assert ds.train_x[3].tolist() == [BOS, 5, 6] and ds.train_y[5].tolist()[0] == EOS
    # "Web web it s web": 5 words, 6 targets, 2 rows.
    assert ds.train_y[6:].tolist() == [[4, 4, UNK], [UNK, 4, EOS]]
    assert ds.train_groups.tolist() == [0, 0, 0, 1, 1, 1, 3, 3]
    assert ds.meta["train_docs"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2]
    # The test article uses the training vocabulary: "up" and "zebra" are unknown there.
    assert ds.test_x.tolist() == [[BOS, UNK, 7], [UNK, PAD, PAD]]
    assert ds.test_y.tolist() == [[UNK, 7, UNK], [EOS, IGNORE_INDEX, IGNORE_INDEX]]
    assert ds.test_groups.tolist() == [2, 2] and ds.meta["test_docs"].tolist() == [0, 0]
    for array in (ds.train_x, ds.train_y, ds.test_x, ds.test_y, ds.train_groups):
        assert array.dtype == np.int64
    assert ds.input_shape == (3,)


def test_ag_news_drop_partial(fake_ag: Path) -> None:
    ds = load_dataset("ag_news", fake_ag, seq_len=3, vocab_size=4, drop_partial=True)
    assert (ds.train_y != IGNORE_INDEX).all() and (ds.train_x != PAD).all()
    assert ds.train_groups.tolist() == [0, 0, 1, 1, 3, 3] and len(ds.test_y) == 1


def test_ag_news_windows_stay_inside_articles(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(30)]
    rows = [(int(rng.integers(1, 5)), " ".join(rng.choice(words, rng.integers(0, 4))),
             " ".join(rng.choice(words, rng.integers(0, 25)))) for _ in range(60)]
    root = tmp_path / "root"
    (root / "ag_news").mkdir(parents=True)
    for name in ("train.csv", "test.csv"):
        (root / "ag_news" / name).write_bytes(ag_csv(rows))
        register(monkeypatch, f"ag_news/{name}", ag_csv(rows))
    ds = load_dataset("ag_news", root, seq_len=4, vocab_size=100)
    index = {w: i for i, w in enumerate(ds.meta["vocab"])}
    docs = ds.meta["train_docs"]
    assert np.all(np.diff(docs) >= 0) and set(docs.tolist()) == set(range(60))
    for doc, (topic, title, desc) in enumerate(rows):
        mine = docs == doc
        assert (ds.train_groups[mine] == topic - 1).all()  # one topic per row
        x, y = ds.train_x[mine], ds.train_y[mine]
        stream = encode_words(tokenize(f"{title} {desc}"), index)
        # The article's rows hold its stream and nothing else: one <bos>, one <eos>.
        np.testing.assert_array_equal(x[x != PAD], stream[:-1])
        np.testing.assert_array_equal(y[y != IGNORE_INDEX], stream[1:])
        assert (x == BOS).sum() == 1 and x[0, 0] == BOS and (y == EOS).sum() == 1


def test_ag_news_train_from_test(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [(1 + i % 4, f"title {i}", f"story number {i} about topic {i % 4}")
            for i in range(40)]
    root = tmp_path / "root"
    (root / "ag_news").mkdir(parents=True)
    (root / "ag_news" / "test.csv").write_bytes(ag_csv(rows))
    register(monkeypatch, "ag_news/test.csv", ag_csv(rows))
    ds = load_dataset("ag_news", root, train_from_test=0.8, seed=1)  # no train.csv needed
    train_docs, test_docs = set(ds.meta["train_docs"]), set(ds.meta["test_docs"])
    assert len(train_docs) == 32 and len(test_docs) == 8
    assert train_docs.isdisjoint(test_docs) and train_docs | test_docs == set(range(40))
    for topic in range(4):  # stratified: 8 + 2 articles of each topic
        assert sum(1 for d in train_docs if d % 4 == topic) == 8
    for docs, groups in ((ds.meta["train_docs"], ds.train_groups),
                         (ds.meta["test_docs"], ds.test_groups)):
        np.testing.assert_array_equal(groups, docs % 4)
    # Only training articles make the vocabulary.
    assert all(f"{d}" not in ds.meta["vocab"] for d in test_docs if d >= 4)
    again = load_dataset("ag_news", root, train_from_test=0.8, seed=1)
    np.testing.assert_array_equal(again.train_x, ds.train_x)
    other = load_dataset("ag_news", root, train_from_test=0.8, seed=2)
    assert set(other.meta["train_docs"]) != train_docs


def test_ag_news_missing_train_names_file_md5_and_way_out(fake_ag: Path) -> None:
    path = fake_ag / "ag_news" / "train.csv"
    path.unlink()
    with pytest.raises(DataError) as info:
        load_dataset("ag_news", fake_ag)
    message = str(info.value)
    assert "missing data file" in message and str(path) in message
    assert ag_news.FILES["ag_news/train.csv"].content_md5 in message
    assert "CLUSTERFED_DATA" in message and "train_from_test" in message
    assert len(message.splitlines()) == 1


def test_ag_news_corrupt_file(fake_ag: Path) -> None:
    path = fake_ag / "ag_news" / "test.csv"
    changed = ag_csv([(3, "Up", "oil zebras")])
    path.write_bytes(changed)
    with pytest.raises(DataError) as info:
        load_dataset("ag_news", fake_ag)
    message = str(info.value)
    assert "corrupt data file" in message and str(path) in message
    assert md5(changed) in message
    assert ag_news.FILES["ag_news/test.csv"].content_md5 in message


def test_ag_news_official_checksums() -> None:
    files = ag_news.FILES
    assert files["ag_news/test.csv"].content_md5 == "d52ea96a97a2d943681189a97654912d"
    assert files["ag_news/train.csv"].content_md5 == "b1a00f826fdfbd249f79597b59e1dc12"
    assert ag_news.AG_NEWS_ARCHIVE_URLS[0].endswith("/ag_news_csv.tgz")


def make_tgz(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))


def test_ag_news_download_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    contents = {"train.csv": ag_csv(TRAIN_ROWS), "test.csv": ag_csv(TEST_ROWS)}
    make_tgz(mirror / "ag_news_csv.tgz",
             {f"ag_news_csv/{name}": data for name, data in contents.items()})
    for name, data in contents.items():
        register(monkeypatch, f"ag_news/{name}", data)
    monkeypatch.setattr(ag_news, "AG_NEWS_ARCHIVE_URLS",
                        ((mirror / "ag_news_csv.tgz").as_uri(),))
    root = tmp_path / "root"
    with pytest.raises(DataError, match="missing data file"):
        load_dataset("ag_news", root)
    ds = load_dataset("ag_news", root, download=True, seq_len=3, vocab_size=4)
    for name, data in contents.items():
        assert (root / "ag_news" / name).read_bytes() == data
    assert ds.meta["vocab"][4:] == ["web", "cup", "final", "oil"]
    assert not list(root.rglob("*.part"))


def test_ag_news_download_falls_back_to_csv_mirror(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    content = ag_csv(TEST_ROWS * 8)
    (mirror / "test.csv").write_bytes(content)
    register(monkeypatch, "ag_news/test.csv", content, ((mirror / "test.csv").as_uri(),))
    monkeypatch.setattr(ag_news, "AG_NEWS_ARCHIVE_URLS",
                        ((mirror / "absent.tgz").as_uri(),))
    root = tmp_path / "root"
    ds = load_dataset("ag_news", root, download=True, train_from_test=0.5)
    assert (root / "ag_news" / "test.csv").read_bytes() == content
    assert len(set(ds.meta["train_docs"])) == 4
    # Neither source has train.csv: one error naming both attempts.
    with pytest.raises(DataError, match=r"absent\.tgz.*could not download train\.csv"):
        load_dataset("ag_news", root, download=True)


@pytest.mark.parametrize("options, key", [
    ({"seq_len": 0}, "seq_len"),
    ({"vocab_size": -1}, "vocab_size"),
    ({"train_from_test": 1.0}, "train_from_test"),
    ({"train_from_test": True}, "train_from_test"),
    ({"bptt": 35}, "bptt"),
])
def test_ag_news_bad_options(fake_ag: Path, options: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"data\.{key}"):
        load_dataset("ag_news", fake_ag, **options)


# ---------------------------------------------------------------- Shakespeare, generated files

ROMEO = ("But, soft! what light through yonder window breaks?\n"
         "    It is the east, and Juliet is the sun.\n" * 3)
KING = "Now is the winter of our discontent $ made glorious summer,\n  by this sun of York. " * 2
NURSE = "Faith, I can tell how to answer.\n"  # under 80 characters: no sample


@pytest.fixture
def leaf_raw(tmp_path: Path) -> Path:
    """LEAF's data/raw_data layout with three roles, one without samples."""
    base = tmp_path / "root" / "shakespeare" / "raw_data"
    folder = base / "by_play_and_character"
    folder.mkdir(parents=True)
    texts = {"ROMEO_AND_JULIET_ROMEO": ROMEO, "ROMEO_AND_JULIET_NURSE": NURSE,
             "KING_RICHARD_III_GLOUCESTER": KING}
    for role, content in texts.items():
        (folder / f"{role}.txt").write_text(content, encoding="utf-8")
    plays = {"ROMEO_AND_JULIET_ROMEO": "ROMEO AND JULIET", "ROMEO_AND_JULIET_NURSE":
             "ROMEO AND JULIET", "KING_RICHARD_III_GLOUCESTER": "KING RICHARD III",
             "KING_RICHARD_III_GHOST": "KING RICHARD III"}  # a role without a file, as LEAF's
    (base / "users_and_plays.json").write_text(json.dumps(plays))
    return tmp_path / "root"


def test_leaf_raw_samples_are_leafs(leaf_raw: Path) -> None:
    ds = load_dataset("shakespeare", leaf_raw)
    assert ds.name == "shakespeare" and ds.n_classes == 80
    assert ds.meta["groups"] == ["KING_RICHARD_III_GLOUCESTER", "ROMEO_AND_JULIET_ROMEO"]
    assert ds.meta["plays"] == ["KING RICHARD III", "ROMEO AND JULIET"]
    assert ds.meta["vocab"] == list(ALL_LETTERS)
    assert ds.train_x.shape[1:] == (80,) and ds.train_y.ndim == 1
    for group, text in enumerate([KING, ROMEO]):
        xs, ys = leaf_reference(text, 80)
        n_train = int(0.9 * len(ys))
        for x, y, g, part in ((ds.train_x, ds.train_y, ds.train_groups, slice(0, n_train)),
                              (ds.test_x, ds.test_y, ds.test_groups, slice(n_train, None))):
            mine = g == group
            got = [decode(row) for row in x[mine]]
            # '$' is outside ALL_LETTERS: it reads back as '}'.
            assert got == [s.replace("$", "}") for s in xs[part]]
            assert decode(y[mine]) == "".join(ys[part]).replace("$", "}")


def test_leaf_raw_options(leaf_raw: Path) -> None:
    full = load_dataset("shakespeare", leaf_raw)
    n_king = int((full.train_groups == 0).sum() + (full.test_groups == 0).sum())
    strided = load_dataset("shakespeare", leaf_raw, stride=7)
    assert (strided.train_groups == 0).sum() + (strided.test_groups == 0).sum() == \
        -(-n_king // 7)
    np.testing.assert_array_equal(strided.train_x[0], full.train_x[0])
    np.testing.assert_array_equal(strided.train_x[1], full.train_x[7])
    # min_samples drops the shorter role (KING has fewer samples than ROMEO).
    n_romeo = len(leaf_reference(ROMEO, 80)[1])
    assert n_king < n_romeo
    only = load_dataset("shakespeare", leaf_raw, min_samples=n_king + 1)
    assert only.meta["groups"] == ["ROMEO_AND_JULIET_ROMEO"]
    assert set(only.train_groups.tolist()) == {0}
    one = load_dataset("shakespeare", leaf_raw, max_roles=1, seed=0)
    assert len(one.meta["groups"]) == 1 and set(one.test_groups.tolist()) == {0}
    picks = {load_dataset("shakespeare", leaf_raw, max_roles=1, seed=s).meta["groups"][0]
             for s in range(8)}
    assert len(picks) == 2  # a seeded draw, not always the first name
    shorter = load_dataset("shakespeare", leaf_raw, seq_len=10, train_fraction=0.5)
    assert shorter.train_x.shape[1] == 10
    assert abs(len(shorter.train_y) - len(shorter.test_y)) <= 2


def test_leaf_raw_random_split(leaf_raw: Path) -> None:
    positional = load_dataset("shakespeare", leaf_raw)
    a = load_dataset("shakespeare", leaf_raw, split="random", seed=5)
    b = load_dataset("shakespeare", leaf_raw, split="random", seed=5)
    np.testing.assert_array_equal(a.test_x, b.test_x)
    assert len(a.train_y) == len(positional.train_y)
    assert not np.array_equal(a.test_x, positional.test_x)
    rows = {r.tobytes() for r in np.concatenate([a.train_x, a.test_x])}
    assert rows == {r.tobytes() for r in np.concatenate([positional.train_x,
                                                         positional.test_x])}


def test_leaf_raw_missing_and_malformed(leaf_raw: Path) -> None:
    base = leaf_raw / "shakespeare" / "raw_data"
    with pytest.raises(DataError, match=r"missing LEAF Shakespeare data.*elsewhere.*raw_dir"):
        load_dataset("shakespeare", leaf_raw, raw_dir="elsewhere")
    with pytest.raises(DataError, match="cannot be downloaded"):
        load_dataset("shakespeare", leaf_raw, raw_dir="elsewhere", download=True)
    (base / "by_play_and_character" / "HAMLET_HAMLET.txt").write_text("To be, or not " * 10)
    with pytest.raises(DataError, match=r"HAMLET_HAMLET is not in .*users_and_plays\.json"):
        load_dataset("shakespeare", leaf_raw)
    (base / "by_play_and_character" / "HAMLET_HAMLET.txt").write_bytes(b"\xff\xfe bad")
    (base / "users_and_plays.json").write_text(json.dumps({"HAMLET_HAMLET": "HAMLET"}))
    with pytest.raises(DataError, match=r"users_and_plays|not UTF-8"):
        load_dataset("shakespeare", leaf_raw)
    (base / "users_and_plays.json").write_text("{not json")
    with pytest.raises(DataError, match=r"users_and_plays\.json is not a valid json file"):
        load_dataset("shakespeare", leaf_raw)
    (base / "users_and_plays.json").unlink()
    with pytest.raises(DataError, match="missing LEAF Shakespeare data"):
        load_dataset("shakespeare", leaf_raw)


def leaf_json_file(users: dict[str, tuple[list[str], list[str]]], plays: list[str]) -> str:
    return json.dumps({"users": list(users), "hierarchies": plays,
                       "num_samples": [len(y) for _, y in users.values()],
                       "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}})


@pytest.fixture
def leaf_json(tmp_path: Path) -> Path:
    base = tmp_path / "root" / "shakespeare"
    (base / "train").mkdir(parents=True)
    (base / "test").mkdir()
    xs, ys = leaf_reference(ROMEO, 80)
    kx, ky = leaf_reference(KING, 80)
    (base / "train" / "all_data_train_9.json").write_text(leaf_json_file(
        {"ROMEO": (xs[:100], ys[:100]), "KING": (kx[:20], ky[:20])}, ["RJ", "R3"]))
    (base / "test" / "all_data_test_9.json").write_text(leaf_json_file(
        {"ROMEO": (xs[100:], ys[100:]), "KING": (kx[20:25], ky[20:25]),
         "GHOST": (kx[:3], ky[:3])}, ["RJ", "R3", "R3"]))
    return tmp_path / "root"


def test_leaf_json(leaf_json: Path) -> None:
    ds = load_dataset("shakespeare", leaf_json, source="leaf_json")
    # GHOST has no training samples: dropped. Names sorted: KING 0, ROMEO 1.
    assert ds.meta["groups"] == ["KING", "ROMEO"] and ds.meta["plays"] == ["R3", "RJ"]
    assert ds.train_groups.tolist() == [0] * 20 + [1] * 100
    assert ds.test_groups.tolist() == [0] * 5 + [1] * (len(leaf_reference(ROMEO, 80)[1]) - 100)
    xs, ys = leaf_reference(ROMEO, 80)
    assert [decode(r) for r in ds.train_x[20:]] == xs[:100]
    assert decode(ds.train_y[20:]) == "".join(ys[:100])
    assert decode(ds.test_x[5]) == xs[100]
    assert ds.train_x.dtype == np.int64 and ds.train_y.dtype == np.int64
    fewer = load_dataset("shakespeare", leaf_json, source="leaf_json", min_samples=26)
    assert fewer.meta["groups"] == ["ROMEO"]


def test_leaf_json_errors(leaf_json: Path) -> None:
    with pytest.raises(ConfigError, match=r"data\.stride"):
        load_dataset("shakespeare", leaf_json, source="leaf_json", stride=2)
    with pytest.raises(DataError, match="20-character strings"):
        load_dataset("shakespeare", leaf_json, source="leaf_json", seq_len=20)
    path = leaf_json / "shakespeare" / "test" / "all_data_test_9.json"
    path.write_text(json.dumps({"users": ["ROMEO"], "user_data": {"ROMEO": {"x": ["a" * 80],
                                                                           "y": ["bc"]}}}))
    with pytest.raises(DataError, match=r"all_data_test_9\.json: role ROMEO"):
        load_dataset("shakespeare", leaf_json, source="leaf_json")
    path.write_text(json.dumps([1, 2]))
    with pytest.raises(DataError, match=r"all_data_test_9\.json is not a LEAF json file"):
        load_dataset("shakespeare", leaf_json, source="leaf_json")
    path.unlink()
    with pytest.raises(DataError, match=r"missing LEAF Shakespeare data: no json files in .*test"):
        load_dataset("shakespeare", leaf_json, source="leaf_json")


TINY = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\n"
        "Speak, speak.\n\n") * 6


@pytest.fixture
def tiny_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "root"
    (root / "shakespeare").mkdir(parents=True)
    (root / "shakespeare" / "tinyshakespeare.txt").write_text(TINY)
    register(monkeypatch, "shakespeare/tinyshakespeare.txt", TINY.encode())
    return root


def test_tiny(tiny_root: Path) -> None:
    ds = load_dataset("shakespeare", tiny_root, source="tiny")
    xs, ys = leaf_reference(TINY, 80)
    n_train = int(0.9 * len(ys))
    assert ds.meta["groups"] == ["tinyshakespeare"] and ds.meta["source"] == "tiny"
    assert len(ds.train_y) == n_train and len(ds.test_y) == len(ys) - n_train
    assert (ds.train_groups == 0).all() and (ds.test_groups == 0).all()
    assert [decode(r) for r in ds.test_x] == xs[n_train:]
    assert decode(ds.train_y) == "".join(ys[:n_train])


def test_tiny_missing_corrupt_and_download(tiny_root: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    path = tiny_root / "shakespeare" / "tinyshakespeare.txt"
    path.write_text(TINY.replace("speak", "Speak"))
    with pytest.raises(DataError) as info:
        load_dataset("shakespeare", tiny_root, source="tiny")
    assert "corrupt data file" in str(info.value) and md5(TINY.encode()) in str(info.value)
    path.unlink()
    with pytest.raises(DataError) as info:
        load_dataset("shakespeare", tiny_root, source="tiny")
    message = str(info.value)
    assert "missing data file" in message and str(path) in message
    assert md5(TINY.encode()) in message and "char-rnn" in message
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "input.txt").write_text(TINY)
    register(monkeypatch, "shakespeare/tinyshakespeare.txt", TINY.encode(),
             ((mirror / "input.txt").as_uri(),))
    ds = load_dataset("shakespeare", tiny_root, source="tiny", download=True)
    assert path.read_text() == TINY and len(ds.train_y) > 0
    assert shakespeare.FILES["shakespeare/tinyshakespeare.txt"].content_md5 != \
        "6fb458f1232090904fb40fe944165e91"  # the patch is in force; the real one is below


def test_tiny_official_checksum_and_url() -> None:
    spec = shakespeare.FILES["shakespeare/tinyshakespeare.txt"]
    assert spec.content_md5 == "6fb458f1232090904fb40fe944165e91"
    assert spec.urls[0].endswith("karpathy/char-rnn/master/data/tinyshakespeare/input.txt")


@pytest.mark.parametrize("options, key", [
    ({"source": "gutenberg"}, "source"),
    ({"split": "sideways"}, "split"),
    ({"train_fraction": 0}, "train_fraction"),
    ({"stride": 0}, "stride"),
    ({"max_roles": 0}, "max_roles"),
    ({"min_samples": -1}, "min_samples"),
    ({"roles": 3}, "roles"),
])
def test_shakespeare_bad_options(leaf_raw: Path, options: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"data\.{key}"):
        load_dataset("shakespeare", leaf_raw, **options)


def test_no_role_has_enough_samples(leaf_raw: Path) -> None:
    with pytest.raises(DataError, match="no Shakespeare role"):
        load_dataset("shakespeare", leaf_raw, min_samples=10**6)


# ---------------------------------------------------------------- the real files


@pytest.mark.shared_data
def test_real_ag_news(shared_data: Path) -> None:
    data = (shared_data / "ag_news" / "test.csv").read_bytes()
    assert md5(data) == ag_news.FILES["ag_news/test.csv"].content_md5
    labels, texts = parse_ag_news_csv(data, "test.csv")
    assert len(texts) == 7600 and np.bincount(labels).tolist() == [1900] * 4
    ds = load_dataset("ag_news", shared_data, train_from_test=0.8)  # verifies the md5
    train_docs, test_docs = np.unique(ds.meta["train_docs"]), np.unique(ds.meta["test_docs"])
    assert len(train_docs) == 6080 and len(test_docs) == 1520
    assert np.bincount(labels[train_docs]).tolist() == [1520] * 4
    assert ds.n_classes == 10004 and ds.train_x.shape[1] == 35
    for x, y in ((ds.train_x, ds.train_y), (ds.test_x, ds.test_y)):
        real = y != IGNORE_INDEX
        np.testing.assert_array_equal(x == PAD, ~real)
        np.testing.assert_array_equal(y[:, :-1][real[:, 1:]], x[:, 1:][real[:, 1:]])
        assert (x[:, 0] != PAD).all() and x.max() < ds.n_classes
    np.testing.assert_array_equal(ds.train_groups, labels[ds.meta["train_docs"]])
    assert np.bincount(ds.test_groups).size == 4
    assert {"the", "oil", "game", "microsoft"} <= set(ds.meta["vocab"])
    assert "39" not in ds.meta["vocab"][:200]  # the " #39;" apostrophes were decoded
    with pytest.raises(DataError, match="train_from_test"):
        load_dataset("ag_news", shared_data)  # the training split is not on this machine


@pytest.mark.shared_data
def test_real_tiny_shakespeare(shared_data: Path) -> None:
    ds = load_dataset("shakespeare", shared_data, source="tiny", stride=100)  # md5 checked
    text = (shared_data / "shakespeare" / "tinyshakespeare.txt").read_text()
    n = -(-(len(leaf_clean(text)) - 80) // 100)
    assert len(ds.train_y) + len(ds.test_y) == n and len(ds.train_y) == int(0.9 * n)
    assert decode(ds.train_x[0]).startswith("First Citizen: Before we proceed")


@pytest.mark.shared_data
def test_real_leaf_partial(shared_data: Path) -> None:
    base = shared_data / "shakespeare" / "leaf_partial"
    folder = base / "by_play_and_character"
    # At LEAF's stride 1, 563 roles have samples (the data README's count).
    with_samples = sum(len(char_rows(char_ids(leaf_clean(p.read_text())), 80)) > 0
                       for p in folder.glob("*.txt"))
    assert with_samples == 563
    ds = load_dataset("shakespeare", shared_data, raw_dir="leaf_partial", stride=20)
    names = ds.meta["groups"]
    assert len(names) == 551  # roles with at least 2 samples at stride 20
    assert set(np.unique(ds.train_groups)) == set(np.unique(ds.test_groups)) == \
        set(range(len(names)))
    plays = json.loads((base / "users_and_plays.json").read_text())
    assert ds.meta["plays"] == [plays[n] for n in names]
    # 107,263 rows at stride 20, less the 12 of roles left with one row
    assert len(ds.train_y) + len(ds.test_y) == 107251
    assert ds.train_x.max() < 80 and re.fullmatch(r"[A-Z_]+", names[0])
