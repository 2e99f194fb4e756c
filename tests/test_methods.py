"""The length-generalization methods beside the regularizers (docs/methods.md): position
interpolation and YaRN against transformers' RoPE scaling and a written-out loop, randomized
positions, the log-length temperature, and DroPE as CPT without positions."""

import math

import pytest
import torch

from conftest import CPT, TINY, run_script, run_train
from model import Transformer, TransformerConfig, random_positions, rope_cos_sin, rope_frequencies


def hf_frequencies(kind, head_dim, theta, factor, L):
    """transformers' own RoPE scaling (an independent implementation) -> (inv_freq, factor on cos
    and sin)."""
    transformers = pytest.importorskip('transformers')
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    config = transformers.LlamaConfig(hidden_size=head_dim * 2, num_attention_heads=2,
                                      head_dim=head_dim,
                                      max_position_embeddings=int(L * factor), rope_parameters={
                                          'rope_type': kind, 'rope_theta': theta, 'factor': factor,
                                          'original_max_position_embeddings': L})
    inv_freq, scale = ROPE_INIT_FUNCTIONS[kind](config, 'cpu')
    return inv_freq, scale


@pytest.mark.parametrize('head_dim,theta,factor,L', [(64, 10000.0, 8.0, 128),
                                                     (32, 500.0, 4.0, 256),
                                                     (128, 1e6, 16.0, 4096),
                                                     (16, 10000.0, 2.0, 32)])
def test_yarn_and_pi_match_transformers(head_dim, theta, factor, L):
    inv_freq, scale = rope_frequencies(head_dim, theta, 'cpu', 'yarn', factor, L)
    ref, ref_scale = hf_frequencies('yarn', head_dim, theta, factor, L)
    torch.testing.assert_close(inv_freq, ref.float(), rtol=1e-6, atol=0)
    assert scale == pytest.approx(ref_scale) == pytest.approx(0.1 * math.log(factor) + 1)
    inv_freq, scale = rope_frequencies(head_dim, theta, 'cpu', 'pi', factor, L)
    ref, _ = hf_frequencies('linear', head_dim, theta, factor, L)
    torch.testing.assert_close(inv_freq, ref.float(), rtol=1e-6, atol=0)
    assert scale == 1.0


