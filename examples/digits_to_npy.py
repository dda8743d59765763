#!/usr/bin/env python3
"""Writes scikit-learn's 8x8 handwritten digits (1797 images, shipped with the package: no
download) as .npy files for pmap-train: OUT/digits_x.npy, float64 (1797, 64) scaled to [0, 1],
and OUT/digits_y.npy, int64 (1797,) labels 0..9."""
import os
import sys

import numpy as np
from sklearn.datasets import load_digits


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    digits = load_digits()
    x = np.ascontiguousarray(digits.data / 16.0, dtype=np.float64)
    y = np.ascontiguousarray(digits.target, dtype=np.int64)
    np.save(os.path.join(out, "digits_x.npy"), x)
    np.save(os.path.join(out, "digits_y.npy"), y)
    print(f"wrote {out}/digits_x.npy {x.shape} {x.dtype} and {out}/digits_y.npy {y.shape} {y.dtype}")


if __name__ == "__main__":
    main()
