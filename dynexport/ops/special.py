"""Special functions ONNX has no operator for: the inverse error function, the normal quantile
(ndtri), the modified Bessel functions of the first kind of orders 0 and 1, plain and
exponentially scaled, and the Kaiser window built on I0.

erfinv is Giles' polynomial approximation (one Newton step on Erf in float32); ndtri and the
Bessel functions are PyTorch's own approximations, from the Cephes Math Library (Copyright (c)
2018 Steven Moshier, 3-clause BSD license), their coefficients as PyTorch's
aten/src/ATen/native/Math.h holds them (``calc_ndtri``, ``chebyshev_coefficients_i0e_A`` and kin).
Every branch of a function is evaluated for every element and Where picks each element's: its
polynomials all in one sweep along a new last axis, 2 nodes per degree (Horner) or 3 per order
(Clenshaw) for all of them together rather than for each. float16 and bfloat16 compute in
float32, as PyTorch's kernels do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import onnx_ir as ir
import torch

from dynexport.ops._helpers import cast, computed_in, ints, scalar_like, split_equally
from dynexport.registry import Promote, translates

aten = torch.ops.aten
# torch's decompositions turn the aten ops into these.
prims = torch.ops.prims

_IN_FLOAT32 = {ir.DataType.FLOAT16: ir.DataType.FLOAT, ir.DataType.BFLOAT16: ir.DataType.FLOAT}


# -- polynomials along a stacked axis ------------------------------------------------------


def _stacked(ctx, points: Sequence[ir.Value], tables: Sequence[Sequence[float]]) -> tuple[ir.Value, list[ir.Value]]:
    """The points (values of one shape) side by side along a new last axis, and the tables'
    coefficients as one row per order, highest first. A shorter table is padded at its high end
    with zeros, which leave both Horner's and Clenshaw's recurrences unchanged."""
    unsqueezed: dict[int, ir.Value] = {}
    for point in points:
        if id(point) not in unsqueezed:
            unsqueezed[id(point)] = ctx.op.Unsqueeze(point, ints(ctx, [-1]))
    stacked = ctx.op.Concat(*(unsqueezed[id(p)] for p in points), axis=-1)
    length = max(len(t) for t in tables)
    padded = [[0.0] * (length - len(t)) + list(t) for t in tables]
    rows = [ctx.constant([t[i] for t in padded], points[0].dtype) for i in range(length)]
    return stacked, rows


def _columns(ctx, stacked: ir.Value, count: int) -> list[ir.Value]:
    if count == 1:
        return [ctx.op.Squeeze(stacked, ints(ctx, [-1]))]
    return [ctx.op.Squeeze(c, ints(ctx, [-1])) for c in split_equally(ctx, stacked, -1, count)]


def _polevl(ctx, points: Sequence[ir.Value], tables: Sequence[Sequence[float]]) -> list[ir.Value]:
    """Cephes' polevl: each polynomial ``tables[i]`` (highest degree first) at ``points[i]``,
    by Horner's rule."""
    t, rows = _stacked(ctx, points, tables)
    total = ctx.op.Add(ctx.op.Mul(t, rows[0]), rows[1])
    for row in rows[2:]:
        total = ctx.op.Add(ctx.op.Mul(total, t), row)
    return _columns(ctx, total, len(tables))


def _chbevl(ctx, points: Sequence[ir.Value], tables: Sequence[Sequence[float]]) -> list[ir.Value]:
    """Cephes' chbevl: each Chebyshev series ``tables[i]`` (highest order first) at
    ``points[i]`` (twice the argument of the polynomials), by Clenshaw's recurrence."""
    t, rows = _stacked(ctx, points, tables)
    b2, b1 = ctx.constant(0.0, points[0].dtype), rows[0]
    b0 = ctx.op.Add(ctx.op.Mul(t, b1), rows[1])
    for row in rows[2:]:
        b2, b1 = b1, b0
        b0 = ctx.op.Add(ctx.op.Sub(ctx.op.Mul(t, b1), b2), row)
    half = ctx.constant(0.5, points[0].dtype)
    return _columns(ctx, ctx.op.Mul(ctx.op.Sub(b0, b2), half), len(tables))


