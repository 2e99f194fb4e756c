"""
Train a model from scratch, continue pre-training (CPT) from a checkpoint, or resume a run.

    python train.py configs/quickstart.py                                  # one CPU process
    torchrun --standalone --nproc_per_node=8 train.py configs/vpad.py     # DDP on 8 GPUs
    python train.py configs/quickstart.py --dropout_type=pre_linear --out_dir=out/pld

Every global below is a config key: set it in a config file or as --key=value (configurator.py).
The whole resolved config is printed and stored in every checkpoint.
"""

import json
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import fields

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import checkpoint
from configurator import configure
from eval_loss import band_means, loss_curve
from tasks import Copy
from tokens import TokenData, batch_rng, same_tokenizer

# -----------------------------------------------------------------------------
# I/O
out_dir = 'out'
init_from = 'scratch'  # 'scratch', 'resume' (the newest checkpoint in out_dir) or a checkpoint path (CPT)
log_interval = 10  # iterations between log lines (also written to out_dir/log.jsonl)
eval_interval = 500  # iterations between evaluations (and at the end)
ckpt_interval = 1000  # iterations between checkpoints (and at the end); every one is kept
halt_at = 0  # if > 0, checkpoint and exit at this iteration; the schedule is unchanged (resume later)
# evaluation
eval_iters = 20  # validation batches at the training length
eval_lengths = [2048, 4096, 8192, 16384]  # lm: mean per-position loss in the bands (L1/2, L1], (L1, L2], ...
eval_windows = 16  # lm: validation windows of max(eval_lengths) tokens for the per-position loss
# data
task = 'lm'  # 'lm': next-token prediction on data_dir; 'copy': the Copy task of tasks.py, made on the fly
data_dir = 'data/shakespeare/byte'  # lm: a folder of train*.bin / val*.bin shards and meta.json (data/*/prepare.py)
copy_vocab = 32  # copy: symbols, the 4 special ones included
copy_min_len = 50  # copy: source lengths at training, uniform in [copy_min_len, copy_max_len];
copy_max_len = 100  # the test lengths are eval_lengths (exact-match accuracy of greedy copies)
copy_eval_samples = 100  # copy: held-out sources per test length
batch_size = 16  # sequences per micro-step, per process
block_size = 2048  # training context length
tokens_per_batch = 524288  # tokens per optimizer step, all processes and micro-steps together
max_tokens = 40e9  # training tokens; max_iters = max_tokens // tokens_per_batch
seed = 1337
# model: every field of the models' config dataclasses is a key (model.py and mamba.py give their meaning)
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
# system
device = 'auto'  # 'auto' (cuda, mps, else cpu), or e.g. 'cpu', 'cuda'
dtype = 'auto'  # 'auto' (bfloat16 on CUDA, float32 elsewhere), 'bfloat16' or 'float32'
compile: bool | None = None  # torch.compile; None: on for CUDA, off elsewhere
# -----------------------------------------------------------------------------
config = configure(globals(), sys.argv[1:])
globals().update(config)

# distributed setup: one process per GPU under torchrun (NCCL), or per CPU process (gloo)
ddp = 'RANK' in os.environ
if device == 'auto':
    device = 'cuda' if torch.cuda.is_available() else 'mps' if torch.backends.mps.is_available() else 'cpu'
if ddp:
    dist.init_process_group(backend='nccl' if device.startswith('cuda') else 'gloo')
    rank, world = dist.get_rank(), dist.get_world_size()
    if device.startswith('cuda'):
        device = f"cuda:{os.environ['LOCAL_RANK']}"
        torch.cuda.set_device(device)
else:
    rank, world = 0, 1
master = rank == 0
device_type = 'cuda' if device.startswith('cuda') else device
if dtype == 'auto':
    dtype = 'bfloat16' if device_type == 'cuda' and torch.cuda.is_bf16_supported() else 'float32'
if dtype not in ('bfloat16', 'float32'):
    raise SystemExit(f"config error: dtype must be 'auto', 'bfloat16' or 'float32', got {dtype!r}")
if schedule not in ('wsd', 'constant', 'cosine'):
    raise SystemExit(f"config error: schedule must be 'wsd', 'constant' or 'cosine', got {schedule!r}")
