"""
The pre-activation variance mismatch of the paper's Figure 3, for a trained checkpoint
(variance_mismatch and pre_norm_drift below; study.py uses them too).

    python probe_variance.py --ckpt=out/quickstart/ckpt_000488.pt                   # its own dropout
    python probe_variance.py --ckpt=out/quickstart/ckpt_000488.pt --dropout_type=pre_linear

On one batch of validation windows: for every projection, the relative error between the
variance of its pre-activations with the train-mode dropout operator and in eval mode (same
inputs), averaged over matrices per layer and over the first and second half of the layers as in
Figure 3 (the paper, SmolLM3-3B: PL-D 0.29 / 0.37, VPAD 0.09 / 0.06); beside it the ratio r
that predicts the error (PL-D p/(1-p) r, VPAD p (r-1); dropout.py's docstring). Then the
pre-norm view: the cosine between each block's normalised input with and without pre-norm
dropout. Writes <ckpt>_probe_<type>.json and .png.
"""

import json
import re
import sys
from collections import defaultdict
from statistics import mean

import torch
import torch.nn as nn
import torch.nn.functional as F

import checkpoint
from configurator import configure
from dropout import Dropout, pre_linear
from tokens import TokenData, batch_rng

PAPER = {'pre_linear': (0.29, 0.37), 'vpad': (0.09, 0.06)}  # Fig. 3, first / last 18 layers of SmolLM3-3B


# -----------------------------------------------------------------------------
# The variance-mismatch probe (Fig. 3). Both probes hook a model built from these operators
# (model.py's Transformer, mamba.py's Mamba2) and run it on one batch, in eval mode throughout.

def _layer(name):
    """'layers.3.attn.q' -> (3, 'attn.q')."""
    parts = name.split('.')
    i = parts.index('layers')
    return int(parts[i + 1]), '.'.join(parts[i + 2:])


PROJECTIONS = ('q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj', 'in_proj', 'out_proj')


def projections(model):
    """(name, nn.Linear) of every projection whose input passes a pre-linear site (model.py's
    Attention and MLP, mamba.py's Mixer; ASEntmax's scale_proj has none)."""
    return [(n, m) for n, m in model.named_modules() if n.rsplit('.', 1)[-1] in PROJECTIONS and isinstance(m, nn.Linear)]


@torch.no_grad()
def variance_mismatch(model, idx, op=None):
    """For every projection W with a pre-linear site (PROJECTIONS) of `model` on the batch idx (B, T): the
    pre-activation y = W x in eval mode, and y' = W op(x) on the same input x with the site's
    train-mode operator (its own, or `op`, e.g. VPAD(0.1)). One row per projection: the signed
    relative error (Var[y'] - Var[y]) / Var[y], Var over all elements as in Fig. 3, and
    r = sum_ij W_ij^2 x_j^2 / ||W x||^2 (summed over tokens) with what r predicts in expectation
    over the mask (dropout.py's docstring): PL-D p/(1-p) * r, VPAD p * (r - 1)."""
    rows, hooks = [], []

    def record(name, module, x, own_site):
        site = op or own_site
        if isinstance(site, nn.Identity):
            raise ValueError(f"{name} has no pre-linear dropout (the model was trained without): give an operator")
        was = site.training
        site.train()
        x = x[0]  # (B, T, d_in)
        y, y_train = F.linear(x, module.weight, module.bias), F.linear(site(x), module.weight, module.bias)
        site.train(was)
        var, var_train = y.float().var().item(), y_train.float().var().item()
        x, w = x.float(), module.weight.float()
        r = (F.linear(x * x, w * w).sum() / F.linear(x, w).pow(2).sum()).item()  # sum_ij W_ij^2 x_j^2 / ||W x||^2
        layer, matrix = _layer(name)
        rows.append({'name': name, 'layer': layer, 'matrix': matrix, 'var_eval': var, 'var_train': var_train,
                     'rel_err': (var_train - var) / var, 'r': r,
                     'predicted_pre_linear': site.p / (1 - site.p) * r, 'predicted_vpad': site.p * (r - 1)})

    for name, module in projections(model):
        site = model.get_submodule(name.rsplit('.', 1)[0]).pre_linear  # the sublayer's own site
        hooks.append(module.register_forward_pre_hook(lambda m, x, name=name, site=site: record(name, m, x, site)))
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
    norms = [(n, m) for n, m in model.named_modules() if re.fullmatch(r'layers\.\d+\.norm\d?', n)]  # not Mamba2's gated norm
    for name, module in norms:
        hooks.append(module.register_forward_hook(lambda m, x, y, name=name: out.setdefault(name, []).append(y.float())))
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


