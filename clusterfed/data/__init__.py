"""Datasets (arrays read from official file formats) and scenarios (datasets made federations)."""

from clusterfed.data.datasets import DATASETS, Dataset, data_root, load_dataset
from clusterfed.data.scenarios import SCENARIOS, ClientData, Federation, build_federation

__all__ = [
    "DATASETS",
    "SCENARIOS",
    "ClientData",
    "Dataset",
    "Federation",
    "build_federation",
    "data_root",
    "load_dataset",
]
