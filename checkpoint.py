"""
A run's files: our checkpoints, written atomically and read with weights_only=True; the run
folder's lock, and the check that no tool writes over a run (check_output); one loader that turns
a checkpoint (or a folder of released weights, read by weights.py) into a model plus its tokenizer
(load_model); train.py's ways in (way_in: resume_state, cpt_source, cpt_model_args), its
checkpoint pairs (save_pair) and its record (RunLog: log.jsonl).

A checkpoint is out_dir/ckpt_{step:06d}.pt = {model (state dict, clean keys), model_type,
model_args, tokenizer (spec), step, config (the whole resolved config)}; every saved step is
kept (checkpoint averaging, average_ckpts.py, needs the last K). The optimizer state of the two
newest steps lives beside them in optim_{step:06d}.pt, for resume (the older one if the newer
cannot be read). An eval script's start-up from a checkpoint is in ruler.py (eval_setup).
"""

import atexit
import errno
import fcntl
import glob
import json
import math
import os
import pickle
import re
import shutil
import tempfile
import uuid
from dataclasses import fields

import torch

from tokens import Tokenizer, same_tokenizer

MODEL_TYPES = ('transformer', 'mamba2')
CKPT_KEYS = {'model', 'model_type', 'model_args', 'tokenizer', 'step'}  # what every reader takes


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
    old file or the new one, whole. A failed write leaves no temporary file behind; a full disk is
    an OSError that names the path and the bytes it needs."""
    tmp = path + '.tmp'
    try:
        with open(tmp, 'wb') as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException as e:  # torch.save reports a full disk as a RuntimeError of its writer
        if os.path.exists(tmp):
            os.remove(tmp)
        need = tensor_bytes(obj)
        free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
        full = getattr(e, 'errno', None) in (errno.ENOSPC, errno.EDQUOT)
        if full or isinstance(e, RuntimeError) and free < need:
            raise OSError(errno.ENOSPC, f"the disk is full: {path} needs about {need:,} bytes, "
                                        f"{free:,} are free") from None
        raise
    os.replace(tmp, path)
    fsync(os.path.dirname(os.path.abspath(path)))


def tensor_bytes(obj):
    """The bytes of the tensors in a nested dict / list / tuple (about what torch.save writes)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(map(tensor_bytes, obj.values()))
    return sum(map(tensor_bytes, obj)) if isinstance(obj, (list, tuple)) else 0


def temporary_folder(path):
    """A new, empty folder beside path (on its disk, so that replace_folder's rename is atomic),
    made for this write alone: no folder that was there before is ever removed."""
    parent, name = os.path.split(os.path.abspath(path.rstrip('/')))
    return tempfile.mkdtemp(prefix=name + '.', suffix='.tmp', dir=parent)


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


def load(path, device='cpu'):
    """Memory-mapped: processes that read one checkpoint share its pages. Only tensors and plain
    data come back (weights_only); anything else is refused, a ValueError that says so."""
    try:
        return torch.load(path, map_location=device, weights_only=True, mmap=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError) as e:
        if 'Weights only load failed' in str(e):  # it refused an object that loading would call
            found = re.search(r'GLOBAL ([\w.]+)', str(e))
            raise ValueError(f"{path} holds objects other than tensors and plain data "
                             f"({found[1] if found else 'a Python object'}): not loaded, since "
                             f"loading it could run code") from None
        raise ValueError(f"{path} is not a checkpoint written by torch.save, or it was cut short "
                         f"({e})") from None


def steps(out_dir, prefix='ckpt', ext='.pt'):
    """Sorted steps of the {prefix}_{step:06d}{ext} files (or folders) in out_dir."""
    found = (re.fullmatch(rf'{prefix}_(\d+){re.escape(ext)}', os.path.basename(p))
             for p in glob.glob(os.path.join(out_dir, f'{prefix}_*{ext}')))
    return sorted(int(m.group(1)) for m in found if m)


