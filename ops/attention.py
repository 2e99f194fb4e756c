"""
The attention operator of model.py and its backends, apart from the modules that call it: one
function, attention(), takes queries and keys at absolute positions with an ALiBi bias and a
window, and attention_kernel() alone chooses how to compute it:

- 'flash': SDPA's fused causal kernels (no bias, no window), FlashAttention-2's for attention
  dropout in half precision, made unbiased;
- 'sdpa': SDPA with an explicit mask and bias, queries in slices that bound the mask's size;
- 'flex': FlexAttention, a block mask and a score_mod (fused ALiBi and windows on CUDA);
- 'manual': the scores written out, normalised by softmax or alpha-entmax (ASEntmax; the sort-based
  entmax-1.5 and the bisection for any alpha), with attention dropout on the probabilities;
- 'triton': attention_triton.py's fused kernels on CUDA, for entmax-1.5 and for softmax with
  attention dropout, each with ALiBi, a window and offsets.
"""

import functools
import math
import warnings
from contextlib import nullcontext

import torch
import torch.nn.functional as F

try:  # FlexAttention: fused ALiBi and sliding windows on CUDA (forward only on CPU)
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # older torch
    flex_attention = None
fused_attention = None  # Triton's fused entmax-1.5 and attention-dropout kernels, on CUDA
if torch.cuda.is_available():  # (triton's import costs 0.3 s, at every start of every script)
    try:  # Triton 3.0 or later (tl.dot's input_precision)
        import triton
        if int(triton.__version__.split('.')[0]) < 3:
            raise ImportError(f"triton {triton.__version__} is older than 3.0")
        from ops.attention_triton import fused_attention
    except Exception as e:  # missing, too old, or broken: anything its import raises
        warnings.warn(f"the Triton kernels are off ({type(e).__name__}: {e}): entmax-1.5 and "
                      "attention dropout with a bias or a window take the written-out path "
                      "(slower, more memory)", stacklevel=2)

SCORE_ENTRIES = 2 ** 25  # the most scores (or mask entries) attention() materialises at once


def attention(q, k, v, *, q_start=0, k_start=0, slopes=None, window=0, dropout_p=0.0,
              backend='sdpa', alpha=1.0, record=None):
    """Causal attention of queries at absolute positions q_start.. over keys at k_start..,
    with the ALiBi bias -slopes[h] * (i - j) (slopes None: no bias) and, if window > 0, only
    the last `window` keys (the query's own included); normalised by softmax (alpha = 1) or
    alpha-entmax; dropout_p on the probabilities. backend: attn_backend of the config.
    record: a probe's callable, given the probabilities of every slice of queries in order,
    record(p) with p (B, H, rows, Tk) before attention dropout; it makes the scores written out.
    q (B, H, Tq, hd), k and v (B, Hkv, Tk, hd) -> (B, H, Tq, hd)"""
    kernel = 'manual' if record else attention_kernel(backend, q, k, q_start, k_start, slopes,
                                                      window, dropout_p, alpha)
    if kernel == 'triton':
        return fused_attention(q, k, v, q_start, k_start, slopes, window, dropout_p,
                               entmax=alpha == 1.5)
    if kernel == 'flex':
        return flex(q, k, v, q_start - k_start, slopes, window)
    if kernel == 'flash':
        if dropout_p > 0 and q.is_cuda and q.element_size() < 4:
            return flash_dropout(q, *repeat_kv(q, k, v), dropout_p)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p,
                                              enable_gqa=q.size(1) != k.size(1))
    # an explicit mask, or the scores written out: queries go in slices of `rows`, so that a long
    # input never holds T x T. A slice materialises the scores of every sequence and head where they
    # are written out (and in SDPA's math kernel, which CPU takes for attention dropout); else only
    # the mask that SDPA's fused kernels take as it is: (1, H, rows, Tk) with the bias, else
    # (rows, Tk)
    k, v = repeat_kv(q, k, v)  # SDPA takes GQA with a mask only in its math kernel: whole heads
    if kernel == 'manual' or (dropout_p > 0 and q.device.type == 'cpu'):
        per_row = q.size(0) * q.size(1) * k.size(2)
    else:
        per_row = (q.size(1) if slopes is not None else 1) * k.size(2)
    rows = max(1, SCORE_ENTRIES // per_row)
    slices = range(0, q.size(2), rows)
    if kernel == 'manual':
        return torch.cat([written_out(q[:, :, i:i + rows], k, v, q_start + i, k_start, slopes,
                                      window, dropout_p, alpha, record) for i in slices], dim=2)
    return torch.cat([masked_sdpa(q[:, :, i:i + rows], k, v, q_start + i, k_start, slopes, window,
                                  dropout_p) for i in slices], dim=2)


def flash_dropout(q, k, v, p):
    """Causal attention with dropout p in half precision through FlashAttention-2's kernel, made
    unbiased. The kernel keeps a probability where an 8-bit random number is at most
    floor(255 (1-p)) (1-p in float32: PyTorch's flash_api.cpp), so with probability
    (floor(255 (1-p)) + 1) / 256, but rescales by 1/(1-p): E[y] = 0.99826 v at p = 0.1 (an H100
    measured -1.7e-3). A keep rate of k/256 it realises exactly, and then
    rescales by its inverse; so the kernel gets the nearest such rate (p = 0.1: 26/256 =
    0.1015625), as dropout.keep_mask realises p to its own grain. A correction of the output
    instead would be lost: bf16 rounds 1.0017 y back to y. SDPA could pick another kernel with its
    own rounding, so this calls FlashAttention-2's itself."""
    # (B, H, T, hd)
    return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, flash_rate(p), True)[0]


