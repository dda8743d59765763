"""import pmap and a CPU context load no CUDA, cuBLAS, NCCL or MPI library: those live in the
plugins beside libpmap (libpmap-cuda.so, libpmap-mpi.so), opened only by a context that needs
one. Checked in a fresh interpreter, whose mapped files are its own."""
import subprocess
import sys

PROGRAM = """
import numpy as np, pmap
with pmap.Context(backend="cpu", devices=2) as ctx:
    params = ctx.params(pmap.Model(input_shape=(1,)).dense(1), pmap.sgd(0.1), seed=0)
    x = np.ones((4, 1), np.float32)
    params.update(x, x)
print(open("/proc/self/maps").read())
"""

HEAVY = ("libcudart", "libcublas", "libnccl", "libcuda.so", "libmpi", "libopen-pal")


def test_cpu_process_loads_no_plugin_library():
    out = subprocess.run([sys.executable, "-c", PROGRAM], check=True, capture_output=True,
                         text=True).stdout
    assert "libpmap" in out
    loaded = [lib for lib in HEAVY if lib in out]
    assert loaded == [], f"a CPU process loaded {loaded}"
