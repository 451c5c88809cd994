"""llama.cpp's CPU float arithmetic in torch: the float32 building blocks that the numba runtime computes bit for
bit (kernels/ggmlmath.py, kernels/simd.py, kernels/ops.py), as tensor operations that give the same bits on the
CPU and on CUDA, vectorized over every row at once.

Why the same bits: every matmul input is rounded to 8-bit blocks (Q8_0 / Q8_1 / Q8_K) or to f16, and so are the
KV cache and attention's q and probabilities; a value one float32 ulp off rounds to a whole step (max/127, an f16
ulp) away once in a while, and the model's logits then move by ~1e-3 relative per such step (ggmlmath.py says
more). So the torch backend in float32 performs numba's operations, in numba's order:

- one rounding per operation: torch runs each operation as its own kernel, nothing is contracted, a
  division takes a tensor divisor (torch on CUDA turns `tensor / python scalar` into a multiplication by the
  reciprocal, which rounds twice) and a square root goes through float64 (`sqrt`);
- fused multiply-adds (`fma`): the product of two float32 is exact in float64 and the sum is rounded to float64,
  then to float32. That is the fused result unless the float64 sum was inexact and fell exactly halfway between
  two float32 (29 given bits: about 2^-29 of the sums);
- the dot products' summation orders: `chain` is a row of 8 (tinyBLAS, ggml_vec_dot_q*) or 32 (ggml_vec_dot_f16
  / f32: four 8-lane accumulators) fma accumulators over steps of the dot, a loop over the steps with every row,
  head and token in one tensor; `hsum8` / `reduce4x8` fold the lanes as the AVX2 code does;
- ggml's vector expf (`v_expf`, used by softmax and SiLU on blocks of 8) operation for operation, bit tricks
  included; libm's expf / logf (sigmoid, softplus, the leftovers of a row) as glibc computes them, in float64
  with its tables (not the correctly rounded value, which glibc's differs from for 6 in 10^4 inputs (expf) and
  2 in 10^3 (logf));
- float64 sums (rms_norm's squares, softmax's block sums) are added in torch's order, not one after the other:
  their rounding, 2^-53 relative, changes the float32 result only next to a float32 halfway point.
"""

import functools
import struct
from decimal import Decimal

import torch

F32, F64 = torch.float32, torch.float64


def div(a: torch.Tensor, b) -> torch.Tensor:
    """a / b rounded once, b a tensor or a number (made a tensor: see the module docstring)."""
    if not isinstance(b, torch.Tensor) or b.numel() == 1 and b.dim() == 0:
        b = torch.full_like(a, float(b))
    return a / b


def f32(x: float) -> float:
    """A number as the float32 numba computes with (np.float32(x)), held by a Python float."""
    return torch.tensor(x, dtype=F32).item()


def fma(a, b, c) -> torch.Tensor:
    """a * b + c rounded once to float32 (float32 tensors or float32-valued numbers; see the module docstring)."""
    a = a.double() if isinstance(a, torch.Tensor) else a
    b = b.double() if isinstance(b, torch.Tensor) else b
    c = c.double() if isinstance(c, torch.Tensor) else c
    return (a * b + c).float()


def sqrt(x: torch.Tensor) -> torch.Tensor:
    """sqrtf, correctly rounded: through float64 (exact for float32's range), because torch's float32 sqrt on
    the CPU is an approximation (measured: 17% of random inputs one ulp off)."""
    return torch.sqrt(x.double()).float()


def to_f16(x: torch.Tensor) -> torch.Tensor:
    """Rounded to the nearest f16 (ties to even) and back: F16C's vcvtps2ph, ggml's FP32_TO_FP16."""
    return x.half().float()


# ---- exp ---------------------------------------------------------------------------------------------------

EXP_SHIFT = float.fromhex("0x1.8p23")
LOG2E = float.fromhex("0x1.715476p+0")
LN2_HI = float.fromhex("0x1.62e4p-1")
LN2_LO = float.fromhex("0x1.7f7d1cp-20")
EXP_P = tuple(float.fromhex(h) for h in ("0x1.0e4020p-7", "0x1.573e2ep-5", "0x1.555e66p-3", "0x1.fffdb6p-2",
                                         "0x1.ffffecp-1"))