def select(ckpt_dir, last, stride, start, stop):
    """Steps of ckpt_dir in [start, stop], every stride-th counted back from the newest, the last
    `last` of them."""
    found = [s for s in steps(ckpt_dir) if start <= s and (stop < 0 or s <= stop)]
    chosen = found[::-1][::stride][:last or None][::-1]
    if last and len(chosen) < last:
        raise ValueError(f"{ckpt_dir} has {len(chosen)} checkpoints in that range with stride "
                         f"{stride} ({chosen}), fewer than the {last} asked for")
    return chosen


def pairs(out_dir):
    """Sorted steps with both a checkpoint and its optimizer state: those a run resumes from."""
    return sorted(set(steps(out_dir)) & set(steps(out_dir, 'optim')))


def step_path(out_dir, step, prefix='ckpt', ext='.pt'):
    return os.path.join(out_dir, f'{prefix}_{step:06d}{ext}')


def clean(out_dir):
    """Remove the temporary files of checkpoints whose write was interrupted (kill -9) from out_dir
    -> their names. Only a run that holds out_dir's lock may call it."""
    stale = sorted(p for prefix in ('ckpt', 'optim')
                   for p in glob.glob(os.path.join(out_dir, f'{prefix}_*.tmp')))
    for path in stale:
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    return [os.path.basename(p) for p in stale]


def lock(out_dir):
    """An advisory lock on out_dir (made if new), taken before anything in it is read and held until
    the process ends (kill -9 included): one writer per run folder from the first moment.
    -> the open lock file, to be kept; SystemExit naming the holder's pid if another process has it.
    A run that ends before writing anything leaves no trace: at exit, a folder holding only the lock
    loses it, and the folder too if this run made it."""
    made = not os.path.isdir(out_dir)
    path = os.path.join(out_dir, 'lock')
    while True:
        try:
            os.makedirs(out_dir, exist_ok=True)
            f = open(path, 'a+')
        except OSError as e:
            raise SystemExit(f"cannot write to out_dir {out_dir}: {e.strerror or e}") from None
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or 'unknown'
            f.close()
            raise SystemExit(f"{out_dir} is in use by another run (pid {holder}): wait for it to "
                             f"end, or stop it (kill {holder}), before writing here") from None
        try:  # the file locked is still the folder's: a run ending now may have removed it
            if os.stat(path).st_ino == os.fstat(f.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        f.close()
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    LOCKS.append((out_dir, made, f))
    return f


LOCKS = []  # (out_dir, whether this process made it, the lock file) of every lock taken: release


@atexit.register
def release():
    """At exit: every lock is let go; that of a run that wrote nothing is removed, and its folder if
    the run made it."""
    while LOCKS:
        out_dir, made, f = LOCKS.pop()
        f.close()
        try:
            if os.listdir(out_dir) == ['lock']:
                os.remove(os.path.join(out_dir, 'lock'))
                if made:
                    os.rmdir(out_dir)
        except OSError:  # another run took the folder meanwhile: it is its own
            pass


RUN_FILE = re.compile(r'(ckpt|optim)_\d+\.pt|log\.jsonl|lock')  # what a training run writes


def check_output(path, overwrite, ours, tool, inputs=()):
    """SystemExit, before anything is computed, unless `path` (a file or a folder) may be written:
    never a training run's file or a folder that holds one, nor one of the tool's inputs; an
    existing path only if ours(path) says `tool` wrote it and overwrite is given; and its folder
    writable."""
    name = os.path.basename(path.rstrip('/'))
    run = os.path.isdir(path) and any(map(RUN_FILE.fullmatch, os.listdir(path)))
    if RUN_FILE.fullmatch(name) or run:
        raise SystemExit(f"{path} is a training run's file or folder, not to be written over: "
                         f"choose another --out")
    if os.path.realpath(path) in {os.path.realpath(p) for p in inputs if p}:
        raise SystemExit(f"{path} is an input of {tool}, not to be written over: choose another "
                         f"--out")
    if os.path.lexists(path):
        if not ours(path):
            raise SystemExit(f"{path} exists and was not written by {tool}: choose another --out")
        if not overwrite:
            raise SystemExit(f"{path} holds an earlier output of {tool}: "
                             f"--overwrite=True replaces it")
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):  # the nearest folder that exists must let us make the rest
        parent = os.path.dirname(parent)
    try:
        if not os.path.isdir(parent):
            raise NotADirectoryError(errno.ENOTDIR, 'a file, not a folder')
        tempfile.TemporaryFile(dir=parent).close()
    except OSError as e:
        raise SystemExit(f"cannot write {path}: {parent} is not a writable folder "
                         f"({e.strerror or e})") from None


