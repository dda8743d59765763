"""Params of a model that only a Python function knows (Context.params_custom, over
pmap_params_create_custom): on every device, at once, the function gets numpy arrays of the
parameters and of the device's rows and returns the mean loss and its gradient; pmap averages
them over the devices and steps the optimizer as for any model.

The function runs on the devices' worker threads (the context's caller only waits:
pmap_config.caller_waits), each taking the GIL for its Python code, so no Ctrl-C is ever raised
inside it. Anything it raises, or a return value of the wrong kind, fails the step on every device
with nothing changed; update() raises a pmap.Error naming the device, with the exception as its
__cause__ (a KeyboardInterrupt or SystemExit it raises itself is raised again as it was)."""
import collections
import collections.abc
import ctypes
import math
import threading
import traceback

import numpy as np

from . import _convert
from ._convert import F32, I32, array
from ._lib import GRAD_FN, ArgumentError, ArgumentTypeError, Error, check, lib

StepInfo = collections.namedtuple("StepInfo", "device devices row0 step scale")
StepInfo.__doc__ = """What a gradient function called with info=True also gets: the device's global
index and the device count, the index of its first row in the global batch, the step the
gradient is for (Params.step before it) and the weight of these rows in the device's share (1
unless micro-batches or an uneven batch split it; pmap applies it)."""

_F32_MAX = float(np.finfo(np.float32).max)
_CTYPES = {F32: ctypes.c_float, I32: ctypes.c_int32}
_DTYPES = {F32: np.float32, I32: np.int32}


def _view(addr, shape, code):
    """A read-only numpy array over memory of the library (valid during the call only)."""
    n = int(np.prod(shape)) if shape else 1
    if n == 0:
        return np.empty(shape, _DTYPES[code])
    buf = (_CTYPES[code] * n).from_address(addr)
    a = np.frombuffer(buf, dtype=_DTYPES[code]).reshape(shape)
    a.flags.writeable = False
    return a


class _Returned(ArgumentError):
    """The function returned something that is not (loss, gradient) of the right shape."""


class _Gradient:
    """The pmap_grad_fn around the user's function, and what it raised, by device."""

    def __init__(self, fn, layout, count, with_info):
        self.fn, self.layout, self.count, self.with_info = fn, layout, count, with_info
        self.errors = {}   # device -> the exception of its last failed call
        self.views = {}    # device -> (params address, the params given to fn)
        self.lock = threading.Lock()
        self.c = GRAD_FN(self._call)

    def take_errors(self):
        with self.lock:
            errors, self.errors = self.errors, {}
        return errors

    def _params(self, d, addr):
        have = self.views.get(d)
        if have is None or have[0] != addr:
            flat = _view(addr, (self.count,), F32)
            if self.layout is None:
                given = flat
            else:
                given, at = {}, 0
                for name, shape in self.layout:
                    n = int(np.prod(shape))
                    given[name] = flat[at:at + n].reshape(shape)
                    at += n
            have = self.views[d] = (addr, given)
        return have[1]

    def _gradient(self, g):
        if self.layout is None:
            return self._block(g, (self.count,), "the gradient")
        if not isinstance(g, collections.abc.Mapping) or set(g) != {n for n, _ in self.layout}:
            names = [n for n, _ in self.layout]
            got = sorted(g) if isinstance(g, collections.abc.Mapping) else type(g).__name__
            raise _Returned(f"the gradient must be a dict with the parameters' keys {names}, "
                            f"got {got}")
        return np.concatenate([self._block(g[n], s, f"the gradient of {n!r}")
                               for n, s in self.layout]) if self.layout else np.empty(0, np.float32)

    @staticmethod
    def _block(g, shape, what):
        a = np.asarray(g)
        if a.shape != tuple(shape):
            raise _Returned(f"{what} has shape {a.shape}, the parameters {tuple(shape)}")
        if a.dtype.kind not in "iuf":
            raise _Returned(f"{what} has dtype {a.dtype}, not real numbers")
        if not a.size:
            return np.empty(0, np.float32)
        try:
            return _convert.values(a, what)
        except ArgumentError as e:  # the function returned it; it raised nothing
            detail = e.message[len(what) + 2:] if e.message.startswith(what + ": ") else e.message
            raise _Returned(f"the gradient function returned {what} that float32 cannot hold: "
                            f"{detail}") from None

    @staticmethod
    def _loss(v):
        a = np.asarray(v)
        if a.size != 1 or a.dtype.kind not in "iuf":
            raise _Returned(f"the loss must be one real number, got {type(v).__name__} of shape "
                            f"{a.shape} and dtype {a.dtype}")
        loss = float(a.reshape(()))
        # NaN and inf go on to the numeric guard; a finite loss float32 cannot hold would reach
        # it as inf, and the report would blame the values instead of the function's return.
        with np.errstate(over="ignore"):
            fits = np.isfinite(np.float32(loss))
        if math.isfinite(loss) and not fits:
            raise _Returned(f"the gradient function returned the loss {loss!r}, finite but "
                            f"beyond float32's range (±{_F32_MAX:.4g})")
        return loss

    def _call(self, args_p, user):
        d = -1
        try:
            a = args_p.contents
            d = lib.pmap_axis_index(a.dev)
            params = self._params(d, a.params)
            xs = _view(a.xs.data, tuple(a.xs.shape[:a.xs.rank]), a.xs.dtype)
            ys = _view(a.ys.data, tuple(a.ys.shape[:a.ys.rank]), a.ys.dtype)
            if self.with_info:
                info = StepInfo(d, lib.pmap_axis_size(a.dev), a.row0, a.step, a.scale)
                out = self.fn(params, xs, ys, info)
            else:
                out = self.fn(params, xs, ys)
            if not isinstance(out, (tuple, list)) or len(out) != 2:
                raise _Returned("the gradient function must return (loss, gradient), got "
                                f"{type(out).__name__}")
            loss, g = self._loss(out[0]), self._gradient(out[1])
            if a.num_params:
                grads = np.frombuffer((ctypes.c_float * a.num_params).from_address(a.grads),
                                      dtype=np.float32)
                grads += np.float32(a.scale) * g
            ctypes.c_float.from_address(a.loss).value = loss
            return 0
        except BaseException as e:  # noqa: B902: every exception fails the step, none escapes
            return self._failed(d, e)

    def _failed(self, d, e):
        if e.__traceback__ is not None:
            traceback.clear_frames(e.__traceback__)  # the frames held views of library memory
        with self.lock:
            self.errors[d] = e
        status = 1 if isinstance(e, ArgumentError) else 4
        what = (e.message if isinstance(e, _Returned)
                else f"the gradient function raised {type(e).__name__}: {e}")
        lib.pmap_set_error(status, b"%s", what.encode("utf-8", "replace"))
        return status


