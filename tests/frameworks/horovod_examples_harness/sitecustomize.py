"""The offline harness of Horovod's examples (tests/frameworks/test_horovod_examples.py): put this folder first on
PYTHONPATH and the examples' data sets are synthetic arrays of the real shapes, their loops short.

- ``keras.datasets.mnist.load_data`` (also ``tf.keras``'s) returns random uint8 images (N, 28, 28) and labels
  0-9 instead of downloading MNIST;
- ``torchvision`` is the stand-in package beside this file (datasets.MNIST, transforms, models.resnet50): PyPI's
  torchvision does not install beside torch 2.13 here;
- ``mxnet.test_utils.download`` of MNIST writes a zip of synthetic IDX files;
- ``Model.fit`` runs at most FIT_EPOCHS epochs of at most FIT_STEPS steps, and ``tf.data.Dataset.take(n)`` takes
  at most TAKE_STEPS elements, so that a script written to train for minutes finishes in seconds in CI.

Each patch is applied when its module is first imported (nothing is imported here): the scripts' own code is
unchanged. Only the test's ranks see this folder.
"""

from __future__ import annotations

import importlib.abc
import inspect
import sys
from typing import Any, Callable

from synthetic_data import synthetic_mnist

FIT_EPOCHS = 2
FIT_STEPS = 3
TAKE_STEPS = 12


def _keras_mnist(module: Any) -> None:
    def load_data(path: str = "mnist.npz") -> tuple[tuple[Any, Any], tuple[Any, Any]]:
        return synthetic_mnist()
    module.load_data = load_data


def _keras_fit(module: Any) -> None:
    fit = module.Model.fit
    signature = inspect.signature(fit)

    def short_fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        given = bound.arguments
        given["epochs"] = min(given.get("epochs", 1), FIT_EPOCHS)
        for key in ("steps_per_epoch", "validation_steps"):
            if given.get(key) is not None:
                given[key] = min(given[key], FIT_STEPS)
        return fit(*bound.args, **bound.kwargs)
    module.Model.fit = short_fit


def _tf_take(module: Any) -> None:
    take = module.DatasetV2.take

    def short_take(self: Any, count: Any, name: Any = None) -> Any:
        if isinstance(count, int) and count > TAKE_STEPS:
            count = TAKE_STEPS
        return take(self, count, name=name)
    module.DatasetV2.take = short_take


def _mxnet_download(module: Any) -> None:
    """``mxnet.test_utils.download`` of Horovod's mnist.zip writes a zip of synthetic MNIST in IDX files instead."""
    def download(url: str, fname: str | None = None, dirname: str | None = None, overwrite: bool = False,
                 retries: int = 5) -> str:
        import os
        import struct
        import zipfile

        path = os.path.join(dirname or ".", fname or url.split("/")[-1])
        (x_train, y_train), (x_test, y_test) = synthetic_mnist()
        with zipfile.ZipFile(path, "w") as archive:
            for prefix, images, labels in (("train", x_train, y_train), ("t10k", x_test, y_test)):
                archive.writestr(f"{prefix}-images-idx3-ubyte", struct.pack(">IIII", 2051, len(images), 28, 28)
                                 + images.tobytes())
                archive.writestr(f"{prefix}-labels-idx1-ubyte", struct.pack(">II", 2049, len(labels))
                                 + labels.tobytes())
        return path
    module.download = download


PATCHES: dict[str, Callable[[Any], None]] = {
    "mxnet.test_utils": _mxnet_download,
    "keras.src.datasets.mnist": _keras_mnist,
    "keras.src.models.model": _keras_fit,
    "tensorflow.python.data.ops.dataset_ops": _tf_take,
}


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds a PATCHES module as the other finders do, and applies its patch once the module has run."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                run_module = spec.loader.exec_module

                def exec_module(module: Any) -> None:
                    run_module(module)
                    PATCHES[name](module)
                spec.loader.exec_module = exec_module
                return spec
        return None


sys.meta_path.insert(0, _PatchAfterImport())
