"""The compiled paths on CPU: what a GPU run compiles must trace as one graph, not recompile
step after step, and compute what eager computes."""

import functools
import subprocess
import sys
import warnings

import pytest
import torch
import torch._dynamo.utils
import torch.utils.checkpoint

from conftest import ROOT
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


# Every config family's training step as a GPU runs it: Inductor (train.py's torch.compile on
# CUDA), attention's CUDA choices (attention_kernel(cuda=True)) with the Triton kernels run by the
# interpreter, at tiny width (heads of 16 or more: the kernels' smallest tile); beside eager with
# the same masks (fallback_random), as
# test_training_step_compiles_to_one_graph_equal_to_eager. Each row: the configs it stands for,
# the model's arguments and whether train.py's activation checkpointing is on.
FAMILIES = {
    # configs/{wd,no_wd,pn_d,pl_d,vpad}.py with attention dropout: the Triton kernel (NAPE's bias)
    'scratch NAPE, attention dropout': (dict(n_head=2, attn_dropout=0.1), False),
    # configs/asentmax_*.py: entmax-1.5 in the Triton kernel, NAPE's bias, the adaptive scale
    'ASEntmax': (dict(n_head=2, attn_alpha=1.5, attn_scale='adaptive', dropout_type='pre_linear',
                      dropout=0.1), False),
    # configs/smollm3_attn_dropout.py: RoPE layers with a window, a global NoPE one, GQA, head_dim
    # 128, SwiGLU, activation checkpointing: the Triton kernel on the windowed layers, SDPA's
    # dropout on the global one
    'SmolLM3 SW, attention dropout': (dict(n_head=4, n_kv_head=2, head_dim=128, mlp='swiglu',
                                           pos_encoding=['rope', 'nope'], window=[8, 0],
                                           attn_dropout=0.1), True),
    # configs/mamba2_*.py: the PyTorch scan (mamba_ssm's kernels are CUDA's alone), PN-D
    'Mamba2, PN-D': ('mamba2', False),
}


@pytest.mark.parametrize('family', FAMILIES)
def test_each_config_family_trains_compiled_by_inductor_as_on_cuda(family, monkeypatch, tmp_path):
    """One training step compiled by Inductor, with the CUDA kernel choice, equals eager. A fake
    that gives the backward's outputs other strides than the real op's crashes here, in the
    first backward (Inductor checks them; aot_eager does not). configs/{wd,...}.py without
    attention dropout take FlexAttention on CUDA, whose backward has no CPU implementation: that
    step cannot run here (test_flex_model_compiles_to_one_graph traces its forward)."""
    pytest.importorskip('triton')
    from ops.attention_triton import fused_attention
    args, checkpointing = FAMILIES[family]
    monkeypatch.setattr(attention, 'fused_attention', fused_attention)
    as_on_cuda = functools.partial(attention.attention_kernel, cuda=True)
    chosen = []  # the kernels attention() chose, traced and eager
    monkeypatch.setattr(attention, 'attention_kernel',
                        lambda *a, **kw: (chosen.append(as_on_cuda(*a, **kw)), chosen[-1])[1])
    if args == 'mamba2':
        from mamba import Mamba2, Mamba2Config
        make = lambda: Mamba2(Mamba2Config(  # noqa: E731
            vocab_size=61, n_layer=1, n_embd=32, d_state=8, headdim=8, chunk_size=8,
            dropout_type='pre_norm', dropout=0.1))
    else:
        make = lambda: model.Transformer(model.TransformerConfig(  # noqa: E731
            **{**SMALL, 'pos_encoding': 'nape', **args}, attn_backend='auto'))
    torch.manual_seed(0)
    eager, compiled_model = make().train(), make().train()
    compiled_model.load_state_dict(eager.state_dict())
    if checkpointing:  # as train.py wraps each block
        for block in compiled_model.layers:
            block.forward = functools.partial(torch.utils.checkpoint.checkpoint, block.forward,
                                              use_reentrant=False)
    monkeypatch.setenv('TORCHINDUCTOR_CACHE_DIR', str(tmp_path))  # no graph of an earlier run
    torch._dynamo.reset()
    idx, tgt = torch.randint(0, 61, (2, 2, 16), generator=torch.Generator().manual_seed(0))
    with torch._inductor.config.patch(fallback_random=True, force_disable_caches=True):
        torch.manual_seed(100)
        loss = torch.compile(compiled_model, backend='inductor')(idx, tgt)[1]
        loss.backward()
    torch.manual_seed(100)
    with monkeypatch.context() as m:
        m.setattr(torch.compiler, 'is_compiling', lambda: True)  # the masks as compiled code
        ref = eager(idx, tgt)[1]
    ref.backward()
    torch._dynamo.reset()
    torch.testing.assert_close(loss, ref, atol=1e-5, rtol=1e-5)
    for (name, a), b in zip(compiled_model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4,
                                   msg=lambda m: f'{name}: {m}')
    if args != 'mamba2':  # the step ran the kernels a GPU runs
        assert 'triton' in chosen, chosen


FALLBACK = """
import sys, warnings
import torch
torch.cuda.is_available = lambda: True  # as on a GPU machine
sys.path.insert(0, sys.argv[1])  # a triton that is broken, or too old
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    from ops import attention
q = torch.zeros(1, 1, 4, 16)
print(attention.fused_attention, attention.attention_kernel('auto', q, q, 0, 0, None, 0, 0.0, 1.5,
                                                            cuda=True))
print(*[str(w.message) for w in caught], sep='\\n')
"""


@pytest.mark.parametrize('triton', ["raise RuntimeError('libcuda.so: cannot open')",
                                    "__version__ = '2.3.1'"], ids=['broken', 'too old'])
def test_a_broken_or_old_triton_falls_back_with_one_warning(triton, tmp_path):
    """On CUDA, a triton whose import raises anything, or one older than the kernels need (3.0),
    leaves ops/attention.py importable: one warning, and entmax-1.5 written out ('manual')."""
    (tmp_path / 'triton').mkdir()
    (tmp_path / 'triton' / '__init__.py').write_text(triton + '\n')
    r = subprocess.run([sys.executable, '-c', FALLBACK, str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0] == 'None manual' and len(lines) == 2, r.stdout
    assert lines[1].startswith('the Triton kernels are off (') and 'written-out path' in lines[1]
