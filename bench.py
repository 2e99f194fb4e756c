"""
Training throughput of the regularizers side by side: one model per variant, all in one
process, timed in alternating rounds so that a machine's drift (~30% on shared CPUs) hits every
variant alike. Reports tokens/s and the ratio to the variant without dropout.

    python bench.py configs/quickstart.py                 # the quick-start model on the CPU
    python bench.py configs/vpad.py --device=cuda --compile=True --batch_size=8

A training config can be given: its model keys are used, its training-only keys ignored.
"""

import sys
import time
from contextlib import nullcontext
from dataclasses import fields

import torch

from configurator import configure
from model import Transformer, TransformerConfig

# -----------------------------------------------------------------------------
globals().update({f.name: f.default for f in fields(TransformerConfig)})
__annotations__.update({f.name: f.type for f in fields(TransformerConfig)})
vocab_size = 320  # the byte tokenizer's 257, rounded up
batch_size = 16
block_size = 256
dropout = 0.1  # p of every variant that has dropout
variants = ['none', 'pre_norm', 'pre_linear', 'vpad', 'attn_dropout']  # dropout_type, or 'attn_dropout'
steps = 10  # timed training steps per variant and round
warmup = 3  # untimed steps per variant before the first round
rounds = 3
device = 'cpu'
dtype = 'float32'  # or 'bfloat16' (autocast)
compile = False
seed = 1337
# -----------------------------------------------------------------------------
globals().update(configure(globals(), sys.argv[1:], lenient_files=True))
autocast = torch.autocast(device.split(':')[0], dtype=torch.bfloat16) if dtype == 'bfloat16' else nullcontext()


def make(variant):
    reg = dict(attn_dropout=dropout) if variant == 'attn_dropout' else dict(dropout_type=variant, dropout=dropout)
    args = {f.name: globals()[f.name] for f in fields(TransformerConfig)}
    torch.manual_seed(seed)
    model = Transformer(TransformerConfig(**{**args, 'dropout': 0.0, 'attn_dropout': 0.0, 'dropout_type': 'none', **reg}))
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.startswith('cuda'))
    return (torch.compile(model) if compile else model), opt


def train_steps(model, opt, n):
    for _ in range(n):
        x = torch.randint(0, vocab_size, (batch_size, block_size + 1), device=device)
        with autocast:
            _, loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if device.startswith('cuda'):
        torch.cuda.synchronize()


runs = {v: make(v) for v in variants}
for v, (model, opt) in runs.items():
    train_steps(model, opt, warmup)
times = {v: [] for v in variants}
for r in range(rounds):
    for v, (model, opt) in runs.items():
        t0 = time.perf_counter()
        train_steps(model, opt, steps)
        times[v].append(time.perf_counter() - t0)
tokens = steps * batch_size * block_size
speed = {v: tokens / sorted(t)[len(t) // 2] for v, t in times.items()}  # the median round
print(f"{n_layer} layers x {n_embd}, {pos_encoding}, batch {batch_size} x {block_size}, p = {dropout}, {device} {dtype}"
      f"{', compiled' if compile else ''}; {rounds} alternating rounds of {steps} steps, median")
print(f"{'variant':>14} {'tok/s':>10} {'vs ' + variants[0]:>10}")
for v in variants:
    print(f"{v:>14} {speed[v]:>10,.0f} {speed[v] / speed[variants[0]]:>10.2f}")