autocast = torch.autocast(device_type, dtype=torch.bfloat16) if dtype == 'bfloat16' else nullcontext()
if compile is None:
    compile = device_type == 'cuda'
if device_type == 'cuda':
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True


def say(*args):
    if master:
        print(*args, flush=True)


# data, and the batch arithmetic
if task == 'copy':
    train_data = val_data = Copy(copy_vocab, copy_min_len, copy_max_len)
    block_size = config['block_size'] = train_data.block_size  # the longest sequence, padded to
    say(f"data: the Copy task, {copy_vocab} symbols, source lengths {copy_min_len}-{copy_max_len}, sequences padded to {block_size}")
elif task == 'lm':
    try:
        train_data, val_data = TokenData(data_dir, 'train'), TokenData(data_dir, 'val')
    except FileNotFoundError as e:
        raise SystemExit(str(e))
    say(f"data: {data_dir}, {len(train_data):,} train / {len(val_data):,} val tokens; tokenizer {train_data.meta['tokenizer']}")
else:
    raise SystemExit(f"config error: task must be 'lm' or 'copy', got {task!r}")
per_micro = batch_size * block_size * world
if tokens_per_batch % per_micro:
    raise SystemExit(f"config error: tokens_per_batch ({tokens_per_batch}) must be a multiple of "
                     f"batch_size * block_size * processes = {per_micro}")
