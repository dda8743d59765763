#!/usr/bin/env python3
"""torch_peer.py: gpt-mini in PyTorch beside pmap, from pmap's own initial parameters.

  PMAP_LIBRARY=build/libpmap.so PYTHONPATH=python python3 bench/torch_peer.py [--steps 20]
      [--bench ROUNDS] [--devices 1,2] [--threads 2] [--ddp 2] [--precision fp32|bf16]

Builds the same transformer in both (pmap.Model and torch.nn.Module: embedding, positions, pre-
norm blocks of causal attention and a GELU MLP, a head tied to the embedding), copies pmap's
initial parameters (Params.named()) into the PyTorch model, trains both with Adam on the same
copy-task batches and compares every step's loss, relative to PyTorch's (exit 1 beyond its
bound: python/tests/bounds.py, the copy of tests/bounds.h, for gpt-mini, the batch and the step,
or beyond --tol).
--bench R then times R interleaved rounds of steps of pmap on each device count and of PyTorch
on --threads threads in this process, and with --ddp N of PyTorch's DistributedDataParallel on N
processes of one thread each (gloo, the batch split in N, as pmap splits it over devices; each
rank's OpenBLAS held to one thread), and
prints the medians in tokens/s with the load average before and after.
--precision bf16 trains pmap under its bf16 policy (Params.set_precision) and PyTorch under
torch.autocast("cpu", dtype=torch.bfloat16) (bfloat16 matmuls, float master weights and Adam),
and compares the loss curves: every step's loss against its bf16 bound, and the mean of the last
fifth of the steps."""
import argparse
import math
import os
import queue
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import pmap

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python",
                                "tests"))
from bounds import bound_model_of, bound_order32, bound_prec16  # noqa: E402

V, T, D, L, H = 256, 64, 128, 4, 4  # gpt-mini's


