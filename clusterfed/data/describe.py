"""What a federation looks like: clients per true cluster, client sizes, label histograms.

Pure functions of a Federation returning plain data (ints, floats, lists, dicts), so the
command line can print them, write them as JSON and plot them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from clusterfed.clustering.metrics import has_truth
from clusterfed.data.federation import Federation


def clients_per_cluster(true_clusters: Sequence[int] | np.ndarray) -> dict[int, int]:
    """{true cluster: number of clients}, in cluster order."""
    ids, counts = np.unique(np.asarray(true_clusters, dtype=np.int64), return_counts=True)
    return {int(i): int(n) for i, n in zip(ids, counts, strict=True)}


def size_summary(sizes: Sequence[int] | np.ndarray) -> dict[str, float]:
    """min, median, max, mean and total of per-client sample counts."""
    s = np.asarray(sizes, dtype=np.int64)
    if len(s) == 0:
        return {"min": 0, "median": 0.0, "max": 0, "mean": 0.0, "total": 0}
    return {"min": int(s.min()), "median": float(np.median(s)), "max": int(s.max()),
            "mean": float(s.mean()), "total": int(s.sum())}


def label_histograms(federation: Federation, split: str = "train") -> np.ndarray:
    """(clients, n_classes) counts of each label; sequence targets count every position."""
    rows = []
    for client in federation.clients:
        y = np.asarray(client.train_y if split == "train" else client.test_y).ravel()
        rows.append(np.bincount(y[y >= 0], minlength=federation.n_classes)[:federation.n_classes])
    if not rows:
        return np.zeros((0, federation.n_classes), dtype=np.int64)
    return np.stack(rows).astype(np.int64)


def compact_histogram(row: Sequence[int] | np.ndarray, limit: int = 12) -> str:
    """'label:count' for the labels a client holds, largest first, cut at `limit` entries."""
    row = np.asarray(row)
    held = np.flatnonzero(row)
    if len(held) == 0:
        return "-"
    shown = held[np.argsort(-row[held], kind="stable")][:limit]
    text = " ".join(f"{int(c)}:{int(row[c])}" for c in np.sort(shown))
    if len(held) > limit:
        text += f" (+{len(held) - limit} labels)"
    return text


def describe(federation: Federation) -> dict[str, Any]:
    """Everything `clusterfed scenario describe` reports, as JSON-ready plain data."""
    train_hist = label_histograms(federation, "train")
    test_hist = label_histograms(federation, "test")
    train_sizes = [int(len(c.train_y)) for c in federation.clients]
    test_sizes = [int(len(c.test_y)) for c in federation.clients]
    # Own data has no true clusters: both None (null), as in a run's summary.
    known = has_truth(federation.true_clusters)
    return {
        "clients": federation.num_clients,
        "n_classes": int(federation.n_classes),
        "input_shape": [int(v) for v in federation.input_shape],
        "clients_per_cluster": {str(k): v for k, v in
                                clients_per_cluster(federation.true_clusters).items()}
        if known else None,
        "true_clusters": [int(c) for c in federation.true_clusters] if known else None,
        "train_samples": size_summary(train_sizes),
        "test_samples": size_summary(test_sizes),
        "train_sizes": train_sizes,
        "test_sizes": test_sizes,
        "labels_per_client": [int((row > 0).sum()) for row in train_hist],
        "train_label_histogram": train_hist.tolist(),
        "test_label_histogram": test_hist.tolist(),
        "info": federation.info,
        "groupings": {name: [int(v) for v in g] for name, g in federation.groupings.items()},
    }


def format_description(description: Mapping[str, Any], max_clients: int = 20) -> str:
    """A few lines for the terminal: clusters, size summaries, one line per client."""
    d = description
    clusters = d["clients_per_cluster"]
    if clusters is None:
        lines = [f"{d['clients']} clients, true clusters unknown (own data), "
                 f"{d['n_classes']} labels, input {tuple(d['input_shape'])}"]
    else:
        lines = [
            f"{d['clients']} clients in {len(clusters)} true clusters, {d['n_classes']} labels, "
            f"input {tuple(d['input_shape'])}",
            "clients per true cluster: " + ", ".join(f"{k}: {v}" for k, v in clusters.items()),
        ]
    for name, groups in d.get("groupings", {}).items():
        lines.append(f"second grouping {name}, clients per group: " + ", ".join(
            f"{k}: {v}" for k, v in clients_per_cluster(groups).items()))
    for split in ("train", "test"):
        s = d[f"{split}_samples"]
        lines.append(f"{split} samples per client: min {s['min']}, median {s['median']:g}, "
                     f"max {s['max']} (total {s['total']})")
    lines.append("client cluster  train   test  train labels (label:count)")
    shown = min(max_clients, d["clients"])
    true = d["true_clusters"]
    for i in range(shown):
        cluster = "-" if true is None else str(true[i])
        lines.append(f"{i:6d} {cluster:>7} {d['train_sizes'][i]:6d} "
                     f"{d['test_sizes'][i]:6d}  "
                     f"{compact_histogram(d['train_label_histogram'][i])}")
    if d["clients"] > shown:
        lines.append(f"... {d['clients'] - shown} more clients (all of them in the plots and "
                     f"scenario.json)")
    shares = d["info"].get("shares")
    if shares:   # a mixture scenario: the cluster column is each client's dominant source
        lines.append("source shares per client (mixture; the true cluster is the largest): " +
                     "; ".join(f"{i}: " + "/".join(f"{v:.2f}" for v in shares[i])
                               for i in range(shown)))
    drift = d["info"].get("drift")
    if drift:
        lines.append(f"drift from round {drift['round']} (shown: the data before it): clients "
                     f"{drift['clients']} move from clusters {drift['from']} to {drift['to']}")
    return "\n".join(lines)
