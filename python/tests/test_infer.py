"""Using trained params: predict on any number of rows (uneven splits, pieces) against a float64
forward pass; evaluate's loss and accuracy against float64 and against the loss update() reports;
generate on a language model whose next token is known; optimizer keywords checked per
optimizer; every invalid argument a ValueError."""
import numpy as np
import pytest

import pmap
from bounds import bound_sum

# One forward pass of mlp() against float64: a value at its output went through the sums of 6 + 1
# (the first layer and its bias) and 9 + 1 terms (the second): together a path of 17
# (docs/tolerances.md, item 2), relative to the outputs' size.
FORWARD = bound_sum(6 + 1 + 9 + 1)


def mlp(ctx, seed=0):
    model = pmap.Model(input_shape=(6,)).dense(9).relu().dense(4).loss("softmax_xent")
    return ctx.params(model, pmap.sgd(1e-3), seed=seed)


def forward64(p, x):
    n = p.named()
    w0, b0 = n["0.dense.w"].astype(np.float64), n["0.dense.b"].astype(np.float64)
    w2, b2 = n["2.dense.w"].astype(np.float64), n["2.dense.b"].astype(np.float64)
    return np.maximum(x.astype(np.float64) @ w0 + b0, 0.0) @ w2 + b2


def close(a, b, tol=FORWARD):
    return a.size == 0 or np.linalg.norm(a - b) <= tol * np.linalg.norm(b)


def loss_bound(kappa, path, terms):
    """A loss against another computation of it: kappa (its condition, tests/bounds.h: 4 for
    cross-entropy at these small logits, 10 for MSE) times the error of a path of `path` terms'
    sums, and the mean's sum of `terms` terms (each term's own few roundings, independent, are
    within that)."""
    return kappa * bound_sum(path) + bound_sum(terms)


@pytest.mark.parametrize("uneven", [False, True])
def test_predict_takes_any_number_of_rows(uneven):
    x = np.random.default_rng(0).standard_normal((23, 6)).astype(np.float32)
    with pmap.Context(backend="cpu", devices=3, uneven_batches=uneven) as ctx:
        p = mlp(ctx)
        want = forward64(p, x)
        for rows in (0, 1, 2, 3, 4, 5, 7, 10, 23):
            out = p.predict(x[:rows])
            assert out.shape == (rows, 4) and out.dtype == np.float32
            assert close(out, want[:rows]), rows
        for batch_size in (1, 2, 4, 7, 100):
            assert close(p.predict(x, batch_size=batch_size), want), batch_size
        assert np.array_equal(p.predict(x[:12]), p.predict(x[:12], batch_size=6))
        with pytest.raises(ValueError, match="batch_size 0"):
            p.predict(x, batch_size=0)


def test_evaluate_is_the_loss_update_reports_and_the_accuracy():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((30, 6)).astype(np.float32)
    y = rng.integers(0, 4, 30).astype(np.int32)
    with pmap.Context(backend="cpu", devices=3) as ctx:
        p = mlp(ctx, seed=3)
        z = forward64(p, x)
        logp = z - z.max(1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(1, keepdims=True))
        r = p.evaluate(x, y)
        assert r["rows"] == 30
        xent = loss_bound(4, 6 + 1 + 9 + 1 + 4, 30)  # mlp(), then the softmax's sum of 4
        assert r["loss"] == pytest.approx(-logp[np.arange(30), y].mean(), rel=xent)
        assert r["accuracy"] == pytest.approx(np.mean(np.argmax(z, 1) == y))
        # the loss before its step, computed on 3 devices' rows (another order)
        assert r["loss"] == pytest.approx(p.update(x, y), rel=xent)
        assert p.evaluate(x[:7], y[:7].reshape(7, 1))["rows"] == 7  # any rows, (B, 1) labels
        with pytest.raises(ValueError, match="outside"):
            p.evaluate(x, np.full(30, 4, np.int32))
        with pytest.raises(ValueError, match="rows"):
            p.evaluate(x, y[:29])
        mse = ctx.params(pmap.Model(input_shape=(6,)).dense(2), pmap.sgd(1e-3), seed=1)
        t = rng.standard_normal((30, 2)).astype(np.float32)
        out = mse.predict(x).astype(np.float64)
        r = mse.evaluate(x, t)
        assert r["accuracy"] is None
        # one dense layer 6 -> 2 (a path of 6 + 1), 30 rows of 2 outputs; predict's outputs are
        # another computation of evaluate's
        sq = loss_bound(10, 6 + 1, 30 * 2)
        assert r["loss"] == pytest.approx(np.mean((out - t) ** 2), rel=sq)
        assert r["loss"] == pytest.approx(mse.update(x, t), rel=sq)


V, T = 7, 4


def successor_model(ctx):
    """A language model whose logits at each position make the next token (token + 1) mod V:
    one-hot embeddings, no attention, an untied head that maps token i to i + 1."""
    model = pmap.Model(input_shape=(T,)).embedding(V, V).lm_head(tied=False)
    p = ctx.params(model, pmap.sgd(1e-3))
    names = p.named()
    table = [k for k in names if k.endswith("embedding.table")][0]
    w = [k for k in names if k.endswith("lm_head.w")][0]
    b = [k for k in names if k.endswith("lm_head.b")][0]
    shift = np.roll(np.eye(V, dtype=np.float32), 1, axis=1) * 10.0  # row i -> column i + 1
    p.set_named({table: np.eye(V, dtype=np.float32), w: shift, b: np.zeros(V, np.float32)})
    return p


