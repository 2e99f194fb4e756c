"""
The timing and memory measures behind tools/bench.py and tools/gpu_check.py: models built and
trained for a few steps, variants timed in alternating rounds, prefill and decoding times with peak
memory at a context length (in a child process, so that one length's memory does not count against
the next), and nanoGPT's model for the side-by-side comparison.
"""

import queue as queues
import resource
import time
import traceback
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

import checkpoint


def build(model_type, args, device, seed=1337):
    torch.manual_seed(seed)
    return checkpoint.build_model(model_type, args).to(device)


def train_steps(model, opt, n, batch_size, block_size, vocab_size, device, autocast, hf=False):
    for _ in range(n):
        x = torch.randint(0, vocab_size, (batch_size, block_size + 1), device=device)
        with autocast:  # transformers shifts the labels itself
            loss = (model(input_ids=x[:, :-1], labels=x[:, :-1]).loss if hf else
                    model(x[:, :-1], x[:, 1:])[1])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    sync(device)


def sync(device):
    if device.startswith('cuda'):
        torch.cuda.synchronize()


def timed(fns, steps, warmup, rounds):
    """Median seconds of each function (called with `steps`) over alternating rounds, after a
    warm-up call each."""
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
        print(f"{k:>22} {v:>12,.0f} {v / base:>8.2f}"
              + ''.join(f"{extra.get(k, {}).get(c, ''):>12}" for c in columns))


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
            ln_2=nn.LayerNorm(C), c_fc=nn.Linear(C, 4 * C), mlp_proj=nn.Linear(4 * C, C)))
            for _ in range(n_layer))
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
            qkv = b['c_attn'](b['ln_1'](x)).view(B, T, 3, self.n_head, -1)
            q, k, v = qkv.permute(2, 0, 3, 1, 4)  # (B, H, T, hd) each
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, hd)
            y = y.transpose(1, 2).reshape(B, T, -1)
            x = x + b['attn_proj'](y)
            x = x + b['mlp_proj'](F.gelu(b['c_fc'](b['ln_2'](x))))
        logits = self.ln_f(x) @ self.wte.weight.T  # (B, T, V)
        return logits, F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    def flops_per_token(self, T):
        """As model.py counts: 6 per multiplying weight (all but the positions; wte is also the
        head), plus 12 * C * T per layer for the attention."""
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
                raise SystemExit(f"the measuring process died (exit code {p.exitcode}) before it "
                                 f"reported")
    p.join()
    if 'error' in r:
        raise SystemExit(f"the measuring process failed:\n{r['error']}")
    return r


# with gradients on, a 64K prefill would keep every activation for a backward that never comes
@torch.no_grad()
def context_times(model_type, args, length, gen_tokens, chunk_size, device, dtype):
    """A chunked prefill of `length` random tokens and gen_tokens decoded greedily, twice: first
    as an evaluation starts (the compiled flex and block masks compile on their first shapes),
    then in steady state (a second prefill into a fresh cache; the decoded tokens after as many
    again). -> the times of both, the peak memory, on CUDA the host syncs per decoded token (a sync
    per layer would stall every token: tools/gpu_check.py bounds them), and the bytes of keys and
    values each decoded token reads and the FLOPs of the prefill (the hardware's bounds; a
    transformer's only)."""
    model = build(model_type, args, device).to(getattr(torch, dtype)).eval()
    idx = torch.randint(0, args['vocab_size'], (1, length), device=device)
    cuda = device.startswith('cuda')
    r = {}
    for run in ('first', 'steady'):
        cache = model.new_cache(length + 2 * gen_tokens)  # the prefill, and both decodings
        t0 = time.perf_counter()
        for s in range(0, length, chunk_size):
            x = model.hidden(idx[:, s:s + chunk_size], cache)
        sync(device)
        t1 = time.perf_counter()
        if run == 'steady':  # the first decoded shapes compile here, outside the timing
            for _ in range(gen_tokens):
                x = model.hidden(model.lm_head(x[:, -1]).argmax(-1, keepdim=True), cache)
            sync(device)
            t1 = time.perf_counter()
        # the positions held (a full layer's buffer has room for the decoded tokens too)
        kv = ([t[:, :, :cache.pos] for t in (*cache.k.values(), *cache.v.values())]
              if model_type == 'transformer' else ())
        kv_bytes = sum(t.numel() * t.element_size() for t in kv)  # Mamba2's state: not counted
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
        r[run] = {'prefill_s': t1 - t0, 'ms_per_token': 1000 * (t2 - t1) / gen_tokens}
    syncs = sum('synchroniz' in str(w.message) for w in caught) / gen_tokens if cuda else None
    peak = torch.cuda.max_memory_allocated() if cuda else \
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux
    return {**{f'{k}_{run}': v for run, d in r.items() for k, v in d.items()},
            'peak_mb': peak / 2 ** 20, 'syncs_per_token': syncs, 'kv_bytes': kv_bytes,
            'prefill_flops': prefill_flops(model, length) if kv else None}


def prefill_flops(model, length):
    """The FLOPs of a forward over `length` tokens without the head (Transformer.hidden): 2 per
    weight that multiplies, and per layer 4 H hd for each key a query sees (its window's, or all
    before it, itself included)."""
    c = model.config
    attn = sum(4 * c.n_head * model.head_dim
               * sum(min(t + 1, w) if w else t + 1 for t in range(length))
               for w in c.layer_windows())
    return 2 * model.num_params() * length + attn


def bandwidth(device, n_bytes=2 ** 30):
    """Bytes per second a copy of n_bytes on the device moves (read and write), the best of 5."""
    x = torch.empty(n_bytes, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    best = float('inf')
    for _ in range(5):
        sync(device)
        t0 = time.perf_counter()
        y.copy_(x)
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n_bytes / best
