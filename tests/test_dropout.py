"""The dropout operators: their statistics, and the identity in eval mode."""

import math
import re

import pytest
import torch
import torch.nn as nn

from ops import attention
from dropout import VPAD, Dropout, keep_mask, dropout, pre_linear, pre_norm, variance_error, vpad
from mamba import Mamba2, Mamba2Config
from model import Transformer, TransformerConfig
from tools.variance import pre_norm_drift, projections, variance_mismatch


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
    (docs/vpad.md); variance_error() predicts both from r = sum_ij W_ij^2 x_j^2 / ||W x||^2."""
    torch.manual_seed(0)
    x = torch.randn(4096, 256)  # zero-mean tokens: the regime of the derivation
    W = torch.randn(256, 256) / 16
    var = lambda v: (v @ W.T).var().item()  # noqa: E731
    assert var(dropout(x, p)) / var(x) == pytest.approx(1 / (1 - p), rel=0.02)
    assert var(vpad(x, p)) / var(x) == pytest.approx(1.0, rel=0.02)
    r = ((x * x) @ (W * W).T).sum().item() / (x @ W.T).pow(2).sum().item()
    for kind, op in (('pre_linear', dropout), ('vpad', vpad)):
        assert var(op(x, p)) / var(x) - 1 == pytest.approx(variance_error(kind, p, r),
                                                           abs=0.02 * (1 + 2 * p)), kind


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
    keep, rate = keep_mask(x, p)
    keep = keep.bool()
    mu = x.mean(-1, keepdim=True).expand_as(x)
    torch.testing.assert_close(a[~keep], mu[~keep])
    torch.testing.assert_close(a[keep], (mu + (x - mu) / math.sqrt(1 - rate))[keep])
    with pytest.raises(ValueError, match='vpad_variant'):
        vpad(x, p, 'Z')


@pytest.mark.parametrize('op', [Dropout(0.3), VPAD(0.3, 'A'), VPAD(0.3, 'B'), VPAD(0.3, 'C'),
                                VPAD(0.3, 'D'), pre_linear('vpad', 0.3),
                                pre_linear('pre_linear', 0.3), pre_norm('pre_norm', 0.3)])
def test_identity_in_eval_mode_only(op):
    x = tokens(n=8, d=64)
    assert not torch.equal(op.train()(x), x)
    assert torch.equal(op.eval()(x), x)


def test_site_operators():
    assert (isinstance(pre_linear('pre_linear', 0.1), Dropout)
            and isinstance(pre_linear('vpad', 0.1), VPAD))
    for t in ('none', 'pre_norm'):
        assert isinstance(pre_linear(t, 0.1), nn.Identity)
    for t in ('none', 'pre_linear', 'vpad'):
        assert isinstance(pre_norm(t, 0.1), nn.Identity)
    assert isinstance(pre_linear('vpad', 0.0), nn.Identity)
    # a ValueError: python -O does not skip it
    with pytest.raises(ValueError, match='dropout_type'):
        pre_linear('pre-linear', 0.1)
    for p in (-0.1, 1.0):
        with pytest.raises(ValueError, match=r'dropout must be in \[0, 1\)'):
            pre_norm('pre_norm', p)


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_inverted_dropout(dtype):
    torch.manual_seed(0)
    y = dropout(torch.ones(1000, 1000, dtype=dtype), 0.3)
    assert y.dtype == dtype
    assert (y == 0).float().mean().item() == pytest.approx(0.3, abs=0.002)
    assert y[y != 0].float().unique().tolist() == pytest.approx([1 / 0.7], rel=1e-2)
    assert y.float().mean().item() == pytest.approx(1.0, abs=0.005)


# the CPU mask, and the one of GPUs and torch.compile
@pytest.mark.parametrize('compiling', [False, True])
def test_inverted_dropout_is_unbiased_under_bf16_autocast(monkeypatch, compiling):
    """E[D(x)] = x for a bf16 input (a projection's input under autocast): the 1/(1-p) scale must
    not be rounded to bf16 (1/0.9 -> 1.109375 would give E[D(x)] = 0.9984 x). Measured on 2^24
    positive values (the mean's noise is about 8e-5): within 1e-4 of 1; and the scale of the
    kept units within 1e-4 of 1/(1-p)."""
    monkeypatch.setattr(torch.compiler, 'is_compiling', lambda: compiling)
    torch.manual_seed(0)
    x = (torch.rand(4096, 4096) + 0.5).bfloat16()  # as autocast hands it on from a projection
    with torch.autocast('cpu', dtype=torch.bfloat16):
        y = Dropout(0.1).train()(x)
    assert y.dtype == torch.bfloat16
    kept = y != 0
    assert (y.double().sum() / x.double().sum()).item() == pytest.approx(1.0, abs=1e-4)
    scale = (y.double().sum() / x[kept].double().sum()).item()
    assert scale == pytest.approx(1 / 0.9, rel=1e-4)


def flash_keep(p):
    """FlashAttention-2's keep rate at dropout p, its rule written out: an entry is kept where its
    8-bit random number r (each of 0..255 equally likely) is at most floor(255 (1-p)), 1-p in
    float32 (PyTorch's flash_api.cpp); the kernel then scales by 1/(1-p)."""
    keep_f32 = torch.tensor(1.0) - torch.tensor(p)  # float32, as the kernel's 1.f - p_dropout
    threshold = torch.floor(keep_f32.double() * 255.0)
    return (torch.arange(256, dtype=torch.float64) <= threshold).double().mean().item()


@pytest.mark.parametrize('p', [0.05, 0.1, 0.2, 0.3, 0.5, 0.9])
def test_flash_attention_dropout_is_unbiased(p):
    """attention.flash_dropout gives the kernel a rate whose keep rate it realises exactly, so
    that its 1/(1-p) undoes it: E[y] = v; the rate within 1/512 of p. Uncorrected, E[y]/v - 1 at
    p = 0.1 is the -1.736e-3 an H100 measured (-1.7e-3)."""
    rate = attention.flash_rate(p)
    if p == 0.1:
        assert flash_keep(p) / (1 - p) - 1 == pytest.approx(-1.736e-3, abs=1e-6)
    assert abs(rate - p) <= 1 / 512
    assert flash_keep(rate) / (1 - rate) == pytest.approx(1.0, abs=1e-12)


# --- the variance-mismatch probe (Fig. 3) ---------------------------------------------------

class OneProjection(nn.Module):
    """One random isotropic projection with its pre-linear site, as 'layers.0.in_proj', for the
    probe."""

    def __init__(self, dropout_type, p, d=256):
        super().__init__()
        self.layers = nn.ModuleList([nn.ModuleDict({'in_proj': nn.Linear(d, d, bias=False)})])
        self.layers[0].pre_linear = pre_linear(dropout_type, p)
        nn.init.normal_(self.layers[0]['in_proj'].weight, std=d ** -0.5)

    def hidden(self, x):
        return self.layers[0]['in_proj'](self.layers[0].pre_linear(x))


@pytest.mark.parametrize('p', [0.1, 0.3])
def test_probe_on_an_isotropic_projection(p):
    """PL-D inflates Var[Wx] by p/(1-p); VPAD (reconstruction A) by far less; r = 1 predicts
    both."""
    torch.manual_seed(0)
    x = torch.randn(16, 256, 256)  # isotropic inputs, (B, T, d)
    [pl] = variance_mismatch(OneProjection('pre_linear', p), x)
    [vp] = variance_mismatch(OneProjection('vpad', p), x)
    assert (pl['layer'], pl['matrix']) == (0, 'in_proj')
    assert pl['r'] == pytest.approx(1.0, abs=0.01)
    assert pl['rel_err'] == pytest.approx(p / (1 - p), rel=0.05) == pl['predicted_pre_linear']
    assert abs(vp['rel_err']) < 0.1 * p / (1 - p) and abs(vp['predicted_vpad']) < 0.01
    # an operator given for a model trained without pre-linear dropout; none given is an error
    [given] = variance_mismatch(OneProjection('none', 0.0), x, VPAD(p))
    assert abs(given['rel_err']) < 0.1 * p / (1 - p)
    with pytest.raises(ValueError, match='give an operator'):
        variance_mismatch(OneProjection('none', 0.0), x)


def test_probe_on_a_transformer_leaves_it_as_it_was():
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=64,
                                          block_size=64, dropout_type='pre_linear',
                                          dropout=0.2)).train()
    idx = torch.randint(0, 64, (32, 64))
    with torch.no_grad():
        before = model.eval().hidden(idx)
    model.train()
    rows = variance_mismatch(model, idx)
    linears = [n for n, _ in projections(model)]
    assert [r['name'] for r in rows] == linears and {r['layer'] for r in rows} == {0, 1}
    # measured (one mask) against predicted from r (in expectation over masks), matrix by matrix
    for r in rows:
        assert r['rel_err'] == pytest.approx(r['predicted_pre_linear'], rel=0.1), r['name']
    assert len(linears) == 2 * 6  # q, k, v, o, up, down in each layer
    assert model.training and all(m.training for n, m in model.named_modules()
                                  if n.endswith('pre_linear'))
    with torch.no_grad():
        assert torch.equal(model.eval().hidden(idx), before)


@pytest.mark.parametrize('model_type', ['transformer', 'mamba2'])
def test_pre_norm_drift_equals_a_model_trained_with_pre_norm_dropout(model_type):
    """The probe's second pass is exactly the model with PN-D on in training mode (same seed)."""
    torch.manual_seed(0)
    if model_type == 'transformer':
        make = lambda **kw: Transformer(TransformerConfig(  # noqa: E731
            n_layer=3, n_head=2, n_embd=32, vocab_size=64, **kw))
        names = ['norm1', 'norm2']
    else:
        make = lambda **kw: Mamba2(Mamba2Config(  # noqa: E731
            n_layer=3, n_embd=32, d_state=8, headdim=8, vocab_size=64, chunk_size=8, **kw))
        names = ['norm']
    model = make()
    twin = make(dropout_type='pre_norm', dropout=0.3)
    twin.load_state_dict(model.state_dict())
    idx = torch.randint(0, 64, (2, 24))
    torch.manual_seed(1)
    rows = pre_norm_drift(model, idx, 0.3)
    assert [(r['layer'], r['norm']) for r in rows] == [(l, n) for l in range(3) for n in names]
    assert isinstance(model.layers[0].pre_norm, nn.Identity) and model.training  # as it was
    outs = []
    hooks = [m.register_forward_hook(lambda m, x, y: outs.append(y))
             for n, m in twin.named_modules() if re.fullmatch(r'layers\.\d+\.norm\d?', n)]
    with torch.no_grad():
        twin.eval().hidden(idx)
        clean, outs = outs, []  # the hooks now fill the new list
        torch.manual_seed(1)
        twin.train().hidden(idx)
    for h in hooks:
        h.remove()
    expected = [torch.nn.functional.cosine_similarity(a, b, dim=-1).mean().item()
                for a, b in zip(clean, outs)]
    assert [r['cosine'] for r in rows] == pytest.approx(expected, abs=1e-6)
    assert rows[0]['cosine'] == pytest.approx(1.0) and min(r['cosine'] for r in rows) < 0.99
    assert all(r['cosine'] == pytest.approx(1.0) for r in pre_norm_drift(model, idx, 0.0))


def test_keep_mask_rate_and_independence():
    torch.manual_seed(0)
    x = torch.empty(1001, 999)  # not a multiple of 4 elements: the last 64-bit draw is partly used
    keep, rate = keep_mask(x, 0.1)
    assert (keep.shape == x.shape and keep.dtype == x.dtype and rate == 3277 / 32768
            and set(keep.unique().tolist()) == {0, 1})
    # dropped or not, the four elements that share a draw
    four = 1 - keep.flatten()[:-3].view(-1, 4)
    # each at the rate (none biased)
    assert four.mean(0).tolist() == pytest.approx([0.1] * 4, abs=0.003)
    c = four - rate
    # uncorrelated
    assert all((c[:, i] * c[:, j]).mean().abs().item() < 1e-3 for i in range(4) for j in range(i))
    assert keep_mask(x, 0.5)[1] == 0.5 and keep_mask(x, 0.0)[0].all()
    assert keep_mask(x.bfloat16(), 0.1)[0].dtype == torch.bfloat16
    with pytest.raises(ValueError, match=r'in \[0, 1\)'):
        keep_mask(x, 1.0)


@pytest.mark.parametrize('dropout_type', ['pre_linear', 'vpad'])
def test_activation_checkpointing_replays_the_masks(dropout_type):
    """train.py's activation checkpointing (each block's forward under torch.utils.checkpoint)
    recomputes a block in the backward with the RNG state of its forward, so PL-D's and VPAD's
    masks (one per projection input) are the same twice: the gradients equal those of the plain
    step, bit for bit. Without the replay they differ (the mutation the test guards)."""
    import functools
    grads = []
    for checkpointing, preserve in ((False, True), (True, True), (True, False)):
        torch.manual_seed(0)
        m = Transformer(TransformerConfig(vocab_size=64, n_layer=2, n_head=4, n_embd=32,
                                          block_size=32, dropout_type=dropout_type,
                                          dropout=0.3)).train()
        if checkpointing:
            for block in m.layers:
                block.forward = functools.partial(torch.utils.checkpoint.checkpoint, block.forward,
                                                  use_reentrant=False, preserve_rng_state=preserve)
        idx = torch.randint(0, 64, (4, 32), generator=torch.Generator().manual_seed(1))
        torch.manual_seed(2)
        m(idx, idx)[1].backward()
        grads.append([p.grad for p in m.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(grads[0], grads[1]))
    assert not all(torch.equal(a, b) for a, b in zip(grads[0], grads[2]))
