"""What a Python gradient function costs in Context.params_custom: the GIL and the call per device.

Two functions, each on 1, 2 and 4 CPU devices, against the same function called once on the whole
batch without pmap:
  empty   returns a constant loss and a zero gradient: the cost of the call itself (ctypes, the
          GIL taken by each device's thread, numpy views, the checks of what it returns);
  matmul  least squares, X^T (X w - y) / n over (rows, features) float32: numpy's matmul releases
          the GIL, so devices overlap there and only its Python part is serialised.
Prints one line per case: devices, function, median step time and spread over the rounds, the
time per device call, and the speedup over 1 device.

    PMAP_LIBRARY=build/libpmap.so PYTHONPATH=python python3 bench/python_custom.py
"""
import argparse
import os
import statistics
import time

import numpy as np

import pmap


def empty(count):
    g = np.zeros(count, np.float32)
    return lambda params, xs, ys: (0.5, g)


def least_squares(params, xs, ys):
    r = xs @ params - ys
    return 0.5 * float(r @ r) / xs.shape[0], xs.T @ r / xs.shape[0]


def timed(step, rounds, steps):
    step()  # warm-up
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(steps):
            step()
        times.append((time.perf_counter() - t) / steps)
    return statistics.median(times), max(times) - min(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--features", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--devices", default="1,2,4")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((a.rows, a.features), dtype=np.float32)
    y = rng.standard_normal(a.rows).astype(np.float32)
    w = np.zeros(a.features, np.float32)
    print(f"# {a.rows} rows x {a.features} features, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}; times: median of {a.rounds} rounds of {a.steps} steps")
    print(f"{'devices':>7} {'function':>8} {'step_ms':>9} {'spread_ms':>9} {'call_us':>8} "
          f"{'speedup':>7}")
    for name, make in (("empty", lambda: empty(a.features)), ("matmul", lambda: least_squares)):
        fn = make()
        direct, spread = timed(lambda: fn(w, x, y), a.rounds, a.steps)
        print(f"{'direct':>7} {name:>8} {direct * 1e3:9.3f} {spread * 1e3:9.3f} "
              f"{direct * 1e6:8.1f} {'':>7}")
        base = None
        for d in [int(v) for v in a.devices.split(",")]:
            with pmap.Context(backend="cpu", devices=d) as ctx:
                p = ctx.params_custom(fn, w, pmap.sgd(1e-6))
                med, spread = timed(lambda: p.update(x, y), a.rounds, a.steps)
            base = base or med
            print(f"{d:7d} {name:>8} {med * 1e3:9.3f} {spread * 1e3:9.3f} {med / d * 1e6:8.1f} "
                  f"{base / med:7.2f}")


if __name__ == "__main__":
    main()