def flash_rate(p):
    """The dropout rate nearest p (> 0) whose keep rate FlashAttention-2 realises exactly:
    1 - k/256."""
    return 1 - min(255, max(1, round(256 * (1 - p)))) / 256


def attention_kernel(backend, q, k, q_start, k_start, slopes, window, dropout_p, alpha,
                     cuda=None):
    """The one place that chooses how attention() computes: 'triton' (attention_triton.py, CUDA),
    'flex' (FlexAttention), 'flash' (SDPA's causal kernels), 'sdpa' (SDPA with an explicit mask)
    or 'manual' (the scores written out). backend 'manual' and 'sdpa' keep the unfused paths
    (the before of docs/performance.md). cuda: choose as on CUDA (None: where q is; the tests run
    CUDA's choices on the CPU, the Triton kernels interpreted)."""
    cuda = q.is_cuda if cuda is None else cuda
    # causal and nothing else
    plain = slopes is None and not window and q_start == k_start and q.size(2) == k.size(2)
    # the fused kernels take head sizes that are powers of two from 16 (a tile's dot product)
    fusable = (fused_attention is not None and cuda and backend == 'auto'
               and q.size(-1) in (16, 32, 64, 128, 256))
    if alpha != 1.0:  # entmax-1.5 fused with any bias, window and offset; other alphas bisect
        return 'triton' if fusable and alpha == 1.5 else 'manual'
    # auto: flex fuses ALiBi and windows on CUDA (it has no attention dropout; the config refuses
    # flex with it); attention dropout with a bias or a window goes to the Triton kernel
    auto_flex = (cuda and (slopes is not None or window) and dropout_p == 0
                 and flex_attention is not None)
    if backend == 'flex' or (backend == 'auto' and auto_flex):
        return 'flex'
    if fusable and dropout_p > 0 and not plain:
        return 'triton'
    if backend == 'manual':
        return 'manual'
    return 'flash' if plain else 'sdpa'


def repeat_kv(q, k, v):
    """Grouped-query k, v (B, Hkv, Tk, hd) repeated to q's heads: (B, H, Tk, hd) each."""
    rep = q.size(1) // k.size(1)
    return (k, v) if rep == 1 else (k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1))


def mask_and_bias(q_start, Tq, k_start, Tk, slopes, window, device):
    """The keys each query may see (Tq, Tk), and the ALiBi bias -m_h * distance (H, Tq, Tk) or
    None."""
    # float32 distances: exact below 2^24 positions, and half the memory of int64 ones
    f32 = dict(device=device, dtype=torch.float32)
    dist = (torch.arange(q_start, q_start + Tq, **f32)[:, None]
            - torch.arange(k_start, k_start + Tk, **f32))  # (Tq, Tk)
    allowed = (dist >= 0) & (dist < window) if window else dist >= 0
    return allowed, None if slopes is None else -slopes[:, None, None] * dist


