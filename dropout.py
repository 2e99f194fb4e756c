"""
The dropout operators of the paper, and nothing else.

Three placements are compared in the paper (Fig. 2), all built from the operators here:
- pre-norm dropout (PN-D, Eq. 6): standard inverted dropout on a sublayer's output before
  the residual add; the dropped vector then reaches the next RMSNorm (model.py, Block.forward).
- pre-linear dropout (PL-D): inverted dropout on the input of every linear projection of a
  block, one independent mask per projection: each sublayer of model.py and mamba.py holds one
  `pre_linear` operator and calls it on the input of each of its projections.
- VPAD, Variance-Preserving Affine Dropout, at the pre-linear sites.

VPAD IS A RECONSTRUCTION. The paper's VPAD formula was not available to us (only its name,
its purpose and Fig. 3). docs/vpad.md derives what we implement: affine dropout whose dropped
units take the per-token mean and whose kept ones are rescaled around it so that the token's
mean and variance are kept (vpad() below, variant A; the family of Klambauer et al. 2017's alpha
dropout), and what each operator does to the variance of a pre-activation (variance_error()).
Variants, all judged by the same variance probe (tools/probe_variance.py):
    B  per-feature statistics over the batch instead of per token (BatchNorm-style)
    C  inverted dropout, then exact per-token re-standardisation to the mean and std of x
    D  RMS-preserving: m*x * ||x|| / ||m*x||
Every operator is the identity in eval mode.
"""

import math

import torch
import torch.nn as nn

DROPOUT_TYPES = ('none', 'pre_norm', 'pre_linear', 'vpad')
VPAD_VARIANTS = ('A', 'B', 'C', 'D')


def dropout(x, p, training=True):
    """Inverted dropout: m * x / (1-p). The scale multiplies x * m as a Python float, which
    PyTorch applies in float32 even to a bf16 tensor: a bf16 mask scaled in place would hold
    1/(1-0.1) as 1.109375, and E[D(x)] would be 0.998 x under autocast."""
    if not training or p == 0.0:
        return x
    keep, p = keep_mask(x, p)
    return torch.mul(x, keep).mul_(1.0 / (1.0 - p))


def vpad(x, p, variant='A', training=True, eps=1e-6):
    """Variance-preserving affine dropout over the last dim of x (..., d).

    See the module docstring."""
    if not training or p == 0.0:
        return x
    keep, p = keep_mask(x, p)
    # dropped units take the mean, kept ones are scaled around it by 1/sqrt(1-p)
    if variant in ('A', 'B'):
        if variant == 'A':  # per-token mean
            mu = x.mean(-1, keepdim=True)  # (..., 1)
        else:  # per-feature mean over all tokens of the batch; detached, so that the statistics
            # (which mix positions of the same sequence) carry no gradient between tokens
            mu = x.detach().reshape(-1, x.shape[-1]).mean(0)  # (d,)
        # mu + m (x - mu) / sqrt(1-p)
        return torch.addcmul(mu, x - mu, keep, value=1.0 / math.sqrt(1.0 - p))
    if variant == 'C':  # dropout, then re-standardise to the realised per-token mean and std of x
        d = x * keep
        d = d - d.mean(-1, keepdim=True)
        return (d * (x.std(-1, keepdim=True) / (d.std(-1, keepdim=True) + eps))
                + x.mean(-1, keepdim=True))
    if variant == 'D':  # keep the per-token RMS (norm) of x
        d = x * keep
        return d * (x.norm(dim=-1, keepdim=True) / (d.norm(dim=-1, keepdim=True) + eps))
    raise ValueError(f"unknown vpad_variant {variant!r}; choose one of {VPAD_VARIANTS}")


