#!/usr/bin/env python3
"""torch_fsdp.py: memory per device and step time of pmap's rungs beside PyTorch FSDP's.

  python3 bench/torch_fsdp.py [--pmap-train build/tools/pmap-train] [--depth 8] [--devices 1,2,4]
      [--batch 32] [--steps 12] [--warmup 2] [--rounds 3] [--json OUT]

gpt-mini of --depth blocks (vocabulary 256, context 64, width 128, 4 heads, a tied head, Adam),
global batch --batch, on N devices for each N of --devices:
- pmap: `pmap-train --model gpt-mini --depth D --devices N --json` replicated, with the optimizer
  sharded (--shard optimizer), and with both that and the blocks recomputed (--recompute full);
  the memory plan per device (which equals what a step allocates) and the median step time after
  --warmup steps (each step's own line, --log-every 1);
- PyTorch: N processes of one thread each (gloo) with DistributedDataParallel
  (gradient_as_bucket_view, so that its buckets are the gradients), and with FSDP (fully_shard
  on each block and the root) as SHARD_GRAD_OP (reshard_after_forward=False) and FULL_SHARD
  (True), the latter also with activation checkpointing of every block; per rank the bytes of
  its parameters, gradients and Adam state at rest after a step (each tensor's local shard;
  SHARD_GRAD_OP holds every block's whole parameters too from its forward to its backward, and
  FULL_SHARD one block's at a time), the bytes of the activations autograd saves for the backward
  pass (saved_tensors_hooks: each storage once, held until the step ends so that no address is
  reused, parameters and views of them left out), and the median step time after --warmup
  steps (between barriers).
Rounds alternate pmap's and PyTorch's runs; the table gives medians over --rounds. pmap's
activation bytes are its whole arena (outputs, output gradients, scratch); PyTorch's are what
autograd keeps, not the backward pass's own temporaries. More devices than cores share them."""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

V, T, D, H = 256, 64, 128, 4  # gpt-mini's


class Block(torch.nn.Module):
    """A pre-norm transformer block: causal attention, then a GELU MLP, each residual."""

    def __init__(self):
        super().__init__()
        self.n1, self.n2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
        self.qkv, self.o = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, D)
        self.up, self.down = torch.nn.Linear(D, 4 * D), torch.nn.Linear(4 * D, D)

    def forward(self, h):
        q, k, v = (t.reshape(-1, T, H, D // H).transpose(1, 2)
                   for t in self.qkv(self.n1(h)).split(D, -1))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.o(a.transpose(1, 2).reshape(-1, T, D))
        return h + self.down(F.gelu(self.up(self.n2(h)), approximate="tanh"))


class Gpt(torch.nn.Module):
    def __init__(self, depth, ckpt):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(V, D), torch.nn.Parameter(torch.zeros(T, D))
        self.blocks = torch.nn.ModuleList(Block() for _ in range(depth))
        self.norm, self.ckpt = torch.nn.LayerNorm(D), ckpt

    def forward(self, x):
        h = self.tok(x) + self.pos
        for b in self.blocks:
            h = torch.utils.checkpoint.checkpoint(b, h, use_reentrant=False) if self.ckpt else b(h)
        return self.norm(h) @ self.tok.weight.t()


def local_bytes(t):
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def rank_main(rank, n, port, a, mode, ckpt, out):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=n)
    torch.manual_seed(1)
    m = Gpt(a.depth, ckpt)
    if mode == "ddp":
        m = torch.nn.parallel.DistributedDataParallel(m, gradient_as_bucket_view=True)
    else:
        from torch.distributed.fsdp import fully_shard
        for b in m.blocks:
            fully_shard(b, reshard_after_forward=mode == "full_shard")
        fully_shard(m, reshard_after_forward=mode == "full_shard")
    opt = torch.optim.Adam(m.parameters(), 1e-3)
    g = torch.Generator().manual_seed(2 + rank)
    rows = a.batch // n
    x = torch.randint(0, V, (rows, T), generator=g)
    y = torch.randint(0, V, (rows, T), generator=g)
    saved = {}

    def is_param(t):
        return (t.is_leaf and t.requires_grad) or (
            t._base is not None and t._base.is_leaf and t._base.requires_grad)

    def pack(t):
        if not is_param(t):
            s = t.untyped_storage()
            saved[s.data_ptr()] = (s.nbytes(), t)  # t held: its address is not reused
        return t

    times = []
    for step in range(a.warmup + a.steps):
        dist.barrier()
        t0 = time.perf_counter()
        saved.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = F.cross_entropy(m(x).reshape(-1, V), y.reshape(-1))
        acts = sum(n for n, _ in saved.values())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        dist.barrier()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    params = sum(local_bytes(p) for p in m.parameters())
    grads = sum(local_bytes(p.grad) for p in m.parameters() if p.grad is not None)
    state = sum(local_bytes(v) for s in opt.state.values() for v in s.values()
                if torch.is_tensor(v) and v.dim() > 0)
    if rank == 0:
        out.put({"params": params, "grads": grads, "optimizer": state, "activations": acts,
                 "step_s": statistics.median(times)})
    dist.destroy_process_group()


