"""Horovod's Keras docs told every user to write ``model.compile(..., experimental_run_tf_function=False)`` (TF
2.0-2.3 needed it for the allreduce to run); Keras 3 refuses the argument. Importing hpcvod's Keras module makes
``compile`` drop it, with one warning line per process, so that such a script runs with its import line changed."""

from __future__ import annotations

import functools
import sys
from typing import Any

import keras

# Keras 2 compile arguments that only tuned how TF 2.0-2.3 ran the step; dropping one changes no result.
_DROPPED = ("experimental_run_tf_function",)
_warned: set[str] = set()


def accept_keras2_compile_arguments() -> None:
    """Wraps Keras's ``compile`` (once) so that it drops the arguments in ``_DROPPED``.

    The wrapper replaces the method on the class that defines it (Keras 3's Trainer), not on ``keras.Model``:
    Keras's ``load_model`` skips compiling a model whose class overrides that method.
    """
    owner = next(cls for cls in keras.Model.__mro__ if "compile" in cls.__dict__)
    compile_fn = owner.__dict__["compile"]
    if getattr(compile_fn, "_hpcvod_keras2_arguments", False):
        return

    @functools.wraps(compile_fn)
    def compile(self: keras.Model, *args: Any, **kwargs: Any) -> Any:  # noqa: A001 - keeps Keras's name
        for name in _DROPPED:
            if name in kwargs:
                value = kwargs.pop(name)
                if name not in _warned:
                    _warned.add(name)
                    print(f"hpcvod: model.compile(): dropped {name}={value!r}, a Keras 2 argument that Keras 3 "
                          f"refuses (remove it from the call)", file=sys.stderr, flush=True)
        return compile_fn(self, *args, **kwargs)

    compile._hpcvod_keras2_arguments = True
    owner.compile = compile