def variance_error(dropout_type, p, r):
    """The relative error E[Var y'] / Var y - 1 that a pre-linear operator makes, in expectation
    over its mask, in a pre-activation y = W x of centred x (docs/vpad.md), where
    r = sum_ij W_ij^2 x_j^2 / ||W x||^2 (about 1 for weights without structure)."""
    if dropout_type == 'pre_linear':  # E||W D(x)||^2 = ||W x||^2 + p / (1-p) sum_ij W_ij^2 x_j^2
        return p / (1 - p) * r
    if dropout_type == 'vpad':  # E||W VPAD(x)||^2 = (1-p) ||W x||^2 + p sum_ij W_ij^2 x_j^2
        return p * (r - 1)
    raise ValueError(f"variance_error is for 'pre_linear' or 'vpad', got {dropout_type!r}")


def keep_mask(x, p):
    """A mask shaped and typed like x, 1 where a unit is kept and 0 where it is dropped, and the
    dropout rate it realises. On GPUs: rand >= p, which torch.compile fuses with its consumer into
    one kernel. On CPU the random numbers were most of what dropout cost, so one 64-bit draw serves
    four elements: 15 random bits each, compared with round(p * 2^15), written straight into the
    float mask. That realises p to within 2^-16; the operators scale by the realised rate, so they
    stay unbiased. Under torch.compile, on CPU too: rand >= p, since dynamo cannot trace random_
    into a view (a graph break per mask) and the compiled kernel draws the numbers in place."""
    if not 0 <= p < 1:
        raise ValueError(f"a dropout rate must be in [0, 1), got {p}")
    if x.device.type != 'cpu' or torch.compiler.is_compiling():
        return (torch.rand(x.shape, device=x.device) >= p).to(x.dtype), p
    threshold, n = round(p * 32768), x.numel()
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_()  # 63 random bits each
    # four numbers in [0, 2^15) per draw
    bits = bits.view(torch.int16)[:n].bitwise_and_(0x7FFF).view(x.shape)
    return torch.ge(bits, threshold, out=torch.empty_like(x)), threshold / 32768


class Dropout(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        return dropout(x, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}"


class VPAD(nn.Module):
    def __init__(self, p, variant='A'):
        super().__init__()
        if variant not in VPAD_VARIANTS:
            raise ValueError(f"unknown vpad_variant {variant!r}; choose one of {VPAD_VARIANTS}")
        self.p, self.variant = p, variant

    def forward(self, x):
        return vpad(x, self.p, self.variant, self.training)

    def extra_repr(self):
        return f"p={self.p}, variant={self.variant}"


def check(dropout_type, p, vpad_variant='A'):
    """User input: a ValueError (not an assert, which python -O skips) for an unknown type or
    VPAD variant, or a rate outside [0, 1)."""
    if dropout_type not in DROPOUT_TYPES:
        raise ValueError(f"unknown dropout_type {dropout_type!r}; choose one of {DROPOUT_TYPES}")
    if not 0 <= p < 1:
        raise ValueError(f"dropout must be in [0, 1), got {p}")
    if vpad_variant not in VPAD_VARIANTS:
        raise ValueError(f"unknown vpad_variant {vpad_variant!r}; choose one of {VPAD_VARIANTS}")


def pre_linear(dropout_type, p, vpad_variant='A'):
    """The operator at a pre-linear site: identity, inverted dropout (PL-D) or VPAD."""
    check(dropout_type, p, vpad_variant)
    if dropout_type == 'pre_linear' and p > 0:
        return Dropout(p)
    if dropout_type == 'vpad' and p > 0:
        return VPAD(p, vpad_variant)
    return nn.Identity()


# the types with an operator at the pre-linear sites (the variance mismatch's, Figure 3)
PRE_LINEAR = tuple(t for t in DROPOUT_TYPES if not isinstance(pre_linear(t, 0.1), nn.Identity))


def pre_norm(dropout_type, p):
    """The operator at the pre-norm site (a sublayer's output, before the residual add): PN-D or
    identity."""
    check(dropout_type, p)
    return Dropout(p) if dropout_type == 'pre_norm' and p > 0 else nn.Identity()
