"""
Fused causal attention in Triton for the two cases no library kernel covers: alpha-entmax
(ASEntmax, alpha = 1.5) and softmax with attention dropout, each with NAPE's per-head ALiBi bias,
a sliding window and queries at any offset into the keys. Forward and backward, FlashAttention's
plan (tiles of queries against tiles of keys, nothing of size T x T in memory).

- The bias is -m_h * (i - j), from the integer distance of the query's and the key's absolute
  positions times a float32 slope (0 for NAPE's NoPE heads): exact at any offset. Adding m_h * j
  alone, as softmax's shift invariance allows, errs by 3.5e-4 in the probabilities at 64K.
- entmax-1.5 (Peters et al. 2019; AdaSplash, Goncalves et al. 2025, for the plan of passes):
  p_ij = [z_ij/2 - tau_i]_+^2, with tau_i such that sum_j p_ij = 1. One pass takes the row max
  (tau >= max - 1). Then Newton's method from max - 1 on f(tau) = sum [x - tau]_+^2 - 1, convex
  and decreasing, so every iterate stays below tau; the same pass's support S gives the root of
  sum_S (x - tau)^2 = 1, which lies above tau (that quadratic is >= f from the iterate on) and
  equals it once S is the support (_entmax_tau). Passes stop when that bracket is within 1e-6;
  a last pass forms the output.
- Backward (entmax, Peters et al. 2019): dz = w * (dp - sum_j w_j dp_j / sum_j w_j), w = p^(1/2);
  the forward keeps o2 = sum_j w_ij v_j / sum_j w_ij, so that sum_j w dp / sum w = dO . o2
  (AdaSplash's trick, as FlashAttention's delta = dO . O for softmax).
- Attention dropout: Philox keep masks from (seed, the entry's index (b, h, i, j)), drawn again in
  the backward; the output is divided by 1-p in float32 (E[y] = the undropped y exactly; bf16
  scaling would bias it, see attention.flash_dropout).

Triton runs these on a CPU too, slowly, with TRITON_INTERPRET=1 set before this module is
imported: tests/test_attention_triton.py checks them there against float64.
"""

import os

import torch
import triton
import triton.language as tl

BLOCK = 64  # queries and keys per tile on a GPU; the interpreter takes 16
# ptxas for sm_90, bf16, 64 x 64 tiles: with 4 warps every kernel but dQ spills (84-304 bytes),
# with 8 only dK and dV under dropout (16-112 bytes); unmeasured on a GPU
NUM_WARPS = 8
N_ITER = 30  # the most Newton passes for tau (it stops earlier, see _entmax_tau)


@triton.jit
def _rows(X, offs, stride, offs_d, T):
    """A tile of rows offs of X (its row stride, D columns) -> (len(offs), D); rows past T load as
    zeros. Offsets in int64: a row offset (or X's batch and head offset, the callers') in int32
    wraps at 2^31 elements."""
    return tl.load(X + offs[:, None].to(tl.int64) * stride + offs_d[None, :],
                   mask=offs[:, None] < T, other=0.0)


@triton.jit
def _scores(q, k, offs_n, qpos, Tk, k_start, window, slope, sm_scale,
            HAS_BIAS: tl.constexpr, WINDOW: tl.constexpr, PRECISION: tl.constexpr):
    """The scores z = q k^T / sqrt(d) - m_h (i - j) of a tile, -inf where a key is masked:
    q (BM, D), the keys offs_n, k (BN, D) -> (BM, BN) float32."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale
    dist = qpos[:, None] - (k_start + offs_n[None, :])  # (BM, BN) int32: i - j, exact
    if HAS_BIAS:
        s = s - slope * dist.to(tl.float32)
    ok = (dist >= 0) & (offs_n[None, :] < Tk)
    if WINDOW:
        ok = ok & (dist < window)
    return tl.where(ok, s, float('-inf'))


@triton.jit
def _keep(seed, bh, offs_m, offs_n, Tq, Tk, p_drop):
    """The attention-dropout keep mask of a tile, from Philox at the entries' flat indices."""
    idx = (bh.to(tl.int64) * Tq + offs_m[:, None]) * Tk + offs_n[None, :]  # (BM, BN)
    return tl.rand(seed, idx) >= p_drop


