"""
Train a model from scratch, continue pre-training (CPT) from a checkpoint, or resume a run.

    python train.py configs/quickstart.py                                  # one CPU process
    torchrun --standalone --nproc_per_node=8 train.py configs/vpad.py     # DDP on 8 GPUs
    python train.py configs/quickstart.py --dropout_type=pre_linear --out_dir=out/pld

Every global below is a config key: set it in a config file or as --key=value (configurator.py).
The whole resolved config is printed and stored in every checkpoint.
"""

import collections
import ctypes
import functools
import json
import math
import os
import signal
import sys
import time
import uuid
from contextlib import nullcontext
from dataclasses import fields

import torch
import torch.distributed as dist
import torch.utils.checkpoint
from torch.nn.parallel import DistributedDataParallel as DDP

import checkpoint
import fsdp
import hardware
from configurator import configure
from eval_loss import band_means, loss_curve
from tasks import Copy, Needle, correct_answers
from tokens import TokenData, batch_rng, same_tokenizer

# -----------------------------------------------------------------------------
# I/O
out_dir = 'out'
init_from = 'scratch'  # 'scratch', 'resume' (the newest checkpoint in out_dir), or CPT from a checkpoint, weights folder or hub id
log_interval = 10  # iterations between log lines (also written to out_dir/log.jsonl)
eval_interval = 500  # iterations between evaluations (and at the end)
ckpt_interval = 1000  # iterations between checkpoints (and at the end); see keep_last
halt_at = 0  # if > 0, checkpoint and exit at this iteration; the schedule is unchanged (resume later)
skip_steps = 0  # with init_from='resume', after a divergence: skip the batches of the next N iterations
# evaluation
eval_iters = 20  # validation batches at the training length
eval_lengths = [2048, 4096, 8192, 16384]  # lm: mean per-position loss in the bands (L1/2, L1], (L1, L2], ...
eval_windows = 16  # lm: validation windows of max(eval_lengths) tokens for the per-position loss
# data
task = 'lm'  # 'lm': next-token prediction on data_dir; 'copy' or 'needle': the tasks of tasks.py, made on the fly
data_dir = 'data/shakespeare/byte'  # lm: a folder of train*.bin / val*.bin shards and meta.json (data/*/prepare.py)
train_tokens = 0  # lm: if > 0, train on the first train_tokens tokens only (repeated: a corpus small enough to over-fit)
task_vocab = 32  # copy/needle: symbols, the 4 special ones included
task_min_len = 50  # copy/needle: lengths at training (copy: of the source, needle: of the sequence), uniform in
task_max_len = 100  # [task_min_len, task_max_len]; the test lengths are eval_lengths (exact-match greedy answers)
task_eval_samples = 100  # copy/needle: held-out samples per test length
needle_value_len = 4  # needle: symbols in the needle's value
needle_keys = 1  # needle: needles in the haystack (> 1: the query names one, the others distract)
batch_size = 16  # sequences per micro-step, per process
block_size = 2048  # training context length
tokens_per_batch = 524288  # tokens per optimizer step, all processes and micro-steps together
max_tokens = 40e9  # training tokens; max_iters = max_tokens // tokens_per_batch
seed = 1337
# model: every field of the models' config dataclasses is a key (model.py and mamba.py give their
# meaning); one the config leaves unset takes its own model's default (Mamba2: 24 layers, not 12)
model_type = 'transformer'  # 'transformer' (model.py) or 'mamba2' (mamba.py)
for _f in (f for _, cfg in checkpoint.MODELS.values() for f in fields(cfg)):
    globals().setdefault(_f.name, _f.default)
    __annotations__.setdefault(_f.name, _f.type)
vocab_size: int | None = None  # None: the tokenizer's vocabulary, rounded up to a multiple of 64
# regularization (dropout, dropout_type, vpad_variant and attn_dropout are model keys, above)
weight_decay = 0.1  # 0.0 is the paper's "no-WD"
decay_embeddings = False  # also decay the token (and position) embeddings
# optimizer and schedule
learning_rate = 6e-4
min_lr = 6e-5
schedule = 'wsd'  # 'wsd' (the paper's SWUA: warm-up, stable, anneal), 'constant' (SWU) or 'cosine'
warmup_frac = 0.025  # fraction of the iterations spent warming up
anneal_frac = 0.2  # 'wsd': fraction of the iterations at the end annealed linearly to min_lr
beta1, beta2 = 0.9, 0.95
grad_clip = 1.0  # 0 disables clipping
spike_threshold = 1.0  # a training loss this many nats above the lowest of the last 20 counts as divergence (0: off)
# system
device = 'auto'  # 'auto' (cuda, mps, else cpu), or e.g. 'cpu', 'cuda'
dtype = 'auto'  # 'auto' (bfloat16 on CUDA, float32 elsewhere), 'bfloat16' or 'float32'
compile: bool | None = None  # torch.compile; None: on for CUDA, off elsewhere
parallel = 'ddp'  # under torchrun: 'ddp' (a replica per process) or 'fsdp' (FSDP2: weights, gradients, optimizer sharded)
activation_checkpointing = False  # recompute each block in the backward pass: less memory, about 30% more compute
keep_last = 0  # keep only the newest N model checkpoints; 0 keeps all (checkpoint averaging needs the last K)
wandb_log = False  # also log to Weights & Biases (pip install wandb): what log.jsonl gets, the config as the run's
wandb_project = 'length-generalization'
wandb_run_name = ''  # default: out_dir's name
# -----------------------------------------------------------------------------
MODEL_KEYS = {f.name for _, cfg in checkpoint.MODELS.values() for f in fields(cfg)}
given = set()
config = configure(globals(), sys.argv[1:], given=given,
                   help_sources=[sys.modules[cfg.__module__].__file__ for _, cfg in checkpoint.MODELS.values()])
