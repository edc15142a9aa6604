"""datasets.MNIST: the harness's synthetic MNIST (uint8 images 28x28, labels 0-9), never downloaded."""

from __future__ import annotations

from typing import Any, Callable

import torch


class MNIST(torch.utils.data.Dataset):
    def __init__(self, root: str, train: bool = True, transform: Callable | None = None,
                 target_transform: Callable | None = None, download: bool = False) -> None:
        from synthetic_data import synthetic_mnist

        (x_train, y_train), (x_test, y_test) = synthetic_mnist()
        self.data, self.targets = (x_train, y_train) if train else (x_test, y_test)
        self.transform, self.target_transform = transform, target_transform

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        image, target = self.data[index], int(self.targets[index])
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target
