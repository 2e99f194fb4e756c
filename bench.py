"""
Speed and memory, side by side. Training variants are timed in alternating rounds in one
process, so that a machine's drift (~30% on shared CPUs) hits them alike; the report gives ratios.

    python bench.py configs/quickstart.py                     # the regularizers: tokens/s vs none
    python bench.py --model_type=mamba2 --mode=hf_mamba       # mamba.py vs transformers' Mamba2
    python bench.py configs/quickstart.py --mode=context      # prefill/decoding time and peak memory vs length
    python bench.py configs/vpad.py --device=cuda --compile=True --batch_size=8

A training config can be given: its model keys are used, its training-only keys ignored.
"""

import multiprocessing
import resource
import sys
import time
from contextlib import nullcontext
from dataclasses import fields

import torch

import checkpoint


def build(model_type, args, device, seed=1337):
    torch.manual_seed(seed)
    return checkpoint.build_model(model_type, args).to(device)


def train_steps(model, opt, n, batch_size, block_size, vocab_size, device, autocast, hf=False):
    for _ in range(n):
        x = torch.randint(0, vocab_size, (batch_size, block_size + 1), device=device)
        with autocast:  # transformers shifts the labels itself
            loss = model(input_ids=x[:, :-1], labels=x[:, :-1]).loss if hf else model(x[:, :-1], x[:, 1:])[1]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    sync(device)


def sync(device):
    if device.startswith('cuda'):
        torch.cuda.synchronize()


def timed(fns, steps, warmup, rounds):
    """Median seconds of each function (called with `steps`) over alternating rounds, after a warm-up call each."""
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


@torch.no_grad()
def measure_context(model_type, args, length, gen_tokens, chunk_size, device, queue):
    """In a fresh process: prefill a random prompt of `length` tokens in chunks through the
    model's cache, then decode gen_tokens greedily; the two times and the process's peak memory."""
    model = build(model_type, args, device).eval()
    idx = torch.randint(0, args['vocab_size'], (1, length), device=device)
    cache = model.new_cache()
    t0 = time.perf_counter()
    for s in range(0, length, chunk_size):
        x = model.hidden(idx[:, s:s + chunk_size], cache)
    sync(device)
    t1 = time.perf_counter()
    for _ in range(gen_tokens):
        x = model.hidden(model.lm_head(x[:, -1]).argmax(-1, keepdim=True), cache)
    sync(device)
    t2 = time.perf_counter()
    peak = torch.cuda.max_memory_allocated() if device.startswith('cuda') else \
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux
    queue.put({'prefill_s': t1 - t0, 'ms_per_token': 1000 * (t2 - t1) / gen_tokens, 'peak_mb': peak / 2 ** 20})


