"""
Checkpoints: written atomically, read with weights_only=True, and one loader that every eval
script uses to turn a checkpoint (or a folder of released weights) into a model plus its tokenizer.

A checkpoint is out_dir/ckpt_{step:06d}.pt = {model (state dict, clean keys), model_type,
model_args, tokenizer (spec), step, config (the whole resolved config)}; every saved step is
kept (checkpoint averaging needs the last K). The optimizer state of the newest step lives
beside it in optim_{step:06d}.pt, for resume.
"""

import glob
import hashlib
import json
import os
import pickle
import re
import shutil
from dataclasses import asdict

import torch

from mamba import Mamba2, Mamba2Config, load_pretrained
from model import Transformer, TransformerConfig, load_pretrained as load_smollm3
from tokens import EOT, Tokenizer

MODELS = {'transformer': (Transformer, TransformerConfig), 'mamba2': (Mamba2, Mamba2Config)}


def fsync(path):
    """Flush a file or a folder (its entries: a rename into it) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(obj, path):
    """torch.save to a temporary file, on the disk before it is renamed into place and the rename
    on the disk before this returns: a crash, of the process or of the machine, leaves either the
    old file or the new one, whole."""
    tmp = path + '.tmp'
    with open(tmp, 'wb') as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync(os.path.dirname(os.path.abspath(path)))


def replace_folder(tmp, path):
    """Put the complete folder tmp at path, its files on the disk first; an old folder at path
    goes only once tmp is in place."""
    path = path.rstrip('/')
    for root, _, files in os.walk(tmp):
        for name in files:
            fsync(os.path.join(root, name))
        fsync(root)
    if os.path.exists(path):
        os.replace(path, path + '.old')
        os.replace(tmp, path)
        shutil.rmtree(path + '.old')
    else:
        os.replace(tmp, path)
    fsync(os.path.dirname(os.path.abspath(path)))


def folder_digest(path):
    """{file name: sha256} of every file under the folder path (a DCP checkpoint), or None if it
    is not a folder. train.py records it beside the pickles that torch.distributed.checkpoint
    writes, and reads them back only if they still match: the run's own files, nothing put there
    since. (Whoever can rewrite the checkpoint file too could forge the digests.)"""
    if not os.path.isdir(path):
        return None
    digest = {}
    for root, _, files in os.walk(path):
        for name in sorted(files):
            h = hashlib.sha256()
            with open(os.path.join(root, name), 'rb') as f:
                for block in iter(lambda: f.read(1 << 24), b''):
                    h.update(block)
            digest[os.path.relpath(os.path.join(root, name), path)] = h.hexdigest()
    return digest


def load(path, device='cpu'):
    """Memory-mapped: processes that read one checkpoint share its pages. Only tensors and plain
    data come back (weights_only); anything else is refused, a ValueError that says so."""
    try:
        return torch.load(path, map_location=device, weights_only=True, mmap=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError) as e:
        raise ValueError(f"{path} is not a checkpoint written by torch.save, or it was cut short ({e})") from None


def steps(out_dir, prefix='ckpt', ext='.pt'):
    """Sorted steps of the {prefix}_{step:06d}{ext} files (or folders) in out_dir."""
    found = (re.fullmatch(rf'{prefix}_(\d+){re.escape(ext)}', os.path.basename(p))
             for p in glob.glob(os.path.join(out_dir, f'{prefix}_*{ext}')))
    return sorted(int(m.group(1)) for m in found if m)


def step_path(out_dir, step, prefix='ckpt', ext='.pt'):
    return os.path.join(out_dir, f'{prefix}_{step:06d}{ext}')


def model_args(model):
    return asdict(model.config)


def build_model(model_type, args):
    if model_type not in MODELS:
        raise ValueError(f"unknown model_type {model_type!r}; choose one of {list(MODELS)}")
    cls, config_cls = MODELS[model_type]
    return cls(config_cls(**args))


def load_any(path):
    """A checkpoint file, or a folder of released weights (transformers' SmolLM3; state-spaces'
    or transformers' Mamba2), as a checkpoint dict: model, model_type, model_args, tokenizer
    (None if the folder has no tokenizer.json), step."""
    if not os.path.isdir(path):
        ckpt = load(path)
        if not isinstance(ckpt, dict) or 'model' not in ckpt or 'model_type' not in ckpt:
            what = ("an optimizer state (optim_*.pt): give the ckpt_*.pt beside it" if isinstance(ckpt, dict)
                    and 'optimizer' in ckpt else "not a model checkpoint of this repository (ckpt_*.pt)")
            raise ValueError(f"{path} is {what}")
        return ckpt
    config = os.path.join(path, 'config.json')
    if not os.path.exists(config):
        raise ValueError(f"{path} is a folder without config.json: not a SmolLM3 or Mamba2 checkpoint")
    with open(config) as f:
        kind = json.load(f)
    kind = 'mamba2' if 'd_model' in kind or kind.get('model_type') == 'mamba2' else kind.get('model_type')
    if kind not in ('smollm3', 'mamba2'):
        raise ValueError(f"{path} holds a {kind!r} model: only SmolLM3 and Mamba2 folders load")
    args, state = (load_pretrained if kind == 'mamba2' else load_smollm3)(path)
    tokenizer = None
    if os.path.exists(os.path.join(path, 'tokenizer.json')):
        eot = EOT if kind == 'mamba2' else '<|end_of_text|>'
        if os.path.exists(os.path.join(path, 'tokenizer_config.json')):  # the eos token it names, if any
            with open(os.path.join(path, 'tokenizer_config.json')) as f:
                eos = json.load(f).get('eos_token') or eot
            eot = eos['content'] if isinstance(eos, dict) else eos
        tokenizer = {'kind': 'hf', 'path': os.path.abspath(os.path.join(path, 'tokenizer.json')), 'eot': eot}
    return {'model': state, 'model_type': 'mamba2' if kind == 'mamba2' else 'transformer', 'model_args': args,
            'tokenizer': tokenizer, 'step': 0}


def load_model(path, device='cpu', **overrides):
    """Any checkpoint file or weights folder -> (model in eval mode, tokenizer or None, checkpoint
    dict). `overrides` replace model arguments that do not change the weights (e.g. window)."""
    ckpt = load_any(path)
    model = build_model(ckpt['model_type'], {**ckpt['model_args'], **overrides})
    model.load_state_dict(ckpt['model'])
    tokenizer = Tokenizer(ckpt['tokenizer']) if ckpt['tokenizer'] else None
    if tokenizer and tokenizer.n_vocab > model.config.vocab_size:
        raise ValueError(f"its tokenizer has {tokenizer.n_vocab} tokens, more than the model's vocabulary "
                         f"of {model.config.vocab_size}: not the model's own tokenizer")
    return model.to(device).eval(), tokenizer, ckpt


def load_for_eval(path, device, purpose, window=None):
    """load_model for an eval script: a clear message (SystemExit) when the checkpoint cannot be
    read or has no tokenizer (`purpose` needs the model's own). window: replaces the model's
    sliding windows (an int for every layer, or a list), e.g. the paper's "SW" without CPT."""
    try:
        model, tokenizer, ckpt = load_model(path, device, **({} if window is None else {'window': window}))
    except (OSError, RuntimeError, ValueError) as e:
        raise SystemExit(f"cannot load {path}: {e}")
    if tokenizer is None:
        raise SystemExit(f"{path} has no tokenizer (tokenizer.json): {purpose} needs the model's own tokenizer")
    return model, tokenizer, ckpt


def check_length(model, length, path):
    """SystemExit if the model cannot take `length` tokens: learned absolute positions stop at block_size."""
    c = model.config
    if getattr(c, 'pos_encoding', None) == 'learned' and length > c.block_size:
        raise SystemExit(f"{path} has learned absolute positions for {c.block_size} tokens: it cannot take {length}")