def _bits(x: torch.Tensor) -> torch.Tensor:
    """float32 -> its bits as int64 in [0, 2^32)."""
    return x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def _from_bits(u: torch.Tensor) -> torch.Tensor:
    """int64 holding 32 bits (taken mod 2^32) -> the float32 with those bits."""
    u = u & 0xFFFFFFFF
    return (u - ((u & 0x80000000) << 1)).to(torch.int32).view(F32)


def v_expf(x: torch.Tensor) -> torch.Tensor:
    """ggml_v_expf (AVX2 + FMA) on every element: ARM's optimized-routines exp, its slow paths chosen per lane."""
    p0, p1, p2, p3, p4 = EXP_P
    z = fma(x, LOG2E, EXP_SHIFT)
    n = z - EXP_SHIFT
    b = fma(-n, LN2_LO, fma(-n, LN2_HI, x))
    e = _bits(z) << 23
    k = _from_bits(e + 0x3F800000)
    u = b * b
    j = fma(fma(fma(torch.full_like(b, p0), b, p1), u, fma(torch.full_like(b, p2), b, p3)), u, b * p4)
    g = torch.where(n <= 0.0, 0x82000000, 0)
    s1 = _from_bits(g + 0x7F000000)
    s2 = _from_bits(e - g)
    abs_n = n.abs()
    near = torch.where(abs_n > 126.0, fma(s2, j, s2) * s1, fma(j, k, k))
    return torch.where(abs_n > 192.0, s1 * s1, near)


# glibc's expf (sysdeps/ieee754/flt-32/e_expf.c, ARM's optimized-routines): x = (k + r) ln2 / 32,
# exp(x) = 2^(k/32) * poly(r), in float64; 2^(i/32) correctly rounded, as glibc's table holds it
EXPF_N = 32
EXPF_TABLE = [(struct.unpack("<Q", struct.pack("<d", float(Decimal(2) ** (Decimal(i) / EXPF_N))))[0] - (i << 47))
              for i in range(EXPF_N)]
EXPF_INVLN2N = float.fromhex("0x1.71547652b82fep+0") * EXPF_N
EXPF_SHIFT = float.fromhex("0x1.8p+52")
EXPF_POLY = (float.fromhex("0x1.c6af84b912394p-5") / EXPF_N ** 3, float.fromhex("0x1.ebfce50fac4f3p-3") / EXPF_N ** 2,
             float.fromhex("0x1.62e42ff0c52d6p-1") / EXPF_N)
EXPF_OVERFLOW, EXPF_UNDERFLOW = float.fromhex("0x1.62e42ep6"), float.fromhex("-0x1.9fe368p6")

# glibc's logf (sysdeps/ieee754/flt-32/e_logf.c): x = 2^k z, log(x) = k ln2 + log(c) + poly(z / c - 1), c near
# the middle of the 16 subintervals of z; its table (__logf_data: 1 / c, log(c)) and polynomial
LOGF_TABLE = (
    ("0x1.661ec79f8f3bep+0", "-0x1.57bf7808caadep-2"), ("0x1.571ed4aaf883dp+0", "-0x1.2bef0a7c06ddbp-2"),
    ("0x1.49539f0f010b0p+0", "-0x1.01eae7f513a67p-2"), ("0x1.3c995b0b80385p+0", "-0x1.b31d8a68224e9p-3"),
    ("0x1.30d190c8864a5p+0", "-0x1.6574f0ac07758p-3"), ("0x1.25e227b0b8ea0p+0", "-0x1.1aa2bc79c8100p-3"),
    ("0x1.1bb4a4a1a343fp+0", "-0x1.a4e76ce8c0e5ep-4"), ("0x1.12358f08ae5bap+0", "-0x1.1973c5a611cccp-4"),
    ("0x1.0953f419900a7p+0", "-0x1.252f438e10c1ep-5"), ("0x1.0000000000000p+0", "0x0.0p+0"),
    ("0x1.e608cfd9a47acp-1", "0x1.aa5aa5df25984p-5"), ("0x1.ca4b31f026aa0p-1", "0x1.c5e53aa362eb4p-4"),
    ("0x1.b2036576afce6p-1", "0x1.526e57720db08p-3"), ("0x1.9c2d163a1aa2dp-1", "0x1.bc2860d224770p-3"),
    ("0x1.886e6037841edp-1", "0x1.1058bc8a07ee1p-2"), ("0x1.767dcf5534862p-1", "0x1.4043057b6ee09p-2"))
