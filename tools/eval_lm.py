"""
Short benchmarks (the paper's Table 7) with lm-eval on any checkpoint that checkpoint.load_model
reads: NAPE, ALiBi and ASEntmax transformers, Mamba2, SmolLM3 CPT runs, weights folders. Most of
these fit no Hugging Face layout (tools/export_hf.py refuses them), so the model is
tools/lengthgen.py's lm-eval LM over our own forward pass, KV cache and tokenizer.

    python -m tools.eval_lm --ckpt=out/nape/ckpt_000953.pt --batch_size=16 \\
        --tasks=arc_easy,arc_challenge,hellaswag,piqa,winogrande,openbookqa,boolq,lambada_openai

Prints lm-eval's table and writes <ckpt>_lm_eval.json (lm-eval's results, its samples left out;
an earlier one is replaced, nothing else: a run's files and the input are refused before the run).
--include_path=<folder> adds local task YAMLs (lm-eval's own mechanism, for tasks only).
lm-eval's own CLI with this model (`--model lengthgen`), and how its requests are answered:
tools/lengthgen.py.
"""

import json
import os
import sys

import torch

from tools import lengthgen


if __name__ == '__main__':
    import lm_eval
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import handle_non_serializable, make_table

    import checkpoint
    from configurator import configure
    from ruler import is_summary

    # -------------------------------------------------------------------------
    ckpt = ''  # a checkpoint file or a weights folder
    tasks: str | list = ''  # lm-eval task names: 'arc_easy,piqa' or a list
    batch_size = 8  # loglikelihood rows per forward pass (generation runs one request at a time)
    limit: int | float | None = None  # examples per task (a fraction if < 1); None: all
    num_fewshot: int | None = None  # None: each task's own default
    max_length = 0  # the most tokens one pass sees; 0: the length the checkpoint was trained at
    chunk_size = 1024  # prefill chunk through the cache
    window: int | list | None = None  # replaces the model's sliding windows (the paper's "SW")
    overrides: dict | None = None  # model arguments no weight depends on: {'rope_scaling': 'yarn'}
    include_path = ''  # a folder of local task YAMLs
    out = ''  # the results JSON; default: the checkpoint's path without .pt, plus _lm_eval.json
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    dtype = 'bfloat16' if torch.cuda.is_available() else 'float32'
    # -------------------------------------------------------------------------
    globals().update(configure(globals(), sys.argv[1:]))
    if not ckpt or not tasks:
        raise SystemExit("give --ckpt=<checkpoint file or weights folder> and "
                         "--tasks=arc_easy,piqa,...")
    if include_path and not os.path.isdir(include_path):
        raise SystemExit(f"--include_path={include_path} is not a folder")
    out = out or ckpt.removesuffix('.pt').rstrip('/') + '_lm_eval.json'
    # never over a run's file, the checkpoint or anything not ours; an earlier result is replaced
    checkpoint.check_output(out, True, is_summary, 'tools/eval_lm.py', [ckpt])
    manager = TaskManager(include_path=include_path or None)
    names = lengthgen.task_names(tasks, manager)  # unknown names are said before the model loads
    try:
        lm = lengthgen.LengthGenLM(ckpt, device, batch_size, dtype, max_length, chunk_size, window,
                                   overrides)
    except ValueError as e:
        raise SystemExit(str(e))
    results = lm_eval.simple_evaluate(model=lm, tasks=names, num_fewshot=num_fewshot, limit=limit,
                                      task_manager=manager, log_samples=False)
    print(make_table(results))
    if results.get('groups'):
        print(make_table(results, 'groups'))
    with open(out + '.tmp', 'w') as f:  # then renamed: an earlier result stays whole until then
        kept = {k: v for k, v in results.items() if k != 'samples'}
        json.dump({'ckpt': ckpt, 'step': lm.step, 'tasks': names, **kept}, f, indent=2,
                  default=handle_non_serializable)
    os.replace(out + '.tmp', out)
    print(f"wrote {out}")
