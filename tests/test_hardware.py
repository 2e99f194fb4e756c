"""hardware.py's memory estimate against what a training step saves for its backward, measured
on CPU."""

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
    probabilities too, so the softmax models are not compared here: on CUDA their fused kernels
    keep none)."""
    torch.manual_seed(0)
    m = Transformer(TransformerConfig(vocab_size=61, n_layer=2, n_head=4, n_embd=32, attn_alpha=1.5,
                                      attn_scale='adaptive'))
    est = hardware.memory_estimate(m, B, T, bf16, device_type='cpu')  # written out, as measured
    measured = saved_bytes(m.train(), B, T, bf16)
    assert abs(est['activations'] + est['attention'] + est['logits'] - measured) < 0.25 * measured
    assert est['attention'] > 0.5 * measured
    # on CUDA attention_triton's kernel keeps none of them
    assert hardware.memory_estimate(m, B, T, bf16)['attention'] == 0


def compiled_saved_bytes(m, B, T, bf16):
    """Bytes of the tensors a compiled training step saves for its backward: the outputs of
    the forward graph that Inductor's partitioner (min-cut rematerialisation) hands to the
    backward, without the graph's inputs (the weights, the tokens)."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    saved = []

    def forward_graph(g, inputs):  # its outputs: the loss, then what the backward takes
        outputs = next(n for n in g.graph.nodes if n.op == 'output').args[0]
        saved.extend(n.meta['val'] for n in outputs[1:]
                     if n is not None and n.op != 'placeholder')
        return g

    def backend(gm, inputs):
        return aot_module_simplified(gm, inputs, fw_compiler=forward_graph,
                                     bw_compiler=lambda g, inputs: g,
                                     partition_fn=min_cut_rematerialization_partition)
    idx = torch.randint(0, m.config.vocab_size, (B, T))
    with torch.autocast('cpu', torch.bfloat16, enabled=bf16):
        torch.compile(m, backend=backend, fullgraph=True)(idx, idx)
    torch._dynamo.reset()
    return sum(t.numel() * t.element_size() for t in saved if isinstance(t, torch.Tensor))


@pytest.mark.parametrize('bf16', [False, True])
@pytest.mark.parametrize('dropout_type,attn_dropout', [('none', 0.0), ('pre_norm', 0.0),
                                                       ('pre_linear', 0.0), ('vpad', 0.0),
                                                       ('none', 0.1)])
def test_estimate_within_5_percent_of_what_a_compiled_step_saves(dropout_type, attn_dropout,
                                                                  bf16):
    """The activation terms of the estimate (and the saved log-probabilities of the logits term)
    against what AOTAutograd saves for the backward of a compiled step on CPU, for every dropout
    type, float32 and bf16 autocast: within 5% (a PN-D step without its two masks, or PL-D
    without its seven, is further). The model is SmolLM3's kind (SwiGLU, grouped-query) with RoPE
    and full attention, which SDPA's fused kernel takes on CPU as flash and flex do on GPUs;
    attention dropout sends CPU to the math kernel, which keeps the T x T probabilities."""
    torch.manual_seed(0)
    m = Transformer(TransformerConfig(vocab_size=64, n_layer=2, n_head=4, n_kv_head=2,
                                      n_embd=64, mlp='swiglu', pos_encoding='rope',
                                      dropout_type=dropout_type,
                                      dropout=0.1 if dropout_type != 'none' else 0.0,
                                      attn_dropout=attn_dropout))
    B, T = 2, 256
    est = hardware.memory_estimate(m, B, T, bf16, device_type='cpu')
    measured = compiled_saved_bytes(m.train(), B, T, bf16)
    assert abs(est['activations'] + est['attention'] + 4 * B * T * 64 - measured) < 0.05 * measured