globals().update(config)
user_model_keys = given & MODEL_KEYS  # the model keys this run's config sets

# distributed setup: one process per GPU under torchrun (NCCL), or per CPU process (gloo)
distributed = 'RANK' in os.environ
if device == 'auto':
    device = 'cuda' if torch.cuda.is_available() else 'mps' if torch.backends.mps.is_available() else 'cpu'
if parallel not in ('ddp', 'fsdp'):
    raise SystemExit(f"config error: parallel must be 'ddp' or 'fsdp', got {parallel!r}")
if distributed:
    if sys.platform == 'linux':  # torchrun starts each worker in a session of its own: end with torchrun
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG (torchrun killed -9 included)
    dist.init_process_group(backend='nccl' if device.startswith('cuda') else 'gloo')
    rank, world = dist.get_rank(), dist.get_world_size()
    if device.startswith('cuda'):
        device = f"cuda:{os.environ['LOCAL_RANK']}"
        torch.cuda.set_device(device)
else:
    rank, world = 0, 1
master = rank == 0
sharded = distributed and parallel == 'fsdp'
# evaluation is split among DDP processes; FSDP processes must all run every forward, so each does it all
eval_rank, eval_world = (0, 1) if sharded else (rank, world)
device_type = 'cuda' if device.startswith('cuda') else device
if dtype == 'auto':
    dtype = 'bfloat16' if device_type == 'cuda' and torch.cuda.is_bf16_supported() else 'float32'
if dtype not in ('bfloat16', 'float32'):
    raise SystemExit(f"config error: dtype must be 'auto', 'bfloat16' or 'float32', got {dtype!r}")
for key in ('log_interval', 'eval_interval', 'ckpt_interval'):
    if config[key] < 1:
        raise SystemExit(f"config error: {key} must be at least 1 (iterations), got {config[key]}")
if keep_last < 0 or halt_at < 0:
    raise SystemExit(f"config error: keep_last (0 keeps every checkpoint) and halt_at (0: run to the end) must be >= 0, "
                     f"got {keep_last} and {halt_at}")
if not (0 < learning_rate < 3e38 and 0 <= min_lr < 3e38):  # the optimizer computes in float32
    raise SystemExit(f"config error: learning_rate and min_lr must be positive and finite in float32, got "
                     f"{learning_rate}, {min_lr}")
if schedule not in ('wsd', 'constant', 'cosine'):
    raise SystemExit(f"config error: schedule must be 'wsd', 'constant' or 'cosine', got {schedule!r}")
if not (0 <= warmup_frac and 0 <= anneal_frac and warmup_frac + (anneal_frac if schedule == 'wsd' else 0) <= 1):
    raise SystemExit(f"config error: warmup_frac ({warmup_frac}) and anneal_frac ({anneal_frac}) are fractions of the "
                     f"run: each >= 0, and warm-up plus anneal at most 1")
if skip_steps < 0 or skip_steps and init_from != 'resume':
    raise SystemExit(f"config error: skip_steps ({skip_steps}) skips batches of a resumed run: >= 0, with "
                     f"--init_from=resume")
if wandb_log and master:
    try:
        import wandb
    except ImportError:
        raise SystemExit("config error: wandb_log=True needs wandb: pip install wandb (or leave wandb_log off)")
autocast = torch.autocast(device_type, dtype=torch.bfloat16) if dtype == 'bfloat16' else nullcontext()
if compile is None:
    compile = device_type == 'cuda'
if device_type == 'cuda':
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True


def say(*args):
    if master:
        print(*args, flush=True)


# data, and the batch arithmetic
if task in ('copy', 'needle'):
    train_data = val_data = (Copy(task_vocab, task_min_len, task_max_len) if task == 'copy' else
                             Needle(task_vocab, task_min_len, task_max_len, needle_value_len, needle_keys))
    block_size = config['block_size'] = train_data.block_size  # the longest sequence, padded to
    say(f"data: the {task} task, {task_vocab} symbols, {'source' if task == 'copy' else 'sequence'} lengths "
        f"{task_min_len}-{task_max_len}, sequences padded to {block_size}")
