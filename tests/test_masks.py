"""tools/masks.py, which tools/gpu_check.py runs on a GPU: the compiled step against eager with
masks that cannot come out in another order, through Inductor on CPU (the closest CPU gets to
CUDA's code), and every dropout site's mask read where it is used. Each check passes on the real
code and fails on a defect planted in it."""

import pytest
import torch

import dropout as dropout_py
import model
from tools import masks

REAL_MASK = dropout_py.keep_mask
SMALL = dict(vocab_size=61, block_size=32, n_layer=2, n_head=4, n_embd=32, pos_encoding='nape')
VPAD = dict(dropout_type='vpad', dropout=0.1)


def build(**kw):
    torch.manual_seed(0)
    return model.Transformer(model.TransformerConfig(**{**SMALL, **kw}))


def batch(i):
    return torch.randint(0, 61, (2, 2, 32), generator=torch.Generator().manual_seed(i))


def test_compiled_vpad_step_equals_eager_through_inductor():
    """VPAD's training step through Inductor's CPU code with fixed masks: one graph, loss and every
    gradient as eager's (with drawn masks: tests/test_compile.py)."""
    (worst, where), graphs, breaks = masks.compiled_vs_eager(lambda: build(**VPAD, n_layer=1),
                                                             batch, 'inductor', 'fixed')
    assert worst < 1e-5 and (graphs, breaks) == (1, 0), (worst, where)


def test_fixed_masks_do_not_depend_on_the_order_they_are_drawn_in():
    """hashed_mask: the k-th call's mask, whatever came before; a rate realised to 2^-24."""
    x = torch.ones(64, 96)
    masks.restart()
    first, p = masks.hashed_mask(x, 0.1)
    second, _ = masks.hashed_mask(x, 0.1)
    masks.restart()
    assert torch.equal(masks.hashed_mask(x, 0.1)[0], first)
    assert not torch.equal(first, second) and abs(p - 0.1) < 2 ** -24
    assert abs(first.mean().item() - 0.9) < 5 * (0.09 / x.numel()) ** 0.5


def planted_in_compiled_code(monkeypatch, defect):
    """A defect in the compiled step only, as a miscompiled graph would have it."""
    real_vpad, real_mask = dropout_py.vpad, masks.hashed_mask
    if defect == 'VPAD scaled by 1/(1-p)':
        def vpad(x, p, variant='A', training=True):
            if not torch.compiler.is_compiling():
                return real_vpad(x, p, variant, training)
            keep, p = dropout_py.keep_mask(x, p)
            mu = x.mean(-1, keepdim=True)
            return torch.addcmul(mu, x - mu, keep, value=1.0 / (1.0 - p))
        monkeypatch.setattr(dropout_py, 'vpad', vpad)
    else:  # q's mask on k's input too
        def shared(x, p, last={}):
            if torch.compiler.is_compiling() and masks._calls[0] % 6 == 1:
                masks._calls[0] += 1
                return last['mask']
            last['mask'] = real_mask(x, p)
            return last['mask']
        monkeypatch.setattr(masks, 'hashed_mask', shared)


@pytest.mark.parametrize('defect', ['VPAD scaled by 1/(1-p)', 'a mask shared by two projections'])
def test_compiled_vs_eager_with_fixed_masks_catches_a_defect_of_the_compiled_step(monkeypatch,
                                                                                   defect):
    planted_in_compiled_code(monkeypatch, defect)
    (worst, _), _, _ = masks.compiled_vs_eager(lambda: build(**VPAD), batch, 'aot_eager', 'fixed')
    assert worst > 1e-2


@pytest.mark.parametrize('kind, backend, recompute', [
    *((k, b, r) for k in ('pre_linear', 'vpad', 'pre_norm')
      for b, r in ((None, False), (None, True), ('aot_eager', False), ('aot_eager', True))),
    ('vpad', 'inductor', True)])  # Inductor's C++ build: about 10 s a model
