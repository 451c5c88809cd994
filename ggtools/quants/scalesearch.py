"""ggml's scale searches for K-quant sub-blocks: make_qkx2_quants, make_qx_quants, make_q3_quants.

The C code tries a list of candidate scales one after another, each with its own sequential
sums. Here every candidate is a SIMD lane: the sums of all candidates advance together
element by element (each lane still adds in index order, so every sum is bit-identical), and the
winner is then picked in the C order with the C comparisons. That turns a latency-bound loop into
a throughput-bound one without changing a single bit. See quant-recipes.md §4-5.

`work` is caller-owned float32 scratch of shape (WORK_ROWS, LANES).
"""

import numpy as np
from numba import njit

from .floatbits import JIT, nearest_int

LANES = 24  # candidate scales per search (at most 21 used), padded to whole AVX2 vectors
WORK_ROWS = 8
GROUP_MAX_EPS = np.float32(1e-15)
F0 = np.float32(0.0)
F1 = np.float32(1.0)


@njit(**JIT)
def clamp(v, lo, hi):
    return max(lo, min(hi, v))


@njit(**JIT)
def make_qkx2_quants(n, nmax, x, xo, w, L, lo, rmin, rdelta, nstep, use_mad, work):
    """Scale + min search. Writes L[lo:lo+n], returns (scale, the_min)."""
    vmin = x[xo]
    vmax = x[xo]
    sum_w = w[0]
    sum_x = sum_w * x[xo]
    for i in range(1, n):
        v = x[xo + i]
        if v < vmin:
            vmin = v
        if v > vmax:
            vmax = v
        sum_w += w[i]
        sum_x += w[i] * v
    if vmin > F0:
        vmin = F0
    if vmax == vmin:
        for i in range(n):
            L[lo + i] = 0
        return F0, -vmin

    fnmax = np.float32(nmax)
    span = vmax - vmin
    iscale0 = fnmax / span
    scale = F1 / iscale0
    best = F0
    for i in range(n):
        l = clamp(nearest_int(iscale0 * (x[xo + i] - vmin)), 0, nmax)
        L[lo + i] = l
        diff = scale * np.float32(l) + vmin - x[xo + i]
        diff = abs(diff) if use_mad else diff * diff
        best += w[i] * diff

    iscale, sum_l, sum_l2, sum_xl = work[0], work[1], work[2], work[3]
    err, lane_scale, lane_min, det = work[4], work[5], work[6], work[7]
    for k in range(LANES):
        step = np.float32(min(k, nstep))
        iscale[k] = (rmin + rdelta * step + fnmax) / span
        sum_l[k] = F0
        sum_l2[k] = F0
        sum_xl[k] = F0
        err[k] = F0
    for i in range(n):
        xi = x[xo + i]
        dx = xi - vmin
        wi = w[i]
        for k in range(LANES):
            fl = np.float32(clamp(nearest_int(iscale[k] * dx), 0, nmax))
            wl = wi * fl
            sum_l[k] += wl
            sum_l2[k] += wl * fl
            sum_xl[k] += wl * xi
    for k in range(LANES):
        d = sum_w * sum_l2[k] - sum_l[k] * sum_l[k]
        det[k] = d
        s = (sum_w * sum_xl[k] - sum_x * sum_l[k]) / d
        m = (sum_l2[k] * sum_x - sum_l[k] * sum_xl[k]) / d
        if m > F0:
            m = F0
            s = sum_xl[k] / sum_l2[k]
        lane_scale[k] = s
        lane_min[k] = m
    if use_mad:
        _lane_errors_mad(n, nmax, x, xo, w, vmin, iscale, lane_scale, lane_min, err)
    else:
        _lane_errors_sq(n, nmax, x, xo, w, vmin, iscale, lane_scale, lane_min, err)

    chosen = -1
    for k in range(nstep + 1):
        if det[k] > F0 and err[k] < best:
            best = err[k]
            chosen = k
    if chosen >= 0:
        for i in range(n):
            L[lo + i] = clamp(nearest_int(iscale[chosen] * (x[xo + i] - vmin)), 0, nmax)
        scale = lane_scale[chosen]
        vmin = lane_min[chosen]
    return scale, -vmin


@njit(**JIT)
def _lane_errors_sq(n, nmax, x, xo, w, vmin, iscale, lane_scale, lane_min, err):
    for i in range(n):
        xi = x[xo + i]
        dx = xi - vmin
        wi = w[i]
        for k in range(LANES):
            fl = np.float32(clamp(nearest_int(iscale[k] * dx), 0, nmax))
            diff = lane_scale[k] * fl + lane_min[k] - xi
            err[k] += wi * (diff * diff)


