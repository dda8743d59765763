"""The Pythonic layer: Context, Model, Params and the optimizer settings."""
import ctypes
import weakref

import numpy as np

from . import _lib
from ._lib import Array, Config, Error, Optimizer, check, lib

_F32, _I32 = 0, 1
_BACKENDS = {"auto": 0, "cpu": 1, "cuda": 2}
_LOSSES = {"mse": 0, "softmax_xent": 1}
_KINDS = {"sgd": 0, "adam": 1, "adamw": 2}
_SCHEDULES = {"constant": 0, "warmup_cosine": 1, "warmup_linear": 2}


def _optimizer(kind, lr, momentum=0.0, beta1=0.9, beta2=0.999, eps=1e-8, clip_norm=0.0,
               weight_decay=0.0, nesterov=False, schedule="constant", warmup_steps=0,
               decay_steps=0, final_lr=0.0):
    if schedule not in _SCHEDULES:
        raise ValueError(f"schedule {schedule!r} is not one of {sorted(_SCHEDULES)}")
    o = Optimizer()
    o.kind = _KINDS[kind]
    o.lr, o.momentum, o.beta1, o.beta2, o.eps = lr, momentum, beta1, beta2, eps
    o.clip_norm, o.weight_decay, o.nesterov = clip_norm, weight_decay, int(bool(nesterov))
    o.schedule, o.warmup_steps, o.decay_steps = _SCHEDULES[schedule], warmup_steps, decay_steps
    o.final_lr = final_lr
    if kind == "sgd":
        o.beta1 = o.beta2 = o.eps = 0.0
    return o


def sgd(lr, momentum=0.0, **kw):
    """SGD settings (pmap_sgd); keywords: nesterov, weight_decay, clip_norm, schedule,
    warmup_steps, decay_steps, final_lr."""
    return _optimizer("sgd", lr, momentum=momentum, **kw)


def adam(lr, **kw):
    """Adam settings (pmap_adam): beta1 0.9, beta2 0.999, eps 1e-8 unless given."""
    return _optimizer("adam", lr, **kw)


def adamw(lr, weight_decay=0.01, **kw):
    """AdamW settings (pmap_adamw): Adam with decoupled weight decay."""
    return _optimizer("adamw", lr, weight_decay=weight_decay, **kw)


def _as_array(x, dtype, name, keep):
    """A pmap_array over x without a copy when x is C-contiguous of the right dtype; otherwise
    over one converted copy (kept alive in `keep`). x itself is never written."""
    a = np.asarray(x)
    want = np.float32 if dtype == _F32 else np.int32
    if a.dtype != want or not a.flags.c_contiguous:
        if dtype == _I32 and not np.issubdtype(a.dtype, np.integer):
            raise TypeError(f"{name}: labels must be integers, got {a.dtype}")
        a = np.ascontiguousarray(a, dtype=want)
    if a.ndim < 1 or a.ndim > _lib.MAX_RANK:
        raise ValueError(f"{name}: rank {a.ndim} is outside 1..{_lib.MAX_RANK}")
    keep.append(a)
    s = Array()
    s.data = a.ctypes.data
    s.dtype = dtype
    s.rank = a.ndim
    for i, n in enumerate(a.shape):
        s.shape[i] = n
    return s


class Model:
    """A sequential model: Model(input_shape=(10,)).dense(32).relu().dense(1).loss("mse").
    Each layer is checked when added (pmap.Error with the C message)."""

    def __init__(self, input_shape):
        shape = tuple(int(n) for n in input_shape)
        self._h = ctypes.c_void_p()
        c = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        check(lib.pmap_model_create(len(shape), c, ctypes.byref(self._h)))
        self.input_shape = shape

    def dense(self, units):
        check(lib.pmap_model_add_dense(self._h, int(units)))
        return self

    def relu(self):
        check(lib.pmap_model_add_relu(self._h))
        return self

    def conv2d(self, out_channels, kernel=3, stride=1, pad=0):
        kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
        check(lib.pmap_model_add_conv2d(self._h, int(out_channels), kh, kw, stride, pad))
        return self

    def flatten(self):
        check(lib.pmap_model_add_flatten(self._h))
        return self

    # The layers of docs/models.md, "Layers".
    def tanh(self):
        check(lib.pmap_model_add_tanh(self._h))
        return self

    def sigmoid(self):
        check(lib.pmap_model_add_sigmoid(self._h))
        return self

    def gelu(self):
        check(lib.pmap_model_add_gelu(self._h))
        return self

    def layernorm(self):
        check(lib.pmap_model_add_layernorm(self._h))
        return self

    def maxpool2d(self, kernel=2, stride=None):
        kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
        check(lib.pmap_model_add_maxpool2d(self._h, kh, kw, stride or kh))
        return self

    def avgpool2d(self, kernel=2, stride=None):
        kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
        check(lib.pmap_model_add_avgpool2d(self._h, kh, kw, stride or kh))
        return self

    def global_avgpool(self):
        check(lib.pmap_model_add_global_avgpool(self._h))
        return self

    def dropout(self, rate):
        check(lib.pmap_model_add_dropout(self._h, float(rate)))
        return self

    def batchnorm(self, cross_replica=True):
        """Batch norm; cross_replica: statistics of the global batch across devices."""
        check(lib.pmap_model_add_batchnorm(self._h, 1 if cross_replica else 0))
        return self

    def begin_residual(self):
        """The layers until end_residual() form f; the block computes x + f(x)."""
        check(lib.pmap_model_begin_residual(self._h))
        return self

    def end_residual(self):
        check(lib.pmap_model_end_residual(self._h))
        return self

    def loss(self, name):
        if name not in _LOSSES:
            raise ValueError(f"loss {name!r} is not one of {sorted(_LOSSES)}")
        check(lib.pmap_model_set_loss(self._h, _LOSSES[name]))
        self._loss = name
        return self

    @property
    def num_params(self):
        return lib.pmap_model_num_params(self._h)

    @property
    def output_shape(self):
        rank = ctypes.c_int()
        shape = (ctypes.c_int64 * _lib.MAX_RANK)()
        lib.pmap_model_output_shape(self._h, ctypes.byref(rank), shape)
        return tuple(shape[i] for i in range(rank.value))

    def close(self):
        if self._h:
            lib.pmap_model_destroy(self._h)
            self._h = ctypes.c_void_p()

    def __del__(self):
        self.close()


