"""The choice of K as one option group (`algorithm.k_choice`): every selector through the
methods' own clustering code, old flat keys, and one-line errors for bad options."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import weak_groups
from sklearn.metrics import adjusted_rand_score

from clusterfed import config as cfg
from clusterfed.algorithms import build_algorithm
from clusterfed.algorithms.fedem.algorithm import FedEM
from clusterfed.algorithms.fedrc.algorithm import FedRC
from clusterfed.algorithms.flexcfl.algorithm import group_labels
from clusterfed.algorithms.ifca.algorithm import IFCA
from clusterfed.algorithms.lcfl import LCFL
from clusterfed.algorithms.options import ClusterCount
from clusterfed.algorithms.pacfl import PACFL
from clusterfed.algorithms.selection import clusters_of_updates
from clusterfed.clustering import selectors
from clusterfed.clustering.kmeans import kmeans_clusters
from clusterfed.clustering.selectors import SELECTORS
from clusterfed.clustering.similarity import euclidean_distance_matrix
from clusterfed.errors import ConfigError

pytestmark = pytest.mark.fast

SIZES = (9, 6, 5, 4)     # unequal clusters, the smallest above HDBSCAN's default 3
# Davies-Bouldin's index is undefined for one cluster: it never says one (selectors.py).
SAYS_ONE = tuple(s for s in SELECTORS if s != "davies_bouldin")


def count(selector: str) -> ClusterCount:
    """The selector's group; the gap statistic's k-means of references is the slow part, so
    fewer k's and references (four clusters need neither ten)."""
    if selector in ("gap", "silhouette_gap", "silhouette_gap_width"):
        return ClusterCount(selector=selector, k_max=6, references=3)
    return ClusterCount(selector=selector)


