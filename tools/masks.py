"""
Dropout under torch.compile, checked two ways that cannot be confused (tools/gpu_check.py runs both;
docs/performance.md, 'Compiled dropout', says why):

- compiled_vs_eager(masks='fixed'): the compiled training step against eager with every mask a pure
  function of its call's place in the step and of the element's index (hashed_mask()), so that
  both draw the same masks whatever order the compiled code runs them in: a difference is maths.
  masks='drawn' compares the real random masks, equal only where compiled code draws them in
  eager's order (Inductor may reorder independent random calls: pytorch #192635, #181136).
- site_masks(): at every dropout site of a model, in one real training step (compiled or eager,
  with or without activation checkpointing), the site's own operator on a probe input of ones
  (VPAD: of +-1, a row mean of 0): the mask its forward applied (the kept entries read 1/(1-p),
  VPAD's 1/sqrt(1-p)) against the mask its backward used (read from the probe's gradient), the
  keep rate, the kept scale, and the correlation between the masks of different sites.
"""

import functools
from contextlib import nullcontext

import torch
import torch._dynamo.utils

import dropout as dropout_py

# -----------------------------------------------------------------------------
# masks that do not depend on the order in which they are drawn

_calls = [0]  # masks drawn since the step began: the next one's index


def hashed_mask(x, p):
    """keep_mask's contract (a mask like x, the rate it realises) with no random numbers: the
    k-th call's mask hashes (k, element index) with integer arithmetic, exact in eager and
    compiled code alike. The call index comes from Python, which dynamo traces in program order."""
    k = _calls[0]
    _calls[0] += 1
    i = torch.arange(x.numel(), device=x.device, dtype=torch.int64)
    # a 32-bit integer hash (every product stays below 2^63)
    h = (i * 0x9E3779B1 + k * 0x7FEB352D + 1) & 0xFFFFFFFF
    h = ((h ^ (h >> 16)) * 0x45D9F3B) & 0xFFFFFFFF
    h = ((h ^ (h >> 16)) * 0x45D9F3B) & 0xFFFFFFFF
    h = h ^ (h >> 16)
    threshold = round(p * 2 ** 24)
    return ((h >> 8) >= threshold).view(x.shape).to(x.dtype), threshold / 2 ** 24


def restart():
    """A new step: its first mask is hashed_mask's call 0."""
    _calls[0] = 0


# -----------------------------------------------------------------------------
# the compiled step against eager

def relative_difference(loss, ref, grads, model):
    """The largest relative difference of a loss from the reference's (ref, backward done) and of
    each gradient in grads from the reference model's own: (value, which)."""
    worst = (abs(loss - ref.item()) / abs(ref.item()), 'loss')
    for g, (name, p) in zip(grads, model.named_parameters()):
        if p.grad is not None:  # no gradients: forward only
            e = ((g - p.grad).abs().max() / p.grad.abs().max().clamp(min=1e-12)).item()
            worst = max(worst, (e, name))
    return worst


