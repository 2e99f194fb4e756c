"""
Per-position cross-entropy beyond the training length (the paper's Figures 1, 4 and 6): the
loss at every position of long documents, averaged over documents, smoothed with a moving
average, summarised per length band, and drawn for one or several checkpoints on one plot.

    python eval_loss.py --ckpt=out/quickstart/ckpt_000488.pt --max_length=4096 --smooth=64
    python eval_loss.py --ckpt="['out/wd/ckpt_076293.pt', 'out/vpad/ckpt_076293.pt']" \\
        --data_dir=data/common_pile_arxiv/gpt2 --max_length=32768

Documents come from a token shard (data_dir, split): every one at least max_length + 1 tokens
long, each read from its first token (windows_per_doc > 1 adds later windows of the same
documents). Losses go through the model's cache chunk by chunk, never T x vocab logits at once.
Writes <out>.json (per checkpoint: the raw and the smoothed curve, the bands) and <out>.png.
"""

import json
import os
import sys
from typing import Literal

import torch

from configurator import configure
from measures import band_edges, length_bands, loss_curve, moving_average
from ruler import autocast, check_length, eval_outputs, load_for_eval
from tokens import TokenData, same_tokenizer

# -------------------------------------------------------------------------
ckpt: str | list = ''  # one checkpoint (or weights folder), or a list of them: a row each
labels: list = []  # the rows' and the figure's names; default: each checkpoint's path
data_dir = ''  # default: the data_dir of the first checkpoint's training config
split = 'val'
max_length = 0  # default: 16x the training length of the first checkpoint
train_length = 0  # default: the checkpoint's block_size (give it for a weights folder)
docs = 16  # documents (windows) to average over
windows_per_doc = 1  # > 1: also the next windows of each document (they start mid-document)
smooth = 512  # moving-average window, as the paper's figures
chunk_size = 1024
window: int | list | None = None  # replaces the models' sliding windows (the paper's "SW")
overrides: dict | None = None  # model arguments no weight depends on: {'rope_scaling': 'yarn'}
out = ''  # default: next to the first checkpoint, <ckpt>_loss
overwrite = False  # replace an earlier <out>.json and .png of this script
device = 'cuda' if torch.cuda.is_available() else 'cpu'
dtype: Literal['bfloat16', 'float32'] = 'bfloat16' if torch.cuda.is_available() else 'float32'
# -------------------------------------------------------------------------
LIMITS = {'max_length': (1, None, 0), 'train_length': (1, None, 0), 'docs': (1, None),
          'windows_per_doc': (1, None), 'smooth': (1, None), 'chunk_size': (1, None)}
globals().update(configure(globals(), sys.argv[1:], limits=LIMITS))
ckpts = [ckpt] if isinstance(ckpt, str) else ckpt
if not ckpts or not ckpts[0]:
    raise SystemExit("give a checkpoint: --ckpt=out/quickstart/ckpt_000488.pt, or a list of them")
if labels and len(labels) != len(ckpts):
    raise SystemExit(f"{len(ckpts)} checkpoints but {len(labels)} labels: give one per checkpoint")
names = dict(zip(ckpts, labels or [os.path.relpath(p) for p in ckpts]))
precision = autocast(device, dtype)
out = out or ckpts[0].removesuffix('.pt').rstrip('/') + '_loss'
eval_outputs(out, 'eval_loss.py', results=False, overwrite=overwrite)

results, data = {}, None
for path in ckpts:
    model, tokenizer, info = load_for_eval(path, device, 'the per-position loss', window,
                                           overrides)
    trained_on = train_length or info.get('config', {}).get('block_size', 0)
    if not trained_on:
        raise SystemExit(f"{path} does not say its training length: give --train_length")
    if data is None:
        data_dir = data_dir or info.get('config', {}).get('data_dir', '')
        try:
            data = TokenData(data_dir, split)
        except (FileNotFoundError, ValueError) as e:
            raise SystemExit(str(e))
        max_length = max_length or 16 * trained_on
        windows = data.long_windows(max_length, docs, per_document=windows_per_doc)
        if windows is None:
            longest = max((b - a for _, a, b in data.doc_spans()), default=0)
            raise SystemExit(f"no document in {data_dir} ({split}) has {max_length + 1} tokens "
                             f"(the longest has {longest}): ask for a shorter --max_length, or use "
                             f"longer documents (data/common_pile_arxiv/prepare.py)")
        if len(windows) < docs:  # never fewer than asked without saying so
            later = len(data.long_windows(max_length, docs))  # with later windows of each
            print(f"asked for {docs} windows of {max_length + 1} tokens; {data_dir} ({split}) has "
                  f"{len(windows)} at {windows_per_doc} per document: evaluating {len(windows)}"
                  + (f" (--windows_per_doc={docs} takes later windows too: {later})"
                     if later > len(windows) else ''))
    if not same_tokenizer(info['tokenizer'], data.meta['tokenizer']):
        raise SystemExit(f"{path} uses tokenizer {info['tokenizer']}, {data_dir} is tokenized with "
                         f"{data.meta['tokenizer']}")
    check_length(model, max_length, path)
    total, n = loss_curve(model, windows, chunk_size, device, precision)
    curve = (total / n).cpu()
    results[path] = {'label': names[path], 'step': info['step'], 'train_length': trained_on,
                     'bands': length_bands(curve, trained_on),
                     'curve': curve.tolist(), 'smoothed': moving_average(curve, smooth).tolist()}
    print(f"{path}: {n} windows of {max_length + 1} tokens")

# the table, the JSON, the figure
print(f"\nmean cross-entropy (nats/token) per band of positions ({len(windows)} windows of "
      f"{data_dir}, {split})")
header = None
for path, r in results.items():
    if header != (r['train_length'], list(r['bands'])):
        header = (r['train_length'], list(r['bands']))
        title = f"checkpoint (trained on {r['train_length']})"
        print(f"{title:<44}" + ''.join(f"{k:>10}" for k in r['bands']))
        # the same bands in positions, as train.py's closing table names them
        edges = band_edges(r['train_length'], max_length)
        print(f"{'positions':<44}" + ''.join(f"{f'{a}-{b}':>10}" for a, b in zip(edges, edges[1:])))
    print(f"{names[path]:<44}" + ''.join(f"{v:>10.4f}" for v in r['bands'].values()))
with open(out + '.json', 'w') as f:
    json.dump({'data_dir': data_dir, 'split': split, 'documents': len(windows), 'asked': docs,
               'max_length': max_length, 'smooth': smooth, 'checkpoints': results}, f)
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(8, 4.5))
for path, r in results.items():
    ax.plot(range(1, max_length + 1), r['smoothed'], label=r['label'], linewidth=1.2)
for L in sorted({r['train_length'] for r in results.values()}):
    ax.axvline(L, linestyle=':', color='k', linewidth=1)
ax.set_xlabel('position')
ax.set_ylabel(f'cross-entropy (nats), {smooth}-position moving average')
ax.set_title(f"per-position loss, {len(windows)} windows; dotted: the training length")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(out + '.png', dpi=120)
print(f"wrote {out}.json and {out}.png")
