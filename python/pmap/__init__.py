"""pmap: data-parallel training on several devices (CPU threads or GPUs) from Python.

A thin layer over the C library through ctypes. numpy arrays are passed without a copy when they
are aligned C-contiguous float32 (features, targets) or int32 (labels); anything else is converted
once, checked (labels must fit int32, complex and non-numeric arrays are refused, a finite value
beyond float32's range is refused), and the caller's array is never modified. Any thread may use
any object; close() waits for a running call, and a closed object raises pmap.Error. Models copy
and pickle; contexts and params refuse (save/load, read/write copy training state). In a forked
child the parent's contexts and params raise pmap.Error. docs/python.md is the reference.

    import numpy as np, pmap
    with pmap.Context(backend="cpu", devices=4) as ctx:
        model = pmap.Model(input_shape=(1,)).dense(1)
        params = ctx.params(model, pmap.sgd(0.5), seed=0)
        loss = params.update(xs, ys)        # one step over the global batch
"""
from ._lib import ArgumentError, ArgumentTypeError, Error, version
from ._api import Context, CustomParams, Model, Params, bf16_support
from ._custom import StepInfo
from ._optim import adam, adamw, sgd

__version__ = version()  # the loaded library's pmap_version(), the project's version

__all__ = ["Context", "Model", "Params", "CustomParams", "StepInfo", "Error", "ArgumentError",
           "ArgumentTypeError", "sgd", "adam", "adamw", "bf16_support", "version", "__version__"]
