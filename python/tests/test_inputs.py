"""What the package accepts and refuses, at every entry point that converts arguments: labels that
do not fit int32, complex, object, string and masked arrays, float64 values beyond float32, odd
layouts (misaligned, byte-swapped, strided), ranks 0 and 5, integers that would be truncated
(bools, floats, values past the C type), flags given as strings, and paths of every type. A
refusal is a pmap.Error (also a ValueError or TypeError) naming the value, and changes nothing."""
import pathlib

import numpy as np
import pytest

import pmap


def classifier(ctx, classes=3, seed=7):
    model = pmap.Model(input_shape=(4,)).dense(classes).loss("softmax_xent")
    return ctx.params(model, pmap.sgd(0.1), seed=seed)


def data(rows=8, classes=3):
    rng = np.random.default_rng(1)
    return (rng.standard_normal((rows, 4)).astype(np.float32),
            rng.integers(0, classes, rows).astype(np.int64))


def refused(params, call, kind=pmap.Error, match=None):
    """call() raises kind (matching match) and leaves the parameters and step as they were."""
    before, step = params.read(), params.step
    with pytest.raises(kind, match=match) as e:
        call()
    assert isinstance(e.value, pmap.Error), f"{type(e.value).__name__} is not a pmap.Error"
    assert np.array_equal(params.read(), before) and params.step == step
    return e.value


@pytest.mark.parametrize("offset", [2 ** 32, 2 ** 31, -(2 ** 32), 2 ** 40 + 1])
def test_labels_beyond_int32_are_refused_not_wrapped(offset):
    x, y = data()
    with pmap.Context(backend="cpu", devices=2) as ctx:
        p = classifier(ctx)
        e = refused(p, lambda: p.update(x, y + offset), ValueError, "does not fit int32")
        assert str(int(y[0] + offset)) in e.message and "[0, 3)" in e.message
        if offset > 0:
            dtype = np.uint32 if offset < 2 ** 32 else np.uint64
            refused(p, lambda: p.update(x, (y + offset).astype(dtype)), ValueError,
                    "does not fit int32")
        refused(p, lambda: p.update(x, [int(v) + offset for v in y]), ValueError)
        p.update(x, y)  # the same labels in range train
        p.update(x, y.astype(np.uint64))
        p.update(x, y.astype(np.int8))
        assert p.step == 3


def test_labels_out_of_range_negative_float_and_bool_are_refused():
    x, y = data()
    with pmap.Context(backend="cpu", devices=2) as ctx:
        p = classifier(ctx)
        for bad, needle in ((y - 1, r"outside \[0, 3\)"), (y + 3, r"outside \[0, 3\)")):
            for dtype in (np.int64, np.int32, np.int16):
                refused(p, lambda: p.update(x, bad.astype(dtype)), pmap.Error, needle)
        refused(p, lambda: p.update(x, y.astype(np.float64)), TypeError, "integers")
        refused(p, lambda: p.update(x, y.astype(bool)), TypeError, "integers")


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_complex_inputs_are_refused_everywhere(dtype):
    x, y = data()
    xy = np.ones((8, 1), dtype)
    with pmap.Context(backend="cpu", devices=2) as ctx:
        p = classifier(ctx)
        refused(p, lambda: p.update(x.astype(dtype) + 1j, y), TypeError, "complex")
        refused(p, lambda: p.update(x.astype(dtype), y), TypeError, "complex")  # imag == 0 too
        refused(p, lambda: p.predict(x.astype(dtype)), TypeError, "complex")
        refused(p, lambda: p.write(np.zeros(p.count, dtype)), TypeError, "complex")
        refused(p, lambda: p.update(x, y.astype(dtype)), TypeError)
        mse = ctx.params(pmap.Model(input_shape=(1,)).dense(1), pmap.sgd(0.1))
        refused(mse, lambda: mse.update(np.ones((8, 1), np.float32), xy), TypeError, "complex")


def test_arrays_that_do_not_hold_numbers_are_refused():
    x, y = data()
    with pmap.Context(backend="cpu", devices=2) as ctx:
        p = classifier(ctx)
        for bad in (x.astype(str), x.astype(object), x.astype("S8"),
                    np.zeros((8, 4), "datetime64[s]"), np.zeros((8, 4), [("a", "f4")]),
                    [[1.0, None, 2.0, 3.0]] * 8, [[1.0, 2.0], [3.0]]):
            refused(p, lambda: p.update(bad, y), pmap.Error)
            refused(p, lambda: p.predict(bad), pmap.Error)
        refused(p, lambda: p.write(np.array(["0.5"] * p.count)), TypeError)
        refused(p, lambda: p.update(x, y.astype(str)), TypeError)


