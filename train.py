"""
Train a model from scratch, continue pre-training (CPT) from a checkpoint, or resume a run.

    python train.py configs/quickstart.py                                  # one CPU process
    torchrun --standalone --nproc_per_node=8 train.py configs/vpad.py     # DDP on 8 GPUs
    python train.py configs/quickstart.py --dropout_type=pre_linear --out_dir=out/pld

Every global below is a config key, set in a config file or as --key=value (configurator.py), and
the resolved config is stored in every checkpoint. The file reads top to bottom: config, data,
model (three ways in), optimizer, one training step, the loop (evaluations: measures.evaluate).
"""

import collections
import functools
import math
import os
import sys
import time
from contextlib import nullcontext
from typing import Literal

import torch
import torch.utils.checkpoint
from torch.nn.parallel import DistributedDataParallel as DDP

import checkpoint
import hardware
from average_ckpts import RunningAverages
from configurator import check_training, configure
from measures import decayed, eval_line, evaluate, report
from model import Transformer, TransformerConfig
from tokens import TRAIN, batch_rng, micro_batches, training_data

# -----------------------------------------------------------------------------
# I/O
out_dir = 'out'
dry_run = False  # print the plan and the memory of each of dry_run_gpus processes, then stop:
dry_run_gpus = 8  # no data, weights (a CPT source's config.json at most), GPU or file is touched
init_from = 'scratch'  # 'scratch', 'resume' (out_dir's newest), or CPT from a checkpoint or weights
log_interval = 10  # iterations between log lines (also written to out_dir/log.jsonl)
eval_interval = 500  # iterations between evaluations (and at the end)
ckpt_interval = 1000  # iterations between checkpoints (and at the end); see keep_last
halt_at = 0  # if > 0, checkpoint and exit at this iteration (the schedule unchanged: resume later)
skip_steps = 0  # init_from='resume' after a divergence: skip the batches of the next N iterations
# evaluation
eval_iters = 20  # validation batches at the training length
eval_lengths: list[int] = [2048, 4096, 8192, 16384]  # lm: per-position loss to each length
eval_windows = 16  # lm: validation windows of max(eval_lengths) tokens for the per-position loss
# data
task: Literal['lm', 'copy', 'needle', 'offset', 'delay_copy'] = 'lm'  # lm: data_dir; or tasks.py's
data_dir = 'data/shakespeare/byte'  # lm: train*.bin / val*.bin and meta.json (data/*/prepare.py)
train_tokens = 0  # lm: if > 0, only the first train_tokens tokens (repeated: a corpus to over-fit)
niah_mix = 0.0  # lm: this fraction of the sequences NIAH-1 documents (docs/study.md's phase 1)
niah_task: Literal['niah_single_1', 'niah_single_1_short'] = 'niah_single_1'  # short: < 1K bytes
task_vocab = 32  # tasks: symbols, the 4 special ones included
task_min_len = 50  # tasks: lengths in training (tasks.LENGTHS says of what), uniform in
task_max_len = 100  # [task_min_len, task_max_len]; the test lengths are eval_lengths
task_eval_samples = 100  # tasks: held-out samples per test length, scored by exact-match answers
needle_value_len = 4  # needle: symbols of its value; offset: of the answer; delay_copy: the source
needle_keys = 1  # needle: needles in the haystack (> 1: the query names one, the others distract)
task_offset = 8  # offset: each answer token is the one this many positions before it
batch_size = 16  # sequences per micro-step, per process
block_size = 2048  # training context length
tokens_per_batch = 524288  # tokens per optimizer step, all processes and micro-steps together
max_tokens = 40e9  # training tokens; max_iters = max_tokens // tokens_per_batch
seed = 1337
# regularization, the paper's subject: weight decay in AdamW below; the dropout keys act at the
# sites of its Figure 2, each named at its call in model.py and mamba.py
weight_decay = 0.1  # AdamW's decoupled decay of the matrices; 0.0 is the paper's "no-WD"
decay_embeddings = False  # also decay the token (and position) embeddings
dropout = 0.0  # p, at the sites of dropout_type
dropout_type = 'none'  # 'none', 'pre_norm' (PN-D, Eq. 6), 'pre_linear' (PL-D) or 'vpad' (VPAD)
vpad_variant = 'A'  # VPAD's rescaling: A (per token, the paper's), B, C or D (dropout.py)
attn_dropout = 0.0  # dropout on the attention probabilities (transformer)
# model: the transformer of model.py or Mamba2 of mamba.py; a key the model has not is unused
model_type: Literal['transformer', 'mamba2'] = 'transformer'  # model.py or mamba.py
n_layer: int | None = None  # None: the model's own, 12 (transformer) or 24 (Mamba2)
n_embd = 768  # the residual width (Mamba2's d_model)
vocab_size: int | None = None  # None: the tokenizer's vocabulary, rounded up to a multiple of 64
norm_eps = 1e-5
bias = False  # biases in the linear layers (and the LayerNorms; Mamba2: in_proj and out_proj)
tie_embeddings = True  # the output head shares the token embedding
# transformer
n_head = 12
n_kv_head: int | None = None  # grouped-query attention: heads of keys and values; None = n_head
head_dim: int | None = None  # None = n_embd // n_head
ffn_dim: int | None = None  # the MLP's hidden width; None = 4 * n_embd
mlp = 'gelu'  # 'gelu' or 'swiglu'
norm = 'rmsnorm'  # 'rmsnorm' or 'layernorm'
pos_encoding: str | list = 'nape'  # per layer: 'nope', 'rope', 'alibi', 'nape' (NAPE) or 'learned'
window: int | list = 0  # a sliding window of W keys per layer, 0 for full attention ("SW")
rope_theta = 10000.0
rope_random = 0  # > 0: randomized RoPE positions in [0, rope_random * T) (docs/methods.md)
rope_scaling = 'none'  # at evaluation: 'none', 'pi' or 'yarn', by rope_factor (docs/methods.md)
rope_factor = 1.0
nape_slopes = 'linear'  # NAPE's ALiBi slopes: 'linear' (1/h) or 'exp' (1/2^(h-1))
attn_alpha = 1.0  # the attention's normaliser: 1 softmax, 1.5 entmax-1.5 (ASEntmax)
attn_scale = 'none'  # the query scale: 'adaptive' is ASEntmax's (model.py has the others)
attn_backend = 'auto'  # 'auto' (fused kernels on CUDA where they apply), 'sdpa', 'flex', 'manual'
# Mamba2
d_state = 128  # N, the state per head and group
d_conv = 4  # the causal convolution's width
expand = 2  # d_inner = expand * n_embd
headdim = 64  # P; heads H = d_inner / headdim
ngroups = 1  # G: heads sharing one B and C
chunk_size = 256  # Q of the SSD scan
conv_bias = True
dt_min = 0.001  # dt is initialised log-uniform in [dt_min, dt_max]
dt_max = 0.1
use_kernels = True  # mamba_ssm / causal_conv1d kernels on CUDA when they import
# optimizer and schedule
learning_rate = 6e-4
min_lr = 6e-5
schedule: Literal['wsd', 'constant', 'cosine'] = 'wsd'  # the paper's SWUA (wsd), SWU (constant)
warmup_frac = 0.025  # fraction of the iterations spent warming up
anneal_frac = 0.2  # 'wsd': fraction of the iterations at the end annealed linearly to min_lr
beta1, beta2 = 0.9, 0.95
grad_clip = 1.0  # 0 disables clipping
spike_threshold = 1.0  # a loss this many nats over the last 20's lowest is a divergence (0: off)
# system
device = 'auto'  # 'auto' (cuda, mps, else cpu), or e.g. 'cpu', 'cuda'
dtype: Literal['auto', 'bfloat16', 'float32'] = 'auto'  # auto: bfloat16 on CUDA, float32 elsewhere
compile: bool | None = None  # torch.compile; None: on for CUDA, off elsewhere
parallel: Literal['ddp', 'fsdp'] = 'ddp'  # under torchrun: a replica per process, or FSDP2
activation_checkpointing = False  # recompute each block in the backward: less memory, more time
keep_last = 0  # keep the newest N model checkpoints; 0 keeps all (averaging needs the last K)
# the average of the weights at the last K averaging steps, summed as the run goes and written at
# its end as avg{K}_{first}-{last}.pt, as average_ckpts.py writes it (Tables 9, 10, 12)
average_last: list[int] = []  # e.g. [10, 20, 30]
average_interval = 0  # iterations between the averaged weights; 0: ckpt_interval
wandb_log = False  # also log to Weights & Biases (pip install wandb) what log.jsonl gets
wandb_project = 'length-generalization'
wandb_run_name = ''  # default: out_dir's name
# -----------------------------------------------------------------------------
given = set()  # the keys a config file or the command line set
config = configure(globals(), sys.argv[1:], given=given)
check_training(config)  # the ranges of the keys and the errors between them (configurator.py)
globals().update(config)