def torch_run(a, n, mode, ckpt):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, n, port, a, mode, ckpt, out))
             for r in range(n)]
    for p in procs:
        p.start()
    res = out.get(timeout=600)
    for p in procs:
        p.join()
    return res


def pmap_run(a, n, shard, recompute):
    cmd = [a.pmap_train, "--model", "gpt-mini", "--depth", str(a.depth), "--devices", str(n),
           "--batch", str(a.batch), "--steps", str(a.warmup + a.steps), "--shard", shard,
           "--recompute", recompute, "--progress", "lines", "--log-every", "1", "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    lines = p.stdout.strip().splitlines()
    m = json.loads(lines[-1])["memory"]
    # "step      3  loss 4.435419  samples/s 826 ...": each step's own rate
    rates = [float(ln.split()[5]) for ln in lines if ln.startswith("step ")
             and int(ln.split()[1]) > a.warmup]
    return {"params": m["params"], "grads": m["grads"], "optimizer": m["optimizer"],
            "activations": m["activations"], "step_s": statistics.median(a.batch / r for r in rates)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pmap-train", default="build/tools/pmap-train")
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--devices", default="1,2,4")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None, metavar="OUT")
    a = ap.parse_args()
    devices = [int(d) for d in a.devices.split(",")]
    if any(d < 1 or a.batch % d for d in devices):
        ap.error(f"--devices {a.devices}: counts that divide --batch {a.batch}")
    rungs = [("pmap", "replicated", lambda n: pmap_run(a, n, "none", "none")),
             ("pmap", "--shard optimizer", lambda n: pmap_run(a, n, "optimizer", "none")),
             ("pmap", "--shard optimizer --recompute full",
              lambda n: pmap_run(a, n, "optimizer", "full")),
             ("torch", "DDP", lambda n: torch_run(a, n, "ddp", False)),
             ("torch", "FSDP SHARD_GRAD_OP", lambda n: torch_run(a, n, "grad_op", False)),
             ("torch", "FSDP FULL_SHARD", lambda n: torch_run(a, n, "full_shard", False)),
             ("torch", "FULL_SHARD + checkpointing", lambda n: torch_run(a, n, "full_shard", True))]
    runs = {}
    load0 = os.getloadavg()[0]
    for _ in range(a.rounds):
        for n in devices:
            for who, name, fn in rungs:
                runs.setdefault((n, who, name), []).append(fn(n))
    load1 = os.getloadavg()[0]
    print(f"gpt-mini, {a.depth} blocks, global batch {a.batch} x {T} tokens, Adam; medians of "
          f"{a.rounds} alternated rounds of {a.steps} steps; torch {torch.__version__}, one "
          f"thread a rank; load average {load0:.2f} before, {load1:.2f} after")
    print("| devices | rung | params + grads + optimizer (MB a device) | activations (MB) | "
          "step (ms) |")
    print("|---|---|---|---|---|")
    table = []
    for (n, who, name), rs in runs.items():
        row = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        fixed = (row["params"] + row["grads"] + row["optimizer"]) / 1e6
        print(f"| {n} | {who}: {name} | {fixed:.2f} | {row['activations'] / 1e6:.2f} | "
              f"{row['step_s'] * 1e3:.1f} |")
        table.append(dict(row, devices=n, who=who, rung=name))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
