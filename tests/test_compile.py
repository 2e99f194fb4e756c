"""The compiled paths on CPU: what a GPU run compiles must trace as one graph, not recompile
step after step, and compute what eager computes."""

import warnings

import pytest
import torch
import torch._dynamo.utils

from ops import attention
import model
from ops.attention import flex
from model import alibi_slopes


def test_compiled_flex_stays_fused_over_many_eval_shapes(monkeypatch):
    """Evaluation calls flex with ever new (Tq, Tk, offset): a chunked prefill, eval_loss's 32
    shapes. Each used to be its own graph, and past dynamo's recompile limit (8) flex ran
    unfused, building the full score matrix. Twelve shapes must all run compiled."""
    torch._dynamo.reset()
    # the CUDA callable, on CPU
    monkeypatch.setattr(attention, 'flex_attention', attention._compiled_flex())
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    slopes = alibi_slopes(2, 'nape')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        for Tq, Tk in [(64, 64), (64, 128), (128, 128), (32, 160), (64, 192), (64, 256), (128, 256),
                       (64, 320), (64, 384), (96, 448), (64, 512), (128, 576)]:
            q, k, v = (torch.randn(1, 2, Tq, 16), torch.randn(1, 2, Tk, 16),
                       torch.randn(1, 2, Tk, 16))
            out = flex(q, k, v, Tk - Tq, slopes, 0)
            ref = attention.attention(q, k, v, q_start=Tk - Tq, slopes=slopes)
            torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    frames = torch._dynamo.utils.counters['frames']
    # every call compiled, few graphs
    assert frames['total'] == frames['ok'] and frames['ok'] <= 6, dict(frames)
    # never the unfused fallback
    assert not [w for w in caught if 'without torch.compile' in str(w.message)]
    torch._dynamo.reset()


SMALL = dict(vocab_size=61, block_size=32, n_layer=2, n_head=4, n_embd=32)
VARIANTS = {  # the training step of each regularizer and model, NAPE unless named otherwise
    'none': {}, 'pre_norm': dict(dropout_type='pre_norm', dropout=0.1),
    'pre_linear': dict(dropout_type='pre_linear', dropout=0.1),
    **{f'vpad_{v}': dict(dropout_type='vpad', dropout=0.1, vpad_variant=v) for v in 'ABCD'},
    'attn_dropout': dict(attn_dropout=0.1), 'asentmax': dict(attn_alpha=1.5, attn_scale='adaptive'),
    'nope': dict(pos_encoding='nope'), 'swa': dict(pos_encoding=['rope', 'nope'], window=[8, 0]),
    'mamba2': 'mamba2',
}


# Inductor's CPU code for the paper's VPAD (its mask path); the other variants are traced to one
# graph and compared with eager through aot_eager (dynamo and AOT autograd without Inductor's C++
# build: seconds, not 20 s each). tools/gpu_check.py compiles every variant again, in its dry run
# (tests/test_gpu_check.py) and with Inductor on a GPU
BACKEND = {v: 'aot_eager' for v in VARIANTS if v != 'vpad_A'}


def make(variant):
    if VARIANTS[variant] == 'mamba2':
        from mamba import Mamba2, Mamba2Config
        return Mamba2(Mamba2Config(vocab_size=61, n_layer=2, n_embd=32, d_state=8, headdim=8,
                                   chunk_size=8, dropout_type='pre_linear', dropout=0.1))
    return model.Transformer(model.TransformerConfig(**SMALL, **VARIANTS[variant]))


