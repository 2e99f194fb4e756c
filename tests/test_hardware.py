"""hardware.py's memory estimate against what a training step saves for its backward, measured on CPU."""

import os

import pytest
import torch

import hardware
from conftest import ROOT
from model import Transformer, TransformerConfig


def saved_bytes(m, B, T, bf16):
    """Bytes of the distinct storages autograd saves in one training forward."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    idx = torch.randint(0, m.config.vocab_size, (B, T))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast('cpu', torch.bfloat16, enabled=bf16):
        m(idx, idx)[1].backward()
    return sum(storages.values())


@pytest.mark.parametrize('bf16', [True, False])
@pytest.mark.parametrize('B,T', [(2, 512), (4, 256)])
def test_asentmax_estimate_within_a_quarter_of_the_saved_tensors(B, T, bf16):
    """The ASEntmax model: its T x T probabilities are most of what a step keeps (entmax's
    float32 output, and its bf16 copy for p @ v). The activation terms of the estimate are
    within 25% of the bytes autograd saves on CPU (there SDPA's math kernel keeps its
    probabilities too, so the softmax models are not compared here: on CUDA their fused kernels keep none)."""
    torch.manual_seed(0)
    m = Transformer(TransformerConfig(vocab_size=61, n_layer=2, n_head=4, n_embd=32, attn_alpha=1.5, attn_scale='adaptive'))
    est = hardware.memory_estimate(m, B, T, bf16)
    measured = saved_bytes(m.train(), B, T, bf16)
    assert abs(est['activations'] + est['attention'] + est['logits'] - measured) < 0.25 * measured
    assert est['attention'] > 0.5 * measured


@pytest.mark.parametrize('variant', ['wd', 'pn_d', 'pl_d', 'vpad'])
def test_asentmax_paper_configs_fit_80_gb(variant):
    """configs/asentmax_*.py on the meta device: under 80 GB per GPU, bf16, no activation
    checkpointing (at the former micro-batch of 16 the probabilities alone were 116 GB)."""
    scope = {}
    exec(open(os.path.join(ROOT, 'configs', f'asentmax_{variant}.py')).read(), scope)
    args = {k: scope[k] for k in TransformerConfig.__dataclass_fields__ if k in scope}
    with torch.device('meta'):
        m = Transformer(TransformerConfig(**args, vocab_size=50304))
    per_micro = scope['batch_size'] * scope['block_size'] * 8  # 8 GPUs
    assert scope['tokens_per_batch'] % per_micro == 0  # the step's tokens unchanged, in more micro-steps
    total = sum(hardware.memory_estimate(m, scope['batch_size'], scope['block_size'], bf16=True).values())
    assert total < 80e9 and hardware.memory_estimate(m, 16, 2048, bf16=True)['attention'] > 100e9


def test_fsdp_states_count_the_unsharded_gradients_of_no_sync_micro_steps():
    """Under FSDP the states are sharded (16 bytes a parameter / world), but across no-sync
    micro-steps every process holds the whole float32 gradient (4 bytes a parameter)."""
    with torch.device('meta'):
        m = Transformer(TransformerConfig(vocab_size=64, n_layer=2, n_head=4, n_embd=32))
    n = m.num_params(False)
    assert hardware.memory_estimate(m, 2, 32, True)['states'] == 16 * n
    assert hardware.memory_estimate(m, 2, 32, True, fsdp_world=4)['states'] == 4 * n
    assert hardware.memory_estimate(m, 2, 32, True, fsdp_world=4, no_sync=True)['states'] == 8 * n


@pytest.mark.parametrize('window', [0, 24])
def test_inference_estimate_counts_what_the_kv_cache_holds(window):
    """The cache term equals the bytes of the storages a KV cache holds after a chunked prefill:
    full layers every position, a windowed layer its last W - 1 as a view of the last concatenation
    (W - 1 + chunk positions). The model is built on meta for the estimate, as tools/gpu_check.py does."""
    args = dict(vocab_size=61, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, window=[window, 0])
    torch.manual_seed(0)
    m = Transformer(TransformerConfig(**args)).eval()
    L, chunk = 96, 16
    cache = m.new_cache()
    with torch.no_grad():
        for s in range(0, L, chunk):
            m.hidden(torch.randint(0, 61, (1, chunk)), cache)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in [*cache.k.values(), *cache.v.values()]}
    with torch.device('meta'):
        shape = Transformer(TransformerConfig(**args))
    est = hardware.inference_estimate(shape, L, chunk, bf16=False)
    assert est['cache'] == sum(storages.values())
    assert est['weights'] == 4 * m.num_params(False)