def layout_of(init, call):
    """(flat float32 initial values, [(name, shape)] or None) of init: an array of any shape
    (flat), or a dict of arrays (named blocks, in the dict's order)."""
    if isinstance(init, collections.abc.Mapping):
        layout, parts = [], []
        for name, v in init.items():
            if not isinstance(name, str):
                raise ArgumentTypeError(f"{call}: parameter names must be str, got "
                                        f"{type(name).__name__} {name!r}")
            a = np.asarray(v)
            layout.append((name, a.shape))
            parts.append(_convert.values(a.reshape(-1) if a.ndim else a.reshape(1), name)
                         if a.size else np.empty(0, np.float32))
        flat = np.concatenate(parts) if parts else np.empty(0, np.float32)
        return np.ascontiguousarray(flat, np.float32), layout
    a = np.asarray(init)
    if a.ndim != 1:
        raise ArgumentError(f"{call}: init must be a flat array of the parameters (or a dict of "
                            f"arrays), got shape {a.shape}")
    return (_convert.values(a, "init") if a.size else np.empty(0, np.float32)), None


def named(flat, layout):
    out, at = {}, 0
    for name, shape in layout:
        n = int(np.prod(shape))
        out[name] = flat[at:at + n].reshape(shape).copy()
        at += n
    return out


def set_named(flat, layout, values):
    where, at = {}, 0
    for name, shape in layout:
        where[name] = (at, tuple(shape))
        at += int(np.prod(shape))
    return _convert.assign_named(flat, where, values, "Params.set_named")


def update(p, xs, ys, call):
    """One step of custom params p: pmap_update, and the function's exception when it failed."""
    keep = []
    try:
        x = array(xs, F32, "xs", keep)
        y_in = ys if isinstance(ys, np.ndarray) else _convert._asarray(ys, "ys")
        y = array(y_in, I32 if y_in.dtype.kind in "iu" else F32, "ys", keep)
    except ArgumentError as e:
        p._refuse_step(call, e)
        raise
    loss = ctypes.c_float()
    with p._handle.hold(call):
        h, grad = p._handle.get(call), p._handle.keep
        grad.take_errors()
        st = lib.pmap_update(h, ctypes.byref(x), ctypes.byref(y), ctypes.byref(loss))
    if st:
        errors = grad.take_errors()
        if errors:
            e = errors[min(errors)]
            if not isinstance(e, Exception):
                raise e  # KeyboardInterrupt, SystemExit raised by the function itself
            message = lib.pmap_last_error().decode("utf-8", "replace")
            if isinstance(e, _Returned):
                raise ArgumentError(message) from None
            if isinstance(e, ArgumentError):
                raise ArgumentError(message) from e
            raise Error(st, message) from e
        check(st)
    return float(loss.value)
