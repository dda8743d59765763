#!/usr/bin/env python3
# gpu_check_figures.py: the key figures of a bench/gpu-check.sh run as Markdown, read from its
# summary.json (each step's last JSON line): training, scaling, all-reduce bandwidth, the
# backend's run-time switches against the default, and the JAX comparison.
import json
import sys


def rows_of(step):
    out = step.get("output")
    return out.get("rows", []) if isinstance(out, dict) else []


def fmt(v, spec="%.4g"):
    return spec % v if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def table(header, rows):
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(fmt(c) for c in r) + " |")


def fast_paths(steps):
    """The step's fast paths: pmap-step's rows (each variant against the plain step on the same
    batches), then the sharded optimizer from pmap-bench, its agreement from pmap-train."""
    rows = []
    for name in ("step-mlp", "step-mlp-1024"):
        rows += rows_of(steps.get(name, {}))
    sharded = steps.get("step-sharded")
    if not rows and not sharded:
        return
    print("\n## The step's fast paths (pmap-step: graph, overlap and both against plain; "
          "host us: median time of a pmap_update call, guard off and no loss read back)\n")
    plain = {(r.get("model"), r.get("devices")): r for r in rows if r.get("variant") == "plain"}
    lines = []
    for r in rows:
        p = plain.get((r.get("model"), r.get("devices")), {})
        speed = p.get("step_ms") / r["step_ms"] if p.get("step_ms") and r.get("step_ms") else ""
        lines.append([r.get("model"), r.get("devices"), r.get("variant"), r.get("step_ms"), speed,
                      r.get("host_us"), r.get("cpu_us"), r.get("max_abs_diff"),
                      r.get("rel_l2_diff")])
    if sharded is not None:
        srows = rows_of(sharded)
        for r in srows:
            n = r.get("devices")
            a, b = steps.get("agree-plain-%s" % n, {}), steps.get("agree-sharded-%s" % n, {})
            la = a.get("output", {}).get("final_loss") if isinstance(a.get("output"), dict) else None
            lb = b.get("output", {}).get("final_loss") if isinstance(b.get("output"), dict) else None
            diff = abs(la - lb) if isinstance(la, (int, float)) and isinstance(lb, (int, float)) else "n/a"
            lines.append([r.get("model"), n, "sharded (pmap-bench median)", r.get("median_ms"), "",
                          "", "", "final loss diff %s" % fmt(diff), ""])
        if not srows:
            lines.append(["", "", "sharded", sharded.get("status"), "", "", "",
                          sharded.get("note", ""), ""])
    table(["model", "devices", "variant", "step ms", "speedup vs plain", "host us", "CPU us/step",
           "max abs diff vs plain", "rel L2 diff"], lines)


def main():
    summary = json.load(open(sys.argv[1]))
    steps = {s["name"]: s for s in summary.get("steps", [])}

    train = [s for n, s in steps.items() if n.startswith("train-") and isinstance(s.get("output"), dict)]
    if train:
        print("\n## Training (pmap-train --backend cuda)\n")
        table(["model", "devices", "steps", "final loss", "samples/s", "replicas identical"],
              [[s["output"].get(k) for k in ("model", "devices", "steps", "final_loss",
                                              "samples_per_sec", "replicas_identical")]
               for s in train])

    bench = rows_of(steps.get("bench", {}))
    if bench:
        print("\n## Scaling (pmap-bench; N logical devices on the GPUs listed)\n")
        table(["model", "scaling", "devices", "global batch", "step ms (median)", "p10-p90 ms", "samples/s",
               "speedup", "efficiency", "replicas identical"],
              [[r.get("model"), r.get("scaling"), r.get("devices"), r.get("global_batch"),
                r.get("median_ms"),
                "%s-%s" % (fmt(r.get("p10_ms")), fmt(r.get("p90_ms"))), r.get("samples_per_sec"),
                r.get("speedup"), r.get("efficiency"), r.get("replicas_identical")]
               for r in bench])

    allred = rows_of(steps.get("allreduce", {}))
    if allred:
        print("\n## All-reduce (pmap-allreduce, largest size per device count)\n")
        largest = {}
        for r in allred:
            if r.get("bytes", 0) >= largest.get(r.get("devices"), {}).get("bytes", -1):
                largest[r.get("devices")] = r
        table(["devices", "bytes", "time us (out of place)", "busbw GB/s (out of place)",
               "busbw GB/s (in place)", "wrong"],
              [[r.get("devices"), r.get("bytes"), r.get("oop_time_us"), r.get("oop_busbw"),
                r.get("ip_busbw"), r.get("oop_wrong", 0) + r.get("ip_wrong", 0)]
               for r in largest.values()])

    def key(r):
        return r.get("model"), r.get("scaling"), r.get("devices")

    base = {key(r): r for r in rows_of(steps.get("bench-default", {}))}
    switches = [n for n in steps if n.startswith("bench-") and n != "bench-default"]
    if base and switches:
        print("\n## Run-time switches of the CUDA backend (mlp-1024; ratio > 1: the switch is "
              "slower than the default)\n")
        lines = []
        for n in switches:
            for r in rows_of(steps[n]):
                b = base.get(key(r))
                if b and b.get("median_ms"):
                    lines.append([n[len("bench-"):], r.get("scaling"), r.get("devices"),
                                  b.get("median_ms"),
                                  r.get("median_ms"), r.get("median_ms") / b["median_ms"]])
        table(["switch", "scaling", "devices", "default step ms", "switched step ms", "ratio"],
              lines)

    fast_paths(steps)

    jax = rows_of(steps.get("jax-compare", {}))
    if jax:
        print("\n## pmap against JAX's pmap on the GPU (same parameters, data and steps)\n")
        table(["model", "devices", "precision", "pmap ms", "JAX ms", "pmap/JAX throughput",
               "loss pmap", "loss JAX", "loss diff", "ok"],
              [[r.get("model"), r.get("devices"), r.get("precision"), r.get("pmap_median_ms"),
                min(r.get("jax_median_ms", {"": float("nan")}).values()),
                r.get("pmap_over_jax_throughput"), r.get("loss_pmap"), r.get("loss_jax"),
                r.get("loss_diff"), r.get("ok")] for r in jax])
        if all(r.get("devices") == 1 for r in jax):
            print("\nJAX puts one device on each GPU: with one GPU only 1 device is compared.")


if __name__ == "__main__":
    main()
