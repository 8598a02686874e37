"""Special functions (erfinv, ndtri, the modified Bessel functions I0 and I1, the Kaiser window)
against eager PyTorch, and their accuracy over dense sweeps against float64."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from tests.equivalence import BATCH, assert_batch_dynamic_equivalent, assert_exports_equivalent, op_histogram

INF, NAN = math.inf, math.nan
prims = torch.ops.prims

ERFINV = [torch.erfinv, torch.special.erfinv]
BESSEL = [
    torch.i0, torch.special.i0, torch.special.i0e, torch.special.i1, torch.special.i1e,
    torch.special.modified_bessel_i0, torch.special.modified_bessel_i1,
]
# Eager PyTorch computes these in float16 and bfloat16 (in float32, rounded); ndtri and the
# modified_bessel functions have no half-precision CPU kernels.
HALF_PRECISION = [torch.erfinv, torch.i0, torch.special.i0e, torch.special.i1, torch.special.i1e]

UNIT_EDGES = [
    -INF, -1.5, -1.0, -(1 - 1e-7), -0.95, -0.5, -0.0, 0.0, 1e-30, 1e-40, 0.3, 0.9, 1 - 1e-7, 1.0, 1.5, INF, NAN,
]
PROBABILITY_EDGES = [-0.5, 0.0, 1e-40, 1e-30, 1e-10, 1e-3, 0.135, 0.5, 0.865, 0.999, 1 - 1e-7, 1.0, 1.5, INF, -INF, NAN]
BESSEL_EDGES = [
    -INF, -1e4, -100.0, -89.0, -88.0, -8.0, -7.99, -1.0, -0.0, 0.0, 1e-30, 1.0, 8.0, 8.01, 30.0, 88.0, 89.0,
    700.0, 710.0, 1e4, INF, NAN,
]
# float64 reaches further into the tails.
FLOAT64_EDGES = {
    "unit": [1 - 1e-15, -(1 - 2**-53), 1e-300], "probability": [1e-300, 1e-200, 1 - 2**-53], "bessel": [1e-300],
}

# Edge values should agree to a few ulps (zeros exactly), far tighter than the default tolerances.
EDGE_TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=0.0), torch.float64: dict(rtol=1e-13, atol=0.0)}


def _edges(values: list[float], dtype: torch.dtype) -> torch.Tensor:
    # Two rows, the second reversed: the batch dim is dynamic and the resized batch reorders rows.
    row = torch.tensor(values, dtype=dtype)
    return torch.stack([row, row.flip(0)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_erfinv_edges(dtype):
    # +-1 are +-inf, |x| > 1 and NaN are NaN, odd about 0, and the tails near +-1 stay accurate.
    values = UNIT_EDGES + (FLOAT64_EDGES["unit"] if dtype == torch.float64 else [])
    assert_batch_dynamic_equivalent(
        lambda x: tuple(fn(x) for fn in ERFINV), _edges(values, dtype), **EDGE_TOLERANCE[dtype]
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_ndtri_edges(dtype):
    # 0 and 1 are -inf and inf, outside [0, 1] NaN; 1e-30 is no -inf (sqrt(2) erfinv(2p - 1) would be).
    values = PROBABILITY_EDGES + (FLOAT64_EDGES["probability"] if dtype == torch.float64 else [])
    assert_batch_dynamic_equivalent(torch.special.ndtri, _edges(values, dtype), **EDGE_TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_bessel_edges(dtype):
    # Both expansions and the seam at 8; exp's overflow past ~88.7 in float32 (inf, as eager) and
    # past ~709.8 in float64; NaN at +-inf for I0 and I1 (inf / inf in PyTorch too), 0 for the
    # scaled forms.
    values = BESSEL_EDGES + (FLOAT64_EDGES["bessel"] if dtype == torch.float64 else [])
    assert_batch_dynamic_equivalent(
        lambda x: tuple(fn(x) for fn in BESSEL), _edges(values, dtype), **EDGE_TOLERANCE[dtype]
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_precision_computes_in_float32(dtype):
    unit = _edges(UNIT_EDGES, dtype)
    bessel = _edges([v for v in BESSEL_EDGES if abs(v) < 12] + [0.5] * 5, dtype)

    def fn(u, b):
        return (torch.erfinv(u),) + tuple(f(b) for f in HALF_PRECISION[1:])

    program = assert_batch_dynamic_equivalent(fn, unit, bessel)
    assert {output.dtype.name for output in program.model.graph.outputs} == {str(dtype).split(".")[1].upper()}


def test_integer_inputs_compute_in_float32():
    x = torch.tensor([[-1, 0, 1, 2], [3, -3, 0, 1]])
    program = assert_batch_dynamic_equivalent(lambda t: (torch.erfinv(t), torch.i0(t), torch.special.i1e(t)), x)
    assert all(output.dtype.name == "FLOAT" for output in program.model.graph.outputs)


def test_prims_that_torch_decomposes_to():
    ops = [prims.erf_inv, prims.ndtri, prims.bessel_i0, prims.bessel_i0e, prims.bessel_i1, prims.bessel_i1e]
    x = torch.rand(2, 6) * 0.98 + 0.01
    assert_batch_dynamic_equivalent(lambda t: tuple(op.default(t) for op in ops), x, rtol=1e-5, atol=0.0)


# -- accuracy over dense sweeps --------------------------------------------------------------


def _ulps(actual: torch.Tensor, precise: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """|actual - precise| in units of ``dtype``'s spacing at ``precise`` (0 where they are equal)."""
    spacing = torch.from_numpy(np.spacing(precise.to(dtype).abs().numpy()).astype(np.float64))
    error = (actual.double() - precise).abs() / spacing
    return torch.where(actual.double() == precise, 0.0, error)


