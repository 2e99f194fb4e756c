"""
The variance-mismatch probe of the paper's Figure 3 and its pre-norm view, for
tools/probe_variance.py and tools/study.py: functions of a model (model.py's Transformer,
mamba.py's Mamba2) and one batch, which hook its projections or its norms and run it in eval mode
throughout; no files, no plots. dropout.py's docstring says what each operator is predicted to do.
"""

import re

import torch
import torch.nn as nn
import torch.nn.functional as F

from dropout import Dropout, variance_error


def _layer(name):
    """'layers.3.attn.q' -> (3, 'attn.q')."""
    parts = name.split('.')
    i = parts.index('layers')
    return int(parts[i + 1]), '.'.join(parts[i + 2:])


PROJECTIONS = ('q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj',
               'in_proj', 'out_proj')


def projections(model):
    """(name, nn.Linear) of every projection whose input passes a pre-linear site (model.py's
    Attention and MLP, mamba.py's Mixer; ASEntmax's scale_proj has none)."""
    return [(n, m) for n, m in model.named_modules()
            if n.rsplit('.', 1)[-1] in PROJECTIONS and isinstance(m, nn.Linear)]


@torch.no_grad()
def variance_mismatch(model, idx, op=None):
    """For every projection W with a pre-linear site (PROJECTIONS) of `model` on the batch idx
    (B, T): the pre-activation y = W x in eval mode, and y' = W op(x) on the same input x with the
    site's train-mode operator (its own, or `op`, e.g. VPAD(0.1)). One row per projection: the
    signed relative error (Var[y'] - Var[y]) / Var[y], Var over all elements as in Fig. 3, and
    r = sum_ij W_ij^2 x_j^2 / ||W x||^2 (summed over tokens) with what r predicts in expectation
    over the mask (dropout.py's docstring): PL-D p/(1-p) * r, VPAD p * (r - 1)."""
    rows, hooks = [], []

    def record(name, module, x, own_site):
        site = op or own_site
        if isinstance(site, nn.Identity):
            raise ValueError(f"{name} has no pre-linear dropout (the model was trained without): "
                             f"give an operator")
        was = site.training
        site.train()
        x = x[0]  # (B, T, d_in)
        y = F.linear(x, module.weight, module.bias)
        y_train = F.linear(site(x), module.weight, module.bias)
        site.train(was)
        var, var_train = y.float().var().item(), y_train.float().var().item()
        x, w = x.float(), module.weight.float()
        # r = sum_ij W_ij^2 x_j^2 / ||W x||^2
        r = (F.linear(x * x, w * w).sum() / F.linear(x, w).pow(2).sum()).item()
        layer, matrix = _layer(name)
        rows.append({'name': name, 'layer': layer, 'matrix': matrix, 'var_eval': var,
                     'var_train': var_train, 'rel_err': (var_train - var) / var, 'r': r,
                     'predicted_pre_linear': variance_error('pre_linear', site.p, r),
                     'predicted_vpad': variance_error('vpad', site.p, r)})

    for name, module in projections(model):
        site = model.get_submodule(name.rsplit('.', 1)[0]).pre_linear  # the sublayer's own site
        hook = lambda m, x, name=name, site=site: record(name, m, x, site)  # noqa: E731
        hooks.append(module.register_forward_pre_hook(hook))
    was = model.training
    try:
        model.eval()
        model.hidden(idx)
    finally:
        model.train(was)
        for h in hooks:
            h.remove()
    return rows


@torch.no_grad()
def pre_norm_drift(model, idx, p):
    """The pre-norm view: every block's normalised input (the output of the norms that read the
    residual stream) in eval mode and with pre-norm dropout of rate p active at every PN-D site,
    nothing else. One row per norm: the mean over tokens of the cosine between the two. Dropout
    upstream reaches every later norm (Eq. 6), so the drift accumulates with depth."""
    out, hooks = {}, []
    # the norms that read the residual stream, not Mamba2's gated norm
    norms = [(n, m) for n, m in model.named_modules() if re.fullmatch(r'layers\.\d+\.norm\d?', n)]
    for name, module in norms:
        hook = lambda m, x, y, name=name: out.setdefault(name, []).append(y.float())  # noqa: E731
        hooks.append(module.register_forward_hook(hook))
    sites = [(block, block.pre_norm) for block in model.layers]
    was = model.training
    try:
        model.eval()
        model.hidden(idx)
        for block, _ in sites:
            block.pre_norm = Dropout(p)  # in training mode: only these are active
        model.hidden(idx)
    finally:
        for block, site in sites:
            block.pre_norm = site
        model.train(was)
        for h in hooks:
            h.remove()
    return [{'name': name, 'layer': _layer(name)[0], 'norm': _layer(name)[1],
             'cosine': F.cosine_similarity(*out[name], dim=-1).mean().item()} for name, _ in norms]