def model_class(model_type):
    """-> (the model's class, its config's class): model.py's Transformer, or mamba.py's Mamba2
    (a file read only when its model is wanted)."""
    if model_type == 'transformer':
        from model import Transformer, TransformerConfig
        return Transformer, TransformerConfig
    if model_type == 'mamba2':
        from mamba import Mamba2, Mamba2Config
        return Mamba2, Mamba2Config
    raise ValueError(f"unknown model_type {model_type!r}; choose one of {list(MODEL_TYPES)}")


def build_model(model_type, args):
    cls, config_cls = model_class(model_type)
    return cls(config_cls(**args))


def load_any(path):
    """A checkpoint file, or a folder of released weights (transformers' SmolLM3; state-spaces'
    or transformers' Mamba2; or their Hugging Face repo id, see weights.local), as a checkpoint
    dict: model, model_type, model_args, tokenizer (None if the folder has no tokenizer.json),
    step."""
    import weights  # released weights: for CPT and evaluation, not a run from scratch
    path = weights.local(path)
    if os.path.isdir(path):
        return weights.load_folder(path)
    ckpt = load(path)
    if not isinstance(ckpt, dict) or not CKPT_KEYS <= ckpt.keys():
        optimizer = isinstance(ckpt, dict) and 'optimizer' in ckpt
        what = ("an optimizer state (optim_*.pt): give the ckpt_*.pt beside it" if optimizer else
                f"not a model checkpoint of this repository (ckpt_*.pt, with "
                f"{', '.join(sorted(CKPT_KEYS))})")
        raise ValueError(f"{path} is {what}")
    return ckpt


def load_model(path, device='cpu', **overrides):
    """Any checkpoint file or weights folder -> (model in eval mode, tokenizer or None, checkpoint
    dict). `overrides` replace model arguments that do not change the weights (e.g. window)."""
    ckpt = load_any(path)
    model = build_model(ckpt['model_type'], {**ckpt['model_args'], **overrides})
    model.load_state_dict(ckpt['model'])
    tokenizer = Tokenizer(ckpt['tokenizer']) if ckpt['tokenizer'] else None
    if tokenizer and tokenizer.n_vocab > model.config.vocab_size:
        raise ValueError(f"its tokenizer has {tokenizer.n_vocab} tokens, more than the model's "
                         f"vocabulary of {model.config.vocab_size}: not the model's own tokenizer")
    return model.to(device).eval(), tokenizer, ckpt


# -----------------------------------------------------------------------------
# train.py's ways in (resume, continued pre-training) and its checkpoint pairs

RUNTIME = ('dropout', 'dropout_type', 'vpad_variant', 'attn_dropout', 'window', 'attn_backend',
           'use_kernels')
# and the positions, where the config sets them (else the source's): no weights depend on them,
# except learned ones. DroPE is CPT with pos_encoding='nope' from a RoPE model (docs/methods.md)
POSITIONS = ('pos_encoding', 'rope_random', 'rope_scaling', 'rope_factor')


