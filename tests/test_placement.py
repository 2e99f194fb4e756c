"""Where each regularizer acts (Fig. 2), pinned: every site's output written out from the paper's
formula with the same random draws, so that moving a site (PN-D after the residual add, PL-D on a
projection's output, attention dropout off the probabilities) fails here. Transformer and Mamba2."""

import math

import pytest
import torch
import torch.nn.functional as F

import dropout
from mamba import Mamba2, Mamba2Config
from ops.attention import attention
from model import Transformer, TransformerConfig

P = 0.3
MODELS = {
    'transformer': lambda **kw: Transformer(TransformerConfig(
        vocab_size=61, n_layer=2, n_head=4, n_embd=32, mlp='swiglu', dropout=P, **kw)),
    'mamba2': lambda **kw: Mamba2(Mamba2Config(
        vocab_size=61, n_layer=2, n_embd=32, d_state=8, headdim=16, chunk_size=8, dropout=P,
        use_kernels=False, **kw)),
}


def replay(module, check):
    """A forward pre-hook that keeps module's input and the random state before its call, and a
    forward hook that recomputes the call from the same random state with check(module, input)
    and asserts it equals the output; the random state is then put back where the call left it."""
    seen = {}

    def before(mod, args):
        seen['args'], seen['rng'] = args, torch.get_rng_state()

    def after(mod, args, out):
        rng_after = torch.get_rng_state()
        torch.set_rng_state(seen['rng'])
        expected = check(mod, *seen['args'])
        torch.set_rng_state(rng_after)
        got = out[0] if isinstance(out, tuple) else out
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
        seen['checked'] = seen.get('checked', 0) + 1
    return module.register_forward_pre_hook(before), module.register_forward_hook(after), seen


def run(m, checks):
    """checks: module -> check; one training forward; every check must have run."""
    hooks = [replay(mod, fn) for mod, fn in checks.items()]
    torch.manual_seed(1)
    m.train()(torch.randint(0, 61, (2, 16)), torch.randint(0, 61, (2, 16)))
    for before, after, seen in hooks:
        before.remove(), after.remove()
        assert seen.get('checked', 0) >= 1


@pytest.mark.parametrize('kind', MODELS)
@pytest.mark.parametrize('dropout_type', ['pre_linear', 'vpad'])
def test_pre_linear_sites_act_on_every_projection_input(kind, dropout_type):
    """PL-D: y = W (m * x) / (1 - p) + b; VPAD: y = W vpad(x) + b, a mask of its own per projection.
    Every call of a pre-linear site is checked against the formula (its mask replayed), and every
    projection's input must be the output of the site call just before it: a site moved to a
    projection's output, or one mask shared by two projections, breaks that chain."""
    torch.manual_seed(0)
    m = MODELS[kind](dropout_type=dropout_type)

    def pl_d(site, x):
        keep, p = dropout.keep_mask(x, P)  # the mask this call draws, m_i ~ Bernoulli(1 - p)
        return keep * x / (1 - p)

    def vpad(site, x):  # variant A: mu + m (x - mu) / sqrt(1 - p), mu the per-token mean
        keep, p = dropout.keep_mask(x, P)
        mu = x.mean(-1, keepdim=True)
        return mu + keep * (x - mu) / math.sqrt(1 - p)
    sites = [mod for name, mod in m.named_modules() if name.endswith('pre_linear')]
    events, hooks = [], []
    for site in sites:
        hooks.append(site.register_forward_hook(lambda mod, i, o: events.append(('site', o))))
    projections = [(n, mod) for n, mod in m.named_modules()
                   if n.endswith('_proj') and not n.endswith('scale_proj')]
    for name, proj in projections:
        hooks.append(proj.register_forward_pre_hook(
            lambda mod, i, name=name: events.append((name, i[0]))))
    run(m, {site: pl_d if dropout_type == 'pre_linear' else vpad for site in sites})
    for h in hooks:
        h.remove()
    names = [e[0] for e in events if e[0] != 'site']
    # q k v o gate up down; in_proj out_proj
    assert len(names) == (2 * 7 if kind == 'transformer' else 2 * 2)
    for before, (name, x) in zip(events, events[1:]):
        if name != 'site':
            assert before[0] == 'site' and before[1] is x, (
                f"{name}'s input is not a pre-linear site's output")


@pytest.mark.parametrize('kind', MODELS)
def test_pre_norm_dropout_is_eq_6(kind):
    """PN-D, Eq. 6: r_{l+1} = r_l + D(u_l), u_l the sublayer's output from Norm(r_l); the dropped
    sublayer output joins the residual stream (the transformer: after attention, then after the
    MLP)."""
    torch.manual_seed(0)
    m = MODELS[kind](dropout_type='pre_norm')

    def transformer_block(block, r, rope=None, cache=None):
        h = r + dropout.dropout(block.attn(block.norm1(r), rope, cache), P)
        return h + dropout.dropout(block.mlp(block.norm2(h)), P)

    def mamba_block(block, r, state=None):
        u, _ = block.mixer(block.norm(r), state)
        return r + dropout.dropout(u, P)
    run(m, {b: transformer_block if kind == 'transformer' else mamba_block for b in m.layers})


def test_attention_dropout_acts_on_the_probabilities():
    """softmax(q k^T / sqrt(d) + mask), then dropout on the probabilities, then @ v."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 12, 8), torch.randn(2, 4, 12, 8), torch.randn(2, 4, 12, 8)
    torch.manual_seed(3)
    got = attention(q, k, v, dropout_p=P, backend='manual')
    causal = torch.ones(12, 12, dtype=torch.bool).tril()
    probs = (q @ k.transpose(-2, -1) / math.sqrt(8)).masked_fill(~causal, float('-inf')).softmax(-1)
    torch.manual_seed(3)
    torch.testing.assert_close(got, F.dropout(probs, P) @ v, atol=1e-6, rtol=1e-5)