@pytest.mark.parametrize('variant', VARIANTS)
def test_training_step_compiles_to_one_graph_equal_to_eager(variant, monkeypatch):
    """fullgraph=True (no graph break), no recompile over three steps, and the loss and every
    gradient as in eager mode. The random masks are drawn the same way in both: inductor's own
    generator is switched off (fallback_random) and the eager run takes the compiled mask path."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with (torch._inductor.config.patch(fallback_random=True),
          torch._dynamo.config.patch(error_on_recompile=True)):
        three_steps(variant, monkeypatch)
    assert torch._dynamo.utils.counters['stats']['unique_graphs'] == 1
    torch._dynamo.reset()


def three_steps(variant, monkeypatch):
    torch.manual_seed(0)
    eager = make(variant).train()
    compiled_model = make(variant).train()
    compiled_model.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_model, fullgraph=True,
                             backend=BACKEND.get(variant, 'inductor'))
    for step in range(3):
        idx, tgt = torch.randint(0, 61, (2, 2, 32), generator=torch.Generator().manual_seed(step))
        torch.manual_seed(100 + step)
        loss = compiled(idx, tgt)[1]
        loss.backward()
        torch.manual_seed(100 + step)
        with monkeypatch.context() as m:
            # the masks as compiled code draws them
            m.setattr(torch.compiler, 'is_compiling', lambda: True)
            ref = eager(idx, tgt)[1]
        ref.backward()
        torch.testing.assert_close(loss, ref, atol=1e-5, rtol=1e-5)
        for (name, a), b in zip(compiled_model.named_parameters(), eager.parameters()):
            torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4,
                                       msg=lambda m: f'{name}: {m}')
            a.grad = b.grad = None


def test_flex_model_compiles_to_one_graph(monkeypatch):
    """The block mask is built inside the compiled graph by create_block_mask itself, not by the
    compiled create_block_mask that eager code uses on CUDA (a torch.compile inside the graph would
    break it twice per layer; torch 2.13 deprecates create_block_mask's own _compile=True). CUDA is
    simulated for block_mask by recording which of the two builds the mask."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = model.Transformer(model.TransformerConfig(**SMALL, window=[8, 0],
                                                  attn_backend='flex')).eval()
    idx = torch.randint(0, 61, (2, 32))
    # aot_eager: dynamo's graph as on CUDA, run by eager kernels (inductor's CPU flex template is
    # narrower than the CUDA one: it takes no block mask made inside the graph); no backward on CPU
    with torch.no_grad():
        with torch._dynamo.config.patch(error_on_recompile=True):
            out = torch.compile(m, fullgraph=True, backend='aot_eager')(idx, idx)[1]
        torch.testing.assert_close(out, m(idx, idx)[1], atol=1e-5, rtol=1e-5)

    asked, real_mask = [], attention.create_block_mask

    def recorder(name):
        return lambda *args, device, **kw: (asked.append(name),
                                            real_mask(*args, device='cpu', **kw))[1]
    monkeypatch.setattr(attention, 'create_block_mask', recorder('plain'))
    monkeypatch.setattr(attention, '_compiled_block_mask', lambda: recorder('compiled'))
    # no CUDA tensors here
    monkeypatch.setattr(attention, 'offset_tensor', lambda offset, device: torch.tensor(offset))
    cuda = torch.device('cuda')
    attention.block_mask.cache_clear()
    attention.block_mask(16, 16, 0, 0, cuda)  # eager
    torch.compile(lambda: attention.block_mask(16, 16, 0, 0, cuda).kv_num_blocks, fullgraph=True,
                  backend='eager')()
    attention.block_mask.cache_clear()
    assert asked == ['compiled', 'plain']
    torch._dynamo.reset()


def test_the_offset_tensor_is_made_once_per_offset(monkeypatch):
    """Eager flex takes the query offset as a tensor: made once per offset and device (by a fill,
    not a host copy), and every layer's score_mod and the block mask take that one. It used to be
    torch.tensor(offset, device='cuda') in every layer: a copy that waits, per layer and token."""
    made, asked, full, real = [], [], torch.full, attention.offset_tensor
    monkeypatch.setattr(torch, 'full', lambda *a, **kw: (made.append(a[1]), full(*a, **kw))[1])
    monkeypatch.setattr(attention, 'offset_tensor',
                        lambda offset, device: (asked.append(offset), real(offset, device))[1])
    real.cache_clear()
    attention.block_mask.cache_clear()
    # NAPE: flex's score_mod takes it
    m = model.Transformer(model.TransformerConfig(**SMALL, attn_backend='flex')).eval()
    with torch.no_grad():
        cache = m.new_cache()
        for s in range(0, 32, 8):
            m.hidden(torch.randint(0, 61, (1, 8)), cache)
    # 2 layers' score_mod, 1 block mask
    assert asked == [offset for offset in (0, 8, 16, 24) for _ in range(3)]
    assert made == [0, 8, 16, 24]
