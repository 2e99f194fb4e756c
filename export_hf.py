"""
A checkpoint as a Hugging Face folder, for lm-eval and transformers: SmolLM3-shaped transformers
in SmolLM3's own layout (config.json, sharded safetensors, the tokenizer files), Mamba2 through
transformers' Mamba2 (needs `transformers`).

    python export_hf.py --ckpt=out/smollm3_pl_d/ckpt_000953.pt --out=exports/smollm3_pl_d
    lm_eval --model hf --model_args pretrained=exports/smollm3_pl_d,dtype=bfloat16 \\
        --tasks arc_easy,arc_challenge,hellaswag,piqa,winogrande,openbookqa,boolq,lambada_openai --batch_size 8

source: the folder of the released weights, for the tokenizer files and token ids; default: the
run's init_from when that was a folder.
"""

import os
import shutil
import sys

import torch

import checkpoint
from configurator import configure

ckpt = ''  # a checkpoint file
out = ''  # the folder to write
source = ''  # default: the checkpoint's init_from, if a folder
dtype = 'bfloat16'  # of the written weights
globals().update(configure(globals(), sys.argv[1:]))
if not ckpt or not out:
    raise SystemExit("give --ckpt=<checkpoint file> and --out=<folder>")
model, _, info = checkpoint.load_model(ckpt)
source = source or info.get('config', {}).get('init_from', '')
if not os.path.isdir(source):
    print(f"note: no source folder ({source or 'none'}): the export has no tokenizer files; give --source=<weights folder>")
    source = None
if info['model_type'] == 'mamba2':
    checkpoint.to_transformers(model).to(getattr(torch, dtype)).save_pretrained(out)
    for name in ('tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json'):
        if source and os.path.exists(os.path.join(source, name)):
            shutil.copy(os.path.join(source, name), out)
else:
    checkpoint.save_smollm3(model, out, source, dtype=getattr(torch, dtype))
print(f"wrote {out} (step {info['step']} of {ckpt})")
