#!/usr/bin/env python3
"""test_check_layers.py: scripts/check-layers.py on small trees made in a temporary folder, one
per rule: a clean tree passes; a new file git does not track yet, a tree outside git, models/
including or calling a backend's own ops (ops/cpu/, ops/cuda/), and a second cycle of files each
fail, naming the arrow; a deleted or ignored file is not read. Each tree gets its own copy of
the script, which checks the tree it lies in.

    tests/test_check_layers.py scripts/check-layers.py
"""
import os
import shutil
import subprocess
import sys
import tempfile

SCRIPT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                         os.path.join(os.path.dirname(__file__), "..", "scripts",
                                      "check-layers.py"))
failures = 0

# Files of a tree that keeps every rule: each room includes what it may.
CLEAN = {
    "include/pmap.h": "",
    "base/error.h": "",
    "runtime/runtime.h": '#include "base/error.h"\n',
    "runtime/ctx.c": '#include "runtime.h"\n',
    "ops/ops.h": '#include "base/error.h"\n',
    "ops/op_math.h": "",
    "ops/cpu/cpu_ops.h": '#include "ops/ops.h"\n',
    "ops/cpu/kernels.c": '#include "cpu_ops.h"\nvoid cpu_kernel(void);\nvoid cpu_kernel(void) {}\n',
    "ops/cuda/cuda_common.cuh": "",
    "models/model.h": '#include "ops/ops.h"\n#include "runtime/runtime.h"\n',
    "models/model.c": '#include "model.h"\n#include "ops/op_math.h"\n#include "pmap.h"\n',
}


def tree(files, git=True, ignore=""):
    root = tempfile.mkdtemp(prefix="check-layers-")
    for path, text in files.items():
        os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
        with open(os.path.join(root, path), "w") as f:
            f.write(text)
    os.makedirs(os.path.join(root, "scripts"))
    shutil.copy(SCRIPT, os.path.join(root, "scripts", "check-layers.py"))
    if ignore:
        with open(os.path.join(root, ".gitignore"), "w") as f:
            f.write(ignore)
    if git:
        subprocess.run(["git", "init", "-q"], cwd=root, check=True)
        subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    return root


def add(root, path, text):
    os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
    with open(os.path.join(root, path), "w") as f:
        f.write(text)


def run(root, *args):
    p = subprocess.run([sys.executable, os.path.join(root, "scripts", "check-layers.py"),
                        "--build", os.path.join(root, "build")] + list(args),
                       capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def expect(what, root, rc, needles, *args):
    global failures
    got, out = run(root, *args)
    missing = [n for n in needles if n not in out]
    if got != rc or missing:
        failures += 1
        print(f"FAIL {what}: exit {got} (want {rc}), missing {missing}; output:\n{out}")
    else:
        print(f"ok   {what}")
    shutil.rmtree(root, ignore_errors=True)


def objects(root, sources):
    """Objects as meson names them (models_model.c.o in libpmap.so.p) for the call edges."""
    obj = os.path.join(root, "build", "libpmap.so.p")
    os.makedirs(obj)
    for src in sources:
        name = src.replace("/", "_") + ".o"
        subprocess.run(["cc", "-c", "-I" + root, os.path.join(root, src), "-o",
                        os.path.join(obj, name)], check=True)


def main():
    if not shutil.which("git"):
        print("test_check_layers: no git on PATH")
        return 77
    expect("a clean tree passes", tree(CLEAN), 0, ["0 arrows against the rules, 0 cycles"])

    root = tree(CLEAN)
    add(root, "base/new.c", '#include "models/model.h"\n')  # written, not yet added to git
    expect("an untracked file is read", root, 1,
           ["base/new.c -> models/model.h (include): base/ may not reach models/ above it"])

    root = tree(CLEAN, ignore="/base/generated.c\n")
    add(root, "base/generated.c", '#include "models/model.h"\n')
    expect("an ignored file is not", root, 0, ["0 arrows against the rules"])

    root = tree(dict(CLEAN, **{"base/gone.h": ""}))
    os.remove(os.path.join(root, "base/gone.h"))  # tracked, deleted from the work tree
    expect("a deleted file is not read", root, 0, ["0 arrows against the rules"])

    root = tree(dict(CLEAN, **{"base/new.c": '#include "models/model.h"\n'}), git=False)
    expect("a tree outside git is walked", root, 1, ["base/new.c -> models/model.h (include)"])

    root = tree(dict(CLEAN, **{
        "models/step.c": '#include "model.h"\n#include "ops/cpu/cpu_ops.h"\n',
        "models/layers/conv.c": '#include "ops/cuda/cuda_common.cuh"\n'}))
    expect("models/ including a backend's ops header fails", root, 1, [
        "models/step.c -> ops/cpu/cpu_ops.h (include): models/ reaches the ops through ops/ops.h",
        "models/layers/conv.c -> ops/cuda/cuda_common.cuh (include)",
        "2 arrows against the rules"])

    if shutil.which("cc"):
        root = tree(dict(CLEAN, **{
            "models/model.c": "void cpu_kernel(void);\nvoid model_run(void);\n"
                              "void model_run(void) { cpu_kernel(); }\n"}))
        objects(root, ["models/model.c", "ops/cpu/kernels.c"])
        expect("models/ calling a backend's kernel fails", root, 1,
               ["models/model.c -> ops/cpu/kernels.c (call): models/ reaches the ops through"])
    else:
        print("test_check_layers: no cc on PATH: the call edges are not tried")

    one = {"runtime/a.h": '#include "b.h"\n', "runtime/b.h": '#include "a.h"\n'}
    two = dict(one, **{"runtime/c.h": '#include "d.h"\n', "runtime/d.h": '#include "c.h"\n'})
    expect("one cycle is today's count", tree(dict(CLEAN, **one)), 0,
           ["check-layers: cycle: runtime/a.h <-> runtime/b.h", "1 cycles (at most 1)"])
    expect("a second cycle fails", tree(dict(CLEAN, **two)), 1,
           ["check-layers: cycle: runtime/c.h <-> runtime/d.h", "2 cycles (at most 1)"])
    expect("--max-cycles raises the limit", tree(dict(CLEAN, **two)), 0, ["2 cycles (at most 2)"],
           "--max-cycles", "2")
    print(f"test_check_layers: {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