def save_pair(out_dir, step, keep_last, optim, ckpt):
    """optim_{step}.pt, then ckpt_{step}.pt: a checkpoint on disk always has its optimizer state
    beside it. Each is written to a temporary name, then renamed; the newest keep_last models are
    kept (or all) and the optimizer states of `step` and the step before it (resume can go back
    one). A full disk stops the run, the pairs before intact."""
    path, optim_path = step_path(out_dir, step), step_path(out_dir, step, 'optim')
    try:
        save(optim, optim_path)
        save(ckpt, path)
    except OSError as e:
        if os.path.exists(optim_path) and not os.path.exists(path):
            os.remove(optim_path)
        raise SystemExit(f"stopping at iteration {step}: cannot save its checkpoint ({e}). The "
                         f"checkpoints before it are intact: free some space and resume with "
                         f"--init_from=resume")
    for old in [s for s in steps(out_dir, 'optim') if s < step][:-1]:  # the new pair is complete
        os.remove(step_path(out_dir, old, 'optim'))
    for old in steps(out_dir)[:-keep_last] if keep_last else []:
        os.remove(step_path(out_dir, old))
    print(f"saved {path}", flush=True)


def resume_state(out_dir, sharded, say=print):
    """The newest complete pair of out_dir that reads -> (step, checkpoint, its optim file: the
    optimizer state under 'optimizer', the sums of train.py's running averages under
    'averages')."""
    resumable = pairs(out_dir)
    if not resumable and not steps(out_dir):  # e.g. a run stopped before its first checkpoint
        raise SystemExit(f"init_from='resume' but {out_dir} holds no checkpoint yet: start the run "
                         f"again, the same command without --init_from=resume")
    if not resumable:
        raise SystemExit(f"init_from='resume' but {out_dir} holds no checkpoint with optimizer "
                         f"state")
    for step in reversed(resumable):
        try:
            ckpt, optim = load(step_path(out_dir, step)), load(step_path(out_dir, step, 'optim'))
            if not (isinstance(ckpt, dict) and 'model' in ckpt
                    and isinstance(optim, dict) and 'optimizer' in optim):
                raise ValueError("the pair is not a checkpoint and its optimizer state")
        except (OSError, ValueError) as e:
            say(f"warning: passing over step {step}: {e}; trying the checkpoint before it")
            continue
        fsdp = optim.get('sharded', False)  # FSDP keys its state by parameter name, DDP by index
        if fsdp != sharded:
            raise SystemExit(f"{out_dir} was trained with parallel={'fsdp' if fsdp else 'ddp'}: "
                             f"resume it {'under torchrun with' if fsdp else 'without'} "
                             f"--parallel=fsdp")
        return step, ckpt, optim
    raise SystemExit(f"no checkpoint of {out_dir} could be read with its optimizer state (warnings "
                     f"above)")


def check_resume(ckpt, model_type, model_args, out_dir, halt_at=0):
    """SystemExit unless the config describes the checkpoint's own model, and halt_at (if > 0)
    lies after it."""
    if 0 < halt_at <= ckpt['step']:
        raise SystemExit(f"config error: halt_at = {halt_at}, but the run resumes at iteration "
                         f"{ckpt['step']}: give a later halt_at, or 0 to run to the end")
    changed = {k: (v, model_args.get(k)) for k, v in ckpt['model_args'].items()
               if model_args.get(k) != v}
    if changed or ckpt['model_type'] != model_type:
        diff = ', '.join(f"{k}: checkpoint {a!r} vs config {b!r}" for k, (a, b) in changed.items())
        raise SystemExit(f"cannot resume {out_dir}: the config describes another model "
                         f"({diff or model_type}). Resume with the run's own config, or start a "
                         f"new run in another out_dir.")