if __name__ == '__main__':
    from configurator import configure
    # -------------------------------------------------------------------------
    mode = 'train'  # 'train' (the regularizers), 'hf_mamba' (mamba.py vs transformers), 'context' (memory vs length)
    model_type = 'transformer'  # or 'mamba2'
    for _f in (f for _, cfg in checkpoint.MODELS.values() for f in fields(cfg)):
        globals().setdefault(_f.name, _f.default)
        __annotations__.setdefault(_f.name, _f.type)
    vocab_size = 320  # the byte tokenizer's 257, rounded up
    n_layer, n_head, n_embd = 4, 4, 128
    d_state, headdim, chunk_size = 64, 32, 64
    batch_size = 16
    block_size = 256
    bench_dropout = 0.1  # train: p of every variant that has dropout (a config's own dropout is ignored)
    variants = ['none', 'pre_norm', 'pre_linear', 'vpad', 'attn_dropout']  # train: dropout_type, or 'attn_dropout'
    gen_prompt, gen_tokens = 1024, 64  # hf_mamba: a prompt of gen_prompt tokens, then gen_tokens; context: gen_tokens
    context_lengths = [4096, 16384, 65536]  # context: prompt lengths
    context_window = 256  # context: the window of the sliding-window variant
    prefill_chunk = 1024  # context: chunked prefill
    steps = 10  # timed steps per variant and round
    warmup = 3  # untimed steps per variant before the first round
    rounds = 3
    device = 'cpu'
    dtype = 'float32'  # or 'bfloat16' (autocast)
    compile = False
    # -------------------------------------------------------------------------
    globals().update(configure(globals(), sys.argv[1:], lenient_files=True))
    autocast = torch.autocast(device.split(':')[0], dtype=torch.bfloat16) if dtype == 'bfloat16' else nullcontext()
    model_args = {t: {f.name: globals()[f.name] for f in fields(cfg)} for t, (_, cfg) in checkpoint.MODELS.items()}
    tokens = steps * batch_size * block_size
    header = f"{model_type}, {n_layer} layers x {n_embd}, batch {batch_size} x {block_size}, {device} {dtype}" \
             f"{', compiled' if compile else ''}; {rounds} alternating rounds of {steps} steps, median"

    def run(model, opt, hf=False):
        return lambda n: train_steps(model, opt, n, batch_size, block_size, vocab_size, device, autocast, hf)

    if mode == 'train':
        runs = {}
        for v in variants:
            if v == 'attn_dropout' and model_type == 'mamba2':
                continue
            reg = dict(dropout_type='none', attn_dropout=bench_dropout) if v == 'attn_dropout' else dict(dropout_type=v)
            model = build(model_type, {**model_args[model_type], 'attn_dropout': 0.0, 'dropout': bench_dropout, **reg}
                          if model_type == 'transformer' else {**model_args[model_type], 'dropout': bench_dropout, **reg}, device)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.startswith('cuda'))
            runs[v] = run(torch.compile(model) if compile else model, opt)
        secs = timed(runs, steps, warmup, rounds)
        table(f"{header}; dropout p = {bench_dropout}", {v: tokens / s for v, s in secs.items()}, 'tokens/s')

    elif mode == 'hf_mamba':
        from mamba import to_transformers
        assert model_type == 'mamba2', "hf_mamba compares Mamba2 models: set --model_type=mamba2"
        ours = build(model_type, model_args[model_type], device)
        theirs = to_transformers(ours)
        secs = timed({'mamba.py': run(ours, torch.optim.AdamW(ours.parameters(), lr=1e-4)),
                      'transformers': run(theirs, torch.optim.AdamW(theirs.parameters(), lr=1e-4), hf=True)},
                     steps, warmup, rounds)
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
            sync(device)
        secs = timed({'mamba.py': lambda n: generate(ours, n), 'transformers': lambda n: generate(theirs, n)}, 1, 1, rounds)
        table(f"generation: a prompt of {gen_prompt} tokens, then {gen_tokens} greedy tokens",
              {k: gen_tokens / s for k, s in secs.items()}, 'tokens/s')

    elif mode == 'context':
        variants = {f'{model_type}': (model_type, model_args[model_type])}
        if model_type == 'transformer':
            variants[f'window {context_window}'] = ('transformer', {**model_args['transformer'], 'window': context_window})
        variants['mamba2'] = ('mamba2', model_args['mamba2'])
        spawn = multiprocessing.get_context('spawn')
        print(f"{n_layer} layers x {n_embd}, {device} {dtype}: a random prompt, prefilled in chunks of {prefill_chunk}, "
              f"then {gen_tokens} greedy tokens; each in a fresh process")
        print(f"{'model':>16} {'length':>8} {'prefill s':>10} {'ms/token':>10} {'peak MB':>10}")
        for name, (kind, args) in variants.items():
            for L in context_lengths:
                queue = spawn.Queue()
                p = spawn.Process(target=measure_context, args=(kind, args, L, gen_tokens, prefill_chunk, device, queue))
                p.start()
                r = queue.get()
                p.join()
                print(f"{name:>16} {L:>8} {r['prefill_s']:>10.2f} {r['ms_per_token']:>10.1f} {r['peak_mb']:>10.0f}", flush=True)
    else:
        raise SystemExit(f"mode must be 'train', 'hf_mamba' or 'context', got {mode!r}")