elif task == 'lm':
    try:
        train_data, val_data = TokenData(data_dir, 'train', train_tokens, max_tokens), TokenData(data_dir, 'val')
    except FileNotFoundError as e:
        raise SystemExit(str(e))
    say(f"data: {data_dir}, {len(train_data):,} train / {len(val_data):,} val tokens; tokenizer {train_data.meta['tokenizer']}"
        + (f"; {max_tokens / len(train_data):.1f} epochs" if train_tokens else ""))
    for split, d in (('train', train_data), ('val', val_data)):
        if d.sizes.max() <= block_size:
            raise SystemExit(f"config error: block_size = {block_size}, but no {split} shard of {data_dir} holds "
                             f"more than {d.sizes.max():,} tokens: windows of block_size + 1 do not fit; use a "
                             f"shorter block_size")
else:
    raise SystemExit(f"config error: task must be 'lm', 'copy' or 'needle', got {task!r}")
# the step's tokens_per_batch // block_size sequences go in micro-batches of the largest size up to
# batch_size that splits them evenly over the processes. Micro-batch j's data and dropout masks
# depend on (seed, step, j) alone: with the same micro-batch size, any process count trains alike.
sequences = tokens_per_batch // block_size
if tokens_per_batch % block_size or sequences < 1:
    raise SystemExit(f"config error: tokens_per_batch ({tokens_per_batch}) must be a positive multiple of block_size "
                     f"({block_size})")
if sequences % world:
    counts = ', '.join(str(n) for n in range(1, sequences + 1) if sequences % n == 0)
    raise SystemExit(f"config error: the {sequences} sequences of a step (tokens_per_batch / block_size) do not split "
                     f"over {world} processes: use a process count that divides {sequences} ({counts}) or another "
                     f"tokens_per_batch")
if batch_size < 1:
    raise SystemExit(f"config error: batch_size must be at least 1, got {batch_size}")
per_process = sequences // world
micro_batch = max(b for b in range(1, min(batch_size, per_process) + 1) if per_process % b == 0)
if micro_batch < batch_size:
    say(f"note: micro-batches of {micro_batch} sequences, the largest up to batch_size = {batch_size} that splits the "
        f"{per_process} per process evenly; a run with other micro-batches has other batches and masks")
