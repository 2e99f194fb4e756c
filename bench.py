"""
Speed and memory, side by side. Training variants are timed in alternating rounds in one
process, so that a machine's drift (~30% on shared CPUs) hits them alike; the report gives ratios.

    python bench.py configs/quickstart.py                     # the regularizers: tokens/s vs none
    python bench.py configs/quickstart.py --mode=nanogpt      # the model vs a plain nanoGPT of the same size
    python bench.py --model_type=mamba2 --mode=hf_mamba       # mamba.py vs transformers' Mamba2
    python bench.py configs/quickstart.py --mode=context      # prefill/decoding time and peak memory vs length
    bash scripts/bench_gpu.sh                                         # the whole suite on one GPU, paper-size models

A training config can be given: its model keys are used, its training-only keys ignored. On
CUDA the train modes also report MFU (FLOPs from the model's flops_per_token, the peak from
hardware.PEAK_FLOPS), peak memory per variant and, compiled, the kernels Inductor generated for
each variant (a dropout that fuses into the surrounding kernels adds none).
"""

import multiprocessing
import queue as queues
import resource
import sys
import time
import traceback
import warnings
from contextlib import nullcontext
from dataclasses import fields

import torch
import torch.nn as nn
import torch.nn.functional as F

import checkpoint
from hardware import peak_flops


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


def table(title, rows, unit, extra=None):
    """rows: name -> value, printed with its ratio to the first; extra: name -> {column: text}."""
    base = next(iter(rows.values()))
    extra = extra or {}
    columns = list(dict.fromkeys(c for v in extra.values() for c in v))
    print(title)
    print(f"{'':>22} {unit:>12} {'ratio':>8}" + ''.join(f"{c:>12}" for c in columns))
    for k, v in rows.items():
        print(f"{k:>22} {v:>12,.0f} {v / base:>8.2f}" + ''.join(f"{extra.get(k, {}).get(c, ''):>12}" for c in columns))


class NanoGPT(nn.Module):
    """nanoGPT's model (karpathy/nanoGPT), written out plainly: learned positions, LayerNorm with
    bias, one fused q/k/v projection, causal SDPA, a GELU MLP, the head tied to the embedding.
    The yardstick for what the project's options cost when they are off."""

    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd):
        super().__init__()
        C = n_embd
        self.n_head = n_head
        self.wte, self.wpe = nn.Embedding(vocab_size, C), nn.Embedding(block_size, C)
        self.blocks = nn.ModuleList(nn.ModuleDict(dict(
            ln_1=nn.LayerNorm(C), c_attn=nn.Linear(C, 3 * C), attn_proj=nn.Linear(C, C),
            ln_2=nn.LayerNorm(C), c_fc=nn.Linear(C, 4 * C), mlp_proj=nn.Linear(4 * C, C))) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(C)
        for m in self.modules():  # nanoGPT's initialisation
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))  # (B, T, C)
        for b in self.blocks:
            q, k, v = b['c_attn'](b['ln_1'](x)).view(B, T, 3, self.n_head, -1).permute(2, 0, 3, 1, 4)  # (B, H, T, hd) each
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, -1)
            x = x + b['attn_proj'](y)
            x = x + b['mlp_proj'](F.gelu(b['c_fc'](b['ln_2'](x))))
        logits = self.ln_f(x) @ self.wte.weight.T  # (B, T, V)
        return logits, F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    def flops_per_token(self, T):
        """As model.py counts: 6 per multiplying weight (all but the positions; wte is also the head),
        plus 12 * C * T per layer for the attention."""
        weights = sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()
        return 6 * weights + 12 * len(self.blocks) * self.wpe.embedding_dim * T


def measure_context(model_type, args, length, gen_tokens, chunk_size, device, dtype, queue):
    """In a fresh process: prefill a random prompt of `length` tokens in chunks through the
    model's cache, then decode gen_tokens greedily; the two times and the process's peak memory
    (or the error, if it fails)."""
    try:
        queue.put(context_times(model_type, args, length, gen_tokens, chunk_size, device, dtype))
    except BaseException:  # e.g. out of memory: the parent reports it and stops
        queue.put({'error': traceback.format_exc()})


def child_result(p, queue):
    """The result of child process p: it never blocks on a child that died without one (killed
    for memory, a crash), and a child's error becomes SystemExit with its traceback."""
    while True:
        try:
            r = queue.get(timeout=1)
            break
        except queues.Empty:
            if not p.is_alive():
                raise SystemExit(f"the measuring process died (exit code {p.exitcode}) before it reported")
    p.join()
    if 'error' in r:
        raise SystemExit(f"the measuring process failed:\n{r['error']}")
    return r


