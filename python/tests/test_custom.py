"""Custom params from Python (Context.params_custom): a focal-loss classifier whose gradient is
numpy trains on 1 and 2 devices to the parameters of the same training in float64; what the
function receives; and everything it may do wrong (raise, return the wrong shape, dtype or kind,
NaN), each failing the step on every device with nothing changed."""
import re

import numpy as np
import pytest

import pmap
from bounds import BOUND_LAMBDA, BOUND_U32

F, ROWS, ALPHA, GAMMA = 5, 48, 0.25, 2.0


def float_steps(devices, steps):
    """The float32 run against the float64 one, relative to the parameters' largest: a step
    rounds each device's float64 gradient to float32, its weight by rows (with uneven batches)
    and their product, the all-reduce's devices - 1 sums and its division, and the update w - lr g
    (lr a power of two: its product exact): at most 4 devices + 1 roundings per element, each of
    a value no larger than the parameters (the steps lr g are a tenth of them here). Gradient
    descent at this rate does not amplify them; they add as a random walk over the steps, held
    to lambda standard deviations (docs/tolerances.md)."""
    return BOUND_LAMBDA * BOUND_U32 * np.sqrt((4 * devices + 1) * steps)


def data(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((ROWS, F)).astype(np.float32)
    y = (x @ np.linspace(-1.0, 1.0, F) + 0.3 * rng.standard_normal(ROWS) > 0.2).astype(np.int32)
    return x, y


def focal(w, b, x, y):
    """Mean binary focal loss of sigmoid(x w + b) and its gradient in (w, b), float64."""
    x = x.astype(np.float64)
    z = x @ w + b
    p = 1.0 / (1.0 + np.exp(-z))
    s = np.where(y == 1, 1.0, -1.0)
    pt = np.where(y == 1, p, 1.0 - p)
    a = np.where(y == 1, ALPHA, 1.0 - ALPHA)
    loss = -a * (1.0 - pt) ** GAMMA * np.log(pt)
    # d loss / d pt, then d pt / d z = s p (1 - p)
    dpt = a * (GAMMA * (1.0 - pt) ** (GAMMA - 1.0) * np.log(pt) - (1.0 - pt) ** GAMMA / pt)
    dz = dpt * s * p * (1.0 - p) / x.shape[0]
    return loss.mean(), x.T @ dz, dz.sum()


def focal_fn(params, xs, ys):
    loss, gw, gb = focal(params["w"].astype(np.float64), float(params["b"][0]), xs, ys)
    return loss, {"w": gw, "b": np.array([gb])}


def reference(steps, lr, x, y):
    w, b = np.zeros(F), 0.0
    for _ in range(steps):
        _, gw, gb = focal(w, b, x, y)
        w, b = w - lr * gw, b - lr * gb
    return w, b


def init():
    return {"w": np.zeros(F, np.float32), "b": np.zeros(1, np.float32)}


def test_the_focal_gradient_is_the_derivative_of_its_loss():
    x, y = data(1)
    rng = np.random.default_rng(2)
    w, b = rng.standard_normal(F), 0.3
    _, gw, gb = focal(w, b, x, y)
    # Central differences err by h^2 |f'''| / 6 (about 1e-13) and by the loss's float64
    # rounding over 2 h (2^-53 / 1e-6, about 1e-10): 1e-7 is far above both.
    h = 1e-6
    for i in range(F):
        e = np.eye(F)[i] * h
        fd = (focal(w + e, b, x, y)[0] - focal(w - e, b, x, y)[0]) / (2 * h)
        assert abs(fd - gw[i]) < 1e-7 * max(1.0, abs(fd))
    fd = (focal(w, b + h, x, y)[0] - focal(w, b - h, x, y)[0]) / (2 * h)
    assert abs(fd - gb) < 1e-7 * max(1.0, abs(fd))


def test_focal_loss_trains_on_one_and_two_devices_to_the_float64_reference():
    x, y = data()
    lr, steps = 0.5, 60
    w_ref, b_ref = reference(steps, lr, x, y)
    got = {}
    for devices in (1, 2):
        with pmap.Context(backend="cpu", devices=devices) as ctx:
            p = ctx.params_custom(focal_fn, init(), pmap.sgd(lr))
            losses = [p.update(x, y) for _ in range(steps)]
            assert losses[-1] < 0.6 * losses[0]
            p.verify()
            named = p.named()
            assert set(named) == {"w", "b"} and named["w"].shape == (F,)
            got[devices] = np.concatenate([named["w"], named["b"]])
    want = np.concatenate([w_ref, [b_ref]])
    for devices, v in got.items():
        err = np.abs(v - want).max() / np.abs(want).max()
        assert err <= float_steps(devices, steps), (devices, err, v, want)
    # Each within its bound of the float64 run: within their sum of each other.
    err = np.abs(got[1] - got[2]).max() / np.abs(want).max()
    assert err <= float_steps(1, steps) + float_steps(2, steps), err


def test_the_function_gets_its_rows_views_and_info():
    x, y = data()
    seen = []

    def fn(params, xs, ys, info):
        seen.append((info, xs.shape, ys.dtype, xs.flags.writeable, params.flags.writeable))
        assert np.array_equal(xs, x[info.row0:info.row0 + xs.shape[0]])
        return 0.5, np.zeros(3)

    with pmap.Context(backend="cpu", devices=3) as ctx:
        p = ctx.params_custom(fn, np.arange(3.0), pmap.sgd(0.1), info=True)
        p.update(x, y)
        p.set_micro_batches(2)
        assert p.update(x, y) == pytest.approx(0.5)
        assert np.array_equal(p.read(2), np.arange(3.0, dtype=np.float32))
    first = sorted((i.device, i.row0, i.step, i.scale) for i, *_ in seen[:3])
    assert first == [(0, 0, 0, 1.0), (1, 16, 0, 1.0), (2, 32, 0, 1.0)]
    assert {i.devices for i, *_ in seen} == {3}
    assert sorted(i.scale for i, *_ in seen[3:]) == [0.5] * 6  # two pieces on each device
    assert all(s == (8, F) or s == (16, F) for _, s, *_ in seen)
    assert all(d == np.int32 and not w1 and not w2 for _, _, d, w1, w2 in seen)


def unchanged_after(p, x, y, err, match=None):
    before, step = p.read(), p.step
    with pytest.raises(err, match=match) as e:
        p.update(x, y)
    assert p.step == step and np.array_equal(p.read(), before)
    p.verify()
    return e.value


@pytest.mark.parametrize("devices", [1, 2])
def test_an_exception_in_the_function_fails_the_step_on_every_device(devices):
    x, y = data()
    calls = {"n": 0}

    def fn(params, xs, ys):
        calls["n"] += 1
        if calls["n"] > devices:  # the second step
            raise ZeroDivisionError("the model's own bug")
        return 0.1, np.ones(2)

    with pmap.Context(backend="cpu", devices=devices) as ctx:
        p = ctx.params_custom(fn, np.zeros(2), pmap.sgd(0.1))
        p.update(x, y)
        e = unchanged_after(p, x, y, pmap.Error, "ZeroDivisionError: the model's own bug")
        assert re.search(r"device \d", e.message) and isinstance(e.__cause__, ZeroDivisionError)
        assert not isinstance(e, ValueError)
        calls["n"] = -100
        assert p.update(x, y) == pytest.approx(0.1)  # every device was released


def test_wrong_return_values_are_refused_naming_what_is_wrong():
    x, y = data()
    cases = [
        (lambda: None, "return \\(loss, gradient\\)"),
        (lambda: (0.1,), "return \\(loss, gradient\\)"),
        (lambda: (np.ones(2), np.ones(4)), "the loss must be one real number"),
        (lambda: ("a", np.ones(4)), "the loss must be one real number"),
        (lambda: (0.1, np.ones(5)), "shape \\(5,\\), the parameters \\(4,\\)"),
        (lambda: (0.1, np.ones((2, 2))), "shape \\(2, 2\\)"),
        (lambda: (0.1, np.ones(4, complex)), "dtype complex128"),
        (lambda: (0.1, np.full(4, 1e39)), "returned the gradient that float32 cannot hold: value "
         "1e\\+39 at row 0 is finite but beyond float32"),
        (lambda: (1e39, np.ones(4)), "returned the loss 1e\\+39, finite but beyond float32"),
        (lambda: (0.1, {"w": np.ones(4)}), "shape \\(\\)"),
    ]
    with pmap.Context(backend="cpu", devices=2) as ctx:
        for make, match in cases:
            p = ctx.params_custom(lambda params, xs, ys: make(), np.zeros(4), pmap.adam(0.1))
            e = unchanged_after(p, x, y, ValueError, match)
            assert isinstance(e, pmap.ArgumentError) and "device" in e.message
            # The function returned these: it raised nothing, and the status is said once.
            assert "raised" not in e.message and "PMAP_ERR" not in e.message, e.message
            p.close()
        named = ctx.params_custom(lambda params, xs, ys: (0.1, {"w": np.ones(2)}),
                                  {"w": np.zeros(2), "b": np.zeros(1)}, pmap.sgd(0.1))
        unchanged_after(named, x, y, ValueError, "a dict with the parameters' keys")


def test_nan_and_a_keyboard_interrupt_from_the_function():
    x, y = data()
    state = {"raise": None}

    def fn(params, xs, ys):
        if state["raise"] is not None:
            raise state["raise"]
        return float("nan"), np.zeros(2)

    with pmap.Context(backend="cpu", devices=2) as ctx:
        p = ctx.params_custom(fn, np.ones(2), pmap.sgd(0.1))
        e = unchanged_after(p, x, y, pmap.Error, "non-finite")
        assert e.status == "PMAP_ERR_NUMERIC"
        state["raise"] = KeyboardInterrupt()
        unchanged_after(p, x, y, KeyboardInterrupt)


def test_custom_params_save_load_and_refuse_what_they_cannot_do(tmp_path):
    x, y = data()
    with pmap.Context(backend="cpu", devices=2) as ctx:
        p = ctx.params_custom(focal_fn, init(), pmap.adam(0.05))
        for _ in range(3):
            p.update(x, y)
        p.save(tmp_path / "c.ckpt")
        q = ctx.params_custom(focal_fn, init(), pmap.adam(0.05))
        q.load(tmp_path / "c.ckpt")
        assert q.step == 3 and np.array_equal(q.read(), p.read())
        assert p.update(x, y) == q.update(x, y)
        for call in (lambda: p.predict(x), lambda: p.evaluate(x, y), lambda: p.generate([1], 2)):
            with pytest.raises(ValueError, match="no forward pass"):
                call()
    with pmap.Context(backend="cpu", devices=2, caller_waits=False) as ctx:
        with pytest.raises(ValueError, match="caller_waits=True"):
            ctx.params_custom(focal_fn, init(), pmap.sgd(0.1))
    with pmap.Context(backend="cpu", devices=1) as ctx:
        for bad, kind in ((np.zeros((2, 2)), ValueError), ({1: np.zeros(2)}, TypeError),
                          (np.array(["a"]), TypeError)):
            with pytest.raises(kind):
                ctx.params_custom(focal_fn, bad, pmap.sgd(0.1))
        with pytest.raises(TypeError, match="callable"):
            ctx.params_custom(None, np.zeros(2), pmap.sgd(0.1))


def test_uneven_batches_weight_each_device_by_its_rows():
    x, y = data()
    x, y = x[:47], y[:47]
    w_ref, b_ref = reference(5, 0.5, x, y)
    with pmap.Context(backend="cpu", devices=3, uneven_batches=True) as ctx:
        p = ctx.params_custom(focal_fn, init(), pmap.sgd(0.5))
        for _ in range(5):
            p.update(x, y)
        v = p.read()
    want = np.concatenate([w_ref, [b_ref]])
    assert np.abs(v - want).max() <= float_steps(3, 5) * np.abs(want).max()



