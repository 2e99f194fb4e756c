"""model.py against independent references: attention, RoPE, caches, chunked losses, the
dropout sites, the paper's parameter count."""

import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from conftest import ROOT
from ops.attention import attention, flex
from model import (Transformer, TransformerConfig, alibi_slopes, apply_rope, rope_cos_sin,
                   rope_frequencies)

SMALL = dict(vocab_size=61, block_size=64, n_layer=2, n_head=4, n_embd=32)


def naive_attention(q, k, v, q_start, k_start, slopes, window):
    """Loops over heads and query positions; ALiBi as -m_h * distance, written out directly."""
    B, H, Tq, hd = q.shape
    rep = H // k.size(1)
    out = torch.zeros_like(q)
    for h in range(H):
        kh, vh = k[:, h // rep], v[:, h // rep]  # (B, Tk, hd)
        for i in range(Tq):
            qpos = q_start + i
            scores = (kh @ q[:, h, i, :, None])[..., 0] / math.sqrt(hd)  # (B, Tk)
            for j in range(k.size(2)):
                dist = qpos - (k_start + j)
                if dist < 0 or (window and dist >= window):
                    scores[:, j] = float('-inf')
                elif slopes is not None:
                    scores[:, j] -= slopes[h] * dist
            out[:, h, i] = (scores.softmax(-1)[:, None] @ vh)[:, 0]
    return out


CASES = [  # pos_encoding, window, n_kv_head, q_start, k_start (queries are the last Tq positions)
    ('nope', 0, 4, 0, 0), ('nope', 5, 2, 0, 0), ('rope', 0, 1, 0, 0), ('alibi', 0, 4, 0, 0),
    ('alibi', 7, 2, 0, 0), ('nape', 0, 2, 0, 0), ('nape', 6, 4, 0, 0), ('nape', 0, 4, 9, 0),
    ('nape', 4, 2, 12, 9), ('nope', 0, 2, 11, 0),
]


@pytest.mark.parametrize('pe,window,n_kv,q_start,k_start', CASES)
def test_sdpa_and_flex_equal_naive_attention(pe, window, n_kv, q_start, k_start):
    torch.manual_seed(0)
    Tk = 20
    Tq = Tk - (q_start - k_start)
    q, k, v = torch.randn(2, 4, Tq, 8), torch.randn(2, n_kv, Tk, 8), torch.randn(2, n_kv, Tk, 8)
    slopes = alibi_slopes(4, pe) if pe in ('alibi', 'nape') else None
    ref = naive_attention(q, k, v, q_start, k_start, slopes, window)
    out = attention(q, k, v, q_start=q_start, k_start=k_start, slopes=slopes, window=window)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(flex(q, k, v, q_start - k_start, slopes, window), ref, atol=1e-5,
                               rtol=1e-5)


@pytest.mark.parametrize('pe,window', [('alibi', 0), ('nape', 0), ('nape', 512)])
def test_attention_exact_at_long_query_offsets(pe, window):
    """16 queries after 2K, 8K and 32K cached keys (a chunked prefill or a decode step), against
    the same attention in float64: the ALiBi bias must be taken at the true distance, not at a
    distance shifted by the offset (fp32 would then carry slope x position: 1e-3 at 32K)."""
    torch.manual_seed(0)
    slopes = alibi_slopes(4, pe)
    for offset in (2048, 8192, 32768):
        q, k, v = (torch.randn(1, 4, 16, 16), torch.randn(1, 2, offset + 16, 16),
                   torch.randn(1, 2, offset + 16, 16))
        dist = (torch.arange(16)[:, None] + offset - torch.arange(offset + 16)).double()  # (Tq, Tk)
        scores = (q.double() @ k.double().repeat_interleave(2, 1).transpose(-2, -1) / 4
                  - slopes.double()[:, None, None] * dist)
        allowed = (dist >= 0) & (dist < window) if window else dist >= 0
        ref = (scores.masked_fill(~allowed, float('-inf')).softmax(-1)
               @ v.double().repeat_interleave(2, 1))
        for out in (flex(q, k, v, offset, slopes, window),
                    attention(q, k, v, q_start=offset, slopes=slopes, window=window)):
            assert (out.double() - ref).abs().max() < 2e-6, (
                offset, (out.double() - ref).abs().max())


def test_alibi_bias_kept_exact_under_bf16_autocast():
    """bf16 queries and keys, as autocast hands them on: the ALiBi bias must not be rounded to
    bf16 (m_h * distance off by up to 2^-9 of itself). The output, rounded to bf16 once, is then
    the float64 attention correctly rounded, but for ties (0.02% here; 5% with a bf16 bias)."""
    torch.manual_seed(0)
    T = 512
    q, k, v = ((torch.randn(1, 4, T, 16) * 1.5).bfloat16(),
               (torch.randn(1, 2, T, 16) * 1.5).bfloat16(), torch.randn(1, 2, T, 16).bfloat16())
    slopes = alibi_slopes(4, 'alibi') / 8  # gentle slopes: keys at distances of hundreds count
    dist = (torch.arange(T)[:, None] - torch.arange(T)).double()
    scores = (q.double() @ k.double().repeat_interleave(2, 1).transpose(-2, -1) / 4
              - slopes.double()[:, None, None] * dist)
    ref = (scores.masked_fill(dist < 0, float('-inf')).softmax(-1)
           @ v.double().repeat_interleave(2, 1))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = attention(q, k, v, slopes=slopes, window=0, backend='sdpa')
    assert out.dtype == torch.bfloat16 and (out != ref.bfloat16()).double().mean() < 0.005


def test_sdpa_gets_whole_heads_whenever_it_gets_a_mask(monkeypatch):
    """SDPA runs grouped-query attention with a mask only in its math kernel (the full score
    matrix): with a mask, attention() hands it k and v repeated to every query head."""
    calls, sdpa = [], F.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, **kw):
        calls.append((attn_mask is not None, q.size(1) == k.size(1), kw.get('enable_gqa', False)))
        return sdpa(q, k, v, attn_mask=attn_mask, **kw)
    monkeypatch.setattr(F, 'scaled_dot_product_attention', recording)
    q, k, v = torch.randn(1, 4, 12, 8), torch.randn(1, 2, 12, 8), torch.randn(1, 2, 12, 8)
    for slopes, window in ((alibi_slopes(4, 'nape'), 0), (None, 5), (None, 0)):
        attention(q, k, v, slopes=slopes, window=window)
    # the last: flash, GQA in-kernel
    assert calls == [(True, True, False), (True, True, False), (False, False, True)]


