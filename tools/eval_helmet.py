"""
HELMET's synthetic recall category (princeton-nlp/HELMET, configs/recall.yaml and
recall_short.yaml): JSON KV and RULER's MK-2, MK-3 and MV, generated offline with the model's own
tokenizer (tools/helmet.py, over ruler.py's generators), in HELMET's prompts for a base model,
greedy answers of at most 50 (MK-2, MV) or 100 (MK-3, JSON KV) tokens, scored as HELMET
(ruler_recall; substring_exact_match for JSON KV) and averaged per length into "Recall", printed
in the layout of HELMET's scripts/collect_results.py.

    python -m tools.eval_helmet --ckpt=out/quickstart/ckpt_000488.pt --lengths="[8192, 16384]" \
        --samples=5
    python -m tools.eval_helmet --ckpt=... --tasks="['json_kv', 'ruler_niah_mk_2']"
    python -m tools.eval_helmet --ckpt="['out/a/ckpt_000488.pt', 'out/a/ckpt_000488.pt']" \
        --sw="[1]" --window=256  # a table: a row per checkpoint (here a, and a with windows)

tasks: a list of HELMET dataset names (helmet.TASKS), or 'recall' for all four.
Data: MK-2's keys from wonderwords' lists; MV's essay haystack: Paul Graham's essays in RULER's
order (--essay, python data/ruler/prepare.py) or else Shakespeare's plays, said in the output and
the JSON; MK-3 and JSON KV need none. A task
whose data is missing is skipped and named; a length too short for a task is left out, and said.
Writes <ckpt>_helmet.jsonl (every sample; an interrupted run continues) and <ckpt>_helmet.json;
with several checkpoints also a table of their Recall by length, as eval_niah.py's (--table).
The samples are read back only under the settings that made them (ruler.Results): other settings
at the same --out are refused, or recomputed with --overwrite=True.
"""

import json
import os
import sys
from typing import Literal

import torch

from tools import helmet
import ruler


if __name__ == '__main__':
    from configurator import configure

    # -------------------------------------------------------------------------
    ckpt: str | list = ''  # a checkpoint file or weights folder; or a list: a table row each
    labels: list = []  # the rows' names; default: the run's folder, K=n for an average, SW
    sw: list[int] = []  # with a list of checkpoints, the rows (from 0) that take --window; [] all
    train_length = 0  # the length marked in the table; 0: the first row's block_size
    table = ''  # the table's .md and .json; default: beside the first checkpoint
    tasks: str | list = 'recall'  # HELMET dataset names, or 'recall' for all four
    lengths: list[int] = list(helmet.LENGTHS)  # prompt + generated tokens (HELMET: 8K to 128K)
    samples = helmet.SAMPLES  # per task and length (HELMET's max_test_samples: 100)
    seed = 42
    # MV's haystack: Paul Graham's essays in RULER's order (python data/ruler/prepare.py); else
    # Shakespeare
    essay = ruler.ESSAY
    window: int | list | None = None  # replaces the model's sliding windows (the paper's "SW")
    overrides: dict | None = None  # model arguments no weight depends on: {'rope_scaling': 'yarn'}
    chunk_size = 1024  # prefill chunk
    overwrite = False  # recompute the results saved at out (of other settings: a window, a seed)
    out = ''  # one checkpoint's output prefix; default: its path without .pt, plus _helmet
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    dtype: Literal['bfloat16', 'float32'] = 'bfloat16' if torch.cuda.is_available() else 'float32'
    # -------------------------------------------------------------------------
    LIMITS = {'lengths': (1, None), 'samples': (1, None), 'seed': (0, None),
              'chunk_size': (1, None), 'train_length': (0, None),
              'sw': (0, None, [])}  # configurator.check_limits
    globals().update(configure(globals(), sys.argv[1:], limits=LIMITS))
    names = helmet.task_list(tasks)
    paths, views, outs, table = ruler.eval_rows(ckpt, labels, sw, window, out, table, '_helmet',
                                                'tools/eval_helmet.py')  # checked first
    data = ruler.Data(essay=ruler.given_essay(essay))
    what = (f"{samples} samples per task and length; ruler_recall, JSON KV "
            f"substring_exact_match; x100")
    rows = []
    for row, o, model, tokenizer, autocast, results in ruler.each_row(
            paths, views, outs, labels, window, overrides, 'tools/eval_helmet.py', 'HELMET recall',
            max(lengths), overwrite, device, dtype, seed=seed, chunk_size=chunk_size, essay=essay,
            **({'haystack': ruler.haystack(data)} if any(map(helmet.on_essay, names)) else {})):
        r = helmet.evaluate(model, tokenizer, results, names, lengths, samples, seed,
                            data, device, chunk_size, autocast)
        print(f"\nHELMET recall ({what})")
        print(helmet.table(r['scores'], lengths, os.path.basename(row['ckpt'].rstrip('/'))))
        print("empty outputs: " + '; '.join(f"{t} " + ' '.join(str(n) for n in by_length.values())
                                            for t, by_length in r['empty'].items()))
        if r['skipped']:
            print(f"not run: {', '.join(r['skipped'])} (their data is missing; see above)")
        if r['stand_in_haystack']:
            print(f"on a stand-in haystack: {', '.join(r['stand_in_haystack'])}: {data.stand_in}")
        with open(o + '.json', 'w') as f:
            json.dump({'ckpt': row['ckpt'], 'step': row['step'], 'tasks': names,
                       'samples': samples, 'seed': seed, **r}, f, indent=2)
        print(f"wrote {o}.json and {o}.jsonl")
        rows.append({**row, 'score': r['recall']})
        del model
    if isinstance(ckpt, list):
        ruler.write_table(table, rows, lengths, train_length or rows[0]['block_size'],
                             f"HELMET Recall ({what})")
