"""
The transformer of the paper, in one file: a decoder-only, pre-norm language model with the
paper's regularizers inline where they act.

- Positional encodings per layer: nope, rope, alibi, nape (NoPE + ALiBi: the first H/2 heads
  carry an ALiBi bias with slopes 1/h, the others none; deep-spin/asentmax), and learned
  absolute positions (the classic baseline that does not extrapolate).
- Attention per layer: full causal or a sliding window of W keys (the current one included).
- Dropout (dropout.py): pre-norm dropout (PN-D, Eq. 6) in Block.forward; pre-linear dropout
  (PL-D) or VPAD, `self.pre_linear(...)`, on the input of every projection of a block (q, k, v, o
  in Attention.forward, gate/up/down in MLP.forward), a mask of its own each call; attention
  dropout on the attention probabilities (ops/attention.py).
- Long inputs: a KV cache (trimmed to the window on sliding-window layers) with chunked
  prefill, for per-position losses and greedy generation that never build T x T or T x vocab.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ops.attention import attention
from dropout import check as check_dropout, pre_linear, pre_norm


POS_ENCODINGS = ('nope', 'rope', 'alibi', 'nape', 'learned')


@dataclass
class TransformerConfig:
    vocab_size: int = 50304
    block_size: int = 2048  # training context length; only the learned positions depend on it
    n_layer: int = 12
    n_head: int = 12
    n_kv_head: int | None = None  # grouped-query attention; None = n_head
    n_embd: int = 768
    head_dim: int | None = None  # None = n_embd // n_head
    ffn_dim: int | None = None  # None = 4 * n_embd
    mlp: str = 'gelu'  # 'gelu' or 'swiglu'
    norm: str = 'rmsnorm'  # 'rmsnorm' or 'layernorm'
    norm_eps: float = 1e-5
    bias: bool = False  # biases in the linear layers (and the LayerNorms)
    tie_embeddings: bool = True
    # one of POS_ENCODINGS, or a list: one per layer, or a pattern that repeats
    pos_encoding: str | list = 'nape'
    # sliding window of W keys, the current one included (0: full); or a list, as above
    window: int | list = 0
    rope_theta: float = 10000.0
    # length-generalization methods for RoPE (docs/methods.md): randomized positions in training,
    # and position interpolation or YaRN at evaluation (no weights change: set them when loading a
    # checkpoint)
    # > 0: in training, each sequence's RoPE positions are a sorted random subset of
    # [0, rope_random * T)
    rope_random: int = 0
    rope_scaling: str = 'none'  # 'none', 'pi' (position interpolation) or 'yarn', with rope_factor
    # s: PI divides every frequency by s; YaRN only the low ones, and sharpens by (0.1 ln s + 1)^2
    rope_factor: float = 1.0
    nape_slopes: str = 'linear'  # NAPE's ALiBi slopes: 'linear' (1/h) or 'exp' (1/2^(h-1))
    dropout: float = 0.0  # p of the dropout at the dropout_type's sites
    dropout_type: str = 'none'  # 'none', 'pre_norm' (PN-D), 'pre_linear' (PL-D) or 'vpad'
    vpad_variant: str = 'A'  # VPAD reconstruction: A (per token, default), B, C, D (dropout.py)
    attn_dropout: float = 0.0  # dropout on the attention probabilities
    attn_alpha: float = 1.0  # the normaliser: 1 softmax, 1.5 entmax-1.5, other > 1 by bisection
    attn_scale: str = 'none'  # 'none', 'adaptive' (ASEntmax), ... (Attention.query_scale)
    # 'auto' (on CUDA: flex, attention_triton where they apply; else sdpa), 'sdpa', 'flex', 'manual'
    attn_backend: str = 'auto'

    def __post_init__(self):
        check_config(self)  # at the end of this file
        for name in ('pos_encoding', 'window'):  # per-layer lists; a shorter pattern repeats
            value = getattr(self, name)
            if isinstance(value, (list, tuple)):
                setattr(self, name, list(value) * (self.n_layer // len(value)))

    def layer_pos_encodings(self):
        p = self.pos_encoding
        return list(p) if isinstance(p, list) else [p] * self.n_layer

    def layer_windows(self):
        w = self.window
        return list(w) if isinstance(w, list) else [w] * self.n_layer


# -----------------------------------------------------------------------------
# positions

def alibi_slopes(n_head, pos_encoding, nape_slopes='linear'):
    """Per-head slope m_h of the bias -m_h * (i - j); 0 for heads without ALiBi. (n_head,)"""
    # first H/2 heads ALiBi, the rest NoPE (deep-spin/asentmax get_nape_slopes)
    if pos_encoding == 'nape':
        h = torch.arange(1, n_head // 2 + 1, dtype=torch.float32)
        s = 1.0 / h if nape_slopes == 'linear' else 2.0 ** -(h - 1)
        return torch.cat([s, torch.zeros(n_head - n_head // 2)])
    # plain ALiBi (Press et al. 2022): geometric slopes 2^(-8h/n); interleaved for non-powers of two
    def geometric(n):
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    n = 2 ** math.floor(math.log2(n_head))
    slopes = geometric(n) + geometric(2 * n)[0::2][:n_head - n]
    return torch.tensor(slopes)


def rope_frequencies(head_dim, theta, device, scaling='none', factor=1.0, train_length=2048):
    """The rotary frequencies theta^(-2d/head_dim), d < head_dim/2 (head_dim/2,), and the factor on
    cos and sin.
    pi    Position interpolation (Chen et al. 2023): every frequency divided by s, so that s times
          the training length spans the angles seen in training.
    yarn  YaRN (Peng et al. 2023, Eq. 17-21, as its code computes it): a frequency that turns more
          than beta = 32 times over the training length L is kept, one that turns less than
          alpha = 1 time is divided by s, and a linear ramp over the dimensions between the two
          (their indices rounded outwards); cos and sin are scaled by 0.1 ln s + 1, which scales
          every logit by its square (the paper's temperature, sqrt(1/t) = 0.1 ln s + 1)."""
    inv_freq = 1.0 / theta ** (
        torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim)
    if scaling == 'pi':
        return inv_freq / factor, 1.0
    if scaling == 'yarn' and factor > 1:
        # the dimension d at which a frequency turns r times over L: L * inv_freq_d = 2 pi r
        dim_of = lambda r: (head_dim * math.log(train_length / (2 * math.pi * r))  # noqa: E731
                            / (2 * math.log(theta)))
        low, high = max(math.floor(dim_of(32)), 0), min(math.ceil(dim_of(1)), head_dim - 1)
        ramp = ((torch.arange(head_dim // 2, device=device) - low)
                / max(high - low, 1e-3)).clamp(0, 1)  # 0: kept
        return inv_freq * (1 - ramp) + inv_freq / factor * ramp, 0.1 * math.log(factor) + 1.0
    return inv_freq, 1.0


def random_positions(B, T, N, device):
    """Randomized positional encodings (Ruoss et al. 2023): for each of B sequences, T positions
    drawn without replacement from [0, N), in increasing order. (B, T)"""
    return torch.rand(B, N, device=device).argsort(dim=1)[:, :T].sort(dim=1).values


def rope_cos_sin(pos, inv_freq, scale=1.0):
    """cos and sin of the rotary angles of positions pos (T,) or (B, T), in float32: (T, head_dim)
    or (B, 1, T, head_dim) each, to broadcast over the heads of (B, H, T, head_dim)."""
    freqs = pos.float()[..., None] * inv_freq  # (..., T, head_dim/2)
    # rotate-half convention (Llama, SmolLM3 in transformers)
    emb = torch.cat([freqs, freqs], dim=-1)
    if emb.dim() == 3:
        emb = emb[:, None]
    return emb.cos() * scale, emb.sin() * scale


def apply_rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat([-x2, x1], dim=-1) * sin.to(x.dtype)


class KVCache:
    """Keys and values of every layer for chunked prefill and decoding, written in place. A
    full-attention layer's go into a buffer of `length` positions (new_cache(length); without it,
    one that doubles when full), so that a decoded token copies only its own key and value: a
    concatenation would copy the whole cache at every token, O(T) per token at 64K. A
    sliding-window layer keeps its last W - 1 positions and joins them to the new ones at each
    step (an O(W) copy: bounded by the window, whatever the length)."""

    def __init__(self, length=0):
        self.pos = 0  # number of tokens processed so far
        self.length = length  # the full layers' buffers, in positions (0: grown as needed)
        self.k, self.v = {}, {}  # layer -> (B, Hkv, positions held or buffered, hd)

    def update(self, i, k, v, window):
        """Add k, v (B, Hkv, T, hd) to layer i; return all keys and values the new queries may
        see, and the absolute position of the first one."""
        if window:
            k_start = self.pos  # the new keys start here, after those kept before
            if i in self.k:
                k_start -= self.k[i].size(2)
                k, v = torch.cat([self.k[i], k], dim=2), torch.cat([self.v[i], v], dim=2)
            keep = min(window - 1, k.size(2))
            self.k[i], self.v[i] = k[:, :, k.size(2) - keep:], v[:, :, v.size(2) - keep:]
            return k, v, k_start
        end = self.pos + k.size(2)  # a full layer holds every position from 0
        if i not in self.k or end > self.k[i].size(2):  # a first buffer, or one twice as large
            size = max(end, self.length, 2 * self.k[i].size(2) if i in self.k else 0)
            for held, new in ((self.k, k), (self.v, v)):
                buf = new.new_empty(*new.shape[:2], size, new.size(3))  # (B, Hkv, size, hd)
                if i in held:
                    buf[:, :, :self.pos] = held[i][:, :, :self.pos]
                held[i] = buf
        self.k[i][:, :, self.pos:end] = k
        self.v[i][:, :, self.pos:end] = v
        return self.k[i][:, :, :end], self.v[i][:, :, :end], 0


# -----------------------------------------------------------------------------
# the network

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # normalise in float32, cast back, then scale (as Llama and SmolLM3 do)
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def Norm(config):
    if config.norm == 'rmsnorm':
        return RMSNorm(config.n_embd, config.norm_eps)
    return nn.LayerNorm(config.n_embd, eps=config.norm_eps, bias=config.bias)


class Attention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head = config.n_head
        self.n_kv_head = config.n_kv_head or config.n_head
        self.head_dim = config.head_dim or config.n_embd // config.n_head
        self.q_proj = nn.Linear(config.n_embd, self.n_head * self.head_dim, bias=config.bias)
        self.k_proj = nn.Linear(config.n_embd, self.n_kv_head * self.head_dim, bias=config.bias)
        self.v_proj = nn.Linear(config.n_embd, self.n_kv_head * self.head_dim, bias=config.bias)
        self.o_proj = nn.Linear(self.n_head * self.head_dim, config.n_embd, bias=config.bias)
        # the PL-D / VPAD site
        self.pre_linear = pre_linear(config.dropout_type, config.dropout, config.vpad_variant)
        self.pos_encoding = config.layer_pos_encodings()[layer_idx]
        self.window = config.layer_windows()[layer_idx]
        self.attn_dropout, self.alpha, self.backend = (config.attn_dropout, config.attn_alpha,
                                                       config.attn_backend)
        # a probe's hook on the attention probabilities (measures.attention_entropy)
        self.record = None
        slopes = (alibi_slopes(self.n_head, self.pos_encoding, config.nape_slopes)
                  if self.pos_encoding in ('alibi', 'nape') else None)
        self.register_buffer('slopes', slopes, persistent=False)
        # ASEntmax's query scale (deep-spin/asentmax): on the NoPE heads under NAPE (the last H/2),
        # else on all
        self.scale = config.attn_scale
        self.train_length = config.block_size  # log_length's L
        self.n_scaled = (self.n_head - self.n_head // 2 if self.pos_encoding == 'nape'
                         else self.n_head)
        if self.scale == 'adaptive':
            # beta and gamma of every scaled head, from the block's normalised input
            self.scale_proj = nn.Linear(config.n_embd, 2 * self.n_scaled, bias=True)
        elif self.scale == 'static':  # one beta and gamma per scaled head
            self.scale_beta = nn.Parameter(torch.empty(self.n_scaled).uniform_(0.1, 1.0))
            self.scale_gamma = nn.Parameter(torch.empty(self.n_scaled).normal_(0.0, 0.1))
        elif self.scale == 'ssmax':  # SSMax (Nakanishi 2025): beta * log(t + 2)
            self.scale_beta = nn.Parameter(torch.empty(self.n_scaled).normal_(1.0, 0.01))

    def forward(self, x, rope=None, cache=None):
        B, T, _ = x.shape
        # PL-D / VPAD (Fig. 2, right): on the input of each projection, a mask of its own each call
        q = self.q_proj(self.pre_linear(x)).view(
            B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        k = self.k_proj(self.pre_linear(x)).view(
            B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
        v = self.v_proj(self.pre_linear(x)).view(
            B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
        if self.pos_encoding == 'rope':
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        q_start = k_start = 0 if cache is None else cache.pos
        if self.scale != 'none':
            n = self.n_head - self.n_scaled
            q = torch.cat([q[:, :n], q[:, n:] * self.query_scale(x, q_start).to(q.dtype)], dim=1)
        if cache is not None:
            k, v, k_start = cache.update(self.layer_idx, k, v, self.window)
        dropout_p = self.attn_dropout if self.training else 0.0
        y = attention(q, k, v, q_start=q_start, k_start=k_start, slopes=self.slopes,
                      window=self.window, dropout_p=dropout_p, backend=self.backend,
                      alpha=self.alpha, record=self.record)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim)  # (B, T, H*hd)
        return self.o_proj(self.pre_linear(y))

    def query_scale(self, x, start):
        """The factor s of the scaled heads' queries at positions start.. (B or 1, n_scaled, T, 1):
        adaptive  s = 1 + softplus(w_b x_t + b_b) * log(t+2)^(2 tanh(w_g x_t + b_g))   (ASEntmax)
        static    s = 1 + beta_h * log(t+2)^gamma_h
        ssmax     s = beta_h * log(t+2)                                                    (SSMax)
        log_length  s = max(1, log(t+1) / log(L)), L the training length: 1 inside it, so that it
                  needs no training; beyond, the logits grow with the log of the keys seen (Chiang
                  and Cholak 2022)"""
        t = torch.arange(start, start + x.size(1), device=x.device,
                         dtype=torch.float32)[:, None]  # (T, 1)
        if self.scale == 'log_length':
            # (1, 1, T, 1)
            return (torch.log(t + 1) / math.log(self.train_length)).clamp(min=1)[None, None]
        log_t = torch.log(t + 2)
        if self.scale == 'adaptive':
            beta, gamma = self.scale_proj(x).float().chunk(2, dim=-1)  # (B, T, n_scaled) each
            s = 1 + F.softplus(beta) * log_t ** (2 * torch.tanh(gamma))
        elif self.scale == 'static':
            s = (1 + self.scale_beta * log_t ** self.scale_gamma)[None]
        else:
            s = (self.scale_beta * log_t)[None]
        return s.transpose(1, 2)[..., None]


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        ffn_dim = config.ffn_dim or 4 * config.n_embd
        self.swiglu = config.mlp == 'swiglu'
        if self.swiglu:
            self.gate_proj = nn.Linear(config.n_embd, ffn_dim, bias=config.bias)
        self.up_proj = nn.Linear(config.n_embd, ffn_dim, bias=config.bias)
        self.down_proj = nn.Linear(ffn_dim, config.n_embd, bias=config.bias)
        # the PL-D / VPAD site
        self.pre_linear = pre_linear(config.dropout_type, config.dropout, config.vpad_variant)

    def forward(self, x):
        # PL-D / VPAD on the input of each projection, a mask of its own each call
        if self.swiglu:
            h = F.silu(self.gate_proj(self.pre_linear(x))) * self.up_proj(self.pre_linear(x))
        else:
            h = F.gelu(self.up_proj(self.pre_linear(x)))
        return self.down_proj(self.pre_linear(h))


class Block(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.norm1 = Norm(config)
        self.attn = Attention(config, layer_idx)
        self.norm2 = Norm(config)
        self.mlp = MLP(config)
        self.pre_norm = pre_norm(config.dropout_type, config.dropout)  # the PN-D site

    def forward(self, x, rope=None, cache=None):
        # PN-D (Eq. 6): r_{l+1} = r_l + Dropout(u_l). The dropped sublayer output joins the
        # residual stream and so reaches the next norm: a bias at test time, not only noise.
        x = x + self.pre_norm(self.attn(self.norm1(x), rope, cache))
        x = x + self.pre_norm(self.mlp(self.norm2(x)))
        return x


class Transformer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = (nn.Embedding(config.block_size, config.n_embd)
                    if config.pos_encoding == 'learned' else None)
        self.layers = nn.ModuleList([Block(config, i) for i in range(config.n_layer)])
        self.norm_f = Norm(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.head_dim = config.head_dim or config.n_embd // config.n_head
        self.uses_rope = 'rope' in config.layer_pos_encodings()
        # init as GPT-2: N(0, 0.02), the projections into the residual stream scaled by 1/sqrt(2L)
        for name, p in self.named_parameters():
            if name.endswith('bias'):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                std = (0.02 / math.sqrt(2 * config.n_layer)
                       if name.endswith(('o_proj.weight', 'down_proj.weight')) else 0.02)
                nn.init.normal_(p, mean=0.0, std=std)

    def num_params(self, non_embedding=True):
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.wte.weight.numel() + (self.wpe.weight.numel() if self.wpe is not None else 0)
            if not self.config.tie_embeddings:
                n -= self.lm_head.weight.numel()
        return n

    def new_cache(self, length=0):
        """A KV cache for `length` positions (0: grown as needed)."""
        return KVCache(length)

    def hidden(self, idx, cache=None):
        """Final-norm hidden states of idx (B, T), continuing the sequence held in cache
        (new_cache(), updated in place). (B, T, C)"""
        T = idx.size(1)
        start = 0 if cache is None else cache.pos
        x = self.wte(idx)  # (B, T, C)
        if self.wpe is not None:
            if start + T > self.config.block_size:
                raise ValueError(f"learned absolute positions cover block_size = "
                                 f"{self.config.block_size} tokens; this input reaches {start + T}")
            x = x + self.wpe(torch.arange(start, start + T, device=idx.device))
        rope = self.rope(idx, start) if self.uses_rope else None
        for block in self.layers:
            x = block(x, rope, cache)
        if cache is not None:
            cache.pos += T
        return self.norm_f(x)

    def rope(self, idx, start):
        """cos and sin of the RoPE layers for the positions of idx (B, T) from start:
        rope_cos_sin."""
        c, (B, T) = self.config, idx.shape
        inv_freq, scale = rope_frequencies(self.head_dim, c.rope_theta, idx.device, c.rope_scaling,
                                           c.rope_factor, c.block_size)
        pos = torch.arange(start, start + T, device=idx.device)  # (T,)
        if self.training and c.rope_random:  # randomized positions, in training only
            pos = random_positions(B, T, c.rope_random * T, idx.device)  # (B, T)
        return rope_cos_sin(pos, inv_freq, scale)

    def forward(self, idx, targets=None):
        x = self.hidden(idx)
        if targets is None:  # inference: only the last position goes through the head
            return self.lm_head(x[:, [-1], :]), None
        logits = self.lm_head(x)  # (B, T, V)
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1),
                               ignore_index=-1)
        return logits, loss

    @torch.no_grad()
    def position_losses(self, idx, targets, chunk_size=1024):
        """Cross-entropy at every position of a long input (B, T) -> (B, T), computed chunk by
        chunk through the KV cache: never T x T scores nor T x vocab logits at once."""
        cache, out = self.new_cache(idx.size(1)), []
        for s in range(0, idx.size(1), chunk_size):
            # (B, chunk, V)
            logits = self.lm_head(self.hidden(idx[:, s:s + chunk_size], cache)).float()
            out.append(F.cross_entropy(logits.transpose(1, 2), targets[:, s:s + chunk_size],
                                       reduction='none', ignore_index=-1))
        return torch.cat(out, dim=1)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, eos_id=None, chunk_size=1024):
        """Greedy decoding: chunked prefill of the prompt idx (B, T) into a KV cache, then one
        token at a time. Stops early once every row has produced eos_id. -> (B, T + new)"""
        cache = self.new_cache(idx.size(1) + max_new_tokens)
        for s in range(0, idx.size(1), chunk_size):
            x = self.hidden(idx[:, s:s + chunk_size], cache)
        out = [idx]
        for i in range(max_new_tokens):
            nxt = self.lm_head(x[:, -1]).argmax(-1, keepdim=True)  # (B, 1)
            out.append(nxt)
            if (eos_id is not None and (nxt == eos_id).all()) or i == max_new_tokens - 1:
                break
            x = self.hidden(nxt, cache)
        return torch.cat(out, dim=1)

    def flops_per_token(self, T):
        """Training FLOPs per token at context T (PaLM appendix B): 6 per weight that multiplies
        (the blocks and the output head; the embedding lookup is free), plus the attention
        scores and their values, 12 * H * hd * (keys seen) per layer, with the window for sliding
        layers and every key counted (as PaLM and nanoGPT; causal kernels skip about half)."""
        c = self.config
        attn = sum(12 * c.n_head * self.head_dim * (min(T, w) if w else T)
                   for w in c.layer_windows())
        return 6 * (self.num_params() + c.vocab_size * c.n_embd) + attn


# -----------------------------------------------------------------------------
# the config's checks: the keys that take one of a few values; each condition and its message

CHOICES = {'mlp': ('gelu', 'swiglu'), 'norm': ('rmsnorm', 'layernorm'), 'attn_backend': (
    'auto', 'sdpa', 'flex', 'manual'), 'rope_scaling': ('none', 'pi', 'yarn'),
    'attn_scale': ('none', 'adaptive', 'static', 'ssmax', 'log_length')}


def check_config(c):
    sizes = {k: getattr(c, k) for k in ('vocab_size', 'block_size', 'n_layer', 'n_head', 'n_embd',
                                        'n_kv_head', 'head_dim', 'ffn_dim')}
    sizes = {k: v for k, v in sizes.items() if v is not None}  # None: from the others
    if min(sizes.values()) < 1:
        raise ValueError("sizes must be >= 1: " + ', '.join(f'{k} = {v}' for k, v in sizes.items()))
    check_dropout(c.dropout_type, c.dropout, c.vpad_variant)
    for key, allowed in CHOICES.items():
        if getattr(c, key) not in allowed:
            raise ValueError(f"{key} must be one of {allowed}, got {getattr(c, key)!r}")
    positions, windows = ([v] if isinstance(v, (str, int)) else list(v)  # per layer, or a pattern
                          for v in (c.pos_encoding, c.window))
    unknown = [p for p in positions if p not in POS_ENCODINGS]
    uneven = [(k, len(v)) for k, v in (('pos_encoding', positions), ('window', windows))
              if not v or c.n_layer % len(v)] or [('', 1)]
    for holds, message in [
        (not uneven[0][0], f"{uneven[0][0]} has {uneven[0][1]} entries but n_layer = {c.n_layer}: "
                           f"give one per layer, or a pattern whose length divides {c.n_layer}"),
        (not unknown, f"unknown pos_encoding {unknown[:1] and unknown[0]!r}; choose one of "
                      f"{POS_ENCODINGS}"),
        ('learned' not in positions or c.pos_encoding == 'learned',
         "learned positions are added to the embeddings: use pos_encoding='learned' everywhere"),
        (min(windows, default=0) >= 0, f"window must be >= 0 (0: full attention), got {c.window}"),
        (c.head_dim is not None or c.n_embd % c.n_head == 0,  # n_embd // n_head drops the rest
         f"n_embd ({c.n_embd}) must be a multiple of n_head ({c.n_head}), or give head_dim"),
        (c.n_head % (c.n_kv_head or c.n_head) == 0,
         f"n_head ({c.n_head}) must be a multiple of n_kv_head ({c.n_kv_head})"),
        (0 <= c.attn_dropout < 1, f"attn_dropout must be in [0, 1), got {c.attn_dropout}"),
        (not (c.attn_backend == 'flex' and c.attn_dropout > 0),  # flex has no dropout: lost
         "attn_backend='flex' cannot apply attention dropout: use 'sdpa' or 'manual' (or 'auto')"),
        (c.attn_alpha >= 1, f"attn_alpha must be >= 1 (1: softmax), got {c.attn_alpha}"),
        (c.rope_random >= 0 and c.rope_factor >= 1, f"rope_random must be >= 0 (0: off) and "
         f"rope_factor >= 1, got {c.rope_random}, {c.rope_factor}")]:
        if not holds:
            raise ValueError(message)