batch_size, grad_accum = micro_batch, per_process // micro_batch
max_iters = int(max_tokens // tokens_per_batch)
if max_iters < 1:
    raise SystemExit(f"config error: max_tokens ({max_tokens:g}) is less than one step of tokens_per_batch "
                     f"({tokens_per_batch}): nothing to train")
if vocab_size is None:
    vocab_size = config['vocab_size'] = -(-train_data.meta['vocab_size'] // 64) * 64
say(f"{max_iters:,} iterations of {tokens_per_batch:,} tokens = {world} processes x {grad_accum} micro-steps "
    f"x {batch_size} x {block_size}")

# the model: from scratch, from a checkpoint (CPT) or resumed
if model_type not in checkpoint.MODELS:
    raise SystemExit(f"config error: model_type must be one of {list(checkpoint.MODELS)}, got {model_type!r}")
model_args = {f.name: config[f.name] if f.name in user_model_keys | {'vocab_size', 'block_size'} else f.default
              for f in fields(checkpoint.MODELS[model_type][1])}  # vocab and block size: as train.py resolved them
start_iter, ckpt, optim_state, cpt_from, skips = 0, None, None, None, []
RUNTIME = ('dropout', 'dropout_type', 'vpad_variant', 'attn_dropout', 'window', 'attn_backend', 'use_kernels')


def cpt_model_args(source_type, source_args, source):
    """CPT: the architecture of the source checkpoint with this run's regularization and windows
    (RUNTIME). A model key that this config sets to another value is an error: it could not apply."""
    known = {f.name for f in fields(checkpoint.MODELS[source_type][1])}
    fixed = known - set(RUNTIME) - {'vocab_size', 'block_size'}  # these two follow the data and this run's length
    clash = {k: (source_args.get(k), config[k]) for k in sorted(user_model_keys & fixed) if config[k] != source_args.get(k)}
    if clash:
        raise SystemExit(f"config error: continued pre-training takes the architecture from {source}, but the config "
                         f"sets " + ', '.join(f"{k} = {b!r} (the checkpoint has {a!r})" for k, (a, b) in clash.items())
                         + f". Remove these keys; CPT may change only {', '.join(RUNTIME)}")
    return {**source_args, **{k: config[k] for k in RUNTIME if k in known}}


def read_pair(step):
    """The checkpoint of `step` and its optimizer state, both read with weights_only=True."""
    ckpt = checkpoint.load(checkpoint.step_path(out_dir, step))
    optim = checkpoint.load(checkpoint.step_path(out_dir, step, 'optim'))
    if optim.get('sharded', False) != sharded:  # FSDP's state is keyed by parameter name, DDP's by index
        raise SystemExit(f"{out_dir} was trained with parallel={'fsdp' if optim.get('sharded') else 'ddp'}: resume "
                         f"it {'under torchrun with' if optim.get('sharded') else 'without'} --parallel=fsdp")
    return ckpt, optim['optimizer']


def replays_divergence():
    """The iteration at which this run's last session diverged, if this resume would replay it:
    it starts before that iteration with the same training config and skips no batches."""
    records = [json.loads(line) for line in open(LOG)] if os.path.exists(LOG) else []
    if not records or records[-1]['event'] != 'diverged' or 'skip_steps' in given or records[-1]['iter'] <= start_iter:
        return None
    same = all(records[-1].get('config', {}).get(k) == v for k, v in config.items() if k not in NOT_TRAINING)
    return records[-1]['iter'] if same else None


# the keys that do not change what a run trains (a resume that changes only these replays it)
NOT_TRAINING = ('init_from', 'halt_at', 'skip_steps', 'log_interval', 'eval_interval', 'ckpt_interval', 'keep_last',
                'eval_iters', 'eval_lengths', 'eval_windows', 'task_eval_samples', 'wandb_log', 'wandb_project',
                'wandb_run_name')
LOG = os.path.join(out_dir, 'log.jsonl')
# one writer per out_dir, for the life of this process: refused before reading what another run writes
lock = checkpoint.lock(out_dir) if master and os.path.isdir(out_dir) and os.listdir(out_dir) else None
if init_from != 'resume' and checkpoint.steps(out_dir):  # scratch or CPT (whose source may be one of them)
    raise SystemExit(f"{out_dir} already holds checkpoints of an earlier run: continue it with --init_from=resume, "
                     f"or choose another --out_dir (or delete the folder)")
if init_from == 'resume':
    resumable = checkpoint.pairs(out_dir)
    if not resumable:
        raise SystemExit(f"init_from='resume' but {out_dir} holds no checkpoint with optimizer state")
    for start_iter in reversed(resumable):  # the newest complete pair that reads
        try:
            ckpt, optim_state = read_pair(start_iter)
            break
        except (OSError, ValueError, KeyError) as e:
            say(f"warning: passing over step {start_iter}: {e}; trying the checkpoint before it")
    else:
        raise SystemExit(f"no checkpoint of {out_dir} could be read with its optimizer state (warnings above)")
    skips = ckpt.get('skips', []) + ([[start_iter, skip_steps]] if skip_steps else [])
    cpt_from = ckpt.get('cpt_from')
    if cpt_from:  # a CPT run: its architecture is the source's, as when it started
        model_type = config['model_type'] = ckpt['model_type']
        model_args = cpt_model_args(model_type, ckpt['model_args'], cpt_from)
    changed = {k: (v, model_args.get(k)) for k, v in ckpt['model_args'].items() if model_args.get(k) != v}
    if changed or ckpt['model_type'] != model_type:
        diff = ', '.join(f"{k}: checkpoint {a!r} vs config {b!r}" for k, (a, b) in changed.items())
        raise SystemExit(f"cannot resume {out_dir}: the config describes another model ({diff or model_type}). "
                         f"Resume with the run's own config, or start a new run in another out_dir.")
    if 0 < halt_at <= start_iter:
        raise SystemExit(f"config error: halt_at = {halt_at}, but the run resumes at iteration {start_iter}: "
                         f"give a later halt_at, or 0 to run to the end")
    say(f"resuming {out_dir} at iteration {start_iter}")
elif init_from != 'scratch':  # CPT: the checkpoint's architecture and weights, this run's regularization and windows
    if not os.path.exists(init_from) and not checkpoint.hub_id(init_from):
        raise SystemExit(f"init_from must be 'scratch', 'resume', a checkpoint file, a weights folder or a Hugging Face "
                         f"repo id (HuggingFaceTB/SmolLM3-3B); {init_from} is none of these")
    try:
        ckpt = checkpoint.load_any(init_from)
    except ValueError as e:
        raise SystemExit(f"init_from: {e}")
    if ckpt['tokenizer'] is None:
        raise SystemExit(f"{init_from} has no tokenizer.json: copy in the tokenizer the model was trained with "
                         f"(GPT-NeoX's for state-spaces/mamba2-*)")
    if not same_tokenizer(ckpt['tokenizer'], train_data.meta['tokenizer']):
        raise SystemExit(f"{init_from} was trained with tokenizer {ckpt['tokenizer']}, but the data is tokenized with "
                         f"{train_data.meta['tokenizer']}: prepare the data with the checkpoint's tokenizer")
    if 'model_type' in given and model_type != ckpt['model_type']:
        raise SystemExit(f"config error: {init_from} is a {ckpt['model_type']}, but the config sets model_type = "
                         f"{model_type!r}: CPT keeps the checkpoint's model (remove model_type)")
    model_type = config['model_type'] = ckpt['model_type']
    model_args = cpt_model_args(model_type, ckpt['model_args'], init_from)
    cpt_from = init_from
    say(f"continued pre-training from {init_from} (step {ckpt['step']})")
config.update(model_args)  # the stored config records the model that is trained
replayed = replays_divergence() if init_from == 'resume' else None
if replayed:
    raise SystemExit(f"this resume from iteration {start_iter} would replay the divergence at iteration {replayed} "
                     f"(the same config, the same batches): skip the batches that led to it with --skip_steps="
                     f"{replayed - start_iter + 1}, or change the training (e.g. a lower learning_rate); "
                     f"--skip_steps=0 replays it all the same")
if skips:
    say(f"skipping batches: from iteration {', from '.join(f'{a} the next {n}' for a, n in skips)} (skip_steps)")
ckpt_recent = ckpt.get('recent_losses', []) if init_from == 'resume' else []
torch.manual_seed(seed)  # the initial weights
try:
    model = checkpoint.build_model(model_type, model_args)
except ValueError as e:
    raise SystemExit(f"config error: {e}")
if ckpt is not None:
    model.load_state_dict(ckpt['model'])
    del ckpt
model.to(device)
if model_args.get('pos_encoding') == 'learned' and eval_lengths and max(eval_lengths) > block_size:
    eval_lengths = [L for L in eval_lengths if L <= block_size]
    say(f"learned absolute positions stop at block_size: per-position loss only up to {block_size}")
say(f"{model_type}: {model.num_params() / 1e6:.2f}M parameters without embeddings, "
    f"{model.num_params(False) / 1e6:.2f}M in all")
if activation_checkpointing:  # the backward pass recomputes each block (and replays its RNG: the same dropout masks)
    for block in model.layers:
        block.forward = functools.partial(torch.utils.checkpoint.checkpoint, block.forward, use_reentrant=False)
if sharded:  # FSDP2: each block's weights, gradients and optimizer state sharded over the processes
    fsdp.wrap(model, device_type, dtype == 'bfloat16')
gb = {k: v / 2 ** 30 for k, v in hardware.memory_estimate(model, batch_size, block_size, dtype == 'bfloat16', activation_checkpointing,
                                                   world if sharded else 1, sharded and grad_accum > 1).items()}
say(f"memory per process (estimate): weights, gradients and AdamW {gb['states']:.1f} GB + activations "
    f"{gb['activations']:.1f} GB + attention probabilities {gb['attention']:.1f} GB + logits {gb['logits']:.1f} GB "
    f"= {sum(gb.values()):.1f} GB (batch_size {batch_size} x {block_size}"
    f"{', activation checkpointing' if activation_checkpointing else ''}{f', FSDP over {world}' if sharded else ''})")

# AdamW: matrices decayed; norms, biases, embeddings (and parameters marked _no_weight_decay) not
embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
decay, no_decay = [], []
for name, p in model.named_parameters():
    is_decayed = p.dim() >= 2 and (decay_embeddings or id(p) not in embeddings) and not getattr(p, '_no_weight_decay', False)
    (decay if is_decayed else no_decay).append(p)
say(f"weight decay {weight_decay} on {len(decay)} tensors ({sum(p.numel() for p in decay):,} parameters); "
    f"none on {len(no_decay)} tensors ({sum(p.numel() for p in no_decay):,}: norms, biases"
    f"{'' if decay_embeddings else ', embeddings'})")
optimizer = torch.optim.AdamW([{'params': decay, 'weight_decay': weight_decay}, {'params': no_decay, 'weight_decay': 0.0}],
                              lr=learning_rate, betas=(beta1, beta2), fused=device_type == 'cuda')
if init_from == 'resume':  # under FSDP each process takes its shards of the whole state
    fsdp.load_optimizer(model, optimizer, optim_state) if sharded else optimizer.load_state_dict(optim_state)
    del optim_state
recent = collections.deque(ckpt_recent, maxlen=20)  # the last training losses, for the spike check

raw_model = ddp = model
if distributed and not sharded:
    model = ddp = DDP(model, device_ids=[int(os.environ['LOCAL_RANK'])] if device_type == 'cuda' else None)
if compile:  # after the DDP wrap, PyTorch's documented order. Dynamo's DDPOptimizer splits the graph at
    # DDP's gradient buckets so that their all-reduce overlaps the backward (in torch 2.13 it finds
    # the DDP module from inside its forward, so the other order splits too: test_train.py checks the split)
    say("compiling the model...")
    model = torch.compile(model)


def get_lr(it):
    """The learning rate of iteration it (0-based); the last iteration runs at min_lr."""
    warmup = int(warmup_frac * max_iters)
    if it < warmup:
        return learning_rate * (it + 1) / warmup
    if schedule == 'constant':  # SWU
        return learning_rate
    if schedule == 'wsd':  # SWUA: stable, then linear annealing to min_lr over the last anneal_frac
        anneal = max(int(anneal_frac * max_iters), 1)
        frac = (it + 1 - (max_iters - anneal)) / anneal
        return learning_rate if frac <= 0 else learning_rate + frac * (min_lr - learning_rate)
    frac = (it + 1 - warmup) / max(max_iters - warmup, 1)  # cosine
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * frac)) * (learning_rate - min_lr)


