"""ASEntmax attention: entmax against the `entmax` package, its gradients, the attention's
sparsity pattern, the query scale, chunked evaluation."""

import math

import pytest
import torch
import torch.nn.functional as F

from ops.attention import Entmax, attention, entmax_bisect
from model import Attention, Transformer, TransformerConfig, alibi_slopes

entmax = pytest.importorskip('entmax')


def masked_scores(seed=0, rows=6, cols=9):
    g = torch.Generator().manual_seed(seed)
    z = 3 * torch.randn(4, rows, cols, generator=g)
    causal = torch.arange(rows)[:, None] + (cols - rows) >= torch.arange(cols)  # queries at the end
    return z.masked_fill(~causal, float('-inf')), causal


def test_entmax15_equals_the_entmax_package():
    z, causal = masked_scores()
    p = Entmax.apply(z, 1.5)
    torch.testing.assert_close(p, entmax.entmax15(z, dim=-1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(p, entmax.entmax_bisect(z, alpha=1.5, dim=-1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(p.sum(-1), torch.ones(4, 6))
    # exactly zero off the mask, and sparse inside
    assert (p[:, ~causal] == 0).all() and (p == 0).any(-1).any()
    for alpha in (1.25, 1.5, 1.75):
        torch.testing.assert_close(entmax_bisect(z, alpha),
                                   entmax.entmax_bisect(z, alpha=alpha, dim=-1),
                                   atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('alpha', [1.5, 1.3])
def test_gradients(alpha):
    z, _ = masked_scores(1)
    z1 = z.clone().requires_grad_()
    z2 = z.clone().requires_grad_()
    g = torch.randn(4, 6, 9)
    (Entmax.apply(z1, alpha) * g).sum().backward()
    ref = (entmax.entmax15(z2, dim=-1) if alpha == 1.5
           else entmax.entmax_bisect(z2, alpha=alpha, dim=-1))
    (ref * g).sum().backward()
    torch.testing.assert_close(z1.grad, z2.grad, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(z1.grad).all() and (z1.grad[z == float('-inf')] == 0).all()
    x = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: Entmax.apply(t, alpha), (x,))


@pytest.mark.parametrize('pe,window', [('nape', 0), ('nape', 4), ('nope', 3), ('alibi', 0)])
def test_attention_weights_are_sparse_and_masked(pe, window):
    """With v = identity the output is the attention matrix itself."""
    torch.manual_seed(0)
    q, k = torch.randn(1, 4, 12, 8), torch.randn(1, 2, 12, 8)
    v = torch.eye(12).expand(1, 2, 12, 12)
    slopes = alibi_slopes(4, pe) if pe != 'nope' else None
    P = attention(q, k, v, slopes=slopes, window=window, alpha=1.5)  # (1, 4, 12, 12)
    dist = torch.arange(12)[:, None] - torch.arange(12)
    allowed = (dist >= 0) & ((dist < window) if window else True)
    torch.testing.assert_close(P.sum(-1), torch.ones(1, 4, 12))
    assert (P[..., ~allowed] == 0).all()
    scores = (q @ k.repeat_interleave(2, 1).transpose(-2, -1)) / math.sqrt(8)
    if slopes is not None:
        scores = scores - slopes[:, None, None] * dist
    torch.testing.assert_close(P, entmax.entmax15(scores.masked_fill(~allowed, float('-inf')),
                                                  dim=-1), atol=1e-5, rtol=1e-5)


def test_alpha_one_is_softmax_attention():
    """The scores written out and normalised by softmax (alpha = 1, no scale) = SDPA's softmax
    attention."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 10, 8), torch.randn(2, 2, 10, 8), torch.randn(2, 2, 10, 8)
    slopes = alibi_slopes(4, 'nape')
    torch.testing.assert_close(attention(q, k, v, slopes=slopes, window=5, backend='manual',
                                         alpha=1.0),
                               attention(q, k, v, slopes=slopes, window=5, backend='sdpa'),
                               atol=1e-5, rtol=1e-5)
    plain = Transformer(TransformerConfig(vocab_size=40, n_layer=2, n_head=4, n_embd=32)).eval()
    manual = Transformer(TransformerConfig(vocab_size=40, n_layer=2, n_head=4, n_embd=32,
                                           attn_backend='manual')).eval()
    manual.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 40, (2, 20))
    torch.testing.assert_close(manual(idx, idx)[0], plain(idx, idx)[0], atol=1e-5, rtol=1e-5)


def test_query_scale():
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=40, n_layer=1, n_head=6, n_embd=24, attn_alpha=1.5,
                               attn_scale='adaptive')
    attn = Attention(config, 0)
    assert attn.n_scaled == 3  # NAPE: the 3 NoPE heads, the last ones
    x = torch.randn(2, 5, 24)
    s = attn.query_scale(x, 10)  # positions 10..14
    beta, gamma = attn.scale_proj(x).chunk(2, dim=-1)
    t = torch.arange(10, 15.0)[None, :, None]
    expected = 1 + F.softplus(beta) * torch.log(t + 2) ** (2 * torch.tanh(gamma))
    torch.testing.assert_close(s[..., 0], expected.transpose(1, 2))
    assert Attention(TransformerConfig(n_head=6, n_embd=24, pos_encoding='nope',
                                       attn_scale='ssmax'), 0).n_scaled == 6
    ssmax = Attention(TransformerConfig(n_head=6, n_embd=24, pos_encoding='nope',
                                        attn_scale='ssmax'), 0)
    torch.testing.assert_close(ssmax.query_scale(x, 0)[0, :, :, 0],
                               ssmax.scale_beta[:, None] * torch.log(torch.arange(5.0) + 2))
    # only the scaled heads change: the ALiBi heads' outputs are those of the unscaled model
    plain = Attention(TransformerConfig(vocab_size=40, n_layer=1, n_head=6, n_embd=24,
                                        attn_alpha=1.5), 0)
    plain.load_state_dict({k: v for k, v in attn.state_dict().items() if not k.startswith('scale')},
                          strict=False)
    heads = lambda a: (  # noqa: E731
        a.o_proj.register_forward_hook(lambda m, i, o: setattr(a, 'seen', i[0])), a(x))
    heads(attn), heads(plain)
    y1, y2 = attn.seen.view(2, 5, 6, 4), plain.seen.view(2, 5, 6, 4)
    torch.testing.assert_close(y1[:, :, :3], y2[:, :, :3])
    assert not torch.allclose(y1[:, :, 3:], y2[:, :, 3:])


@pytest.mark.parametrize('scale', ['adaptive', 'static', 'ssmax'])
def test_chunked_evaluation_equals_full(scale):
    torch.manual_seed(0)
    m = Transformer(TransformerConfig(vocab_size=50, n_layer=2, n_head=4, n_embd=32, attn_alpha=1.5,
                                      attn_scale=scale, window=[0, 7])).eval()
    idx = torch.randint(0, 50, (2, 40))
    full = F.cross_entropy(m(idx, idx)[0].transpose(1, 2), idx, reduction='none')
    torch.testing.assert_close(m.position_losses(idx, idx, chunk_size=7), full, atol=1e-5,
                               rtol=1e-5)
    ref = idx[:, :10]
    for _ in range(8):
        ref = torch.cat([ref, m(ref)[0][:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(m.generate(idx[:, :10], 8, chunk_size=3), ref)
    m.train()
    m(idx, idx)[1].backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())


def entmax_reference(q, k, v, slopes):
    """entmax-1.5 attention with NAPE's bias, every step in float64 (the entmax package)."""
    T, rep = q.size(2), q.size(1) // k.size(1)
    dist = (torch.arange(T)[:, None] - torch.arange(T)).double()
    scores = (q.double() @ k.double().repeat_interleave(rep, 1).transpose(-2, -1)
              / math.sqrt(q.size(-1)))
    scores = (scores - slopes.double()[:, None, None] * dist).masked_fill(dist < 0, float('-inf'))
    return entmax.entmax15(scores, dim=-1) @ v.double().repeat_interleave(rep, 1)


def test_scores_in_float32_under_bf16_autocast():
    """Autocast hands attention bf16 queries and keys; entmax must see their product in fp32.
    Relative error of the output here: 6.5e-3 with the scores rounded to bf16, 1.7e-3 in fp32,
    against 1.3e-3 for the float64 result rounded to bf16 once."""
    torch.manual_seed(0)
    q, k, v = ((3 * torch.randn(2, 4, 256, 16)).bfloat16(), torch.randn(2, 2, 256, 16).bfloat16(),
               torch.randn(2, 2, 256, 16).bfloat16())
    slopes = alibi_slopes(4, 'nape')
    ref = entmax_reference(q, k, v, slopes)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = attention(q, k, v, slopes=slopes, alpha=1.5)
    error = lambda y: ((y.double() - ref).norm() / ref.norm()).item()  # noqa: E731
    assert (out.dtype == torch.bfloat16
            and error(out) < 2 * error(ref.bfloat16())), (error(out), error(ref.bfloat16()))


def test_query_slices_count_the_batch(monkeypatch):
    """The scores entmax sorts are bounded per slice, the batch included (it used to be left out:
    B x the bound at the paper's batch of 16, 4 GiB of sort indices alone); slices change
    nothing."""
    from ops import attention as attention_module
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 4, 64, 8), torch.randn(3, 2, 64, 8), torch.randn(3, 2, 64, 8)
    slopes = alibi_slopes(4, 'nape')
    whole = attention(q, k, v, slopes=slopes, alpha=1.5)
    sizes, apply = [], Entmax.apply
    # 16 query rows of the whole batch
    monkeypatch.setattr(attention_module, 'SCORE_ENTRIES', 3 * 4 * 16 * 64)
    monkeypatch.setattr(Entmax, 'apply',
                        lambda z, alpha: (sizes.append(z.numel()), apply(z, alpha))[1])
    torch.testing.assert_close(attention(q, k, v, slopes=slopes, alpha=1.5), whole, atol=1e-6,
                               rtol=1e-5)
    torch.testing.assert_close(whole.double(), entmax_reference(q, k, v, slopes), atol=1e-5,
                               rtol=1e-5)
    assert sizes == [3 * 4 * 16 * 64] * 4
