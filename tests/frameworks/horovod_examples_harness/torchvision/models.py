"""models.resnet50: ResNet-50 (bottleneck blocks 3-4-6-3, 25.6 M parameters), randomly initialised."""

from __future__ import annotations

import torch
from torch import nn


class _Bottleneck(nn.Module):
    def __init__(self, channels_in: int, width: int, stride: int) -> None:
        super().__init__()
        out = width * 4
        self.body = nn.Sequential(
            nn.Conv2d(channels_in, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(width),
            nn.ReLU(inplace=True), nn.Conv2d(width, out, 1, bias=False), nn.BatchNorm2d(out))
        self.shortcut = (nn.Identity() if stride == 1 and channels_in == out else
                         nn.Sequential(nn.Conv2d(channels_in, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


def resnet50(num_classes: int = 1000) -> nn.Module:
    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64),
                               nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2, padding=1)]
    channels = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for block in range(blocks):
            layers.append(_Bottleneck(channels, width, stride if block == 0 else 1))
            channels = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_classes)]
    return nn.Sequential(*layers)
