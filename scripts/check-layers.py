#!/usr/bin/env python3
"""check-layers.py: the house's rules, checked on the sources and the built objects.

Rooms, bottom to top: base/ < ops/ and runtime/ (siblings) < models/ < tools/, bench/, examples/.
A file may include or call files of its own room and of the rooms below it (include/pmap.h is
everyone's); ops/ and runtime/ never include or call each other, models/ reaches the runtime
only through runtime/runtime.h and the ops only through ops/'s own files (ops/ops.h, never a
backend's: ops/cpu/, ops/cuda/). The files are those of the work tree: what git tracks and the
untracked files it does not ignore (outside a git checkout, every file under the rooms). Nodes
are files (a header is a file of its own: a .c that includes its header and a header that
declares what several .c files define make no cycle by that alone). Edges are #include "..."
lines and calls (from the objects of a build: an undefined symbol of one object defined by
another). Prints every arrow that breaks a rule and every cycle of files (strongly connected
components of more than one module); exits 1 on a broken rule or on more cycles than
--max-cycles (default: the one of today, the runtime's core).

    scripts/check-layers.py [--build DIR] [--max-cycles N] [--explain]
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB_DIRS = ("base", "runtime", "ops", "models")


def room(path):
    top = path.split("/")[0]
    if top in ("base", "runtime", "ops", "models"):
        return top
    if top == "include":
        return "include"
    return "program"


RANK = {"include": -1, "base": 0, "runtime": 1, "ops": 1, "models": 2, "program": 3}


def module(path):
    return path


def sources():
    """The rooms' source files as the work tree has them: tracked, or new and not ignored."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                              "--"] + list(LIB_DIRS), cwd=ROOT, capture_output=True, check=True)
        names = out.stdout.decode("utf-8", "surrogateescape").split("\0")
    except (OSError, subprocess.CalledProcessError):  # no git, or not a checkout
        names = [os.path.relpath(os.path.join(d, n), ROOT)
                 for top in LIB_DIRS for d, _, ns in os.walk(os.path.join(ROOT, top)) for n in ns]
    return sorted({f for f in names if f.split("/")[0] in LIB_DIRS
                   and f.endswith((".c", ".h", ".cu", ".cuh"))
                   and os.path.isfile(os.path.join(ROOT, f))})  # a deleted file is gone


def includes(files):
    edges = set()
    known = set(files)
    pat = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
    for f in files:
        with open(os.path.join(ROOT, f), encoding="utf-8", errors="replace") as fh:
            for line in fh:
                m = pat.match(line)
                if not m:
                    continue
                inc = m.group(1)
                for cand in (os.path.normpath(os.path.join(os.path.dirname(f), inc)), inc):
                    if cand in known:
                        edges.add((f, cand, "include"))
                        break
    return edges


def calls(build):
    """Edges from the objects of a build: object -> object defining a symbol it uses."""
    objs = []
    for dirpath, _, names in os.walk(build):
        if ".p" not in os.path.basename(dirpath):
            continue
        if not os.path.basename(dirpath).startswith(("libpmap", "pmap-cuda", "pmap-mpi")):
            continue
        objs += [os.path.join(dirpath, n) for n in names if n.endswith(".o")]
    defined, undefined, where = {}, {}, {}
    for o in objs:
        src = object_source(os.path.basename(o))
        if not src:
            continue
        where[o] = src
        out = subprocess.run(["nm", o], capture_output=True, text=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == "U":
                undefined.setdefault(o, set()).add(parts[1])
            elif len(parts) == 3 and parts[1] in "TDBR":
                defined.setdefault(parts[2], src)
    edges = set()
    for o, syms in undefined.items():
        for s in syms:
            d = defined.get(s)
            if d and d != where[o]:
                edges.add((where[o], d, "call"))
    return edges


def object_source(name):
    """meson names objects after their sources: models_step.c.o, ops_cuda_act.cu.o or act.o."""
    stem = name[:-2]
    for ext in (".c", ".cu"):
        if stem.endswith(ext):
            flat = stem
            for cand in candidates(flat):
                if os.path.exists(os.path.join(ROOT, cand)):
                    return cand
    # nvcc objects of ops/cuda: act.o
    cand = "ops/cuda/" + stem + ".cu"
    return cand if os.path.exists(os.path.join(ROOT, cand)) else None


def candidates(flat):
    """models_layers_dense.c -> models/layers/dense.c and the other splits of '_'."""
    parts = flat.split("_")
    out = []
    def rec(i, acc):
        if i == len(parts):
            out.append(acc)
            return
        rec(i + 1, acc + "/" + parts[i] if acc else parts[i])
        if acc:
            rec(i + 1, acc + "_" + parts[i])
    rec(0, "")
    return out


def why_not(a, b, kind):
    """None when a may reach b by this kind of edge, else the rule it breaks."""
    ra, rb = room(a), room(b)
    if rb == "include" or ra == rb:
        return None
    if {ra, rb} == {"ops", "runtime"}:
        return "ops/ and runtime/ never reach each other"
    if RANK[rb] > RANK[ra]:
        return f"{ra}/ may not reach {rb}/ above it"
    if ra == "models" and rb == "runtime" and kind == "include" and b != "runtime/runtime.h":
        return "models/ includes the runtime through runtime/runtime.h alone"
    if ra == "models" and rb == "ops" and b.count("/") > 1:
        return "models/ reaches the ops through ops/ops.h, never a backend's own files"
    return None


def sccs(nodes, adj):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in adj.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--max-cycles", type=int, default=1)
    ap.add_argument("--explain", action="store_true", help="print the arrows inside each cycle")
    args = ap.parse_args()
    files = sources()
    edges = includes(files)
    if os.path.isdir(args.build):
        edges |= calls(args.build)
    else:
        print(f"check-layers: no build at {args.build}: includes only")
    bad = sorted((a, b, k) for a, b, k in edges if why_not(a, b, k))
    for a, b, k in bad:
        print(f"check-layers: {a} -> {b} ({k}): {why_not(a, b, k)}")
    adj, nodes = {}, set()
    for a, b, _ in edges:
        ma, mb = module(a), module(b)
        nodes |= {ma, mb}
        if ma != mb:
            adj.setdefault(ma, set()).add(mb)
    cycles = sccs(nodes, adj)
    for c in cycles:
        print("check-layers: cycle: " + " <-> ".join(c))
        if args.explain:
            inside = set(c)
            for a, b, k in sorted(edges):
                if module(a) in inside and module(b) in inside and module(a) != module(b):
                    print(f"    {a} -> {b} ({k})")
    n_inc = sum(1 for e in edges if e[2] == "include")
    n_call = len(edges) - n_inc
    print(f"check-layers: {len(files)} files, {n_inc} includes, {n_call} calls between files: "
          f"{len(bad)} arrows against the rules, {len(cycles)} cycles (at most {args.max_cycles})")
    return 1 if bad or len(cycles) > args.max_cycles else 0


if __name__ == "__main__":
    sys.exit(main())
