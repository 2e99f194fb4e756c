"""
RULER (the paper's main long-context metric: Tables 1, 5, 8, 10, 11 and Figure 1): its 13
tasks, generated offline with the model's own tokenizer (ruler.py) and scored as NVIDIA's RULER
does: string_match_all for niah/vt/cwe/fwe, string_match_part for QA, the mean over tasks per
length, and the count of empty predictions.

    python eval_ruler.py --ckpt=out/quickstart/ckpt_000488.pt --lengths="[1024, 2048]" --samples=4
    python eval_ruler.py --ckpt=... --tasks=synthetic     # or a list: --tasks="['vt', 'cwe']"

tasks: a list of task names, or a named set of ruler.SUBSETS: 'paper' (all 13, RULER's headline
average, which we take the paper's "RULER" to be), 'synthetic' (all but QA), 'niah'.
Data: word lists from wonderwords (and RULER's English words for cwe beyond 8166 words); the
essay haystack: Paul Graham's essays in RULER's order (python data/ruler/prepare.py, once, with
internet), or else Shakespeare's plays, said in the table and the JSON; SQuAD v2 dev and
HotpotQA dev (distractor) from --squad / --hotpotqa (the original JSON files) or else through
`datasets`.
A task whose data is missing is skipped and said so, never scored 0.
Writes <ckpt>_ruler.jsonl (every sample; an interrupted run continues) and <ckpt>_ruler.json.
With several checkpoints (--ckpt="['a.pt', 'b.pt']", --labels, --sw with --window: as
eval_niah.py), each row is scored so, a row already scored is read back, and the table of the
RULER averages, lengths as columns, is printed and written to --table.md and --table.json.
The samples are read back only under the settings that made them (ruler.Results): other settings
at the same --out are refused, or recomputed with --overwrite=True.
"""

import json
import math
import os
import sys
from typing import Literal

import torch

import ruler


if __name__ == '__main__':
    from configurator import configure

    # -------------------------------------------------------------------------
    ckpt: str | list = ''  # a checkpoint file or weights folder; or a list: a table row each
    labels: list = []  # the rows' names; default: the run's folder, K=n for an average, SW
    sw: list[int] = []  # with a list of checkpoints, the rows (from 0) that take --window; [] all
    train_length = 0  # the length marked in the table; 0: the first row's block_size
    table = ''  # the table's .md and .json; default: <first checkpoint>_ruler_table
    tasks: str | list = 'paper'  # task names, or a named set of ruler.SUBSETS
    lengths: list[int] = [4096, 8192, 16384, 32768]  # prompt + generated tokens, the model's tokens
    samples = 500  # per task and length (RULER's default)
    seed = 42
    essay = ruler.ESSAY  # Paul Graham's essays (python data/ruler/prepare.py); else Shakespeare
    squad = ''  # SQuAD v2 dev JSON (train-v2.0 layout); default: through `datasets`
    hotpotqa = ''  # HotpotQA dev distractor JSON; default: through `datasets`
    window: int | list | None = None  # replaces the model's sliding windows (the paper's "SW")
    overrides: dict | None = None  # model arguments no weight depends on: {'rope_scaling': 'yarn'}
    chunk_size = 1024  # prefill chunk
    overwrite = False  # recompute the results saved at out (of other settings: a window, a seed)
    out = ''  # one checkpoint's output prefix; default: its path without .pt, plus _ruler
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    dtype: Literal['bfloat16', 'float32'] = 'bfloat16' if torch.cuda.is_available() else 'float32'
    # -------------------------------------------------------------------------
    LIMITS = {'lengths': (1, None), 'samples': (1, None), 'seed': (0, None),
              'chunk_size': (1, None), 'train_length': (0, None),
              'sw': (0, None, [])}  # configurator.check_limits
    globals().update(configure(globals(), sys.argv[1:], limits=LIMITS))
    names = ruler.task_list(tasks)
    paths, views, outs, table = ruler.eval_rows(ckpt, labels, sw, window, out, table, '_ruler',
                                                'eval_ruler.py')  # checked before any sample
    data = ruler.Data(ruler.given_essay(essay), squad, hotpotqa)
    title = (f"RULER, the average over its tasks ({samples} samples per task and length; "
             f"string_match_all, QA string_match_part; x100)")
    rows = []
    for row, o, model, tokenizer, autocast, results in ruler.each_row(
            paths, views, outs, labels, window, overrides, 'eval_ruler.py', 'RULER', max(lengths),
            overwrite, device, dtype, seed=seed, chunk_size=chunk_size,
            **ruler.prompt_settings(names, data)):
        r = ruler.evaluate(model, tokenizer, results, names, lengths, samples, seed, data, device,
                           chunk_size, autocast)
        print(f"\nRULER ({samples} samples per task and length; string_match_all, QA "
              f"string_match_part; x100)")
        header = ''.join(f"{ruler.length_label(L):>8}" for L in lengths)
        print(f"{'task':<18}{header}   empty predictions")
        for t, by_length in r['scores'].items():
            cells = ''.join(f"{v:>8.1f}" if not math.isnan(v) else f"{'-':>8}"
                            for v in by_length.values())
            print(f"{t:<18}{cells}   " + ' '.join(str(n) for n in r['nulls'][t].values()))
        print(f"{'average':<18}" + ''.join(f"{v:>8.2f}" for v in r['average'].values()))
        print(f"{'tasks averaged':<18}" + ''.join(f"{v:>8}" for v in r['tasks_averaged'].values()))
        if r['skipped']:
            print(f"not run: {', '.join(r['skipped'])} (their data is missing; see above)")
        if r['stand_in_haystack']:
            print(f"on a stand-in haystack: {', '.join(r['stand_in_haystack'])}: {data.stand_in}")
        print(f"\n{'RULER':<24}{header}")
        print(f"{os.path.basename(row['ckpt'].rstrip('/')):<24}"
              + ''.join(f"{v:>8.2f}" for v in r['average'].values()))
        with open(o + '.json', 'w') as f:
            json.dump({'ckpt': row['ckpt'], 'step': row['step'], 'tasks': names, 'samples': samples,
                       'seed': seed, **r}, f, indent=2)
        print(f"wrote {o}.json and {o}.jsonl")
        rows.append({**row, 'score': r['average'], 'tasks_averaged': r['tasks_averaged']})
        del model
    if isinstance(ckpt, list):
        # what each average is over: the tasks that fit a length (vt and cwe need more than 1K)
        fewer = {L: min(r['tasks_averaged'][L] for r in rows) for L in lengths}
        ran = max(max(r['tasks_averaged'].values()) for r in rows)
        if any(n < ran for n in fewer.values()):
            title += "; tasks averaged: " + ', '.join(
                f"{fewer[L]} of {ran} at {ruler.length_label(L)}" for L in lengths)
        if data.stand_in:
            title += f"; the essay tasks on a stand-in haystack, {data.stand_in}"
        ruler.write_table(table, rows, lengths, train_length or rows[0]['block_size'], title)