def test_alibi_and_windows_reach_sdpas_fused_cpu_kernel():
    """NAPE's bias and the sliding window go to SDPA's fused CPU kernel, forward and backward; a
    3-d bias mask sends SDPA to its math kernel (the quick start: training 1.3x slower, evaluation
    at 2048 tokens 2x)."""
    from torch.profiler import profile
    q, k, v = (torch.randn(2, 4, 64, 8, requires_grad=True) for _ in range(3))
    for slopes, window in ((alibi_slopes(4, 'nape'), 0), (None, 16), (alibi_slopes(4, 'nape'), 16)):
        with profile() as prof:
            attention(q, k, v, slopes=slopes, window=window).sum().backward()
        ops = {e.key for e in prof.key_averages()}
        assert {'aten::_scaled_dot_product_flash_attention_for_cpu',
                'aten::_scaled_dot_product_flash_attention_for_cpu_backward'} <= ops, (
            slopes, window)
        assert not any('math' in op for op in ops), (slopes, window)


def test_long_inputs_go_in_query_slices():
    """Past 2^25 mask entries the queries are sliced; the output is the same as one explicit
    mask."""
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 3000, 8), torch.randn(1, 2, 3000, 8), torch.randn(1, 2, 3000, 8)
    slopes = alibi_slopes(4, 'nape')
    dist = torch.arange(3000)[:, None] - torch.arange(3000)
    mask = (-slopes[:, None, None] * dist).masked_fill(dist < 0, float('-inf'))
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(attention(q, k, v, slopes=slopes), ref, atol=1e-5, rtol=1e-5)


