"""Checks of what Python callers pass, before anything reaches the C library: exact integers in
the range of the C type, real numbers, flags, names, paths, and numpy arrays, converted only where
the conversion keeps every value. Nothing here calls back into the library."""
import numbers
import operator
import os

import numpy as np

from . import _lib
from ._lib import ArgumentError, ArgumentTypeError, Array

F32, I32 = 0, 1
INT32 = (-(2 ** 31), 2 ** 31 - 1)
INT64 = (-(2 ** 63), 2 ** 63 - 1)
_F32_MAX = float(np.finfo(np.float32).max)
_F32_DTYPE, _I32_DTYPE = np.dtype(np.float32), np.dtype(np.int32)


def integer(name, v, lo, hi):
    """v as a Python int in [lo, hi]; bools and non-integers (2.0, "3") are refused."""
    if isinstance(v, (bool, np.bool_)):
        raise ArgumentTypeError(f"{name} must be an integer, got the bool {v!r}")
    try:
        i = operator.index(v)
    except TypeError:
        raise ArgumentTypeError(f"{name} must be an integer, got {type(v).__name__} {v!r}") \
            from None
    if not lo <= i <= hi:
        raise ArgumentError(f"{name} {i} is outside {lo}..{hi}")
    return i


def real(name, v):
    """v as a float; bools, strings and complex numbers are refused."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise ArgumentTypeError(f"{name} must be a real number, got {type(v).__name__} {v!r}")
    try:
        return float(v)
    except OverflowError:
        text = str(v)
        raise ArgumentError(f"{name} {text[:12]}... ({len(text)} digits) is beyond the range of "
                            "a float") from None


def flag(name, v):
    """v as 0 or 1: True, False, 1 or 0 (a string such as "off" is refused, not taken as true)."""
    if isinstance(v, (bool, np.bool_)):
        return int(bool(v))
    if isinstance(v, numbers.Integral) and int(v) in (0, 1):
        return int(v)
    raise ArgumentTypeError(f"{name} must be True or False (or 1 or 0), got {type(v).__name__} "
                            f"{v!r}")


def choice(name, v, table):
    """table[v] for a str v that is one of table's keys (ArgumentTypeError for a v that is not a
    str, ArgumentError for another str)."""
    if not isinstance(v, str):
        raise ArgumentTypeError(f"{name} must be a str, one of {sorted(table)}; got "
                                f"{type(v).__name__} {v!r}")
    if v not in table:
        raise ArgumentError(f"{name} {v!r} is not one of {sorted(table)}")
    return table[v]


def path(name, p):
    """p (str, bytes or os.PathLike) as the bytes the C library opens (os.fsencode)."""
    try:
        b = os.fsencode(p)
    except TypeError:
        raise ArgumentTypeError(f"{name} must be a str, bytes or os.PathLike path, got "
                                f"{type(p).__name__} {p!r}") from None
    if b"\0" in b:
        raise ArgumentError(f"{name} {p!r} contains a NUL byte")
    return b


def _first(a, mask):
    """The first element of a where mask holds: (its value, "row i" or "index (i, j, ...)")."""
    idx = tuple(int(i) for i in np.argwhere(mask)[0])
    return a[idx], f"row {idx[0]}" if a.ndim == 1 else f"index {idx}"


def _numbers(a, name, labels, kind="labels"):
    """Refuses dtypes that do not hold real numbers, or labels (kind: "labels" or "token ids")
    that are not integers."""
    k = a.dtype.kind
    if k == "c":
        raise ArgumentTypeError(f"{name}: complex values ({a.dtype}) are not accepted: their "
                                "imaginary part would be lost; pass the real part (.real) or "
                                "the parts as separate features")
    if k == "O":
        raise ArgumentTypeError(f"{name}: an object array (values numpy could not convert to one "
                                "number type, such as None or integers beyond 64 bits) is not "
                                "accepted")
    if k not in "biuf":
        raise ArgumentTypeError(f"{name}: dtype {a.dtype} does not hold real numbers")
    if labels and k not in "iu":
        raise ArgumentTypeError(f"{name}: {kind} must be integers, got {a.dtype}")


def _fit(a, name, labels, classes, kind="labels"):
    """a converted to float32 or int32, refusing any value the conversion would change beyond
    float32 rounding: labels (or token ids) outside int32, finite values beyond float32's
    range."""
    if labels:
        if a.size and a.dtype.itemsize >= 4 and a.dtype != np.int32:
            if a.max() > INT32[1] or a.min() < INT32[0]:
                v, where = _first(a, (a > INT32[1]) | (a < INT32[0]))
                one, what = (("token id", "token ids are indices into the vocabulary")
                             if kind == "token ids" else ("label", "labels are class indices"))
                raise ArgumentError(f"{name}: {one} {int(v)} at {where} does not fit int32; "
                                    f"{what} in [0, {classes})")
        return np.ascontiguousarray(a, dtype=np.int32)
    with np.errstate(over="ignore"):  # an overflow is reported below, by value and place
        out = np.ascontiguousarray(a, dtype=np.float32)
    if a.dtype.kind == "f" and a.dtype.itemsize > 4 and a.size and np.isinf(out).any():
        over = np.isinf(out) & np.isfinite(a)
        if over.any():
            v, where = _first(a, over)
            raise ArgumentError(f"{name}: value {float(v)!r} at {where} is finite but beyond "
                                f"float32's range (±{_F32_MAX:.4g})")
    return out


def _asarray(x, name):
    if isinstance(x, np.ma.MaskedArray) and np.ma.count_masked(x):
        raise ArgumentError(f"{name}: a masked array with {np.ma.count_masked(x)} masked values; "
                            "fill them (.filled(value)) or drop them first")
    try:
        return np.asarray(x)
    except (TypeError, ValueError) as e:
        raise ArgumentError(f"{name}: not an array of numbers ({e})") from None


def array(x, dtype, name, keep, classes=0, kind="labels"):
    """A pmap_array over x: without a copy when x is an aligned C-contiguous array of the C dtype
    (float32, or int32 for labels and token ids: kind names them in messages); otherwise over
    one checked conversion, kept alive in `keep`. x itself is never written."""
    labels = dtype == I32
    a = x if type(x) is np.ndarray else _asarray(x, name)
    if a.ndim < 1 or a.ndim > _lib.MAX_RANK:
        raise ArgumentError(f"{name}: rank {a.ndim} is outside 1..{_lib.MAX_RANK}")
    flags = a.flags
    if a.dtype != (_I32_DTYPE if labels else _F32_DTYPE) or not (flags.c_contiguous and
                                                                   flags.aligned):
        _numbers(a, name, labels, kind)
        a = _fit(a, name, labels, classes, kind)
    keep.append(a)
    s = Array()
    s.data = a.ctypes.data
    s.dtype = dtype
    s.rank = a.ndim
    for i, n in enumerate(a.shape):
        s.shape[i] = n
    return s


def values(x, name):
    """x, of any shape, as one flat checked float32 array (for Params.write)."""
    a = _asarray(x, name)
    if a.ndim == 0:
        raise ArgumentError(f"{name}: a scalar; pass the flat array of every parameter")
    keep = []
    array(a.reshape(-1), F32, name, keep)
    return keep[0]


def assign_named(flat, where, blocks, call):
    """flat (a copy of every parameter) with blocks (a dict: block name -> array) written at
    where[name] = (offset, shape); a name or shape that does not match raises before the caller
    writes flat back."""
    for name, v in blocks.items():
        if name not in where:
            raise ArgumentError(f"{call}: no parameter block {name!r}")
        a = np.asarray(v)
        at, shape = where[name]
        if a.shape != tuple(shape):
            raise ArgumentError(f"{call}: {name} has shape {tuple(shape)}, got {a.shape}")
        flat[at:at + a.size] = values(a, name) if a.size else []
    return flat
