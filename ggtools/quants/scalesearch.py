"""ggml's scale searches for K-quant sub-blocks: make_qkx2_quants, make_qx_quants, make_q3_quants.

The C code runs long chains of dependent float additions (each sum strictly in index order),
which leaves a CPU mostly waiting. Here independent searches run side by side as SIMD lanes,
each lane still adding in index order, so every bit stays the same while the loops become
throughput-bound:
- make_qkx2_quants (Q2_K, Q4_K, Q5_K): lane = sub-block; a step's candidate depends on the
  min chosen by the previous accepted step, so the steps themselves stay sequential.
- make_qx_quants (Q6_K): lane = (candidate scale, sub-block), the 16 sub-blocks of a block at
  once (candidates are independent); the winner is then picked in the C order with the C
  comparisons, for every sub-block at once.
- make_q3_quants (Q3_K): lane = sub-block; coordinate descent, element by element.
See quant-recipes.md §4-5. Scratch arrays are caller-owned so kernels allocate once per group.
"""

import numpy as np
from numba import njit

from .floatbits import JIT, nearest_float, nearest_int

LANES = 24  # candidate scales per make_qx_quants search (19 used), padded to whole AVX2 vectors
GROUP_MAX_EPS = np.float32(1e-15)
F0 = np.float32(0.0)
F1 = np.float32(1.0)


@njit(**JIT)
def clamp(v, lo, hi):
    return max(lo, min(hi, v))


@njit(**JIT)
def clamp_float(v, lo, hi):
    v = lo if v < lo else v
    return hi if v > hi else v


@njit(**JIT)
def level(f, nmax):
    """float32(clamp(nearest_int(f), 0, nmax)) in vector-friendly form (nmax a float32)."""
    return clamp_float(nearest_float(f), F0, nmax)


