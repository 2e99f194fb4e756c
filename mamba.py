"""
Mamba2 (Dao & Gu, "Transformers are SSMs", 2024) as a language model, in one file, with the
paper's dropout placements inline:

    embedding -> N x [RMSNorm -> Mamba2 mixer, residual add] -> RMSNorm -> tied head
    mixer: in_proj -> (z, xBC, dt); causal depthwise conv1d + SiLU on xBC -> (x, B, C);
           SSD scan with the D skip; gated RMSNorm(y, z); out_proj

- PN-D (Eq. 6) in Block.forward, on the mixer output before the residual add; PL-D and VPAD
  (`self.pre_linear(...)`) on the inputs of in_proj and out_proj, in Mixer.forward.
- The SSD scan is plain PyTorch (any device, any length); on CUDA the fused kernels of
  mamba_ssm (and causal_conv1d) are used when they import, with the same numbers.
- A state (conv inputs and SSM state per layer) carries a sequence across calls: chunked
  prefill of long prompts, per-position losses, and constant-time-per-token generation.
- Defaults and initialisation follow mamba_ssm's Mamba2 (d_state 128, headdim 64, expand 2,
  d_conv 4, ngroups 1); weights of state-spaces/mamba2-* load through weights.py.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from dropout import check as check_dropout, pre_linear, pre_norm

try:  # fused kernels, CUDA only; without them the PyTorch scan below runs everywhere
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
except ImportError:
    mamba_chunk_scan_combined = None
except Exception as e:
    # installed but broken (a CUDA or Triton mismatch): every script imports this file
    print(f"warning: mamba_ssm is installed but does not import ({type(e).__name__}: {e}); "
          f"using the PyTorch scan")
    mamba_chunk_scan_combined = None
try:
    from causal_conv1d import causal_conv1d_fn
except ImportError:
    causal_conv1d_fn = None
except Exception as e:
    print(f"warning: causal_conv1d is installed but does not import ({type(e).__name__}: {e}); "
          f"using the PyTorch conv")
    causal_conv1d_fn = None
# The kernels run outside any compiled graph (a graph break each, by design): dynamo fails on
# mamba_ssm's Triton autograd functions upstream, and Inductor has nothing to fuse inside them.
if mamba_chunk_scan_combined is not None:
    mamba_chunk_scan_combined = torch.compiler.disable(mamba_chunk_scan_combined)
if causal_conv1d_fn is not None:
    causal_conv1d_fn = torch.compiler.disable(causal_conv1d_fn)


@dataclass
class Mamba2Config:
    vocab_size: int = 50288
    n_layer: int = 24
    n_embd: int = 768  # d_model
    d_state: int = 128  # N
    d_conv: int = 4
    expand: int = 2  # d_inner = expand * n_embd
    headdim: int = 64  # P; heads H = d_inner / headdim
    ngroups: int = 1  # G: heads sharing one B and C
    chunk_size: int = 256  # Q of the SSD scan
    norm_eps: float = 1e-5
    bias: bool = False  # in_proj and out_proj
    conv_bias: bool = True
    tie_embeddings: bool = True
    dt_min: float = 0.001  # dt is initialised log-uniform in [dt_min, dt_max]
    dt_max: float = 0.1
    dropout: float = 0.0
    dropout_type: str = 'none'  # 'none', 'pre_norm' (PN-D), 'pre_linear' (PL-D) or 'vpad'
    vpad_variant: str = 'A'
    use_kernels: bool = True  # mamba_ssm / causal_conv1d kernels on CUDA when they import

    def __post_init__(self):
        names = ('vocab_size', 'n_layer', 'n_embd', 'd_state', 'd_conv', 'expand', 'headdim',
                 'ngroups', 'chunk_size')
        sizes = {k: getattr(self, k) for k in names}
        if min(sizes.values()) < 1:
            raise ValueError("sizes must be >= 1: " + ', '.join(f'{k} = {v}' for k, v in
                                                                sizes.items()))
        check_dropout(self.dropout_type, self.dropout, self.vpad_variant)
        if self.d_inner % self.headdim:
            raise ValueError(f"d_inner = expand * n_embd = {self.d_inner} must be a multiple of "
                             f"headdim ({self.headdim})")
        if self.nheads % self.ngroups:
            raise ValueError(f"the {self.nheads} heads must split evenly into ngroups = "
                             f"{self.ngroups}")
        if self.use_kernels and mamba_chunk_scan_combined is not None and self.conv_channels % 8:
            raise ValueError(f"mamba_ssm's kernels need conv channels (d_inner + 2 * ngroups * "
                             f"d_state = {self.conv_channels}) to be a multiple of 8: change the "
                             f"sizes, or set use_kernels=False")
        # xBC is read in place, channels last
        if self.use_kernels and causal_conv1d_fn is not None and self.in_proj_width % 8:
            raise ValueError(f"causal_conv1d needs the row stride of in_proj's output (2 * d_inner "
                             f"+ 2 * ngroups * d_state + nheads = {self.in_proj_width}) to be a "
                             f"multiple of 8: change the sizes, or set use_kernels=False")

    @property
    def d_inner(self):
        return self.expand * self.n_embd

    @property
    def nheads(self):
        return self.d_inner // self.headdim

    @property
    def in_proj_width(self):  # in_proj's output: z, xBC, dt
        return 2 * self.d_inner + 2 * self.ngroups * self.d_state + self.nheads

    @property
    def conv_channels(self):
        return self.d_inner + 2 * self.ngroups * self.d_state


# -----------------------------------------------------------------------------
# the SSD scan

def segsum(a):
    """segsum(a)[..., i, j] = a[j+1] + ... + a[i] for j <= i, -inf above the diagonal: the log
    of the decay from position j to i. Summed by masked cumsum, not as a difference of cumsums,
    which would cancel catastrophically. (..., T) -> (..., T, T)"""
    T = a.size(-1)
    a = a[..., None].expand(*a.shape, T)  # (..., T, T): a[..., i, j] = a_i
    a = a.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool, device=a.device), -1), 0)
    s = a.cumsum(dim=-2)
    return s.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool, device=a.device)),
                         float('-inf'))


def ssd(x, a, B, C, chunk_size, state=None):
    """The SSD recurrence h_t = exp(a_t) h_{t-1} + x_t B_t^T, y_t = h_t C_t, computed chunk by
    chunk: attention-like inside each chunk, a recurrence over chunk states between them.
    x (b, l, h, p) already times dt; a (b, l, h) = dt * A (<= 0); B, C (b, l, g, n);
    state (b, h, p, n) or None. Any l: the tail is zero-padded (a = 0 and x = 0 leave the
    state unchanged). -> y (b, l, h, p), final state (b, h, p, n)"""
    b, l, h, p = x.shape
    Q = chunk_size
    pad = -l % Q
    rep = h // B.size(2)
    B, C = B.repeat_interleave(rep, dim=2), C.repeat_interleave(rep, dim=2)  # (b, l, h, n)
    x, a, B, C = (F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for t in (x, a, B, C))
    c = (l + pad) // Q
    x, B, C = (t.reshape(b, c, Q, h, -1) for t in (x, B, C))  # (b, c, Q, h, .)
    a = a.reshape(b, c, Q, h).transpose(2, 3)  # (b, c, h, Q)
    a_cum = a.cumsum(dim=-1)  # (b, c, h, Q)

    # 1. inside each chunk, attention-like:
    # y_t = sum_{s<=t} (C_t . B_s) exp(a_{s+1} + ... + a_t) x_s
    scores = torch.einsum('bclhn,bcshn->bchls', C, B) * torch.exp(segsum(a))  # (b, c, h, Q, Q)
    y = torch.einsum('bchls,bcshp->bclhp', scores, x)
    # 2. the state each chunk adds, decayed to the chunk's end
    to_end = torch.exp(a_cum[..., -1:] - a_cum).transpose(2, 3)  # (b, c, Q, h)
    chunk_states = torch.einsum('bclhn,bclhp->bchpn', B * to_end[..., None], x)  # (b, c, h, p, n)
    # 3. the state entering each chunk: the recurrence over chunks, as one product with their decays
    if state is None:
        state = x.new_zeros(b, h, p, B.size(-1))
    chunk_states = torch.cat([state[:, None], chunk_states], dim=1)  # (b, c+1, h, p, n)
    across = torch.exp(segsum(F.pad(a_cum[..., -1].transpose(1, 2), (1, 0))))  # (b, h, c+1, c+1)
    states = torch.einsum('bhzc,bchpn->bzhpn', across, chunk_states)  # (b, c+1, h, p, n)
    # 4. what the entering state contributes at each position of its chunk
    y = y + (torch.einsum('bclhn,bchpn->bclhp', C, states[:, :-1])
             * torch.exp(a_cum).transpose(2, 3)[..., None])
    return y.reshape(b, c * Q, h, p)[:, :l], states[:, -1]


# -----------------------------------------------------------------------------
# the network

class RMSNorm(nn.Module):
    """RMSNorm in float32; with a gate z, the gated norm of Mamba2: norm(y * silu(z)), per group."""

    def __init__(self, dim, eps, group_size=None):
        super().__init__()
        self.eps, self.group_size = eps, group_size or dim
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x, z=None):
        y = x.float()
        if z is not None:
            y = y * F.silu(z.float())
        y = y.unflatten(-1, (-1, self.group_size))  # (..., groups, group_size)
        y = (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).flatten(-2)
        return self.weight * y.to(x.dtype)


class Mixer(nn.Module):
    def __init__(self, config):
        super().__init__()
        c = config
        self.config = c
        self.d_inner, self.nheads, self.channels = c.d_inner, c.nheads, c.conv_channels
        self.in_proj = nn.Linear(c.n_embd, c.in_proj_width, bias=c.bias)  # z, xBC, dt
        self.conv1d = nn.Conv1d(self.channels, self.channels, c.d_conv, groups=self.channels,
                                bias=c.conv_bias)
        # dt ~ log-uniform in [dt_min, dt_max] through softplus(dt_bias); A = -exp(A_log),
        # A_log = log U[1, 16]
        dt = torch.exp(torch.rand(c.nheads) * (math.log(c.dt_max) - math.log(c.dt_min))
                       + math.log(c.dt_min)).clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # the inverse of softplus
        self.A_log = nn.Parameter(torch.log(torch.empty(c.nheads).uniform_(1, 16)))
        self.D = nn.Parameter(torch.ones(c.nheads))
        for p in (self.dt_bias, self.A_log, self.D):
            p._no_weight_decay = True  # as mamba_ssm: train.py leaves them out of weight decay
        self.norm = RMSNorm(c.d_inner, c.norm_eps, group_size=c.d_inner // c.ngroups)
        self.out_proj = nn.Linear(c.d_inner, c.n_embd, bias=c.bias)
        # the PL-D / VPAD site
        self.pre_linear = pre_linear(c.dropout_type, c.dropout, c.vpad_variant)

    def forward(self, u, state=None):
        """u (B, L, C), state (conv inputs (B, channels, d_conv-1), SSM state (B, H, P, N)) or None
        -> (B, L, C) and the state after the last position."""
        c = self.config
        Bsz, L, _ = u.shape
        # PL-D / VPAD (Fig. 2, right) on the input of in_proj, and below of out_proj
        z, xBC, dt = self.in_proj(self.pre_linear(u)).split(
            [self.d_inner, self.channels, self.nheads], dim=-1)
        conv_state, ssm_state = state if state is not None else (None, None)
        xBC, conv_state = self.conv(xBC, conv_state)  # (B, L, channels)
        x, Bm, Cm = xBC.split([self.d_inner, c.ngroups * c.d_state, c.ngroups * c.d_state], dim=-1)
        x = x.unflatten(-1, (self.nheads, c.headdim))  # (B, L, H, P)
        Bm, Cm = (Bm.unflatten(-1, (c.ngroups, c.d_state)),
                  Cm.unflatten(-1, (c.ngroups, c.d_state)))  # (B, L, G, N)
        A = -torch.exp(self.A_log.float())  # (H,)
        if L == 1 and ssm_state is not None:  # one token after a prefill: the recurrence
            y, ssm_state = self.step(x, dt, A, Bm, Cm, ssm_state)
        elif self._kernels(u):
            y, ssm_state = mamba_chunk_scan_combined(x, dt, A, Bm, Cm, c.chunk_size, D=self.D,
                                                     dt_bias=self.dt_bias, dt_softplus=True,
                                                     initial_states=ssm_state,
                                                     return_final_states=True)
        else:
            y, ssm_state = self.scan(x, dt, A, Bm, Cm, ssm_state)
        y = self.norm(y.flatten(-2), z)  # (B, L, d_inner)
        return self.out_proj(self.pre_linear(y)), (conv_state, ssm_state)

    def scan(self, x, dt, A, Bm, Cm, ssm_state):
        """The SSD scan over a sequence, from ssm_state (or zeros), with the D skip; in float32
        whatever the autocast (exponentials of long cumulative sums). -> y (B, L, H, P), final
        state"""
        dt = F.softplus(dt.float() + self.dt_bias.float())  # (B, L, H)
        xf = x.float()
        y, ssm_state = ssd(xf * dt[..., None], dt * A, Bm.float(), Cm.float(),
                           self.config.chunk_size, ssm_state)
        return (y + xf * self.D.float()[:, None]).to(x.dtype), ssm_state

    def step(self, x, dt, A, Bm, Cm, ssm_state):
        """One token, constant time: h = exp(dt A) h + dt x B^T, y = h C + D x (float32).
        x (B, 1, H, P), Bm and Cm (B, 1, G, N), ssm_state (B, H, P, N) -> y (B, 1, H, P), new
        state"""
        dt = F.softplus(dt[:, 0].float() + self.dt_bias.float())  # (B, H)
        xf = x[:, 0].float()  # (B, H, P)
        rep = self.nheads // self.config.ngroups
        Bh, Ch = (Bm[:, 0].float().repeat_interleave(rep, dim=1),
                  Cm[:, 0].float().repeat_interleave(rep, dim=1))  # (B, H, N)
        ssm_state = (ssm_state.float() * torch.exp(dt * A)[..., None, None]
                     + (dt[..., None] * xf)[..., None] * Bh[:, :, None, :])
        y = (ssm_state @ Ch[..., None])[..., 0] + xf * self.D.float()[:, None]  # (B, H, P)
        return y.unsqueeze(1).to(x.dtype), ssm_state

    def conv(self, xBC, conv_state):
        """Causal depthwise conv1d + SiLU over (B, L, channels), continuing from conv_state, the
        last d_conv-1 inputs before this call (zeros at the start of a sequence)."""
        x = xBC.transpose(1, 2)  # (B, channels, L)
        k = self.config.d_conv
        if conv_state is None:
            if self._kernels(x) and causal_conv1d_fn is not None:
                out = causal_conv1d_fn(x, self.conv1d.weight[:, 0], self.conv1d.bias,
                                       activation='silu')
                return out.transpose(1, 2), F.pad(x, (k - 1, 0))[:, :, -(k - 1):]
            conv_state = x.new_zeros(x.size(0), x.size(1), k - 1)
        x = torch.cat([conv_state, x], dim=-1)  # (B, channels, d_conv-1 + L)
        out = F.conv1d(x, self.conv1d.weight, self.conv1d.bias, groups=self.channels)
        return F.silu(out).transpose(1, 2), x[:, :, -(k - 1):]

    def _kernels(self, t):
        return t.is_cuda and self.config.use_kernels and mamba_chunk_scan_combined is not None


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.norm = RMSNorm(config.n_embd, config.norm_eps)
        self.mixer = Mixer(config)
        self.pre_norm = pre_norm(config.dropout_type, config.dropout)  # the PN-D site

    def forward(self, x, state=None):
        # PN-D (Eq. 6): the dropped mixer output joins the residual stream and reaches the next norm
        u, state = self.mixer(self.norm(x), state)
        return x + self.pre_norm(u), state


class Mamba2(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.n_embd)
        self.layers = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.norm_f = RMSNorm(config.n_embd, config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embedding.weight
        # init as mamba_ssm: embeddings N(0, 0.02); linears and convs keep PyTorch's default,
        # biases zero, out_proj scaled by 1/sqrt(n_layer) (one residual add per layer)
        nn.init.normal_(self.embedding.weight, std=0.02)
        for name, p in self.named_parameters():
            if name.endswith('proj.bias'):
                nn.init.zeros_(p)
            if name.endswith('out_proj.weight'):
                with torch.no_grad():
                    p /= math.sqrt(config.n_layer)

    def num_params(self, non_embedding=True):
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.embedding.weight.numel() * (1 if self.config.tie_embeddings else 2)
        return n

    def new_cache(self, length=0):
        return {}  # layer -> (conv inputs, SSM state): of one size whatever the length

    def hidden(self, idx, state=None):
        """Final-norm hidden states of idx (B, T), continuing the sequence whose per-layer states
        are in `state` (new_cache(), updated in place). (B, T, C)"""
        x = self.embedding(idx)
        for i, block in enumerate(self.layers):
            x, layer_state = block(x, None if state is None else state.get(i))
            if state is not None:
                state[i] = layer_state
        return self.norm_f(x)

    def forward(self, idx, targets=None):
        x = self.hidden(idx)
        if targets is None:
            return self.lm_head(x[:, [-1], :]), None
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1),
                               ignore_index=-1)
        return logits, loss

    @torch.no_grad()
    def position_losses(self, idx, targets, chunk_size=1024):
        """Cross-entropy at every position (B, T) -> (B, T), chunk by chunk through the state."""
        state, out = self.new_cache(), []
        for s in range(0, idx.size(1), chunk_size):
            logits = self.lm_head(self.hidden(idx[:, s:s + chunk_size], state)).float()
            out.append(F.cross_entropy(logits.transpose(1, 2), targets[:, s:s + chunk_size],
                                       reduction='none', ignore_index=-1))
        return torch.cat(out, dim=1)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, eos_id=None, chunk_size=1024):
        """Greedy decoding: chunked prefill of idx (B, T) into the recurrent state, then one
        constant-time step per token. Stops early once every row has produced eos_id."""
        state = self.new_cache()
        for s in range(0, idx.size(1), chunk_size):
            x = self.hidden(idx[:, s:s + chunk_size], state)
        out = [idx]
        for i in range(max_new_tokens):
            nxt = self.lm_head(x[:, -1]).argmax(-1, keepdim=True)  # (B, 1)
            out.append(nxt)
            if (eos_id is not None and (nxt == eos_id).all()) or i == max_new_tokens - 1:
                break
            x = self.hidden(nxt, state)
        return torch.cat(out, dim=1)

    def flops_per_token(self, T):
        """Training FLOPs per token: 6 per weight that multiplies (the blocks and the output head),
        plus the scan's products per layer and head: C.B^T and its product with x inside a chunk
        (Q(N + P)), the chunk states and their read-out (2NP). T does not enter: linear in
        length."""
        c = self.config
        scan = c.n_layer * c.nheads * (c.chunk_size * (c.d_state + c.headdim)
                                       + 2 * c.d_state * c.headdim)
        return 6 * (self.num_params() + c.vocab_size * c.n_embd) + 6 * scan