def loss_bound(bf16, rows, steps):
    """How far the two sides' losses may part after `steps` passes on batches of `rows` rows,
    relative (docs/tolerances.md). fp32: both sum in float32 in other orders (their elementwise
    functions err by a few roundings a value, within the sums' count): bound_order32. bf16: pmap
    rounds every GEMM's operands; autocast rounds them and every matmul's result too (forward and
    backward), so that any of twice pmap's roundings may differ: bound_prec16 on those."""
    m = bound_model_of("gpt-mini")
    if bf16:
        return bound_prec16(m._replace(r_all=2 * m.r_all), rows, steps)
    return bound_order32(m, rows, steps)


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
    ap.add_argument("--tol", type=float, default=None,
                    help="the largest relative loss difference allowed at every step (default: "
                         "the step's bound, python/tests/bounds.py)")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--bench", type=int, default=0, metavar="ROUNDS")
    ap.add_argument("--bench-steps", type=int, default=5)
    ap.add_argument("--devices", default="1,2")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--ddp", type=int, default=0, metavar="RANKS",
                    help="also time DistributedDataParallel on RANKS processes (0: not)")
    a = ap.parse_args()
    if a.ddp < 0 or (a.ddp and a.batch % a.ddp):
        ap.error(f"--ddp {a.ddp}: a count of ranks that divides --batch {a.batch}")
    bf16 = a.precision == "bf16"
    torch.set_num_threads(a.threads)
    batches = [copy_task(a.batch, s) for s in (1, 2)]
    with pmap.Context(backend="cpu", devices=1) as ctx:
        params = ctx.params(pmap_model(), pmap.adam(a.lr), seed=0)
        params.set_precision(a.precision)
        peer = Peer(params.named())
        opt = torch.optim.Adam(peer.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8)
        worst, lps, lts = (0.0, 1.0, -1), [], []  # the difference, its bound, the step
        print(f"{'step':>4} {'pmap loss':>12} {'torch loss':>12} {'|rel diff|':>10} {'bound':>10}"
              f"  ({a.precision})")
        for s in range(a.steps):
            x, y = batches[s % 2]
            lp = params.update(x, y)
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                out = peer(torch.from_numpy(x).long())
            loss = F.cross_entropy(out.float().reshape(-1, V),
                                   torch.from_numpy(y).long().reshape(-1))
            loss.backward()
            opt.step()
            d = abs(lp - loss.item()) / abs(loss.item())
            b = a.tol if a.tol is not None else loss_bound(bf16, a.batch, s + 1)
            if not d / b <= worst[0] / worst[1]:  # the largest against its bound, or NaN
                worst = (d, b, s)
            lps.append(lp), lts.append(loss.item())
            print(f"{s:4d} {lp:12.6f} {loss.item():12.6f} {d:10.2e} {b:10.2e}")
    ok = worst[0] <= worst[1]
    tail = max(len(lps) // 5, 1)
    mp_, mt = statistics.mean(lps[-tail:]), statistics.mean(lts[-tail:])
    print(f"torch_peer: {a.steps} steps under {a.precision}, largest relative loss difference "
          f"against its bound {worst[0]:.3g} at step {worst[2]} ({'within' if ok else 'BEYOND'} "
          f"{worst[1]:.3g}); mean of "
          f"the last {tail} losses: pmap {mp_:.6f}, torch {mt:.6f} ({100 * (mp_ - mt) / mt:+.3f} "
          f"%); torch {torch.__version__}, {a.threads} threads")
    if a.bench:
        bench(a, batches[0])
    return 0 if ok else 1


def bench(a, batch):
    """Interleaved rounds: each round times bench_steps steps of every contender."""
    x, y = batch
    devs = [int(d) for d in a.devices.split(",")]
    bf16 = a.precision == "bf16"
    ctxs = [pmap.Context(backend="cpu", devices=d) for d in devs]
    ps = [c.params(pmap_model(), pmap.adam(a.lr), seed=0) for c in ctxs]
    for p in ps:
        p.set_precision(a.precision)
    peer = Peer(ps[0].named())
    opt = torch.optim.Adam(peer.parameters(), lr=a.lr)
    xt, yt = torch.from_numpy(x).long(), torch.from_numpy(y).long().reshape(-1)

    def torch_step():
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = peer(xt)
        F.cross_entropy(out.float().reshape(-1, V), yt).backward()
        opt.step()

    steps = {f"pmap {d} dev": (lambda p=p: p.update(x, y)) for d, p in zip(devs, ps)}
    steps[f"torch {a.threads} threads"] = torch_step
    ddp = DDPGroup(a.ddp, ps[0].named(), x, y, a.lr, bf16) if a.ddp else None
    if ddp:
        steps[f"torch DDP {a.ddp}x1"] = ddp.step
    try:
        for f in steps.values():  # warm-up
            f()
        times = {k: [] for k in steps}
        load0 = os.getloadavg()
        for _ in range(a.bench):
            for k, f in steps.items():
                if ddp and f == ddp.step:  # timed inside the ranks, between barriers
                    times[k].append(ddp.run(a.bench_steps))
                    continue
                t0 = time.perf_counter()
                for _ in range(a.bench_steps):
                    f()
                times[k].append((time.perf_counter() - t0) / a.bench_steps)
        load1 = os.getloadavg()
        tokens = a.batch * T
        print(f"bench: {a.bench} interleaved rounds of {a.bench_steps} steps, batch {a.batch} x "
              f"{T} tokens, {a.precision}; load average {load0[0]:.2f} before, {load1[0]:.2f} "
              "after")
        base = None
        for k, ts in times.items():
            med = statistics.median(ts)
            base = base or med
            print(f"  {k:18s} median {med * 1e3:8.1f} ms/step  {tokens / med:9.0f} tokens/s  "
                  f"(min {min(ts) * 1e3:.1f}, max {max(ts) * 1e3:.1f})")
    finally:  # the ranks end also when a step fails
        if ddp:
            ddp.close()
    for p in ps:
        p.close()
    for c in ctxs:
        c.close()


def ddp_rank(rank, ranks, rendezvous, named, x, y, lr, bf16, cmds, results):
    """One DDP rank: one thread, rows rank/ranks of the batch; runs the steps it is sent."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + rendezvous, rank=rank,
                            world_size=ranks)
    model = torch.nn.parallel.DistributedDataParallel(Peer(named))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    rows = len(x) // ranks
    xt = torch.from_numpy(x[rank * rows:(rank + 1) * rows]).long()
    yt = torch.from_numpy(y[rank * rows:(rank + 1) * rows]).long().reshape(-1)
    while True:
        n = cmds[rank].get()
        if n is None:
            break
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(n):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                out = model(xt)
            F.cross_entropy(out.float().reshape(-1, V), yt).backward()
            opt.step()
        dist.barrier()
        if rank == 0:
            results.put((time.perf_counter() - t0) / max(n, 1))
    dist.destroy_process_group()


class DDPGroup:
    """PyTorch's data-parallel peer: RANKS spawned processes (gloo), driven step by step. The
    ranks meet through a file (no port to collide with); they are daemons, and close() ends any
    that has not, so an error on either side never leaves the script waiting."""

    def __init__(self, ranks, named, x, y, lr, bf16=False):
        ctx = mp.get_context("spawn")
        self.cmds = [ctx.Queue() for _ in range(ranks)]
        self.results = ctx.Queue()
        self.dir = tempfile.mkdtemp(prefix="torch-peer-")
        rendezvous = os.path.join(self.dir, "rendezvous")
        self.procs = [ctx.Process(target=ddp_rank, daemon=True,
                                  args=(r, ranks, rendezvous, named, x, y, lr, bf16,
                                        self.cmds, self.results))
                      for r in range(ranks)]
        # One core per rank: Debian's torch multiplies with OpenBLAS's pthread build, which
        # otherwise starts a thread per core in every rank (the ranks then slow each other).
        saved = {k: os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
        os.environ.update({k: "1" for k in saved})
        try:
            for p in self.procs:
                p.start()
        finally:
            for k, v in saved.items():
                if v is None:
                    del os.environ[k]
                else:
                    os.environ[k] = v

    def run(self, n):
        """n steps on every rank; their time per step, measured by rank 0."""
        for q in self.cmds:
            q.put(n)
        deadline = time.monotonic() + 600
        while True:
            try:
                return self.results.get(timeout=1)
            except queue.Empty:
                dead = [p.exitcode for p in self.procs if p.exitcode is not None]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError("torch_peer: a DDP rank %s" % (
                        "exited (codes %s)" % dead if dead else "gave no result in 600 s"))

    def step(self):  # the warm-up
        self.run(1)

    def close(self):
        for q in self.cmds:
            q.put(None)
        for p in self.procs:
            p.join(60)
            if p.is_alive():
                p.terminate()
                p.join()
        shutil.rmtree(self.dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
