#!/usr/bin/env python3
# jax_compare.py: pmap against jax.pmap + lax.pmean on the same models, data, initial parameters,
# optimizers, device counts and cores: runs pmap-bench (which dumps what it trains), then the same
# training in JAX, checks that both reach the same losses, prints a side-by-side table.
import argparse
import json
import os
from math import prod, sqrt
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python",
                                "tests"))
from bounds import BOUND_LAMBDA, bound_model_of, bound_order32, bound_prec16  # noqa: E402

# How far the two sides' losses may part (tests/bounds.h, python/tests/bounds.py its copy;
# docs/tolerances.md), on the model's counts, its global batch and the steps taken: under fp32
# both sides sum in float32 in other orders (their elementwise functions err by a few roundings
# a value, within the sums' count), bound_order32; under bf16 each side rounds to bfloat16 at
# its own places (pmap's policy; JAX every matmul and convolution operand), so that any rounding
# on the path may differ, bound_prec16; under TF32 each side's GEMMs keep 10 fraction bits of
# their operands, rounded or truncated (up to 2^-10), at places of their own: bound_prec16's form
# with that unit. The step-0 losses (one forward pass from the same parameters) are held to the
# bound of one pass; the final losses to that of their steps only within the first
# CHECKED_STEPS steps (a run of --steps 4 --warmup 0), early in training where the bounds'
# premises hold: a run of hundreds of steps on one batch drives the loss toward zero, where its
# condition grows without limit, and Adam's normalised step turns rounding differences of the
# vanishing gradients into whole steps (bench/pmap-bench.c, CHECKED_STEPS, says more). Beyond
# them the final losses are reported beside the bound, not held to it.
CHECKED_STEPS = 10
BOUND_TF32 = 2.0 ** -10


def loss_bound(model, precision, rows, steps):
    """The bound of the two sides' losses after `steps` passes (None: no counts for the model)."""
    m = bound_model_of(model)
    if m is None:
        return None
    if precision == "bf16":
        return bound_prec16(m, rows, steps)
    if precision == "tf32":
        return (bound_order32(m, rows, steps)
                + BOUND_LAMBDA * m.kappa * BOUND_TF32 * sqrt(m.r_all * steps / (rows * m.tokens)))
    return bound_order32(m, rows, steps)
# The GEMM precision of each side for --precision on the GPU: pmap's PMAP_CUDA_TF32 and JAX's
# default matmul precision (which also governs its convolutions; on the GPU JAX's own default
# lets XLA use TF32 for float32, so the comparison sets it explicitly on both sides).
# bf16: pmap's bf16 policy (pmap-bench --precision bf16) against JAX with every matmul and
# convolution on bfloat16 operands and float32 results (preferred_element_type), the rest float32.
PRECISIONS = {"fp32": {"PMAP_CUDA_TF32": "0", "JAX_DEFAULT_MATMUL_PRECISION": "float32"},
              "tf32": {"PMAP_CUDA_TF32": "1", "JAX_DEFAULT_MATMUL_PRECISION": "tensorfloat32"},
              "bf16": {"PMAP_CUDA_TF32": "0", "JAX_DEFAULT_MATMUL_PRECISION": "float32"}}


def parse_cores(spec):
    cores = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        cores.update(range(int(lo), int(hi or lo) + 1))
    return sorted(cores)


def param_blocks(spec):
    """The trained blocks of pmap's flat vector, in its order, as pmap-bench --dump names them
    (pmap_model_param_block: layer, block, shape, offset, count); the blocks, state included,
    must tile the vector's spec["params"] floats exactly."""
    at, trained = 0, []
    for b in spec["blocks"]:
        if b["offset"] != at or b["count"] != prod(b["shape"]):
            raise SystemExit("jax_compare: block %s at %d of %d floats, after %d floats"
                             % (b["name"], b["offset"], b["count"], at))
        at += b["count"]
        if b["trained"]:
            trained.append(b)
    if at != spec["params"]:
        raise SystemExit("jax_compare: the blocks cover %d of %d parameters" % (at, spec["params"]))
    return trained


# ---------------------------------------------------------------------------------------------
# The JAX side: one process per XLA configuration, since XLA_FLAGS is read once at start-up.