# -- the inverse error function and the normal quantile ------------------------------------

# Giles, "Approximating the erfinv function" (GPU Computing Gems Jade Edition, 2011):
# erfinv(x) = x P(w) in w = -log((1 - x)(1 + x)), which is exact enough near |x| = 1 (1 - x is
# exact there). Each entry: the bound of w below which it applies, the shift of its argument
# (w, or sqrt(w) past the first) and its coefficients, highest degree first.
_GILES_FLOAT = (
    (5.0, 2.5, [
        2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
        -0.00417768164, 0.246640727, 1.50140941,
    ]),
    (math.inf, 3.0, [
        -0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
        0.00943887047, 1.00167406, 2.83297682,
    ]),
)
_GILES_DOUBLE = (
    (6.25, 3.125, [
        -3.6444120640178196996e-21, -1.685059138182016589e-19, 1.2858480715256400167e-18, 1.115787767802518096e-17,
        -1.333171662854620906e-16, 2.0972767875968561637e-17, 6.6376381343583238325e-15, -4.0545662729752068639e-14,
        -8.1519341976054721522e-14, 2.6335093153082322977e-12, -1.2975133253453532498e-11, -5.4154120542946279317e-11,
        1.051212273321532285e-09, -4.1126339803469836976e-09, -2.9070369957882005086e-08, 4.2347877827932403518e-07,
        -1.3654692000834678645e-06, -1.3882523362786468719e-05, 0.0001867342080340571352, -0.00074070253416626697512,
        -0.0060336708714301490533, 0.24015818242558961693, 1.6536545626831027356,
    ]),
    (16.0, 3.25, [
        2.2137376921775787049e-09, 9.0756561938885390979e-08, -2.7517406297064545428e-07, 1.8239629214389227755e-08,
        1.5027403968909827627e-06, -4.013867526981545969e-06, 2.9234449089955446044e-06, 1.2475304481671778723e-05,
        -4.7318229009055733981e-05, 6.8284851459573175448e-05, 2.4031110387097893999e-05, -0.0003550375203628474796,
        0.00095328937973738049703, -0.0016882755560235047313, 0.0024914420961078508066, -0.0037512085075692412107,
        0.005370914553590063617, 1.0052589676941592334, 3.0838856104922207635,
    ]),
    (math.inf, 5.0, [
        -2.7109920616438573243e-11, -2.5556418169965252055e-10, 1.5076572693500548083e-09, -3.7894654401267369937e-09,
        7.6157012080783393804e-09, -1.4960026627149240478e-08, 2.9147953450901080826e-08, -6.7711997758452339498e-08,
        2.2900482228026654717e-07, -9.9298272942317002539e-07, 4.5260625972231537039e-06, -1.9681778105531670567e-05,
        7.5995277030017761139e-05, -0.00021503011930044477347, -0.00013871931833623122026, 1.0103004648645343977,
        4.8499064014085844221,
    ]),
)

# One Newton step on erf(y) = x takes float32's error from 3.7 ulps to 2.3 where erf is steep
# enough: past |x| = 0.9, Erf(y)'s rounding to x's spacing, divided by erf'(y), would add more
# error than the step removes. (No step in float64: onnxruntime has no float64 Erf.)
_NEWTON_BELOW = 0.9


