"""FLOP counting against hand counts, the GPU peak table (hardware.py), and tools/bench.py's modes
on a tiny model."""

import subprocess
import sys

import pytest
import torch

from tools import timing
import hardware
from conftest import ROOT
from mamba import Mamba2, Mamba2Config
from model import Transformer, TransformerConfig


def test_transformer_flops_by_hand():
    m = Transformer(TransformerConfig(n_layer=2, n_head=2, n_embd=16, vocab_size=64, window=[0, 8],
                                      pos_encoding='nape'))
    # per layer: q, k, v, o 4 * 16 * 16 = 1024; MLP 16 * 64 * 2 = 2048; two RMSNorm gains 32
    # -> 3104; two layers and the final norm 6224; the tied head multiplies 64 * 16 = 1024 more
    weights = 2 * (4 * 16 * 16 + 2 * 16 * 64 + 2 * 16) + 16 + 64 * 16
    # attention at T = 32: 12 * H * hd * keys, all 32 keys in layer 0, the 8 of its window
    # in layer 1
    attn = 12 * 2 * 8 * 32 + 12 * 2 * 8 * 8
    assert m.flops_per_token(32) == 6 * weights + attn == 6 * 7248 + 7680
    # a window longer than the context
    assert m.flops_per_token(4) == 6 * 7248 + 12 * 2 * 8 * (4 + 4)


def test_mamba2_flops_by_hand():
    m = Mamba2(Mamba2Config(n_layer=1, n_embd=32, expand=2, headdim=16, d_state=8, ngroups=1,
                            d_conv=4, chunk_size=8, vocab_size=64))
    # d_inner 64, 4 heads; in_proj 32 -> z, x (64 each), B, C (8 each), dt (4): 32 * 148
    # depthwise conv over x, B, C (80 channels) with bias: 80 * 4 + 80; dt_bias, A_log, D: 3 * 4;
    # gated norm 64; out_proj 64 * 32; block norm 32; final norm 32; the tied head 64 * 32
    weights = 32 * 148 + 80 * 4 + 80 + 3 * 4 + 64 + 64 * 32 + 32 + 32 + 64 * 32
    # the scan per head: Q (N + P) inside a chunk, 2 N P for the states: 8 * (8 + 16) + 2 * 8 * 16
    scan = 4 * (8 * (8 + 16) + 2 * 8 * 16)
    assert m.flops_per_token(1024) == 6 * weights + 6 * scan == 6 * 9372 + 6 * 1792


@pytest.mark.parametrize('name,peak', [('NVIDIA H200', 989e12), ('NVIDIA H100 80GB HBM3', 989e12),
                                       ('NVIDIA H100 PCIe', 756e12), ('NVIDIA H100 NVL', 835e12),
                                       ('NVIDIA H200 NVL', 835e12), ('NVIDIA A10G', None),
                                       ('Some Future GPU', None)])
def test_peak_flops(monkeypatch, name, peak):
    """By the exact name: a PCIe or NVL card is not the SXM part, an A10G not an A10."""
    assert hardware.peak_flops('cpu') == ('cpu', None)
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda d=None: name)
    assert hardware.peak_flops('cuda:0') == (name, peak)


def test_nanogpt_yardstick_has_the_size_of_model_py_configured_as_nanogpt():
    ours = Transformer(TransformerConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=64,
                                         block_size=16, pos_encoding='learned', norm='layernorm',
                                         bias=True, mlp='gelu'))
    plain = timing.NanoGPT(64, 16, 2, 2, 32)
    assert sum(p.numel() for p in plain.parameters()) == sum(p.numel() for p in ours.parameters())
    assert plain.flops_per_token(16) == ours.flops_per_token(16)  # counted alike
    idx = torch.randint(0, 64, (2, 16))
    logits, loss = plain(idx, idx)
    assert (logits.shape == (2, 16, 64)
            and abs(loss.item() - torch.log(torch.tensor(64.0)).item()) < 0.5)


@pytest.mark.parametrize('mode,rows', [
    ('train', ['none', 'pre_norm', 'pre_linear', 'vpad', 'attn_dropout']),
    ('nanogpt', ['nanoGPT', 'model.py as nanoGPT', 'model.py, nape']),
    ('methods', ['RoPE', 'PL-D', 'RandPos', 'SSMax', "NoPE (DroPE's CPT)"])])
def test_bench_script(mode, rows):
    """A smoke test: each mode runs and prints its rows (the timing itself:
    test_timed_measures_each_function)."""
    r = subprocess.run([sys.executable, '-m', 'tools.bench', f'--mode={mode}', '--n_layer=1',
                        '--n_embd=32', '--n_head=2', '--batch_size=2', '--block_size=16',
                        '--steps=1', '--rounds=1', '--warmup=1'],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    for name in rows:
        line = next(l for l in lines
                    if l.strip().startswith(name + ' ') or l.strip().split('  ')[0] == name)
        assert float(line.split()[-1]) > 0  # the ratio to the first row


def test_timed_measures_each_function():
    """timing.timed: the median time of each function over alternating rounds; a function that
    takes three times as long is timed so (a timer that returned a constant would give 1)."""
    import time
    secs = timing.timed({'fast': lambda n: time.sleep(0.01 * n),
                         'slow': lambda n: time.sleep(0.03 * n)},
                       steps=2, warmup=1, rounds=3)
    assert 2 < secs['slow'] / secs['fast'] < 4 and 0.02 <= secs['fast'] < 0.05


def test_context_mode_fails_when_a_measuring_process_does(tmp_path):
    """A child that fails (here: learned positions asked past block_size, as an out-of-memory
    would) makes tools/bench.py exit non-zero with the child's error, instead of waiting forever."""
    args = [sys.executable, '-m', 'tools.bench', '--mode=context', '--n_layer=1', '--n_embd=32',
            '--n_head=2', '--gen_tokens=2', '--prefill_chunk=16', '--context_window=8']
    r = subprocess.run([*args, '--context_lengths=[32]'], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    # one row per model
    assert len([l for l in r.stdout.splitlines() if l.split()[-6:-5] == ['32']]) == 3
    r = subprocess.run([*args, '--context_lengths=[32]', '--pos_encoding=learned',
                        '--block_size=16'],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (r.returncode != 0 and 'the measuring process failed' in r.stderr
            and 'learned absolute positions' in r.stderr)