@njit(**JIT)
def make_qkx2_quants(nmax, xt, wt, Lt, laux, rmin, rdelta, nstep, use_mad, st, scales, mins):
    """Scale + min search for many sub-blocks at once (sub-block j is lane j).

    xt, wt: (n, nsub) values and weights, element i of sub-block j at [i, j]. Writes the levels
    to Lt (n, nsub) and scales[j], mins[j] (the_min). laux: float32 scratch like Lt, a step's
    candidate levels (small integers, exact as floats: kept as floats, the step's error pass needs
    no conversion, which would keep its loop from vectorizing well); st: float32 scratch
    (QKX2_ROWS, >= nsub). Each step of the C loop depends on the min the previous
    accepted step chose, so steps stay sequential; the lanes are the independent sub-blocks.
    """
    n, nsub = xt.shape
    vmin, vmax, sum_w, sum_x = st[0], st[1], st[2], st[3]
    best, scale, iscale, sum_l = st[4], st[5], st[6], st[7]
    sum_l2, sum_xl, err, t_scale = st[8], st[9], st[10], st[11]
    t_min, det, usable = st[12], st[13], st[14]
    fnmax = np.float32(nmax)

    for j in range(nsub):
        vmin[j] = xt[0, j]
        vmax[j] = xt[0, j]
        sum_w[j] = wt[0, j]
        sum_x[j] = wt[0, j] * xt[0, j]
    for i in range(1, n):
        for j in range(nsub):
            v = xt[i, j]
            vmin[j] = v if v < vmin[j] else vmin[j]
            vmax[j] = v if v > vmax[j] else vmax[j]
            sum_w[j] += wt[i, j]
            sum_x[j] += wt[i, j] * v
    for j in range(nsub):
        vmin[j] = F0 if vmin[j] > F0 else vmin[j]
        usable[j] = F1 if vmax[j] != vmin[j] else F0  # max == min: all levels 0, scale 0
        iscale[j] = fnmax / (vmax[j] - vmin[j])
        scale[j] = F1 / iscale[j]
        best[j] = F0
    for i in range(n):
        for j in range(nsub):
            fl = level(iscale[j] * (xt[i, j] - vmin[j]), fnmax)
            Lt[i, j] = np.int32(fl)
            diff = scale[j] * fl + vmin[j] - xt[i, j]
            best[j] += wt[i, j] * (abs(diff) if use_mad else diff * diff)

    for step in range(nstep + 1):
        for j in range(nsub):
            iscale[j] = (rmin + rdelta * np.float32(step) + fnmax) / (vmax[j] - vmin[j])
            sum_l[j] = F0
            sum_l2[j] = F0
            sum_xl[j] = F0
            err[j] = F0
        for i in range(n):
            for j in range(nsub):
                fl = level(iscale[j] * (xt[i, j] - vmin[j]), fnmax)
                laux[i, j] = fl
                wl = wt[i, j] * fl
                sum_l[j] += wl
                sum_l2[j] += wl * fl
                sum_xl[j] += wl * xt[i, j]
        for j in range(nsub):
            det[j] = sum_w[j] * sum_l2[j] - sum_l[j] * sum_l[j]
            this_scale = (sum_w[j] * sum_xl[j] - sum_x[j] * sum_l[j]) / det[j]
            this_min = (sum_l2[j] * sum_x[j] - sum_l[j] * sum_xl[j]) / det[j]
            clipped = this_min > F0
            t_scale[j] = sum_xl[j] / sum_l2[j] if clipped else this_scale
            t_min[j] = F0 if clipped else this_min
        for i in range(n):
            for j in range(nsub):
                diff = t_scale[j] * laux[i, j] + t_min[j] - xt[i, j]
                err[j] += wt[i, j] * (abs(diff) if use_mad else diff * diff)
        accepted = 0
        for j in range(nsub):
            take = (usable[j] != F0) & (det[j] > F0) & (err[j] < best[j])
            accepted += take
            best[j] = err[j] if take else best[j]
            scale[j] = t_scale[j] if take else scale[j]
            vmin[j] = t_min[j] if take else vmin[j]
            det[j] = F1 if take else F0  # reused as the "take" mask below
        if accepted:
            for i in range(n):
                for j in range(nsub):
                    Lt[i, j] = np.int32(laux[i, j]) if det[j] != F0 else Lt[i, j]

    for j in range(nsub):
        scales[j] = scale[j] if usable[j] != F0 else F0
        mins[j] = -vmin[j]
    for i in range(n):
        for j in range(nsub):
            Lt[i, j] = Lt[i, j] if usable[j] != F0 else 0


QKX2_ROWS = 15


@njit(**JIT)
def signed_absmax_lanes(row, amax, vmax):
    """signed_absmax's step for one element of every lane (row[c] of lane c), strict '>' so the first wins.
    (A 1-D row: LLVM vectorizes this loop, not the same loop over xt[i, c] inside the loop nest.)"""
    for c in range(row.shape[0]):
        v = row[c]
        ax = abs(v)
        bigger = ax > amax[c]
        amax[c] = ax if bigger else amax[c]
        vmax[c] = v if bigger else vmax[c]


QX_STEPS = 19  # is = 0 (the first guess), then -9..-1, 1..9
QX_SUBS = 16   # sub-blocks searched at once (a Q6_K block), one SIMD lane each per candidate
QX_ROWS = 3    # work rows of LANES * QX_SUBS: iscale, sumlx, suml2
QX_SMALL_ROWS = 5   # work rows of QX_SUBS: amax, vmax, scale, best, chosen


@njit(**JIT)
def qx_step(k):
    """The C loop variable `is` tried by lane k of make_qx_quants."""
    if k == 0 or k >= QX_STEPS:
        return 0
    return k - 10 if k <= 9 else k - 9