LOGF_POLY = tuple(float.fromhex(h) for h in ("-0x1.00ea348b88334p-2", "0x1.5575b0be00b6ap-2",
                                             "-0x1.ffffef20a4123p-2"))
LN2 = float.fromhex("0x1.62e42fefa39efp-1")
LOGF_OFF = 0x3F330000


@functools.lru_cache(maxsize=None)
def _tables(device) -> tuple[torch.Tensor, torch.Tensor]:
    """expf's and logf's tables on a device, made once."""
    logf_table = [[float.fromhex(a), float.fromhex(b)] for a, b in LOGF_TABLE]
    return (torch.tensor(EXPF_TABLE, dtype=torch.int64, device=device),
            torch.tensor(logf_table, dtype=F64, device=device))


def expf(x: torch.Tensor) -> torch.Tensor:
    """glibc's expf (libm's, what numba's np.exp on float32 calls) in its float64 steps. glibc's FMA build fuses
    three of its float64 multiply-adds; that moves the float64 result by an ulp at most, which changes the
    float32 result only next to a halfway point (2^-29 of inputs)."""
    xd = x.double()
    z = EXPF_INVLN2N * xd
    kd = z + EXPF_SHIFT
    ki = kd.view(torch.int64)
    kd = kd - EXPF_SHIFT
    r = z - kd
    t = _tables(x.device)[0][ki % EXPF_N] + (ki << 47)
    s = t.view(F64)
    c0, c1, c2 = EXPF_POLY
    zz = c0 * r + c1
    y = (zz * (r * r) + (c2 * r + 1.0)) * s
    y = torch.where(x > EXPF_OVERFLOW, float("inf"), torch.where(x < EXPF_UNDERFLOW, 0.0, y))
    return torch.where(torch.isnan(x), x.double(), y).float()


def logf(x: torch.Tensor) -> torch.Tensor:
    """glibc's logf in its float64 steps (normal positive x; 0, negative, subnormal, inf and NaN as libm returns
    them). Its FMA build computes z / c - 1 with one rounding: as for expf, that shows in 2^-29 of the results."""
    ix = _bits(x)
    normal = (ix >= 0x00800000) & (ix < 0x7F800000)
    ix = torch.where(normal, ix, _bits(x * float.fromhex("0x1p23")) - (23 << 23))
    tmp = ix - LOGF_OFF
    i = (tmp >> 19) % 16
    k = tmp >> 23                       # tmp as a signed 32-bit value, shifted arithmetically
    iz = ix - (tmp & (0x1FF << 23))
    table = _tables(x.device)[1][i]
    z = _from_bits(iz).double()
    r = z * table[..., 0] - 1.0
    y0 = table[..., 1] + k.double() * LN2
    a0, a1, a2 = LOGF_POLY
    r2 = r * r
    y = a0 * r2 + (a1 * r + a2)
    y = (y * r2 + (y0 + r)).float()
    y = torch.where(x == 1.0, 0.0, y)
    y = torch.where(x == 0.0, float("-inf"), y)
    y = torch.where((x < 0.0) | torch.isnan(x), float("nan"), y)
    return torch.where(torch.isinf(x) & (x > 0), x, y)


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    """ggml's unary sigmoid: 1 / (1 + expf(-x)), libm's expf."""
    return div(torch.ones_like(x), 1.0 + expf(-x))