@triton.jit
def _key_range(m0, q_start, k_start, Tk, window, WINDOW: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr):
    """The first and the end key index of the tiles a query tile m0.. may see (causal, window)."""
    hi = tl.minimum(Tk, q_start + m0 + BLOCK_M - k_start)
    lo = 0
    if WINDOW:
        lo = tl.maximum(0, q_start + m0 - window + 1 - k_start)
    return (lo // BLOCK_N) * BLOCK_N, hi


@triton.jit
def _entmax_tau(q, K, lo, hi, stride_kn, offs_d, qpos, Tk, k_start, window, slope, sm_scale,
                HAS_BIAS: tl.constexpr, WINDOW: tl.constexpr, PRECISION: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, N_ITER: tl.constexpr):
    """entmax-1.5's threshold tau of each row, x = z/2: the row max, then Newton's method from
    max - 1 until the bracket (Newton's iterate below tau, the root of the support's quadratic
    above) closes."""
    mx = tl.full((BLOCK_M,), float('-inf'), tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        x = 0.5 * _scores(q, _rows(K, offs_n, stride_kn, offs_d, Tk), offs_n, qpos, Tk, k_start,
                          window, slope, sm_scale, HAS_BIAS, WINDOW, PRECISION)
        mx = tl.maximum(mx, tl.max(x, 1))
    mx = tl.where(mx == float('-inf'), 0.0, mx)  # a row past the queries' end
    low = mx - 1.0  # the max's own entry gives sum >= 1 here
    high = mx
    gap = tl.max(high - low, 0)
    it = 0
    while (it < N_ITER) & (gap > 0):
        # over the support at `low`, in units u = tau - low: n, s1 = sum (x - low), s2 = sum ()^2
        n = tl.zeros((BLOCK_M,), tl.float32)
        s1 = tl.zeros((BLOCK_M,), tl.float32)
        s2 = tl.zeros((BLOCK_M,), tl.float32)
        for n0 in range(lo, hi, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            x = 0.5 * _scores(q, _rows(K, offs_n, stride_kn, offs_d, Tk), offs_n, qpos, Tk,
                              k_start, window, slope, sm_scale, HAS_BIAS, WINDOW, PRECISION)
            d = tl.maximum(x - low[:, None], 0.0)
            n += tl.sum((d > 0).to(tl.float32), 1)
            s1 += tl.sum(d, 1)
            s2 += tl.sum(d * d, 1)
        # the support's quadratic n u^2 - 2 s1 u + s2 - 1 = 0: its smaller root bounds tau above
        disc = s1 * s1 - n * (s2 - 1.0)
        root = (s1 - tl.sqrt(tl.maximum(disc, 0.0))) / tl.maximum(n, 1.0)
        high = tl.where(disc >= 0, tl.minimum(high, low + root), high)
        # Newton's step f / -f' with f = s2 - 1 >= 0, f' = -2 s1: below tau (f is convex)
        low = tl.minimum(low + (s2 - 1.0) / (2.0 * tl.maximum(s1, 1e-30)), high)
        # rows with no key (past the queries' end) do not hold the tile back
        gap = tl.max(tl.where(n > 0, high - low - 1e-6 * (1.0 + tl.abs(low)), 0.0), 0)
        it += 1
    return high


@triton.jit
def _fwd(Q, K, V, SL, SEED, O, O2, S1, S2,
         stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
         stride_vb, stride_vh, stride_vn, H, GROUP, Tq, Tk, q_start, k_start, window,
         sm_scale, p_drop,
         ENTMAX: tl.constexpr, HAS_BIAS: tl.constexpr, WINDOW: tl.constexpr,
         DROPOUT: tl.constexpr, PRECISION: tl.constexpr, D: tl.constexpr,
         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, N_ITER: tl.constexpr):
    """One tile of queries: O (and O2, entmax) (BM, D); the row statistics the backward needs,
    softmax: S1 = log-sum-exp; entmax: S1 = tau, S2 = sum_j [x - tau]_+^2 (1 up to rounding)."""
    m0 = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)  # (int64: so are the offsets made from b and h)
    b, h = bh // H, bh % H
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    qpos = q_start + offs_m
    q = _rows(Q + b * stride_qb + h * stride_qh, offs_m, stride_qm, offs_d, Tq)  # (BM, D)
    K = K + b * stride_kb + (h // GROUP) * stride_kh
    V = V + b * stride_vb + (h // GROUP) * stride_vh
    slope = tl.load(SL + h) if HAS_BIAS else 0.0
    seed = tl.load(SEED) if DROPOUT else 0
    lo, hi = _key_range(m0, q_start, k_start, Tk, window, WINDOW, BLOCK_M, BLOCK_N)
    if ENTMAX:
        tau = _entmax_tau(q, K, lo, hi, stride_kn, offs_d, qpos, Tk, k_start, window, slope,
                          sm_scale, HAS_BIAS, WINDOW, PRECISION, BLOCK_M, BLOCK_N, N_ITER)
        w_sum = tl.zeros((BLOCK_M,), tl.float32)
        acc2 = tl.zeros((BLOCK_M, D), tl.float32)
    else:
        m_i = tl.full((BLOCK_M,), float('-inf'), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        s = _scores(q, _rows(K, offs_n, stride_kn, offs_d, Tk), offs_n, qpos, Tk, k_start, window,
                    slope, sm_scale, HAS_BIAS, WINDOW, PRECISION)
        v = _rows(V, offs_n, stride_vn, offs_d, Tk)  # (BN, D)
        if ENTMAX:
            w = tl.maximum(0.5 * s - tau[:, None], 0.0)  # p^(1/2), unnormalised
            p = w * w
            w_sum += tl.sum(w, 1)
        else:  # online softmax: rescale what was summed to the new row max
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float('-inf'), 0.0, m_new)
            p = tl.exp(s - m_safe[:, None])
            corr = tl.exp(m_i - m_safe)
            l_i *= corr
            acc *= corr[:, None]
            m_i = m_new
        l_i += tl.sum(p, 1)
        if DROPOUT:
            keep = _keep(seed, bh, offs_m, offs_n, Tq, Tk, p_drop)
            p = tl.where(keep, p, 0.0)
            if ENTMAX:
                w = tl.where(keep, w, 0.0)
        acc += tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        if ENTMAX:
            acc2 += tl.dot(w.to(v.dtype), v, input_precision=PRECISION)
    scale = 1.0 / (1.0 - p_drop) if DROPOUT else 1.0
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    row = bh * Tq + offs_m
    out = row[:, None] * D + offs_d[None, :]
    tl.store(O + out, acc * (scale / l_safe)[:, None], mask=offs_m[:, None] < Tq)
    if ENTMAX:
        tl.store(O2 + out, acc2 * (scale / tl.where(w_sum > 0, w_sum, 1.0))[:, None],
                 mask=offs_m[:, None] < Tq)
        tl.store(S1 + row, tau, mask=offs_m < Tq)
        tl.store(S2 + row, l_safe, mask=offs_m < Tq)
    else:
        tl.store(S1 + row, tl.where(m_i == float('-inf'), 0.0, m_i) + tl.log(l_safe),
                 mask=offs_m < Tq)


@triton.jit
def _ds(s, dp, s1, s2, delta, keep, p_drop, ENTMAX: tl.constexpr, DROPOUT: tl.constexpr):
    """The tile's probabilities as dropout passes them on, (BM, BN), and the gradient of the
    scores z from dp = dO v^T."""
    if DROPOUT:
        dp = tl.where(keep, dp / (1.0 - p_drop), 0.0)
    if ENTMAX:
        w = tl.maximum(0.5 * s - s1[:, None], 0.0) / tl.sqrt(s2)[:, None]  # p^(1/2)
        p = w * w
        ds = w * (dp - delta[:, None])
    else:
        p = tl.exp(s - s1[:, None])
        ds = p * (dp - delta[:, None])
    if DROPOUT:
        p = tl.where(keep, p / (1.0 - p_drop), 0.0)
    return p, ds


@triton.jit
def _query_rows(Q, DO, S1, S2, DELTA, b, h, bh, offs_m, offs_d, stride_qb, stride_qh, stride_qm,
                stride_ob, stride_oh, stride_om, Tq, ENTMAX: tl.constexpr):
    """A tile of queries with what their backward needs: q and dO (BM, D), the forward's row
    statistics and delta (BM,); rows past the queries' end load as zeros."""
    in_q = offs_m < Tq
    q = _rows(Q + b * stride_qb + h * stride_qh, offs_m, stride_qm, offs_d, Tq)
    do = _rows(DO + b * stride_ob + h * stride_oh, offs_m, stride_om, offs_d, Tq)
    row = bh * Tq + offs_m
    s1 = tl.load(S1 + row, mask=in_q, other=0.0)
    s2 = tl.load(S2 + row, mask=in_q, other=1.0) if ENTMAX else s1
    delta = tl.load(DELTA + row, mask=in_q, other=0.0)
    return q, do, s1, s2, delta


@triton.jit
def _bwd_dkdv(Q, K, V, SL, SEED, DO, S1, S2, DELTA, DK, DV,
              stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
              stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
              H, GROUP, Tq, Tk, q_start, k_start, window, sm_scale, p_drop,
              ENTMAX: tl.constexpr, HAS_BIAS: tl.constexpr, WINDOW: tl.constexpr,
              DROPOUT: tl.constexpr, PRECISION: tl.constexpr, D: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One tile of keys: dK, dV (BN, D), summed over the query heads that share it (GQA)."""
    n0 = tl.program_id(0) * BLOCK_N
    bkv = tl.program_id(1).to(tl.int64)
    Hkv = H // GROUP
    b, hkv = bkv // Hkv, bkv % Hkv
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    # this program's keys and values, loaded once for every query tile and head of the group
    k = _rows(K + b * stride_kb + hkv * stride_kh, offs_n, stride_kn, offs_d, Tk)  # (BN, D)
    v = _rows(V + b * stride_vb + hkv * stride_vh, offs_n, stride_vn, offs_d, Tk)  # (BN, D)
    seed = tl.load(SEED) if DROPOUT else 0
    dk = tl.zeros((BLOCK_N, D), tl.float32)
    dv = tl.zeros((BLOCK_N, D), tl.float32)
    # the queries that may see these keys: from the first key's position, to the window's reach
    m_lo = tl.maximum(0, k_start + n0 - q_start)
    m_hi = Tq
    if WINDOW:
        m_hi = tl.minimum(Tq, k_start + n0 + BLOCK_N - 1 + window - q_start)
    for h in range(hkv * GROUP, hkv * GROUP + GROUP):
        bh = b * H + h
        slope = tl.load(SL + h) if HAS_BIAS else 0.0
        for m0 in range((m_lo // BLOCK_M) * BLOCK_M, m_hi, BLOCK_M):
            offs_m = m0 + tl.arange(0, BLOCK_M)
            q, do, s1, s2, delta = _query_rows(  # (BM, D) twice, (BM,) thrice
                Q, DO, S1, S2, DELTA, b, h, bh, offs_m, offs_d, stride_qb, stride_qh, stride_qm,
                stride_ob, stride_oh, stride_om, Tq, ENTMAX)
            s = _scores(q, k, offs_n, q_start + offs_m, Tk, k_start, window, slope, sm_scale,
                        HAS_BIAS, WINDOW, PRECISION)
            s = tl.where(offs_m[:, None] < Tq, s, float('-inf'))  # rows past the end: no part
            keep = _keep(seed, bh, offs_m, offs_n, Tq, Tk, p_drop) if DROPOUT else s > 0
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)  # (BM, BN)
            p, ds = _ds(s, dp, s1, s2, delta, keep, p_drop, ENTMAX, DROPOUT)
            dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION)
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
    out = (bkv * Tk + offs_n[:, None]) * D + offs_d[None, :]
    tl.store(DK + out, dk * sm_scale, mask=offs_n[:, None] < Tk)
    tl.store(DV + out, dv, mask=offs_n[:, None] < Tk)


@triton.jit
def _bwd_dq(Q, K, V, SL, SEED, DO, S1, S2, DELTA, DQ,
            stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
            stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
            H, GROUP, Tq, Tk, q_start, k_start, window, sm_scale, p_drop,
            ENTMAX: tl.constexpr, HAS_BIAS: tl.constexpr, WINDOW: tl.constexpr,
            DROPOUT: tl.constexpr, PRECISION: tl.constexpr, D: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One tile of queries: dQ (BM, D)."""
    m0 = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q, do, s1, s2, delta = _query_rows(  # (BM, D) twice, (BM,) thrice
        Q, DO, S1, S2, DELTA, b, h, bh, offs_m, offs_d, stride_qb, stride_qh, stride_qm,
        stride_ob, stride_oh, stride_om, Tq, ENTMAX)
    K = K + b * stride_kb + (h // GROUP) * stride_kh
    V = V + b * stride_vb + (h // GROUP) * stride_vh
    slope = tl.load(SL + h) if HAS_BIAS else 0.0
    seed = tl.load(SEED) if DROPOUT else 0
    dq = tl.zeros((BLOCK_M, D), tl.float32)
    lo, hi = _key_range(m0, q_start, k_start, Tk, window, WINDOW, BLOCK_M, BLOCK_N)
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        k = _rows(K, offs_n, stride_kn, offs_d, Tk)  # (BN, D), for the scores and for dQ
        v = _rows(V, offs_n, stride_vn, offs_d, Tk)  # (BN, D)
        s = _scores(q, k, offs_n, q_start + offs_m, Tk, k_start, window, slope, sm_scale,
                    HAS_BIAS, WINDOW, PRECISION)
        keep = _keep(seed, bh, offs_m, offs_n, Tq, Tk, p_drop) if DROPOUT else s > 0
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)  # (BM, BN)
        _, ds = _ds(s, dp, s1, s2, delta, keep, p_drop, ENTMAX, DROPOUT)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    row = bh * Tq + offs_m
    tl.store(DQ + row[:, None] * D + offs_d[None, :], dq * sm_scale, mask=offs_m[:, None] < Tq)


# -----------------------------------------------------------------------------
# the operator: opaque to torch.compile (one graph around it), with its own backward

def _launch_args(q, k, slopes, q_start, k_start, window, dropout_p, entmax):
    """The arguments every kernel shares, after the tensors and strides."""
    B, H, Tq, D = q.shape
    return dict(H=H, GROUP=H // k.size(1), Tq=Tq, Tk=k.size(2), q_start=q_start, k_start=k_start,
                window=window, sm_scale=D ** -0.5, p_drop=dropout_p, ENTMAX=entmax,
                HAS_BIAS=slopes is not None, WINDOW=window > 0, DROPOUT=dropout_p > 0,
                # fp32 inputs in true fp32 (TF32 would cost 1e-3); bf16 takes tensor cores
                PRECISION='ieee' if q.dtype == torch.float32 else 'tf32', D=D)


def _tile():
    # the interpreter: small and quick
    return 16 if os.environ.get('TRITON_INTERPRET') == '1' else BLOCK


def _last_dim_contiguous(*ts):
    return [t if t.stride(-1) == 1 else t.contiguous() for t in ts]


@torch.library.custom_op('lengthgen::fused_attention', mutates_args=())
def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slopes: torch.Tensor,
             seed: torch.Tensor, q_start: int, k_start: int, window: int, dropout_p: float,
             entmax: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v = _last_dim_contiguous(q, k, v)
    B, H, Tq, D = q.shape
    o = torch.empty(B, H, Tq, D, device=q.device, dtype=q.dtype)
    # entmax's o2 and s2 for the backward (softmax's delta takes o itself; s1 is its log-sum-exp)
    o2 = torch.empty(B, H, Tq, D if entmax else 0, device=q.device, dtype=torch.float32)
    s1 = torch.empty(B, H, Tq, device=q.device, dtype=torch.float32)
    s2 = torch.empty(B, H, Tq if entmax else 0, device=q.device, dtype=torch.float32)
    tile = _tile()
    args = _launch_args(q, k, slopes if slopes.numel() else None, q_start, k_start, window,
                        dropout_p, entmax)
    _fwd[(triton.cdiv(Tq, tile), B * H)](
        q, k, v, slopes, seed, o, o2, s1, s2, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
        **args, BLOCK_M=tile, BLOCK_N=tile, N_ITER=N_ITER, num_warps=NUM_WARPS)
    return o, o2, s1, s2


@_forward.register_fake
def _(q, k, v, slopes, seed, q_start, k_start, window, dropout_p, entmax):
    B, H, Tq, D = q.shape
    o2 = q.new_empty(B, H, Tq, D if entmax else 0, dtype=torch.float32)
    return (q.new_empty(B, H, Tq, D), o2, q.new_empty(B, H, Tq, dtype=torch.float32),
            q.new_empty(B, H, Tq if entmax else 0, dtype=torch.float32))


@torch.library.custom_op('lengthgen::fused_attention_backward', mutates_args=())
def _backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              delta: torch.Tensor, s1: torch.Tensor, s2: torch.Tensor, slopes: torch.Tensor,
              seed: torch.Tensor, q_start: int, k_start: int, window: int, dropout_p: float,
              entmax: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    do, q, k, v = _last_dim_contiguous(do, q, k, v)
    B, H, Tq, D = q.shape
    Hkv, Tk = k.size(1), k.size(2)
    dq = torch.empty(B, H, Tq, D, device=q.device, dtype=torch.float32)
    dk, dv = (torch.empty(B, Hkv, Tk, D, device=q.device, dtype=torch.float32) for _ in range(2))
    tile = _tile()
    args = _launch_args(q, k, slopes if slopes.numel() else None, q_start, k_start, window,
                        dropout_p, entmax)
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3])
    _bwd_dkdv[(triton.cdiv(Tk, tile), B * Hkv)](
        q, k, v, slopes, seed, do, s1, s2, delta, dk, dv, *strides, **args, BLOCK_M=tile,
        BLOCK_N=tile, num_warps=NUM_WARPS)
    _bwd_dq[(triton.cdiv(Tq, tile), B * H)](
        q, k, v, slopes, seed, do, s1, s2, delta, dq, *strides, **args, BLOCK_M=tile,
        BLOCK_N=tile, num_warps=NUM_WARPS)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


@_backward.register_fake
def _(do, q, k, v, delta, s1, s2, slopes, seed, q_start, k_start, window, dropout_p, entmax):
    # contiguous, as the real op returns them: not empty_like, whose copy of q's and k's
    # transposed strides (model.py's layout) Inductor's stride checks refuse at the backward
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, slopes, seed, *ctx.settings = inputs
    o, o2, s1, s2 = output
    entmax = ctx.settings[-1]
    ctx.save_for_backward(q, k, v, o2 if entmax else o, s1, s2, slopes, seed)


def _autograd_backward(ctx, do, *_):
    q, k, v, o, s1, s2, slopes, seed = ctx.saved_tensors
    # softmax: delta = dO . O; entmax: dO . o2 (the module's docstring)
    delta = (do.float() * o.float()).sum(-1)  # (B, H, Tq)
    dq, dk, dv = _backward(do, q, k, v, delta, s1, s2, slopes, seed, *ctx.settings)
    return dq, dk, dv, None, None, None, None, None, None, None


_forward.register_autograd(_autograd_backward, setup_context=_setup_context)


def fused_attention(q, k, v, q_start=0, k_start=0, slopes=None, window=0, dropout_p=0.0,
                    entmax=False):
    """attention.attention for softmax or entmax-1.5, in these kernels.
    q (B, H, Tq, hd), k and v (B, Hkv, Tk, hd), hd a power of two >= 16 -> (B, H, Tq, hd)"""
    # Philox's seed from torch's generator: seeded runs repeat, and a compiled graph draws it too
    seed = (torch.randint(2 ** 62, (1,), device=q.device) if dropout_p > 0
            else torch.zeros(1, dtype=torch.int64, device=q.device))
    slopes = (slopes.float() if slopes is not None
              else torch.zeros(0, dtype=torch.float32, device=q.device))
    return _forward(q, k, v, slopes, seed, q_start, k_start, window, float(dropout_p),
                    entmax)[0]