@njit(**JIT)
def make_qx_quants(nmax, x, xo, L, xt, work, small, scales):
    """make_qx_quants (rmse_type 1, no quant weights) of the QX_SUBS sub-blocks of 16 values at x[xo:] at once:
    lane k * QX_SUBS + j is candidate scale k of sub-block j, each still summed in index order. Writes
    L[16j + i] (raw 0 for an all-zero sub-block) and scales[j]. xt: (16, QX_SUBS) float32 scratch; work:
    (QX_ROWS, LANES * QX_SUBS); small: (QX_SMALL_ROWS, QX_SUBS)."""
    n = 16
    for j in range(QX_SUBS):
        for i in range(n):
            xt[i, j] = x[xo + n * j + i]
    amax, vmax, scale, best, chosen = small[0], small[1], small[2], small[3], small[4]
    for j in range(QX_SUBS):
        amax[j] = F0
        vmax[j] = F0
    for i in range(n):
        signed_absmax_lanes(xt[i], amax, vmax)
    fnmax = np.float32(nmax)
    iscale, sumlx, suml2 = work[0], work[1], work[2]
    for k in range(LANES):
        step = fnmax + np.float32(0.1) * np.float32(qx_step(k))
        for j in range(QX_SUBS):
            iscale[k * QX_SUBS + j] = -step / vmax[j]
    for m in range(LANES * QX_SUBS):
        sumlx[m] = F0
        suml2[m] = F0
    for i in range(n):
        qx_sums(xt[i], iscale, sumlx, suml2, nmax)
    # the candidates in the C order, with the C comparisons: every sub-block at once
    for j in range(QX_SUBS):
        scale[j] = sumlx[j] / suml2[j] if suml2[j] != F0 else F0
        best[j] = scale[j] * sumlx[j]
        chosen[j] = F0
    for k in range(1, QX_STEPS):
        qx_pick(k, sumlx[k * QX_SUBS:(k + 1) * QX_SUBS], suml2[k * QX_SUBS:(k + 1) * QX_SUBS], scale, best, chosen)
    for j in range(QX_SUBS):
        usable = amax[j] >= GROUP_MAX_EPS
        scales[j] = scale[j] if usable else F0
        chosen_iscale = iscale[np.int64(chosen[j]) * QX_SUBS + j]
        for i in range(n):
            level = nmax + clamp(nearest_int(chosen_iscale * xt[i, j]), -nmax, nmax - 1)
            L[n * j + i] = level if usable else 0


@njit(**JIT)
def qx_sums(row, iscale, sumlx, suml2, nmax):
    """One element of every sub-block (row[j]) against every candidate scale: the sums of x^3 l and x^2 l^2.
    (Its own function over 1-D rows: LLVM vectorizes it.)"""
    nsub = row.shape[0]     # not QX_SUBS: a known count gets unrolled, not vectorized
    lo, hi = np.float32(-nmax), np.float32(nmax - 1)
    for k in range(LANES):
        for j in range(nsub):
            m = k * nsub + j
            xi = row[j]
            wi = xi * xi
            fl = clamp_float(nearest_float(iscale[m] * xi), lo, hi)
            sumlx[m] += (wi * xi) * fl
            suml2[m] += (wi * fl) * fl


@njit(**JIT)
def qx_pick(k, sumlx, suml2, scale, best, chosen):
    """Candidate k against the best so far, for every sub-block: C's `suml2 > 0 && sumlx^2 > best*suml2`."""
    for j in range(scale.shape[0]):     # not QX_SUBS: a known count gets unrolled, not vectorized
        take = (suml2[j] > F0) & (sumlx[j] * sumlx[j] > best[j] * suml2[j])
        new_scale = sumlx[j] / suml2[j]
        scale[j] = new_scale if take else scale[j]
        best[j] = new_scale * sumlx[j] if take else best[j]
        chosen[j] = np.float32(k) if take else chosen[j]


