#!/usr/bin/env python3
# gpu_check_figures.py: the key figures of a bench/gpu-check.sh run as Markdown, read from its
# summary.json (each step's last JSON line): the step's fast paths (pmap-step), the all-reduce
# table (pmap-allreduce) and the JAX comparison, each labelled with what it measures.
import json
import sys


def rows_of(step):
    out = step.get("output") if step else None
    return out.get("rows", []) if isinstance(out, dict) else []


def fmt(v, spec="%.4g"):
    return spec % v if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def table(header, rows):
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(fmt(c) for c in r) + " |")


def cut_short(steps, names):
    """The steps whose program was ended before its last row (pmap-step's "complete": false)."""
    out = []
    for n in names:
        o = (steps.get(n) or {}).get("output")
        if isinstance(o, dict) and o.get("complete") is False:
            out.append(n)
    return out


def fast_paths(steps):
    names = ("step-mlp-1024", "step-mlp", "step-gpt-mini")
    rows = [r for n in names for r in rows_of(steps.get(n))]
    if not rows:
        return
    print("\n## The step's variants (pmap-step, the same batches; mlp-1024 with 4 gradient "
          "buckets of 32 KiB)\n")
    short = cut_short(steps, names)
    if short:
        print("Cut short (the rows measured before the program was ended): %s.\n"
              % ", ".join(short))
    print("host us: wall time of one pmap_update call, numeric guard off and no loss read back; "
          "it includes waiting for NCCL, whose non-blocking communicators launch each collective "
          "from a thread of their own. thread CPU us: the calling thread's CPU time per step "
          "(device 0's work alone). process CPU us: every thread's, NCCL's included.\n")
    plain = {(r.get("model"), r.get("devices")): r for r in rows if r.get("variant") == "plain"}
    lines = []
    for r in rows:
        p = plain.get((r.get("model"), r.get("devices")), {})
        speed = p.get("step_ms") / r["step_ms"] if p.get("step_ms") and r.get("step_ms") else ""
        lines.append([r.get("model"), r.get("devices"), r.get("variant"), r.get("step_ms"), speed,
                      r.get("host_us"), r.get("thread_cpu_us", ""), r.get("cpu_us"),
                      r.get("max_abs_diff"), r.get("rel_l2_diff")])
    table(["model", "devices", "variant", "step ms", "speedup vs plain", "host us",
           "thread CPU us", "process CPU us", "max abs diff vs plain", "rel L2 diff"], lines)


def allreduce(steps, gpus):
    rows = rows_of(steps.get("allreduce"))
    if not rows:
        return
    largest = {}
    for r in rows:
        if r.get("bytes", 0) >= largest.get(r.get("devices"), {}).get("bytes", -1):
            largest[r.get("devices")] = r
    shared = any(isinstance(d, int) and d > gpus for d in largest)
    where = ("copying within one GPU's memory (every logical device on the same GPU): not the "
             "bandwidth of a link between GPUs" if shared and gpus <= 1 else
             "several logical devices per GPU: partly copies within a GPU" if shared else
             "between GPUs")
    print("\n## All-reduce (pmap-allreduce, largest size per device count)\n")
    print("busbw = algbw x 2(n-1)/n, nccl-tests' definition. Here it is %s.\n" % where)
    label = "busbw GB/s (%s)" % ("within one GPU" if shared and gpus <= 1 else "bus")
    table(["devices", "bytes", "time us (out of place)", label + ", out of place",
           label + ", in place", "wrong"],
          [[r.get("devices"), r.get("bytes"), r.get("oop_time_us"), r.get("oop_busbw"),
            r.get("ip_busbw"), r.get("oop_wrong", 0) + r.get("ip_wrong", 0)]
           for r in largest.values()])


def jax(steps):
    rows = rows_of(steps.get("jax-compare"))
    if not rows:
        return
    print("\n## pmap against JAX's pmap on the GPU (same parameters, data and steps; 1 device: "
          "JAX puts one device on each GPU)\n")
    table(["model", "devices", "precision", "pmap ms", "JAX ms", "pmap/JAX throughput",
           "loss pmap", "loss JAX", "loss diff", "ok"],
          [[r.get("model"), r.get("devices"), r.get("precision"), r.get("pmap_median_ms"),
            min(r.get("jax_median_ms", {"": float("nan")}).values()),
            r.get("pmap_over_jax_throughput"), r.get("loss_pmap"), r.get("loss_jax"),
            r.get("loss_diff"), r.get("ok")] for r in rows])


def main():
    summary = json.load(open(sys.argv[1]))
    steps = {s["name"]: s for s in summary.get("steps", [])}
    gpus = summary.get("gpu", {}).get("count", 0) or 0
    fast_paths(steps)
    allreduce(steps, gpus)
    jax(steps)


if __name__ == "__main__":
    main()