@torch.no_grad()  # with gradients on, a 64K prefill would keep every activation for a backward that never comes
def context_times(model_type, args, length, gen_tokens, chunk_size, device, dtype):
    """Prefill time, decoding time per token, the peak memory and, on CUDA, the host syncs per
    decoded token (a sync per layer would stall every token: gpu_check.py bounds them)."""
    model = build(model_type, args, device).to(getattr(torch, dtype)).eval()
    idx = torch.randint(0, args['vocab_size'], (1, length), device=device)
    cache = model.new_cache()
    t0 = time.perf_counter()
    for s in range(0, length, chunk_size):
        x = model.hidden(idx[:, s:s + chunk_size], cache)
    sync(device)
    t1 = time.perf_counter()
    cuda = device.startswith('cuda')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        if cuda:
            torch.cuda.set_sync_debug_mode('warn')  # each synchronizing call warns
        try:
            for _ in range(gen_tokens):
                x = model.hidden(model.lm_head(x[:, -1]).argmax(-1, keepdim=True), cache)
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode('default')
    sync(device)
    t2 = time.perf_counter()
    syncs = sum('synchroniz' in str(w.message) for w in caught) / gen_tokens if cuda else None
    peak = torch.cuda.max_memory_allocated() if cuda else \
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux
    return {'prefill_s': t1 - t0, 'ms_per_token': 1000 * (t2 - t1) / gen_tokens, 'peak_mb': peak / 2 ** 20,
            'syncs_per_token': syncs}


if __name__ == '__main__':
    from configurator import configure
    # -------------------------------------------------------------------------
    mode = 'train'  # 'train' (the regularizers), 'nanogpt' (vs nanoGPT), 'hf_mamba' (vs transformers' Mamba2), 'context'
    model_type = 'transformer'  # or 'mamba2'
    for _f in (f for _, cfg in checkpoint.MODELS.values() for f in fields(cfg)):
        globals().setdefault(_f.name, _f.default)
        globals().setdefault('__annotations__', {}).setdefault(_f.name, _f.type)  # (no annotations of its own)
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

    def measure(models, title):
        """Time the models' training steps side by side and print tokens/s, and on CUDA MFU, the memory
        a step adds (activations, gradients, temporaries) and, compiled, Inductor's kernels per model."""
        runs, extra, (_, peak) = {}, {}, peak_flops(device)
        for name, model in models.items():
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.startswith('cuda'))
            runs[name] = run(torch.compile(model) if compile else model, opt)
            kernels = kernel_count()
            runs[name](warmup)  # compiles here
            extra[name] = {'kernels': str(kernel_count() - kernels)} if compile and kernels is not None else {}
            if device.startswith('cuda'):
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
                runs[name](1)
                extra[name]['step MB'] = f"{(torch.cuda.max_memory_allocated() - before) / 2 ** 20:,.0f}"
        secs = timed(runs, steps, 0, rounds)
        for name, model in models.items():
            if peak:
                extra[name]['MFU'] = f"{100 * model.flops_per_token(block_size) * tokens / secs[name] / peak:.1f}%"
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
            reg = dict(dropout_type='none', attn_dropout=bench_dropout) if v == 'attn_dropout' else dict(dropout_type=v)
            args = {**model_args[model_type], 'dropout': bench_dropout, **reg}
            if model_type == 'transformer':
                args.setdefault('attn_dropout', 0.0)
            models[v] = build(model_type, args, device)
        measure(models, f"{header}; dropout p = {bench_dropout}")

    elif mode == 'nanogpt':
        # the same size three ways: nanoGPT itself, our model configured as nanoGPT, our model as the config has it
        plain = dict(pos_encoding='learned', norm='layernorm', mlp='gelu', bias=True, tie_embeddings=True, n_kv_head=None,
                     window=0, dropout_type='none', attn_dropout=0.0, attn_alpha=1.0, attn_scale='none')
        ours = {**model_args['transformer'], 'dropout_type': 'none', 'attn_dropout': 0.0}
        torch.manual_seed(1337)
        models = {'nanoGPT': NanoGPT(vocab_size, block_size, n_layer, n_head, n_embd).to(device),
                  'model.py as nanoGPT': build('transformer', {**ours, **plain}, device),
                  f"model.py, {pos_encoding}": build('transformer', ours, device)}
        measure(models, f"{header}; no dropout")

    elif mode == 'hf_mamba':
        from checkpoint import to_transformers
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
                p = spawn.Process(target=measure_context, args=(kind, args, L, gen_tokens, prefill_chunk, device, dtype, queue))
                p.start()
                r = child_result(p, queue)
                print(f"{name:>16} {L:>8} {r['prefill_s']:>10.2f} {r['ms_per_token']:>10.1f} {r['peak_mb']:>10.0f}", flush=True)
    else:
        raise SystemExit(f"mode must be 'train', 'nanogpt', 'hf_mamba' or 'context', got {mode!r}")