def _erfinv(ctx, x: ir.Value) -> ir.Value:
    dtype = x.dtype
    one = scalar_like(ctx, 1.0, x)
    # Out of [-1, 1] the product is negative and w NaN; at +-1 w is inf.
    w = ctx.op.Neg(ctx.op.Log(ctx.op.Mul(ctx.op.Sub(one, x), ctx.op.Add(one, x))))
    root = ctx.op.Sqrt(w)
    branches = _GILES_DOUBLE if dtype == ir.DataType.DOUBLE else _GILES_FLOAT
    points = [ctx.op.Sub(w if i == 0 else root, ctx.constant(shift, dtype)) for i, (_, shift, _) in enumerate(branches)]
    values = _polevl(ctx, points, [table for _, _, table in branches])
    factor = values[-1]
    for (bound, _, _), value in reversed(list(zip(branches[:-1], values[:-1]))):
        factor = ctx.op.Where(ctx.op.Less(w, ctx.constant(bound, dtype)), value, factor)
    y = ctx.op.Mul(factor, x)
    if dtype != ir.DataType.DOUBLE:
        residual = ctx.op.Sub(ctx.op.Erf(y), x)
        slope = ctx.op.Mul(ctx.op.Exp(ctx.op.Mul(y, y)), ctx.constant(math.sqrt(math.pi) / 2, dtype))
        step = ctx.op.Mul(residual, slope)
        steep = ctx.op.Less(ctx.op.Abs(x), ctx.constant(_NEWTON_BELOW, dtype))
        y = ctx.op.Where(steep, ctx.op.Sub(y, step), y)
    return ctx.op.Where(ctx.op.Equal(ctx.op.Abs(x), one), ctx.op.Mul(x, ctx.constant(math.inf, dtype)), y)


@translates(aten.erfinv.default, aten.special_erfinv.default, prims.erf_inv.default, promote=Promote.RESULT)
def erfinv(ctx, self):
    return computed_in(ctx, self, _IN_FLOAT32, lambda x: _erfinv(ctx, x))


# Cephes' ndtri, as PyTorch computes it: for 0 <= |p - 1/2| <= 3/8, p - 1/2 + (p - 1/2)^3
# P0/Q0 of (p - 1/2)^2 (times sqrt(2 pi)); beyond, in x = sqrt(-2 log q) of the tail probability
# q, x - log(x)/x - P/Q(1/x)/x, with P1/Q1 for 2 <= x < 8 and P2/Q2 for 8 <= x <= 64 (down to
# q = 1e-890). sqrt(2) erfinv(2p - 1) would lose every tail below float's epsilon to 2p - 1.
_NDTRI_P0 = [
    -5.99633501014107895267e1, 9.80010754185999661536e1, -5.66762857469070293439e1, 1.39312609387279679503e1,
    -1.23916583867381258016e0,
]
_NDTRI_Q0 = [
    1.0, 1.95448858338141759834e0, 4.67627912898881538453e0, 8.63602421390890590575e1, -2.25462687854119370527e2,
    2.00260212380060660359e2, -8.20372256168333339912e1, 1.59056225126211695515e1, -1.18331621121330003142e0,
]
_NDTRI_P1 = [
    4.05544892305962419923e0, 3.15251094599893866154e1, 5.71628192246421288162e1, 4.40805073893200834700e1,
    1.46849561928858024014e1, 2.18663306850790267539e0, -1.40256079171354495875e-1, -3.50424626827848203418e-2,
    -8.57456785154685413611e-4,
]
_NDTRI_Q1 = [
    1.0, 1.57799883256466749731e1, 4.53907635128879210584e1, 4.13172038254672030440e1, 1.50425385692907503408e1,
    2.50464946208309415979e0, -1.42182922854787788574e-1, -3.80806407691578277194e-2, -9.33259480895457427372e-4,
]
_NDTRI_P2 = [
    3.23774891776946035970e0, 6.91522889068984211695e0, 3.93881025292474443415e0, 1.33303460815807542389e0,
    2.01485389549179081538e-1, 1.23716634817820021358e-2, 3.01581553508235416007e-4, 2.65806974686737550832e-6,
    6.23974539184983293730e-9,
]
_NDTRI_Q2 = [
    1.0, 6.02427039364742014255e0, 3.67983563856160859403e0, 1.37702099489081330271e0, 2.16236993594496635890e-1,
    1.34204006088543189037e-2, 3.28014464682127739104e-4, 2.89247864745380683936e-6, 6.79019408009981274425e-9,
]