def masked_sdpa(q, k, v, q_start, k_start, slopes, window, dropout_p):
    """SDPA with an explicit mask (and bias) for queries at q_start.. over keys at k_start.."""
    allowed, bias = mask_and_bias(q_start, q.size(2), k_start, k.size(2), slopes, window, q.device)
    # attention dropout in half precision on CUDA goes to float32 too: the fused kernel that takes a
    # mask scales the kept probabilities by 1/(1-p) in q's dtype (1.109375 in bf16 at p = 0.1, so
    # E[y] = 0.9984 v), exactly in float32
    half_dropout = dropout_p > 0 and q.is_cuda and q.element_size() < 4
    if bias is None and not half_dropout:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p)
    # the bias in float32, and so the attention: in bf16, m_h * distance would be off by up to 2^-9
    # of itself (0.03 at a distance of 100 with m_h = 1/16), and SDPA's kernels take a mask of q's
    # dtype (1, H, Tq, Tk): with a batch dim SDPA's fused CPU kernel takes the mask; a 3-d one sends
    # it to the math kernel (torch 2.13): the quick start's training step 1.3x slower, a 2048-token
    # forward 2x
    # (1, H, Tq, Tk) with the bias, else (Tq, Tk)
    mask = allowed if bias is None else bias.masked_fill(~allowed, float('-inf'))[None]
    # autocast would cast the inputs back to bf16
    with no_autocast(q.device):
        y = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask,
                                           dropout_p=dropout_p)
    return y.to(q.dtype)


def no_autocast(device):
    """autocast off on device (the meta device has none to switch off: hardware.dropout_bytes
    runs a model there)."""
    return nullcontext() if device.type == 'meta' else torch.autocast(device.type, enabled=False)


def written_out(q, k, v, q_start, k_start, slopes, window, dropout_p, alpha, record=None):
    """The scores in float32, masked, normalised by softmax or entmax (handed to record), dropped,
    times v."""
    allowed, bias = mask_and_bias(q_start, q.size(2), k_start, k.size(2), slopes, window, q.device)
    # scores in fp32: bf16 ones cost entmax 5x its error
    with no_autocast(q.device):
        scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, Tq, Tk)
    if bias is not None:
        scores = scores + bias
    scores = scores.masked_fill(~allowed, float('-inf'))
    p = scores.softmax(-1) if alpha == 1.0 else Entmax.apply(scores, alpha)  # (B, H, Tq, Tk)
    if record:
        record(p)
    # attention dropout, on the probabilities
    return F.dropout(p.to(v.dtype), dropout_p, training=dropout_p > 0) @ v


class Entmax(torch.autograd.Function):
    """alpha-entmax over the last dim (Peters et al. 2019):
    p_i = [(alpha-1) z_i - tau]_+^(1/(alpha-1)), tau such that sum p = 1; alpha = 1.5 exactly, by
    sorting, other alpha > 1 by bisection on tau. -inf entries get exactly 0, and so does all of
    the row past the support (sparse attention)."""

    @staticmethod
    def forward(ctx, z, alpha):
        p = entmax15(z) if alpha == 1.5 else entmax_bisect(z, alpha)
        ctx.save_for_backward(p)
        ctx.alpha = alpha
        return p

    @staticmethod
    def backward(ctx, g):
        # dp_i/dz_j = w_i delta_ij - w_i w_j / sum(w), w = p^(2-alpha) on the support, 0 off it
        p, = ctx.saved_tensors
        w = torch.where(p > 0, p ** (2 - ctx.alpha), 0.0)
        return w * (g - (g * w).sum(-1, keepdim=True) / w.sum(-1, keepdim=True)), None


def entmax15(z):
    """Exact entmax-1.5: with x = z/2 sorted descending, the support is the largest k whose
    threshold tau_k = mean_k - sqrt((1 - k (meansq_k - mean_k^2)) / k) lies below x_k."""
    x = z / 2
    x = x - x.max(-1, keepdim=True).values
    xs = x.sort(-1, descending=True).values
    k = torch.arange(1, x.size(-1) + 1, device=x.device, dtype=x.dtype)
    mean, meansq = xs.cumsum(-1) / k, (xs * xs).cumsum(-1) / k
    # nan past the -inf entries
    tau = mean - ((1 - k * (meansq - mean * mean)) / k).clamp(min=0).sqrt()
    support = (tau <= xs).sum(-1, keepdim=True)  # comparisons with nan are false
    return (x - tau.gather(-1, support - 1)).clamp(min=0) ** 2