def cpt_source(source, tokenizer, model_type=None):
    """The checkpoint (or weights folder, or hub id) that continued pre-training starts from,
    checked against the run's tokenizer and, if the config sets one (else None), its model_type."""
    import weights
    if not os.path.exists(source) and not weights.hub_id(source):
        raise SystemExit(f"init_from must be 'scratch', 'resume', a checkpoint file, a weights "
                         f"folder or a Hugging Face repo id (HuggingFaceTB/SmolLM3-3B); "
                         f"{source} is none of these")
    try:
        ckpt = load_any(source)
    except ValueError as e:
        raise SystemExit(f"init_from: {e}")
    if ckpt['tokenizer'] is None:
        raise SystemExit(f"{source} has no tokenizer.json: copy in the tokenizer the model was "
                         f"trained with (GPT-NeoX's for state-spaces/mamba2-*)")
    if not same_tokenizer(ckpt['tokenizer'], tokenizer):
        raise SystemExit(f"{source} was trained with tokenizer {ckpt['tokenizer']}, but the data "
                         f"is tokenized with {tokenizer}: prepare the data with the checkpoint's "
                         f"tokenizer")
    if model_type and model_type != ckpt['model_type']:
        raise SystemExit(f"config error: {source} is a {ckpt['model_type']}, but the config sets "
                         f"model_type = {model_type!r}: CPT keeps the checkpoint's model (remove "
                         f"model_type)")
    return ckpt


def source_shape(source):
    """A CPT source's (model_type, model_args) without its weights, for a dry run: a checkpoint
    file's record, or a weights folder's config.json (or the release it names: weights.RELEASED)."""
    if os.path.isfile(source):
        ckpt = load_any(source)
        return ckpt['model_type'], ckpt['model_args']
    import weights
    try:
        return weights.folder_shape(weights.local(source) if os.path.exists(source) else source)
    except (ValueError, KeyError) as e:
        raise SystemExit(f"init_from: {source}: {e}")


def cpt_model_args(model_type, source_args, config, user_keys, source):
    """CPT: the architecture of the source checkpoint (a model_type) with this run's
    regularization and windows (RUNTIME), and its positions where it sets them (POSITIONS). A model
    key that the config sets (user_keys) to another value is an error: it could not apply."""
    known = {f.name for f in fields(model_class(model_type)[1])}
    fixed = known - set(RUNTIME) - set(POSITIONS) - {'vocab_size', 'block_size'}  # from the data
    clash = {k: (source_args.get(k), config[k]) for k in sorted(user_keys & fixed)
             if config[k] != source_args.get(k)}
    positions = {k: config[k] for k in POSITIONS if k in user_keys & known}
    before = source_args.get('pos_encoding')
    after = positions.get('pos_encoding', before)
    if 'learned' in (before, after) and after != before:  # learned positions' weights would not fit
        clash['pos_encoding'] = (before, config['pos_encoding'])
    if clash:
        sets = ', '.join(f"{k} = {b!r} (the checkpoint has {a!r})" for k, (a, b) in clash.items())
        raise SystemExit(f"config error: continued pre-training takes the architecture from "
                         f"{source}, but the config sets {sets}. Remove these keys; CPT may change "
                         f"only {', '.join(RUNTIME + POSITIONS)} (learned positions excepted)")
    return {**source_args, **{k: config[k] for k in RUNTIME if k in known}, **positions}