def softplus(x: torch.Tensor) -> torch.Tensor:
    """ggml's softplus: x above 20 kept, else logf(1 + expf(x))."""
    return torch.where(x > 20.0, x, logf(1.0 + expf(x)))


def silu(x: torch.Tensor) -> torch.Tensor:
    """ggml_vec_silu_f32 over the last axis: x / (1 + v_expf(-x)) on its whole blocks of 8, libm's expf on the
    leftover values."""
    n_main = x.shape[-1] // 8 * 8
    main = x[..., :n_main]
    main = div(main, 1.0 + v_expf(0.0 - main))
    rest = x[..., n_main:]
    return torch.cat([main, div(rest, 1.0 + expf(-rest))], -1) if n_main < x.shape[-1] else main


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """ggml's swiglu: silu(gate) * up, silu as `silu`."""
    return silu(gate) * up


def swiglu_oai(gate: torch.Tensor, up: torch.Tensor, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    """ggml_swiglu_oai in scalar float32 with libm's expf: x / (1 + expf(alpha * (0 - x))) * (y + 1)."""
    alpha, limit = f32(alpha), f32(limit)
    x, y = gate.clamp(max=limit), up.clamp(-limit, limit)
    return div(x, 1.0 + expf(alpha * (0.0 - x))) * (y + 1.0)


# ---- sums --------------------------------------------------------------------------------------------------

def fma_chain(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """acc = fma(values[b], scales[b], acc) over b from acc = 0, float32 (values float32, scales float64 holding
    float32 values: the product is exact in float64; torch computes addcmul in float64 and rounds it once to the
    float32 output)."""
    acc = (values[0] * scales[0] + 0.0).float()
    for b in range(1, len(values)):
        torch.addcmul(acc, values[b], scales[b], out=acc)
    return acc


def hsum8(v: torch.Tensor) -> torch.Tensor:
    """(..., 8) -> ((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7)): hsum_float_8, tinyBLAS's hsum."""
    t = v[..., :4] + v[..., 4:]
    return (t[..., 0] + t[..., 2]) + (t[..., 1] + t[..., 3])


def reduce4x8(acc: torch.Tensor) -> torch.Tensor:
    """(..., 32): four 8-lane accumulators -> GGML_F32x8_REDUCE: (0+2) + (1+3) lane-wise, then the low half plus
    the high half, ((t0+t1) + (t2+t3))."""
    a = (acc[..., 0:8] + acc[..., 16:24]) + (acc[..., 8:16] + acc[..., 24:32])
    t = a[..., :4] + a[..., 4:]
    return (t[..., 0] + t[..., 1]) + (t[..., 2] + t[..., 3])


def chain(w: torch.Tensor, x: torch.Tensor, width: int, exact_products: bool = False,
          acc: torch.Tensor | None = None) -> torch.Tensor:
    """`width` fma accumulators: lane l sums w[..., k] * x[..., k] for k = l mod width, in order of k, starting
    from 0 (w, x broadcastable, their last length a multiple of width) -> (..., width) float32. Each step is one
    addcmul of float64 operands (exact products) into the float32 accumulators: torch computes it in float64
    and rounds once to the float32 output. exact_products: every w * x is exact in float32 (f16 or bf16 values
    on both sides: at most 22 significant bits), so the fma is an addition of the product and float32 will do.
    acc: the accumulators of the chain so far (its earlier steps), continued here (updated in place)."""
    dtype = F32 if exact_products else F64
    w64, x64 = (_steps(a.to(dtype), width) for a in (w, x))
    first = 0
    if acc is None:
        acc, first = (w64[0] * x64[0] + 0.0).float(), 1     # fma(w, x, 0): + 0 turns a -0 product into 0
    for s in range(first, len(w64)):
        torch.addcmul(acc, w64[s], x64[s], out=acc)
    return acc


def _steps(a: torch.Tensor, width: int) -> torch.Tensor:
    """(..., n) -> (n / width, ..., width), contiguous: one step's values in one block of memory."""
    return a.reshape(a.shape[:-1] + (-1, width)).movedim(-2, 0).contiguous()


def dot_one_row(w: torch.Tensor, x: torch.Tensor, f16_tail: bool, exact_products: bool = False) -> torch.Tensor:
    """ggml_vec_dot_f32 / f16 (numba's matmul.dot_one_row): four 8-lane accumulators over steps of 32, reduce4x8,
    then the leftover values: float fma for f32, a float64 sum of float32 products for f16."""
    n = w.shape[-1]
    n_main = n // 32 * 32
    if n_main:
        s = reduce4x8(chain(w[..., :n_main], x[..., :n_main], 32, exact_products))
    else:
        s = (w[..., :1] * x[..., :1])[..., 0] * 0.0
    if n_main == n:
        return s
    if f16_tail:
        return (s.double() + (w[..., n_main:] * x[..., n_main:]).double().sum(-1)).float()
    for k in range(n_main, n):
        s = fma(w[..., k], x[..., k], s)
    return s


def dot_4x8(w: torch.Tensor, x: torch.Tensor, exact_products: bool = False) -> torch.Tensor:
    """ggml_vec_dot_f32 / f16's main part (the length a multiple of 32)."""
    return reduce4x8(chain(w, x, 32, exact_products))


def dot_lanes8(w: torch.Tensor, x: torch.Tensor, exact_products: bool = False) -> torch.Tensor:
    """tinyBLAS's dot (8 fma lanes, hsum8) over the whole steps of 8 of the last axis."""
    n8 = w.shape[-1] // 8 * 8
    return hsum8(chain(w[..., :n8], x[..., :n8], 8, exact_products))


# ---- norms, rope, softmax ----------------------------------------------------------------------------------

def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """ggml's rms_norm over the last axis, then the weight (numba's rms_norm_row): squares summed in float64,
    scale = 1 / sqrtf(mean + eps) in float32, (x * scale) * weight."""
    n = x.shape[-1]
    total = (x * x).double().sum(-1, keepdim=True)
    mean = div(total, float(n)).float()
    scale = div(torch.ones_like(mean), sqrt(mean + f32(eps)))
    out = x * scale
    return out if weight is None else out * weight


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
    """numba's rope_head on every head: the first 2 * cos.shape[-1] dims rotated in pairs, with fma. x: (T, heads,
    d) float32; cos, sin: (T, n_rot / 2)."""
    half = cos.shape[-1]
    if neox:
        a, b = x[..., :half], x[..., half:2 * half]
    else:
        a, b = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
    c, s = cos[:, None], sin[:, None]
    ra, rb = fma(a, c, -(b * s)), fma(a, s, b * c)
    rotated = torch.cat([ra, rb], -1) if neox else torch.stack([ra, rb], -1).flatten(-2)
    return torch.cat([rotated, x[..., 2 * half:]], -1)


def soft_max(w: torch.Tensor, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """ggml_soft_max over the last axis (numba's ops.soft_max): max m (with the sink, a logit that takes part
    in the max and the sum only), v_expf(w - m) on whole blocks of 8 and libm's expf on the rest, the blocks'
    hsum8 and the rest added in float64, then every value times float32(1 / sum). sinks: one per row (the
    leading axes), or None."""
    m = w.amax(-1)
    if sinks is not None:
        m = torch.maximum(m, sinks)
    n = w.shape[-1]
    n8 = n // 8 * 8
    shifted = w - m[..., None]
    main = v_expf(shifted[..., :n8])
    total = hsum8(main.reshape(main.shape[:-1] + (n8 // 8, 8))).double().sum(-1)
    parts = [main]
    if n8 < n:
        rest = expf(shifted[..., n8:])
        total = total + rest.double().sum(-1)
        parts.append(rest)
    if sinks is not None:
        total = total + expf(sinks - m).double()
    inv = div(torch.ones_like(total), total).float()
    e = torch.cat(parts, -1) if len(parts) > 1 else main
    return e * inv[..., None]
