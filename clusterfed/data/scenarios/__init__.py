"""Scenarios: how a dataset becomes a federation of clients with known true clusters.

A scenario is a registered function `(dataset, *, assign, rng, **own_options) -> ScenarioPlan`.
True clusters are contiguous blocks of clients (`scenario.clients_per_cluster` sets their
sizes; default as even as possible). The label mathematics live in `partition.py`.

| kind              | rule (spec section)                                                       |
|-------------------|---------------------------------------------------------------------------|
| iid               | uniform random disjoint shares; 1 true cluster                            |
| label_skew        | each client holds `labels_per_client` labels, or `label_fraction` of them |
|                   | (PACFL 4.3 "#label{k}", NIID-Bench): client i owns label i mod K plus k-1 |
|                   | random others; each label's samples are split among its owners; 1 cluster |
| label_groups      | cluster j owns its own label set (a window of a seeded label order, of    |
|                   | `labels_per_group`, consecutive groups sharing `overlap` labels, or       |
|                   | explicit `group_labels`); its clients split those labels' samples         |
| dirichlet         | per label, proportions over clients ~ Dir(`alpha`), NIID-Bench balance    |
|                   | trick, redrawn until every client has `min_size` (10) (PACFL 4.3); 1 cl.  |
| shards            | sort by label, n_clients x `shards_per_client` (2) equal shards, random   |
|                   | owners (FL+HC A7, McMahan); 1 true cluster                                |
| label_swap        | cluster j swaps its own label pair, pairs disjoint (CFL A10, FL+HC A8)    |
| label_permutation | cluster j applies its own random permutation of all labels (CFL 4.3,      |
|                   | Eqs. 52/53)                                                               |
| rotation          | cluster j rotates images by 360 j / k degrees (IFCA, LCFL 4.2b);          |
|                   | `replicate`: each rotation has its own copy of the data                   |
| invert            | cluster j has its pixels inverted (x -> 255 - x) when `inverted[j]`,      |
|                   | default j odd: k = 2 gives cluster 1 inverted; k > 2 alternates           |
| mix               | cluster j = source dataset `groups[j]` (dataset groups, PACFL MIX-4)      |
| topics            | cluster j = topic j (AG News, CFL 4.4): groups, else the class label      |
| writers           | natural clients: one client per dataset group with its own train and test |
|                   | samples (FEMNIST writers, Shakespeare roles; FL+HC A6)                    |
| cyclic_classes    | client in cluster j holds `classes_per_client` (3) consecutive classes of |
|                   | the cycle from position j L / k (FedProx FEMNIST, LCFL 4.2a)              |
| corrupted         | cluster j's train and test images carry corruption `kinds[j]` at its      |
|                   | `severity` 1..5 (default 3; `none` is clean) with the parameters of       |
|                   | `table` cifar10_c (Hendrycks & Dietterich) or mnist_c (Mu & Gilmer),      |
|                   | generated from the clean data (`data/corruptions.py`), seeded per client  |
| mixture           | soft clusters: each client's images a mixture of k rotated sources, its   |
|                   | shares `linear`, one vector per block, or `dirichlet` (FedSoft; true      |
|                   | cluster the dominant source; `mixture.py`)                                |

Common options (every scenario, `COMMON_KEYS`):

- `samples_per_client` / `test_samples_per_client`: fixed shares instead of everything split
  (for `dirichlet` and `shards` the first sets the pool size, clients x samples_per_client).
- `quantity_skew: SIGMA` or `{sigma, min_samples}`: client sizes proportional to
  exp(N(0, sigma^2)) draws (seeded by the run seed), applied wherever client shares are cut
  (`Assignment.sizes`, `label_set_counts`, `dirichlet_counts`, `shard_partition`).
  `min_samples` bounds client totals where they are set directly (random shares,
  samples_per_client totals, shards); per-label splits and Dirichlet use `min_size` instead.
  FedProx's lognormal(4, 1) + 5 FEMNIST sizes are, up to normalisation, `samples_per_client:
  86, quantity_skew: {sigma: 1, min_samples: 6}` (90 % of 95 for training, 2 per class).
- `test` (default `split`): `split` gives each client a disjoint test share that follows its
  training data: random for iid shares, or each label's test samples split in proportion to
  the clients' training counts of it where labels are skewed (FL+HC A6); `by_labels` gives
  every test sample of every label the client holds (PACFL 4.3 `local_view`); `all` gives the
  client's whole test pool (the whole test set, CFL Eq. 53; the source dataset's test split
  for `mix`, MIX-4). Test data always get the client's own transform.
- `drift: {round, clients, to}` (scenarios with k >= 2 true clusters): from that round on,
  the drifting clients hold new data of another true cluster (FlexCFL's client migration;
  the rules: `drift.py`).

Overlays (every scenario; `overlays.py`): a second true grouping over the scenario's clients,
kept in `Federation.groupings` beside the true clusters (which stay the truth) and scored in a
run's summary (`clustering.groupings`). Each is a client's extra applied after its cluster's
transform (`ClientSpec.train_extra` / `test_extra`), decided once from the first plan (under
`drift` a client keeps its corruption and noise), and draws from its own stream of the seed.

- `corruption: {kinds: [none, gaussian_noise], severity: 3, table: cifar10_c}`: client i's
  images (train and test, after the scenario's own transform) carry kinds[i mod G]; grouping
  `corruption` = i mod G, crossed with the contiguous clusters (e.g. label-swap concepts,
  each with clean and noisy clients: concept and feature shift at once).
- `label_noise: {rate: R, share: 0.5, flip: symmetric, clusters: all}`: in each listed true
  cluster a seeded round(share x size) of its clients have exactly round(R n) of their n
  training labels flipped, to a uniformly random other label (`symmetric`) or to the next
  one (`pair`, l + 1 mod K); test labels stay clean; grouping `label_noise` (1 noisy).

Composition: the transform scenarios (`label_swap`, `label_permutation`, `rotation`,
`invert`, `corrupted`) and the grouped ones (`mix`, `topics`) take `labels: {kind: K, ...}`, a
label partition applied inside each pool of samples (the whole data, a rotation's copy, a source
dataset) among that pool's clients: `iid` (default), `label_skew`, `dirichlet` or `shards`
with the same options as the scenarios of those names, over the labels present in the pool,
e.g. Dirichlet inside rotation clusters (CFL's reference code):
`{kind: rotation, clusters: 2, angles: [0, 180], labels: {kind: dirichlet, alpha: 1.0}}`.
Quantity-skew weights come from their own random stream, so adding quantity skew leaves,
for example, the label sets that `label_skew` draws for a seed unchanged.
"""

# Importing the families registers their scenarios.
from clusterfed.data.federation import ClientData, Federation
from clusterfed.data.scenarios import groups, label_skew, mixture, transformed  # noqa: F401
from clusterfed.data.scenarios.assignment import (
    Assignment,
    ClientSpec,
    Pool,
    ScenarioPlan,
    Split,
    Transform,
    fill,
    label_partition,
    labels_per_client_of,
)
from clusterfed.data.scenarios.building import (
    COMMON_KEYS,
    SCENARIOS,
    TEST_MODES,
    build_federation,
    materialise,
)

__all__ = [
    "COMMON_KEYS",
    "SCENARIOS",
    "TEST_MODES",
    "Assignment",
    "ClientData",
    "ClientSpec",
    "Federation",
    "Pool",
    "ScenarioPlan",
    "Split",
    "Transform",
    "build_federation",
    "fill",
    "label_partition",
    "labels_per_client_of",
    "materialise",
]