def entmax_bisect(z, alpha, n_iter=50):
    """alpha-entmax by bisection on tau, between max - 1 (sum >= 1) and max - (1/d)^(alpha-1)
    (sum <= 1)."""
    x = z * (alpha - 1)
    top = x.max(-1, keepdim=True).values
    lo, hi = top - 1, top - (1 / x.size(-1)) ** (alpha - 1)
    for _ in range(n_iter):
        tau = (lo + hi) / 2
        above = (x - tau).clamp(min=0).pow(1 / (alpha - 1)).sum(-1, keepdim=True) >= 1
        lo, hi = torch.where(above, tau, lo), torch.where(above, hi, tau)
    p = (x - lo).clamp(min=0).pow(1 / (alpha - 1))
    return p / p.sum(-1, keepdim=True)


def flex(q, k, v, offset, slopes=None, window=0):
    """The same attention with FlexAttention (query i sits at key index i + offset): a block
    mask for causality and the window, a score_mod for ALiBi. Fused only when compiled: on CUDA
    through _compiled_flex() in eager code, or inside the caller's graph when the model is
    compiled."""
    compiling = torch.compiler.is_compiling()
    # the offset as a tensor for the compiled callable (a constant would recompile it per offset);
    # inside a compiled model, a plain number (a tensor made in the graph is no input the kernel can
    # take)
    offset_t = offset if compiling else offset_tensor(offset, q.device)
    score_mod = None
    if slopes is not None:
        # -m_h * (i - j) with the query's absolute index: without the offset, fp32 would carry
        # m_h * position
        def score_mod(score, b, h, qi, ki):
            return score - slopes[h] * (qi + offset_t - ki)
    fn = _compiled_flex() if q.is_cuda and not compiling else flex_attention
    mask = (block_mask.__wrapped__ if compiling else block_mask)(q.size(2), k.size(2), offset,
                                                                 window, q.device)
    return fn(q, k, v, score_mod=score_mod, block_mask=mask, enable_gqa=q.size(1) != k.size(1))


@functools.lru_cache(maxsize=16)
def block_mask(Tq, Tk, offset, window, device):
    """Causal (and windowed) block mask, built once per shape and offset in eager code (every
    layer and step reuses it). Inside a compiled region it is traced instead (dynamo ignores the
    cache), and built without its own torch.compile, which dynamo cannot trace (a graph break per
    layer)."""
    compiling = torch.compiler.is_compiling()
    offset_t = offset if compiling else offset_tensor(offset, device)

    def mask_mod(b, h, qi, ki):
        d = qi + offset_t - ki
        return (d >= 0) & (d < window) if window else d >= 0
    create = (_compiled_block_mask() if device.type == 'cuda' and not compiling
              else create_block_mask)
    return create(mask_mod, None, None, Tq, Tk, device=device)


@functools.lru_cache(maxsize=64)
def offset_tensor(offset, device):
    """The query offset as a 0-d tensor on the device, made once per offset (shared by every layer)
    and by a fill kernel: torch.tensor(offset, device='cuda') copies from the host and waits for
    it."""
    # a tensor that a later training step may also save for its backward
    with torch.inference_mode(False):
        return torch.full((), offset, device=device)


@functools.lru_cache(maxsize=1)
def _compiled_flex():
    # shapes dynamic after the first change (dynamo's default), offsets as tensors: a handful of
    # graphs serve every (B, Tq, Tk, offset). dynamic=False compiled one graph per shape and fell
    # back to the unfused kernel (the full score matrix) after dynamo's limit of 8.
    return torch.compile(flex_attention)


@functools.lru_cache(maxsize=1)
def _compiled_block_mask():
    # compiled, create_block_mask never builds the (Tq, Tk) mask it summarises (torch 2.13
    # deprecates its own _compile=True for this); the offset is a tensor, as for _compiled_flex()
    return torch.compile(create_block_mask)
