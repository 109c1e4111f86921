"""The corrupted scenario and the overlays that add a second true grouping (a corruption per
client, noisy training labels): groupings as asked, images and labels as defined, seeded, and
the second grouping scored beside the truth."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from clusterfed.clustering.metrics import grouping_scores, truth_scores
from clusterfed.data import Dataset, build_federation, load_dataset
from clusterfed.data import corruptions as cx
from clusterfed.data.describe import describe, format_description
from clusterfed.data.export import truth_record
from clusterfed.errors import ConfigError
from clusterfed.experiments import benchmark as bench
from tests.helpers import tiny_config


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return load_dataset("digits")


def clean_twin(digits: Dataset, clients: int, clusters: int, seed: int):
    """The federation with the same samples as `corrupted` draws, untransformed."""
    return build_federation(digits, {"kind": "invert", "clients": clients, "clusters": clusters,
                                     "inverted": [False] * clusters}, seed)


def test_corrupted_clusters_carry_their_corruption(digits):
    fed = build_federation(digits, {"kind": "corrupted", "clients": 6, "clusters": 3,
                                    "kinds": ["none", "contrast", "gaussian_noise"],
                                    "severity": [1, 4, 5]}, seed=2)
    clean = clean_twin(digits, 6, 3, seed=2)
    assert fed.true_clusters.tolist() == [0, 0, 1, 1, 2, 2]
    assert fed.groupings == {}                          # the corruption is the truth itself
    assert fed.info["corruption"] == {"kinds": ["none", "contrast", "gaussian_noise"],
                                      "severities": [0, 4, 5], "table": "cifar10_c"}
    for i, (c, k) in enumerate(zip(fed.clients, clean.clients, strict=True)):
        for split in ("train", "test"):
            x, x0 = getattr(c, f"{split}_x"), getattr(k, f"{split}_x")
            np.testing.assert_array_equal(getattr(c, f"{split}_y"), getattr(k, f"{split}_y"))
            if i < 2:
                np.testing.assert_array_equal(x, x0)
            elif i < 4:                                 # contrast 0.3, truncated to grey levels
                grey = np.rint(x0 * 255).astype(np.float64) / 255.0   # the uint8 original
                expected = np.floor(cx.contrast(grey, 0.3, None) * 255) / 255
                np.testing.assert_allclose(x, expected, atol=1e-6)
            else:                                       # N(0, 0.1^2), clipped and truncated
                inside = (x0 > 0.45) & (x0 < 0.55)
                assert (x - x0)[inside].std() == pytest.approx(0.1, rel=0.15)


def test_corrupted_is_seeded_per_seed_and_client(digits):
    section = {"kind": "corrupted", "clients": 4, "clusters": 2,
               "kinds": ["gaussian_noise", "impulse_noise"]}
    a, b = build_federation(digits, section, 0), build_federation(digits, section, 0)
    for c, d in zip(a.clients, b.clients, strict=True):
        np.testing.assert_array_equal(c.train_x, d.train_x)
        np.testing.assert_array_equal(c.test_x, d.test_x)
    other = build_federation(digits, section, 1)
    assert not np.array_equal(a.clients[0].train_x[:5], other.clients[0].train_x[:5])
    # Impulse noise (cluster 1): which pixels it hits differs between clients, and between a
    # client's train and test images (the first 100 of each, where both are grey, not 0 or 1).
    clean = clean_twin(digits, 4, 2, seed=0)

    def hits(i: int, split: str) -> tuple[np.ndarray, np.ndarray]:
        x, x0 = getattr(a.clients[i], f"{split}_x")[:100], getattr(clean.clients[i],
                                                                  f"{split}_x")[:100]
        return x != x0, (x0 > 0.0) & (x0 < 1.0)

    def differ(one: tuple[int, str], other: tuple[int, str]) -> bool:
        (h1, grey1), (h2, grey2) = hits(*one), hits(*other)
        both = grey1 & grey2
        return both.sum() > 1000 and not np.array_equal(h1[both], h2[both])

    assert hits(2, "train")[0].mean() > 0.005
    assert differ((2, "train"), (3, "train")) and differ((2, "train"), (2, "test"))


def test_concept_clusters_with_a_crossed_corruption_grouping(digits):
    base = {"kind": "label_swap", "clients": 8, "clusters": 2}
    plain = build_federation(digits, base, 4)
    fed = build_federation(digits, {**base, "corruption": {"kinds": ["none", "gaussian_blur"],
                                                           "severity": 5}}, 4)
    assert fed.true_clusters.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert fed.groupings["corruption"].tolist() == [0, 1, 0, 1, 0, 1, 0, 1]
    assert fed.info["pairs"] == plain.info["pairs"]
    # Its own random stream: the same samples and swapped labels as without the corruption.
    for i, (c, p) in enumerate(zip(fed.clients, plain.clients, strict=True)):
        np.testing.assert_array_equal(c.train_y, p.train_y)
        np.testing.assert_array_equal(c.test_y, p.test_y)
        if i % 2 == 0:
            np.testing.assert_array_equal(c.train_x, p.train_x)
        else:                                           # Gaussian blur, sigma 1, then uint8
            grey = np.rint(p.test_x * 255).astype(np.float64) / 255.0
            expected = np.floor(cx.gaussian_blur(grey, 1.0, None) * 255)
            np.testing.assert_allclose(c.test_x * 255, expected, atol=1e-4)
    d = describe(fed)
    assert d["groupings"] == {"corruption": [0, 1, 0, 1, 0, 1, 0, 1]}
    assert "second grouping corruption, clients per group: 0: 4, 1: 4" in format_description(d)
    assert truth_record(fed, "digits", [], base)["groupings"] == d["groupings"]


def noisy(digits: Dataset, seed: int = 0, **noise):
    base = {"kind": "label_swap", "clients": 8, "clusters": 2, "pairs": [[0, 1], [2, 3]]}
    return (build_federation(digits, {**base, "label_noise": noise}, seed),
            build_federation(digits, base, seed))


def test_label_noise_flips_the_asked_rate_of_training_labels_only(digits):
    fed, clean = noisy(digits, rate=0.3, share=0.5)
    flags = fed.groupings["label_noise"]
    # Half of each true cluster's 4 clients.
    assert flags[:4].sum() == 2 and flags[4:].sum() == 2
    assert fed.info["label_noise"]["noisy_clients"] == np.flatnonzero(flags).tolist()
    for f, c, is_noisy in zip(fed.clients, clean.clients, flags, strict=True):
        np.testing.assert_array_equal(f.test_y, c.test_y)
        np.testing.assert_array_equal(f.train_x, c.train_x)
        rate = (f.train_y != c.train_y).mean()
        assert rate == pytest.approx(0.3 if is_noisy else 0.0, abs=1 / len(f.train_y))
    again, _ = noisy(digits, rate=0.3, share=0.5)
    for f, g in zip(fed.clients, again.clients, strict=True):
        np.testing.assert_array_equal(f.train_y, g.train_y)


def test_label_noise_flip_rules(digits):
    sym, clean = noisy(digits, seed=1, rate=1.0, share=1.0)
    steps = np.concatenate([(f.train_y - c.train_y) % 10 for f, c in
                            zip(sym.clients, clean.clients, strict=True)])
    # Symmetric: every label moved, to each other label about equally often.
    counts = np.bincount(steps, minlength=10)
    assert counts[0] == 0
    assert counts[1:].min() > 0.75 * len(steps) / 9 and counts[1:].max() < 1.25 * len(steps) / 9
    pair, clean = noisy(digits, rate=0.5, share=1.0, flip="pair", clusters=[1])
    assert pair.groupings["label_noise"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    for f, c in zip(pair.clients[4:], clean.clients[4:], strict=True):
        moved = f.train_y != c.train_y
        np.testing.assert_array_equal(f.train_y[moved], (c.train_y[moved] + 1) % 10)


def test_a_run_scores_its_clustering_against_each_grouping(digits):
    groupings = {"corruption": np.array([0, 1, 0, 1]), "label_noise": np.array([0, 0, 1, 1])}
    found = np.array([0, 1, 0, 0])
    scores = grouping_scores(groupings, found)["groupings"]
    assert scores["corruption"]["ari"] == pytest.approx(adjusted_rand_score([0, 1, 0, 1], found))
    assert scores["label_noise"]["ari"] == pytest.approx(adjusted_rand_score([0, 0, 1, 1], found))
    assert grouping_scores({}, found) == {}
    from clusterfed.sim.simulation import run_config
    config = tiny_config("local", train={"rounds": 1},
                         scenario={"corruption": {"kinds": ["none", "contrast"]}})
    summary = run_config(config)["clustering"]
    truth = np.array(summary["true_assignment"])
    assert truth.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    # Local: a cluster per client, so ARI is 0 against both; NMI tells them apart.
    assert summary["groupings"]["corruption"] == pytest.approx(
        truth_scores(np.array([0, 1] * 4), np.array(summary["assignment"])))
    assert summary["groupings"]["corruption"]["nmi"] != pytest.approx(summary["nmi"])
    assert "groupings" not in run_config(tiny_config("local", train={"rounds": 1}))["clustering"]


@pytest.mark.parametrize(("section", "message"), [
    ({"kind": "corrupted", "kinds": ["none", "fog"]}, "kinds must be a list"),
    ({"kind": "corrupted", "severity": 6}, "severity must be a severity in 1..5"),
    ({"kind": "corrupted", "kinds": ["contrast", "contrast"]}, "its own corruption"),
    ({"kind": "corrupted", "kinds": ["none"]}, "1 corruptions for 2 clusters"),
    ({"kind": "corrupted", "table": "imagenet_c"}, "table must be one of"),
    ({"kind": "corrupted", "corruption": {"kinds": ["none"]}}, "leave out"),
    ({"kind": "rotation", "corruption": {"kind": ["none"]}}, "kind"),
    ({"kind": "rotation", "label_noise": {"share": 0.5}}, "rate is required"),
    ({"kind": "rotation", "label_noise": {"rate": 0}}, "rate must be a number in (0, 1]"),
    ({"kind": "rotation", "label_noise": {"rate": 0.1, "flip": "any"}}, "flip must be"),
    ({"kind": "rotation", "label_noise": {"rate": 0.1, "clusters": [5]}}, "clusters must list"),
])
def test_bad_options_are_refused(digits, section, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        build_federation(digits, {"clients": 4, "clusters": 2, **section}, 0)


@pytest.mark.parametrize(("name", "shift", "corruption", "noise"), [
    ("corrupted", "feature", None, None),
    ("label_swap_corrupted", "concept", [0, 1] * 10, None),
    ("label_swap_noisy", "noise", None, [2, 2, 2, 2]),
])
def test_benchmark_scenarios(name, shift, corruption, noise):
    sc = bench.SCENARIOS[name]
    assert sc.shift == shift and sc.claimable == (shift in bench.SHIFTS)
    fed = build_federation(load_dataset("digits"),
                           bench.cell_config("digits", name, 0, "cfl")["scenario"], 0)
    assert fed.true_clusters.tolist() == np.repeat(np.arange(4), 5).tolist()
    if corruption is not None:
        assert fed.groupings["corruption"].tolist() == corruption
    if noise is not None:                               # noisy clients of each true cluster
        per_cluster = np.bincount(fed.true_clusters, weights=fed.groupings["label_noise"])
        assert per_cluster.tolist() == noise


def test_benchmark_rows_record_the_ari_against_the_second_grouping(tmp_path):
    rows = bench.run_benchmark(tmp_path, datasets=["digits"], scenarios=["label_swap_corrupted"],
                               methods=["fedavg", "local"], seeds=[0],
                               overrides=["train.rounds=1", "run.threads=1"])
    assert rows[0]["clusters"] == 1 and rows[0]["ari_vs"] == {"corruption": 0.0}
    assert rows[1]["clusters"] == 20 and rows[1]["ari_vs"] == {"corruption": 0.0}


def test_result_line_and_report_name_the_second_grouping():
    from clusterfed.cli import result_line
    from clusterfed.report.pages import _clustering_line

    clustering = {"n_clusters": 2, "ari": 1.0, "nmi": 1.0,
                  "groupings": {"corruption": {"ari": 0.25, "nmi": 0.5}}}
    summary = {"algorithm": "ifca", "final": {"mean_accuracy": 0.9}, "wall_seconds": 1.0,
               "clustering": clustering}
    assert "ARI 1.000, ARI vs corruption 0.250, 1.0 s" in result_line(summary)
    assert _clustering_line(clustering).endswith(
        "against the true clusters; ARI 0.250, NMI 0.500 against the corruption grouping")


def test_under_drift_a_client_keeps_its_corruption_and_noise(digits):
    base = {"kind": "label_swap", "clients": 8, "clusters": 2, "pairs": [[0, 1], [2, 3]],
            "drift": {"round": 3, "clients": [1, 2]}}
    overlays = {"corruption": {"kinds": ["none", "contrast"], "severity": 5},
                "label_noise": {"rate": 0.5, "share": 0.5}}
    fed = build_federation(digits, {**base, **overlays}, 0)
    plain = build_federation(digits, base, 0)
    after, plain_after = fed.at_round(3), plain.at_round(3)
    assert after.true_clusters.tolist() == [0, 1, 1, 0, 1, 1, 1, 1]
    assert after.groupings["corruption"].tolist() == fed.groupings["corruption"].tolist()
    assert after.groupings["label_noise"].tolist() == fed.groupings["label_noise"].tolist()
    for i in (1, 2):                                    # the drifting clients
        f, p = after.clients[i], plain_after.clients[i]
        np.testing.assert_array_equal(f.test_y, p.test_y)       # the new cluster's swap
        grey = np.rint(p.test_x * 255).astype(np.float64) / 255.0
        corrupted = np.floor(cx.contrast(grey, 0.15, None) * 255) / 255
        np.testing.assert_allclose(f.test_x, corrupted if i % 2 else grey, atol=1e-6)
        flipped = (f.train_y != p.train_y).mean()
        assert flipped == pytest.approx(0.5 * fed.groupings["label_noise"][i],
                                        abs=1 / len(p.train_y))


def test_corrupted_clusters_drift_to_the_new_clusters_corruption(digits):
    fed = build_federation(digits, {"kind": "corrupted", "clients": 4, "clusters": 2,
                                    "kinds": ["none", "contrast"], "severity": 5,
                                    "drift": {"round": 2, "clients": [0]}}, 0)
    before, after = fed.clients[0].test_x, fed.at_round(2).clients[0].test_x
    assert after.std() < 0.5 * before.std()             # contrast 0.15 of the clean images


def original_labels(dataset_x: np.ndarray, dataset_y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Each image's label in the dataset, found by its pixels (digits has no duplicate image)."""
    label_of = {xi.tobytes(): int(yi) for xi, yi in zip(dataset_x, dataset_y, strict=True)}
    return np.array([label_of[xi.tobytes()]
                     for xi in np.rint(x * 255).astype(np.uint8)], dtype=np.int64)