def compiled_vs_eager(build, batch, backend, masks='drawn', steps=3, backward=True,
                      inductor=None):
    """The compiled training step of build() against eager over `steps` steps (batch(i) -> x, y):
    the largest relative difference of the loss and gradients, the parameter it is in, and
    dynamo's graphs and breaks, read right after the compiled steps, before any eager call (eager
    flex compiles itself, and its graph would count as the step's). masks: 'drawn', the random
    masks, with Inductor's generator off (fallback_random) so that both draw from the same one;
    'fixed', hashed_mask(). inductor: more Inductor settings (e.g. reorder_for_peak_memory=False).
    """
    counters = torch._dynamo.utils.counters
    torch._dynamo.reset()
    counters.clear()
    real_mask, real_compiling = dropout_py.keep_mask, torch.compiler.is_compiling
    if masks == 'fixed':
        dropout_py.keep_mask = hashed_mask
    try:
        with (torch._inductor.config.patch(fallback_random=True, **(inductor or {})),
              torch.set_grad_enabled(backward)):
            compiled = build().train()
            step = torch.compile(compiled, backend=backend)
            seen = []
            for i in range(steps):
                x, y = batch(i)
                torch.manual_seed(i)
                restart()
                loss = step(x, y)[1]
                if backward:
                    loss.backward()
                seen.append((loss.item(), [p.grad for p in compiled.parameters()]))
                compiled.zero_grad(set_to_none=True)
            graphs = counters['stats']['unique_graphs']
            breaks = sum(counters['graph_break'].values())
            eager = build().train()
            eager.load_state_dict(compiled.state_dict())
            worst = (0.0, 'loss')
            for i, (loss, grads) in enumerate(seen):
                x, y = batch(i)
                torch.manual_seed(i)
                restart()
                # drawn masks: eager on CPU draws them as compiled code does (rand >= p)
                torch.compiler.is_compiling = lambda: masks == 'drawn' or real_compiling()
                try:
                    ref = eager(x, y)[1]
                finally:
                    torch.compiler.is_compiling = real_compiling
                if backward:
                    ref.backward()
                worst = max(worst, relative_difference(loss, ref, grads, eager))
                eager.zero_grad(set_to_none=True)
    finally:
        dropout_py.keep_mask = real_mask
        torch._dynamo.reset()
    return worst, graphs, breaks


# -----------------------------------------------------------------------------
# every site's mask, forward and backward

def site_masks(model, x, y, backend=None, recompute=False):
    """One training step of model (train mode) on x, y with every dropout site (dropout.Dropout,
    dropout.VPAD) probed: the site's operator runs, at the site's place in the step (and on a
    probe input that keeps its input's producer in the graph), on a leaf of ones (VPAD, variant A:
    +-1 along the features), and returns its input unchanged; the probe outputs join the loss with
    weight 1. backend: torch.compile's, or None for eager; recompute: each block under activation
    checkpointing, as train.py runs it. -> (the sites in the order the forward met them, each
    dict(name, p, scale (1/(1-p), VPAD 1/sqrt(1-p)), forward mask, backward mask, kept values);
    dynamo's graph breaks, 0 where the step compiled whole)."""
    names = {m: n for n, m in model.named_modules()}
    layers = list(getattr(model, 'layers', []))
    state = {'block': -1, 'call': 0, 'leaves': {}, 'seen': {}, 'shapes': {}}
    real = {cls: cls.forward for cls in (dropout_py.Dropout, dropout_py.VPAD)}

    def probe(module, u):
        key = (state['block'], state['call'])
        state['call'] += 1
        if not state['leaves']:  # the shape pass
            state['shapes'][key] = (module, u.shape)
            return u
        # the leaf, with the site's input as its producer (x * 0: no gradient reaches x)
        out = real[type(module)](module, u.detach() * 0 + state['leaves'][key])
        state['seen'][key] = out
        return u

    def tagged(forward, i):
        @functools.wraps(forward)
        def run(*args, **kwargs):  # the block's own call count, restarted when the backward
            # recomputes it
            state['block'], state['call'] = i, 0
            return forward(*args, **kwargs)
        return run

    saved = [(b, b.__dict__.get('forward')) for b in layers]
    for i, b in enumerate(layers):
        b.forward = tagged(b.forward, i)
    for cls in real:
        cls.forward = probe
    try:
        with torch.no_grad():
            state['block'], state['call'] = -1, 0
            model(x, y)
        for key, (module, shape) in state['shapes'].items():
            if isinstance(module, dropout_py.VPAD) and module.variant != 'A':
                raise ValueError("site_masks reads VPAD's masks for variant A only")
            leaf = torch.ones(shape, device=x.device)
            if isinstance(module, dropout_py.VPAD):  # +-1 along the features: a token mean of 0
                leaf[..., 1::2] = -1
            state['leaves'][key] = leaf.requires_grad_()
        if recompute:
            for b in layers:
                b.forward = functools.partial(torch.utils.checkpoint.checkpoint, b.forward,
                                              use_reentrant=False)
        counters = torch._dynamo.utils.counters
        counters.clear()
        # the probe's bookkeeping is Python state: traced once, not replayed when the backward
        # recomputes a block (the recompute runs the traced graph)
        replay = dict(skip_fwd_side_effects_in_bwd_under_checkpoint=True)
        with torch._dynamo.config.patch(**replay) if recompute and backend else nullcontext():
            step = torch.compile(model, backend=backend) if backend else model
            state['block'], state['call'] = -1, 0
            loss = step(x, y)[1]
            seen = dict(state['seen'])
            (loss + sum(out.float().sum() for out in seen.values())).backward()
        breaks = sum(counters['graph_break'].values())
    finally:
        for cls, forward in real.items():
            cls.forward = forward
        for b, forward in saved:
            if forward is None:
                b.__dict__.pop('forward', None)
            else:
                b.forward = forward
        torch._dynamo.reset()
    sites = []
    for key, out in seen.items():
        module, _ = state['shapes'][key]
        leaf, p = state['leaves'][key], module.p
        out, grad = out.detach().double(), leaf.grad.double()
        forward = out != 0
        if isinstance(module, dropout_py.VPAD):
            # d out_j / d u_k summed over j: c m_k + 1 - c K / d (K kept of the row's d)
            scale = (1 - p) ** -0.5
            kept = forward.sum(-1, keepdim=True)
            backward = (grad - (1 - scale * kept / out.size(-1))) > scale / 2
            values = (out * leaf.detach().double())[forward]
        else:
            scale = 1 / (1 - p)
            backward = grad != 0
            values = out[forward]
        sites.append(dict(name=f"{names[module]} call {key[1]}", p=p, scale=scale,
                          forward=forward, backward=backward, values=values))
    return sites, breaks