def test_yarn_written_out():
    """YaRN (Peng et al. 2023, Sec. 3.2-3.3) by a loop over the dimensions: keep a frequency that
    turns at least beta = 32 times over L, divide by s one that turns at most alpha = 1 time, and
    between the two (the dimension bounds rounded outwards, and clipped to the dimensions) mix
    linearly in the dimension index."""
    head_dim, theta, s, L = 64, 10000.0, 8.0, 128
    base = [theta ** (-2 * d / head_dim) for d in range(head_dim // 2)]
    turns_dim = lambda r: (head_dim * math.log(L / (2 * math.pi * r))  # noqa: E731
                           / (2 * math.log(theta)))
    # as YaRN's code
    low, high = max(math.floor(turns_dim(32)), 0), min(math.ceil(turns_dim(1)), head_dim - 1)
    expect = []
    for d, f in enumerate(base):
        gamma = min(max((d - low) / (high - low), 0.0), 1.0)  # 0: kept, 1: interpolated
        expect.append((1 - gamma) * f + gamma * f / s)
    inv_freq, scale = rope_frequencies(head_dim, theta, 'cpu', 'yarn', s, L)
    torch.testing.assert_close(inv_freq, torch.tensor(expect), rtol=1e-6, atol=0)
    # fastest kept, slowest divided
    assert inv_freq[0] == base[0] and inv_freq[-1] == pytest.approx(base[-1] / s)
    assert scale == pytest.approx(1 + 0.1 * math.log(s))
    # no scaling, or s = 1: the plain frequencies
    assert torch.equal(rope_frequencies(head_dim, theta, 'cpu', 'yarn', 1.0, L)[0],
                       rope_frequencies(head_dim, theta, 'cpu')[0])


def test_pi_is_positions_divided_by_s():
    inv_freq = rope_frequencies(16, 10000.0, 'cpu')[0]
    pi = rope_frequencies(16, 10000.0, 'cpu', 'pi', 4.0)[0]
    pos = torch.arange(0, 64)
    for a, b in zip(rope_cos_sin(pos, pi), rope_cos_sin(pos / 4, inv_freq)):
        torch.testing.assert_close(a, b)


def test_random_positions_are_sorted_distinct_and_cover_the_range():
    torch.manual_seed(0)
    pos = random_positions(4000, 8, 32, 'cpu')  # (B, T)
    assert pos.shape == (4000, 8) and pos.dtype == torch.int64
    assert (pos.diff(dim=1) > 0).all()  # increasing, hence distinct
    assert pos.min() == 0 and pos.max() == 31  # [0, N): both ends drawn, nothing beyond
    # every position equally likely: 4000 * 8 / 32 each
    counts = torch.bincount(pos.flatten(), minlength=32).float()
    assert (counts / 1000 - 1).abs().max() < 0.1
    assert not torch.equal(pos[0], pos[1])  # a subset per sequence


def tiny(**kw):
    return TransformerConfig(**{**dict(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32,
                                       pos_encoding='rope'), **kw})


def test_randomized_positions_in_training_only():
    torch.manual_seed(0)
    plain = Transformer(tiny())
    randomized = Transformer(tiny(rope_random=4))
    randomized.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 64, (3, 16))
    plain.eval(), randomized.eval()
    assert torch.equal(plain(idx, idx)[1], randomized(idx, idx)[1])  # evaluation: positions 0..T-1
    randomized.train()
    torch.manual_seed(5)
    cos, sin = randomized.rope(idx, 0)
    torch.manual_seed(5)
    pos = random_positions(3, 16, 64, 'cpu')
    for a, b in zip((cos, sin), rope_cos_sin(pos, rope_frequencies(16, 10000.0, 'cpu')[0])):
        assert a.shape == (3, 1, 16, 16) and torch.equal(a, b)
    plain.train()
    assert not torch.equal(plain(idx, idx)[1], randomized(idx, idx)[1])


def test_log_length_temperature():
    """s = max(1, log(t+1) / log(L)): the model is unchanged up to its training length L, and beyond
    it the queries are scaled by exactly that."""
    torch.manual_seed(0)
    plain = Transformer(tiny(pos_encoding='nope')).eval()
    scaled = Transformer(tiny(pos_encoding='nope', attn_scale='log_length')).eval()
    scaled.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 64, (2, 48))
    assert torch.equal(plain.position_losses(idx[:, :16], idx[:, :16]),
                       scaled.position_losses(idx[:, :16], idx[:, :16]))
    assert not torch.equal(plain.position_losses(idx, idx)[:, 16:],
                           scaled.position_losses(idx, idx)[:, 16:])
    s = scaled.layers[0].attn.query_scale(torch.zeros(1, 48, 32), 0).flatten()
    expect = torch.tensor([max(1.0, math.log(t + 1) / math.log(16)) for t in range(48)])
    torch.testing.assert_close(s, expect)
    assert (s[:16] == 1).all() and s[16] > 1


def test_drope_is_cpt_without_positions(tiny_data, tmp_path):
    """DroPE: CPT of a RoPE model with pos_encoding='nope' (the weights fit); without the key, CPT
    keeps the source's positions."""
    args = [*TINY, f'--data_dir={tiny_data}', '--max_tokens=2048',
            "--pos_encoding=['rope', 'nope']"]
    assert run_train(*args, f'--out_dir={tmp_path}/a').returncode == 0
    source = f'{tmp_path}/a/ckpt_000008.pt'
    r = run_train(*CPT, f'--data_dir={tiny_data}', '--max_tokens=1024', f'--init_from={source}',
                  '--pos_encoding=nope', f'--out_dir={tmp_path}/drope')
    assert r.returncode == 0, r.stderr
    drope = torch.load(f'{tmp_path}/drope/ckpt_000004.pt', weights_only=True)
    assert drope['model_args']['pos_encoding'] == 'nope' and drope['cpt_from'] == source
    r = run_train(*CPT, f'--data_dir={tiny_data}', '--max_tokens=1024', f'--init_from={source}',
                  f'--out_dir={tmp_path}/b')
    assert r.returncode == 0, r.stderr
    assert torch.load(f'{tmp_path}/b/ckpt_000004.pt',
                      weights_only=True)['model_args']['pos_encoding'] == ['rope', 'nope']
    code, said = run_script('train.py', *CPT, f'--data_dir={tiny_data}', '--max_tokens=1024',
                            f'--init_from={source}', '--pos_encoding=learned',
                            f'--out_dir={tmp_path}/c')
    assert code != 0 and "sets pos_encoding = 'learned'" in said
