"""Ctrl-C during training: interrupt_storm.py's storm of SIGINTs at a child that trains through
this same pmap (the meson test python-interrupts runs it at full size, under the sanitizers too),
and the package's own lock, which no interrupt may leave held."""
import os
import subprocess
import sys
import threading

import pmap

HERE = os.path.dirname(os.path.abspath(__file__))


def test_a_storm_of_interrupts_leaves_params_usable_and_equal_to_an_uninterrupted_run():
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(pmap.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])
    r = subprocess.run([sys.executable, os.path.join(HERE, "interrupt_storm.py"),
                        "--interrupts", "90", "--width", "64", "--seconds", "60"], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=400)
    assert r.returncode == 0, r.stdout
    assert "\nok\n" in r.stdout


def test_the_lock_is_released_whatever_raises_inside_a_call():
    model = pmap.Model(input_shape=(1,))
    h = model._handle
    for _ in range(3):
        try:
            with h.hold("test"):
                raise KeyboardInterrupt
        except KeyboardInterrupt:
            pass
        assert not h._lock._is_owned()
    seen = []
    t = threading.Thread(target=lambda: seen.append(h.busy()))
    with h.hold("test"):
        t.start()
        t.join()
    assert seen == [True] and not h.busy()