def _sweep(name: str, dtype: torch.dtype) -> torch.Tensor:
    """A dense grid over the function's domain (finite results only), tails included."""
    f64 = torch.float64
    tiny = 1e-38 if dtype == torch.float32 else 1e-300
    epsilon = torch.finfo(dtype).eps
    near_one = 1 - torch.logspace(-1, math.log10(epsilon / 2), 300, dtype=f64)
    if name == "erfinv":
        grid = torch.cat([torch.linspace(-1, 1, 8001, dtype=f64)[1:-1], near_one, -near_one])
    elif name == "ndtri":
        low_tail = torch.logspace(math.log10(tiny), -1, 300, dtype=f64)
        grid = torch.cat([torch.linspace(0, 1, 8001, dtype=f64)[1:-1], low_tail, near_one])
    else:
        # I0 and I1 overflow float32 past ~88.7; the scaled forms go on.
        limit = 85.0 if name in ("i0", "i1") and dtype == torch.float32 else 700.0
        grid = torch.cat([torch.linspace(-limit, limit, 8001, dtype=f64), torch.logspace(-30, 1, 300, dtype=f64)])
    return grid.to(dtype)


# Per function: the largest error in ulps against float64 eager (float32: what eager float32
# reaches itself is in the comment; float64 is compared with eager float64, PyTorch's own
# approximations being within a few ulps of the truth: against mpmath, erfinv 4 ulps (eager 1),
# ndtri 5 (eager 4), i0 3.5, i0e 6, i1 8, i1e 10 (eager 3 to 6)); the most nodes its graph has
# in float32 and float64; ONNX ops it must use once, and must not use.
SWEEPS = {
    "erfinv": (torch.erfinv, (4.0, 8.0), (50, 75), {"Log"}, set()),  # eager 0.5
    "ndtri": (torch.special.ndtri, (6.0, 8.0), (60, 60), {"Sqrt", "Reciprocal"}, {"Erf"}),  # eager 4
    "i0": (torch.i0, (6.0, 6.0), (80, 110), {"Exp"}, set()),  # eager 4.2
    "i0e": (torch.special.i0e, (8.0, 6.0), (80, 110), set(), {"Exp"}),  # eager 5.6
    "i1": (torch.special.i1, (20.0, 12.0), (80, 110), {"Exp"}, set()),  # eager 13.6: exp(x) x chbevl near 7.5
    "i1e": (torch.special.i1e, (10.0, 12.0), (80, 110), set(), {"Exp"}),  # eager 8.7
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", list(SWEEPS))
def test_dense_sweep_accuracy_and_graph_size(name, dtype):
    fn, bounds, most_nodes, once, absent = SWEEPS[name]
    float32 = dtype == torch.float32
    x = _sweep(name, dtype)
    # (Dynamic, but not resized: the edge tests resize.)
    program = assert_exports_equivalent(
        fn, (x,), dynamic_shapes=({0: BATCH},), rtol=1e-5 if float32 else 1e-12, atol=0.0
    )
    actual = program(x)
    precise = fn(x.double()) if float32 else fn(x)
    assert torch.isfinite(precise).all()
    errors = _ulps(actual, precise, dtype)
    worst = int(errors.argmax())
    message = f"{name} {dtype}: {float(errors.max()):.2f} ulps at x = {float(x[worst])!r}"
    assert errors.max() <= bounds[not float32], message

    histogram = op_histogram(program)
    assert sum(histogram.values()) <= most_nodes[not float32], histogram
    assert all(histogram[op] == 1 for op in once) and not absent & set(histogram), histogram
    # A Newton step on Erf polishes float32; onnxruntime has no float64 Erf.
    if name == "erfinv":
        assert histogram["Erf"] == (1 if float32 else 0), histogram


# -- the Kaiser window and models that use these functions ----------------------------------


def test_kaiser_window():
    # torch.kaiser_window has no decomposition in torch: translated on its own, in its dtype;
    # empty and single windows, symmetric and periodic ones, each dtype.
    windows = [(0, True, 12.0), (1, True, 5.0), (8, False, 5.0), (9, True, 12.0), (400, False, 14.769656459379492)]
    dtypes = (torch.float32, torch.float64, torch.float16)

    def fn(x):
        constants = [torch.kaiser_window(n, periodic=p, beta=b) for n, p, b in windows]
        constants += [torch.kaiser_window(9, periodic=True, beta=12.0, dtype=d) for d in dtypes[1:]]
        return x * torch.kaiser_window(400, periodic=True, beta=8.0), torch.kaiser_window(16), *constants

    assert_batch_dynamic_equivalent(fn, torch.randn(2, 400), rtol=1e-6, atol=1e-7)


class KaiserSincInterpolator(nn.Module):
    """A resampler's band-limited interpolation at fractional positions, as torchaudio's
    ``sinc_interp_kaiser``: a sinc of ``2 * width`` taps under a Kaiser window (torch.i0), lowpassed
    by ``rolloff``, evaluated at each output's phase."""

    def __init__(self, width: int = 6, rolloff: float = 0.945, beta: float = 14.769656459379492):
        super().__init__()
        self.width, self.rolloff, self.beta = width, rolloff, beta
        self.register_buffer("taps", torch.arange(-width + 1, width + 1, dtype=torch.float32))

    def forward(self, frames: torch.Tensor, phase: torch.Tensor) -> torch.Tensor:
        t = (self.taps - phase) * self.rolloff
        window = torch.i0(self.beta * torch.sqrt((1 - (t / self.width) ** 2).clamp(min=0)))
        window = window / torch.i0(torch.tensor(self.beta))
        t = t * math.pi
        sinc = torch.where(t == 0, torch.ones_like(t), torch.sin(t) / t)
        return (frames * sinc * window * self.rolloff).sum(-1)


def test_kaiser_windowed_sinc_resampler():
    frames = torch.randn(5, 12)
    phase = torch.tensor([[0.0], [0.25], [0.5], [0.75], [0.999]])
    assert_batch_dynamic_equivalent(KaiserSincInterpolator().eval(), frames, phase, rtol=1e-5, atol=1e-6)


class GaussianCopula(nn.Module):
    """Uniform marginals to correlated standard normals: each marginal's normal quantile (ndtri),
    mixed by the Cholesky factor of the copula's correlation; and the probit by erfinv, as users
    write it."""

    def __init__(self, correlation: torch.Tensor, eps: float = 1e-7):
        super().__init__()
        self.eps = eps
        self.register_buffer("cholesky", torch.linalg.cholesky(correlation))

    def forward(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        u = u.clamp(self.eps, 1 - self.eps)
        normal = torch.special.ndtri(u) @ self.cholesky.T
        probit = math.sqrt(2) * torch.erfinv(2 * u - 1)
        return normal, probit


def test_gaussian_copula_layer():
    correlation = torch.tensor([[1.0, 0.6, 0.2], [0.6, 1.0, -0.3], [0.2, -0.3, 1.0]])
    u = torch.tensor([[1e-9, 0.5, 0.9999999], [0.2, 0.7, 0.01], [0.999, 1e-4, 0.35], [0.5, 0.5, 0.5]])
    assert_exports_equivalent(
        GaussianCopula(correlation).eval(), (u,), dynamic_shapes=({0: torch.export.Dim("rows")},),
        resized=[(torch.rand(7, 3),)], rtol=1e-5, atol=1e-6,
    )


from tests.opset_parametrization import tested_opset  # noqa: F401  (autouse: every test at two opsets)