def jax_worker(args):
    import numpy as np
    import jax
    import jax.numpy as jnp
    from jax import lax

    now = time.perf_counter
    plan = json.loads(args.worker)
    devices_all = jax.devices()
    out = {"jax": jax.__version__, "backend": jax.default_backend(), "rows": []}
    for m in plan["models"]:
        spec = json.load(open(os.path.join(plan["dump"], m["model"] + ".json")))
        flat = np.fromfile(os.path.join(plan["dump"], m["model"] + ".params.f32"), "<f4")
        x = np.fromfile(os.path.join(plan["dump"], m["model"] + ".x.f32"),
                        "<i4" if spec.get("x_dtype") == "int32" else "<f4")  # token ids
        x = x.reshape(spec["x_shape"])
        y = np.fromfile(os.path.join(plan["dump"], m["model"] + ".y.bin"),
                        "<i4" if spec["y_dtype"] == "int32" else "<f4").reshape(spec["y_shape"])
        for layer in spec["layers"]:
            if layer["kind"] == "dropout" and layer["rate"] > 0:
                # pmap's masks come from its own counter-based hash; not reproduced here.
                raise SystemExit("jax_compare: dropout with rate > 0 has no JAX counterpart here")
        # JAX's parameters: pmap's trained blocks, in pmap's shapes; where[(layer, block)] is a
        # block's place among them. Batch norm's running statistics are state that a training
        # step's loss never reads: they stay out.
        blocks = param_blocks(spec)
        params = [flat[b["offset"]:b["offset"] + b["count"]].reshape(b["shape"]) for b in blocks]
        where = {(b["layer"], b["block"]): i for i, b in enumerate(blocks)}
        layers, loss_kind, opt = spec["layers"], spec["loss"], spec["optimizer"]
        bf16 = plan.get("precision") == "bf16"

        def mm(a, b):  # a matmul: float32, or bfloat16 operands with float32 results
            if not bf16:
                return a @ b
            return jnp.matmul(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16),
                              preferred_element_type=jnp.float32)

        def batchnorm(h, g, b, layer):
            # Training-mode statistics: of the global batch across the pmap axis when
            # cross_replica (flax BatchNorm(axis_name=...)); shards are equal, so the global
            # moments are the means of the shards' moments.
            axes = (0,) if h.ndim == 2 else (0, 2, 3)
            mean, sq = jnp.mean(h, axis=axes), jnp.mean(h * h, axis=axes)
            if layer["cross_replica"]:
                mean, sq = lax.pmean(mean, "i"), lax.pmean(sq, "i")
            var = jnp.maximum(sq - mean * mean, 0.0)
            shape = (1, -1) if h.ndim == 2 else (1, -1, 1, 1)
            return ((h - mean.reshape(shape)) / jnp.sqrt(var.reshape(shape) + layer["eps"])
                    * g.reshape(shape) + b.reshape(shape))

        def pool(h, layer, reducer, init):
            kh, kw, s = layer["kh"], layer["kw"], layer["stride"]
            return lax.reduce_window(h, init, reducer, (1, 1, kh, kw), (1, 1, s, s), "VALID")

        def attention(h, wqkv, wo, bqkv, bo, layer):
            t, nh, hs = h.shape[1], layer["heads"], layer["head_size"]
            e = nh * hs
            qkv = mm(h, wqkv) + bqkv
            q, kk, v = (qkv[..., j * e:(j + 1) * e].reshape(h.shape[0], t, nh, hs)
                        .transpose(0, 2, 1, 3) for j in range(3))
            s = mm(q, kk.transpose(0, 1, 3, 2)) / jnp.sqrt(jnp.float32(hs))
            s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -jnp.inf)
            o = mm(jax.nn.softmax(s, axis=-1), v)
            return mm(o.transpose(0, 2, 1, 3).reshape(h.shape[0], t, e), wo) + bo

        def forward(ps, h):
            skips = []
            for li, layer in enumerate(layers):
                k = layer["kind"]

                def w(block, li=li):  # the block of this layer by its name in pmap
                    return ps[where[(li, block)]]

                if k == "embedding":
                    h = w("table")[h]
                elif k == "pos_embedding":
                    h = h + w("table")
                elif k in ("token_dense", "dense"):
                    h = mm(h, w("w")) + w("b")
                elif k == "token_layernorm":
                    mean = jnp.mean(h, axis=-1, keepdims=True)
                    var = jnp.mean((h - mean) ** 2, axis=-1, keepdims=True)
                    h = (h - mean) / jnp.sqrt(var + layer["eps"]) * w("gamma") + w("beta")
                elif k == "causal_attention":
                    h = attention(h, w("wqkv"), w("wo"), w("bqkv"), w("bo"), layer)
                elif k == "lm_head":
                    if layer["tied"]:  # the token embedding's table, layer 0's
                        h = mm(h, ps[where[(0, "table")]].T)
                    else:
                        h = mm(h, w("w")) + w("b")
                elif k == "relu":
                    h = jnp.maximum(h, 0.0)
                elif k == "conv2d":
                    s, p = layer["stride"], layer["pad"]
                    cast = (lambda a: a.astype(jnp.bfloat16)) if bf16 else (lambda a: a)
                    h = lax.conv_general_dilated(cast(h), cast(w("w")), (s, s), [(p, p), (p, p)],
                                                 dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                                 preferred_element_type=jnp.float32)
                    h = h + w("b")[None, :, None, None]
                elif k == "flatten":
                    h = h.reshape(h.shape[0], -1)
                elif k == "tanh":
                    h = jnp.tanh(h)
                elif k == "sigmoid":
                    h = jax.nn.sigmoid(h)
                elif k == "gelu":
                    h = jax.nn.gelu(h, approximate=True)
                elif k == "layernorm":  # gamma and beta in the shape of one example
                    axes = tuple(range(1, h.ndim))
                    mean = jnp.mean(h, axis=axes, keepdims=True)
                    var = jnp.mean((h - mean) ** 2, axis=axes, keepdims=True)
                    h = (h - mean) / jnp.sqrt(var + layer["eps"]) * w("gamma") + w("beta")
                elif k == "batchnorm":
                    h = batchnorm(h, w("gamma"), w("beta"), layer)
                elif k in ("maxpool2d", "avgpool2d"):
                    if k == "maxpool2d":
                        h = pool(h, layer, lax.max, -jnp.inf)
                    else:
                        h = pool(h, layer, lax.add, 0.0) / (layer["kh"] * layer["kw"])
                    if layer["global"]:
                        h = h.reshape(h.shape[0], -1)
                elif k == "dropout":
                    pass  # rate 0 (others are refused above)
                elif k == "res_begin":
                    skips.append(h)
                elif k == "res_end":
                    h = h + skips.pop()
                else:
                    raise SystemExit("jax_compare: unknown layer kind " + k)
            return h

        def loss_fn(ps, xb, yb):
            z = forward(ps, xb)
            if loss_kind == "mse":
                return jnp.mean((z - yb) ** 2)
            if loss_kind == "token_xent":  # every token a row
                z, yb = z.reshape(-1, z.shape[-1]), yb.reshape(-1)
            picked = jnp.take_along_axis(z, yb.reshape(-1, 1), axis=1)[:, 0]
            return jnp.mean(jax.nn.logsumexp(z, axis=1) - picked)

        lr, mom = opt["lr"], opt["momentum"]
        b1, b2, eps = opt["beta1"], opt["beta2"], opt["eps"]

        # The same update as ops/op_math.h: SGD with momentum v = m v + g, w -= lr v; Adam with
        # bias corrections 1 - beta^t.
        def step(ps, st, xb, yb):
            loss, g = jax.value_and_grad(loss_fn)(ps, xb, yb)
            g = lax.pmean(g, "i")
            loss = lax.pmean(loss, "i")
            if opt["kind"] == "sgd":
                if mom:
                    v = [mom * vi + gi for vi, gi in zip(st["v"], g)]
                    return [w - lr * vi for w, vi in zip(ps, v)], {"v": v}, loss
                return [w - lr * gi for w, gi in zip(ps, g)], st, loss
            t = st["t"] + 1.0
            mm = [b1 * mi + (1 - b1) * gi for mi, gi in zip(st["m"], g)]
            vv = [b2 * vi + (1 - b2) * gi * gi for vi, gi in zip(st["v"], g)]
            bc1, bc2 = 1.0 - b1 ** t, 1.0 - b2 ** t
            ps = [w - lr * (mi / bc1) / (jnp.sqrt(vi / bc2) + eps) for w, mi, vi in zip(ps, mm, vv)]
            return ps, {"m": mm, "v": vv, "t": t}, loss

        setups = []
        for n in plan["devices"]:
            devs = devices_all[:n]
            # Places a stacked array on the devices, one slice each.
            put = jax.pmap(lambda a: a, devices=devs)

            def replicate(a, n=n, put=put):
                return put(np.broadcast_to(a, (n,) + a.shape).copy())

            state = {}
            if opt["kind"] == "sgd" and mom:
                state = {"v": [np.zeros_like(p) for p in params]}
            elif opt["kind"] == "adam":
                state = {"m": [np.zeros_like(p) for p in params],
                         "v": [np.zeros_like(p) for p in params], "t": np.float32(0.0)}
            rows = x.shape[0] // n
            setups.append({
                "n": n,
                "fn": jax.pmap(step, axis_name="i", devices=devs, donate_argnums=(0, 1)),
                "ps": [replicate(p) for p in params],
                "st": jax.tree_util.tree_map(replicate, state),
                "x": put(x.reshape((n, rows) + x.shape[1:])),
                "y": put(y.reshape((n, rows) + y.shape[1:])),
                "t": [], "steps": 0,
            })

        def run(s):
            s["ps"], s["st"], loss = s["fn"](s["ps"], s["st"], s["x"], s["y"])
            loss.block_until_ready()
            s["steps"] += 1
            return float(loss[0])

        # The protocol of pmap-bench: step 0 timed apart (here it includes the compilation),
        # warm-up, then interleaved rounds of one re-warming step and the timed steps.
        for s in setups:
            t0 = now()
            s["loss0"] = run(s)
            s["step0_ms"] = 1e3 * (now() - t0)
            for _ in range(m["warmup"]):
                s["loss"] = run(s)
        rounds, steps = m["rounds"], m["steps"]
        for r in range(rounds):
            n_timed = steps * (r + 1) // rounds - steps * r // rounds
            for s in setups:
                s["loss"] = run(s)
                for _ in range(n_timed):
                    t0 = now()
                    s["loss"] = run(s)
                    s["t"].append(now() - t0)
        for s in setups:
            t = sorted(s["t"])
            def q(f, t=t):
                return 1e3 * t[min(len(t) - 1, max(0, int(f * (len(t) - 1) + 0.5)))]
            out["rows"].append({"model": m["model"], "devices": s["n"], "step0_ms": s["step0_ms"],
                                "median_ms": q(0.5), "p10_ms": q(0.1), "p90_ms": q(0.9),
                                "loss0": s["loss0"], "loss": s["loss"],
                                "total_steps": s["steps"]})
    print(json.dumps(out))


