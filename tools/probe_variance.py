"""
The pre-activation variance mismatch of the paper's Figure 3, for a trained checkpoint
(tools/variance.py: variance_mismatch and pre_norm_drift, which tools/study.py uses too).

    python -m tools.probe_variance --ckpt=out/quickstart/ckpt_000488.pt  # its own dropout
    python -m tools.probe_variance --ckpt=out/quickstart/ckpt_000488.pt --dropout_type=pre_linear

On one batch of validation windows: for every projection, the relative error between the
variance of its pre-activations with the train-mode dropout operator and in eval mode (same
inputs), averaged over matrices per layer and over the first and second half of the layers as in
Figure 3 (the paper, SmolLM3-3B: PL-D 0.29 / 0.37, VPAD 0.09 / 0.06); beside it the ratio r
that predicts the error (dropout.variance_error: docs/vpad.md derives it). Then the
pre-norm view: the cosine between each block's normalised input with and without pre-norm
dropout. Writes <ckpt>_probe_<type>.json and .png (an earlier probe's are replaced, nothing else).
"""

import json
import sys
from collections import defaultdict
from statistics import mean

import torch

from configurator import configure
from dropout import PRE_LINEAR, pre_linear
from ruler import eval_outputs, load_for_eval
from tools.variance import pre_norm_drift, variance_mismatch
from tokens import TokenData, batch_rng

# Fig. 3, first / last 18 layers of SmolLM3-3B
PAPER = {'pre_linear': (0.29, 0.37), 'vpad': (0.09, 0.06)}

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
    raise SystemExit(f"config error: dropout must be below 1 (a negative value: the model's own), "
                     f"length >= 0 (0: the training length) and batch_size >= 1, got {dropout}, "
                     f"{length}, {batch_size}")
model, _, info = load_for_eval(ckpt, device, 'the probe')
c = model.config
dropout_type = dropout_type or c.dropout_type
if dropout_type not in PRE_LINEAR:
    raise SystemExit(f"the model was trained with dropout_type={c.dropout_type!r}: give "
                     f"--dropout_type={' or '.join(PRE_LINEAR)}")
p = dropout if dropout >= 0 else (c.dropout or 0.1)
try:
    op = pre_linear(dropout_type, p, vpad_variant or c.vpad_variant)
except ValueError as e:
    raise SystemExit(f"config error: {e}")
out = out or f"{ckpt.removesuffix('.pt').rstrip('/')}_probe_{dropout_type}"
eval_outputs(out, 'tools/probe_variance.py', results=False, overwrite=True)  # before the work
config = info.get('config', {})
length = length or config.get('block_size') or 1024
try:
    data = TokenData(data_dir or config.get('data_dir', ''), split)
except (FileNotFoundError, ValueError) as e:
    raise SystemExit(str(e))
torch.manual_seed(seed)
try:
    idx = data.batch(batch_size, length, batch_rng(seed, 1))[0].to(device)
except ValueError as e:  # no document as long as the window
    raise SystemExit(f"{e}: give a shorter --length")

rows = variance_mismatch(model, idx, op)
drift = pre_norm_drift(model, idx, p)

# per layer: mean |relative error| over its matrices, mean r and the predictions
by_layer = defaultdict(list)
for row in rows:
    by_layer[row['layer']].append(row)
layers = {l: {'rel_err': mean(abs(r['rel_err']) for r in rs),
              'signed': mean(r['rel_err'] for r in rs), 'r': mean(r['r'] for r in rs),
              'predicted': mean(abs(r['predicted_' + dropout_type]) for r in rs)}
          for l, rs in sorted(by_layer.items())}
half = len(layers) // 2
halves = [mean(layers[l]['rel_err'] for l in ls)
          for ls in (list(layers)[:half or 1], list(layers)[half:])]
cos = {l: [d['cosine'] for d in drift if d['layer'] == l] for l in layers}

name = f"{dropout_type}{'' if dropout_type != 'vpad' else ' ' + op.variant}, p = {p}"
print(f"{ckpt}: {name}, {batch_size} windows of {length} tokens\n")
print(f"{'layer':>5} {'|rel err|':>10} {'signed':>8} {'r':>7} {'predicted':>10}   "
      f"pre-norm cosine (p = {p})")
for l, v in layers.items():
    print(f"{l:>5} {v['rel_err']:>10.4f} {v['signed']:>8.4f} {v['r']:>7.3f} "
          f"{v['predicted']:>10.4f}   "
          + ' '.join(f"{x:.4f}" for x in cos[l]))
print(f"\nrelative variance error, first / second half of the layers: {halves[0]:.3f} / "
      f"{halves[1]:.3f}   (paper, SmolLM3-3B: {PAPER[dropout_type][0]} / {PAPER[dropout_type][1]})")

with open(out + '.json', 'w') as f:
    json.dump({'ckpt': ckpt, 'dropout_type': dropout_type, 'p': p,
               'vpad_variant': op.variant if dropout_type == 'vpad' else None,
               'batch_size': batch_size, 'length': length, 'first_half': halves[0],
               'second_half': halves[1], 'paper': PAPER[dropout_type], 'layers': layers,
               'matrices': rows, 'pre_norm_drift': drift}, f, indent=1)
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
ls = list(layers)
a.bar([l - 0.2 for l in ls], [layers[l]['rel_err'] for l in ls], width=0.4, label='measured')
a.bar([l + 0.2 for l in ls], [layers[l]['predicted'] for l in ls], width=0.4,
      label='predicted from r')
a.set_xlabel('layer')
a.set_ylabel('|Var[y train] - Var[y eval]| / Var[y eval]')
a.set_title(f"pre-activation variance mismatch, {name}", fontsize=9)
a.legend(fontsize=8)
for norm in sorted({d['norm'] for d in drift}):
    mine = [d for d in drift if d['norm'] == norm]
    b.plot([d['layer'] for d in mine], [d['cosine'] for d in mine], marker='o', label=norm)
b.set_xlabel('layer')
b.set_ylabel('cosine(normalised input, train vs eval)')
b.set_title(f"pre-norm view: pre-norm dropout p = {p}", fontsize=9)
b.legend(fontsize=8)
fig.tight_layout()
fig.savefig(out + '.png', dpi=120)
print(f"wrote {out}.json and {out}.png")
