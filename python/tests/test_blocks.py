"""The parameter blocks as the C library declares them (pmap_model_param_block): every kind's
names and shapes as docs/models.md gives them, the layer numbers of the C model whatever else
was called between the layers (a loss set midway), and named() at the blocks' offsets."""
import numpy as np

import pmap


def test_every_kind_named_as_documented():
    m = (pmap.Model(input_shape=(2, 6, 6)).conv2d(3, kernel=(3, 2), pad=1).batchnorm()
         .relu().layernorm().maxpool2d(2).flatten().begin_residual().dense(27).tanh()
         .end_residual().dense(3))
    assert m.parameter_shapes == {
        "0.conv2d.w": (3, 2, 3, 2), "0.conv2d.b": (3,),
        "1.batchnorm.gamma": (3,), "1.batchnorm.beta": (3,),
        "1.batchnorm.running_mean": (3,), "1.batchnorm.running_var": (3,),
        "3.layernorm.gamma": (3, 6, 7), "3.layernorm.beta": (3, 6, 7),
        "7.dense.w": (27, 27), "7.dense.b": (27,),
        "10.dense.w": (27, 3), "10.dense.b": (3,),
    }
    assert sum(int(np.prod(s)) for s in m.parameter_shapes.values()) == m.num_params


def test_a_loss_set_between_layers_keeps_the_layer_numbers():
    m = pmap.Model(input_shape=(4,)).dense(3).loss("mse").relu().dense(2)
    assert m.parameter_shapes == {"0.dense.w": (4, 3), "0.dense.b": (3,),
                                  "2.dense.w": (3, 2), "2.dense.b": (2,)}
    with pmap.Context(backend="cpu", devices=2) as ctx:
        p = ctx.params(m, pmap.sgd(0.1), seed=0)
        flat = np.arange(p.count, dtype=np.float32)
        p.write(flat)
        named = p.named(device=1)
        np.testing.assert_array_equal(named["2.dense.w"], flat[15:21].reshape(3, 2))
        np.testing.assert_array_equal(named["2.dense.b"], flat[21:23])
        p.set_named({"2.dense.b": np.array([-1.0, -2.0])})
        assert p.read()[21:23].tolist() == [-1.0, -2.0]


def test_named_covers_state_and_a_tied_head_reads_the_table():
    m = (pmap.Model(input_shape=(5,)).embedding(7, 4).pos_embedding().token_layernorm()
         .lm_head(tied=True))
    assert list(m.parameter_shapes) == ["0.embedding.table", "1.pos_embedding.table",
                                        "2.token_layernorm.gamma", "2.token_layernorm.beta"]
    with pmap.Context(backend="cpu", devices=1) as ctx:
        p = ctx.params(m, pmap.adam(1e-3), seed=0)
        named = p.named()
        np.testing.assert_array_equal(np.concatenate([v.ravel() for v in named.values()]),
                                      p.read())
