"""A stand-in for the few parts of torchvision Horovod's PyTorch examples use (datasets.MNIST with synthetic
images, transforms.Compose/ToTensor/Normalize, models.resnet50), for the examples' harness only."""

from torchvision import datasets, models, transforms  # noqa: F401

__version__ = "0.0+hpcvod.harness"