def test_generate_greedy_follows_the_model_beyond_its_window():
    with pmap.Context(backend="cpu", devices=2) as ctx:
        p = successor_model(ctx)
        out = p.generate([3], 12)
        assert out.dtype == np.int32 and out.tolist() == [(4 + i) % V for i in range(12)]
        rows = p.generate(np.array([[1, 2], [5, 6], [0, 0]]), 3)
        assert rows.tolist() == [[3, 4, 5], [0, 1, 2], [1, 2, 3]]
        assert p.generate(bytes([2, 3, 4, 5, 6]), 2).tolist() == [0, 1]  # longer than T
        assert p.generate([1], 0).shape == (0,)
        for bad, kind in (([], ValueError), ([V], ValueError), ([-1], ValueError),
                          ([0.5], TypeError)):
            with pytest.raises(kind):
                p.generate(bad, 2)
        for empty in ([], b"", np.zeros((0, 3), np.int64), np.zeros((2, 0), np.int32)):
            with pytest.raises(ValueError, match="the prompt is empty"):
                p.generate(empty, 2)
        with pytest.raises(ValueError, match="temperature"):
            p.generate([1], 2, temperature=-1.0)
        with pytest.raises(ValueError, match="not a language model"):
            mlp(ctx).generate([1], 2)


def test_generate_samples_the_softmax_at_a_temperature():
    with pmap.Context(backend="cpu", devices=2) as ctx:
        p = successor_model(ctx)
        names = p.named()
        w = [k for k in names if k.endswith("lm_head.w")][0]
        b = [k for k in names if k.endswith("lm_head.b")][0]
        logits = np.log(np.array([0.5, 0.2, 0.1, 0.1, 0.05, 0.05, 0.0] + [], np.float64) + 1e-30)
        p.set_named({w: np.zeros((V, V), np.float32), b: logits.astype(np.float32)})
        draws = p.generate(np.zeros((400, 1), np.int64), 1, temperature=1.0, seed=5)[:, 0]
        freq = np.bincount(draws, minlength=V) / 400.0
        assert np.abs(freq - np.exp(logits)).max() < 0.08, freq
        assert freq[6] == 0.0
        again = p.generate(np.zeros((400, 1), np.int64), 1, temperature=1.0, seed=5)[:, 0]
        assert np.array_equal(draws, again)  # the seed makes it reproducible
        assert p.generate([0], 3, temperature=0.0).tolist() == [0, 0, 0]  # the largest logit


def test_optimizer_keywords_of_another_optimizer_are_refused_naming_them():
    for make, key, hint in ((lambda: pmap.adam(1e-3, momentum=0.9), "momentum", "beta1"),
                            (lambda: pmap.adam(1e-3, weight_decay=0.1), "weight_decay",
                             "adamw"),
                            (lambda: pmap.adamw(1e-3, nesterov=True), "nesterov", "pmap.sgd"),
                            (lambda: pmap.sgd(0.1, beta2=0.99), "beta2", "pmap.adam"),
                            (lambda: pmap.sgd(0.1, lrate=0.1), "lrate", "no optimizer")):
        with pytest.raises(ValueError) as e:
            make()
        assert isinstance(e.value, TypeError) and isinstance(e.value, pmap.Error)
        assert key in e.value.message and hint in e.value.message, e.value.message
    o = pmap.sgd(0.1, 0.9, nesterov=True, weight_decay=1e-4, clip_norm=1.0,
                 schedule="warmup_linear", warmup_steps=5, decay_steps=50, final_lr=0.01)
    assert (o.momentum, o.nesterov, o.warmup_steps) == (pytest.approx(0.9), 1, 5)
    a = pmap.adam(1e-3, beta1=0.8, eps=1e-6)
    assert (a.beta1, a.weight_decay, a.momentum) == (pytest.approx(0.8), 0.0, 0.0)
    assert pmap.adamw(1e-3, 0.05).weight_decay == pytest.approx(0.05)


def test_every_invalid_argument_is_a_value_error_and_a_pmap_error():
    with pmap.Context(backend="cpu", devices=2) as ctx:
        p = mlp(ctx)
        calls = [lambda: ctx.params(pmap.Model(input_shape=(3,)), pmap.sgd(0.1)),  # library's
                 lambda: p.update(np.ones((3, 6), np.float32), np.zeros(3, np.int32)),
                 lambda: p.read(5), lambda: p.set_micro_batches(0),
                 lambda: pmap.Model(input_shape=(3,)).dense(0),
                 lambda: pmap.Context(backend="cpu", devices=0)]
        for call in calls:
            with pytest.raises(ValueError) as e:
                call()
            assert isinstance(e.value, pmap.Error)
            assert e.value.status == "PMAP_ERR_INVALID_ARGUMENT", e.value
        p.close()
        with pytest.raises(ValueError, match="closed"):
            p.update(np.ones((2, 6), np.float32), np.zeros(2, np.int32))