def federation_updates(sizes: tuple[int, ...], seed: int = 0, dim: int = 60
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Clients' updates: a direction per true cluster plus noise; and the truth."""
    rng = np.random.default_rng(seed)
    directions = rng.normal(size=(len(sizes), dim))
    truth = np.repeat(np.arange(len(sizes)), sizes)
    return directions[truth] + 0.3 * rng.normal(size=(len(truth), dim)), truth


@pytest.mark.parametrize("selector", SELECTORS)
def test_every_selector_recovers_unequal_clusters_through_ifca_selection(selector):
    updates, truth = federation_updates(SIZES)
    found = clusters_of_updates(np.zeros(updates.shape[1], np.float32), updates,
                                np.ones(len(updates)), count(selector))
    assert adjusted_rand_score(truth, found.labels) == 1.0
    assert found.num_clusters == len(SIZES)


@pytest.mark.parametrize("selector", SAYS_ONE)
def test_every_selector_that_can_says_one_cluster_on_iid_updates(selector):
    updates, _ = federation_updates((24,), seed=1)
    found = clusters_of_updates(np.zeros(updates.shape[1], np.float32), updates,
                                np.ones(len(updates)), count(selector))
    assert found.num_clusters == 1


def test_davies_bouldin_never_says_one_cluster():
    updates, _ = federation_updates((24,), seed=1)
    found = clusters_of_updates(np.zeros(updates.shape[1], np.float32), updates,
                                np.ones(len(updates)), ClusterCount(selector="davies_bouldin"))
    assert found.num_clusters > 1


@pytest.mark.parametrize("selector", SELECTORS)
def test_every_selector_through_lcfl_on_its_distance_matrix(selector):
    points, truth = federation_updates(SIZES, seed=2)
    algo = LCFL(k_choice=count(selector))
    labels, info = algo.cluster_labels(euclidean_distance_matrix(points))
    assert adjusted_rand_score(truth, labels) == 1.0
    assert ("silhouettes" in info) == (selector == "silhouette")
    if selector in SAYS_ONE:
        iid, _ = federation_updates((24,), seed=3)
        assert algo.cluster_labels(euclidean_distance_matrix(iid))[0].max() == 0


@pytest.mark.parametrize("selector", ["eigengap", "hdbscan"])
def test_flexcfl_cold_start_uses_the_selector(selector):
    updates, truth = federation_updates(SIZES, seed=4)
    labels = group_labels(updates, ClusterCount(selector=selector), seed=0)
    assert adjusted_rand_score(truth, labels) == 1.0


def test_each_method_hands_its_selector_and_parameters_to_the_rule(monkeypatch):
    seen = []

    def spy(name, d, labels_for_k, k_max, params=None):
        seen.append((name, k_max, dict(params or {}), len(d)))
        return np.zeros(len(d), dtype=np.int64)

    monkeypatch.setattr(selectors, "select", spy)
    group = ClusterCount(selector="eigengap", k_max=7, neighbours=5)
    updates, _ = federation_updates(SIZES)
    d = euclidean_distance_matrix(updates)
    clusters_of_updates(np.zeros(updates.shape[1], np.float32), updates, np.ones(len(updates)),
                        group)                                            # IFCA, FedEM, FedSoft
    LCFL(k_choice=group).cluster_labels(d)
    PACFL(k_choice=group)._cut(d)
    group_labels(updates, group, seed=0)                                  # FlexCFL
    kmeans_clusters(updates, d, 0, None, group.choose)                    # FeSEM's K-means
    assert seen == [("eigengap", 7, {"neighbours": 5}, len(updates))] * 5


def test_a_selector_parameter_reaches_the_rule():
    updates, _ = federation_updates(SIZES)
    bigger = ClusterCount(selector="hdbscan", min_cluster_size=max(SIZES) + 1)
    found = clusters_of_updates(np.zeros(updates.shape[1], np.float32), updates,
                                np.ones(len(updates)), bigger)
    assert found.num_clusters == 1    # no cluster reaches the size: one


def test_k_fixed_ignores_the_data():
    updates, _ = federation_updates(SIZES)
    found = clusters_of_updates(np.zeros(updates.shape[1], np.float32), updates,
                                np.ones(len(updates)), ClusterCount(k=2))
    assert found.num_clusters == 2


@pytest.mark.parametrize(("section", "expected"), [
    ({"name": "ifca", "k": 4}, ClusterCount(k=4)),
    ({"name": "ifca", "min_silhouette": 0.3},
     ClusterCount(selector="silhouette_gap_width", min_silhouette=0.3)),
    ({"name": "lcfl", "k_max": 6, "min_silhouette": None},
     ClusterCount(k_max=6, min_silhouette=None)),
    ({"name": "pacfl", "n_clusters": 2}, ClusterCount(k=2)),
    ({"name": "pacfl", "min_silhouette": 0.3},
     ClusterCount(selector="hdbscan_silhouette", min_silhouette=0.3)),
    ({"name": "fedem", "components": 3}, ClusterCount(k=3)),
    ({"name": "fedrc", "components": None}, ClusterCount(selector="silhouette_gap_width")),
    ({"name": "fesem", "k": 2, "k_choice": {"k_max": 5}}, ClusterCount(k=2, k_max=5)),
])
def test_old_flat_keys_load_into_the_group(section, expected):
    assert build_algorithm(section).k_choice == expected


def test_old_keys_load_from_overrides_and_new_ones_nest():
    config = cfg.resolve("quickstart", ["algorithm.name=ifca", "algorithm.k=4",
                                        "algorithm.min_silhouette=0.3"])
    assert build_algorithm(config["algorithm"]).k_choice == ClusterCount(k=4,
                                                                         min_silhouette=0.3)
    config = cfg.resolve("quickstart", ["algorithm.name=pacfl",
                                        "algorithm.k_choice.selector=hdbscan",
                                        "algorithm.k_choice.min_cluster_size=4"])
    assert build_algorithm(config["algorithm"]).k_choice == ClusterCount(
        selector="hdbscan", min_cluster_size=4)


@pytest.mark.parametrize(("section", "message"), [
    ({"name": "ifca", "k_choice": {"selector": "elbow"}},
     "k_choice.selector must be one of silhouette, eigengap, gap, davies_bouldin, hdbscan, "
     "hdbscan_silhouette, silhouette_gap, silhouette_gap_width, got 'elbow'"),
    ({"name": "ifca", "k_choice": {"k": 0}}, "k_choice.k must be a whole number >= 1"),
    ({"name": "pacfl", "k_choice": {"k_max": 1}}, "k_choice.k_max must be a whole number >= 2"),
    ({"name": "lcfl", "k_choice": {"min_silhouette": 2}}, "k_choice.min_silhouette must be in"),
    ({"name": "fesem", "k_choice": {"min_cluster_size": 1}}, "k_choice.min_cluster_size"),
    ({"name": "ifca", "k_choice": {"k": 3, "selector": "gap"}}, "k_choice.k fixes it at 3"),
    ({"name": "ifca", "k_choice": {"kmax": 3}}, "unknown option k_choice.kmax; valid: k, k_max"),
    ({"name": "ifca", "k_choice": 4}, "k_choice must be a mapping"),
    ({"name": "pacfl", "n_clusters": 2, "k_choice": {"k": 3}}, "k is set twice"),
    ({"name": "lcfl", "clustering": "dbscan", "k_choice": {"selector": "hdbscan"}},
     "k_choice.selector 'hdbscan' does not apply: clustering dbscan"),
])
def test_bad_options_fail_in_one_line_naming_the_key(section, message):
    with pytest.raises(ConfigError) as err:
        build_algorithm(section)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_method_without_the_group_still_refuses_its_keys():
    with pytest.raises(ConfigError, match="unknown config key algorithm.k "):
        build_algorithm({"name": "fedavg", "k": 3})
    assert isinstance(LCFL().k_choice, ClusterCount)


def weighted_tree_choice(points: np.ndarray, selector: str) -> np.ndarray:
    """`selector`'s labels on the points' distances, candidates cut from a weighted tree (as
    PACFL's)."""
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import pdist, squareform

    tree = linkage(pdist(points), "weighted")
    return selectors.select(selector, squareform(pdist(points)),
                            lambda k: fcluster(tree, k, "maxclust"), 10)


@pytest.mark.parametrize("seed", [1, 2])
def test_hdbscan_silhouette_keeps_a_small_tight_cluster_the_silhouette_merges(seed):
    rng = np.random.default_rng(seed)
    points = np.vstack([rng.normal(size=(40, 5)),
                        0.1 * rng.normal(size=(4, 5)) + [4, 0, 0, 0, 0]])
    truth = np.repeat([0, 1], [40, 4])
    assert weighted_tree_choice(points, "silhouette").max() == 0       # the case's premise
    found = weighted_tree_choice(points, "hdbscan_silhouette")
    assert adjusted_rand_score(truth, found) == 1.0


@pytest.mark.parametrize("seed", [0, 1])
def test_hdbscan_silhouette_parts_diffuse_groups_that_hdbscan_calls_one(seed):
    rng = np.random.default_rng(seed)
    points = np.vstack([rng.uniform(-1, 1, size=(20, 5)),
                        rng.uniform(-1, 1, size=(20, 5)) + [3, 0, 0, 0, 0]])
    truth = np.repeat([0, 1], 20)
    assert weighted_tree_choice(points, "hdbscan").max() == 0          # the case's premise
    found = weighted_tree_choice(points, "hdbscan_silhouette")
    assert adjusted_rand_score(truth, found) == 1.0


def test_pacfl_defaults_to_hdbscan_silhouette_and_keeps_it_under_other_keys():
    assert PACFL().k_choice.selector == "hdbscan_silhouette"
    assert build_algorithm({"name": "pacfl"}).k_choice.selector == "hdbscan_silhouette"
    assert build_algorithm({"name": "pacfl", "k_choice": {"k_max": 5}}).k_choice == \
        ClusterCount(selector="hdbscan_silhouette", k_max=5)
    assert build_algorithm({"name": "pacfl", "k_choice": {"selector": "silhouette"}}
                           ).k_choice == ClusterCount()
    # k fixed (the old n_clusters) takes no selector from the default: no conflict
    assert build_algorithm({"name": "pacfl", "k_choice": {"k": 3}}).k_choice == ClusterCount(k=3)
    assert build_algorithm({"name": "ifca", "k_choice": {"k_max": 5}}).k_choice.selector == \
        "silhouette_gap_width"


def update_tree_choice(updates: np.ndarray, selector: str) -> np.ndarray:
    """`selector`'s labels on the updates, cut from the cosine average-linkage tree (IFCA's and
    FL+HC's)."""
    from clusterfed.clustering import hierarchical as hc

    return hc.chosen_clusters(updates, "cosine", "average",
                              lambda d, labels_for_k: selectors.select(selector, d,
                                                                       labels_for_k, 10)).labels


def test_silhouette_gap_takes_the_gap_where_the_silhouette_finds_no_cluster():
    """Four equal groups whose every silhouette is under 0.25: the silhouette rule says one,
    the gap statistic finds them; with no groups both say one."""
    truth, grouped, alike = weak_groups()
    assert update_tree_choice(grouped, "silhouette").max() == 0        # the case's premise
    assert adjusted_rand_score(truth, update_tree_choice(grouped, "silhouette_gap")) == 1.0
    assert update_tree_choice(alike, "silhouette_gap").max() == 0


def test_silhouette_gap_keeps_the_silhouettes_clusters_where_the_gap_cuts_a_diffuse_one():
    """A diffuse cluster of 10 and two tight ones of 5: the silhouette rule finds the three,
    the gap statistic cuts the diffuse one into pieces (8 clusters)."""
    rng = np.random.default_rng(0)
    truth = np.repeat(np.arange(3), (10, 5, 5))
    spread = np.where(truth == 0, 0.2, 0.05)[:, None]
    updates = np.eye(20)[truth] + spread * rng.normal(size=(len(truth), 20))
    assert update_tree_choice(updates, "gap").max() + 1 > 3            # the case's premise
    assert adjusted_rand_score(truth, update_tree_choice(updates, "silhouette_gap")) == 1.0
    assert adjusted_rand_score(truth, update_tree_choice(updates, "silhouette_gap_width")) == 1.0


def mean_silhouette_by_hand(d: np.ndarray, labels: np.ndarray) -> float:
    """Rousseeuw's s(i) = (b - a) / max(a, b), a lone point's s = 0, averaged over points."""
    widths = []
    for i in range(len(d)):
        own = (labels == labels[i]) & (np.arange(len(d)) != i)
        if not own.any():
            widths.append(0.0)
            continue
        a = d[i, own].mean()
        b = min(d[i, labels == c].mean() for c in set(labels.tolist()) - {labels[i]})
        widths.append((b - a) / max(a, b))
    return float(np.mean(widths))


def test_the_widest_silhouette_is_the_candidate_of_the_largest_mean_silhouette():
    """Six points on a line, 0 0.1 0.2 | 1.0 1.1 | 3.0: each candidate's mean silhouette by
    hand; the widest is chosen, whatever k it has."""
    x = np.array([0.0, 0.1, 0.2, 1.0, 1.1, 3.0])
    d = np.abs(x[:, None] - x[None, :])
    candidates = {2: np.array([0, 0, 0, 0, 0, 1]), 3: np.array([0, 0, 0, 1, 1, 2]),
                  4: np.array([0, 0, 1, 2, 2, 3]), 5: np.array([0, 1, 2, 3, 3, 4])}
    widths = {k: mean_silhouette_by_hand(d, labels) for k, labels in candidates.items()}
    best = max(widths, key=widths.get)
    assert best == 3 and widths[3] > widths[2] > 0           # the case's premise
    np.testing.assert_array_equal(selectors.widest_silhouette(d, candidates.__getitem__, 5),
                                  candidates[best])
    np.testing.assert_array_equal(selectors.widest_silhouette(d, candidates.__getitem__, 2),
                                  candidates[2])             # k_max bounds the candidates


def nested_groups(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Updates of three clusters (24, 10, 6 clients: a shared direction plus one of three),
    the large one made of three weaker sub-directions (label skew inside a cluster), under
    noise that puts some cluster's silhouette under 0.25."""
    rng = np.random.default_rng(seed)
    truth = np.repeat(np.arange(3), (24, 10, 6))
    base = np.zeros((len(truth), 50))
    base[:, -1] = 3.0
    base[np.arange(len(truth)), truth] += 1.0
    first = np.flatnonzero(truth == 0)
    base[first, 3 + first % 3] += 0.7
    return truth, (base + 0.2 * rng.normal(size=base.shape)).astype(np.float32)


@pytest.mark.parametrize("seed", [1, 3])
def test_silhouette_gap_width_keeps_a_cluster_whole_that_the_gap_cuts(seed):
    """The silhouette rule finds no cluster, the gap statistic's K is wrong (it parts the large
    cluster's sub-groups, or merges), the widest silhouette finds the three clusters."""
    truth, updates = nested_groups(seed)
    assert update_tree_choice(updates, "silhouette").max() == 0        # the case's premise
    assert adjusted_rand_score(truth, update_tree_choice(updates, "gap")) < 0.9
    assert adjusted_rand_score(truth, update_tree_choice(updates,
                                                         "silhouette_gap_width")) == 1.0


def test_silhouette_gap_width_says_one_where_the_gap_statistic_does():
    truth, grouped, alike = weak_groups()
    assert update_tree_choice(alike, "silhouette_gap_width").max() == 0
    assert adjusted_rand_score(truth, update_tree_choice(grouped, "silhouette_gap_width")) == 1.0


@pytest.mark.parametrize("method", [IFCA, FedEM, FedRC])
def test_k_from_the_updates_is_the_silhouette_gap_width_cut(method):
    """IFCA's k and FedEM's and FedRC's M from the data are FL+HC's default cut
    (`silhouette_gap_width`) of one round's updates: four equal groups of updates whose
    silhouettes fall under the silhouette rule's floor are four clusters (the silhouette rule,
    FedEM's and FedRC's default before 2026-12-08, says one); the same clients with no groups
    are one."""
    truth, grouped, alike = weak_groups()
    base, weights = np.zeros(grouped.shape[1], np.float32), np.ones(len(truth))
    found = clusters_of_updates(base, grouped, weights, method().k_choice)
    assert found.num_clusters == 4
    assert len(set(zip(found.labels.tolist(), truth.tolist(), strict=True))) == 4
    assert clusters_of_updates(base, alike, weights, method().k_choice).num_clusters == 1
    silhouette = method(k_choice={"selector": "silhouette"}).k_choice
    assert clusters_of_updates(base, grouped, weights, silhouette).num_clusters == 1
