"""
NIAH-1, as RULER's niah_single_1 (the paper's Tables 1, 5, 8, 12): one 7-digit number under a
word key, hidden at a random line of the repeated "The grass is green. ..." haystack, the prompt
sized to each length with the model's own tokenizer, greedy answers of up to 128 tokens, scored
by RULER's string_match_all. Also the classic view: the needle at fixed depths, a depth x length
heatmap. `--task=niah_single_1_short` scores its short form (ruler.py) instead, for models trained
on a few hundred bytes (docs/study.md's Tables 1 and 5 parts).

    python eval_niah.py --ckpt=out/quickstart/ckpt_000488.pt --lengths="[1024, 2048, 4096, 8192]"
    python eval_niah.py --ckpt="['out/a/ckpt_000488.pt', 'out/a/ckpt_000488.pt', \
        'out/b/avg10_000400-000488.pt']" --sw="[1]" --window=256 --table=out/t  # a, a SW, b K=10

Writes, next to the checkpoint: <ckpt>_niah.jsonl (every sample: its length in tokens, the
answer, the prediction, the score; an interrupted run continues from it), <ckpt>_niah.json (the
summary) and <ckpt>_niah.png (the heatmap). With several checkpoints, each row's files are
written so (a --window view's as <ckpt>_sw_niah.*), a row already scored is read back, and the
table, lengths as columns and the training length marked, is printed and written to
--table.md and --table.json (the paper's Tables 1, 5, 12 from their rows). Takes any checkpoint
or weights folder that checkpoint.load_model reads. The samples are read back only under the
settings that made them (ruler.Results): other settings at the same --out are refused, or
recomputed with --overwrite=True.
"""

import json
import os
import sys
from typing import Literal

import torch

import ruler


def heatmap(path, heat, lengths, depths, title):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    grid = [[heat[d][L] for L in lengths] for d in depths]
    fig, ax = plt.subplots(figsize=(1.2 * len(lengths) + 2, 0.5 * len(depths) + 1.5))
    im = ax.imshow(grid, cmap='RdYlGn', vmin=0, vmax=100, aspect='auto')
    ax.set_xticks(range(len(lengths)), [ruler.length_label(L) for L in lengths])
    ax.set_yticks(range(len(depths)), [f"{d}%" for d in depths])
    for y, row in enumerate(grid):
        for x, v in enumerate(row):
            ax.text(x, y, f"{v:.0f}", ha='center', va='center', fontsize=8)
    ax.set_xlabel('context length (tokens)')
    ax.set_ylabel('needle depth')
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label='score')
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == '__main__':
    from configurator import configure

    # -------------------------------------------------------------------------
    ckpt: str | list = ''  # a checkpoint file or weights folder; or a list: a table row each
    labels: list = []  # the rows' names; default: the run's folder, K=n for an average, SW
    sw: list[int] = []  # with a list of checkpoints, the rows (from 0) that take --window; [] all
    train_length = 0  # the length marked in the table; 0: the first row's block_size
    table = ''  # the table's .md and .json; default: beside the first checkpoint, <name>_niah_table
    lengths: list[int] = [1024, 2048, 4096, 8192, 16384]  # prompt + generated, the model's tokens
    samples = 20  # NIAH-1 samples per length
    depths: list[int] = [0, 25, 50, 75, 100]  # needle depths (% of the haystack); [] for none
    depth_samples = 2  # samples per depth and length
    seed = 42
    task: Literal['niah_single_1', 'niah_single_1_short'] = 'niah_single_1'  # the short: ruler.py
    window: int | list | None = None  # replaces the model's sliding windows (the paper's "SW")
    overrides: dict | None = None  # model arguments no weight depends on: {'rope_scaling': 'yarn'}
    chunk_size = 1024  # prefill chunk: a prompt's memory grows with chunk x length, not length^2
    overwrite = False  # recompute the results saved at out (of other settings: a window, a seed)
    out = ''  # one checkpoint's output prefix; default: its path without .pt, plus _niah
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    dtype: Literal['bfloat16', 'float32'] = 'bfloat16' if torch.cuda.is_available() else 'float32'
    # -------------------------------------------------------------------------
    LIMITS = {'lengths': (1, None), 'samples': (1, None), 'depths': (0, 100, []),
              'depth_samples': (0, None), 'seed': (0, None), 'chunk_size': (1, None),
              'train_length': (0, None), 'sw': (0, None, [])}
    globals().update(configure(globals(), sys.argv[1:], limits=LIMITS))
    paths, views, outs, table = ruler.eval_rows(ckpt, labels, sw, window, out, table, '_niah',
                                                'eval_niah.py')  # checked before any sample
    several = isinstance(ckpt, list)
    name = 'RULER niah_single_1' if task == 'niah_single_1' else f"{task}, RULER's form shortened"
    title = f"NIAH-1 ({name}, {samples} samples per length, string_match_all x 100)"
    rows = []
    for row, o, model, tokenizer, autocast, results in ruler.each_row(
            paths, views, outs, labels, window, overrides, 'eval_niah.py', 'NIAH', max(lengths),
            overwrite, device, dtype, seed=seed, chunk_size=chunk_size,
            **({} if task == 'niah_single_1' else {'task': task}),
            **ruler.prompt_settings([task], ruler.Data())):
        try:
            summary = ruler.evaluate_niah(model, tokenizer, results, lengths, samples, depths,
                                          depth_samples, seed, device, chunk_size, autocast, task)
        except ValueError as e:  # a length too short for the task
            raise SystemExit(f"{e}: leave that length out of --lengths")
        rows.append({**row, 'score': summary['niah_1']})
        if not several:
            print(f"\n{title}")
            print(f"{'model':<24}" + ''.join(f"{ruler.length_label(L):>8}" for L in lengths))
            print(f"{os.path.basename(row['ckpt'].rstrip('/')):<24}"
                  + ''.join(f"{summary['niah_1'][L]:>8.1f}" for L in lengths))
        with open(o + '.json', 'w') as f:
            json.dump({'ckpt': row['ckpt'], 'step': row['step'], 'task': task, 'samples': samples,
                       'seed': seed, 'depth_samples': depth_samples, **summary}, f, indent=2)
        if depths:
            heatmap(o + '.png', summary['depth_x_length'], lengths, depths,
                    f"NIAH: {row['label']}, {depth_samples} samples per cell")
        print(f"wrote {o}.json, {o}.jsonl" + (f", {o}.png" if depths else ""))
        del model
    if several:
        ruler.write_table(table, rows, lengths, train_length or rows[0]['block_size'], title)
