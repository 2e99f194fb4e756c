"""
What the evaluations share. An eval script's start-up (eval_setup: a checkpoint loaded for it,
its precision, the length it can take) and the check of its outputs before anything is computed
(eval_outputs, eval_settings). Then the measures of a trained model, shared by the scripts that
report them (train.py's evaluation, eval_loss.py, tools/study.py): the loss at the training length,
per-position cross-entropy and its length bands, the accuracy of a symbol task by length, and the
entropy of attention by query position: functions of a model and its data, no files, no plots.
(The variance mismatch of the paper's Figure 3: tools/variance.py.)
"""

import hashlib
import json
import os
from contextlib import nullcontext

import torch

import checkpoint
import hardware
from tokens import VAL, batch_rng

# -----------------------------------------------------------------------------
# An eval script's start-up and outputs

def load_for_eval(path, device, purpose, window=None, overrides=None):
    """load_model for an eval script: a clear message (SystemExit) when the checkpoint cannot be
    read or has no tokenizer (`purpose` needs the model's own). window: replaces the model's
    sliding windows (an int for every layer, or a list), e.g. the paper's "SW" without CPT;
    overrides: other model arguments that change no weight, e.g. YaRN (docs/methods.md)."""
    overrides = {**(overrides or {}), **({} if window is None else {'window': window})}
    hardware.check_device(device)
    try:
        model, tokenizer, ckpt = checkpoint.load_model(path, device, **overrides)
    except TypeError as e:  # an argument the model does not have
        raise SystemExit(f"cannot load {path} with overrides {overrides}: {e}")
    except (OSError, RuntimeError, ValueError) as e:
        raise SystemExit(f"cannot load {path}: {e}")
    if tokenizer is None:
        raise SystemExit(f"{path} has no tokenizer (tokenizer.json): {purpose} needs the model's "
                         f"own tokenizer")
    return model, tokenizer, ckpt


def check_length(model, length, path):
    """SystemExit if the model cannot take `length` tokens: learned absolute positions stop at
    block_size."""
    c = model.config
    if getattr(c, 'pos_encoding', None) == 'learned' and length > c.block_size:
        raise SystemExit(f"{path} has learned absolute positions for {c.block_size} tokens: it "
                         f"cannot take {length}")


def autocast(device, dtype):
    """The eval scripts' precision: 'bfloat16' runs under autocast on the device's type, anything
    else (float32) plain."""
    if dtype != 'bfloat16':
        return nullcontext()
    return torch.autocast(device.split(':')[0], dtype=torch.bfloat16)


def eval_setup(ckpt, device, dtype, purpose, window=None, length=None, overrides=None):
    """The start-up every eval script shares: a SystemExit asking for --ckpt when it is empty, the
    autocast of `dtype`, the model and its tokenizer (load_for_eval: purpose, window, overrides),
    and, given a length, the check that the model can take it (check_length) -> (model, tokenizer,
    checkpoint dict, autocast). device and dtype are the scripts' own (their defaults stay in
    their config)."""
    if not ckpt:
        raise SystemExit("give a checkpoint: --ckpt=out/quickstart/ckpt_000488.pt (or a weights "
                         "folder)")
    context = autocast(device, dtype)
    model, tokenizer, info = load_for_eval(ckpt, device, purpose, window, overrides)
    if length is not None:
        check_length(model, length, ckpt)
    return model, tokenizer, info, context


def digest(state):
    """A fingerprint of a state dict (names, dtypes, shapes and bytes): which weights an evaluation
    scored, so that its saved results are read back for these weights only."""
    h = hashlib.blake2b(digest_size=12)
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous().reshape(-1)
        h.update(f"{name} {t.dtype} {t.numel()}".encode())
        h.update(t.view(torch.uint8).numpy().data)
    return h.hexdigest()


def eval_settings(info, tool, **settings):
    """What an eval script's predictions depend on: the weights (their digest), the tokenizer, the
    script and its settings -> the dict ruler.Results keeps beside the results."""
    return {'tool': tool, 'weights': digest(info['model']), 'tokenizer': info['tokenizer'],
            **settings}


def eval_rows(ckpt, labels, sw, window, out, table, suffix, tool):
    """The rows of an eval script's table, checked before anything runs -> (paths, views, outs,
    table): ckpt is one checkpoint (a row, no table) or a list; views[i]: row i takes --window
    (the rows in sw, or all); outs: each row's output prefix (out for one checkpoint, else beside
    it, <ckpt>_sw<suffix> for a view); table: the table's prefix (default: beside the first
    row's)."""
    paths = ckpt if isinstance(ckpt, list) else [ckpt] if ckpt else []
    several = isinstance(ckpt, list)
    wrong_labels = labels and len(labels) != len(paths)
    if several and (out or wrong_labels or max(sw, default=0) >= len(paths)):
        raise SystemExit(f"with {len(paths)} checkpoints: no --out (each row's results go beside "
                         f"its checkpoint, the table to --table), a label per row if any "
                         f"({len(labels)} given), --sw rows below {len(paths)} (given {sw})")
    views = [window is not None and (not sw or i in sw) for i in range(len(paths))]
    outs = [out or p.removesuffix('.pt').rstrip('/') + ('_sw' if several and w else '') + suffix
            for p, w in zip(paths, views)]
    table = table or (outs[0] + '_table' if several else '')
    for o in outs:
        eval_outputs(o, tool)
    if table:
        check_prefix(table, tool)
        checkpoint.check_output(table + '.json', True, is_summary, tool)
        checkpoint.check_output(table + '.md', True, lambda p: is_summary(table + '.json'), tool)
    return paths or [''], views or [False], outs or [''], table


