"""mamba.py against independent references: a step-by-step recurrence, transformers' Mamba2
(its pure-PyTorch path), full forwards; the dropout sites; the paper's parameter counts."""

import json
import os

import pytest
import torch
import torch.nn.functional as F

import mamba
from conftest import ROOT
from mamba import Mamba2, Mamba2Config, ssd
from weights import load_mamba2, to_transformers

SMALL = dict(vocab_size=53, n_layer=2, n_embd=32, d_state=8, headdim=16, ngroups=2, chunk_size=16)


def naive_recurrence(x, a, B, C, state=None):
    """h_t = exp(a_t) h_{t-1} + x_t B_t^T, y_t = h_t C_t, one position at a time (in float64)."""
    b, l, h, p = x.shape
    rep = h // B.size(2)
    B, C = B.repeat_interleave(rep, 2), C.repeat_interleave(rep, 2)
    hs = torch.zeros(b, h, p, B.size(-1), dtype=x.dtype) if state is None else state.clone()
    ys = []
    for t in range(l):
        hs = torch.exp(a[:, t])[..., None, None] * hs + x[:, t, :, :, None] * B[:, t, :, None, :]
        ys.append((hs @ C[:, t, :, :, None])[..., 0])
    return torch.stack(ys, 1), hs


@pytest.mark.parametrize('l,Q,with_state', [(64, 16, False), (50, 16, False), (50, 16, True),
                                            (7, 32, True), (1, 8, False)])