def test_alibi_slopes():
    # first H/2 heads ALiBi, 1/h
    assert alibi_slopes(8, 'nape').tolist() == pytest.approx([1, 1 / 2, 1 / 3, 1 / 4, 0, 0, 0, 0])
    assert alibi_slopes(8, 'nape', 'exp').tolist() == [1, 1 / 2, 1 / 4, 1 / 8, 0, 0, 0, 0]
    # Press et al.: 2^(-8h/H)
    assert alibi_slopes(4, 'alibi').tolist() == [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8]
    # then odd powers of 2^(-8/(2n))
    assert alibi_slopes(6, 'alibi').tolist() == pytest.approx([2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8,
                                                               2 ** -1, 2 ** -3])


def test_rope_is_a_rotation_of_half_pairs():
    """Rotate-half RoPE = multiplying (x_i + i x_{i+d/2}) by e^{i pos theta^(-2i/d)}."""
    x = torch.randn(1, 2, 7, 16)
    cos, sin = rope_cos_sin(torch.arange(3, 10), rope_frequencies(16, 500.0, 'cpu')[0])
    z = torch.complex(x[..., :8], x[..., 8:])
    angle = torch.arange(3, 10.0)[:, None] * 500.0 ** (-torch.arange(0, 16, 2) / 16)
    rz = z * torch.polar(torch.ones_like(angle), angle)
    torch.testing.assert_close(apply_rope(x, cos, sin), torch.cat([rz.real, rz.imag], -1))


@pytest.mark.parametrize('pe,window', [('nope', 0), ('rope', 0), ('rope', 9), ('alibi', 0),
                                       ('nape', 0), ('nape', 9),
                                       ('learned', 0), (['rope', 'nope'], [9, 0])])
