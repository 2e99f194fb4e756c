"""
Speed and memory, side by side. Training variants are timed in alternating rounds in one
process, so that a machine's drift (~30% on shared CPUs) hits them alike; the report gives ratios.

    # the regularizers: tokens/s vs none
    python -m tools.bench configs/quickstart.py
    # the model vs a plain nanoGPT of the same size
    python -m tools.bench configs/quickstart.py --mode=nanogpt
    # the length-generalization methods vs RoPE (docs/methods.md)
    python -m tools.bench configs/quickstart.py --mode=methods
    # mamba.py vs transformers' Mamba2
    python -m tools.bench --model_type=mamba2 --mode=hf_mamba
    # prefill/decoding time and peak memory vs length
    python -m tools.bench configs/quickstart.py --mode=context
    # one decoded token's KV-cache update vs the cache's length, against a concatenation
    python -m tools.bench configs/quickstart.py --mode=cache
    # the whole suite on one GPU, paper-size models
    bash scripts/bench_gpu.sh

A training config can be given: its model keys are used, its training-only keys ignored. On
CUDA the train modes also report MFU (FLOPs from the model's flops_per_token, the peak from
hardware.PEAK_FLOPS), peak memory per variant and, compiled, the kernels Inductor generated for
each variant (a dropout that fuses into the surrounding kernels adds none).
"""

import multiprocessing
import sys
from contextlib import nullcontext
from dataclasses import fields

import torch

import checkpoint
from configurator import configure
from dropout import DROPOUT_TYPES
from hardware import peak_flops
from tools.timing import (NanoGPT, build, child_result, measure_context, sync, table, timed,
                          train_steps)