def test_chunked_scan_equals_the_recurrence(l, Q, with_state):
    torch.manual_seed(0)
    b, h, p, g, n = 2, 4, 8, 2, 6
    x = torch.randn(b, l, h, p)
    a = -torch.rand(b, l, h) * 0.5
    B, C = torch.randn(b, l, g, n), torch.randn(b, l, g, n)
    state = torch.randn(b, h, p, n) if with_state else None
    y, final = ssd(x, a, B, C, Q, state)
    y_ref, final_ref = naive_recurrence(*(t.double() for t in (x, a, B, C)),
                                        None if state is None else state.double())
    torch.testing.assert_close(y, y_ref.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(final, final_ref.float(), atol=1e-5, rtol=1e-5)


def hf_twin(model):
    pytest.importorskip('transformers')
    return to_transformers(model).eval()


@pytest.mark.parametrize('T', [48, 37])  # a multiple of the chunk size (16) and not
def test_logits_equal_transformers_mamba2(T):
    torch.manual_seed(0)
    model = Mamba2(Mamba2Config(**SMALL)).eval()
    hf = hf_twin(model)
    idx = torch.randint(0, 53, (2, T))
    with torch.no_grad():
        ours = model(idx, idx)[0]
        theirs = hf(idx).logits
    assert (ours - theirs).abs().max().item() <= 1e-4


def test_chunk_size_does_not_change_the_output():
    torch.manual_seed(0)
    a = Mamba2(Mamba2Config(**SMALL)).eval()
    b = Mamba2(Mamba2Config(**{**SMALL, 'chunk_size': 5}))
    b.load_state_dict(a.state_dict())
    idx = torch.randint(0, 53, (2, 40))
    torch.testing.assert_close(b.eval()(idx, idx)[0], a(idx, idx)[0], atol=1e-5, rtol=1e-5)


def test_state_paths_equal_full_forward():
    """Chunked per-position losses = the plain loss; prefill + steps = argmax of full forwards."""
    torch.manual_seed(0)
    m = Mamba2(Mamba2Config(**SMALL)).eval()
    idx, tgt = torch.randint(0, 53, (2, 45)), torch.randint(0, 53, (2, 45))
    full = F.cross_entropy(m(idx, tgt)[0].transpose(1, 2), tgt, reduction='none')
    torch.testing.assert_close(m.position_losses(idx, tgt, chunk_size=7), full, atol=1e-5,
                               rtol=1e-5)
    ref = idx[:, :21]
    for _ in range(10):
        ref = torch.cat([ref, m(ref)[0][:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(m.generate(idx[:, :21], 10, chunk_size=6), ref)


def test_generation_equals_transformers_greedy():
    torch.manual_seed(0)
    m = Mamba2(Mamba2Config(**SMALL)).eval()
    hf = hf_twin(m)
    idx = torch.randint(0, 53, (1, 20))
    ours = m.generate(idx, 12)
    theirs = hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=12,
                         do_sample=False, min_new_tokens=12, pad_token_id=0)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize('dropout_type', ['none', 'pre_norm', 'pre_linear', 'vpad'])
def test_dropout_sites(dropout_type):
    """The operators found by what they are (test_model.dropout_sites): PL-D and VPAD on the
    inputs of in_proj and out_proj, PN-D on each mixer's output (no projection), none nowhere;
    every call changes its input in training and the model is itself in eval mode."""
    from test_model import dropout_sites
    torch.manual_seed(0)
    m = Mamba2(Mamba2Config(**SMALL, dropout=0.3, dropout_type=dropout_type))
    idx = torch.randint(0, 53, (2, 16))
    calls = dropout_sites(m, idx)
    assert all(changed for _, _, changed in calls)
    if dropout_type in ('pre_linear', 'vpad'):
        assert sorted(into for _, into, _ in calls) == sorted(
            f'layers.{i}.mixer.{p}' for i in range(2) for p in ('in_proj', 'out_proj'))
    elif dropout_type == 'pre_norm':
        assert len(calls) == 2 and all(into is None for _, into, _ in calls)
    else:
        assert calls == []
    train_logits = m.train()(idx, idx)[0]
    plain = Mamba2(Mamba2Config(**SMALL)).eval()
    plain.load_state_dict(m.state_dict())
    # identity in eval mode
    torch.testing.assert_close(m.eval()(idx, idx)[0], plain(idx, idx)[0], atol=0, rtol=0)
    assert torch.equal(train_logits, plain(idx, idx)[0]) == (dropout_type == 'none')


def test_initialisation_and_no_decay_marks():
    torch.manual_seed(0)
    # 64 heads, for the statistics
    m = Mamba2(Mamba2Config(**{**SMALL, 'n_embd': 256, 'headdim': 8}))
    mixer = m.layers[0].mixer
    dt = F.softplus(mixer.dt_bias)
    assert dt.min() >= 1e-3 * 0.99 and dt.max() <= 0.1 * 1.01  # log-uniform in [1e-3, 0.1]
    A = torch.exp(mixer.A_log)
    assert A.min() >= 1 and A.max() <= 16
    assert torch.equal(mixer.D, torch.ones(64))
    assert all(getattr(p, '_no_weight_decay', False) for p in (mixer.dt_bias, mixer.A_log, mixer.D))
    # out_proj: PyTorch's default bound 1/sqrt(fan_in), divided by sqrt(n_layer)
    assert mixer.out_proj.weight.abs().max() <= 1 / (512 ** 0.5) / (2 ** 0.5)


def test_paper_parameter_counts_on_meta(monkeypatch):
    """Mamba2-45M (Table 6, Copy) and Mamba2-85M (the Pile, with GPT-NeoX's vocabulary), sized
    for the kernels (their checks pass as if mamba_ssm and causal_conv1d imported)."""
    monkeypatch.setattr(mamba, 'mamba_chunk_scan_combined', lambda *a, **k: None)
    monkeypatch.setattr(mamba, 'causal_conv1d_fn', lambda *a, **k: None)
    for name, expected_non_embedding in (('mamba2_45m_copy.py', 45.18e6),
                                         ('mamba2_85m.py', 45.18e6)):
        scope = {}
        exec(open(os.path.join(ROOT, 'configs', name)).read(), scope)
        args = {k: scope[k] for k in Mamba2Config.__dataclass_fields__ if k in scope}
        with torch.device('meta'):
            m = Mamba2(Mamba2Config(**{'vocab_size': 50288, **args}))
        assert m.config.nheads == 24 and m.config.d_state == 128 and m.config.n_layer == 12
        assert m.num_params() == pytest.approx(expected_non_embedding, abs=0.05e6)
    # "85M" with 50,288 x 768 embeddings
    assert m.num_params(non_embedding=False) == pytest.approx(83.8e6, abs=0.1e6)


@pytest.mark.parametrize('layout', ['mamba_ssm', 'transformers'])
def test_load_released_weights_from_a_folder(tmp_path, layout):
    torch.manual_seed(0)
    m = Mamba2(Mamba2Config(**{**SMALL, 'vocab_size': 64})).eval()
    if layout == 'mamba_ssm':
        cfg = {'d_model': 32, 'n_layer': 2, 'vocab_size': 50, 'pad_vocab_size_multiple': 16,
               'tie_embeddings': True,
               'ssm_cfg': {'layer': 'Mamba2', 'd_state': 8, 'headdim': 16, 'ngroups': 2,
                           'chunk_size': 16}}
        torch.save({'backbone.' + k: v for k, v in m.state_dict().items()},
                   tmp_path / 'pytorch_model.bin')
    else:
        from safetensors.torch import save_file
        cfg = {'vocab_size': 64, 'num_hidden_layers': 2, 'hidden_size': 32, 'state_size': 8,
               'conv_kernel': 4, 'expand': 2, 'head_dim': 16, 'n_groups': 2, 'chunk_size': 16,
               'layer_norm_epsilon': 1e-5, 'use_bias': False,
               'use_conv_bias': True, 'tie_word_embeddings': True}
        save_file({'backbone.' + k.replace('embedding.', 'embeddings.'): v.contiguous()
                   for k, v in m.state_dict().items() if k != 'lm_head.weight'},
                  str(tmp_path / 'model.safetensors'))
    (tmp_path / 'config.json').write_text(json.dumps(cfg))
    args, state = load_mamba2(str(tmp_path))
    assert args['vocab_size'] == 64  # 50 padded to a multiple of 16, as mamba_ssm does
    loaded = Mamba2(Mamba2Config(**args)).eval()
    loaded.load_state_dict(state)
    idx = torch.randint(0, 50, (1, 20))
    torch.testing.assert_close(loaded(idx, idx)[0], m(idx, idx)[0])


def test_config_errors(monkeypatch):
    with pytest.raises(ValueError, match='multiple of headdim'):
        Mamba2Config(n_embd=40, headdim=24)
    with pytest.raises(ValueError, match='ngroups'):
        Mamba2Config(n_embd=64, headdim=32, ngroups=3)
    bad = dict(n_embd=36, headdim=8, d_state=5)  # conv channels 72 + 10 = 82
    Mamba2Config(**bad)  # fine without the kernels
    # as if mamba_ssm imported
    monkeypatch.setattr(mamba, 'mamba_chunk_scan_combined', lambda *a, **k: None)
    with pytest.raises(ValueError,
                       match='multiple of 8: change the sizes, or set use_kernels=False'):
        Mamba2Config(**bad)
    Mamba2Config(**bad, use_kernels=False)
    # conv channels 64 + 2 * 2 * 8 = 96, a multiple of 8; in_proj's rows
    # 2 * 64 + 32 + 4 heads = 164 are not
    # as if causal_conv1d imported
    monkeypatch.setattr(mamba, 'causal_conv1d_fn', lambda *a, **k: None)
    with pytest.raises(ValueError,
                       match=r"row stride of in_proj's output .* = 164\) to be a multiple of 8"):
        Mamba2Config(**SMALL)
    Mamba2Config(**SMALL, use_kernels=False)


def test_a_broken_kernel_install_falls_back_to_the_pytorch_scan(tmp_path):
    """mamba_ssm or causal_conv1d installed but failing at import with something other than an
    ImportError: the scripts (all import mamba.py through checkpoint.py) still run, with a
    warning."""
    import subprocess
    import sys
    from conftest import ROOT
    for name in ('mamba_ssm', 'causal_conv1d'):
        (tmp_path / name).mkdir()
        (tmp_path / name / '__init__.py').write_text(
            "raise RuntimeError('libcudart.so.12: cannot open shared object file')")
    r = subprocess.run([sys.executable, '-c', 'import checkpoint, mamba; '
                        'print(mamba.mamba_chunk_scan_combined, mamba.causal_conv1d_fn)'],
                       cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, 'PYTHONPATH': str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert ('None None' in r.stdout
            and r.stdout.count('is installed but does not import (RuntimeError') == 2)