def swapped(y: np.ndarray, pair: list[int]) -> np.ndarray:
    a, b = pair
    return np.where(y == a, b, np.where(y == b, a, y))


@pytest.mark.parametrize("seed", [0, 1])
def test_the_benchmarks_label_swap_noisy_keeps_the_swap_clusters_as_its_truth(digits, seed):
    """Brute force from the images: each client's labels against the dataset's. The swap
    groups are the truth, 2 of each group's 5 clients have exactly round(0.3 n) training
    labels off their group's swap, the rest and every test label are swapped and clean."""
    fed = build_federation(digits, bench.cell_config("digits", "label_swap_noisy", seed,
                                                     "ifca")["scenario"], seed)
    pairs = fed.info["pairs"]
    assert len({v for pair in pairs for v in pair}) == 8             # 4 disjoint pairs
    # The swap each client's test labels show is its true cluster.
    shown = []
    for c in fed.clients:
        test_orig = original_labels(digits.test_x, digits.test_y, c.test_x)
        fits = [j for j, pair in enumerate(pairs)
                if np.array_equal(c.test_y, swapped(test_orig, pair))]
        assert len(fits) == 1
        shown.append(fits[0])
    assert fed.true_clusters.tolist() == shown == np.repeat(np.arange(4), 5).tolist()
    # Training labels off the client's own swap: none, or round(0.3 n) on the noisy clients.
    off = []
    for c, j in zip(fed.clients, shown, strict=True):
        train_orig = original_labels(digits.train_x, digits.train_y, c.train_x)
        off.append(int((c.train_y != swapped(train_orig, pairs[j])).sum()))
        assert off[-1] in (0, int(round(0.3 * len(c.train_y))))
    noisy = (np.array(off) > 0).astype(np.int64)
    assert fed.groupings["label_noise"].tolist() == noisy.tolist()
    assert np.bincount(fed.true_clusters, weights=noisy).tolist() == [2, 2, 2, 2]
    assert fed.info["label_noise"]["rate"] == 0.3
    assert fed.info["label_noise"]["noisy_clients"] == np.flatnonzero(noisy).tolist()
