"""A deterministic synthetic classification data set and its per-rank shards (no downloads)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InvalidArgument


@dataclass(frozen=True)
class Dataset:
    """Train and test split of a classification problem."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    @property
    def n_features(self) -> int:
        """Input width."""
        return int(self.x_train.shape[1])

    @property
    def n_classes(self) -> int:
        """Number of labels."""
        return int(max(self.y_train.max(), self.y_test.max()) + 1)


def make_classification(n_samples: int = 2048, n_features: int = 16, n_classes: int = 4,
                        clusters_per_class: int = 2, noise: float = 1.0, seed: int = 0,
                        test_fraction: float = 0.25) -> Dataset:
    """Gaussian clusters (several per class) pushed through a fixed random tanh map: not linearly separable."""
    if n_samples < 2 or n_features < 1 or n_classes < 2:
        raise InvalidArgument(f"bad data set shape ({n_samples=}, {n_features=}, {n_classes=})",
                              "need at least 2 samples, 1 feature and 2 classes")
    rng = np.random.default_rng(seed)
    centers = rng.normal(0.0, 2.5, (n_classes * clusters_per_class, n_features))
    cluster = rng.integers(0, n_classes * clusters_per_class, n_samples)
    x = centers[cluster] + rng.normal(0.0, noise, (n_samples, n_features))
    mix = rng.normal(0.0, 1.0 / np.sqrt(n_features), (n_features, n_features))
    x = np.tanh(x @ mix) + 0.1 * x
    y = (cluster % n_classes).astype(np.int64)
    n_test = int(n_samples * test_fraction)
    return Dataset(x[n_test:], y[n_test:], x[:n_test], y[:n_test])


def global_batch(x: np.ndarray, y: np.ndarray, step: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Mini-batch number `step` (wrapping around the data) of `batch` rows."""
    n = x.shape[0]
    if batch > n or batch <= 0:
        raise InvalidArgument(f"batch {batch} does not fit {n} samples", "use 0 < batch <= samples")
    idx = (np.arange(batch) + step * batch) % n
    return x[idx], y[idx]


def local_batch(x: np.ndarray, y: np.ndarray, step: int, batch: int, rank: int,
                size: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank `rank`'s contiguous 1/size share of global batch `step` (batch must divide evenly)."""
    if batch % size:
        raise InvalidArgument(f"global batch {batch} is not divisible by {size} ranks",
                              "choose a batch that is a multiple of the number of ranks")
    xb, yb = global_batch(x, y, step, batch)
    per = batch // size
    return xb[rank * per:(rank + 1) * per], yb[rank * per:(rank + 1) * per]