# ---------------------------------------------------------------------------------------------
# The orchestration: pmap-bench and the JAX workers in turns, then the table.

def last_json(text):
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError("no JSON line in the output")


def pinned(cores):
    return lambda: os.sched_setaffinity(0, cores)


def run_pmap(args, n, cores, dump):
    cmd = [args.pmap_bench, "--model", args.models, "--devices", str(n), "--scaling", "strong",
           "--no-ref", "--json", "--backend", "cuda" if args.gpu else "cpu",
           "--precision", "bf16" if args.precision_now == "bf16" else "fp32"]
    if args.steps:
        cmd += ["--steps", str(args.steps)]
    if args.warmup is not None:
        cmd += ["--warmup", str(args.warmup)]
    if dump:
        cmd += ["--dump", dump]
    env = dict(os.environ, **({"PMAP_CUDA_TF32": PRECISIONS[args.precision_now]["PMAP_CUDA_TF32"]}
                              if args.gpu else {}))
    p = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=pinned(cores), env=env)
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        raise SystemExit("jax_compare: pmap-bench failed: " + " ".join(cmd))
    return last_json(p.stdout)


def run_jax(args, plan, n, cores, one_thread):
    if args.gpu:
        flags = os.environ.get("XLA_FLAGS", "")
        env = dict(os.environ, JAX_PLATFORMS="cuda",
                   JAX_DEFAULT_MATMUL_PRECISION=PRECISIONS[args.precision_now][
                       "JAX_DEFAULT_MATMUL_PRECISION"])
    else:
        flags = "--xla_force_host_platform_device_count=%d" % n
        if one_thread:
            flags += " --xla_cpu_multi_thread_eigen=false"
        env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    plan = dict(plan, devices=[n], precision=args.precision_now)
    p = subprocess.run([sys.executable, __file__, "--worker", json.dumps(plan)], env=env,
                       capture_output=True, text=True, preexec_fn=pinned(cores))
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        raise SystemExit("jax_compare: the JAX run failed (XLA_FLAGS=%s)" % flags)
    return last_json(p.stdout), flags


