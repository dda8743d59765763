"""The transformer layers from Python: a small GPT trains on int32 token ids and agrees on 1 and
2 devices, named() and set_named() cover the flat parameter vector block by block with the
shapes docs/models.md gives (a tied head adds none), bad ids and targets are refused with
nothing changed, and the model pickles."""
import pickle

import numpy as np
import pytest

import pmap
from bounds import BoundModel, bound_order32
from test_pmap import xent_condition

T, V, D = 12, 40, 16

# gpt() counted as tests/bounds.h counts gpt-mini: per token, two layer norms (D features, 4
# sums each), the qkv projection (D + 3D), attention's products (head size 8 + T, and back), the
# output projection (D + D), the MLP (D + 4D, 4D + D); the final layer norm and the tied head
# (D + V); weight gradients summed over every token of a row (7 matrices, the embedding, the
# head); 20 bfloat16 roundings a block, 16 computed, and 3 and 2 more for the head.
GPT = BoundModel("gpt", 2 * 4 * D + (D + 3 * D) + 2 * (8 + T) + (D + D) + (D + 4 * D)
                 + (4 * D + D) + 4 * D + (D + V), T * (7 + 2), 20 + 3, 16 + 2, 4 * D, 4, T)


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
            losses, kappa = [], []
            for _ in range(20):
                z = p.predict(x)
                losses.append(p.update(x, y))
                kappa.append(max(GPT.kappa, xent_condition(z, losses[-1])))
            runs.append((losses, p.named(), kappa))
    (l1, w1, kappa), (l2, w2, _) = runs
    assert l1[-1] < l1[0] - 0.5
    # 2 devices sum the batch in another order than 1: step s's loss (before its update) within
    # bound_order32 of s + 1 passes, the parameters within that of the 20 steps on 8 rows, the
    # loss's condition the run's where it exceeds tests/bounds.h's 4.
    for s, (a, b) in enumerate(zip(l2, l1)):
        bound = bound_order32(GPT._replace(kappa=kappa[s]), 8, s + 1)
        assert abs(a - b) <= bound * abs(b), (s, a, b, bound)
    # But for the key bias (bqkv[E:2E], E = 2 x 8 = D): a query's scores all move by q . b_k,
    # which the softmax takes away, so its gradient is 0 in exact arithmetic and rounding alone
    # in float, and Adam's normalised step turns that into steps of up to lr either way. It
    # changes no loss; the other parameters follow the model.
    def flat(w):
        return np.concatenate([np.delete(v.reshape(-1), np.s_[D:2 * D])
                               if k.endswith("causal_attention.bqkv") else v.reshape(-1)
                               for k, v in w.items()]).astype(np.float64)

    a, b = flat(w2), flat(w1)
    assert a.size == sum(v.size for v in w1.values()) - D
    err = np.linalg.norm(a - b) / np.linalg.norm(b)
    assert err <= bound_order32(GPT._replace(kappa=max(kappa)), 8, 20), err


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
