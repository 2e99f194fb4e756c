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
memory stays at about two models (average). Everything is checked before anything is
averaged: a different architecture, a missing or extra key, a different shape, or fewer
checkpoints than asked for stop the script with nothing written. The output is written atomically.
"""

import json
import os
import shutil
import sys

import torch
from tqdm import tqdm

import checkpoint
import hardware

IGNORED_CONFIG_KEYS = ('transformers_version', 'torch_dtype', 'dtype')  # bookkeeping in config.json


def weight_files(path):
    """The files that hold a checkpoint's weights: itself, or a folder's (sharded) weight files."""
    if not os.path.isdir(path):
        return [path]
    names = sorted(os.listdir(path))
    files = ([n for n in names if n.endswith('.safetensors')] or
             [n for n in names if n.startswith('pytorch_model') and n.endswith('.bin')])
    if not files:
        raise ValueError(f"{path} has no *.safetensors or pytorch_model*.bin weights")
    return [os.path.join(path, n) for n in files]


def read(file):
    """name -> tensor of one weight file, lazily (memory-mapped or read on access)."""
    if file.endswith('.safetensors'):
        from safetensors import safe_open
        with safe_open(file, 'pt') as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
    else:
        state = checkpoint.load(file)
        yield from (state['model'] if file.endswith('.pt') else state).items()


def shapes(file):
    """name -> (shape, is float) of one weight file of a folder, without reading the weights."""
    if file.endswith('.safetensors'):
        from safetensors import safe_open
        with safe_open(file, 'pt') as f:
            return {n: (tuple(f.get_slice(n).get_shape()),
                        f.get_slice(n).get_dtype().startswith(('F', 'BF'))) for n in f.keys()}
    return {n: (tuple(t.shape), t.is_floating_point()) for n, t in read(file)}


def describe(path):
    """What averaged checkpoints must share, read without the weights: the architecture (model type
    and arguments, or a folder's config.json) and name -> (shape, is float) of every tensor."""
    if os.path.isdir(path):
        with open(os.path.join(path, 'config.json')) as f:
            config = json.load(f)
        if not isinstance(config, dict):
            raise ValueError(f"{path}/config.json is not a model config (a JSON object)")
        arch = {k: v for k, v in config.items()
                if not k.startswith('_') and k not in IGNORED_CONFIG_KEYS}
        return arch, {n: s for f in weight_files(path) for n, s in shapes(f).items()}
    ckpt = checkpoint.load_any(path)  # memory-mapped: the tensors' pages are not read
    return ({'model_type': ckpt['model_type'], **ckpt['model_args']},
            {n: (tuple(t.shape), t.is_floating_point()) for n, t in ckpt['model'].items()})


def check(paths):
    """ValueError, naming the first difference, unless all checkpoints have one architecture and the
    same tensors."""
    if not paths:
        raise ValueError("no checkpoints to average")
    if len({os.path.isdir(p) for p in paths}) > 1:
        raise ValueError("cannot average checkpoint files with weights folders")
    ref_arch, ref_shapes = None, None
    for path in paths:
        arch, found = describe(path)
        if ref_arch is None:
            ref_arch, ref_shapes, first = arch, found, path
            continue
        diff = sorted((k for k in ref_arch.keys() | arch.keys() if ref_arch.get(k) != arch.get(k)),
                      key=lambda k: (k != 'model_type', k))  # the model type first, if it differs
        if diff:
            what = ', '.join(f'{k} ({ref_arch.get(k)!r} vs {arch.get(k)!r})' for k in diff[:5])
            raise ValueError(f"{path} and {first} differ in {what}")
        if found.keys() != ref_shapes.keys():
            odd = sorted(found.keys() ^ ref_shapes.keys())
            raise ValueError(f"{path} and {first} hold different tensors: {', '.join(odd[:5])}")
        bad = [n for n in found if found[n] != ref_shapes[n]]
        if bad:
            (shape, fp), (ref_shape, ref_fp) = found[bad[0]], ref_shapes[bad[0]]
            raise ValueError(f"{path} and {first} differ in {bad[0]}: shape {shape} vs {ref_shape} "
                             f"(float: {fp} vs {ref_fp})")


def average(paths):
    """The uniform average of the checkpoints' weights: name -> tensor in the newest's dtype."""
    check(paths)
    total, newest = {}, {}
    for path in tqdm(paths, desc='averaging', unit='ckpt', disable=len(paths) < 3):
        for file in weight_files(path):
            for name, t in read(file):
                if not t.is_floating_point():
                    newest[name] = t  # the last checkpoint read is the newest
                    continue
                acc = torch.float64 if t.dtype in (torch.float32, torch.float64) else torch.float32
                if name in total:
                    total[name] += t.to(total[name].dtype)
                else:
                    total[name] = t.to(acc, copy=True)
                newest[name] = t.dtype
    return {n: (total[n] / len(paths)).to(newest[n]) if n in total else newest[n] for n in newest}


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


class RunningAverages:
    """train.py's average_last: the averages of the weights at the last K of a run's averaging
    steps (every `every` iterations, and the last), summed as the run goes and written at its end
    as the file this script writes from saved checkpoints, so that a run needs not keep K of them.
    The sums are float32, like the weights (under FSDP each process's shards); they are saved
    with the optimizer state, so that a resumed run goes on summing."""

    def __init__(self, ks, every, max_iters):
        # the averaging steps: each every-th iteration and the last (configurator.py checks that
        # each K is at most their number)
        marks = sorted(set(range(every, max_iters + 1, every)) | {max_iters})
        self.every = every
        self.windows = {K: marks[-K:] for K in ks}  # K -> the steps its average takes
        self.sums = {K: None for K in ks}  # K -> name -> float32 tensor
        self.summed = -1  # the last step the sums hold

    def add(self, it, model):
        """Add the weights of iteration it to the sums whose steps hold it."""
        due = [K for K, w in self.windows.items() if it in w and it > self.summed]
        weights = {n: t.detach().float() for n, t in model.state_dict().items()  # FSDP: shards
                   if t.is_floating_point()} if due else {}
        for K in due:
            self.sums[K] = ({n: t.clone() for n, t in weights.items()} if self.sums[K] is None
                            else {n: self.sums[K][n].add_(t) for n, t in weights.items()})
        self.summed = max(self.summed, it)

    def state_dict(self):
        """The sums whole and on the CPU (gathered under FSDP: every process calls this)."""
        return {'windows': {str(K): w for K, w in self.windows.items()}, 'step': self.summed,
                'sums': {str(K): s and {n: hardware.whole(t).cpu() for n, t in s.items()}
                         for K, s in self.sums.items()}}

    def load(self, saved, like, device, out_dir):
        """A resumed run's sums (saved: state_dict()'s, None before averaging existed), each
        tensor placed like its weight in `like` (a state_dict: DTensors under FSDP); SystemExit
        if this run's averages are not the saved ones."""
        saved = saved or {'windows': {}, 'sums': {}, 'step': -1}
        if {str(K): w for K, w in self.windows.items()} != saved['windows']:
            raise SystemExit(f"cannot resume {out_dir}: average_last or its steps changed (saved: "
                             f"{saved['windows'] or 'none'}). Resume with the run's own settings")
        self.sums = {K: saved['sums'][str(K)] and {
            n: hardware.like(t.to(device, copy=True), like[n])
            for n, t in saved['sums'][str(K)].items()} for K in self.windows}
        self.summed = saved['step']

    def write(self, out_dir, it, state, master):
        """avg{K}_{first}-{last}.pt beside the last checkpoint (it): its record with the averaged
        weights (state: the whole model's, for the keys the sums lack). Every process calls
        this; the master writes. -> [(path, steps)]"""
        written = []
        for K, s in self.state_dict()['sums'].items():
            w = self.windows[int(K)]
            path = os.path.join(out_dir, f'avg{K}_{w[0]:06d}-{w[-1]:06d}.pt')
            if master:
                ckpt = dict(checkpoint.load(checkpoint.step_path(out_dir, it)))
                average = {n: (t / int(K)).to(state[n].dtype) for n, t in s.items()}
                ckpt.update(model={**state, **average}, averaged_steps=w, averaged_from=[])
                checkpoint.save(ckpt, path)
            written.append((path, w))
        return written


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
        checkpoint.check_output(out, overwrite, is_average, 'average_ckpts.py', paths)
        names = [os.path.basename(p.rstrip('/')) for p in paths]
        names = names if len(names) < 5 else names[:2] + ['...'] + names[-2:]
        print(f"averaging {len(paths)} checkpoints: {', '.join(names)}")
        state = average(paths)
    except (OSError, ValueError) as e:
        raise SystemExit(f"nothing written: {e}")
    write_folder(state, paths, out) if folders else write_file(state, paths, chosen, out)
    print(f"wrote {out}")
