"""A model only JAX knows, trained data-parallel by pmap: the loss is written in jax.numpy, its
gradient is jax.grad's, and pmap splits each batch over the CPU devices, averages the loss and
gradients (one all-reduce) and steps Adam. The model: a two-layer MLP with a focal loss on a
synthetic two-class problem; the script prints the loss every 50 steps and the held-out accuracy
(from the same JAX forward pass on the trained parameters).

    PMAP_LIBRARY=build/libpmap.so PYTHONPATH=python python3 python/examples/custom_jax.py

Needs jax (pip install jax); without it the script says so and exits 0."""
import sys

import numpy as np

import pmap

try:
    import jax
    import jax.numpy as jnp
except ImportError:
    print("custom_jax.py: jax is not installed (pip install jax); nothing to run")
    sys.exit(0)

F, H = 10, 32


def forward(params, x):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return (h @ params["w2"] + params["b2"])[:, 0]


def focal_loss(params, x, y, gamma=2.0):
    p = jax.nn.sigmoid(forward(params, x))
    pt = jnp.where(y == 1, p, 1.0 - p)
    return jnp.mean(-((1.0 - pt) ** gamma) * jnp.log(jnp.clip(pt, 1e-7, 1.0)))


loss_and_grad = jax.jit(jax.value_and_grad(focal_loss))


def on_device(params, xs, ys):
    """Called by pmap on every device with its rows: numpy in, (loss, gradients) out."""
    loss, grads = loss_and_grad(params, xs, ys)
    return float(loss), {k: np.asarray(v) for k, v in grads.items()}


def main():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1200, F)).astype(np.float32)
    y = (np.sin(x[:, 0] * 2) + x[:, 1] * x[:, 2] > 0.3).astype(np.int32)
    train_x, train_y, test_x, test_y = x[:1024], y[:1024], x[1024:], y[1024:]
    init = {"w1": (rng.standard_normal((F, H)) / np.sqrt(F)).astype(np.float32),
            "b1": np.zeros(H, np.float32),
            "w2": (rng.standard_normal((H, 1)) / np.sqrt(H)).astype(np.float32),
            "b2": np.zeros(1, np.float32)}
    with pmap.Context(backend="cpu", devices=4) as ctx:
        params = ctx.params_custom(on_device, init, pmap.adam(1e-2))
        for step in range(301):
            i = rng.integers(0, len(train_x), 256)
            loss = params.update(train_x[i], train_y[i])
            if step % 50 == 0:
                print(f"step {step:3d}  loss {loss:.4f}")
        trained = {k: jnp.asarray(v) for k, v in params.named().items()}
    accuracy = np.mean((np.asarray(forward(trained, test_x)) > 0) == test_y)
    print(f"held-out accuracy {accuracy:.3f} on {len(test_x)} rows")


if __name__ == "__main__":
    main()
