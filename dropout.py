"""
The dropout operators of the paper, and nothing else.

Three placements are compared in the paper (Fig. 2), all built from the operators here:
- pre-norm dropout (PN-D, Eq. 6): standard inverted dropout on a sublayer's output before
  the residual add; the dropped vector then reaches the next RMSNorm (model.py, Block.forward).
- pre-linear dropout (PL-D): inverted dropout on the input of every linear projection
  (Linear below, used by model.py and mamba.py), one independent mask per projection.
- VPAD, Variance-Preserving Affine Dropout, at the pre-linear sites.

VPAD IS A RECONSTRUCTION. The paper's VPAD formula was not available to us (only its name,
its purpose and Fig. 3). What we implement (../shared/reference/paper-notes.md §1.4):
for one token's input x in R^d to a linear layer W, inverted dropout D(x) = m*x/(1-p) with
m_i ~ Bernoulli(1-p) keeps E[Wx] but inflates the pre-activation variance,
    E||W D(x)||^2 = ||Wx||^2 + p/(1-p) * sum_ij W_ij^2 x_j^2      (~ 1/(1-p) for isotropic W).
"Affine" dropout sets dropped units to a constant c instead of 0 and rescales, z = a*(m*x + (1-m)*c) + b.
Asking that the per-token mean mu and variance sigma^2 of x be preserved, with c = mu, gives
a = 1/sqrt(1-p), b = (1-a)*mu, i.e.
    VPAD(x) = mu + m * (x - mu) / sqrt(1-p),        mu = mean_i x_i (per token)        (variant A)
Then E||W VPAD(x)||^2 = (1-p)||Wx||^2 + p * sum_ij W_ij^2 x_j^2 for centred x: exact for
isotropic W, where PL-D is off by p/(1-p). With torch's alpha-dropout constants this is the same
family (Klambauer et al. 2017). Variants, all judged by the same variance probe:
    B  per-feature statistics over the batch instead of per token (BatchNorm-style)
    C  inverted dropout, then exact per-token re-standardisation to the mean and std of x
    D  RMS-preserving: m*x * ||x|| / ||m*x||
Every operator is the identity in eval mode.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

DROPOUT_TYPES = ('none', 'pre_norm', 'pre_linear', 'vpad')
VPAD_VARIANTS = ('A', 'B', 'C', 'D')


def keep_mask(x, p, scale=1.0):
    """scale * m with m_i ~ Bernoulli(1-p), shaped and typed like x. rand >= p is about twice as
    fast on CPU as bernoulli_; drawn in float32 so that p stays exact under bf16."""
    keep = torch.rand(x.shape, device=x.device) >= p
    return (keep * scale).to(x.dtype)


def dropout(x, p, training=True):
    """Inverted dropout: m * x / (1-p)."""
    if not training or p == 0.0:
        return x
    return x * keep_mask(x, p, 1.0 / (1.0 - p))


def vpad(x, p, variant='A', training=True, eps=1e-6):
    """Variance-preserving affine dropout over the last dim of x (..., d). See the module docstring."""
    if not training or p == 0.0:
        return x
    if variant == 'A':  # per-token mean; dropped units take the mean, kept ones are scaled around it
        mu = x.mean(-1, keepdim=True)  # (..., 1)
        return mu + (x - mu) * keep_mask(x, p, 1.0 / math.sqrt(1.0 - p))
    if variant == 'B':  # per-feature mean over all tokens of the batch; detached, so that the
        # statistics (which mix positions of the same sequence) carry no gradient between tokens
        mu = x.detach().reshape(-1, x.shape[-1]).mean(0)  # (d,)
        return mu + (x - mu) * keep_mask(x, p, 1.0 / math.sqrt(1.0 - p))
    if variant == 'C':  # dropout, then re-standardise to the realised per-token mean and std of x
        d = x * keep_mask(x, p)
        d = d - d.mean(-1, keepdim=True)
        return d * (x.std(-1, keepdim=True) / (d.std(-1, keepdim=True) + eps)) + x.mean(-1, keepdim=True)
    if variant == 'D':  # keep the per-token RMS (norm) of x
        d = x * keep_mask(x, p)
        return d * (x.norm(dim=-1, keepdim=True) / (d.norm(dim=-1, keepdim=True) + eps))
    raise ValueError(f"unknown vpad_variant {variant!r}; choose one of {VPAD_VARIANTS}")


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
        assert variant in VPAD_VARIANTS, f"unknown vpad_variant {variant!r}; choose one of {VPAD_VARIANTS}"
        self.p, self.variant = p, variant

    def forward(self, x):
        return vpad(x, self.p, self.variant, self.training)

    def extra_repr(self):
        return f"p={self.p}, variant={self.variant}"


def pre_linear(dropout_type, p, vpad_variant='A'):
    """The operator at a pre-linear site: identity, inverted dropout (PL-D) or VPAD."""
    assert dropout_type in DROPOUT_TYPES, f"unknown dropout_type {dropout_type!r}; choose one of {DROPOUT_TYPES}"
    if dropout_type == 'pre_linear' and p > 0:
        return Dropout(p)
    if dropout_type == 'vpad' and p > 0:
        return VPAD(p, vpad_variant)
    return nn.Identity()


def pre_norm(dropout_type, p):
    """The operator at the pre-norm site (a sublayer's output, before the residual add): PN-D or identity."""
    assert dropout_type in DROPOUT_TYPES, f"unknown dropout_type {dropout_type!r}; choose one of {DROPOUT_TYPES}"
    return Dropout(p) if dropout_type == 'pre_norm' and p > 0 else nn.Identity()


class Linear(nn.Linear):
    """A projection of a block with the pre-linear site on its input (Fig. 2, right): identity,
    PL-D or VPAD, an independent mask per projection. config: any object with bias,
    dropout_type, dropout and vpad_variant (the transformer's and Mamba2's configs)."""

    def __init__(self, in_features, out_features, config):
        super().__init__(in_features, out_features, bias=config.bias)
        self.pre_linear = pre_linear(config.dropout_type, config.dropout, config.vpad_variant)

    def forward(self, x):
        return F.linear(self.pre_linear(x), self.weight, self.bias)

