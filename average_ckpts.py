"""
Checkpoint averaging (the paper's Tables 9, 10 and 12, Figure 6): the uniform average of the
parameters of several checkpoints of one run, written as a normal checkpoint that every eval
script loads.

    python average_ckpts.py --ckpt_dir=out/quickstart --last=10             # the last 10 steps
    python average_ckpts.py --ckpt_dir=out/quickstart --last=10 --stride=2  # every other one
    python average_ckpts.py --ckpt_dir=out/quickstart --start=300 --stop=480
    python average_ckpts.py --steps="[400, 450, 488]" --ckpt_dir=out/quickstart
    python average_ckpts.py --ckpts="['hf/cpt_a', 'hf/cpt_b']" --out=hf/cpt_avg   # weights folders

Checkpoint files (ckpt_{step}.pt, transformer or Mamba2) give a checkpoint file: the newest
one's metadata, the averaged weights, and `averaged_steps`. Hugging Face folders (SmolLM3 or
Mamba2; sharded safetensors or pytorch_model*.bin) give a folder laid out like the newest one,
with averaged.json naming its sources. Checkpoints are read one at a time (memory-mapped), so
memory stays at about two models (checkpoint.average). Everything is checked before anything is
averaged: a different architecture, a missing or extra key, a different shape, or fewer
checkpoints than asked for stop the script with nothing written. The output is written atomically.
"""

import json
import os
import shutil
import sys

import torch

import checkpoint
from checkpoint import average, shapes, weight_files

def is_average(path):
    """Whether path is an earlier output of this script: a folder with averaged.json, or a
    checkpoint file with averaged_from."""
    if os.path.isdir(path):
        return os.path.exists(os.path.join(path, 'averaged.json'))
    try:
        return 'averaged_from' in checkpoint.load(path)
    except (OSError, ValueError, TypeError):
        return False


def write_file(state, paths, steps, out):
    """A checkpoint file: the newest's metadata with the averaged weights (atomic)."""
    ckpt = dict(checkpoint.load(paths[-1]))
    ckpt.update(model=state, averaged_steps=steps,
                averaged_from=[os.path.abspath(p) for p in paths])
    checkpoint.save(ckpt, out)


def write_folder(state, paths, out):
    """A weights folder laid out like the newest (same shards, same file formats, its other files),
    written in a new temporary folder, then put in place."""
    from safetensors.torch import save_file
    tmp = checkpoint.temporary_folder(out)
    weights = ('.safetensors', '.bin')  # its other files are copied
    try:
        shutil.copytree(paths[-1], tmp, dirs_exist_ok=True,
                        ignore=lambda d, names: [n for n in names if n.endswith(weights)])
        for file in weight_files(paths[-1]):
            shard = {n: state[n].contiguous() for n in shapes(file)}
            dest = os.path.join(tmp, os.path.basename(file))
            if file.endswith('.safetensors'):
                save_file(shard, dest, metadata={'format': 'pt'})
            else:
                torch.save(shard, dest)
        with open(os.path.join(tmp, 'averaged.json'), 'w') as f:
            json.dump({'averaged_from': [os.path.abspath(p) for p in paths]}, f, indent=1)
        checkpoint.replace_folder(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # ours alone, if the write did not finish


if __name__ == '__main__':
    from configurator import configure

    # -------------------------------------------------------------------------
    ckpt_dir = ''  # a run's out_dir (its ckpt_{step}.pt files)
    last = 10  # K: average the last K (0: all of them in the range)
    stride = 1  # take every stride-th checkpoint, counted back from the newest
    start = 0  # only steps >= start
    stop = -1  # only steps <= stop (-1: no limit)
    steps: list[int] = []  # or exactly these steps of ckpt_dir
    ckpts: list = []  # or these checkpoint files or weights folders, oldest first
    out = ''  # default: ckpt_dir/avg{K}_{first}-{last}.pt, or beside the newest: <name>_avg{K}[.pt]
    overwrite = False  # replace an earlier average at out (never anything else)
    # -------------------------------------------------------------------------
    LIMITS = {'last': (0, None), 'stride': (1, None), 'start': (0, None), 'stop': (0, None, -1),
              'steps': (0, None, [])}
    globals().update(configure(globals(), sys.argv[1:], limits=LIMITS))
    try:
        if ckpts:
            paths, chosen = list(ckpts), []
        elif ckpt_dir:
            if not os.path.isdir(ckpt_dir):
                raise ValueError(f"--ckpt_dir={ckpt_dir} is not a folder")
            chosen = sorted(steps) or checkpoint.select(ckpt_dir, last, stride, start, stop)
            paths = [checkpoint.step_path(ckpt_dir, s) for s in chosen]
            missing = [p for p in paths if not os.path.exists(p)]
            if missing:
                raise ValueError(f"no such checkpoints: {', '.join(missing)}")
        else:
            raise ValueError("give --ckpt_dir (with --last, --start/--stop/--stride or --steps) or "
                             "--ckpts")
        if not paths:
            raise ValueError(f"no checkpoints (ckpt_*.pt) in {ckpt_dir} in that range")
        folders = os.path.isdir(paths[0])
        if not out and chosen:
            out = os.path.join(ckpt_dir, f'avg{len(paths)}_{chosen[0]:06d}-{chosen[-1]:06d}.pt')
        elif not out:  # beside the newest of the given paths
            out = (paths[-1].rstrip('/').removesuffix('.pt') + f'_avg{len(paths)}'
                   + ('' if folders else '.pt'))
        checkpoint.check_output(out, overwrite, is_average, 'average_ckpts.py')  # not a run's
        names = [os.path.basename(p.rstrip('/')) for p in paths]
        names = names if len(names) < 5 else names[:2] + ['...'] + names[-2:]
        print(f"averaging {len(paths)} checkpoints: {', '.join(names)}")
        state = average(paths)
    except (OSError, ValueError) as e:
        raise SystemExit(f"nothing written: {e}")
    write_folder(state, paths, out) if folders else write_file(state, paths, chosen, out)
    print(f"wrote {out}")