def all_sum(t):
    """Sum a tensor over the processes that shared the work (identity in one process)."""
    if distributed:
        dist.all_reduce(t)
    return t


def eval_sum(t):
    """Sum an evaluation tally over the processes that split the evaluation (under FSDP each process does it all)."""
    return t if sharded else all_sum(t)


@torch.no_grad()
def evaluate():
    """Validation loss at the training length; for lm the per-position loss (position_loss), for
    copy and needle the accuracy by length (task_accuracy). Shared among processes."""
    raw_model.eval()
    acc = torch.zeros(2, device=device)  # loss sum, count
    for i in range(eval_rank, eval_iters, eval_world):
        x, y = val_data.batch(batch_size, block_size, batch_rng(seed, 1, i))
        with autocast:
            acc[0] += raw_model(x.to(device), y.to(device))[1].float()
        acc[1] += 1
    eval_sum(acc)
    result = {'val_loss': (acc[0] / acc[1]).item()}
    if eval_lengths:
        if sharded:  # the embedding and the head live outside the blocks: gather them for the cache paths
            raw_model.unshard()
        result.update(position_loss() if task == 'lm' else task_accuracy())
        if sharded:
            raw_model.reshard()
    raw_model.train()
    return result


def position_loss():
    """Mean per-position loss in doubling bands of eval_lengths, (L1/2, L1], (L1, L2], ..., over
    validation windows that start at document starts (the first band has at least L1/2 of context)."""
    windows = val_data.long_windows(max(eval_lengths), eval_windows)
    if windows is None:
        say(f"(no validation document is longer than {max(eval_lengths)} tokens: no per-position loss)")
        return {}
    total, n = loss_curve(raw_model, windows[eval_rank::eval_world], block_size, device, autocast)
    total = torch.cat([total, torch.tensor([float(n)], device=device)])  # per position, then the count
    eval_sum(total)
    edges = [min(eval_lengths) // 2] + sorted(eval_lengths)
    return {'position_loss': band_means(total[:-1] / total[-1], edges), 'windows': len(windows)}


def task_accuracy():
    """Exact-match accuracy of greedy answers (copies, needle values) at the lengths eval_lengths,
    and the fraction of answer tokens that are right."""
    with autocast:
        correct = correct_answers(train_data, raw_model, eval_lengths, task_eval_samples, seed, device, rank=eval_rank,
                                  world=eval_world)
    eval_sum(correct)
    correct = (correct / task_eval_samples).tolist()
    return {'accuracy': {str(L): c[0] for L, c in zip(eval_lengths, correct)},
            'token_accuracy': {str(L): c[1] for L, c in zip(eval_lengths, correct)}}


def save_checkpoint(it):
    """optim_{it}.pt, the optimizer state, then ckpt_{it}.pt, the whole model: a checkpoint on disk
    always has its optimizer state beside it. Each is written to a temporary name, then renamed;
    the newest keep_last models are kept (or all) and the optimizer states of `it` and the step
    before it (resume can go back one). A full disk stops the run, the pairs before intact."""
    state = fsdp.model_state(raw_model) if sharded else raw_model.state_dict()  # FSDP: gathered from every process
    optim = fsdp.optimizer_state(raw_model, optimizer) if sharded else optimizer.state_dict()
    if not master:
        return
    path, optim_path = checkpoint.step_path(out_dir, it), checkpoint.step_path(out_dir, it, 'optim')
    try:
        checkpoint.save({'optimizer': optim, 'step': it, 'sharded': sharded}, optim_path)
        checkpoint.save({'model': state, 'model_type': model_type, 'model_args': model_args, 'step': it,
                         'tokenizer': train_data.meta['tokenizer'], 'config': config, 'cpt_from': cpt_from,
                         'recent_losses': list(recent), 'skips': skips}, path)
    except OSError as e:
        if os.path.exists(optim_path) and not os.path.exists(path):
            os.remove(optim_path)
        raise SystemExit(f"stopping at iteration {it}: cannot save its checkpoint ({e}). The checkpoints before it are "
                         f"intact: free some space and resume with --init_from=resume")
    for old in [s for s in checkpoint.steps(out_dir, 'optim') if s < it][:-1]:  # now that the new pair is complete
        os.remove(checkpoint.step_path(out_dir, old, 'optim'))
    for old in checkpoint.steps(out_dir)[:-keep_last] if keep_last else []:
        os.remove(checkpoint.step_path(out_dir, old))
    print(f"saved {path}", flush=True)


os.makedirs(out_dir, exist_ok=True)  # the first write: every config error above leaves nothing behind
if master:
    lock = lock or checkpoint.lock(out_dir)  # then nothing else writes here
    for name in checkpoint.clean(out_dir):
        say(f"removed {name}, left by an interrupted write")
# every record names its session (0 for the first start, 1 after the first resume, ...): the steps
# that a resumed run repeats can be told from the ones before the interruption
session = sum(1 for line in open(LOG) if '"event": "start"' in line) if master and os.path.exists(LOG) else 0


def log(record):
    """Append one line to log.jsonl, whole or not at all (a full disk: a warning, the run goes on);
    with wandb_log, its numbers to wandb too (position_loss/128-256, accuracy/64, ...)."""
    if not master:
        return
    if wandb_log and record['event'] in ('train', 'eval'):
        flat = {f"{k}/{band}" if isinstance(v, dict) else k: x for k, v in record.items() if k not in ('event', 'iter')
                for band, x in (v.items() if isinstance(v, dict) else [(None, v)]) if isinstance(x, (int, float))}
        wandb.log(flat, step=record['iter'])
    line = (json.dumps({**record, 'session': session}) + '\n').encode()
    size = os.path.getsize(LOG) if os.path.exists(LOG) else 0
    try:
        with open(LOG, 'ab') as f:
            f.write(line)
            f.flush()
    except OSError as e:
        with open(LOG, 'ab') as f:
            f.truncate(size)
        print(f"warning: could not write to {LOG} ({e}); the record of iteration {record.get('iter')} is lost", flush=True)


def print_eval(it, r):
    bands = '  '.join(f"{k}: {v:.4f}" for k, v in r.get('position_loss', {}).items())
    answers = '  '.join(f"{k}: {v:.2f}" for k, v in r.get('accuracy', {}).items())
    say(f"iter {it}: val loss {r['val_loss']:.4f}" + (f" | per-position loss {bands}" if bands else "")
        + (f" | {task} accuracy by length {answers}" if answers else ""))


say("config:\n" + "\n".join(f"  {k} = {v!r}" for k, v in config.items()))
if wandb_log and master:  # a resumed run continues its wandb run: the run's id is kept in out_dir
    id_file = os.path.join(out_dir, 'wandb_id')
    run_id = open(id_file).read().strip() if os.path.exists(id_file) else uuid.uuid4().hex[:8]
    wandb.init(project=wandb_project, name=wandb_run_name or os.path.basename(os.path.abspath(out_dir)), config=config,
               dir=out_dir, id=run_id, resume='allow')
    with open(id_file, 'w') as f:
        f.write(run_id)
log({'event': 'start', 'iter': start_iter, 'config': config})
gpu, peak = hardware.peak_flops(device)  # for MFU; None off CUDA
if device_type == 'cuda':
    say(f"MFU against {gpu}'s bf16 peak of {peak / 1e12:.0f} TFLOP/s" if peak else
        f"no MFU: {gpu!r} is not in hardware.PEAK_FLOPS (add its dense bf16 peak there)")
flops_per_iter = raw_model.flops_per_token(block_size) * tokens_per_batch
def forward_backward(it, backward=True):
    """The training loss of iteration it (the mean over micro-steps and processes), and with
    backward its gradients. The batches and the dropout masks of iteration `it` are functions of
    (seed, it, micro-batch) alone, so a resumed run repeats a straight one exactly."""
    loss_sum = torch.zeros((), device=device)
    step = it + sum(n for start, n in skips if it >= start)  # whose batches iteration it takes (skip_steps moves them on)
    for micro in range(grad_accum):
        j = micro * world + rank  # the micro-batch's index in the global batch: the same data and masks on any number of processes
        torch.manual_seed(hash((seed, step, j)) % 2 ** 62)
        x, y = train_data.batch(batch_size, block_size, batch_rng(seed, 0, step, j))
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if backward and sharded:  # reduce the gradients on the last micro-step only (set in a no-grad
            raw_model.set_requires_gradient_sync(micro == grad_accum - 1)  # forward, it aborts gloo at exit)
        elif backward and distributed:
            ddp.require_backward_grad_sync = micro == grad_accum - 1
        with autocast, torch.set_grad_enabled(backward):
            loss = model(x, y)[1]  # the logits not kept: held through the backward, they are 3.3 GB at 16 x 2048
        if backward:
            (loss / grad_accum).backward()
        loss_sum += loss.detach().float()
    return (all_sum(loss_sum) / (grad_accum * world)).item()


def divergence(loss, grad_norm=0.0):
    """Why the current weights must not be kept (None if they may): a loss or gradient that is not
    finite, or a loss spike_threshold nats above a reference (weights blown up by a huge step give
    a uniform output, ln(vocab), without ever reaching NaN). The reference is the lowest of the
    recent losses; over the first 5 steps, while the loss falls fast, the first loss recorded."""
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
        return f"loss {loss}, gradient norm {grad_norm} (not finite)"
    if len(recent) >= 5:
        reference, what = min(recent), f"the lowest of the last {len(recent)}"
    else:  # the first steps
        reference, what = (recent[0], "the first loss") if recent else (math.inf, '')
    if spike_threshold and loss > reference + spike_threshold:
        return (f"loss {loss:.4f}, {loss - reference:.2f} nats above {what} (spike_threshold = {spike_threshold}; "
                f"0 turns the check off)")
    return None


def stop(it, why):
    """Diverged: exit without saving. Every checkpoint on disk was saved only after its own weights
    passed divergence(), so the newest one is good, and its optimizer state is still beside it."""
    kept = [s for s in checkpoint.pairs(out_dir) if s <= it]
    good = checkpoint.step_path(out_dir, kept[-1]) if kept else None
    say(f"stopping at iteration {it}: {why}. Nothing was saved from these weights. " +
        (f"The last good checkpoint is {good} (its optimizer state beside it): resume from it with --init_from=resume "
         f"--skip_steps={it - kept[-1] + 1} (skips the batches of iterations {kept[-1]}-{it}, which led here), or "
         f"with a lower learning_rate or a longer warm-up." if good else
         "No checkpoint was saved yet: start again with a lower learning_rate or a longer warm-up."))
    log({'event': 'diverged', 'iter': it, 'reason': why, 'last_good': good, 'config': config})
    sys.exit(1)


model.train()
it = t0_iter = start_iter
t0 = time.time()
while True:
    last, halt = it == max_iters, 0 < halt_at == it
    if it % eval_interval == 0 or last:
        result = evaluate()
        print_eval(it, result)
        log({'event': 'eval', 'iter': it, **result})
    if last or halt:  # the weights to save have not been through a training forward yet: check them first
        with torch.no_grad():
            why = divergence(forward_backward(it, backward=False))
        if why:
            stop(it, why)
        save_checkpoint(it)
        break

    # one optimizer step; the weights it starts from are checked, and then saved, before it is taken
    lr = get_lr(it)
    for group in optimizer.param_groups:
        group['lr'] = lr
    loss = forward_backward(it)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else float('inf'))
    grad_norm = (grad_norm.full_tensor() if hasattr(grad_norm, 'full_tensor') else grad_norm).item()  # a DTensor under FSDP
    why = divergence(loss, grad_norm)
    if why:
        stop(it, why)
    if it > start_iter and it % ckpt_interval == 0:
        save_checkpoint(it)
    recent.append(loss)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    it += 1

    if it % log_interval == 0 or it == max_iters:
        if device_type == 'cuda':
            torch.cuda.synchronize()
        dt = (time.time() - t0) / (it - t0_iter)
        t0, t0_iter = time.time(), it
        mfu = f", mfu {100 * flops_per_iter / dt / peak / world:.1f}%" if peak else ""
        say(f"iter {it}: loss {loss:.4f}, lr {lr:.2e}, {dt * 1000:.0f} ms/iter, {tokens_per_batch / dt:,.0f} tok/s{mfu}")
        log({'event': 'train', 'iter': it, 'loss': loss, 'lr': lr, 'grad_norm': grad_norm, 'ms': dt * 1000})

