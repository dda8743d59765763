#!/usr/bin/env python3
"""torch_peer.py: gpt-mini in PyTorch beside pmap, from pmap's own initial parameters.

  PMAP_LIBRARY=build/libpmap.so PYTHONPATH=python python3 bench/torch_peer.py [--steps 20]
      [--bench ROUNDS] [--devices 1,2] [--threads 2]

Builds the same transformer in both (pmap.Model and torch.nn.Module: embedding, positions, pre-
norm blocks of causal attention and a GELU MLP, a head tied to the embedding), copies pmap's
initial parameters (Params.named()) into the PyTorch model, trains both with Adam on the same
copy-task batches and compares every step's loss (exit 1 beyond --tol, default 1e-4 absolute).
--bench R then times R interleaved rounds of steps of pmap on each device count and of PyTorch
on --threads threads (its best CPU setting here), and prints the medians in tokens/s with the
load average before and after."""
import argparse
import math
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import pmap

V, T, D, L, H = 256, 64, 128, 4, 4


def pmap_model():
    m = pmap.Model(input_shape=(T,)).embedding(V, D).pos_embedding()
    for _ in range(L):
        m.begin_residual().token_layernorm().causal_attention(H, D // H).end_residual()
        m.begin_residual().token_layernorm().token_dense(4 * D).gelu().token_dense(D)
        m.end_residual()
    return m.token_layernorm().lm_head(tied=True)


class Peer(torch.nn.Module):
    """The same computation with pmap's parameter shapes: weights (in, out), x @ W + b."""

    def __init__(self, named):
        super().__init__()
        P = lambda a: torch.nn.Parameter(torch.from_numpy(np.array(a, dtype=np.float32)))
        self.p = torch.nn.ParameterDict({k.replace(".", "_"): P(v) for k, v in named.items()})
        self.names = list(named)

    def w(self, name):
        return self.p[name.replace(".", "_")]

    def forward(self, x):
        names = self.names
        h = self.w(names[0])[x] + self.w(names[1])  # token table, positions
        i = 2
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        for _ in range(L):
            g, b, wqkv, wo, bqkv, bo = (self.w(n) for n in names[i:i + 6])
            a = F.layer_norm(h, (D,), g, b, 1e-5)
            qkv = a @ wqkv + bqkv
            q, k, v = (t.reshape(-1, T, H, D // H).transpose(1, 2) for t in qkv.split(D, -1))
            s = (q @ k.transpose(-1, -2)) / math.sqrt(D // H)
            p = s.masked_fill(~mask, float("-inf")).softmax(-1)
            o = (p @ v).transpose(1, 2).reshape(-1, T, D)
            h = h + o @ wo + bo
            g, b, w1, b1, w2, b2 = (self.w(n) for n in names[i + 6:i + 12])
            a = F.layer_norm(h, (D,), g, b, 1e-5)
            h = h + F.gelu(a @ w1 + b1, approximate="tanh") @ w2 + b2
            i += 12
        h = F.layer_norm(h, (D,), self.w(names[i]), self.w(names[i + 1]), 1e-5)
        return h @ self.w(names[0]).t()  # tied head


def copy_task(rows, seed):
    """pmap_copy_task_data's rule: k = T/2 letters of 'a'..'p', '|', the letters again, '.'."""
    rng = np.random.default_rng(seed)
    k = T // 2
    s = np.full((rows, T + 1), ord("."), dtype=np.int32)
    letters = rng.integers(0, 16, (rows, k)) + ord("a")
    s[:, :k], s[:, k], s[:, k + 1:2 * k + 1] = letters, ord("|"), letters
    return s[:, :-1].copy(), s[:, 1:].copy()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.003)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--bench", type=int, default=0, metavar="ROUNDS")
    ap.add_argument("--bench-steps", type=int, default=5)
    ap.add_argument("--devices", default="1,2")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    batches = [copy_task(a.batch, s) for s in (1, 2)]
    with pmap.Context(backend="cpu", devices=1) as ctx:
        params = ctx.params(pmap_model(), pmap.adam(a.lr), seed=0)
        peer = Peer(params.named())
        opt = torch.optim.Adam(peer.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8)
        worst = 0.0
        print(f"{'step':>4} {'pmap loss':>12} {'torch loss':>12} {'|diff|':>10}")
        for s in range(a.steps):
            x, y = batches[s % 2]
            lp = params.update(x, y)
            opt.zero_grad()
            out = peer(torch.from_numpy(x).long())
            loss = F.cross_entropy(out.reshape(-1, V), torch.from_numpy(y).long().reshape(-1))
            loss.backward()
            opt.step()
            d = abs(lp - loss.item())
            worst = max(worst, d)
            print(f"{s:4d} {lp:12.6f} {loss.item():12.6f} {d:10.2e}")
    ok = worst <= a.tol
    print(f"torch_peer: {a.steps} steps, largest loss difference {worst:.3g} "
          f"({'within' if ok else 'BEYOND'} {a.tol:g}); torch {torch.__version__}, "
          f"{a.threads} threads")
    if a.bench:
        bench(a, batches[0])
    return 0 if ok else 1


def bench(a, batch):
    """Interleaved rounds: each round times bench_steps steps of every contender."""
    x, y = batch
    devs = [int(d) for d in a.devices.split(",")]
    ctxs = [pmap.Context(backend="cpu", devices=d) for d in devs]
    ps = [c.params(pmap_model(), pmap.adam(a.lr), seed=0) for c in ctxs]
    peer = Peer(ps[0].named())
    opt = torch.optim.Adam(peer.parameters(), lr=a.lr)
    xt, yt = torch.from_numpy(x).long(), torch.from_numpy(y).long().reshape(-1)

    def torch_step():
        opt.zero_grad()
        F.cross_entropy(peer(xt).reshape(-1, V), yt).backward()
        opt.step()

    steps = {f"pmap {d} dev": (lambda p=p: p.update(x, y)) for d, p in zip(devs, ps)}
    steps[f"torch {a.threads} threads"] = torch_step
    for f in steps.values():  # warm-up
        f()
    times = {k: [] for k in steps}
    load0 = os.getloadavg()
    for _ in range(a.bench):
        for k, f in steps.items():
            t0 = time.perf_counter()
            for _ in range(a.bench_steps):
                f()
            times[k].append((time.perf_counter() - t0) / a.bench_steps)
    load1 = os.getloadavg()
    tokens = a.batch * T
    print(f"bench: {a.bench} interleaved rounds of {a.bench_steps} steps, batch {a.batch} x {T} "
          f"tokens; load average {load0[0]:.2f} before, {load1[0]:.2f} after")
    base = None
    for k, ts in times.items():
        med = statistics.median(ts)
        base = base or med
        print(f"  {k:18s} median {med * 1e3:8.1f} ms/step  {tokens / med:9.0f} tokens/s  "
              f"(min {min(ts) * 1e3:.1f}, max {max(ts) * 1e3:.1f})")
    for p in ps:
        p.close()
    for c in ctxs:
        c.close()


if __name__ == "__main__":
    sys.exit(main())
