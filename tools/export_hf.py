"""
A checkpoint as a Hugging Face folder, for lm-eval and transformers: SmolLM3-shaped transformers
in SmolLM3's own layout (config.json, sharded safetensors, the tokenizer files), Mamba2 through
transformers' Mamba2 (needs `transformers`).

    python -m tools.export_hf --ckpt=out/smollm3_pl_d/ckpt_000953.pt --out=exports/smollm3_pl_d
    lm_eval --model hf --model_args pretrained=exports/smollm3_pl_d,dtype=bfloat16 \\
        --tasks arc_easy,arc_challenge,hellaswag,piqa,winogrande,openbookqa,boolq,lambada_openai \
        --batch_size 8

A transformer that SmolLM3's layout cannot hold (NAPE or ALiBi, learned positions, entmax or a
query scale, LayerNorm, GELU, biases, windows of several sizes) is refused before anything is
written: evaluate it where it is, with tools/eval_lm.py (lm-eval over our own model class).

source: the folder of the released weights, for the tokenizer files and token ids; default: the
run's init_from when that was a folder.
"""

import json
import os
import shutil
import sys
from typing import Literal

import torch

import checkpoint
import weights
from configurator import configure

MARK = 'exported_from.json'  # the checkpoint an export came from; what marks a folder as an export

ckpt = ''  # a checkpoint file
out = ''  # the folder to write
# the released weights' folder or hub name (tokenizer files, token ids); default: the run's
# init_from
source = ''
dtype: Literal['bfloat16', 'float16', 'float32'] = 'bfloat16'  # of the written weights
overwrite = False  # replace an earlier export at out (never another folder)
globals().update(configure(globals(), sys.argv[1:]))
if not ckpt or not out:
    raise SystemExit("give --ckpt=<checkpoint file> and --out=<folder>")
checkpoint.check_output(out, overwrite, lambda p: os.path.exists(os.path.join(p, MARK)),
                        'tools/export_hf.py', [ckpt, source])
if source and not weights.hub_id(source) and not os.path.isdir(source):  # given: it must be
    raise SystemExit(f"--source={source} is not a folder: give the released weights' folder "
                     f"(or a hub name), or no --source")
try:
    model, _, info = checkpoint.load_model(ckpt)
except (OSError, RuntimeError, ValueError) as e:
    raise SystemExit(f"cannot load {ckpt}: {e}")
source = source or info.get('config', {}).get('init_from', '')
try:  # a hub name: its cached folder (a path stays as it is)
    source = weights.local(source)
except ValueError as e:
    raise SystemExit(f"--source: {e}")
given, source = source, (source if os.path.isdir(source) else None)
tmp = checkpoint.temporary_folder(out)  # written whole, then put in place: never half there
try:
    if info['model_type'] == 'mamba2':
        weights.to_transformers(model).to(getattr(torch, dtype)).save_pretrained(tmp)
        for name in ('tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json'):
            if source and os.path.exists(os.path.join(source, name)):
                shutil.copy(os.path.join(source, name), tmp)
    else:
        try:  # the layout is checked before anything is written
            weights.save_smollm3(model, tmp, source, dtype=getattr(torch, dtype))
        except ValueError as e:
            raise SystemExit(f"cannot export {ckpt}: {e}. Evaluate it with tools/eval_lm.py "
                             f"instead: python -m tools.eval_lm --ckpt={ckpt} --tasks=arc_easy,...")
    with open(os.path.join(tmp, MARK), 'w') as f:
        json.dump({'ckpt': os.path.abspath(ckpt), 'step': info['step']}, f)
    checkpoint.replace_folder(tmp, out)
finally:
    shutil.rmtree(tmp, ignore_errors=True)
if not source:
    print(f"note: no source folder ({given or 'none'}): the export has no tokenizer files; give "
          f"--source=<weights folder>")
print(f"wrote {out} (step {info['step']} of {ckpt})")