grad_accum = tokens_per_batch // per_micro
max_iters = int(max_tokens // tokens_per_batch)
if vocab_size is None:
    vocab_size = config['vocab_size'] = -(-train_data.meta['vocab_size'] // 64) * 64
say(f"{max_iters:,} iterations of {tokens_per_batch:,} tokens = {world} processes x {grad_accum} micro-steps "
    f"x {batch_size} x {block_size}")

# the model: from scratch, from a checkpoint (CPT) or resumed
os.makedirs(out_dir, exist_ok=True)
if model_type not in checkpoint.MODELS:
    raise SystemExit(f"config error: model_type must be one of {list(checkpoint.MODELS)}, got {model_type!r}")
model_args = {f.name: config[f.name] for f in fields(checkpoint.MODELS[model_type][1])}
start_iter, ckpt, optim_state = 0, None, None
if init_from == 'scratch':
    if checkpoint.steps(out_dir):
        raise SystemExit(f"{out_dir} already holds checkpoints of an earlier run: continue it with --init_from=resume, "
                         f"or choose another --out_dir (or delete the folder)")
elif init_from == 'resume':
    resumable = sorted(set(checkpoint.steps(out_dir)) & set(checkpoint.steps(out_dir, 'optim')))
    if not resumable:
        raise SystemExit(f"init_from='resume' but {out_dir} holds no checkpoint with optimizer state")
    start_iter = resumable[-1]
    ckpt = checkpoint.load(checkpoint.step_path(out_dir, start_iter))
    changed = {k: (v, model_args.get(k)) for k, v in ckpt['model_args'].items() if model_args.get(k) != v}
    if changed or ckpt['model_type'] != model_type:
        diff = ', '.join(f"{k}: checkpoint {a!r} vs config {b!r}" for k, (a, b) in changed.items())
        raise SystemExit(f"cannot resume {out_dir}: the config describes another model ({diff or model_type}). "
                         f"Resume with the run's own config, or start a new run in another out_dir.")
    optim_state = checkpoint.load(checkpoint.step_path(out_dir, start_iter, 'optim'))
    say(f"resuming {out_dir} at iteration {start_iter}")
else:  # CPT: the architecture and weights of the checkpoint, with this run's regularization and windows
    if not os.path.exists(init_from):
        raise SystemExit(f"init_from must be 'scratch', 'resume', a checkpoint file or a weights folder; "
                         f"{init_from} is none of these")
    ckpt = checkpoint.load_any(init_from)
    if ckpt['tokenizer'] is None:
        raise SystemExit(f"{init_from} has no tokenizer.json: copy in the tokenizer the model was trained with "
                         f"(GPT-NeoX's for state-spaces/mamba2-*)")
    if not same_tokenizer(ckpt['tokenizer'], train_data.meta['tokenizer']):
        raise SystemExit(f"{init_from} was trained with tokenizer {ckpt['tokenizer']}, but the data is tokenized with "
                         f"{train_data.meta['tokenizer']}: prepare the data with the checkpoint's tokenizer")
    runtime = ('dropout', 'dropout_type', 'vpad_variant', 'attn_dropout', 'window', 'attn_backend', 'use_kernels')
    model_type = config['model_type'] = ckpt['model_type']
    known = {f.name for f in fields(checkpoint.MODELS[model_type][1])}
    model_args = {**ckpt['model_args'], **{k: config[k] for k in runtime if k in known}}
    say(f"continued pre-training from {init_from} (step {ckpt['step']})")
torch.manual_seed(seed)  # the initial weights
model = checkpoint.build_model(model_type, model_args)
if ckpt is not None:
    model.load_state_dict(ckpt['model'])
model.to(device)
if model_args.get('pos_encoding') == 'learned' and eval_lengths and max(eval_lengths) > block_size:
    eval_lengths = [L for L in eval_lengths if L <= block_size]
    say(f"learned absolute positions stop at block_size: per-position loss only up to {block_size}")
say(f"{model_type}: {model.num_params() / 1e6:.2f}M parameters without embeddings, "
    f"{model.num_params(False) / 1e6:.2f}M in all")

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
if optim_state is not None:
    optimizer.load_state_dict(optim_state['optimizer'])

raw_model = model
if compile:
    say("compiling the model...")
    model = torch.compile(model)
if ddp:
    model = DDP(model, device_ids=[int(os.environ['LOCAL_RANK'])] if device_type == 'cuda' else None)


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
    """Sum a tensor over processes (identity without DDP)."""
    if ddp:
        dist.all_reduce(t)
    return t


@torch.no_grad()
def evaluate():
    """Validation loss at the training length; for lm the per-position loss (position_loss), for
    copy the accuracy by length (copy_accuracy). Shared among processes."""
    raw_model.eval()
    acc = torch.zeros(2, device=device)  # loss sum, count
    for i in range(rank, eval_iters, world):
        x, y = val_data.batch(batch_size, block_size, batch_rng(seed, 1, i))
        with autocast:
            acc[0] += raw_model(x.to(device), y.to(device))[1].float()
        acc[1] += 1
    all_sum(acc)
    result = {'val_loss': (acc[0] / acc[1]).item()}
    if eval_lengths:
        result.update(copy_accuracy() if task == 'copy' else position_loss())
    raw_model.train()
    return result


def position_loss():
    """Mean per-position loss in doubling bands of eval_lengths, (L1/2, L1], (L1, L2], ..., over
    validation windows that start at document starts (the first band has at least L1/2 of context)."""
    windows = val_data.long_windows(max(eval_lengths), eval_windows)
    if windows is None:
        say(f"(no validation document is longer than {max(eval_lengths)} tokens: no per-position loss)")
        return {}
    total, n = loss_curve(raw_model, windows[rank::world], block_size, device, autocast)
    total = all_sum(torch.cat([total, torch.tensor([float(n)], device=device)]))  # per position, then the count
    edges = [min(eval_lengths) // 2] + sorted(eval_lengths)
    return {'position_loss': band_means(total[:-1] / total[-1], edges), 'windows': len(windows)}


def copy_accuracy():
    """Exact-match accuracy of greedy copies at the source lengths eval_lengths, and the
    fraction of copied tokens that are right."""
    with autocast:
        correct = train_data.correct_copies(raw_model, eval_lengths, copy_eval_samples, seed, device, rank=rank, world=world)
    correct = (all_sum(correct) / copy_eval_samples).tolist()
    return {'copy_accuracy': {str(L): c[0] for L, c in zip(eval_lengths, correct)},
            'copy_token_accuracy': {str(L): c[1] for L, c in zip(eval_lengths, correct)}}


def save_checkpoint(it):
    """ckpt_{it}.pt (model, kept) and optim_{it}.pt (optimizer; only the newest is kept)."""
    if not master:
        return
    checkpoint.save({'model': raw_model.state_dict(), 'model_type': model_type, 'model_args': model_args,
                     'tokenizer': train_data.meta['tokenizer'], 'step': it, 'config': config},
                    checkpoint.step_path(out_dir, it))
    checkpoint.save({'optimizer': optimizer.state_dict(), 'step': it}, checkpoint.step_path(out_dir, it, 'optim'))
    for old in checkpoint.steps(out_dir, 'optim'):
        if old != it:
            os.remove(checkpoint.step_path(out_dir, old, 'optim'))
    print(f"saved {checkpoint.step_path(out_dir, it)}", flush=True)


def log(record):
    if master:
        with open(os.path.join(out_dir, 'log.jsonl'), 'a') as f:
            f.write(json.dumps(record) + '\n')


def print_eval(it, r):
    bands = '  '.join(f"{k}: {v:.4f}" for k, v in r.get('position_loss', {}).items())
    copies = '  '.join(f"{k}: {v:.2f}" for k, v in r.get('copy_accuracy', {}).items())
    say(f"iter {it}: val loss {r['val_loss']:.4f}" + (f" | per-position loss {bands}" if bands else "")
        + (f" | copy accuracy by length {copies}" if copies else ""))


say("config:\n" + "\n".join(f"  {k} = {v!r}" for k, v in config.items()))
log({'event': 'start', 'iter': start_iter, 'config': config})
peak = {'A100': 312e12, 'H100': 989e12, 'H200': 989e12, 'L40S': 362e12, 'A10': 125e12}  # dense bf16 FLOP/s
peak = next((v for k, v in peak.items() if device_type == 'cuda' and k in torch.cuda.get_device_name()), None)
flops_per_iter = raw_model.flops_per_token(block_size) * tokens_per_batch
model.train()
it = t0_iter = start_iter
t0 = time.time()
while True:
    last, halt = it == max_iters, 0 < halt_at == it
    if it % eval_interval == 0 or last:
        result = evaluate()
        print_eval(it, result)
        log({'event': 'eval', 'iter': it, **result})
    if it > start_iter and (it % ckpt_interval == 0 or last) or halt:
        save_checkpoint(it)
    if last or halt:
        break

    # one optimizer step. The batches and the dropout masks of iteration `it` are functions of
    # (seed, rank, it, micro-step) alone, so a resumed run repeats a straight one exactly.
    lr = get_lr(it)
    for group in optimizer.param_groups:
        group['lr'] = lr
    loss_sum = torch.zeros((), device=device)
    for micro in range(grad_accum):
        torch.manual_seed(hash((seed, rank, it, micro)) % 2 ** 62)
        x, y = train_data.batch(batch_size, block_size, batch_rng(seed, 0, rank, it, micro))
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if ddp:  # all-reduce the gradients on the last micro-step only
            model.require_backward_grad_sync = micro == grad_accum - 1
        with autocast:
            _, loss = model(x, y)
        (loss / grad_accum).backward()
        loss_sum += loss.detach().float()
    loss = (all_sum(loss_sum) / (grad_accum * world)).item()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else float('inf')).item()
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
        kept = checkpoint.steps(out_dir)
        say(f"stopping at iteration {it}: loss {loss}, gradient norm {grad_norm} (not finite). Nothing was saved from "
            f"this iteration; the last good checkpoint is {checkpoint.step_path(out_dir, kept[-1]) if kept else 'none'}. "
            f"Try a lower learning_rate or a longer warm-up, then resume.")
        log({'event': 'nonfinite', 'iter': it, 'loss': loss, 'grad_norm': grad_norm})
        sys.exit(1)
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
if master and last and 'copy_accuracy' in result:
    accuracy = result['copy_accuracy']
    say(f"\ncopy accuracy of {out_dir} at iteration {it}, trained on source lengths {copy_min_len}-{copy_max_len} "
        f"({copy_eval_samples} held-out sources per length): exact-match copies, and the fraction of right tokens")
    say(f"{'length':>10}" + ''.join(f"{k:>8}" for k in accuracy))
    say(f"{'exact':>10}" + ''.join(f"{v:>8.2f}" for v in accuracy.values()))
    say(f"{'tokens':>10}" + ''.join(f"{v:>8.2f}" for v in result['copy_token_accuracy'].values()))
if ddp:
    dist.barrier()  # every rank done (rank 0 was writing) before the group goes
    dist.destroy_process_group()