def loss_diff(a, b):
    """Relative difference; losses below 1e-3 are compared to 1e-3 (near-zero losses differ
    by float32 rounding alone, which a relative measure would blow up). The bounds are relative:
    a difference within one is within it here too."""
    return abs(a - b) / max(abs(b), 1e-3)


def main():
    ap = argparse.ArgumentParser(
        description="pmap against jax.pmap + lax.pmean on the same models, data and cores")
    ap.add_argument("--pmap-bench", default="build/bench/pmap-bench")
    ap.add_argument("--models", default="linear,mlp,convnet,mlp-1024,cifar-cnn,res-mlp,cifar-bn")
    ap.add_argument("--devices", default="1,2,4")
    ap.add_argument("--steps", type=int, default=0, help="timed steps (default: pmap-bench's)")
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=2, help="turns of pmap then JAX (medians)")
    ap.add_argument("--cores", default=None,
                    help="CPU cores to use, e.g. 0-1 (default: all this process may use); N "
                         "devices run on the first min(N, cores) of them, on both sides")
    ap.add_argument("--jax-threads", choices=["both", "xla", "one"], default="both",
                    help="XLA's own threading, one thread per device's ops, or both")
    ap.add_argument("--platform", choices=["auto", "cpu", "gpu"], default="auto",
                    help="gpu: pmap's CUDA backend against JAX on the GPUs; auto: gpu where "
                         "this Python's JAX sees a GPU, else cpu")
    ap.add_argument("--precision", choices=["fp32", "tf32", "bf16", "both"], default="both",
                    help="FP32 GEMMs on both sides (PMAP_CUDA_TF32=0, JAX matmul precision "
                         "float32), on the GPU TF32 on both, bf16 (pmap's bf16 policy against "
                         "JAX's matmuls and convolutions on bfloat16 operands with float32 "
                         "results), or both (fp32 then tf32 on the GPU, fp32 on the CPU; the "
                         "default)")
    ap.add_argument("--out", default=None, help="write jax_compare.csv and .json here")
    ap.add_argument("--dry-run", action="store_true",
                    help="check the arguments and that numpy and jax import; run nothing")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return jax_worker(args)
    if args.dry_run:
        import numpy  # noqa: F401  (what the workers need)
        import jax
        print("jax_compare: would compare %s on %s devices (%s, precision %s) with JAX %s"
              % (args.models, args.devices, args.platform, args.precision, jax.__version__))
        return 0

    cores = parse_cores(args.cores) if args.cores else sorted(os.sched_getaffinity(0))
    if args.models == "all":
        args.models = "linear,mlp,convnet,mlp-1024,cifar-cnn,res-mlp,cifar-bn,gpt-mini"
    devices = [int(d) for d in args.devices.split(",")]
    args.gpu = args.platform == "gpu"
    if args.platform == "auto":
        probe = subprocess.run([sys.executable, "-c", "import jax; print(len(jax.devices('gpu')))"],
                               capture_output=True, text=True)
        args.gpu = probe.returncode == 0 and probe.stdout.strip() not in ("", "0")
        if args.gpu:
            # JAX puts one device on one GPU; pmap may share GPUs, JAX cannot.
            gpus = int(probe.stdout.strip())
            dropped = [d for d in devices if d > gpus]
            devices = [d for d in devices if d <= gpus]
            if dropped:
                print("note: this machine has %d GPU%s and JAX puts one device on each, so "
                      "device count%s %s %s compared on %d GPU%s only"
                      % (gpus, "" if gpus == 1 else "s", "" if len(dropped) == 1 else "s",
                         ",".join(map(str, dropped)), "is not" if len(dropped) == 1 else "are not",
                         gpus, "" if gpus == 1 else "s"))
    configs = {"both": [False, True], "xla": [False], "one": [True]}[args.jax_threads]
    if args.gpu:
        configs = [False]  # XLA's CPU threading flags mean nothing on the GPU
    names = {False: "JAX (XLA threads)" if not args.gpu else "JAX (GPU)",
             True: "JAX (1 thread/dev)"}

    # Turns: for each device count, pmap-bench then each JAX setting, both pinned to the same
    # min(N, cores) cores, so that neither side uses a core the other may not.
    if not devices:
        raise SystemExit("jax_compare: no device count left to compare")
    precisions = ["fp32", "tf32"] if args.precision == "both" else [args.precision]
    if not args.gpu and "tf32" in precisions:
        precisions = ["fp32"]  # the CPU has no TF32
    dump = tempfile.mkdtemp(prefix="pmap-jax-")
    rc, rows, meta = 0, [], {}
    try:
        for prec in precisions:
            args.precision_now = prec
            r, prec_rows, meta = compare(args, cores, devices, configs, names, dump)
            rc |= r
            rows += prec_rows
    finally:
        shutil.rmtree(dump, ignore_errors=True)
    if args.out:
        write_out(args.out, meta, configs, names, rows)
    print(json.dumps({"jax": meta.get("jax"), "cores": len(cores), "gpu": args.gpu,
                      "rows": rows}))
    return rc


