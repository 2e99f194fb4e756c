"""
Per-position cross-entropy beyond the training length (the paper's Figures 1, 4 and 6): the
loss at every position of long documents, averaged over documents, smoothed with a moving
average, summarised per length band, and drawn for one or several checkpoints on one plot.

    python eval_loss.py --ckpt=out/quickstart/ckpt_000488.pt --max_length=4096 --smooth=64
    python eval_loss.py --ckpt="['out/scratch_wd/ckpt_076293.pt', 'out/scratch_vpad/ckpt_076293.pt']" \\
        --data_dir=data/common_pile_arxiv/gpt2 --max_length=32768

Documents come from a token shard (data_dir, split): every one at least max_length + 1 tokens
long, each read from its first token (windows_per_doc > 1 adds later windows of the same
documents). Losses go through the model's cache chunk by chunk, never T x vocab logits at once.
Writes <out>.json (per checkpoint: the raw and the smoothed curve, the bands) and <out>.png.
"""

import json
import math
import os
import sys
from contextlib import nullcontext

import torch


def loss_curve(model, windows, chunk_size, device, autocast=nullcontext()):
    """Summed cross-entropy per position over windows (n, T+1) -> (T,), and the number of windows."""
    curve = torch.zeros(windows.size(1) - 1, device=device)
    for w in windows:
        w = w[None].to(device)
        with autocast:
            curve += model.position_losses(w[:, :-1], w[:, 1:], chunk_size=chunk_size)[0].float()
    return curve, len(windows)


def band_means(curve, edges):
    """Mean of curve over positions [edges[i], edges[i+1]) -> {'lo-hi': mean}."""
    return {f'{lo}-{hi}': curve[lo:hi].mean().item() for lo, hi in zip(edges, edges[1:])}


def length_bands(curve, train_length):
    """Mean loss inside the training length L, then over 1-2x, 2-4x, ... of it: {'<=1x': ..., '1-2x': ...}."""
    edges = [0, train_length]
    while edges[-1] < len(curve):
        edges.append(min(2 * edges[-1], len(curve)))
    means = band_means(curve, edges)
    return {('<=1x' if lo == 0 else f"{lo / train_length:g}-{hi / train_length:g}x"): m
            for (lo, hi), m in zip(zip(edges, edges[1:]), means.values())}


def moving_average(curve, window):
    """Trailing moving average: position t averages positions max(0, t-window+1) .. t."""
    c = torch.cat([curve.new_zeros(1), curve.double().cumsum(0)])
    t = torch.arange(1, len(curve) + 1)
    return ((c[t] - c[(t - window).clamp(min=0)]) / (t - (t - window).clamp(min=0))).float()


@torch.no_grad()
def attention_entropy(net, windows):
    """Entropy (nats) of every head's attention distribution at every query position, averaged
    over windows (n, T+1) -> (n_layer, n_head, T). For this call, model.py's attention function is
    swapped for the same softmax attention written out (eval mode: no dropout), which also records
    -sum_j p_ij log p_ij of each query i. Uniform attention over t+1 visible keys gives log(t+1)."""
    import model  # the module whose attention function is swapped
    from attention import mask_and_bias, repeat_kv
    rows = []  # (H, Tq) per attention call: layer after layer, window after window

    def softmax_attention(q, k, v, q_start, k_start, slopes=None, window=0, dropout_p=0.0, backend='sdpa', alpha=1.0):
        if alpha != 1.0:
            raise ValueError("attention_entropy is written for softmax attention (attn_alpha = 1)")
        k, v = repeat_kv(q, k, v)  # (B, H, Tk, hd)
        ys, hs = [], []
        for i in range(0, q.size(2), 256):  # 256 queries at a time: their scores stay in cache
            qi = q[:, :, i:i + 256]  # (B, H, rows, hd)
            allowed, bias = mask_and_bias(q_start + i, qi.size(2), k_start, k.size(2), slopes, window, q.device)
            scores = (qi @ k.transpose(-2, -1)).float() / math.sqrt(q.size(-1))  # (B, H, rows, Tk)
            if bias is not None:
                scores = scores + bias
            p = scores.masked_fill(~allowed, float('-inf')).softmax(-1)
            hs.append(-torch.special.xlogy(p, p).sum(-1).sum(0))  # (H, rows), summed over the batch
            ys.append(p.to(v.dtype) @ v)
        rows.append(torch.cat(hs, 1))  # (H, Tq)
        return torch.cat(ys, 2)

    original, model.attention = model.attention, softmax_attention
    try:
        for w in windows:
            net.hidden(w[None, :-1])
    finally:
        model.attention = original
    L = net.config.n_layer
    return torch.stack([sum(rows[i::L]) for i in range(L)]) / len(windows)  # (L, H, T)