def way_in(c, model_args, given, sharded, tokenizer, dry_run=False, say=print):
    """train.py's way in for its config c (given: the keys it set) -> (start step, checkpoint,
    optimizer file, CPT source, model_type, model_args, batches skipped):
    - from scratch: 0, None, None, None, and the config's model;
    - resumed (init_from='resume'): out_dir's newest pair that reads (resume_state), its model (a
      CPT run's architecture is its source's, as when it started), and the batches skipped before
      with skip_steps more from here (after a divergence);
    - continued pre-training from a checkpoint, weights folder or hub id: its weights and
      architecture with this run's regularization and windows (cpt_model_args); for a dry run
      the source's shape alone.
    SystemExit, before anything is written, where out_dir or the source does not fit."""
    out_dir, source, model_type = c['out_dir'], c['init_from'], c['model_type']
    if source != 'resume' and not dry_run and steps(out_dir):
        raise SystemExit(f"{out_dir} already holds checkpoints of an earlier run: continue it with "
                         f"--init_from=resume, or choose another --out_dir (or delete the folder)")
    if source == 'scratch':
        return 0, None, None, None, model_type, model_args, []
    if source == 'resume':
        step, ckpt, optim = resume_state(out_dir, sharded, say)
        skips = ckpt.get('skips', []) + ([[step, c['skip_steps']]] if c['skip_steps'] else [])
        cpt_from = ckpt.get('cpt_from')
        if cpt_from:
            model_type = ckpt['model_type']
            model_args = cpt_model_args(model_type, ckpt['model_args'], c, given, cpt_from)
        check_resume(ckpt, model_type, model_args, out_dir, c['halt_at'])
        say(f"resuming {out_dir} at iteration {step}")
        if skips:
            say(f"skipping batches: from iteration "
                f"{', from '.join(f'{a} the next {n}' for a, n in skips)}")
        return step, ckpt, optim, cpt_from, model_type, model_args, skips
    if dry_run:  # the source's shape alone (a folder's config.json)
        model_type, source_args = source_shape(source)
        model_args = cpt_model_args(model_type, source_args, c, given, source)
        return 0, None, None, None, model_type, model_args, []
    ckpt = cpt_source(source, tokenizer, model_type if 'model_type' in given else None)
    model_args = cpt_model_args(ckpt['model_type'], ckpt['model_args'], c, given, source)
    say(f"continued pre-training from {source} (step {ckpt['step']})")
    return 0, ckpt, None, source, ckpt['model_type'], model_args, []


def divergence(loss, grad_norm, recent, spike_threshold):
    """Why the weights that gave this loss and gradient norm must not be kept, or None: a loss or
    gradient not finite, or a loss spike_threshold nats above the lowest of the recent losses (the
    first loss, over the first 5 steps, while it falls fast). Weights blown up by a huge step give
    a uniform output, ln(vocab), without ever reaching NaN."""
    if len(recent) >= 5:
        reference, what = min(recent), f"the lowest of the last {len(recent)}"
    else:  # the first steps
        reference, what = (recent[0], "the first loss") if recent else (math.inf, '')
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
        return f"loss {loss}, gradient norm {grad_norm} (not finite)"
    if spike_threshold and loss > reference + spike_threshold:
        return (f"loss {loss:.4f}, {loss - reference:.2f} nats above {what} (spike_threshold = "
                f"{spike_threshold}; 0 turns the check off)")
    return None


def after_divergence(out_dir, it):
    """-> (the newest checkpoint of out_dir up to iteration it, or None; how to go on from there).
    Every checkpoint on disk was saved only after its own weights passed train.py's divergence
    check, so the newest one is good, and its optimizer state is still beside it."""
    kept = [s for s in pairs(out_dir) if s <= it]
    if not kept:
        return None, ("No checkpoint was saved yet: start again with a lower learning_rate or a "
                      "longer warm-up.")
    good = step_path(out_dir, kept[-1])
    return good, (f"The last good checkpoint is {good} (its optimizer state beside it): resume "
                  f"from it with --init_from=resume --skip_steps={it - kept[-1] + 1} (skips the "
                  f"batches of iterations {kept[-1]}-{it}, which led here), or with a lower "
                  f"learning_rate or a longer warm-up.")


# -----------------------------------------------------------------------------
# a run's record: out_dir/log.jsonl, one JSON line per event (start, train, eval, diverged),
# each whole or not at all, and with wandb_log the same numbers in Weights & Biases. Every
# record names its session (0 for the first start, 1 after the first resume, ...), so the
# steps that a resumed run repeats can be told from the ones before the interruption.

# the keys that do not change what a run trains (a resume that changes only these replays it)
NOT_TRAINING = ('init_from', 'halt_at', 'skip_steps', 'log_interval', 'eval_interval',
                'ckpt_interval', 'keep_last', 'eval_iters', 'eval_lengths', 'eval_windows',
                'task_eval_samples', 'wandb_log', 'wandb_project', 'wandb_run_name')


