"""The harness's synthetic data sets: random arrays of the real data sets' shapes and types (same on every rank)."""

from __future__ import annotations

from typing import Any

MNIST_TRAIN, MNIST_TEST = 2048, 256


def synthetic_mnist() -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """(x_train, y_train), (x_test, y_test) as keras.datasets.mnist.load_data gives them: uint8 images (N, 28, 28)
    and uint8 labels 0-9. Learnable, as the examples that check their accuracy need: noise, and a bright 7x7
    square whose place on a 4x4 grid is the label."""
    import numpy as np

    rng = np.random.default_rng(0)

    def part(n: int) -> tuple[Any, Any]:
        labels = rng.integers(0, 10, (n,), dtype=np.uint8)
        images = rng.integers(0, 64, (n, 28, 28), dtype=np.uint8)
        for index, label in enumerate(labels):
            row, column = divmod(int(label), 4)
            images[index, 7 * row:7 * row + 7, 7 * column:7 * column + 7] = 255
        return images, labels
    return part(MNIST_TRAIN), part(MNIST_TEST)
