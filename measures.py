"""
The measures of a trained model, shared by the scripts that report them (train.py's evaluation,
eval_loss.py, tools/study.py): the loss at the training length, per-position cross-entropy and
its length bands, the accuracy of a symbol task by length, the entropy of attention by query
position, and the size of the matrices weight decay acts on: functions of a model and its data,
no files, no plots. (An eval script's start-up and its table: ruler.py's harness. The variance
mismatch of the paper's Figure 3: tools/variance.py.)
"""

from contextlib import nullcontext

import torch

import hardware
from tokens import VAL, batch_rng

# -----------------------------------------------------------------------------
# Per-position cross-entropy (Figures 1, 4 and 6)

def loss_curve(model, windows, chunk_size, device, autocast=nullcontext()):
    """Summed cross-entropy per position over windows (n, T+1) -> (T,), and the number of
    windows."""
    curve = torch.zeros(windows.size(1) - 1, device=device)
    for w in windows:
        w = w[None].to(device)
        with autocast:
            curve += model.position_losses(w[:, :-1], w[:, 1:], chunk_size=chunk_size)[0].float()
    return curve, len(windows)


def val_loss(model, data, n, batch_size, block_size, seed, device, autocast=nullcontext(),
             rank=0, world=1, reduce=lambda t: t):
    """train.py's loss at the training length: the mean over the validation batches 0..n-1 (the VAL
    stream of batch_rng: the same ones at every evaluation), this process taking its
    hardware.share()."""
    tally = torch.zeros(2, device=device)  # loss sum, count
    for i, real in hardware.share(n, rank, world):
        x, y = data.batch(batch_size, block_size, batch_rng(seed, VAL, i))
        with autocast:
            loss = model(x.to(device), y.to(device))[1].float()
        if real:
            tally += torch.stack([loss, torch.ones_like(loss)])
    tally = reduce(tally)
    return {'val_loss': (tally[0] / tally[1]).item()}


