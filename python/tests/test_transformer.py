"""The transformer layers from Python: a small GPT trains on int32 token ids and agrees on 1 and
2 devices, named() and set_named() cover the flat parameter vector block by block with the
shapes docs/models.md gives (a tied head adds none), bad ids and targets are refused with
nothing changed, and the model pickles."""
import pickle

import numpy as np
import pytest

import pmap

T, V, D = 12, 40, 16


def gpt(tied=True):
    return (pmap.Model(input_shape=(T,)).embedding(V, D).pos_embedding()
            .begin_residual().token_layernorm().causal_attention(2, 8).end_residual()
            .begin_residual().token_layernorm().token_dense(4 * D).gelu().token_dense(D)
            .end_residual().token_layernorm().lm_head(tied=tied))


def tokens(rows=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, V, (rows, T))
    return x, np.roll(x, -1, axis=1)


@pytest.mark.parametrize("tied", [True, False])
def test_layout_covers_the_vector(tied):
    m = gpt(tied)
    shapes = m.parameter_shapes
    assert sum(int(np.prod(s)) for s in shapes.values()) == m.num_params
    assert shapes["0.embedding.table"] == (V, D)
    assert shapes["1.pos_embedding.table"] == (T, D)
    assert shapes["4.causal_attention.wqkv"] == (D, 48)
    assert shapes["4.causal_attention.wo"] == (16, D)
    assert ("13.lm_head.w" in shapes) == (not tied)
    assert m.output_shape == (T, V)


def test_trains_and_agrees_across_devices():
    x, y = tokens()
    runs = []
    for n in (1, 2):
        with pmap.Context(backend="cpu", devices=n) as ctx:
            p = ctx.params(gpt(), pmap.adam(3e-3), seed=1)
            losses = [p.update(x, y) for _ in range(20)]
            runs.append((losses, p.read()))
    (l1, w1), (l2, w2) = runs
    assert l1[-1] < l1[0] - 0.5
    np.testing.assert_allclose(l1, l2, rtol=1e-5)
    # the bound of tests/test_equiv.c for gpt-mini: relative L2 error of the parameters
    assert np.linalg.norm(w1 - w2) <= 1e-4 * np.linalg.norm(w1)


def test_named_round_trip():
    with pmap.Context(backend="cpu", devices=2) as ctx:
        p = ctx.params(gpt(), pmap.sgd(0.1), seed=0)
        named = p.named()
        flat = np.concatenate([v.reshape(-1) for v in named.values()])
        np.testing.assert_array_equal(flat, p.read())
        table = np.arange(V * D, dtype=np.float32).reshape(V, D) / (V * D)
        p.set_named({"0.embedding.table": table})
        np.testing.assert_array_equal(p.named(device=1)["0.embedding.table"], table)
        before = p.read()
        with pytest.raises(pmap.ArgumentError, match="has shape"):
            p.set_named({"0.embedding.table": table[:, :3]})
        with pytest.raises(pmap.ArgumentError, match="no parameter block"):
            p.set_named({"nope": table})
        np.testing.assert_array_equal(p.read(), before)


def test_bad_tokens_refused_nothing_changed():
    x, y = tokens(4)
    with pmap.Context(backend="cpu", devices=2) as ctx:
        p = ctx.params(gpt(), pmap.adam(1e-2), seed=0)
        before = p.read()
        bad = x.copy()
        bad[2, 5] = V
        with pytest.raises(pmap.Error, match="token id 40 at example 2 position 5"):
            p.update(bad, y)
        bad_y = y.copy()
        bad_y[1, 0] = -1
        with pytest.raises(pmap.Error, match="target -1 at example 1 position 0"):
            p.update(x, bad_y)
        # Token ids are named as such, not as labels: floats, and integers beyond int32.
        with pytest.raises(pmap.ArgumentTypeError,
                           match="xs: token ids must be integers, got float32"):
            p.update(x.astype(np.float32), y)
        with pytest.raises(pmap.ArgumentTypeError,
                           match="ys: token ids must be integers, got float64"):
            p.update(x, y.astype(np.float64))
        wide = x.astype(np.int64)
        wide[0, 1] = 2 ** 33
        with pytest.raises(pmap.ArgumentError, match=r"xs: token id 8589934592 at index \(0, 1\) "
                           r"does not fit int32; token ids are indices into the vocabulary in "
                           r"\[0, 40\)"):
            p.update(wide, y)
        np.testing.assert_array_equal(p.read(), before)
        assert p.step == 0
        assert p.predict(x).shape == (4, T, V)


def test_pickles():
    m = pickle.loads(pickle.dumps(gpt(False)))
    assert m.parameter_shapes == gpt(False).parameter_shapes