if __name__ == '__main__':
    import checkpoint
    from configurator import configure
    from tokens import TokenData, same_tokenizer

    # -------------------------------------------------------------------------
    ckpt: str | list = ''  # one checkpoint (or weights folder), or a list of them
    data_dir = ''  # default: the data_dir of the first checkpoint's training config
    split = 'val'
    max_length = 0  # default: 16x the training length of the first checkpoint
    train_length = 0  # default: the checkpoint's block_size (give it for a weights folder)
    docs = 16  # documents (windows) to average over
    windows_per_doc = 1  # > 1: also the next windows of each document (they start mid-document)
    smooth = 512  # moving-average window, as the paper's figures
    chunk_size = 1024
    window: int | list | None = None  # replaces the models' sliding windows (e.g. the paper's "SW" without CPT)
    out = ''  # default: next to the first checkpoint, <ckpt>_loss
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    dtype = 'bfloat16' if torch.cuda.is_available() else 'float32'
    # -------------------------------------------------------------------------
    globals().update(configure(globals(), sys.argv[1:]))
    ckpts = [ckpt] if isinstance(ckpt, str) else ckpt
    if not ckpts or not ckpts[0]:
        raise SystemExit("give a checkpoint: --ckpt=out/quickstart/ckpt_000488.pt, or a list of them")
    autocast = torch.autocast(device.split(':')[0], dtype=torch.bfloat16) if dtype == 'bfloat16' else nullcontext()
    out = out or ckpts[0].removesuffix('.pt').rstrip('/') + '_loss'

    results, data = {}, None
    for path in ckpts:
        model, tokenizer, info = checkpoint.load_for_eval(path, device, 'the per-position loss', window)
        trained_on = train_length or info.get('config', {}).get('block_size', 0)
        if not trained_on:
            raise SystemExit(f"{path} does not say its training length: give --train_length")
        if data is None:
            data_dir = data_dir or info.get('config', {}).get('data_dir', '')
            try:
                data = TokenData(data_dir, split)
            except FileNotFoundError as e:
                raise SystemExit(str(e))
            max_length = max_length or 16 * trained_on
            windows = data.long_windows(max_length, docs, per_document=windows_per_doc)
            if windows is None:
                longest = max((b - a for _, a, b in data.doc_spans()), default=0)
                raise SystemExit(f"no document in {data_dir} ({split}) has {max_length + 1} tokens (the longest has "
                                 f"{longest}): ask for a shorter --max_length, or use longer documents "
                                 f"(data/common_pile_arxiv/prepare.py)")
        if not same_tokenizer(info['tokenizer'], data.meta['tokenizer']):
            raise SystemExit(f"{path} uses tokenizer {info['tokenizer']}, {data_dir} is tokenized with {data.meta['tokenizer']}")
        checkpoint.check_length(model, max_length, path)
        total, n = loss_curve(model, windows, chunk_size, device, autocast)
        curve = (total / n).cpu()
        results[path] = {'step': info['step'], 'train_length': trained_on, 'bands': length_bands(curve, trained_on),
                         'curve': curve.tolist(), 'smoothed': moving_average(curve, smooth).tolist()}
        print(f"{path}: {n} windows of {max_length + 1} tokens")

    # the table, the JSON, the figure
    print(f"\nmean cross-entropy (nats/token) per band of positions ({len(windows)} windows of {data_dir}, {split})")
    header = None
    for path, r in results.items():
        if header != (r['train_length'], list(r['bands'])):
            header = (r['train_length'], list(r['bands']))
            print(f"{'checkpoint (trained on ' + str(r['train_length']) + ')':<44}" + ''.join(f"{k:>10}" for k in r['bands']))
        print(f"{os.path.relpath(path):<44}" + ''.join(f"{v:>10.4f}" for v in r['bands'].values()))
    with open(out + '.json', 'w') as f:
        json.dump({'data_dir': data_dir, 'split': split, 'documents': len(windows), 'max_length': max_length,
                   'smooth': smooth, 'checkpoints': results}, f)
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for path, r in results.items():
        ax.plot(range(1, max_length + 1), r['smoothed'], label=os.path.relpath(path), linewidth=1.2)
    for L in sorted({r['train_length'] for r in results.values()}):
        ax.axvline(L, linestyle=':', color='k', linewidth=1)
    ax.set_xlabel('position')
    ax.set_ylabel(f'cross-entropy (nats), {smooth}-position moving average')
    ax.set_title(f"per-position loss, {len(windows)} windows; dotted: the training length")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out + '.png', dpi=120)
    print(f"wrote {out}.json and {out}.png")
