"""Clustering mathematics and clustering-quality scores, as pure functions."""

from clusterfed.clustering.metrics import clustering_scores, contingency

__all__ = ["clustering_scores", "contingency"]