def test_every_site_uses_its_forward_mask_in_the_backward(kind, backend, recompute):
    """Eager, and compiled (Inductor's own random numbers, the partitioner free to recompute a
    mask in the backward) with activation checkpointing: all 12 pre-linear sites of 2 layers (q,
    k, v, o, up, down) or 4 pre-norm ones pass every check."""
    m = build(dropout_type=kind, dropout=0.1).train()
    sites, breaks = masks.site_masks(m, *batch(0), backend, recompute)
    ok, stats, figure = masks.judge(sites)
    assert ok and breaks == 0, (figure, breaks)
    assert len(sites) == (4 if kind == 'pre_norm' else 12) and stats['mismatched'] == 0
    assert [s['name'] for s in sites[:4]] == (
        ['layers.0.pre_norm call 0', 'layers.0.pre_norm call 1', 'layers.1.pre_norm call 0',
         'layers.1.pre_norm call 1'] if kind == 'pre_norm' else
        [f'layers.0.attn.pre_linear call {i}' for i in range(4)])
    # the model is left as it was: its own dropout again, no probe
    assert 'forward' not in m.layers[0].__dict__
    assert dropout_py.Dropout.forward.__name__ == dropout_py.VPAD.forward.__name__ == 'forward'


def fresh_backward_mask(x, p, training=True):
    class Dropout(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            keep, ctx.p = dropout_py.keep_mask(x, p)
            return x * keep / (1 - ctx.p)

        @staticmethod
        def backward(ctx, g):  # another draw: the defect
            keep, _ = dropout_py.keep_mask(g, ctx.p)
            return g * keep / (1 - ctx.p)
    return Dropout.apply(x) if training else x


def groups_of_four(x, p):
    """pytorch #198333's defect: 4 neighbouring units share one random number."""
    u = torch.rand(*x.shape[:-1], x.size(-1) // 4).repeat_interleave(4, -1)
    return (u >= p).to(x.dtype), p


def shared_by_pairs(x, p, cache={}):
    """Every second projection takes the mask of the one before (q's on k, v's on o)."""
    if x.shape in cache:
        return cache.pop(x.shape)
    cache[x.shape] = REAL_MASK(x, p)
    return cache[x.shape]


def vpad_scaled_as_dropout(x, p, variant='A', training=True):
    keep, p = dropout_py.keep_mask(x, p)
    mu = x.mean(-1, keepdim=True)
    return torch.addcmul(mu, x - mu, keep, value=1.0 / (1.0 - p))


def rate_off(x, p):
    keep, _ = REAL_MASK(x, 1.3 * p)  # drops 13%, scales as for 10%
    return keep, p


DEFECTS = {  # name: (dropout type, what is planted where, the figure that must fail)
    'the backward draws another mask': ('pre_linear', 'dropout', fresh_backward_mask,
                                        'mismatched'),
    '4 neighbours share a random number': ('pre_linear', 'keep_mask', groups_of_four, 'group'),
    'a mask shared by two projections': ('pre_linear', 'keep_mask', shared_by_pairs,
                                         'correlation'),
    'VPAD scaled by 1/(1-p)': ('vpad', 'vpad', vpad_scaled_as_dropout, 'scale'),
    'a keep rate of 0.87': ('pre_linear', 'keep_mask', rate_off, 'rate'),
}


@pytest.mark.parametrize('defect', DEFECTS)
def test_site_masks_catch_a_planted_defect(monkeypatch, defect):
    kind, name, planted, figure = DEFECTS[defect]
    monkeypatch.setattr(dropout_py, name, planted)
    sites, _ = masks.site_masks(build(dropout_type=kind, dropout=0.1).train(), *batch(0))
    ok, stats, line = masks.judge(sites)
    bound = 0 if figure == 'mismatched' else 1e-3 if figure == 'scale' else 5
    assert not ok and stats[figure] > bound, line