@pytest.mark.parametrize('variant', ['wd', 'pn_d', 'pl_d', 'vpad'])
def test_asentmax_paper_configs_fit_80_gb(variant):
    """configs/asentmax_*.py on the meta device: under 80 GB per GPU, bf16, no activation
    checkpointing, fused or written out (written out at the former micro-batch of 16 the
    probabilities alone were 116 GB)."""
    scope = {}
    exec(open(os.path.join(ROOT, 'configs', f'asentmax_{variant}.py')).read(), scope)
    args = {k: scope[k] for k in TransformerConfig.__dataclass_fields__ if k in scope}
    with torch.device('meta'):
        fused = Transformer(TransformerConfig(**args, vocab_size=50304))
        written = Transformer(TransformerConfig(**args, vocab_size=50304, attn_backend='manual'))
    per_micro = scope['batch_size'] * scope['block_size'] * 8  # 8 GPUs
    # the step's tokens unchanged, in more micro-steps
    assert scope['tokens_per_batch'] % per_micro == 0
    for m in (fused, written):
        total = sum(hardware.memory_estimate(m, scope['batch_size'], scope['block_size'],
                                             bf16=True).values())
        assert total < 80e9
    assert hardware.memory_estimate(written, 16, 2048, bf16=True)['attention'] > 100e9
    assert hardware.memory_estimate(fused, 16, 2048, bf16=True)['attention'] == 0


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
    full layers a buffer of every position, a windowed layer its last W - 1 as a view of the last
    concatenation (W - 1 + chunk positions). The model is built on meta for the estimate, as
    tools/gpu_check.py does."""
    args = dict(vocab_size=61, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, window=[window, 0])
    torch.manual_seed(0)
    m = Transformer(TransformerConfig(**args)).eval()
    L, chunk = 96, 16
    cache = m.new_cache(L)  # as model.generate and timing.context_times make it
    with torch.no_grad():
        for s in range(0, L, chunk):
            m.hidden(torch.randint(0, 61, (1, chunk)), cache)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in [*cache.k.values(), *cache.v.values()]}
    with torch.device('meta'):
        shape = Transformer(TransformerConfig(**args))
    est = hardware.inference_estimate(shape, L, chunk, bf16=False)
    assert est['cache'] == sum(storages.values())
    assert est['weights'] == 4 * m.num_params(False)


def config(name):
    """A config file's keys, as train.py reads them (configs import each other)."""
    import runpy
    return runpy.run_path(os.path.join(ROOT, 'configs', name))


PAPER_CONFIGS = ['wd', 'no_wd', 'pn_d', 'pl_d', 'vpad', 'asentmax_wd', 'asentmax_pn_d',
                 'asentmax_pl_d', 'asentmax_vpad', 'smollm3_wd', 'smollm3_no_wd', 'smollm3_pn_d',
                 'smollm3_pl_d', 'smollm3_vpad', 'smollm3_attn_dropout', 'mamba2_1b3_wd',
                 'mamba2_1b3_no_wd', 'mamba2_1b3_pn_d', 'mamba2_85m']


def paper_model(name, c):
    """The shape a paper config trains, on the meta device: SmolLM3-3B's from transformers'
    SmolLM3Config as released, Mamba2-1.3B's from state-spaces/mamba2-1.3b's config.json (48 x
    2048), the others from the config's own keys."""
    from mamba import Mamba2, Mamba2Config
    run = {k: c[k] for k in ('dropout_type', 'dropout', 'attn_dropout', 'window') if k in c}
    with torch.device('meta'):
        if name.startswith('smollm3'):
            transformers = pytest.importorskip('transformers')
            from weights import smollm3_args
            args = smollm3_args(transformers.SmolLM3Config(
                rope_parameters={'rope_theta': 5e6, 'rope_type': 'default'}).to_dict())
            return Transformer(TransformerConfig(**{**args, **run}))
        if name.startswith('mamba2_1b3'):
            run.pop('window', None)
            return Mamba2(Mamba2Config(n_layer=48, n_embd=2048, vocab_size=50288, **run))
        if name.startswith('mamba2'):
            return Mamba2(Mamba2Config(**{k: c[k] for k in Mamba2Config.__dataclass_fields__
                                          if k in c}))
        args = {k: c[k] for k in TransformerConfig.__dataclass_fields__ if k in c}
        return Transformer(TransformerConfig(**args, vocab_size=50304))


