"""pmap: data-parallel training on several devices (CPU threads or GPUs) from Python.

A thin layer over the C library through ctypes. numpy arrays are passed without a copy when they
are C-contiguous float32 (features, targets) or int32 (labels); anything else is converted once,
explicitly, and the caller's array is never modified.

    import numpy as np, pmap
    with pmap.Context(backend="cpu", devices=4) as ctx:
        model = pmap.Model(input_shape=(1,)).dense(1)
        params = ctx.params(model, pmap.sgd(0.5), seed=0)
        loss = params.update(xs, ys)        # one step over the global batch
"""
from ._lib import Error, version
from ._api import Context, Model, Params, adam, adamw, sgd

__all__ = ["Context", "Model", "Params", "Error", "sgd", "adam", "adamw", "version"]
