#!/usr/bin/env python3
"""precision_curves.py: the README's precision table. Trains every example model (and gpt-mini
on a text) with pmap-train under fp32 and bf16, on 1 and on 2 devices, from the same initial
parameters and data, and compares the loss curves: the mean loss of each tenth of the steps,
bf16 against fp32 (the largest relative difference over the tenths, and the last tenth's), bf16
on 2 devices against 1, and fp32 on 2 devices against 1: the difference that the order of the
sums alone makes, against which bf16's is to be read. With --text, the held-out loss after the
run too, over --seeds, bf16 and fp32 on 2 devices against fp32 on 1.

  bench/precision_curves.py [--train build/tools/pmap-train] [--steps 300] [--models a,b]
                            [--text FILE] [--seeds 0,1,2] [--json OUT]
"""
import argparse
import json
import re
import subprocess
import sys

MODELS = "linear,mlp,convnet,mlp-1024,cifar-cnn,res-mlp,cifar-bn,gpt-mini"
STEP = re.compile(r"^step\s+(\d+)\s+loss\s+(\S+)")


def run(train, args):
    """pmap-train ARGS --log-every 1 --json: (every step's loss, the final JSON)."""
    out = subprocess.run([train, "--backend", "cpu", "--log-every", "1", "--json"] + args,
                         check=True, capture_output=True, text=True).stdout
    losses = [float(m.group(2)) for m in map(STEP.match, out.splitlines()) if m]
    return losses, json.loads(out.splitlines()[-1])


def tenths(a, b):
    """The largest relative difference of the tenths' mean losses of a against b, and the last's."""
    n = min(len(a), len(b))
    w = max(n // 10, 1)
    diffs = []
    for s in range(0, n - w + 1, w):
        ma, mb = sum(a[s:s + w]) / w, sum(b[s:s + w]) / w
        diffs.append(abs(ma - mb) / abs(mb))
    return max(diffs), diffs[-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", default="build/tools/pmap-train")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--models", default=MODELS)
    ap.add_argument("--text", default=None)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--json", default=None)
    o = ap.parse_args()
    rows = []
    print(f"{'model':10} {'steps':>5}  {'fp32 last':>10} {'bf16 last':>10} {'curve':>9} "
          f"{'last':>9} {'2 dev':>9} {'fp32 2dev':>9}")
    for model in o.models.split(","):
        common = ["--model", model, "--steps", str(o.steps)]
        f32, _ = run(o.train, common + ["--devices", "1"])
        b16, _ = run(o.train, common + ["--devices", "1", "--precision", "bf16"])
        b16x2, _ = run(o.train, common + ["--devices", "2", "--precision", "bf16"])
        f32x2, _ = run(o.train, common + ["--devices", "2"])
        curve, last = tenths(b16, f32)
        dev, _ = tenths(b16x2, b16)
        noise, _ = tenths(f32x2, f32)
        w = max(len(f32) // 10, 1)
        r = {"model": model, "steps": o.steps, "fp32_last": sum(f32[-w:]) / w,
             "bf16_last": sum(b16[-w:]) / w, "curve": curve, "last": last, "devices": dev,
             "fp32_devices": noise}
        rows.append(r)
        print(f"{model:10} {o.steps:5}  {r['fp32_last']:10.4g} {r['bf16_last']:10.4g} "
              f"{curve:9.2e} {last:9.2e} {dev:9.2e} {noise:9.2e}", flush=True)
    if o.text:
        print(f"\n--text {o.text}, {o.steps} steps: held-out loss (nats per byte), and the mean "
              "training loss of the last tenth, against fp32 on 1 device")
        for seed in o.seeds.split(","):
            got = {}
            for prec, dev in (("fp32", 1), ("bf16", 1), ("fp32", 2), ("bf16", 2)):
                losses, j = run(o.train, ["--text", o.text, "--steps", str(o.steps), "--seed",
                                          seed, "--devices", str(dev), "--precision", prec])
                w = max(len(losses) // 10, 1)
                got[prec, dev] = (j["eval_loss"], sum(losses[-w:]) / w)
            e32, t32 = got["fp32", 1]
            r = {"text": o.text, "seed": int(seed), "fp32_eval": e32, "fp32_train": t32}
            line = f"seed {seed}: fp32 held out {e32:.4f}, training {t32:.4f};"
            for (prec, dev), (e, t) in got.items():
                if (prec, dev) == ("fp32", 1):
                    continue
                key = f"{prec}_{dev}dev"
                r[key + "_eval"], r[key + "_train"] = e, t
                line += (f" {prec} {dev} dev {100 * (e - e32) / e32:+.2f} % / "
                         f"{100 * (t - t32) / t32:+.2f} %")
            rows.append(r)
            print(line, flush=True)
    if o.json:
        with open(o.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