if master and last and 'position_loss' in result:
    bands = result['position_loss']
    base = next(iter(bands.values()))
    say(f"\nper-position validation loss (nats/token) of {out_dir} at iteration {it}, trained on {block_size} tokens "
        f"({result['windows']} windows of {max(eval_lengths)}):")
    say(f"{'positions':>12}" + ''.join(f"{k:>12}" for k in bands))
    say(f"{'loss':>12}" + ''.join(f"{v:>12.4f}" for v in bands.values()))
    say(f"{'vs first':>12}" + ''.join(f"{v - base:>+12.4f}" for v in bands.values()))
if master and last and 'accuracy' in result:
    accuracy = result['accuracy']
    say(f"\n{task} accuracy of {out_dir} at iteration {it}, trained on {'source' if task == 'copy' else 'sequence'} "
        f"lengths {task_min_len}-{task_max_len} ({task_eval_samples} held-out samples per length): exact-match answers, "
        f"and the fraction of right tokens")
    say(f"{'length':>10}" + ''.join(f"{k:>8}" for k in accuracy))
    say(f"{'exact':>10}" + ''.join(f"{v:>8.2f}" for v in accuracy.values()))
    say(f"{'tokens':>10}" + ''.join(f"{v:>8.2f}" for v in result['token_accuracy'].values()))
if distributed:
    dist.barrier()  # every rank done (rank 0 was writing) before the group goes
    dist.destroy_process_group()
    # gloo (CPU) can abort a process at interpreter exit ("terminate called without an active
    # exception", about one run in eight): everything is written and synced, so leave at once
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