if __name__ == '__main__':
    # -----------------------------------------------------------------------------
    ckpt = ''
    dropout_type = ''  # 'pre_linear' or 'vpad'; default: the model's own
    dropout = -1.0  # p; default: the model's own (0.1 if it has none)
    vpad_variant = ''  # default: the model's own
    data_dir = ''  # default: the checkpoint's training data
    split = 'val'
    batch_size = 8
    length = 0  # tokens per window; default: the training length
    seed = 0
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    out = ''  # default: <ckpt>_probe_<type>
    # -----------------------------------------------------------------------------
    globals().update(configure(globals(), sys.argv[1:]))
    if not ckpt:
        raise SystemExit("give a checkpoint: --ckpt=out/quickstart/ckpt_000488.pt")
    if dropout >= 1 or length < 0 or batch_size < 1:
        raise SystemExit(f"config error: dropout must be below 1 (a negative value: the model's own), length >= 0 "
                         f"(0: the training length) and batch_size >= 1, got {dropout}, {length}, {batch_size}")
    model, _, info = checkpoint.load_for_eval(ckpt, device, 'the probe')
    c = model.config
    dropout_type = dropout_type or c.dropout_type
    if dropout_type not in ('pre_linear', 'vpad'):
        raise SystemExit(f"the model was trained with dropout_type={c.dropout_type!r}: give --dropout_type=pre_linear or vpad")
    p = dropout if dropout >= 0 else (c.dropout or 0.1)
    op = pre_linear(dropout_type, p, vpad_variant or c.vpad_variant)
    config = info.get('config', {})
    try:
        data = TokenData(data_dir or config.get('data_dir', ''), split)
    except FileNotFoundError as e:
        raise SystemExit(str(e))
    length = length or config.get('block_size') or 1024
    torch.manual_seed(seed)
    idx = data.batch(batch_size, length, batch_rng(seed, 1))[0].to(device)

    rows = variance_mismatch(model, idx, op)
    drift = pre_norm_drift(model, idx, p)

    # per layer: mean |relative error| over its matrices, mean r and the predictions
    by_layer = defaultdict(list)
    for row in rows:
        by_layer[row['layer']].append(row)
    layers = {l: {'rel_err': mean(abs(r['rel_err']) for r in rs), 'signed': mean(r['rel_err'] for r in rs),
                  'r': mean(r['r'] for r in rs), 'predicted': mean(abs(r['predicted_' + dropout_type]) for r in rs)}
              for l, rs in sorted(by_layer.items())}
    half = len(layers) // 2
    halves = [mean(layers[l]['rel_err'] for l in ls) for ls in (list(layers)[:half or 1], list(layers)[half:])]
    cos = {l: [d['cosine'] for d in drift if d['layer'] == l] for l in layers}

    name = f"{dropout_type}{'' if dropout_type != 'vpad' else ' ' + op.variant}, p = {p}"
    print(f"{ckpt}: {name}, {batch_size} windows of {length} tokens\n")
    print(f"{'layer':>5} {'|rel err|':>10} {'signed':>8} {'r':>7} {'predicted':>10}   pre-norm cosine (p = {p})")
    for l, v in layers.items():
        print(f"{l:>5} {v['rel_err']:>10.4f} {v['signed']:>8.4f} {v['r']:>7.3f} {v['predicted']:>10.4f}   "
              + ' '.join(f"{x:.4f}" for x in cos[l]))
    print(f"\nrelative variance error, first / second half of the layers: {halves[0]:.3f} / {halves[1]:.3f}"
          + (f"   (paper, SmolLM3-3B: {PAPER[dropout_type][0]} / {PAPER[dropout_type][1]})"))

    out = out or f"{ckpt.removesuffix('.pt').rstrip('/')}_probe_{dropout_type}"
    with open(out + '.json', 'w') as f:
        json.dump({'ckpt': ckpt, 'dropout_type': dropout_type, 'p': p,
                   'vpad_variant': op.variant if dropout_type == 'vpad' else None, 'batch_size': batch_size, 'length': length, 'first_half': halves[0], 'second_half': halves[1],
                   'paper': PAPER[dropout_type], 'layers': layers, 'matrices': rows, 'pre_norm_drift': drift}, f, indent=1)
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    ls = list(layers)
    a.bar([l - 0.2 for l in ls], [layers[l]['rel_err'] for l in ls], width=0.4, label='measured')
    a.bar([l + 0.2 for l in ls], [layers[l]['predicted'] for l in ls], width=0.4, label='predicted from r')
    a.set_xlabel('layer')
    a.set_ylabel('|Var[y train] - Var[y eval]| / Var[y eval]')
    a.set_title(f"pre-activation variance mismatch, {name}", fontsize=9)
    a.legend(fontsize=8)
    for norm in sorted({d['norm'] for d in drift}):
        b.plot([d['layer'] for d in drift if d['norm'] == norm], [d['cosine'] for d in drift if d['norm'] == norm],
               marker='o', label=norm)
    b.set_xlabel('layer')
    b.set_ylabel('cosine(normalised input, train vs eval)')
    b.set_title(f"pre-norm view: pre-norm dropout p = {p}", fontsize=9)
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out + '.png', dpi=120)
    print(f"wrote {out}.json and {out}.png")
