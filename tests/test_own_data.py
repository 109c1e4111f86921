"""A client's own data in every format, and `clusterfed scenario export` writing them.

Exported scenarios must read back to the scenario's arrays, float-equal and in order, so that a
run on the folders is the run on the scenario; every refusal names what is wrong.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import cli
from PIL import Image

from clusterfed import config as cfg
from clusterfed.data import own
from clusterfed.data.export import export_federation
from clusterfed.data.own import OwnDataOptions, federation_from_folders, load_client_data
from clusterfed.data.scenarios import ClientData, Federation
from clusterfed.errors import ConfigError, DataError
from clusterfed.sim.simulation import build_federation_for

# quickstart (digits, label swap) at a size that runs in a second.
SMALL = ["scenario.clients=4", "scenario.clusters=2"]
RUN = ["train.rounds=2", "train.local_epochs=1", "eval.every=1", "run.progress=false",
       "run.threads=1"]


@pytest.fixture(scope="module")
def federation() -> Federation:
    return build_federation_for(cfg.resolve("quickstart", SMALL))


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, federation: Federation
             ) -> dict[str, Path]:
    """quickstart written in each format by the library (the CLI is tested on its own)."""
    roots = {}
    for fmt in ("npz", "images", "csv"):
        roots[fmt] = tmp_path_factory.mktemp(f"export-{fmt}")
        export_federation(federation, roots[fmt], fmt)
    return roots


def assert_same_clients(got: Federation, want: Federation, shape: tuple[int, ...] | None = None
                        ) -> None:
    assert got.num_clients == want.num_clients
    for k, (a, b) in enumerate(zip(got.clients, want.clients, strict=True)):
        for name in ("train_x", "train_y", "test_x", "test_y"):
            have, expected = getattr(a, name), getattr(b, name)
            if shape is not None and name.endswith("_x"):
                expected = expected.reshape(len(expected), *shape)
            assert have.dtype == expected.dtype, (k, name)
            np.testing.assert_array_equal(have, expected, err_msg=f"client {k} {name}")


def save_png(path: Path, pixels: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels.astype(np.uint8)).save(path)


def grey(value: int, size: tuple[int, int] = (8, 8)) -> np.ndarray:
    return np.full(size, value, dtype=np.uint8)


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("fmt", ["npz", "images", "csv"])
def test_export_reads_back_to_the_scenarios_arrays(capsys, tmp_path, federation, fmt):
    out = tmp_path / "fed"
    code, stdout, err = cli(capsys, "scenario", "export", "quickstart", str(out), *SMALL,
                            "--format", fmt)
    assert code == 0, err
    assert stdout.count("client-") >= federation.num_clients and "[4/4]" in stdout
    truth = json.loads((out / "truth.json").read_text())
    assert truth["true_clusters"] == federation.true_clusters.tolist()
    assert truth["n_classes"] == 10 and truth["input_shape"] == [1, 8, 8]
    assert truth["source"] == "quickstart" and truth["overrides"] == SMALL
    assert truth["scenario"] == {"kind": "label_swap", "clients": 4, "clusters": 2}
    assert truth["info"]["pairs"] == [list(p) for p in federation.info["pairs"]]
    # CSV rows are flat; the agreed input_shape gives them the model's shape back.
    shape = (1, 8, 8) if fmt == "csv" else None
    got = federation_from_folders(out, input_shape=shape)
    assert_same_clients(got, federation)
    assert got.n_classes == federation.n_classes and got.input_shape == (1, 8, 8)
    assert (got.true_clusters == own.NO_TRUTH).all()


def test_csv_rows_stay_flat_without_an_agreed_shape(exported, federation):
    got = federation_from_folders(exported["csv"])
    assert got.input_shape == (64,)
    assert_same_clients(got, federation, shape=(64,))


def test_a_run_on_exported_folders_is_the_run_on_the_scenario(capsys, tmp_path, exported):
    runs = {}
    for name, data in (("scenario", SMALL),
                       ("folders", ["data.dataset=folders", f"data.root={exported['npz']}"])):
        code, _, err = cli(capsys, "run", "quickstart", *data, *RUN, "--out",
                           str(tmp_path / name))
        assert code == 0, err
        runs[name] = [json.loads(line) for line in
                      (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    assert len(runs["folders"]) == len(runs["scenario"]) == 2
    for a, b in zip(runs["folders"], runs["scenario"], strict=True):
        for key in ("train_loss", "mean_accuracy", "per_client_accuracy", "per_client_loss"):
            assert a[key] == b[key], key


def test_image_folders_keep_the_order_of_file_names_across_classes(tmp_path):
    client = tmp_path / "client-0"
    for i, label in enumerate([2, 0, 1, 0]):
        save_png(client / str(label) / f"{i:03d}.png", grey(10 * i))
    data = load_client_data(client)
    assert data.train_y.tolist() == [2, 0, 1, 0]
    np.testing.assert_array_equal(data.train_x[:, 0, 0, 0],
                                  np.float32([0, 10, 20, 30]) / np.float32(255))
    assert data.train_x.shape == (4, 1, 8, 8) and data.train_x.dtype == np.float32


# ---------------------------------------------------------------- images: classes, channels


def test_named_class_folders_take_their_numbers_from_data_classes(tmp_path):
    # Each node sees only some classes: the federation's list numbers them the same everywhere.
    save_png(tmp_path / "client-0" / "cat" / "a.png", grey(1))
    save_png(tmp_path / "client-0" / "dog" / "b.png", grey(2))
    save_png(tmp_path / "client-1" / "dog" / "c.png", grey(3))
    fed = own.federation_from_config({"dataset": "folders", "root": str(tmp_path),
                                      "classes": ["dog", "cat", "bird"]})
    assert fed.n_classes == 3
    assert fed.clients[0].train_y.tolist() == [1, 0]
    assert fed.clients[1].train_y.tolist() == [0]


def test_named_class_folders_without_data_classes_are_refused(tmp_path):
    save_png(tmp_path / "cat" / "a.png", grey(1))
    with pytest.raises(DataError, match=r"'cat' is not an integer.*data\.classes"):
        load_client_data(tmp_path)


def test_a_class_folder_missing_from_data_classes_is_refused(tmp_path):
    save_png(tmp_path / "cat" / "a.png", grey(1))
    save_png(tmp_path / "fox" / "b.png", grey(1))
    with pytest.raises(DataError, match=r"'fox' is not in data\.classes \['cat', 'dog'\]"):
        load_client_data(tmp_path, OwnDataOptions(classes=("cat", "dog")))


def test_images_take_the_agreed_channel_count(tmp_path):
    colour = np.zeros((8, 8, 3), dtype=np.uint8)
    colour[..., 0] = 255
    save_png(tmp_path / "rgb" / "0" / "a.png", colour)
    save_png(tmp_path / "grey" / "0" / "a.png", grey(51))
    as_grey = load_client_data(tmp_path / "rgb", OwnDataOptions(input_shape=(1, 8, 8)))
    # Pillow's luma of pure red: 255 * 299 / 1000, rounded.
    assert as_grey.train_x.shape == (1, 1, 8, 8)
    assert as_grey.train_x[0, 0, 0, 0] == np.float32(76) / np.float32(255)
    as_colour = load_client_data(tmp_path / "grey", OwnDataOptions(input_shape=(3, 8, 8)))
    assert as_colour.train_x.shape == (1, 3, 8, 8)
    np.testing.assert_array_equal(as_colour.train_x, np.full((1, 3, 8, 8), 0.2, np.float32))
    # Without an agreement a colour image stays colour.
    assert load_client_data(tmp_path / "rgb").train_x.shape == (1, 3, 8, 8)


def test_an_image_of_another_size_is_refused_naming_the_file(tmp_path):
    save_png(tmp_path / "0" / "a.png", grey(1))
    save_png(tmp_path / "0" / "b.png", grey(1, (10, 8)))
    with pytest.raises(DataError, match=r"b\.png: image is 10x8 pixels .* are 8x8"):
        load_client_data(tmp_path)
    with pytest.raises(DataError, match=r"a\.png: image is 8x8 .* are 6x6.*data\.resize"):
        load_client_data(tmp_path, OwnDataOptions(input_shape=(1, 6, 6)))
    resized = load_client_data(tmp_path, OwnDataOptions(input_shape=(1, 6, 6), resize=True))
    assert resized.train_x.shape == (2, 1, 6, 6)


def test_images_split_into_train_and_test_folders(tmp_path):
    save_png(tmp_path / "train" / "0" / "a.png", grey(0))
    save_png(tmp_path / "train" / "1" / "b.png", grey(0))
    save_png(tmp_path / "test" / "1" / "c.png", grey(0))
    data = load_client_data(tmp_path)
    assert data.train_y.tolist() == [0, 1] and data.test_y.tolist() == [1]


# ---------------------------------------------------------------- csv


def write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_one_csv_with_a_named_label_column_and_a_test_fraction(tmp_path):
    rows = "\n".join(f"{i},{i * 0.5},{i % 3}" for i in range(8))
    write_text(tmp_path / "data.csv", f"a,b,y\n{rows}\n")
    data = load_client_data(tmp_path, OwnDataOptions(label_column="y", test_fraction=0.25))
    assert data.train_x.shape == (6, 2) and data.test_x.shape == (2, 2)
    both = np.concatenate([data.train_x, data.test_x])
    labels = np.concatenate([data.train_y, data.test_y])
    np.testing.assert_array_equal(labels, both[:, 0].astype(np.int64) % 3)
    np.testing.assert_array_equal(both[:, 1], both[:, 0] * 0.5)


def test_csv_labels_must_be_integers_or_listed_classes(tmp_path):
    write_text(tmp_path / "train.csv", "x,label\n0.5,cat\n0.2,dog\n")
    with pytest.raises(DataError, match=r"train\.csv: label 'cat' is not an integer"):
        load_client_data(tmp_path)
    named = load_client_data(tmp_path, OwnDataOptions(classes=("dog", "cat")))
    assert named.train_y.tolist() == [1, 0]
    write_text(tmp_path / "train.csv", "x,label\n0.5,1.5\n")
    with pytest.raises(DataError, match="'1.5' is not an integer"):
        load_client_data(tmp_path)


def test_csv_needs_a_header_and_numbers(tmp_path):
    write_text(tmp_path / "train.csv", "0.5,1\n0.2,0\n")
    with pytest.raises(DataError, match=r"no column 'label' in its header"):
        load_client_data(tmp_path)
    write_text(tmp_path / "train.csv", "x,label\n0.5,1\nhigh,0\n")
    with pytest.raises(DataError, match=r"train\.csv, line 3, column 'x': 'high' is not a "
                                        r"number"):
        load_client_data(tmp_path)


# ---------------------------------------------------------------- normalisation


def test_data_normalize_applies_after_scaling_in_every_format(tmp_path, exported, federation):
    mean, std = 0.25, 0.5
    fed = own.federation_from_config({"dataset": "folders", "root": str(exported["images"]),
                                      "normalize": [[mean], [std]]})
    for got, raw in zip(fed.clients, federation.clients, strict=True):
        want = (raw.train_x - np.float32(mean)) / np.float32(std)
        np.testing.assert_array_equal(got.train_x, want)
        np.testing.assert_array_equal(got.test_x, (raw.test_x - np.float32(mean))
                                      / np.float32(std))
    # Per channel, along axis 1, for uint8 npz inputs as for the others.
    x = np.arange(2 * 2 * 2 * 2, dtype=np.uint8).reshape(2, 2, 2, 2)
    np.savez(tmp_path / "c.npz", x=x, y=np.array([0, 1]))
    got = load_client_data(tmp_path, OwnDataOptions(normalize=((0.1, 0.2), (1.0, 2.0))))
    scaled = x.astype(np.float32) / 255.0
    np.testing.assert_array_equal(got.train_x[:, 1], (scaled[:, 1] - np.float32(0.2)) / 2)
    np.testing.assert_array_equal(got.train_x[:, 0], scaled[:, 0] - np.float32(0.1))


def test_data_normalize_is_checked(tmp_path):
    agreement = own.agreement_from_config({"normalize": {"mean": [0.5], "std": [0.25]}})
    assert agreement.normalize == ((0.5,), (0.25,))
    for bad, message in (([[0.5, 0.5], [0.2]], "as many means as stds"),
                         ([[0.5], [0.0]], "std must be positive"),
                         ("0.5", r"\[\[mean per channel\]")):
        with pytest.raises(ConfigError, match=message):
            own.agreement_from_config({"normalize": bad})
    with pytest.raises(ConfigError, match="2 values per channel.*3 channels"):
        own.agreement_from_config({"normalize": [[0, 0], [1, 1]], "input_shape": [3, 8, 8]})
    np.savez(tmp_path / "c.npz", x=np.zeros((2, 3, 4, 4), np.float32), y=np.array([0, 1]))
    with pytest.raises(DataError, match="2 values per channel"):
        load_client_data(tmp_path, OwnDataOptions(normalize=((0, 0), (1, 1))))


# ---------------------------------------------------------------- refusals


def test_an_empty_client_folder_or_an_unknown_format_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="empty is empty"):
        load_client_data(tmp_path / "empty")
    write_text(tmp_path / "notes" / "readme.txt", "hello")
    with pytest.raises(DataError, match=r"no client data in a known format .* readme\.txt"):
        load_client_data(tmp_path / "notes")
    with pytest.raises(DataError, match="unknown data format 'parquet'"):
        load_client_data(tmp_path / "notes", OwnDataOptions(fmt="parquet"))
    with pytest.raises(ConfigError, match="unknown data.format 'parquet'"):
        own.agreement_from_config({"format": "parquet"})


def test_float_labels_in_npz_are_refused(tmp_path):
    np.savez(tmp_path / "c.npz", x=np.zeros((2, 3), np.float32), y=np.array([0.0, 1.0]))
    with pytest.raises(DataError, match="labels must be integers, got float64"):
        load_client_data(tmp_path)


def test_clients_of_different_shapes_are_refused_naming_the_client(tmp_path):
    for k, width in enumerate((3, 4)):
        (tmp_path / f"client-{k}").mkdir()
        np.savez(tmp_path / f"client-{k}" / "d.npz", x=np.zeros((2, width), np.float32),
                 y=np.array([0, 1]))
    with pytest.raises(DataError, match=r"client-1: inputs shaped \[4\]; the other clients' "
                                        r"inputs are \[3\]"):
        federation_from_folders(tmp_path)
    with pytest.raises(DataError, match=r"client-1: inputs shaped \[4\], the federation's are "
                                        r"\[3\]"):
        federation_from_folders(tmp_path, input_shape=(3,))


def test_a_colour_image_among_grey_clients_is_refused_naming_the_file(tmp_path):
    for k in range(3):
        save_png(tmp_path / f"client-{k}" / "0" / "a.png", grey(10 * k))
    colour = np.zeros((8, 8, 3), dtype=np.uint8)
    save_png(tmp_path / "client-1" / "0" / "b.png", colour)
    with pytest.raises(DataError, match=r"client-1/0/b\.png is a colour image \(RGB\); the "
                                        r"other clients' inputs are \[1, 8, 8\].*input_shape"):
        federation_from_folders(tmp_path)
    # Agreeing on grey converts it.
    assert federation_from_folders(tmp_path, input_shape=(1, 8, 8)).input_shape == (1, 8, 8)


def test_a_file_that_is_no_image_in_a_class_folder_is_refused_naming_it(tmp_path):
    save_png(tmp_path / "0" / "a.png", grey(1))
    save_png(tmp_path / "1" / "b.png", grey(2))
    write_text(tmp_path / "1" / "notes.txt", "taken on Monday")
    (tmp_path / "1" / ".DS_Store").write_bytes(b"")   # hidden files are not samples
    with pytest.raises(DataError, match=r"1/notes\.txt: not an image .* move it out"):
        load_client_data(tmp_path)
    (tmp_path / "1" / "notes.txt").unlink()
    assert len(load_client_data(tmp_path).train_y) == 2


def test_an_empty_class_folder_is_refused_naming_it(tmp_path):
    save_png(tmp_path / "train" / "0" / "a.png", grey(1))
    (tmp_path / "train" / "1").mkdir()
    with pytest.raises(DataError, match=r"train/1: empty class folder"):
        load_client_data(tmp_path)


# ---------------------------------------------------------------- export refusals


def test_export_refuses_a_non_empty_folder_unless_forced(capsys, tmp_path):
    out = tmp_path / "fed"
    (out / "client-7").mkdir(parents=True)
    code, _, err = cli(capsys, "scenario", "export", "quickstart", str(out), *SMALL)
    assert code == 2 and "is not empty" in err and "--force" in err
    code, _, err = cli(capsys, "scenario", "export", "quickstart", str(out), *SMALL, "--force")
    assert code == 0, err
    # A larger federation's stale client folders do not join the new one.
    assert sorted(p.name for p in out.iterdir()) == [
        "client-0", "client-1", "client-2", "client-3", "truth.json"]


def test_images_export_refuses_inputs_that_are_not_8_bit_pixels(tmp_path, federation):
    client = federation.clients[0]
    normalised = ClientData(client.train_x * 0.5 + 0.001, client.train_y, client.test_x,
                            client.test_y)
    fed = Federation([normalised], np.zeros(1, np.int64), 10, (1, 8, 8))
    with pytest.raises(DataError, match=r"not 8-bit pixels .* --format npz"):
        export_federation(fed, tmp_path, "images")
    assert not list(tmp_path.iterdir())
    export_federation(fed, tmp_path, "npz")
    assert_same_clients(federation_from_folders(tmp_path), fed)


def test_export_refuses_token_federations(tmp_path):
    tokens = ClientData(np.zeros((2, 5), np.int64), np.zeros(2, np.int64),
                        np.zeros((1, 5), np.int64), np.zeros(1, np.int64))
    with pytest.raises(DataError, match="token ids"):
        export_federation(Federation([tokens], np.zeros(1, np.int64), 3, (5,)), tmp_path)


# ---------------------------------------------------------------- Hugging Face datasets


def make_hf_marker(folder: Path) -> Path:
    write_text(folder / "state.json", "{}")
    return folder


def test_a_datasets_folder_without_the_package_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    folder = make_hf_marker(tmp_path / "client-0")
    with pytest.raises(DataError, match=r"pip install 'clusterfed\[hf\]'"):
        load_client_data(folder)


def test_datasets_folders_read_images_arrays_and_named_labels(tmp_path, federation):
    datasets = pytest.importorskip("datasets")
    client = federation.clients[0]
    pixels = np.rint(client.train_x[:, 0] * 255).astype(np.uint8)
    images = datasets.Dataset.from_dict(
        {"image": [Image.fromarray(p) for p in pixels], "label": client.train_y.tolist()},
        features=datasets.Features({"image": datasets.Image(),
                                    "label": datasets.Value("int64")}))
    arrays = datasets.Dataset.from_dict({"x": client.test_x, "label": client.test_y.tolist()})
    datasets.DatasetDict(train=images, test=arrays).save_to_disk(str(tmp_path / "dict"))
    got = load_client_data(tmp_path / "dict")
    np.testing.assert_array_equal(got.train_x, client.train_x)
    np.testing.assert_array_equal(got.test_x, client.test_x)
    np.testing.assert_array_equal(got.train_y, client.train_y)
    # One Dataset (no splits), ClassLabel names renumbered by the federation's list.
    names = datasets.Dataset.from_dict(
        {"x": client.test_x[:3], "y": [0, 1, 1]},
        features=datasets.Features({"x": arrays.features["x"],
                                    "y": datasets.ClassLabel(names=["cat", "dog"])}))
    names.save_to_disk(str(tmp_path / "one"))
    got = load_client_data(tmp_path / "one", OwnDataOptions(label_column="y",
                                                            classes=("dog", "cat")))
    assert got.train_y.tolist() == [1, 0, 0] and len(got.test_y) == 0
    with pytest.raises(DataError, match=r"no input column 'pixels'; columns: x, y"):
        load_client_data(tmp_path / "one", OwnDataOptions(label_column="y",
                                                          feature_column="pixels"))