def test_float64_beyond_float32_is_refused_but_nan_and_inf_pass_to_the_guard():
    x, y = data()
    with pmap.Context(backend="cpu", devices=2) as ctx:
        p = classifier(ctx)
        big = x.astype(np.float64)
        big[3, 2] = 1e300
        e = refused(p, lambda: p.update(big, y), ValueError, "beyond float32")
        assert "(3, 2)" in e.message and "1e+300" in e.message
        refused(p, lambda: p.predict(big), ValueError, "beyond float32")
        w = np.zeros(p.count)
        w[5] = -1e39
        refused(p, lambda: p.write(w), ValueError, "beyond float32")
        mse = ctx.params(pmap.Model(input_shape=(1,)).dense(1), pmap.sgd(0.1))
        refused(mse, lambda: mse.update(np.ones((4, 1)), np.full((4, 1), 4e38)), ValueError)
        nan = x.astype(np.float64)
        nan[0, 0] = np.nan  # the user's own non-finite data is the guard's business
        refused(p, lambda: p.update(nan, y), pmap.Error, "non-finite")
        inf = x.astype(np.float64)
        inf[1, 1] = np.inf
        refused(p, lambda: p.update(inf, y), pmap.Error, "non-finite")
        p.update(x.astype(np.float64), y)  # values in range convert
        p.update(x.astype(np.float16), y)
        p.update((x > 0), y)  # bools are 0 and 1
        p.update((x * 10).astype(np.int16), y)
        assert p.step == 4


def test_layouts_ranks_and_masks():
    x, y = data()
    with pmap.Context(backend="cpu", devices=2) as ctx:
        p = classifier(ctx, seed=3)
        q = classifier(ctx, seed=3)
        raw = np.zeros(x.nbytes + 1, np.uint8)
        misaligned = np.frombuffer(raw.data, np.float32, x.size, 1).reshape(x.shape)
        misaligned[...] = x
        assert not misaligned.flags.aligned
        swapped = x.astype(">f4")
        strided = np.repeat(x, 3, axis=1)[:, ::3]
        yi = y.astype(np.int32)
        reversed_y = yi[::-1].copy()[::-1]
        p.update(x, yi)
        for xs, ys in ((misaligned, y), (swapped, y.astype(">i8")), (strided, reversed_y)):
            q.update(xs, ys)
            assert np.array_equal(p.read(), q.read())
            p.update(x, yi)
        q.update(x, yi)
        assert np.array_equal(p.read(), q.read())
        refused(p, lambda: p.update(np.float32(1.0), y), ValueError, "rank 0")
        refused(p, lambda: p.predict(np.zeros((8, 1, 1, 1, 4), np.float32)), ValueError,
                "rank 5")
        masked = np.ma.masked_array(x, mask=np.zeros_like(x, bool))
        masked.mask[2, 2] = True
        refused(p, lambda: p.update(masked, y), ValueError, "1 masked")
        p.update(np.ma.masked_array(x), y)  # nothing masked: its values