class RunLog:
    def __init__(self, out_dir, master=True, wandb_log=False):
        self.out_dir, self.path = out_dir, os.path.join(out_dir, 'log.jsonl')
        self.master, self.wandb = master, None
        self.wandb_log, self.session = wandb_log, 0
        if wandb_log:
            try:
                import wandb  # noqa: F401
            except ImportError:
                raise SystemExit("config error: wandb_log=True needs wandb: pip install wandb "
                                 "(or no wandb_log)")

    def records(self):
        """Every record that reads; a line cut short by a kill during its write is passed over."""
        records = []
        for n, line in enumerate(open(self.path) if os.path.exists(self.path) else [], 1):
            try:
                records.append(json.loads(line))
            except ValueError:
                print(f"note: passing over line {n} of {self.path}, cut short by an interrupted "
                      f"write", flush=True)
        return records

    def check_replay(self, start_iter, config, skipping):
        """SystemExit if this resume would replay the divergence that ended the run's last session:
        it starts before that iteration with the same training config and skips no batches."""
        records = self.records()
        last = records[-1] if records else {}
        if last.get('event') != 'diverged' or skipping or last['iter'] <= start_iter:
            return
        before = last.get('config', {})
        if all(before.get(k) == v for k, v in config.items() if k not in NOT_TRAINING):
            replayed, skip = last['iter'], last['iter'] - start_iter + 1
            raise SystemExit(f"this resume from iteration {start_iter} would replay the divergence "
                             f"at iteration {replayed} (the same config, the same batches): skip "
                             f"the batches that led to it with --skip_steps={skip}, or change "
                             f"the training (e.g. a lower learning_rate); --skip_steps=0 replays "
                             f"it all the same")

    def start(self, it, config, project, name):
        """This session's number, its wandb run (a resumed run continues the wandb run whose id is
        kept in out_dir), and its start record."""
        if not self.master:
            return
        if os.path.exists(self.path):  # counted by text: a line cut short by a kill still counts
            self.session = sum(1 for line in open(self.path) if '"event": "start"' in line)
            with open(self.path, 'rb+') as f:  # a cut last line is ended: the next starts anew
                end = f.seek(0, os.SEEK_END)
                f.seek(max(end - 1, 0))
                if end and f.read(1) != b'\n':
                    f.write(b'\n')
        if self.wandb_log:
            import wandb
            id_file = os.path.join(self.out_dir, 'wandb_id')
            run_id = uuid.uuid4().hex[:8]  # a new wandb run, or the one of out_dir
            if os.path.exists(id_file):
                run_id = open(id_file).read().strip()
            name = name or os.path.basename(os.path.abspath(self.out_dir))
            wandb.init(project=project, name=name, config=config, dir=self.out_dir, id=run_id,
                       resume='allow')
            with open(id_file, 'w') as f:
                f.write(run_id)
            self.wandb = wandb
        self({'event': 'start', 'iter': it, 'config': config})

    def __call__(self, record):
        """Append one line, whole or not at all (a full disk: a warning, the run goes on); with
        wandb, its numbers too (position_loss/128-256, accuracy/64, ...)."""
        if not self.master:
            return
        if self.wandb and record['event'] in ('train', 'eval'):
            flat = {f"{k}/{band}" if isinstance(v, dict) else k: x
                    for k, v in record.items() if k not in ('event', 'iter')
                    for band, x in (v.items() if isinstance(v, dict) else [(None, v)])
                    if isinstance(x, (int, float))}
            self.wandb.log(flat, step=record['iter'])
        line = (json.dumps({**record, 'session': self.session}) + '\n').encode()
        size = os.path.getsize(self.path) if os.path.exists(self.path) else 0
        try:
            with open(self.path, 'ab') as f:
                f.write(line)
                f.flush()
        except OSError as e:
            with open(self.path, 'ab') as f:
                f.truncate(size)
            print(f"warning: could not write to {self.path} ({e}); the record of iteration "
                  f"{record.get('iter')} is lost", flush=True)
