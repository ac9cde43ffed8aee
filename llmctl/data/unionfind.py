"""Connected components over document-id edges, vectorised.

Why not a Python union-find: duplicate edges come by the million from LSH buckets. Min-label
propagation over the edge arrays (each node repeatedly takes the smallest label among its
neighbours, with pointer jumping) converges in O(log n) numpy rounds for the shallow, star-like
graphs LSH produces, and gives every component its smallest document id as label, which is
exactly the document dedup keeps.
"""

from __future__ import annotations

import numpy as np


def components(num_nodes: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Label of every node: the smallest node id in its connected component."""
    labels = np.arange(num_nodes, dtype=np.int64)
    if not len(src):
        return labels
    src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
    while True:
        lo = np.minimum(labels[src], labels[dst])
        new = labels.copy()
        np.minimum.at(new, src, lo)
        np.minimum.at(new, dst, lo)
        new = new[new]  # pointer jumping
        while True:
            jumped = new[new]
            if np.array_equal(jumped, new):
                break
            new = jumped
        if np.array_equal(new, labels):
            return labels
        labels = new