def _ndtri(ctx, p: ir.Value) -> ir.Value:
    dtype = p.dtype
    one, half = scalar_like(ctx, 1.0, p), scalar_like(ctx, 0.5, p)
    centered = ctx.op.Sub(p, half)
    # 1 - p is exact where it is the smaller; out of [0, 1] the tail is negative and its Log NaN.
    tail = ctx.op.Min(p, ctx.op.Sub(one, p))
    lower = ctx.op.Less(p, half)
    square = ctx.op.Mul(centered, centered)
    root = ctx.op.Sqrt(ctx.op.Mul(ctx.op.Log(tail), ctx.constant(-2.0, dtype)))
    reciprocal = ctx.op.Reciprocal(root)
    p0, p1, p2, q0, q1, q2 = _polevl(
        ctx, [square, reciprocal, reciprocal, square, reciprocal, reciprocal],
        [_NDTRI_P0, _NDTRI_P1, _NDTRI_P2, _NDTRI_Q0, _NDTRI_Q1, _NDTRI_Q2],
    )
    central = ctx.op.Add(centered, ctx.op.Mul(centered, ctx.op.Div(ctx.op.Mul(square, p0), q0)))
    central = ctx.op.Mul(central, ctx.constant(math.sqrt(2 * math.pi), dtype))
    near = ctx.op.Less(root, ctx.constant(8.0, dtype))
    correction = ctx.op.Div(ctx.op.Mul(reciprocal, ctx.op.Where(near, p1, p2)), ctx.op.Where(near, q1, q2))
    far = ctx.op.Sub(ctx.op.Sub(root, ctx.op.Div(ctx.op.Log(root), root)), correction)
    far = ctx.op.Where(lower, ctx.op.Neg(far), far)
    result = ctx.op.Where(ctx.op.Greater(tail, ctx.constant(math.exp(-2), dtype)), central, far)
    # At p = 0 and 1, x - log(x)/x is inf - inf.
    infinity = ctx.op.Where(lower, ctx.constant(-math.inf, dtype), ctx.constant(math.inf, dtype))
    return ctx.op.Where(ctx.op.Equal(tail, ctx.constant(0.0, dtype)), infinity, result)


@translates(aten.special_ndtri.default, prims.ndtri.default, promote=Promote.RESULT)
def ndtri(ctx, self):
    return computed_in(ctx, self, _IN_FLOAT32, lambda p: _ndtri(ctx, p))


# -- modified Bessel functions of the first kind -------------------------------------------

