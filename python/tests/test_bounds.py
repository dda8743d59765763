"""bounds.py, the Python tests' copy of tests/bounds.h: its constants and model table equal the
header's, and its functions give the numbers their formulas give when worked out by hand
(docs/tolerances.md)."""
import pathlib
import re

import pytest

import bounds

HEADER = pathlib.Path(__file__).resolve().parents[2] / "tests" / "bounds.h"


def header_text():
    if not HEADER.is_file():
        pytest.skip(f"{HEADER} is not here (an installed package's tests)")
    return re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.S)


def test_constants_are_the_headers():
    text = header_text()
    defs = dict(re.findall(r"#define (BOUND_\w+) (\S+)", text))
    assert float.fromhex(defs["BOUND_U32"]) == bounds.BOUND_U32 == 2.0 ** -24
    assert float.fromhex(defs["BOUND_U16"]) == bounds.BOUND_U16 == 2.0 ** -8
    assert float(defs["BOUND_LAMBDA"]) == bounds.BOUND_LAMBDA == 6.0


def test_model_table_is_the_headers():
    text = header_text()
    body = re.search(r"bound_models\[\] = \{(.*?)\};", text, re.S).group(1)
    # The initialisers are string literals and integer arithmetic: Python's syntax as well.
    rows = eval("(" + body.replace("{", "(").replace("}", ")") + ")", {"__builtins__": {}})
    assert [tuple(r) for r in rows] == [tuple(m) for m in bounds.BOUND_MODELS]
    assert bounds.bound_model_of("cifar-cnn") is bounds.BOUND_MODELS[4]
    assert bounds.bound_model_of("no-such-model") is None


def test_values_worked_out_by_hand():
    u = 2.0 ** -24
    # linear (k_path 2, k_batch 1, kappa 10), 24 rows, 20 steps:
    # 6 * 10 * u * sqrt((2 + 24) * 20) = 3.5762787e-6 * sqrt(520) = 3.5762787e-6 * 22.803509
    assert bounds.bound_order32(bounds.bound_model_of("linear"), 24, 20) == \
        pytest.approx(8.155170e-5, rel=1e-6)
    # mlp (k_path 139, k_batch 3, r_act 5, k_round 32, kappa 10), 24 rows, 100 steps:
    # float part 6 * 10 * u * sqrt((139 + 72) * 100) = 3.5762787e-6 * 145.25839 = 5.194832e-4;
    # p = 2 u sqrt(32) / v = 11.313708 / 65536 = 1.7263349e-4;
    # bf16 part 6 * 10 * v * sqrt(p * 5 * 100 / 24) = 0.234375 * sqrt(3.5965311e-3)
    #   = 0.234375 * 0.059971086 = 1.4055724e-2
    assert bounds.bound_order16(bounds.bound_model_of("mlp"), 24, 100) == \
        pytest.approx(5.194832e-4 + 1.4055724e-2, rel=1e-6)
    # gpt-mini (k_path 4 * 3264 + 896 = 13952, k_batch 64 * 30 = 1920, r_all 83, kappa 4,
    # tokens 64), 32 rows, 30 steps:
    # float part 6 * 4 * u * sqrt((13952 + 61440) * 30) = 1.4305115e-6 * 1503.9149 = 2.151368e-3;
    # bf16 part 6 * 4 * v * sqrt(83 * 30 / (32 * 64)) = 0.09375 * 1.1026424 = 0.10337272
    assert bounds.bound_prec16(bounds.bound_model_of("gpt-mini"), 32, 30) == \
        pytest.approx(2.151368e-3 + 0.10337272, rel=1e-6)
    # 6 u sqrt(1024) = 192 / 2^24, exactly; below one term, one term's
    assert bounds.bound_sum(1024) == 192 * u
    assert bounds.bound_sum(0.5) == bounds.bound_sum(1) == 6 * u