@pytest.mark.parametrize('name', PAPER_CONFIGS)
def test_plan_of_the_paper_runs_on_meta(name, tmp_path):
    """hardware.plan and the memory line as train.py prints them, for every paper config on the
    meta device, 8 GPUs: PaLM's FLOPs over every token, GPU-hours at PLAN_MFU, 4 bytes a
    parameter per checkpoint and 8 more (4 per running average) per optimizer state; the run is
    refused when what it keeps cannot fit the free space; each fits the 79 GiB an 80 GB H100
    gives. The lines for vpad and smollm3_pl_d are the figures docs/performance.md quotes."""
    c = config(f'{name}.py')
    m = paper_model(name, c)
    steps = int(c['max_tokens'] // c['tokens_per_batch'])
    saves = len(set(range(c['ckpt_interval'], steps, c['ckpt_interval'])) | {steps})
    n, averages = m.num_params(False), len(c.get('average_last', []))
    line, error = hardware.plan(m, c['block_size'], steps * c['tokens_per_batch'], n, saves,
                                c.get('keep_last', 0), averages, str(tmp_path / 'run'),
                                free=2 ** 50)
    fsdp, micro = c.get('parallel') == 'fsdp', c['batch_size'] * c['block_size'] * 8
    memory = [m, c['batch_size'], c['block_size'], True, c.get('activation_checkpointing', False),
              8 if fsdp else 1, fsdp and c['tokens_per_batch'] > micro]
    print(f"{name}: {line}\n{name}: {hardware.describe_memory(*memory, averages=averages)}")
    flops = m.flops_per_token(c['block_size']) * steps * c['tokens_per_batch']
    assert line.startswith(f"plan: {flops:.3g} training FLOPs, "
                           f"{flops / 989e12 / 0.35 / 3600:,.3g} GPU-hours on H100")
    keep = c.get('keep_last', 0)
    kept_ckpts, optim = min(keep, saves) if keep else saves, (8 + 4 * averages) * n
    kept = kept_ckpts * 4 * n + 2 * optim
    # a save holds its new pair beside the old ones; the averages are written at the end
    peak = max(min(kept_ckpts + 1, saves) * 4 * n + 3 * optim, kept + averages * 4 * n)
    assert f"({kept / 2 ** 30:,.3g} GB)" in line and error is None
    assert f"; at most {peak / 2 ** 30:,.3g} GB on the disk at once; " in line
    if name == 'smollm3_pl_d':  # 1 kept: 11.5 + 2 x 57.3 GB; at a save 2 x 11.5 + 3 x 57.3
        assert '(126 GB) and 3 averages; at most 195 GB on the disk at once' in line
    _, error = hardware.plan(m, c['block_size'], 1, n, saves, keep, averages,
                             str(tmp_path / 'run'), free=peak - 1)
    assert isinstance(error, SystemExit) and 'raise ckpt_interval, set keep_last' in str(error)
    assert sum(hardware.memory_estimate(*memory, averages=averages).values()) < 79 * 2 ** 30


def test_running_averages_count_in_the_states():
    """train.py's average_last keeps a float32 sum per average: 4 bytes a parameter each, sharded
    by FSDP like the rest of the states."""
    with torch.device('meta'):
        m = Transformer(TransformerConfig(vocab_size=64, n_layer=2, n_head=4, n_embd=32))
    n = m.num_params(False)
    assert hardware.memory_estimate(m, 2, 32, True, fsdp_world=4, averages=3)['states'] == 7 * n


@pytest.mark.parametrize('name', PAPER_CONFIGS)
def test_dry_run_prints_the_plan_of_every_paper_config(name, tmp_path):
    """train.py configs/<paper config>.py --dry_run=True: the memory of each of 8 processes and
    the plan, as the meta-device shape above gives them, with no data, weights or GPU (a CPT
    source's shape from the release its folder names: weights.RELEASED), and nothing written."""
    from conftest import run_train
    c = config(f'{name}.py')
    m = paper_model(name, c)
    steps = int(c['max_tokens'] // c['tokens_per_batch'])
    flops = m.flops_per_token(c['block_size']) * steps * c['tokens_per_batch']
    out = tmp_path / 'run'
    r = run_train(f'configs/{name}.py', '--dry_run=True', f'--out_dir={out}', '--device=cpu')
    assert r.returncode == 0, r.stderr[-2000:]
    assert 'dry run, 8 processes: memory per process (estimate): ' in r.stdout
    assert f"plan: {flops:.3g} training FLOPs" in r.stdout and 'on the disk at once' in r.stdout
    assert not out.exists()


def test_a_new_dropout_type_is_counted_without_an_edit_here():
    """A fork's new placement, dropout on every projection's output ('post_linear'), built from
    dropout.py's operator and its sites alone: the estimate counts its masks from the calls the
    model makes (dropout_bytes), within 5% of what a compiled step saves, as the paper's types;
    the site tests see its operators too. (Counted by name, its masks were left out: 12.6% low.)"""
    import dropout
    from test_model import dropout_sites
    torch.manual_seed(0)
    m = Transformer(TransformerConfig(vocab_size=64, n_layer=2, n_head=4, n_kv_head=2, n_embd=64,
                                      mlp='swiglu', pos_encoding='rope'))
    for block in m.layers:
        for sub in (block.attn, block.mlp):
            for name, lin in list(sub.named_children()):
                if isinstance(lin, torch.nn.Linear):  # the sites: every projection's output
                    setattr(sub, name, torch.nn.Sequential(lin, dropout.Dropout(0.1)))
    calls = dropout_sites(m, torch.randint(0, 64, (2, 16)))
    assert len(calls) == 14 and all(changed for _, _, changed in calls)
    B, T = 2, 256
    for bf16 in (False, True):
        est = hardware.memory_estimate(m, B, T, bf16, device_type='cpu')
        measured = compiled_saved_bytes(m.train(), B, T, bf16)
        assert abs(est['activations'] + est['attention'] + 4 * B * T * 64 - measured) \
            < 0.05 * measured, (est, measured)