# Chebyshev coefficients of exp(-x) I0(x) on [0, 8] (A) and of exp(-x) sqrt(x) I0(x) on
# [8, inf) in 32/x (B); the same for I1, A of exp(-x) I1(x) / x.
_I0E_A = [
    -4.41534164647933937950e-18, 3.33079451882223809783e-17, -2.43127984654795469359e-16, 1.71539128555513303061e-15,
    -1.16853328779934516808e-14, 7.67618549860493561688e-14, -4.85644678311192946090e-13, 2.95505266312963983461e-12,
    -1.72682629144155570723e-11, 9.67580903537323691224e-11, -5.18979560163526290666e-10, 2.65982372468238665035e-9,
    -1.30002500998624804212e-8, 6.04699502254191894932e-8, -2.67079385394061173391e-7, 1.11738753912010371815e-6,
    -4.41673835845875056359e-6, 1.64484480707288970893e-5, -5.75419501008210370398e-5, 1.88502885095841655729e-4,
    -5.76375574538582365885e-4, 1.63947561694133579842e-3, -4.32430999505057594430e-3, 1.05464603945949983183e-2,
    -2.37374148058994688156e-2, 4.93052842396707084878e-2, -9.49010970480476444210e-2, 1.71620901522208775349e-1,
    -3.04682672343198398683e-1, 6.76795274409476084995e-1,
]
_I0E_B = [
    -7.23318048787475395456e-18, -4.83050448594418207126e-18, 4.46562142029675999901e-17, 3.46122286769746109310e-17,
    -2.82762398051658348494e-16, -3.42548561967721913462e-16, 1.77256013305652638360e-15, 3.81168066935262242075e-15,
    -9.55484669882830764870e-15, -4.15056934728722208663e-14, 1.54008621752140982691e-14, 3.85277838274214270114e-13,
    7.18012445138366623367e-13, -1.79417853150680611778e-12, -1.32158118404477131188e-11, -3.14991652796324136454e-11,
    1.18891471078464383424e-11, 4.94060238822496958910e-10, 3.39623202570838634515e-9, 2.26666899049817806459e-8,
    2.04891858946906374183e-7, 2.89137052083475648297e-6, 6.88975834691682398426e-5, 3.36911647825569408990e-3,
    8.04490411014108831608e-1,
]
_I1E_A = [
    2.77791411276104639959e-18, -2.11142121435816608115e-17, 1.55363195773620046921e-16, -1.10559694773538630805e-15,
    7.60068429473540693410e-15, -5.04218550472791168711e-14, 3.22379336594557470981e-13, -1.98397439776494371520e-12,
    1.17361862988909016308e-11, -6.66348972350202774223e-11, 3.62559028155211703701e-10, -1.88724975172282928790e-9,
    9.38153738649577178388e-9, -4.44505912879632808065e-8, 2.00329475355213526229e-7, -8.56872026469545474066e-7,
    3.47025130813767847674e-6, -1.32731636560394358279e-5, 4.78156510755005422638e-5, -1.61760815825896745588e-4,
    5.12285956168575772895e-4, -1.51357245063125314899e-3, 4.15642294431288815669e-3, -1.05640848946261981558e-2,
    2.47264490306265168283e-2, -5.29459812080949914269e-2, 1.02643658689847095384e-1, -1.76416518357834055153e-1,
    2.52587186443633654823e-1,
]
_I1E_B = [
    7.51729631084210481353e-18, 4.41434832307170791151e-18, -4.65030536848935832153e-17, -3.20952592199342395980e-17,
    2.96262899764595013876e-16, 3.30820231092092828324e-16, -1.88035477551078244854e-15, -3.81440307243700780478e-15,
    1.04202769841288027642e-14, 4.27244001671195135429e-14, -2.10154184277266431302e-14, -4.08355111109219731823e-13,
    -7.19855177624590851209e-13, 2.03562854414708950722e-12, 1.41258074366137813316e-11, 3.25260358301548823856e-11,
    -1.89749581235054123450e-11, -5.58974346219658380687e-10, -3.83538038596423702205e-9, -2.63146884688951950684e-8,
    -2.51223623787020892529e-7, -3.88256480887769039346e-6, -1.10588938762623716291e-4, -9.76109749136146840777e-3,
    7.78576235018280120474e-1,
]

# In float32 the highest orders, whose coefficients together stay below this, change no result
# by a tenth of an ulp: the series get shorter (PyTorch's own float tables for I1 are cut too).
_FLOAT32_NEGLIGIBLE = 2.0**-34


def _significant(table: list[float], dtype: ir.DataType) -> list[float]:
    if dtype == ir.DataType.DOUBLE:
        return table
    dropped, start = 0.0, 0
    while dropped + abs(table[start]) <= _FLOAT32_NEGLIGIBLE:
        dropped += abs(table[start])
        start += 1
    return table[start:]