def judge(sites, sigmas=5.0):
    """The checks of site_masks' sites -> (passed, the figures, a line that says them): forward
    and backward masks equal; each keep rate within `sigmas` standard errors of 1-p; every kept
    value the site's scale to 1e-3 (dropout.py's CPU masks realise p to 2^-16); the masks of any
    two sites uncorrelated (|r| sqrt(n) under `sigmas`); groups of 4 neighbouring units no more
    often identical than chance allows (pytorch #198333's 4-wide random path)."""
    if not sites:
        return False, {}, "no dropout site"
    mismatched = sum((s['forward'] != s['backward']).sum().item() for s in sites)
    rate, scale, group = 0.0, 0.0, 0.0
    for s in sites:
        m, keep = s['forward'].double(), 1 - s['p']
        n = m.numel()
        rate = max(rate, abs(m.mean().item() - keep) / (keep * (1 - keep) / n) ** 0.5)
        scale = max(scale, (s['values'] / s['scale'] - 1).abs().max().item())
        if m.size(-1) % 4 == 0:
            g = m.reshape(-1, 4).sum(-1)
            same = ((g == 0) | (g == 4)).double()
            chance = keep ** 4 + (1 - keep) ** 4
            group = max(group, (same.mean().item() - chance)
                        / (chance * (1 - chance) / same.numel()) ** 0.5)
    worst, pair = 0.0, ''
    for i, a in enumerate(sites):
        for b in sites[i + 1:]:
            n = min(a['forward'].numel(), b['forward'].numel())
            u, v = (s['forward'].flatten()[:n].double() for s in (a, b))
            u, v = u - u.mean(), v - v.mean()
            r = ((u * v).sum() / (u.norm() * v.norm()).clamp(min=1e-12)).item()
            if abs(r) * n ** 0.5 > worst:
                worst, pair = abs(r) * n ** 0.5, f" ({a['name']}, {b['name']})"
    ok = mismatched == 0 and rate < sigmas and scale < 1e-3 and worst < sigmas and group < sigmas
    stats = dict(mismatched=mismatched, rate=rate, group=group, scale=scale, correlation=worst)
    return ok, stats, (
        f"{len(sites)} sites: {mismatched} units where the backward's mask differs from "
        f"the forward's (bound 0); keep rate within {rate:.1f} sigma of 1-p, identical "
        f"4-unit groups {group:+.1f} sigma (bounds {sigmas:g}); kept scale off by "
        f"{scale:.1e} (bound 1e-3); largest correlation between sites {worst:.1f} "
        f"sigma{pair} (bound {sigmas:g})")
