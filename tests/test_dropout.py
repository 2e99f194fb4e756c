"""The dropout operators: their statistics, and the identity in eval mode."""

import math

import pytest
import torch
import torch.nn as nn

from dropout import VPAD, Dropout, dropout, pre_linear, pre_norm, vpad


def tokens(n=4096, d=512, seed=0):
    """Tokens with their own mean and scale: x_t = mu_t + s_t * z, z ~ N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(n, 1, generator=g)
    s = torch.rand(n, 1, generator=g) + 0.5
    return mu + s * torch.randn(n, d, generator=g)


@pytest.mark.parametrize('p', [0.1, 0.3])
def test_vpad_keeps_per_token_mean_and_variance(p):
    torch.manual_seed(0)
    x = tokens()
    y = vpad(x, p)
    assert not torch.equal(x, y)
    # per token, the mean and the variance are kept in expectation: averaged over tokens the
    # ratios are 1 (the noise of one token's estimate is ~ sqrt(p/d), averaged over 4096 tokens)
    mean_err = (y.mean(-1) - x.mean(-1)) / x.std(-1)
    assert mean_err.mean().abs() < 3e-3 and mean_err.std() < 0.05
    assert (y.var(-1) / x.var(-1)).mean().item() == pytest.approx(1.0, abs=0.01)
    # while inverted dropout inflates the centred second moment by about 1/(1-p)
    d = dropout(x, p)
    centred = lambda v, ref: ((v - ref.mean(-1, keepdim=True)) ** 2).mean(-1)  # noqa: E731
    assert (centred(d, x) / centred(x, x)).mean().item() > 1 + 0.5 * p


@pytest.mark.parametrize('p', [0.1, 0.2, 0.3])
def test_preactivation_variance_before_a_linear(p):
    """Inverted dropout before an isotropic linear inflates Var[Wx] by 1/(1-p); VPAD keeps it
    (paper-notes §1.4: E||W VPAD(x)||^2 = (1-p)||Wx||^2 + p sum W^2 x^2 = ||Wx||^2 when r = 1)."""
    torch.manual_seed(0)
    x = torch.randn(4096, 256)  # zero-mean tokens: the regime of the derivation
    W = torch.randn(256, 256) / 16
    var = lambda v: (v @ W.T).var().item()  # noqa: E731
    assert var(dropout(x, p)) / var(x) == pytest.approx(1 / (1 - p), rel=0.02)
    assert var(vpad(x, p)) / var(x) == pytest.approx(1.0, rel=0.02)


def test_variants():
    torch.manual_seed(0)
    x, p = tokens(n=512), 0.2
    # C re-standardises exactly: every token keeps its realised mean and std
    c = vpad(x, p, 'C')
    torch.testing.assert_close(c.mean(-1), x.mean(-1), atol=1e-4, rtol=0)
    torch.testing.assert_close(c.std(-1), x.std(-1), atol=1e-4, rtol=1e-4)
    # D keeps every token's norm exactly
    torch.testing.assert_close(vpad(x, p, 'D').norm(dim=-1), x.norm(dim=-1))
    # B: per-feature mean and variance over the batch, in expectation
    b = vpad(x, p, 'B')
    assert (b.mean(0) - x.mean(0)).abs().mean() < 0.05
    assert (b.var(0) / x.var(0)).mean().item() == pytest.approx(1.0, abs=0.03)
    # A: dropped units take the token's mean exactly
    torch.manual_seed(1)
    a = vpad(x, p, 'A')
    torch.manual_seed(1)
    keep = torch.rand(x.shape) >= p
    mu = x.mean(-1, keepdim=True).expand_as(x)
    torch.testing.assert_close(a[~keep], mu[~keep])
    torch.testing.assert_close(a[keep], (mu + (x - mu) / math.sqrt(1 - p))[keep])
    with pytest.raises(ValueError, match='vpad_variant'):
        vpad(x, p, 'Z')


@pytest.mark.parametrize('op', [Dropout(0.3), VPAD(0.3, 'A'), VPAD(0.3, 'B'), VPAD(0.3, 'C'), VPAD(0.3, 'D'),
                                pre_linear('vpad', 0.3), pre_linear('pre_linear', 0.3), pre_norm('pre_norm', 0.3)])
def test_identity_in_eval_mode_only(op):
    x = tokens(n=8, d=64)
    assert not torch.equal(op.train()(x), x)
    assert torch.equal(op.eval()(x), x)


def test_site_operators():
    assert isinstance(pre_linear('pre_linear', 0.1), Dropout) and isinstance(pre_linear('vpad', 0.1), VPAD)
    for t in ('none', 'pre_norm'):
        assert isinstance(pre_linear(t, 0.1), nn.Identity)
    for t in ('none', 'pre_linear', 'vpad'):
        assert isinstance(pre_norm(t, 0.1), nn.Identity)
    assert isinstance(pre_linear('vpad', 0.0), nn.Identity)
    with pytest.raises(AssertionError, match='dropout_type'):
        pre_linear('pre-linear', 0.1)


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_inverted_dropout(dtype):
    torch.manual_seed(0)
    y = dropout(torch.ones(1000, 1000, dtype=dtype), 0.3)
    assert y.dtype == dtype
    assert (y == 0).float().mean().item() == pytest.approx(0.3, abs=0.002)
    assert y[y != 0].float().unique().tolist() == pytest.approx([1 / 0.7], rel=1e-2)
    assert y.float().mean().item() == pytest.approx(1.0, abs=0.005)
