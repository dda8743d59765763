"""The arithmetic the tests' tolerances are argued from: a copy of tests/bounds.h for the Python
tests and the scripts (docs/tolerances.md gives the argument). The constants, the example models'
counts and the functions are the same as there, line for line; test_bounds.py checks the copy
against tests/bounds.h where the source tree is at hand, and a few values against numbers worked
out by hand. Change the two together.

In short: two float computations of the same mathematics that sum in other orders differ by about
u sqrt(k) of a sum of k terms; a value on one row's path carries every sum it went through
(k_path per row and step, and k_batch per row for the sums over the batch); a bfloat16 rounding
errs by up to v of its value; the loss moves by kappa times the relative change of a value on its
path; steps add their differences as a random walk; bounds stand at lambda = 6 standard
deviations."""
import math
from typing import NamedTuple, Optional

BOUND_U32 = 2.0 ** -24  # float's unit roundoff
BOUND_U16 = 2.0 ** -8  # bfloat16's (8 significant bits)
BOUND_LAMBDA = 6.0


class BoundModel(NamedTuple):
    """One row's path through a model, per training step (forward and backward)."""
    name: str
    k_path: float  # summed lengths of the float reductions on one row's path
    k_batch: float  # summed lengths per row of the reductions over the batch
    r_all: float  # bfloat16 roundings on the path (operands of every GEMM, forward, backward)
    r_act: float  # of them, roundings of computed values (not the input, not a parameter)
    k_round: float  # the longest float reduction whose result is rounded to bfloat16
    kappa: float  # the loss's condition
    tokens: float  # independent loss terms per row


# A GEMM layer of a inputs and b outputs adds a (forward) + b (its input gradient) to k_path and
# 1 to k_batch (its weight gradient sums the rows); a convolution adds c kh kw and oc kh kw, and
# OH OW to k_batch; a batch norm adds 2 H W to k_batch (statistics, their gradients). Under bf16
# a GEMM rounds its input, its weights and its output gradient (r_all 3), of which the input
# (but the first layer's) and the output gradient are computed (r_act 2). The layers of each
# model are in tests/bounds.h.
BOUND_MODELS = (
    BoundModel("linear", 1 + 1, 1, 3, 1, 1, 10, 1),
    BoundModel("mlp", (10 + 32) + (32 + 32) + (32 + 1), 3, 9, 5, 32, 10, 1),
    BoundModel("convnet", (9 + 9) + (1024 + 2), 1024 + 1, 6, 3, 1024, 4, 1),
    BoundModel("mlp-1024", 3 * (1024 + 1024) + (1024 + 10), 4, 12, 7, 1024, 4, 1),
    BoundModel("cifar-cnn", (27 + 144) + (144 + 288) + (288 + 288) + (1568 + 10),
               1024 + 256 + 49 + 1, 12, 7, 1568, 4, 1),
    BoundModel("res-mlp", (10 + 32) + 2 * ((32 + 64) + (64 + 32)) + (32 + 1) + 3 * 4 * 32,
               6 + 3 * 2, 18, 11, 64, 10, 1),
    BoundModel("cifar-bn", (27 + 144) + (144 + 288) + (2048 + 10),
               1024 + 2 * 1024 + 256 + 2 * 256 + 1, 9, 5, 2048, 4, 1),
    BoundModel("gpt-mini",
               4 * (2 * 4 * 128 + (128 + 384) + 2 * (32 + 64) + (128 + 128) + (128 + 512)
                    + (512 + 128)) + 4 * 128 + (128 + 256),
               64 * (4 * 7 + 2), 4 * 20 + 3, 4 * 16 + 2, 512, 4, 64),
)


def bound_model_of(name: str) -> Optional[BoundModel]:
    for m in BOUND_MODELS:
        if m.name == name:
            return m
    return None


def bound_order32(m: BoundModel, rows: float, steps: float) -> float:
    """Two runs of `steps` steps on batches of `rows` rows (per step, across every device) whose
    float sums differ in order only: the relative difference of the losses or of the
    parameters."""
    return BOUND_LAMBDA * m.kappa * BOUND_U32 * math.sqrt((m.k_path + m.k_batch * rows) * steps)


def bound_order16(m: BoundModel, rows: float, steps: float) -> float:
    """The same for two bf16 runs: the float part, and the bfloat16 roundings the float
    difference moves (each by one bfloat16 step, with probability p)."""
    p = min(1.0, 2.0 * BOUND_U32 * math.sqrt(m.k_round) / BOUND_U16)
    return (bound_order32(m, rows, steps)
            + BOUND_LAMBDA * m.kappa * BOUND_U16 * math.sqrt(p * m.r_act * steps
                                                              / (rows * m.tokens)))


def bound_prec16(m: BoundModel, rows: float, steps: float) -> float:
    """bf16 against fp32: every bfloat16 rounding on the path differs, by up to v."""
    return (bound_order32(m, rows, steps)
            + BOUND_LAMBDA * m.kappa * BOUND_U16 * math.sqrt(m.r_all * steps / (rows * m.tokens)))


def bound_sum(k: float) -> float:
    """One float dot product or sum of k terms of random sign, in two orders (or against the
    exact value), relative to its size (the root mean square over many such sums)."""
    return BOUND_LAMBDA * BOUND_U32 * math.sqrt(k if k > 1 else 1)
