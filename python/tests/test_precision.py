"""The bf16 policy from Python: Params.set_precision and .precision, training under bf16 close
to fp32, a checkpoint that restores the policy, pmap.bf16_support(), and the refusals."""
import numpy as np
import pytest

import pmap
from bounds import BoundModel, bound_prec16

# model() counted as tests/bounds.h counts res-mlp, with one residual block: dense 10 -> 32,
# [layer norm (32 features, 4 sums), dense 32 -> 64, GELU, dense 64 -> 32], dense 32 -> 1; four
# GEMM layers (r_all 12, of them 7 computed). kappa is the run's (below).
RES = BoundModel("res-mlp, 1 block", (10 + 32) + 4 * 32 + (32 + 64) + (64 + 32) + (32 + 1), 4,
                 12, 7, 64, None, 1)


def model():
    return (pmap.Model(input_shape=(10,)).dense(32).begin_residual().layernorm().dense(64)
            .gelu().dense(32).end_residual().dense(1))


def data(rows=64, seed=1):
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((rows, 10)).astype(np.float32)
    return xs, np.tanh(xs[:, :1] - xs[:, 1:2]).astype(np.float32)


def train(precision, steps=60, devices=2):
    with pmap.Context(backend="cpu", devices=devices) as ctx:
        with ctx.params(model(), pmap.adam(1e-2), seed=3) as params:
            params.set_precision(precision)
            assert params.precision == precision
            xs, ys = data()
            return [params.update(xs, ys) for _ in range(steps)], params.read(0)


def test_bf16_trains_as_fp32_does():
    # bf16's loss curve within bound_prec16 of fp32's, as tests/test_precision.c holds the
    # examples': each tenth's mean loss, after that tenth's steps on 64 rows. The MSE loss moves
    # by dL = 2 mean((y - t) dy) + mean(dy^2), so |dL| / L <= kappa d + (kappa d)^2 / 4 for a
    # relative change d of the outputs y, with kappa = 2 rms(y) / sqrt(L) and rms(y) <= rms(t) +
    # sqrt(L). These targets have no noise: kappa grows as the loss falls (from about 8 to 30
    # here), and each tenth takes it from fp32's least loss there. The last tenths' bounds say
    # only that bf16 trains as fp32 does; the first ones say more.
    l32, w32 = train("fp32")
    l16, w16 = train("bf16")
    t = data()[1].astype(np.float64)
    rms_t = float(np.sqrt(np.mean(t * t)))
    for s0 in range(0, 60, 10):
        a, b = np.mean(l16[s0:s0 + 10]), np.mean(l32[s0:s0 + 10])
        root = float(np.sqrt(min(l32[s0:s0 + 10])))
        first = bound_prec16(RES._replace(kappa=2 * (rms_t + root) / root), 64, s0 + 10)
        bound = first + first * first / 4
        assert abs(a / b - 1) <= bound, (s0, a, b, bound)
    assert not np.array_equal(w16, w32)  # the policy changes the arithmetic
    again, w16b = train("bf16")
    assert again == l16 and np.array_equal(w16b, w16)  # bitwise repeated


def test_checkpoint_restores_the_policy(tmp_path):
    path = tmp_path / "run.ckpt"
    xs, ys = data()
    with pmap.Context(backend="cpu", devices=2) as ctx:
        with ctx.params(model(), pmap.adam(1e-2), seed=3) as a, \
                ctx.params(model(), pmap.adam(1e-2), seed=4) as b:
            assert b.precision == "fp32"
            a.set_precision("bf16")
            a.update(xs, ys)
            a.save(path)
            b.load(path)
            assert b.precision == "bf16"
            assert a.update(xs, ys) == b.update(xs, ys)
            b.set_precision("fp32")  # resuming under the other policy
            assert np.isfinite(b.update(xs, ys)) and b.precision == "fp32"


def test_bf16_support():
    s = pmap.bf16_support()
    assert s["cpu"] in ("amx_bf16", "avx512_bf16", "none"), s
    assert s["gemm"] in ("onednn", "portable"), s
    assert s["reason"], s


def test_refusals():
    with pmap.Context(backend="cpu", devices=1) as ctx:
        with ctx.params(model(), pmap.sgd(0.1), seed=0) as params:
            with pytest.raises(pmap.ArgumentError, match="fp16"):
                params.set_precision("fp16")
            with pytest.raises(pmap.ArgumentError):
                params.set_precision(1)
            assert params.precision == "fp32"
        custom = ctx.params_custom(lambda w, xs, ys: (0.0, np.zeros_like(w)),
                                   np.zeros(4, np.float32), pmap.sgd(0.1))
        with pytest.raises(pmap.ArgumentError, match="pmap_params_create_custom"):
            custom.set_precision("bf16")
        assert custom.precision == "fp32"
        custom.close()
