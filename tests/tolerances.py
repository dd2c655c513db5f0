"""Float tolerances of the tests, each derived from what rounds and how often.

u = 2**-24 is float32's unit roundoff. A float32 sum of K terms has a relative error of
about sqrt(K) * u when the roundings are independent (the probabilistic bound of Higham and
Mary, SIAM J. Sci. Comput. 41(5), 2019), not the worst case K * u that almost never occurs.
"""
from __future__ import annotations

import math

from bapipe.zoo import get

#: float32 unit roundoff (half an ULP of 1.0)
U32 = 2.0 ** -24


def largest_reduction(model_name: str, batch: int) -> int:
    """The longest float32 sum in one training step of ``model_name`` on ``batch`` samples:
    a weight gradient sums batch x output pixels terms, an input gradient or a forward
    output sums fan-out or fan-in terms."""
    k = batch
    for l in get(model_name).layers:
        if not l.params:
            continue
        pixels = math.prod(l.out_shape[1:]) if len(l.out_shape) == 3 else 1
        fan_in = max(1, l.fwd_macs // max(1, l.out_elems))
        fan_out = max(1, l.fwd_macs // max(1, l.in_elems))
        k = max(k, batch * pixels, fan_in, fan_out)
    return k


def grad_tolerance(model_name: str, batch: int) -> float:
    """Norm-wise relative error a float32 pipeline's gradients may carry against the float64
    single-device reference (host.driver.grad_rel_err): every layer of the backward pass
    rounds sums of at most K terms (about sqrt(K) * u each) and the gradient of the first
    layer has passed through all L layers, so the errors add up to L * sqrt(K) * u."""
    layers = len(get(model_name).layers)
    return layers * math.sqrt(largest_reduction(model_name, batch)) * U32


#: float64 unit roundoff (half an ULP of 1.0)
U64 = 2.0 ** -53

#: plan.yaml writes floats with 12 significant digits (bapipe.plan, f"{x:.12g}"): a value read
#: back is within half a unit of the 12th digit, a relative 5e-12; 1e-11 leaves room for the
#: float64 rounding of the reading and of what is computed from it.
PLAN_DIGITS = 1e-11


def f64_sum(n: int) -> float:
    """Relative error bound of a float64 sum (or a chain of products and quotients) of n terms
    of one sign, each rounded once: the worst case n * u (Higham, Accuracy and Stability of
    Numerical Algorithms, 2002, section 4.2), which needs no independence assumption."""
    return max(1, n) * U64