def each_row(paths, views, outs, labels, window, overrides, tool, purpose, length, overwrite,
             device, dtype, **settings):
    """An eval script's rows (eval_rows), one at a time: the checkpoint loaded with its window
    (eval_setup: purpose, length), its results file read back under its settings only
    (ruler.Results: the script's settings, the window, overrides and dtype) -> yields (row, out,
    model, tokenizer, autocast, results); row: 'label', 'ckpt', 'window', 'step' and
    'block_size', for the script to give its 'score' (write_table)."""
    import ruler
    for i, (path, view, out) in enumerate(zip(paths, views, outs)):
        w = window if view else None
        model, tokenizer, info, context = eval_setup(path, device, dtype, purpose, w, length,
                                                     overrides)
        kept = eval_settings(info, tool, window=w, overrides=overrides, dtype=dtype, **settings)
        row = {'label': labels[i] if labels else row_label(path, info, view), 'ckpt': path,
               'window': w, 'step': info['step'],
               'block_size': info.get('config', {}).get('block_size')}
        yield row, out, model, tokenizer, context, ruler.Results(out + '.jsonl', kept, overwrite)
        del model  # (and the script's reference): the next row loads with this one freed


def row_label(path, info, windowed):
    """A table row's default name: the run's folder (a weights folder's own name), K=n for the
    average of n checkpoints, SW for a view with --window."""
    path = os.path.abspath(path.rstrip('/'))
    name = os.path.basename(os.path.dirname(path) if path.endswith('.pt') else path)
    if info.get('averaged_steps'):
        name += f" K={len(info['averaged_steps'])}"
    return name + (' SW' if windowed else '')


def write_table(table, rows, lengths, train_length, title):
    """An eval script's rows of checkpoints as the paper lays its tables out (lengths as columns,
    the training length marked; each row's 'score' by length): printed, and written as
    table.md and table.json (eval_niah.py, eval_ruler.py, tools/eval_helmet.py, tools/study.py)."""
    from ruler import length_label
    mark = lambda L: length_label(L) + ('*' if L == train_length else '')  # noqa: E731
    width = max(24, *(len(r['label']) + 2 for r in rows))
    print(f"\n{title}" + ("; * the training length" if train_length in lengths else ""))
    print(f"{'row':<{width}}" + ''.join(f"{mark(L):>8}" for L in lengths))
    for r in rows:
        print(f"{r['label']:<{width}}" + ''.join(f"{r['score'][L]:>8.1f}" for L in lengths))
    md = [f"{title}" + ("; * the training length" if train_length in lengths else ""), '',
          '| row | ' + ' | '.join(mark(L) for L in lengths) + ' |',
          '|---' * (len(lengths) + 1) + '|']
    md += [f"| {r['label']} | " + ' | '.join(f"{r['score'][L]:.1f}" for L in lengths) + ' |'
           for r in rows]
    with open(table + '.md', 'w') as f:
        f.write('\n'.join(md) + '\n')
    with open(table + '.json', 'w') as f:
        json.dump({'checkpoints': [r['ckpt'] for r in rows], 'title': title, 'lengths': lengths,
                   'train_length': train_length, 'rows': rows}, f, indent=2)
    print(f"wrote {table}.md, {table}.json")


def is_summary(path):
    """Whether path is an eval script's JSON summary (its 'ckpt' or 'checkpoints' key)."""
    try:
        with open(path) as f:
            found = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(found, dict) and bool({'ckpt', 'checkpoints'} & found.keys())


def check_prefix(out, tool):
    """SystemExit if an output prefix names a folder: 'runs/' or '.' would write hidden files
    (runs/.json) in it."""
    if os.path.basename(out) in ('', '.', '..'):
        raise SystemExit(f"{out} names a folder, but {tool} takes a prefix of files (it writes "
                         f"<prefix>.json and more): give e.g. {os.path.join(out, 'results')}")


def eval_outputs(out, tool, results=True, overwrite=False):
    """check_output for an eval script's outputs, before anything is computed: out.json and out.png
    (an earlier summary of ours is replaced: with results, the results file out.jsonl decides,
    ruler.Results checking its settings; without, only with overwrite) and out.jsonl."""
    check_prefix(out, tool)
    checkpoint.check_output(out + '.json', overwrite or results, is_summary, tool)
    checkpoint.check_output(out + '.png', overwrite or results,
                            lambda p: is_summary(out + '.json'), tool)
    if results:  # whose settings ruler.Results checks
        checkpoint.check_output(out + '.jsonl', True, lambda p: True, tool)


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


def length_bands(curve, train_length):
    """Mean loss inside the training length L, then over 1-2x, 2-4x, ... of it:
    {'<=1x': ..., '1-2x': ...}."""
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
