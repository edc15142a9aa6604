"""transforms.Compose, ToTensor (HxW or HxWxC uint8 -> CxHxW float in [0, 1]) and Normalize."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch


class Compose:
    def __init__(self, steps: Sequence[Callable]) -> None:
        self.steps = list(steps)

    def __call__(self, value: Any) -> Any:
        for step in self.steps:
            value = step(value)
        return value


class ToTensor:
    def __call__(self, image: Any) -> torch.Tensor:
        array = np.asarray(image)
        if array.ndim == 2:
            array = array[:, :, None]
        return torch.from_numpy(array.transpose(2, 0, 1).copy()).float() / 255.0


class Normalize:
    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        return (tensor - self.mean) / self.std