# spawned measuring processes import this file again: only the parent runs it
if __name__ == '__main__':
    # -------------------------------------------------------------------------
    # 'train' (the regularizers), 'nanogpt', 'methods' (docs/methods.md), 'hf_mamba', 'context',
    # 'cache'
    mode = 'train'
    model_type = 'transformer'  # or 'mamba2'
    MODELS = {t: checkpoint.model_class(t) for t in checkpoint.MODEL_TYPES}
    for _f in (f for _, cfg in MODELS.values() for f in fields(cfg)):
        globals().setdefault(_f.name, _f.default)
        # (no annotations of its own)
        globals().setdefault('__annotations__', {}).setdefault(_f.name, _f.type)
    vocab_size = 320  # the byte tokenizer's 257, rounded up
    n_layer, n_head, n_embd = 4, 4, 128
    d_state, headdim, chunk_size = 64, 32, 64
    batch_size = 16
    block_size = 256
    # train: p of every variant that has dropout (a config's own dropout is ignored)
    bench_dropout = 0.1
    # train: dropout_type, or 'attn_dropout'
    variants = [*DROPOUT_TYPES, 'attn_dropout']  # every type of dropout.py
    # hf_mamba: a prompt of gen_prompt tokens, then gen_tokens; context: gen_tokens
    gen_prompt, gen_tokens = 1024, 64
    context_lengths = [4096, 16384, 65536]  # context, cache: prompt lengths
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
    autocast = (torch.autocast(device.split(':')[0], dtype=torch.bfloat16) if dtype == 'bfloat16'
                else nullcontext())
    model_args = {t: {f.name: globals()[f.name] for f in fields(cfg)}
                  for t, (_, cfg) in MODELS.items()}
    tokens = steps * batch_size * block_size
    header = f"{model_type}, {n_layer} layers x {n_embd}, batch {batch_size} x {block_size}, " \
             f"{device} {dtype}{', compiled' if compile else ''}; " \
             f"{rounds} alternating rounds of {steps} steps, median"

    def run(model, opt, hf=False):
        return lambda n: train_steps(model, opt, n, batch_size, block_size, vocab_size, device,
                                     autocast, hf)

    def measure(models, title):
        """Time the models' training steps side by side and print tokens/s, and on CUDA MFU, the
        memory a step adds (activations, gradients, temporaries) and, compiled, Inductor's kernels
        per model."""
        runs, extra, (_, peak) = {}, {}, peak_flops(device)
        for name, model in models.items():
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.startswith('cuda'))
            runs[name] = run(torch.compile(model) if compile else model, opt)
            kernels = kernel_count()
            runs[name](warmup)  # compiles here
            extra[name] = ({'kernels': str(kernel_count() - kernels)}
                           if compile and kernels is not None else {})
            if device.startswith('cuda'):
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
                runs[name](1)
                extra[name]['step MB'] = \
                    f"{(torch.cuda.max_memory_allocated() - before) / 2 ** 20:,.0f}"
        secs = timed(runs, steps, 0, rounds)
        for name, model in models.items():
            if peak:
                extra[name]['MFU'] = \
                    f"{100 * model.flops_per_token(block_size) * tokens / secs[name] / peak:.1f}%"
        table(title, {k: tokens / s for k, s in secs.items()}, 'tokens/s', extra)

    def kernel_count():
        try:
            from torch._inductor import metrics
            return metrics.generated_kernel_count
        except ImportError:
            return None

    if mode == 'train':
        models = {}
        for v in variants:
            if v == 'attn_dropout' and model_type == 'mamba2':
                continue
            reg = (dict(dropout_type='none', attn_dropout=bench_dropout) if v == 'attn_dropout'
                   else dict(dropout_type=v))
            args = {**model_args[model_type], 'dropout': bench_dropout, **reg}
            if model_type == 'transformer':
                args.setdefault('attn_dropout', 0.0)
            models[v] = build(model_type, args, device)
        measure(models, f"{header}; dropout p = {bench_dropout}")

    elif mode == 'nanogpt':
        # the same size three ways: nanoGPT itself, our model configured as nanoGPT, our model as
        # the config has it
        plain = dict(pos_encoding='learned', norm='layernorm', mlp='gelu', bias=True,
                     tie_embeddings=True, n_kv_head=None, window=0, dropout_type='none',
                     attn_dropout=0.0, attn_alpha=1.0, attn_scale='none')
        ours = {**model_args['transformer'], 'dropout_type': 'none', 'attn_dropout': 0.0}
        torch.manual_seed(1337)
        models = {'nanoGPT': NanoGPT(vocab_size, block_size, n_layer, n_head, n_embd).to(device),
                  'model.py as nanoGPT': build('transformer', {**ours, **plain}, device),
                  f"model.py, {pos_encoding}": build('transformer', ours, device)}
        measure(models, f"{header}; no dropout")

    elif mode == 'methods':
        # what each method of docs/methods.md costs in training, beside PL-D, on RoPE. YaRN and the
        # log-length temperature train nothing (they change evaluation); DroPE's CPT trains a NoPE
        # model
        rope = {**model_args['transformer'], 'pos_encoding': 'rope', 'dropout_type': 'none',
                'dropout': bench_dropout, 'attn_dropout': 0.0, 'rope_random': 0,
                'attn_scale': 'none'}
        methods = {'RoPE': {}, 'PL-D': dict(dropout_type='pre_linear'),
                   'RandPos': dict(rope_random=8), 'SSMax': dict(attn_scale='ssmax'),
                   "NoPE (DroPE's CPT)": dict(pos_encoding='nope')}
        measure({k: build('transformer', {**rope, **v}, device) for k, v in methods.items()},
                f"{header}; PL-D p = {bench_dropout}, RandPos from 8x")

    elif mode == 'hf_mamba':
        from weights import to_transformers
        assert model_type == 'mamba2', "hf_mamba compares Mamba2 models: set --model_type=mamba2"
        ours = build(model_type, model_args[model_type], device)
        theirs = to_transformers(ours)
        secs = timed({'mamba.py': run(ours, torch.optim.AdamW(ours.parameters(), lr=1e-4)),
                      'transformers': run(theirs, torch.optim.AdamW(theirs.parameters(), lr=1e-4),
                                          hf=True)},
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
                        model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                       max_new_tokens=gen_tokens, min_new_tokens=gen_tokens,
                                       do_sample=False, pad_token_id=0)
            sync(device)
        secs = timed({'mamba.py': lambda n: generate(ours, n),
                      'transformers': lambda n: generate(theirs, n)}, 1, 1, rounds)
        table(f"generation: a prompt of {gen_prompt} tokens, then {gen_tokens} greedy tokens",
              {k: gen_tokens / s for k, s in secs.items()}, 'tokens/s')

    elif mode == 'context':
        variants = {f'{model_type}': (model_type, model_args[model_type])}
        if model_type == 'transformer':
            variants[f'window {context_window}'] = (
                'transformer', {**model_args['transformer'], 'window': context_window})
        variants['mamba2'] = ('mamba2', model_args['mamba2'])
        spawn = multiprocessing.get_context('spawn')
        print(f"{n_layer} layers x {n_embd}, {device} {dtype}: a random prompt, prefilled in "
              f"chunks of {prefill_chunk}, then {gen_tokens} greedy tokens; "
              f"each in a fresh process")
        print("steady state; in brackets the first run, the compile included")
        print(f"{'model':>16} {'length':>8} {'prefill s':>18} {'ms/token':>18} {'peak MB':>10}")
        for name, (kind, args) in variants.items():
            for L in context_lengths:
                queue = spawn.Queue()
                p = spawn.Process(
                    target=measure_context,
                    args=(kind, args, L, gen_tokens, prefill_chunk, device, dtype, queue))
                p.start()
                r = child_result(p, queue)
                prefill = f"{r['prefill_s_steady']:.2f} ({r['prefill_s_first']:.2f})"
                decode = f"{r['ms_per_token_steady']:.1f} ({r['ms_per_token_first']:.1f})"
                print(f"{name:>16} {L:>8} {prefill:>18} {decode:>18} {r['peak_mb']:>10.0f}",
                      flush=True)
    elif mode == 'cache':  # model.KVCache.update alone, one token into a full layer
        from model import KVCache
        hd, hkv = n_embd // n_head, n_kv_head or n_head
        print(f"one decoded token's keys and values (1 x {hkv} heads x {hd}) added to a full "
              f"layer holding L positions, {device}: model.KVCache.update (in place) against the "
              f"torch.cat it replaced; {rounds} alternating rounds of {steps * 10} updates, median")
        print(f"{'length':>8} {'update us':>10} {'cat us':>10}")
        for L in context_lengths:
            k = torch.randn(1, hkv, L, hd, device=device)
            new = torch.randn(1, hkv, 1, hd, device=device)
            cache = KVCache(L + steps * 10 * rounds + 1)
            cache.update(0, k, k, 0)
            cache.pos = L

            def update(n):
                for _ in range(n):
                    cache.update(0, new, new, 0)
                    cache.pos += 1

            def cat(n):
                for _ in range(n):
                    torch.cat([k, new], dim=2), torch.cat([k, new], dim=2)
            secs = timed({'update': update, 'cat': cat}, steps * 10, 1, rounds)
            print(f"{L:>8} {1e6 * secs['update'] / (steps * 10):>10.1f} "
                  f"{1e6 * secs['cat'] / (steps * 10):>10.1f}", flush=True)
    else:
        raise SystemExit(f"mode must be 'train', 'nanogpt', 'methods', 'hf_mamba', 'context' or "
                         f"'cache', got {mode!r}")