@njit(**JIT)
def make_q3_quants(nmax, xt, Lt, st, scales):
    """make_q3_quants with do_rmse for many sub-blocks at once (sub-block c is lane c, element i
    at xt[i, c]): coordinate descent, up to 5 rounds. Writes Lt (raw 0 for an all-zero group,
    else l + nmax) and scales[c]. st: float32 scratch (Q3_ROWS, >= lanes).

    The first round runs for all lanes at once; the C loop stops after a round without an
    accepted change, so only lanes that moved in round 1 continue, one by one.
    """
    n, lanes = xt.shape
    amax, vmax, iscale, sumlx, suml2, usable = st[0], st[1], st[2], st[3], st[4], st[5]
    lo = np.float32(-nmax)
    hi = np.float32(nmax - 1)
    for c in range(lanes):
        amax[c] = F0
        vmax[c] = F0
    for i in range(n):
        signed_absmax_lanes(xt[i], amax, vmax)
    for c in range(lanes):
        usable[c] = F1 if amax[c] >= GROUP_MAX_EPS else F0
        iscale[c] = np.float32(-nmax) / vmax[c]
        sumlx[c] = F0
        suml2[c] = F0
    for i in range(n):
        for c in range(lanes):
            x = xt[i, c]
            fl = clamp_float(nearest_float(iscale[c] * x), lo, hi)
            Lt[i, c] = np.int32(fl)
            w = x * x
            sumlx[c] += (w * x) * fl
            suml2[c] += (w * fl) * fl
    # Round 1 for all lanes side by side; the few lanes that moved go on alone (C's rounds 2-5).
    moved = st[6]
    for c in range(lanes):
        moved[c] = F0
    for i in range(n):
        q3_descent_step(xt, Lt, i, sumlx, suml2, usable, lo, hi, moved)
    for c in range(lanes):
        if moved[c] != F0:
            q3_more_rounds(xt, Lt, c, sumlx, suml2, lo, hi)
    for c in range(lanes):
        scale = sumlx[c] / suml2[c] if suml2[c] > F0 else F0
        scales[c] = scale if usable[c] != F0 else F0
    for i in range(n):
        for c in range(lanes):
            Lt[i, c] = Lt[i, c] + nmax if usable[c] != F0 else 0


Q3_ROWS = 7


@njit(**JIT)
def q3_descent_step(xt, Lt, i, sumlx, suml2, usable, lo, hi, moved):
    """make_q3_quants' try of a new level for element i of every lane; moved[c] = 1 where a
    lane accepts one. (Its own function: LLVM vectorizes it alone, not inside a loop nest.)"""
    lanes = xt.shape[1]
    for c in range(lanes):
        x = xt[i, c]
        w = x * x
        fl = np.float32(Lt[i, c])
        slx = sumlx[c] - (w * x) * fl
        sl2 = suml2[c] - (w * fl) * fl
        new = clamp_float(nearest_float((x * sl2) / slx), lo, hi)
        slx_new = slx + (w * x) * new
        sl2_new = sl2 + (w * new) * new
        take = ((usable[c] != F0) & (slx > F0) & (new != fl) & (sl2_new > F0)
                & ((slx_new * slx_new) * suml2[c] > (sumlx[c] * sumlx[c]) * sl2_new))
        moved[c] = F1 if take else moved[c]
        Lt[i, c] = np.int32(new) if take else Lt[i, c]
        sumlx[c] = slx_new if take else sumlx[c]
        suml2[c] = sl2_new if take else suml2[c]


@njit(**JIT)
def q3_more_rounds(xt, Lt, c, sumlx, suml2, lo, hi):
    """Rounds 2-5 of make_q3_quants for lane c alone, stopping after a round without change."""
    n = xt.shape[0]
    for _ in range(4):
        changed = False
        for i in range(n):
            x = xt[i, c]
            w = x * x
            fl = np.float32(Lt[i, c])
            slx = sumlx[c] - (w * x) * fl
            if slx > F0:
                sl2 = suml2[c] - (w * fl) * fl
                new = clamp_float(nearest_float((x * sl2) / slx), lo, hi)
                if new != fl:
                    slx += (w * x) * new
                    sl2 += (w * new) * new
                    if sl2 > F0 and (slx * slx) * suml2[c] > (sumlx[c] * sumlx[c]) * sl2:
                        Lt[i, c] = np.int32(new)
                        sumlx[c] = slx
                        suml2[c] = sl2
                        changed = True
        if not changed:
            return
