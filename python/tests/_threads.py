"""The library's threads in this process, counted by their names (pmap-dev<i>, pmap-...).

Counting every task of the process would count the thread pools of numpy and of the GEMM
library too, which start and stop threads of their own (OpenBLAS stops its pool at a fork).
"""

import gc
import os
import time


def library_threads():
    n = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                n += f.read().startswith("pmap-")
        except OSError:  # it ended while listed
            pass
    return n


def library_threads_after_close(expected, seconds=5.0):
    """The count once it is `expected`, or at the deadline: a joined thread can stay listed in
    /proc a moment after pthread_join returned (the kernel reaps it after waking the joiner)."""
    deadline = time.monotonic() + seconds
    n = library_threads()
    while n != expected and time.monotonic() < deadline:
        time.sleep(0.01)
        n = library_threads()
    return n


def no_library_threads():
    """Closes what earlier tests left to the garbage collector; True when none of the library's
    threads are left."""
    gc.collect()
    return library_threads_after_close(0) == 0