def _bessel(ctx, x: ir.Value, order: int, scaled: bool) -> ir.Value:
    """I0 or I1 of ``x`` (``order``), times exp(-|x|) if ``scaled``, as Cephes' i0, i0e, i1, i1e."""
    dtype = x.dtype
    magnitude = ctx.op.Abs(x)
    two = ctx.constant(2.0, dtype)
    eight = ctx.constant(8.0, dtype)
    small_point = ctx.op.Sub(ctx.op.Mul(magnitude, ctx.constant(0.5, dtype)), two)
    # The large form at 8 where the small one applies: no division by zero (Max keeps NaN).
    large_magnitude = ctx.op.Max(magnitude, eight)
    large_point = ctx.op.Sub(ctx.op.Div(ctx.constant(32.0, dtype), large_magnitude), two)
    tables = (_I0E_A, _I0E_B) if order == 0 else (_I1E_A, _I1E_B)
    small, large = _chbevl(ctx, [small_point, large_point], [_significant(t, dtype) for t in tables])
    if order == 1:
        small = ctx.op.Mul(small, magnitude)
    large = ctx.op.Div(large, ctx.op.Sqrt(large_magnitude))
    value = ctx.op.Where(ctx.op.LessOrEqual(magnitude, eight), small, large)
    if not scaled:
        # As PyTorch: exp overflows past ~88.7 in float32 (inf), and exp(inf) * 0 is NaN at +-inf.
        value = ctx.op.Mul(ctx.op.Exp(magnitude), value)
    if order == 1:
        value = ctx.op.Where(ctx.op.Less(x, ctx.constant(0.0, dtype)), ctx.op.Neg(value), value)
    return value


def _bessel_rule(order: int, scaled: bool, name: str):
    def rule(ctx, self):
        return computed_in(ctx, self, _IN_FLOAT32, lambda x: _bessel(ctx, x, order, scaled))

    rule.__name__ = rule.__qualname__ = name
    return rule


for _name, _order, _scaled, _targets in [
    ("i0", 0, False, (aten.i0.default, aten.special_i0.default, aten.special_modified_bessel_i0.default,
                      prims.bessel_i0.default)),
    ("i0e", 0, True, (aten.special_i0e.default, prims.bessel_i0e.default)),
    ("i1", 1, False, (aten.special_i1.default, aten.special_modified_bessel_i1.default, prims.bessel_i1.default)),
    ("i1e", 1, True, (aten.special_i1e.default, prims.bessel_i1e.default)),
]:
    translates(*_targets, promote=Promote.RESULT)(_bessel_rule(_order, _scaled, _name))


# -- the Kaiser window ---------------------------------------------------------------------


@translates(aten.kaiser_window.default, aten.kaiser_window.periodic, aten.kaiser_window.beta)
def kaiser_window(ctx, window_length, periodic=True, beta=12.0, *, dtype=None):
    # As PyTorch's kernel: I0(beta sqrt|1 - ((n - alpha) / alpha)^2|) / I0(beta) over
    # n = 0 .. length - 1 (one more, then dropped, if periodic), alpha = (length - 1) / 2.
    out_dtype = ctx.out_dtype
    if window_length <= 1:
        return ctx.op.Expand(ctx.constant(1.0, out_dtype), ints(ctx, [window_length]))
    length = window_length + 1 if periodic else window_length
    compute = _IN_FLOAT32.get(out_dtype, out_dtype)
    int64 = ir.DataType.INT64
    n = ctx.op.Range(ctx.constant(0, int64), ctx.constant(window_length, int64), ctx.constant(1, int64))
    # PyTorch's n is an arange of the output dtype, exact up to 2048 in float16.
    n = cast(ctx, cast(ctx, n, out_dtype), compute)
    alpha = ctx.constant((length - 1) / 2.0, compute)
    ratio = ctx.op.Div(ctx.op.Sub(n, alpha), alpha)
    radicand = ctx.op.Abs(ctx.op.Sub(ctx.constant(1.0, compute), ctx.op.Mul(ratio, ratio)))
    beta_value = ctx.constant(beta, compute)
    window = ctx.op.Div(
        _bessel(ctx, ctx.op.Mul(beta_value, ctx.op.Sqrt(radicand)), 0, False), _bessel(ctx, beta_value, 0, False)
    )
    return cast(ctx, window, out_dtype)
