"""
Throughput, side by side in one process: every variant is timed in alternating rounds, so that
a machine's drift (~30% on shared CPUs) hits them alike; the report gives ratios.

    python bench.py configs/quickstart.py                      # the regularizers: tokens/s vs none
    python bench.py --model_type=mamba2 --hf_mamba=True        # mamba.py vs transformers' Mamba2
    python bench.py configs/vpad.py --device=cuda --compile=True --batch_size=8

A training config can be given: its model keys are used, its training-only keys ignored.
"""

import sys
import time
from contextlib import nullcontext
from dataclasses import fields

import torch

import checkpoint
from configurator import configure
from mamba import to_transformers

# -----------------------------------------------------------------------------
model_type = 'transformer'  # or 'mamba2'
for _f in (f for _, cfg in checkpoint.MODELS.values() for f in fields(cfg)):
    globals().setdefault(_f.name, _f.default)
    __annotations__.setdefault(_f.name, _f.type)
vocab_size = 320  # the byte tokenizer's 257, rounded up
n_layer, n_head, n_embd = 4, 4, 128
d_state, headdim, chunk_size = 64, 32, 64
batch_size = 16
block_size = 256
bench_dropout = 0.1  # p of every variant that has dropout (a config's own dropout is ignored)
variants = ['none', 'pre_norm', 'pre_linear', 'vpad', 'attn_dropout']  # dropout_type, or 'attn_dropout'
hf_mamba = False  # instead: mamba.py against transformers' pure-PyTorch Mamba2 of the same size and weights
gen_prompt, gen_tokens = 1024, 64  # hf_mamba: generation after a prompt of gen_prompt tokens
steps = 10  # timed steps per variant and round
warmup = 3  # untimed steps per variant before the first round
rounds = 3
device = 'cpu'
dtype = 'float32'  # or 'bfloat16' (autocast)
compile = False
seed = 1337
# -----------------------------------------------------------------------------
globals().update(configure(globals(), sys.argv[1:], lenient_files=True))
autocast = torch.autocast(device.split(':')[0], dtype=torch.bfloat16) if dtype == 'bfloat16' else nullcontext()


def build(**changes):
    args = {f.name: globals()[f.name] for f in fields(checkpoint.MODELS[model_type][1])}
    torch.manual_seed(seed)
    return checkpoint.build_model(model_type, {**args, **changes}).to(device)


def variant(name):
    """A model and its optimizer for one regularizer."""
    reg = dict(dropout_type='none', attn_dropout=bench_dropout) if name == 'attn_dropout' else dict(dropout_type=name)
    if model_type == 'transformer':
        reg = {'attn_dropout': 0.0, **reg}
    model = build(dropout=bench_dropout, **reg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.startswith('cuda'))
    return (torch.compile(model) if compile else model), opt


def train_steps(model, opt, n, hf=False):
    for _ in range(n):
        x = torch.randint(0, vocab_size, (batch_size, block_size + 1), device=device)
        with autocast:  # transformers shifts the labels itself
            loss = model(input_ids=x[:, :-1], labels=x[:, :-1]).loss if hf else model(x[:, :-1], x[:, 1:])[1]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    sync()


def sync():
    if device.startswith('cuda'):
        torch.cuda.synchronize()


def timed(fns):
    """Median seconds of each function over alternating rounds, after one warm-up call each."""
    for fn in fns.values():
        fn(warmup)
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn(steps)
            times[k].append(time.perf_counter() - t0)
    return {k: sorted(t)[len(t) // 2] for k, t in times.items()}


def table(title, rows, unit):
    base = next(iter(rows.values()))
    print(title)
    print(f"{'':>16} {unit:>12} {'ratio':>8}")
    for k, v in rows.items():
        print(f"{k:>16} {v:>12,.0f} {v / base:>8.2f}")


tokens = steps * batch_size * block_size
header = f"{model_type}, {n_layer} layers x {n_embd}, batch {batch_size} x {block_size}, {device} {dtype}" \
         f"{', compiled' if compile else ''}; {rounds} alternating rounds of {steps} steps, median"
if not hf_mamba:
    runs = {v: variant(v) for v in variants if not (v == 'attn_dropout' and model_type == 'mamba2')}
    secs = timed({v: (lambda n, r=r: train_steps(*r, n)) for v, r in runs.items()})
    table(f"{header}; dropout p = {bench_dropout}", {v: tokens / s for v, s in secs.items()}, 'tokens/s')
else:
    assert model_type == 'mamba2', "hf_mamba compares Mamba2 models: set --model_type=mamba2"
    ours = build()
    theirs = to_transformers(ours)
    train = {'mamba.py': (ours, torch.optim.AdamW(ours.parameters(), lr=1e-4), False),
             'transformers': (theirs, torch.optim.AdamW(theirs.parameters(), lr=1e-4), True)}
    secs = timed({k: (lambda n, r=r: train_steps(r[0], r[1], n, r[2])) for k, r in train.items()})
    table(f"{header}\ntraining", {k: tokens / s for k, s in secs.items()}, 'tokens/s')
    ours.eval(), theirs.eval()
    prompt = torch.randint(0, vocab_size, (1, gen_prompt), device=device)

    def generate(model, n):
        for _ in range(n):
            with torch.no_grad(), autocast:
                if model is ours:
                    model.generate(prompt, gen_tokens)
                else:
                    model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=gen_tokens,
                                   min_new_tokens=gen_tokens, do_sample=False, pad_token_id=0)
        sync()
    steps, warmup = 1, 1
    secs = timed({'mamba.py': lambda n: generate(ours, n), 'transformers': lambda n: generate(theirs, n)})
    table(f"generation: a prompt of {gen_prompt} tokens, then {gen_tokens} greedy tokens",
          {k: gen_tokens / s for k, s in secs.items()}, 'tokens/s')