def write_out(out, meta, configs, names, rows):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "jax_compare.json"), "w") as f:
        json.dump(dict(meta, rows=rows), f, indent=1)
    with open(os.path.join(out, "jax_compare.csv"), "w") as f:
        f.write("model,devices,precision,cores,global_batch,pmap_ms,%s,pmap_over_jax,loss_pmap,"
                "loss_jax,loss_diff,ok\n" % ",".join(names[c] for c in configs))
        for r in rows:
            f.write("%s,%d,%s,%d,%d,%.6g,%s,%.4g,%.9g,%.9g,%.3g,%d\n" % (
                r["model"], r["devices"], r["precision"], r["cores"], r["global_batch"],
                r["pmap_median_ms"],
                ",".join("%.6g" % r["jax_median_ms"][names[c]] for c in configs),
                r["pmap_over_jax_throughput"], r["loss_pmap"], r["loss_jax"], r["loss_diff"],
                r["ok"]))


def compare(args, cores, devices, configs, names, dump):
    pm, jx, flags, plan, jax_version = {}, {c: {} for c in configs}, {}, None, "?"
    # On the GPU the host only feeds the devices: both sides get every core.
    budget = {n: cores if args.gpu else cores[:min(n, len(cores))] for n in devices}
    for r in range(args.repeat):
        for n in devices:
            res = run_pmap(args, n, budget[n], dump if plan is None else None)
            if plan is None:
                plan = {"dump": dump, "models": [
                    {"model": m["model"], "steps": m["steps"], "warmup": m["warmup"],
                     "rounds": m["rounds"]} for m in res["models"]]}
                gemm, conv = res["gemm"], res.get("conv", "im2col")
            for row in res["rows"]:
                pm.setdefault((row["model"], n), []).append(row)
            for c in configs:
                out, flags[c] = run_jax(args, plan, n, budget[n], c)
                jax_version = out["jax"]
                for row in out["rows"]:
                    jx[c].setdefault((row["model"], n), []).append(row)

    prec = args.precision_now
    print("pmap against JAX %s (jax.pmap + lax.pmean) on %s; N devices run on %s cores (%s) "
          "on both sides; medians of %d turns"
          % (jax_version, "the GPU" if args.gpu else "CPU",
             ("all %d" if args.gpu else "min(N, %d)") % len(cores), ",".join(map(str, cores)),
             args.repeat))
    if prec == "bf16":
        print("  bf16 on both sides: pmap's bf16 policy (--precision bf16), JAX's matmuls and "
              "convolutions on bfloat16 operands with float32 results")
    elif args.gpu:
        print("  GEMM precision %s on both sides: pmap PMAP_CUDA_TF32=%s, JAX "
              "JAX_DEFAULT_MATMUL_PRECISION=%s" % (prec, PRECISIONS[prec]["PMAP_CUDA_TF32"],
                                                    PRECISIONS[prec]["JAX_DEFAULT_MATMUL_PRECISION"]))
        print("  pmap: CUDA backend, one worker thread per device")
    else:
        print("  pmap: one worker thread per device, its GEMM (%s) and convolutions (%s) "
              "single-threaded" % (gemm, conv))
    for c in configs:
        print("  %s: XLA_FLAGS=%s" % (names[c], flags[c].replace("=%d" % devices[-1], "=N")))
    print("  same initial parameters and data (pmap-bench --dump), same optimizer and steps; "
          "step-0 losses held to the bound of one pass, final losses to that of their steps "
          "within the first %d (relative difference, floor 1e-3; python/tests/bounds.py)"
          % CHECKED_STEPS)
    hdr = "%-10s %4s %5s %6s %10s" % ("model", "dev", "cores", "batch", "pmap_ms")
    for c in configs:
        hdr += " %19s" % (names[c] + " ms")
    hdr += " %9s %13s %8s %12s %12s %9s %9s %9s %9s %4s" % (
        "pmap/JAX", "turns", "speedup", "loss_pmap", "loss_jax", "loss0_diff", "bound",
        "loss_diff", "bound", "ok")
    print(hdr)
    rows, failed = [], False
    models = [m["model"] for m in plan["models"]]
    for model in models:
        for n in devices:
            p_ms = statistics.median(row["median_ms"] for row in pm[(model, n)])
            j_ms = {c: statistics.median(row["median_ms"] for row in jx[c][(model, n)])
                    for c in configs}
            best = min(j_ms.values())
            # The same ratio turn by turn (pmap and JAX of one turn ran back to back): its
            # spread says how far the machine's noise moves the median.
            turns = [min(jx[c][(model, n)][t]["median_ms"] for c in configs)
                     / pm[(model, n)][t]["median_ms"] for t in range(len(pm[(model, n)]))]
            pl, jl = pm[(model, n)][-1], jx[configs[0]][(model, n)][-1]
            same_steps = jl["total_steps"] == pl["total_steps"]
            d0, d = loss_diff(jl["loss0"], pl["loss0"]), loss_diff(jl["loss"], pl["loss"])
            b0 = loss_bound(model, prec, pl["global_batch"], 1)
            b = loss_bound(model, prec, pl["global_batch"], pl["total_steps"])
            held = pl["total_steps"] <= CHECKED_STEPS
            ok = (same_steps and b0 is not None and d0 <= b0
                  and (not held or d <= b))
            failed |= not ok
            p1 = statistics.median(row["median_ms"] for row in pm[(model, devices[0])])
            line = "%-10s %4d %5d %6d %10.4g" % (model, n, len(budget[n]), pl["global_batch"], p_ms)
            for c in configs:
                line += " %19.4g" % j_ms[c]
            # pmap/JAX: throughput ratio against the faster JAX setting (> 1: pmap is faster).
            line += " %8.2fx %13s %8.3f %12.6g %12.6g %9.2g %9.2g %9.2g %9s %4s" % (
                best / p_ms, "%.2f-%.2f" % (min(turns), max(turns)), p1 / p_ms * devices[0],
                pl["loss"], jl["loss"], d0, b0 if b0 is not None else float("nan"), d,
                ("%.2g" if held else "(%.2g)") % (b if b is not None else float("nan")),
                "yes" if ok else "NO")
            print(line)
            rows.append({"model": model, "devices": n, "precision": prec, "cores": len(budget[n]),
                         "global_batch": pl["global_batch"], "pmap_median_ms": p_ms,
                         "jax_median_ms": {names[c]: j_ms[c] for c in configs},
                         "pmap_over_jax_throughput": best / p_ms,
                         "pmap_over_jax_per_turn": turns,
                         "pmap_median_ms_per_turn": [row["median_ms"] for row in pm[(model, n)]],
                         "loss_pmap": pl["loss"],
                         "loss_jax": jl["loss"], "loss0_pmap": pl["loss0"],
                         "loss0_jax": jl["loss0"], "total_steps": pl["total_steps"],
                         "loss0_diff": d0, "loss0_bound": b0, "loss_diff": d, "loss_bound": b,
                         "loss_held": held, "ok": ok})
    print("pmap/JAX = JAX step time (faster setting) / pmap step time, medians over the turns: "
          "above 1, pmap is faster; turns: the lowest and highest ratio of a single turn; "
          "speedup: pmap's own against %d device(s); a bound in parentheses is reported, not "
          "held (past the first %d steps)." % (devices[0], CHECKED_STEPS))
    meta = {"jax": jax_version, "cores": cores, "xla_flags": list(flags.values()),
            "repeat": args.repeat}
    return (1 if failed else 0), rows, meta


if __name__ == "__main__":
    sys.exit(main() or 0)