class Context:
    """The device mesh: Context(backend="cpu", devices=4, timeout=0.0, numeric_guard=True,
    uneven_batches=False, shard_optimizer=None). shard_optimizer: True shards the optimizer
    over the devices (ZeRO-1), False replicates it, None leaves it to the library (the
    PMAP_SHARD_OPTIMIZER variable, else sharded from 65536 parameters on). Close it with close() or a with block; closing
    it closes its params."""

    def __init__(self, backend="auto", devices=None, timeout=0.0, numeric_guard=True,
                 uneven_batches=False, shard_optimizer=None):
        if backend not in _BACKENDS:
            raise ValueError(f"backend {backend!r} is not one of {sorted(_BACKENDS)}")
        cfg = Config()
        cfg.backend = _BACKENDS[backend]
        cfg.num_devices = -1 if devices is None else int(devices)
        cfg.timeout_s = float(timeout)
        cfg.numeric_guard = 0 if numeric_guard else 1
        cfg.uneven_batches = int(bool(uneven_batches))
        cfg.shard_optimizer = 0 if shard_optimizer is None else (2 if shard_optimizer else 1)
        self._h = ctypes.c_void_p()
        check(lib.pmap_ctx_create(ctypes.byref(cfg), ctypes.byref(self._h)))
        self._params = weakref.WeakSet()

    @property
    def devices(self):
        return lib.pmap_ctx_num_devices(self._h)

    @property
    def backend(self):
        return lib.pmap_backend_name(lib.pmap_ctx_backend(self._h)).decode()

    def params(self, model, optimizer, seed=0):
        """Training state of model on every device, drawn from seed."""
        if not self._h:
            raise Error(1, "the context is closed")
        p = Params(self, model, optimizer, seed)
        self._params.add(p)
        return p

    def close(self):
        """Closes every params of the context, then stops its threads. Idempotent."""
        for p in list(self._params):
            p.close()
        if self._h:
            check(lib.pmap_ctx_destroy(self._h))
            self._h = ctypes.c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class Params:
    """Replicated training state; made by Context.params."""

    def __init__(self, ctx, model, optimizer, seed):
        self._ctx = ctx
        self._h = ctypes.c_void_p()
        check(lib.pmap_params_create(ctx._h, model._h, ctypes.byref(optimizer), int(seed),
                                     ctypes.byref(self._h)))
        self._classify = getattr(model, "_loss", "mse") == "softmax_xent"
        self._out = model.output_shape

    def _live(self):
        if not self._h:
            raise Error(1, "the params are closed")

    @property
    def count(self):
        return lib.pmap_params_count(self._h)

    @property
    def sharded(self):
        """Whether the optimizer is sharded over the devices."""
        self._live()
        return bool(lib.pmap_params_sharded(self._h))

    @property
    def optimizer_bytes(self):
        """Bytes of optimizer state each device holds."""
        self._live()
        return lib.pmap_params_optimizer_bytes(self._h)

    @property
    def step(self):
        return lib.pmap_params_step(self._h)

    def update(self, xs, ys):
        """One data-parallel step on the global batch (xs, ys); returns the mean loss."""
        self._live()
        keep = []
        x = _as_array(xs, _F32, "xs", keep)
        y = _as_array(ys, _I32 if self._classify else _F32, "ys", keep)
        loss = ctypes.c_float()
        check(lib.pmap_update(self._h, ctypes.byref(x), ctypes.byref(y), ctypes.byref(loss)))
        return float(loss.value)

    def predict(self, xs):
        """The model's outputs for xs, an ndarray (rows, outputs...) float32."""
        self._live()
        keep = []
        x = _as_array(xs, _F32, "xs", keep)
        out = np.empty((x.shape[0],) + self._out, dtype=np.float32)
        o = _as_array(out, _F32, "out", keep)
        check(lib.pmap_predict(self._h, ctypes.byref(x), ctypes.byref(o)))
        return out

    def read(self, device=0):
        """A copy of device `device`'s replica of the parameters (float32, flat)."""
        self._live()
        out = np.empty(self.count, dtype=np.float32)
        check(lib.pmap_params_read(self._h, int(device), out.ctypes.data_as(
            ctypes.POINTER(ctypes.c_float)), out.size))
        return out

    def write(self, values):
        """Sets every replica's parameters to values (flat, count floats)."""
        self._live()
        a = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
        check(lib.pmap_params_write(self._h, a.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                                    a.size))

    def set_micro_batches(self, k):
        self._live()
        check(lib.pmap_params_set_micro_batches(self._h, int(k)))

    def save(self, path):
        """Checkpoints the whole training state to path (atomic)."""
        self._live()
        check(lib.pmap_params_save(self._h, str(path).encode()))

    def load(self, path):
        """Restores a checkpoint written by save (validated first; nothing changes on error)."""
        self._live()
        check(lib.pmap_params_load(self._h, str(path).encode()))

    def verify(self):
        """Raises pmap.Error when the replicas differ."""
        self._live()
        check(lib.pmap_params_verify(self._h))

    def close(self):
        if self._h:
            lib.pmap_params_destroy(self._h)
            self._h = ctypes.c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()