@njit(**JIT)
def _lane_errors_mad(n, nmax, x, xo, w, vmin, iscale, lane_scale, lane_min, err):
    for i in range(n):
        xi = x[xo + i]
        dx = xi - vmin
        wi = w[i]
        for k in range(LANES):
            fl = np.float32(clamp(nearest_int(iscale[k] * dx), 0, nmax))
            diff = lane_scale[k] * fl + lane_min[k] - xi
            err[k] += wi * abs(diff)


@njit(**JIT)
def signed_absmax(x, xo, n):
    """(amax, value with that |value|), strict '>' so the first wins, NaNs skipped."""
    amax = F0
    vmax = F0
    for i in range(n):
        ax = abs(x[xo + i])
        if ax > amax:
            amax = ax
            vmax = x[xo + i]
    return amax, vmax


QX_STEPS = 19  # is = 0 (the first guess), then -9..-1, 1..9


@njit(**JIT)
def qx_step(k):
    """The C loop variable `is` tried by lane k of make_qx_quants."""
    if k == 0 or k >= QX_STEPS:
        return 0
    return k - 10 if k <= 9 else k - 9


@njit(**JIT)
def make_qx_quants(n, nmax, x, xo, L, lo, work):
    """Symmetric search (rmse_type 1, no quant weights). Writes L[lo:lo+n] (raw 0 for an
    all-zero group), returns the scale."""
    amax, vmax = signed_absmax(x, xo, n)
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[lo + i] = 0
        return F0
    fnmax = np.float32(nmax)
    iscale, sumlx, suml2 = work[0], work[1], work[2]
    for k in range(LANES):
        iscale[k] = -(fnmax + np.float32(0.1) * np.float32(qx_step(k))) / vmax
        sumlx[k] = F0
        suml2[k] = F0
    for i in range(n):
        xi = x[xo + i]
        wi = xi * xi
        wx = wi * xi
        for k in range(LANES):
            fl = np.float32(clamp(nearest_int(iscale[k] * xi), -nmax, nmax - 1))
            sumlx[k] += wx * fl
            suml2[k] += (wi * fl) * fl

    scale = sumlx[0] / suml2[0] if suml2[0] != F0 else F0
    best = scale * sumlx[0]
    chosen = 0
    for k in range(1, QX_STEPS):
        if suml2[k] > F0 and sumlx[k] * sumlx[k] > best * suml2[k]:
            scale = sumlx[k] / suml2[k]
            best = scale * sumlx[k]
            chosen = k
    for i in range(n):
        L[lo + i] = nmax + clamp(nearest_int(iscale[chosen] * x[xo + i]), -nmax, nmax - 1)
    return scale


@njit(**JIT)
def make_q3_quants(n, nmax, x, xo, L, lo):
    """make_q3_quants with do_rmse: coordinate descent, up to 5 rounds. Writes L[lo:lo+n]
    (raw 0 for an all-zero group, else l + nmax), returns the scale."""
    amax, vmax = signed_absmax(x, xo, n)
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[lo + i] = 0
        return F0
    iscale = np.float32(-nmax) / vmax
    sumlx = F0
    suml2 = F0
    for i in range(n):
        xi = x[xo + i]
        l = clamp(nearest_int(iscale * xi), -nmax, nmax - 1)
        L[lo + i] = l
        fl = np.float32(l)
        wi = xi * xi
        sumlx += (wi * xi) * fl
        suml2 += (wi * fl) * fl
    for _ in range(5):
        n_changed = 0
        for i in range(n):
            xi = x[xo + i]
            wi = xi * xi
            fl = np.float32(L[lo + i])
            slx = sumlx - (wi * xi) * fl
            if slx > F0:
                sl2 = suml2 - (wi * fl) * fl
                new_l = clamp(nearest_int((xi * sl2) / slx), -nmax, nmax - 1)
                if new_l != L[lo + i]:
                    fn = np.float32(new_l)
                    slx += (wi * xi) * fn
                    sl2 += (wi * fn) * fn
                    if sl2 > F0 and (slx * slx) * suml2 > (sumlx * sumlx) * sl2:
                        L[lo + i] = new_l
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    for i in range(n):
        L[lo + i] += nmax
    return sumlx / suml2 if suml2 > F0 else F0