def test_integers_are_exact():
    with pytest.raises(ValueError, match="devices -1"):
        pmap.Context(backend="cpu", devices=-1)
    for bad in (True, 2.0, "2", 2 ** 32 + 2):
        with pytest.raises(pmap.Error):
            pmap.Context(backend="cpu", devices=bad)
    with pytest.raises(pmap.Error) as e:
        pmap.Context(backend="cpu", devices=0)
    assert e.value.code == 1
    with pmap.Context(backend="cpu", devices=np.int64(2)) as ctx:
        assert ctx.devices == 2
    m = pmap.Model(input_shape=(2, 6, 6))
    for call in (lambda: m.conv2d(4, 2.5), lambda: m.conv2d(4, 3, stride=2 ** 32 + 1),
                 lambda: m.conv2d(4, (3,)), lambda: m.conv2d(2 ** 64), lambda: m.dense(True),
                 lambda: m.maxpool2d(2, 2 ** 32), lambda: m.avgpool2d(1.5),
                 lambda: m.dropout("0.5"), lambda: m.batchnorm("no")):
        with pytest.raises(pmap.Error):
            call()
    assert m.output_shape == (2, 6, 6) and m.num_params == 0
    m.maxpool2d(2, stride=1)  # stride 1 is kept (not read as "the kernel")
    assert m.output_shape == (2, 5, 5)
    with pytest.raises(pmap.Error, match="stride 0"):
        m.avgpool2d(2, stride=0)  # refused by the library, not taken as the default
    for bad in ((2.5,), (True,), 5, (2 ** 64,), ("3",)):
        with pytest.raises(pmap.Error):
            pmap.Model(input_shape=bad)
    for kw in ({"warmup_steps": 2 ** 70}, {"decay_steps": 1.5}, {"nesterov": "yes"},
               {"momentum": True}, {"final_lr": 1j}, {"schedule": 3}):
        with pytest.raises(pmap.Error):
            pmap.sgd(0.1, **kw)
    for bad in ("0.1", None, True):
        with pytest.raises(TypeError):
            pmap.adam(bad)
    with pmap.Context(backend="cpu", devices=2) as ctx:
        model = pmap.Model(input_shape=(1,)).dense(1)
        for seed in (-1, 2 ** 64, 1.0):
            with pytest.raises(pmap.Error):
                ctx.params(model, pmap.sgd(0.1), seed=seed)
        p = ctx.params(model, pmap.sgd(0.1), seed=2 ** 64 - 1)
        for call in (lambda: p.read(2 ** 32), lambda: p.read(1.0),
                     lambda: p.set_micro_batches(2 ** 32 + 1), lambda: p.set_micro_batches(2.0)):
            with pytest.raises(pmap.Error):
                call()
        with pytest.raises(TypeError, match="pmap.sgd"):
            ctx.params(model, {"lr": 0.1})
        for bad in ("on", 2, None):
            with pytest.raises(pmap.Error):
                pmap.Context(backend="cpu", devices=1, numeric_guard=bad)
        for bad in (10 ** 400, "5", True, 1j):
            with pytest.raises(pmap.Error):
                pmap.Context(backend="cpu", devices=1, timeout=bad)
        with pytest.raises(pmap.Error):
            pmap.Context(backend=["cpu"], devices=1)


def test_flags_take_true_false_1_and_0_and_mean_what_the_keyword_says():
    """numeric_guard=1 turns the guard on in Python (C's numeric_guard = 1 is PMAP_GUARD_OFF)."""
    x, y = data()
    x[0, 0] = np.nan
    for on in (True, 1, np.bool_(True)):
        with pmap.Context(backend="cpu", devices=2, numeric_guard=on) as ctx:
            p = classifier(ctx)
            e = refused(p, lambda: p.update(x, y))
            assert e.status == "PMAP_ERR_NUMERIC", e
    for off in (False, 0):
        with pmap.Context(backend="cpu", devices=2, numeric_guard=off) as ctx:
            assert np.isnan(classifier(ctx).update(x, y))
    with pytest.raises(pmap.ArgumentTypeError, match=r"numeric_guard must be True or False "
                       r"\(or 1 or 0\), got str 'off'"):
        pmap.Context(backend="cpu", devices=1, numeric_guard="off")


def test_paths_of_every_type(tmp_path):
    x, y = data()
    with pmap.Context(backend="cpu", devices=2) as ctx:
        p = classifier(ctx)
        p.update(x, y)
        want = p.read()
        for i, kind in enumerate((str, bytes, pathlib.Path)):
            target = tmp_path / f"run{i}.ckpt"
            arg = kind(str(target)) if kind is not bytes else str(target).encode()
            p.save(arg)
            assert target.is_file(), f"save({arg!r}) wrote {sorted(tmp_path.iterdir())}"
            p.update(x, y)
            p.load(arg)
            assert np.array_equal(p.read(), want)
        assert sorted(f.name for f in tmp_path.iterdir()) == ["run0.ckpt", "run1.ckpt",
                                                              "run2.ckpt"]
        for bad, kind in ((5, TypeError), (None, TypeError), (str(tmp_path / "a\0b"), ValueError),
                          (b"x\0", ValueError)):
            refused(p, lambda: p.save(bad), kind)
            refused(p, lambda: p.load(bad), kind)
        assert len(list(tmp_path.iterdir())) == 3