def position_loss(model, data, lengths, n_windows, chunk_size, device, autocast=nullcontext(),
                  rank=0, world=1, reduce=lambda t: t):
    """train.py's measure beyond the training length: the mean per-position loss in doubling bands
    of lengths, (L1/2, L1], (L1, L2], ..., over n_windows validation windows that start at document
    starts, this process taking its hardware.share() and reduce() summing over the processes.
    -> {'position_loss': {band: mean}, 'windows': n}, or {} if no document is long enough."""
    windows = data.long_windows(max(lengths), n_windows)
    if windows is None:
        return {}
    total = torch.zeros(windows.size(1), device=device)  # per position, then the count
    for i, real in hardware.share(len(windows), rank, world):
        curve, _ = loss_curve(model, windows[i:i + 1], chunk_size, device, autocast)
        if real:
            total += torch.cat([curve, curve.new_ones(1)])
    total = reduce(total)
    edges = [min(lengths) // 2] + sorted(lengths)
    return {'position_loss': band_means(total[:-1] / total[-1], edges), 'windows': len(windows)}


def task_accuracy(task, model, lengths, n, seed, device, autocast=nullcontext(), rank=0, world=1,
                  reduce=lambda t: t):
    """The exact-match accuracy of greedy answers (copies, needle values) by length, and the
    fraction of answer tokens that are right (tasks.correct_answers), shared among processes."""
    from tasks import correct_answers  # the symbol tasks (docs/study.md): not a language run's
    with autocast:
        correct = correct_answers(task, model, lengths, n, seed, device, rank=rank, world=world)
    correct = (reduce(correct) / n).tolist()
    return {'accuracy': {str(L): c[0] for L, c in zip(lengths, correct)},
            'token_accuracy': {str(L): c[1] for L, c in zip(lengths, correct)}}


@torch.no_grad()
def evaluate(model, c, batch_size, train_data, val_data, sharded=False, say=print, **shared):
    """train.py's evaluation of model (c: its config; batch_size: its micro-batch): the loss at the
    training length and, at c['eval_lengths'], the per-position loss (lm) or the accuracy of greedy
    answers (tasks). shared: device, autocast, rank, world, reduce; each process takes its share,
    the same number of forwards (FSDP's all run each one at once). In eval mode, then back."""
    model.eval()
    block_size = c['block_size']  # the training length
    result = val_loss(model, val_data, c['eval_iters'], batch_size, block_size, c['seed'], **shared)
    lengths = c['eval_lengths']
    if sharded and lengths:  # the embedding and the head live outside the blocks: gathered
        model.unshard()
    if lengths and c['task'] == 'lm':
        result.update(position_loss(model, val_data, lengths, c['eval_windows'], block_size,
                                    **shared))
        if 'windows' not in result:
            say(f"(no validation document is longer than {max(lengths)} tokens: no per-position "
                f"loss)")
    elif lengths:
        result.update(task_accuracy(train_data, model, lengths, c['task_eval_samples'],
                                    c['seed'], **shared))
    if sharded and lengths:
        model.reshard()
    model.train()
    return result


def eval_line(it, result, task):
    """train.py's line for one evaluation."""
    bands = '  '.join(f"{k}: {v:.4f}" for k, v in result.get('position_loss', {}).items())
    answers = '  '.join(f"{k}: {v:.2f}" for k, v in result.get('accuracy', {}).items())
    return (f"iter {it}: val loss {result['val_loss']:.4f}"
            + (f" | per-position loss {bands}" if bands else "")
            + (f" | {task} accuracy by length {answers}" if answers else ""))


def report(result, it, c):
    """The final table of a train.py run (c: its config): per-position loss by band (and against
    the first), or accuracy by length (exact and per token)."""
    if 'position_loss' in result:
        bands = result['position_loss']
        base = next(iter(bands.values()))
        what = (f"\nper-position validation loss (nats/token) of {c['out_dir']} at iteration "
                f"{it}, trained on {c['block_size']} tokens ({result['windows']} windows of "
                f"{max(c['eval_lengths'])}):")
        row = lambda name, cells: f"{name:>12}" + ''.join(cells)  # noqa: E731
        return '\n'.join([what, row('positions', (f"{k:>12}" for k in bands)),
                          row('loss', (f"{v:>12.4f}" for v in bands.values())),
                          row('vs first', (f"{v - base:>+12.4f}" for v in bands.values()))])
    from tasks import LENGTHS
    what = (f"\n{c['task']} accuracy of {c['out_dir']} at iteration {it}, trained on "
            f"{LENGTHS[c['task']]} {c['task_min_len']}-{c['task_max_len']} "
            f"({c['task_eval_samples']} held-out samples per length): exact-match answers, and "
            f"the fraction of right tokens")
    row = lambda name, cells: f"{name:>10}" + ''.join(cells)  # noqa: E731
    return '\n'.join([what, row('length', (f"{k:>8}" for k in result['accuracy'])),
                      row('exact', (f"{v:>8.2f}" for v in result['accuracy'].values())),
                      row('tokens', (f"{v:>8.2f}" for v in result['token_accuracy'].values()))])


def band_means(curve, edges):
    """Mean of curve over positions [edges[i], edges[i+1]) -> {'lo-hi': mean}."""
    return {f'{lo}-{hi}': curve[lo:hi].mean().item() for lo, hi in zip(edges, edges[1:])}


def band_edges(train_length, n):
    """The positions where length_bands' bands start and end for a curve of n positions: 0, L,
    2L, 4L, ... up to n."""
    edges = [0, train_length]
    while edges[-1] < n:
        edges.append(min(2 * edges[-1], n))
    return edges


def length_bands(curve, train_length):
    """Mean loss inside the training length L, then over 1-2x, 2-4x, ... of it:
    {'<=1x': ..., '1-2x': ...}."""
    edges = band_edges(train_length, len(curve))
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
    over windows (n, T+1) -> (n_layer, n_head, T). Through each Attention block's `record` hook:
    the probabilities written out in eval mode, -sum_j p_ij log p_ij of each query i. Uniform
    attention over t+1 visible keys gives log(t+1)."""
    if net.config.attn_alpha != 1.0:
        raise ValueError("attention_entropy is written for softmax attention (attn_alpha = 1)")
    blocks = [block.attn for block in net.layers]
    rows = [[] for _ in blocks]  # per layer: (H, rows) per slice of queries, window after window
    for attn, out in zip(blocks, rows):
        # (H, rows): -sum_j p_ij log p_ij, summed over the batch
        attn.record = lambda p, out=out: out.append(-torch.special.xlogy(p, p).sum(-1).sum(0))
    try:
        for w in windows:
            net.hidden(w[None, :-1])
    finally:
        for attn in blocks:
            attn.record = None
    n = len(rows[0]) // len(windows)  # slices of queries per window
    # (H, T) each: a window's slices side by side, summed over windows
    per_layer = [sum(torch.cat(out[i:i + n], 1) for i in range(0, len(out), n)) for out in rows]
    return torch.stack(per_layer) / len(windows)  # (L, H, T)


# -----------------------------------------------------------------------------
# What weight decay acts on

def decayed(model, decay_embeddings=False):
    """The parameters AdamW decays (train.py's first group): the matrices, but not the embeddings
    (unless decay_embeddings) nor those marked _no_weight_decay (Mamba2's A, D, dt bias)."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    return [p for p in model.parameters()
            if p.dim() >= 2 and (decay_embeddings or id(p) not in embeddings)
            and not getattr(p, '_no_weight_decay', False)]


def decayed_norm(model, decay_embeddings=False):
    """The Frobenius norm of every decayed matrix together, sqrt(sum ||W||^2): how far weight
    decay pulled the weights in (tools/study.py, against the same run without it)."""
    matrices = decayed(model, decay_embeddings)
    return torch.sqrt(sum(p.detach().float().pow(2).sum() for p in matrices)).item()
