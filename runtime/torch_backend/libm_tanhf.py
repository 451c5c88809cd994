"""glibc's tanhf (what ggml's tanh op calls, and numba's np.tanh on float32) in torch float32 operations, for
kimi-k3's situ activation: bit for bit on the CPU and on CUDA, vectorized.

glibc 2.36's tanhf is fdlibm's float version (sysdeps/ieee754/flt-32/s_tanhf.c) over its expm1f (s_expm1f.c):
float32 arithmetic with branches on the argument, not the correctly rounded tanh (which differs from it on about a
third of random inputs). Both are written here branch for branch, each branch computed for every value and
selected with `where`; every operation is one float32 rounding (torch runs each as its own kernel, a division
takes a tensor divisor).
"""

import torch

F32, I32 = torch.float32, torch.int32

LN2_HI, LN2_LO, INV_LN2 = 6.9313812256e-01, 9.0580006145e-06, 1.4426950216e+00
EXPM1_Q = (-3.3333335072e-02, 1.5873016091e-03, -7.9365076090e-05, 4.0082177293e-06, -2.0109921195e-07)


def _c(x: torch.Tensor, v: float) -> torch.Tensor:
    """v as a float32 tensor shaped like x (the operand every float32 operation below takes)."""
    return torch.full_like(x, v)


def _scale2(y: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """y with k added to its exponent (SET_FLOAT_WORD(y, i + (k << 23)))."""
    return (y.view(I32) + (k << 23)).view(F32)


def expm1f(x: torch.Tensor) -> torch.Tensor:
    """fdlibm's expm1f for finite x below its overflow threshold (what tanhf gives it: |x| < 44)."""
    hx = x.view(I32) & 0x7FFFFFFF
    negative = x < 0
    one = _c(x, 1.0)
    # argument reduction: k = 0 (|x| <= ln2 / 2), +-1 (|x| < 1.5 ln2), else round(x / ln2)
    near = hx < 0x3F851592
    kf = (_c(x, INV_LN2) * x + torch.where(negative, _c(x, -0.5), _c(x, 0.5))).to(I32)
    k = torch.where(hx <= 0x3EB17218, torch.zeros_like(kf),
                    torch.where(near, torch.where(negative, -1, 1).to(I32), kf)).to(I32)
    t = k.to(F32)
    hi = torch.where(near, torch.where(negative, x + LN2_HI, x - LN2_HI), x - t * _c(x, LN2_HI))
    lo = torch.where(near, torch.where(negative, _c(x, -LN2_LO), _c(x, LN2_LO)), t * _c(x, LN2_LO))
    reduced = k != 0
    r = torch.where(reduced, hi - lo, x)
    c = torch.where(reduced, (hi - r) - lo, torch.zeros_like(x))
    # x in the primary range
    hfx = _c(x, 0.5) * r
    hxs = r * hfx
    q1, q2, q3, q4, q5 = (_c(x, q) for q in EXPM1_Q)
    r1 = one + hxs * (q1 + hxs * (q2 + hxs * (q3 + hxs * (q4 + hxs * q5))))
    t = _c(x, 3.0) - r1 * hfx
    e = hxs * ((r1 - t) / (_c(x, 6.0) - r * t))
    k0 = r - (r * e - hxs)
    e = (r * (e - c) - c) - hxs
    k_minus1 = _c(x, 0.5) * (r - e) - _c(x, 0.5)
    k_plus1 = torch.where(r < -0.25, _c(x, -2.0) * (e - (r + _c(x, 0.5))), one + _c(x, 2.0) * (r - e))
    far = _scale2(one - (e - r), k) - one                               # k <= -2 or k > 56
    k_small = k.clamp(0, 22)
    t_small = (torch.full_like(k, 0x3F800000) - (torch.full_like(k, 0x1000000) >> k_small)).view(F32)  # 1 - 2^-k
    mid_small = _scale2(t_small - (e - r), k)                          # 2 <= k < 23
    t_large = ((0x7F - k.clamp(23, 127)) << 23).view(F32)             # 2^-k
    mid_large = _scale2((r - (e + t_large)) + one, k)                  # 23 <= k <= 56
    out = torch.where(k <= -2, far, torch.where(k > 56, far, torch.where(k < 23, mid_small, mid_large)))
    out = torch.where(k == 1, k_plus1, out)
    out = torch.where(k == -1, k_minus1, out)
    out = torch.where(k == 0, k0, out)
    return torch.where(hx < 0x33000000, x, out)                        # |x| < 2^-25: x itself


def tanhf(x: torch.Tensor) -> torch.Tensor:
    """fdlibm's tanhf: 1 - 2 / (expm1f(2|x|) + 2) for |x| >= 1, -t / (t + 2) with t = expm1f(-2|x|) below, +-1
    from 22 on, x itself below 2^-55 (and at 0), the sign of x."""
    ax = x.abs()
    ix = ax.view(I32)
    two = _c(x, 2.0)
    big = ix >= 0x3F800000
    t = expm1f(torch.where(big, two * ax.clamp(max=22.0), _c(x, -2.0) * ax))
    z = torch.where(big, _c(x, 1.0) - two / (t + two), -t / (t + two))
    z = torch.where(ix >= 0x41B00000, _c(x, 1.0), z)
    z = torch.where(x < 0, -z, z)
    return torch.where((ix < 0x24000000) | torch.isnan(x), x, z)