def test_cache_paths_equal_full_forward(pe, window):
    """Chunked per-position losses = the plain loss; greedy KV-cache generation = argmax of
    full forwards, including past block_size and across the window."""
    torch.manual_seed(0)
    m = Transformer(TransformerConfig(**SMALL, pos_encoding=pe, window=window, n_kv_head=2,
                                      mlp='swiglu')).eval()
    idx, tgt = torch.randint(0, 61, (2, 50)), torch.randint(0, 61, (2, 50))
    logits, _ = m(idx, tgt)
    full = F.cross_entropy(logits.transpose(1, 2), tgt, reduction='none')
    torch.testing.assert_close(m.position_losses(idx, tgt, chunk_size=7), full, atol=1e-5,
                               rtol=1e-5)
    ref = idx[:, :20]
    for _ in range(12):
        ref = torch.cat([ref, m(ref)[0][:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(m.generate(idx[:, :20], 12, chunk_size=6), ref)


@pytest.mark.parametrize('length', [0, 40], ids=['grown', 'sized'])
def test_the_cache_writes_decoded_tokens_in_place(length):
    """A full layer's keys and values go into one buffer: with new_cache(length) every decoded
    token writes into the same storage (no copy of the cache per token, which grew O(T)); without
    a length the buffer doubles when full. Either way the hidden states equal a full forward's,
    and a windowed layer keeps W - 1 positions."""
    torch.manual_seed(0)
    m = Transformer(TransformerConfig(**SMALL, pos_encoding=['rope', 'nope'], window=[5, 0],
                                      n_kv_head=2)).eval()
    idx = torch.randint(0, 61, (2, 40))
    cache, states, buffers = m.new_cache(length), [], []
    with torch.no_grad():
        states.append(m.hidden(idx[:, :16], cache))  # a prefill, then one token at a time
        for t in range(16, 40):
            states.append(m.hidden(idx[:, t:t + 1], cache))
            buffers.append((cache.k[1].untyped_storage().data_ptr(), cache.k[1].size(2)))
        full = m.hidden(idx)
    torch.testing.assert_close(torch.cat(states, 1), full, atol=1e-5, rtol=1e-5)
    sizes = [size for _, size in buffers]
    if length:
        assert len(set(buffers)) == 1 and sizes[0] == 40  # one storage for every token
    else:  # the prefill's 16, then 32 at token 17 and 64 at 33: a copy at two of 24 tokens
        assert sorted(set(sizes)) == [32, 64] and len(set(buffers)) == 2
    assert cache.k[0].size(2) == 4 and cache.pos == 40


def test_layernorm_biases_and_untied_head():
    torch.manual_seed(0)
    m = Transformer(TransformerConfig(**SMALL, norm='layernorm', bias=True,
                                      tie_embeddings=False)).eval()
    assert m.lm_head.weight is not m.wte.weight and isinstance(m.norm_f, torch.nn.LayerNorm)
    # projections, MLP, 2 LayerNorms
    per_layer = 4 * (32 * 32 + 32) + (32 * 128 + 128) + (128 * 32 + 32) + 2 * 2 * 32
    assert (m.num_params() == 2 * per_layer + 2 * 32
            and m.num_params(False) == m.num_params() + 2 * 61 * 32)
    idx = torch.randint(0, 61, (2, 30))
    full = F.cross_entropy(m(idx, idx)[0].transpose(1, 2), idx, reduction='none')
    torch.testing.assert_close(m.position_losses(idx, idx, chunk_size=8), full, atol=1e-5,
                               rtol=1e-5)


def test_model_flex_equals_sdpa():
    torch.manual_seed(0)
    args = dict(**SMALL, pos_encoding='nape', window=[0, 5])
    a = Transformer(TransformerConfig(**args, attn_backend='sdpa')).eval()
    b = Transformer(TransformerConfig(**args, attn_backend='flex')).eval()
    b.load_state_dict(a.state_dict())
    idx = torch.randint(0, 61, (2, 40))
    with torch.no_grad():  # FlexAttention has no backward on CPU
        torch.testing.assert_close(b(idx, idx)[0], a(idx, idx)[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b.position_losses(idx, idx, 16), a.position_losses(idx, idx, 16),
                               atol=1e-5, rtol=1e-5)


def test_generate_stops_at_eos():
    torch.manual_seed(0)
    m = Transformer(TransformerConfig(**SMALL)).eval()
    idx = torch.randint(0, 61, (1, 5))
    first = m.generate(idx, 1)[0, -1].item()
    assert m.generate(idx, 10, eos_id=first).shape == (1, 6)
    assert m.generate(idx, 10).shape == (1, 15)


def dropout_sites(model, idx):
    """A training-mode forward -> [(operator, the projection its output went into or None,
    whether it changed its input)], a row per call of a dropout operator. The sites are found by
    what they are, modules of dropout.py's operator classes, not by their names, so that a new
    type's sites are seen too; each projection (every nn.Linear of the blocks) is matched to the
    call whose output it took."""
    calls, made = [], {}  # made: id of an operator's output -> its row (the outputs kept alive)

    def operator(name):
        def hook(m, inp, out):  # (a hook that returns nothing leaves the output as it is)
            calls.append([name, None, not torch.equal(inp[0], out)])
            made[id(out)] = (calls[-1], out)
        return hook

    def projection(name):
        def hook(m, inp):
            if id(inp[0]) in made:
                made[id(inp[0])][0][1] = name
        return hook
    hooks = [m.register_forward_hook(operator(n)) for n, m in model.named_modules()
             if type(m).__module__ == 'dropout']
    hooks += [m.register_forward_pre_hook(projection(n)) for n, m in model.named_modules()
              if isinstance(m, torch.nn.Linear) and n != 'lm_head']
    model.train()(idx, idx)
    for h in hooks:
        h.remove()
    return [tuple(c) for c in calls]


@pytest.mark.parametrize('dropout_type', ['none', 'pre_norm', 'pre_linear', 'vpad'])
def test_each_placement_acts_only_at_its_sites(dropout_type):
    """PL-D and VPAD: one call on the input of every projection (q, k, v, o; gate, up, down), each
    changing it; PN-D: two calls a block, on the sublayers' outputs, which go to the residual
    stream and no projection; none: no operator at all."""
    torch.manual_seed(0)
    m = Transformer(TransformerConfig(**SMALL, mlp='swiglu', dropout=0.3,
                                      dropout_type=dropout_type))
    calls = dropout_sites(m, torch.randint(0, 61, (2, 16)))
    projections = sorted(f'layers.{i}.{s}' for i in range(2)
                         for s in ('attn.q_proj', 'attn.k_proj', 'attn.v_proj', 'attn.o_proj',
                                   'mlp.gate_proj', 'mlp.up_proj', 'mlp.down_proj'))
    assert all(changed for _, _, changed in calls)
    if dropout_type in ('pre_linear', 'vpad'):
        assert sorted(into for _, into, _ in calls) == projections
    elif dropout_type == 'pre_norm':  # after each sublayer, before the residual add
        assert len(calls) == 4 and all(into is None for _, into, _ in calls)
    else:
        assert calls == []


def test_pre_linear_masks_are_independent_per_projection():
    torch.manual_seed(0)
    m = Transformer(TransformerConfig(**SMALL, dropout=0.5, dropout_type='pre_linear'))
    seen = []  # the dropped units of each call of the attention's site: q, k, v, o
    m.layers[0].attn.pre_linear.register_forward_hook(lambda mod, i, o: seen.append(o == 0))
    m.train()(torch.randint(0, 61, (2, 16)))
    q, k, v = seen[:3]
    assert len(seen) == 4 and not torch.equal(q, k) and not torch.equal(k, v)


@pytest.mark.parametrize('kind', [dict(dropout_type='pre_norm'), dict(dropout_type='pre_linear'),
                                  dict(dropout_type='vpad'),
                                  dict(dropout_type='vpad', vpad_variant='C'),
                                  dict(attn_dropout=0.5)])
def test_every_dropout_is_the_identity_in_eval_mode(kind):
    torch.manual_seed(0)
    plain = Transformer(TransformerConfig(**SMALL))
    reg = Transformer(TransformerConfig(**SMALL, dropout=0.5, **kind))
    reg.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 61, (2, 16))
    # active in training
    assert not torch.allclose(reg.train()(idx, idx)[0], plain.train()(idx, idx)[0])
    torch.testing.assert_close(reg.eval()(idx, idx)[0], plain.eval()(idx, idx)[0], atol=0, rtol=0)


def test_learned_positions_stop_at_block_size():
    m = Transformer(TransformerConfig(**SMALL, pos_encoding='learned')).eval()
    m(torch.zeros(1, 64, dtype=torch.long))
    with pytest.raises(ValueError, match='learned absolute positions cover block_size = 64 tokens; '
                                         'this input reaches 65'):
        m(torch.zeros(1, 65, dtype=torch.long))


def test_config_errors():
    with pytest.raises(ValueError, match='pos_encoding'):
        TransformerConfig(pos_encoding='alibi2')
    with pytest.raises(ValueError, match='3 entries but n_layer = 2'):
        TransformerConfig(n_layer=2, window=[0, 4, 8])
    # a pattern repeats
    assert TransformerConfig(n_layer=6, window=[8, 0]).layer_windows() == [8, 0] * 3
    with pytest.raises(ValueError, match='n_kv_head'):
        TransformerConfig(n_head=4, n_kv_head=3)
    with pytest.raises(ValueError, match='learned'):
        TransformerConfig(n_layer=2, pos_encoding=['learned', 'nope'])
    # it would drop it
    with pytest.raises(ValueError, match="attn_backend='flex' cannot apply attention dropout"):
        TransformerConfig(attn_backend='flex', attn_dropout=0.1)
    with pytest.raises(ValueError, match=r'attn_dropout must be in \[0, 1\)'):
        TransformerConfig(attn_dropout=1.0)


def test_paper_config_parameter_count_on_meta():
    """configs/scratch.py (Table 6: 24 layers, 768 wide, FFN 3072, 12 heads) on the meta device,
    against the count written out by hand."""
    scope = {}
    exec(open(os.path.join(ROOT, 'configs', 'scratch.py')).read(), scope)
    args = {k: scope[k] for k in TransformerConfig.__dataclass_fields__ if k in scope}
    with torch.device('meta'):
        m = Transformer(TransformerConfig(**args, vocab_size=50304))
    assert (scope['n_layer'], scope['n_embd'], scope['ffn_dim'], scope['n_head'],
            scope['block_size']) == (24, 768, 3072, 12, 2048)
    # q, k, v, o; GELU MLP up, down; two RMSNorms
    per_layer = 4 * 768 * 768 + 2 * 768 * 3072 + 2 * 768
    assert m.num_params() == 24 * per_layer + 768  # + the final norm: 169,906,944
    # tied head: 208,540,416
    assert m.num_params(non_embedding=False) == 24 * per_layer + 768 + 50304 * 768


def sdpa_calls_per_layer(monkeypatch, B, H, Hkv, T, hd, slopes, window, device):
    """How many SDPA calls attention() makes for one layer with attention dropout at B x T: the
    masked calls are counted, not run (autocast has no meta device), the causal ones run on meta."""
    from ops import attention as attention_module
    calls, sdpa = [], F.scaled_dot_product_attention
    monkeypatch.setattr(attention_module.F, 'scaled_dot_product_attention',
                        lambda *a, **kw: (calls.append(1), sdpa(*a, **kw))[1])
    monkeypatch.setattr(attention_module, 'masked_sdpa',
                        lambda q, *a: (calls.append(1), torch.empty_like(q))[1])
    q, k = torch.empty(B, H, T, hd, device=device), torch.empty(B, Hkv, T, hd, device=device)
    attention(q, k, k, slopes=None if slopes is None else slopes.to(device), window=window,
              dropout_p=0.1, backend='auto')
    return len(calls)


def test_masked_sdpa_slices_by_what_it_materialises(monkeypatch):
    """SDPA's fused CUDA kernels take the mask as given, (1, H, rows, Tk) with NAPE's bias and
    (rows, Tk) without, and keep no scores: slices bound the mask, not the batch times it. The
    paper's configs with attention dropout, on the meta device (CUDA's rule; nothing computed):
    NAPE (configs/scratch.py) at 16 x 2048, 2 SDPA calls per layer (25 when the batch counted);
    SmolLM3-3B's windowed RoPE layers (16 heads, 4 KV heads of 128) at 4 x 4096, 1 (32 before),
    its global NoPE layers 1 (the causal kernel). On CPU SDPA's math kernel computes attention
    dropout and materialises the scores of the whole batch: there the batch still counts."""
    nape = alibi_slopes(12, 'nape')
    assert sdpa_calls_per_layer(monkeypatch, 16, 12, 12, 2048, 64, nape, 0, 'meta') == 2
    monkeypatch.undo()
    assert sdpa_calls_per_layer(monkeypatch, 4, 16, 4, 4096, 128, None, 2048, 'meta') == 1
    monkeypatch.undo()
    assert sdpa_calls_per_layer(monkeypatch, 4, 16, 4, 4096, 128, None, 0, 'meta') == 1
    monkeypatch.undo()
    from ops import attention as attention_module
    # 16 rows of every sequence, 48 of the mask
    monkeypatch.setattr(attention_module, 'SCORE_ENTRIES', 3 * 4 * 16 * 64)
    assert sdpa_calls_per_layer(monkeypatch, 3, 4, 4, 64, 8, alibi_slopes(4, 'nape'), 0, 'cpu') == 4


def test_the_fused_kernels_stay_out_of_compiled_graphs(tmp_path):
    """mamba_ssm's and causal_conv1d's Triton kernels (dynamo fails on them upstream) are not
    traced into the caller's graph: each is wrapped by torch.compiler.disable where it imports.
    Fake packages stand in for them, each saying whether dynamo traced it. (attention_triton's
    kernels are an opaque operator instead: tests/test_attention_triton.py.)"""
    fake = ("import torch\ndef {}(*args, **kwargs):\n"
            "    return 'traced' if torch.compiler.is_compiling() else 'kernel'\n")
    for module, fn in (('mamba_ssm/ops/triton/ssd_combined.py', 'mamba_chunk_scan_combined'),
                       ('causal_conv1d/__init__.py', 'causal_conv1d_fn')):
        path = tmp_path / module
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(tmp_path).parents:
            (tmp_path / parent / '__init__.py').touch()
        path.write_text(fake.format(fn))
    code = ('import torch, mamba\n'
            'fns = (mamba.mamba_chunk_scan_combined, mamba.causal_conv1d_fn)\n'
            'print([torch.compile(lambda: f(), backend="eager")() for f in fns])\n')
    r = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, 'PYTHONPATH': str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split('\n')[0] == "['kernel', 'kernel']"