# the processes: one per GPU under torchrun (NCCL), or per CPU process (gloo); or just this one
distributed = 'RANK' in os.environ
rank, world, device = (0, dry_run_gpus, 'cpu') if dry_run else hardware.start(device)
master = rank == 0
sharded = (distributed or dry_run) and parallel == 'fsdp'
device_type = 'cuda' if device.startswith('cuda') else device
bf16 = dtype == 'bfloat16' or dtype == 'auto' and (  # auto: bf16 where CUDA has it
    dry_run or device_type == 'cuda' and torch.cuda.is_bf16_supported())
autocast = torch.autocast(device_type, dtype=torch.bfloat16) if bf16 else nullcontext()
compile = device_type == 'cuda' if compile is None else compile
if device_type == 'cuda':
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
say = functools.partial(print, flush=True) if master else lambda *args: None

# data, and the batch arithmetic (tokens.py: a symbol task, data_dir's shards, NIAH-1 mixed in)
train_data, val_data = training_data(config, dry_run, say)
if task != 'lm':  # the longest sequence, padded to
    block_size = config['block_size'] = train_data.block_size
# micro-batch j of a step: its data and dropout masks depend on (seed, step, j) alone, so with the
# same micro-batch size any process count trains alike
batch_size, grad_accum = micro_batches(tokens_per_batch, block_size, world, batch_size, say)
max_iters = int(max_tokens // tokens_per_batch)
data_vocab = train_data.meta.get('vocab_size', 0)  # 0: a dry run's CPT, which takes the source's
if vocab_size is None:  # the data's, rounded up to a multiple of 64
    vocab_size = config['vocab_size'] = -(-data_vocab // 64) * 64
if vocab_size < data_vocab:
    raise SystemExit(f"config error: vocab_size = {vocab_size} is less than the data's "
                     f"{data_vocab} tokens: leave it unset (the data's, rounded up to 64s)")
say(f"{max_iters:,} iterations of {tokens_per_batch:,} tokens = {world} processes x {grad_accum} "
    f"micro-steps x {batch_size} x {block_size}")


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


# weight decay's dose: AdamW multiplies every decayed matrix by (1 - lr_t * wd) at each step, so a
# matrix the gradient leaves alone ends at prod_t (1 - lr_t * wd) ~ exp(-sum_t lr_t * wd) of its
# size. The sum, not wd, says how hard the decay acts: the paper's from-scratch runs (lr 6e-4,
# 76,293 steps) sum to ~4.1, a shrink of ~98%; its SmolLM3 CPT (lr 2e-5, 953 steps) to ~0.002
summed_decay = weight_decay * sum(get_lr(it) for it in range(max_iters))
shrink = 1 - math.prod(1 - get_lr(it) * weight_decay for it in range(max_iters))
say(f"weight decay {weight_decay}: summed decay sum_t lr_t * wd = {summed_decay:.4g} over "
    f"{max_iters:,} steps; a matrix the gradient leaves alone shrinks by {100 * shrink:.3g}%")
averages = RunningAverages(average_last, average_interval or ckpt_interval, max_iters)
for K, w in averages.windows.items():  # average_ckpts.py's running sums
    say(f"average of the last {K}: the weights of steps {w[0]} to {w[-1]}, every {averages.every}")

# the model, three ways in (checkpoint.way_in): from scratch, as model_args says; resumed from
# out_dir's newest checkpoint pair; or continued pre-training (CPT) of init_from's architecture and
# weights with this run's regularization and windows
if model_type == 'transformer':
    n_layer = TransformerConfig.n_layer if n_layer is None else n_layer  # None: its own, 12
    model_args = dict(vocab_size=vocab_size, block_size=block_size, n_layer=n_layer,
                      n_head=n_head, n_kv_head=n_kv_head, n_embd=n_embd, head_dim=head_dim,
                      ffn_dim=ffn_dim, mlp=mlp, norm=norm, norm_eps=norm_eps, bias=bias,
                      tie_embeddings=tie_embeddings, pos_encoding=pos_encoding, window=window,
                      rope_theta=rope_theta, rope_random=rope_random, rope_scaling=rope_scaling,
                      rope_factor=rope_factor, nape_slopes=nape_slopes, dropout=dropout,
                      dropout_type=dropout_type, vpad_variant=vpad_variant,
                      attn_dropout=attn_dropout, attn_alpha=attn_alpha, attn_scale=attn_scale,
                      attn_backend=attn_backend)
else:
    from mamba import Mamba2Config  # only a Mamba2 run reads mamba.py
    n_layer = Mamba2Config.n_layer if n_layer is None else n_layer  # None: its own, 24
    model_args = dict(vocab_size=vocab_size, n_layer=n_layer, n_embd=n_embd,
                      d_state=d_state, d_conv=d_conv, expand=expand, headdim=headdim,
                      ngroups=ngroups, chunk_size=chunk_size, norm_eps=norm_eps, bias=bias,
                      conv_bias=conv_bias, tie_embeddings=tie_embeddings, dt_min=dt_min,
                      dt_max=dt_max, dropout=dropout, dropout_type=dropout_type,
                      vpad_variant=vpad_variant, use_kernels=use_kernels)


def build_model(model_type, model_args, device='cpu'):
    """nanoGPT's GPT(GPTConfig(**model_args)), for either model; on 'meta' its shape alone."""
    try:
        with torch.device(device):
            if model_type == 'mamba2':
                from mamba import Mamba2, Mamba2Config  # (CPT may take a Mamba2 from its source)
                return Mamba2(Mamba2Config(**model_args))
            return Transformer(TransformerConfig(**model_args))
    except ValueError as e:  # the model's own checks: sizes, positions, dropout
        raise SystemExit(f"config error: {e}")


if init_from == 'scratch':  # those checks, and its shape, before out_dir is touched
    shape = build_model(model_type, model_args, 'meta')
log = checkpoint.RunLog(out_dir, master, wandb_log)  # log.jsonl (and wandb)
# one writer per out_dir, for the life of this process, from before anything in it is read (two runs
# started together on a new folder: one of them trains); a run refused from here on leaves no trace
lock = checkpoint.lock(out_dir) if master and not dry_run else None
start_iter, ckpt, optim_state, cpt_from, model_type, model_args, skips = checkpoint.way_in(
    config, model_args, given, sharded, train_data.meta.get('tokenizer'), dry_run, say)
config['model_type'] = model_type
# the stored config records the model that is trained, but block_size stays the training length
# (a CPT model keeps its source's, for learned positions and LogLen's L)
config.update({k: v for k, v in model_args.items() if k != 'block_size'})
if init_from == 'resume':  # after a divergence: not the same batches again, unless skip_steps says
    log.check_replay(start_iter, config, 'skip_steps' in given)
recent = collections.deque(ckpt.get('recent_losses', []) if init_from == 'resume' else [],
                           maxlen=20)
if init_from != 'scratch':  # the checkpoint's model: what it needs, before anything is allocated
    shape = build_model(model_type, model_args, 'meta')
memory = hardware.describe_memory(shape, batch_size, block_size, bf16,
                                  activation_checkpointing, world if sharded else 1,
                                  sharded and grad_accum > 1, None if dry_run else device,
                                  len(average_last))  # SystemExit: cannot fit
ckpt_steps = len(set(range(start_iter + ckpt_interval - start_iter % ckpt_interval, max_iters,
                           ckpt_interval)) | {max_iters})  # this run's saves, the last included
plan, too_big = hardware.plan(shape, block_size, (max_iters - start_iter) * tokens_per_batch,
                              shape.num_params(False), ckpt_steps, keep_last, len(average_last),
                              out_dir)
if dry_run:
    say(f"dry run, {world} processes: {memory}\n{plan}" + (f"\nhere: {too_big}" if too_big else ''))
    sys.exit(0)
if too_big and master and init_from != 'resume':  # a resumed run's checkpoints are on the disk:
    raise too_big  # a full disk stops it at the save that does not fit, the pair before intact
torch.manual_seed(seed)  # the initial weights
model = build_model(model_type, model_args)
if ckpt is not None:
    model.load_state_dict(ckpt['model'])
    del ckpt
model.to(device)
if model_args.get('pos_encoding') == 'learned' and eval_lengths and max(eval_lengths) > block_size:
    eval_lengths = config['eval_lengths'] = [L for L in eval_lengths if L <= block_size]
    say(f"learned absolute positions stop at block_size: per-position loss only up to {block_size}")
say(f"{model_type}: {model.num_params() / 1e6:.2f}M parameters without embeddings, "
    f"{model.num_params(False) / 1e6:.2f}M in all")
if activation_checkpointing:  # the backward recomputes each block, replaying its RNG (its masks)
    for block in model.layers:
        block.forward = functools.partial(torch.utils.checkpoint.checkpoint, block.forward,
                                          use_reentrant=False)
if sharded:  # FSDP2: each block's weights, gradients and optimizer state sharded over the processes
    hardware.shard(model, device_type, bf16)
say(memory)
say(plan)

# AdamW: matrices decayed; norms, biases, embeddings (and parameters marked _no_weight_decay) not
decay = decayed(model, decay_embeddings)  # (measures.py)
no_decay = [p for p in model.parameters() if id(p) not in {id(q) for q in decay}]
say(f"weight decay {weight_decay} on {len(decay)} tensors ({sum(p.numel() for p in decay):,} "
    f"parameters); none on {len(no_decay)} tensors ({sum(p.numel() for p in no_decay):,}: norms, "
    f"biases{'' if decay_embeddings else ', embeddings'})")
optimizer = torch.optim.AdamW([{'params': decay, 'weight_decay': weight_decay},
                               {'params': no_decay, 'weight_decay': 0.0}],
                              lr=learning_rate, betas=(beta1, beta2), fused=device_type == 'cuda')
if init_from == 'resume':  # AdamW's moments and the averages' sums (FSDP: each process its shards)
    hardware.load_optimizer(model, optimizer, optim_state['optimizer'], sharded)
    averages.load(optim_state.get('averages'), model.state_dict(), device, out_dir)
    del optim_state

raw_model = ddp = model
if distributed and not sharded:
    ids = [int(os.environ['LOCAL_RANK'])] if device_type == 'cuda' else None
    model = ddp = DDP(model, device_ids=ids)
if compile:  # after the DDP wrap (PyTorch's order): Dynamo splits the graph at DDP's buckets so
    # that their all-reduce overlaps the backward (test_train.py checks the split)
    say("compiling the model...")
    model = torch.compile(model)


# -----------------------------------------------------------------------------
# one training step, and the checks that keep a diverged run from overwriting its last good state

def forward_backward(it, backward=True):
    """The training loss of iteration it (the mean over micro-steps and processes), and with
    backward its gradients. The batches and the dropout masks of iteration `it` are functions of
    (seed, it, micro-batch) alone, so a resumed run repeats a straight one exactly."""
    loss_sum = torch.zeros((), device=device)
    step = it + sum(n for start, n in skips if it >= start)  # whose batches it takes (skip_steps)
    for micro in range(grad_accum):
        j = micro * world + rank  # the micro-batch's index in the step, whatever the process count
        torch.manual_seed(hash((seed, step, j)) % 2 ** 62)  # its dropout masks
        x, y = train_data.batch(batch_size, block_size, batch_rng(seed, TRAIN, step, j))
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if backward and sharded:  # reduce the gradients on the last micro-step only (set in
            # a no-grad forward, it aborts gloo at exit)
            raw_model.set_requires_gradient_sync(micro == grad_accum - 1)
        elif backward and distributed:
            ddp.require_backward_grad_sync = micro == grad_accum - 1
        with autocast, torch.set_grad_enabled(backward):
            loss = model(x, y)[1]  # logits not kept: held through the backward, 3.3 GB at 16x2048
        if backward:
            (loss / grad_accum).backward()
        loss_sum += loss.detach().float()
    return (hardware.all_sum(loss_sum) / (grad_accum * world)).item()


def check_divergence(it, loss, grad_norm=0.0):
    """Exit without saving if the weights of iteration it must not be kept (checkpoint.divergence),
    naming the last good checkpoint: the newest, as each passed this check before it was saved."""
    why = checkpoint.divergence(loss, grad_norm, recent, spike_threshold)
    if why:
        good, how = checkpoint.after_divergence(out_dir, it)
        say(f"stopping at iteration {it}: {why}. Nothing was saved from these weights. {how}")
        log({'event': 'diverged', 'iter': it, 'reason': why, 'last_good': good, 'config': config})
        sys.exit(1)


def save_checkpoint(it):
    """The weights of iteration it, checked by check_divergence() but not yet stepped, and the
    optimizer state with the averages' sums beside them (checkpoint.save_pair: atomic)."""
    state = hardware.model_state(raw_model) if sharded else raw_model.state_dict()  # FSDP: whole
    optim = hardware.optimizer_state(raw_model, optimizer) if sharded else optimizer.state_dict()
    sums = averages.state_dict()  # every process: gathered under FSDP
    if master:
        optim = {'optimizer': optim, 'step': it, 'sharded': sharded, 'averages': sums}
        checkpoint.save_pair(out_dir, it, keep_last, optim, {
            'model': state, 'model_type': model_type, 'model_args': model_args, 'step': it,
            'tokenizer': train_data.meta['tokenizer'], 'config': config, 'cpt_from': cpt_from,
            'recent_losses': list(recent), 'skips': skips, 'summed_decay': summed_decay})


# -----------------------------------------------------------------------------
# the loop
if master:  # out_dir's lock is this process's: what an interrupted write left is removed
    for name in checkpoint.clean(out_dir):
        say(f"removed {name}, left by an interrupted write")
say("config:\n" + "\n".join(f"  {k} = {v!r}" for k, v in config.items()))
log.start(start_iter, config, wandb_project, wandb_run_name)
_, peak = hardware.peak_flops(device, say)  # for MFU; None off CUDA
flops_per_iter = raw_model.flops_per_token(block_size) * tokens_per_batch
model.train()
it = t0_iter = start_iter
t0 = time.time()
while True:
    last, halt = it == max_iters, 0 < halt_at == it
    if it % eval_interval == 0 or last:
        result = evaluate(raw_model, config, batch_size, train_data, val_data, sharded, say,
                          device=device, autocast=autocast, rank=rank, world=world,
                          reduce=hardware.all_sum)
        say(eval_line(it, result, task))
        log({'event': 'eval', 'iter': it, **result})  # log: checkpoint.RunLog
    if last or halt:  # the weights to save have had no training forward yet: check them first
        check_divergence(it, forward_backward(it, backward=False))  # under "one training step"
        averages.add(it, raw_model)
        save_checkpoint(it)
        if last and averages.windows:  # avg{K}_{first}-{last}.pt beside the last checkpoint
            state = hardware.model_state(raw_model) if sharded else raw_model.state_dict()
            for path, w in averages.write(out_dir, it, state, master):
                say(f"saved {path}: the average of the weights of steps {w[0]} to {w[-1]}")
        break

    # one optimizer step; the weights it starts from are checked, and then saved, before it is taken
    lr = get_lr(it)  # the schedule, after the batch arithmetic
    for group in optimizer.param_groups:
        group['lr'] = lr
    loss = forward_backward(it)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip or math.inf)
    grad_norm = hardware.whole(grad_norm).item()  # FSDP: a sharded tensor
    check_divergence(it, loss, grad_norm)
    averages.add(it, raw_model)
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
        say(f"iter {it}: loss {loss:.4f}, lr {lr:.2e}, {dt * 1000:.0f} ms/iter, "
            f"{tokens_per_batch / dt:,.0f} tok/s{mfu}")
        log({'event': 'train', 'iter': it, 'loss': loss, 'lr': lr, 'grad_norm': grad_norm,
             'ms': dt * 1000})

if last and ('position_loss' in result or 'accuracy' in result):
    say(report(result, it, config))  # the final table: measures.report
if distributed:
    hardware.finish()
