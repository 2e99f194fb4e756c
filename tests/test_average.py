"""average_ckpts.py: the exact mean, the identity, checkpoint files of both models and sharded
weights folders, the selection of steps, and nothing written on a mismatch."""

import json
import os
from dataclasses import asdict

import pytest
import torch

import average_ckpts
import checkpoint
from conftest import run_script
from mamba import Mamba2, Mamba2Config
from model import Transformer, TransformerConfig
from weights import save_smollm3

TINY = dict(n_layer=2, n_head=2, n_embd=16, vocab_size=260, block_size=32, pos_encoding='nape')


def write_ckpt(path, seed, model_type='transformer', dtype=torch.float32, **changes):
    torch.manual_seed(seed)
    cls, config = ((Transformer, TransformerConfig) if model_type == 'transformer'
                   else (Mamba2, Mamba2Config))
    args = ({**TINY, **changes} if model_type == 'transformer'
            else dict(n_layer=2, n_embd=32, d_state=8, headdim=8, vocab_size=260, chunk_size=8,
                      **changes))
    model = cls(config(**args))
    state = {k: v.to(dtype) for k, v in model.state_dict().items()}
    checkpoint.save({'model': state, 'model_type': model_type, 'model_args': asdict(model.config),
                     'tokenizer': {'kind': 'byte'}, 'step': seed, 'config': {'block_size': 32}},
                    str(path))
    return state


def run(*args):
    """python average_ckpts.py *args, in this process -> (exit code, its one-line refusal or '')."""
    return run_script('average_ckpts.py', *args)


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_mean_of_two_is_exact(tmp_path, dtype):
    a = write_ckpt(tmp_path / 'a.pt', 1, dtype=dtype)
    b = write_ckpt(tmp_path / 'b.pt', 2, dtype=dtype)
    avg = average_ckpts.average([str(tmp_path / 'a.pt'), str(tmp_path / 'b.pt')])
    assert avg.keys() == a.keys()
    for k in a:  # the correctly rounded mean, in the stored dtype
        assert (avg[k].dtype == dtype
                and torch.equal(avg[k], ((a[k].double() + b[k].double()) / 2).to(dtype))), k


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
@pytest.mark.parametrize('K', [1, 3, 10])
def test_one_checkpoint_K_times_is_the_identity(tmp_path, dtype, K):
    a = write_ckpt(tmp_path / 'a.pt', 1, dtype=dtype)
    avg = average_ckpts.average([str(tmp_path / 'a.pt')] * K)
    assert all(torch.equal(avg[k], a[k]) for k in a)


def test_mean_of_many_and_non_float_tensors_from_the_newest(tmp_path):
    paths, states = [], []
    for i in range(4):
        states.append(write_ckpt(tmp_path / f'{i}.pt', i))
        ckpt = dict(checkpoint.load(str(tmp_path / f'{i}.pt')))
        # a non-float buffer
        ckpt['model'] = {**ckpt['model'], 'counter': torch.tensor([i, 10 * i])}
        checkpoint.save(ckpt, str(tmp_path / f'{i}.pt'))
        paths.append(str(tmp_path / f'{i}.pt'))
    avg = average_ckpts.average(paths)
    assert torch.equal(avg['counter'], torch.tensor([3, 30]))
    for k in states[0]:
        assert torch.allclose(avg[k], torch.stack([s[k] for s in states]).mean(0), atol=1e-7)


def test_script_averages_the_last_K_and_every_eval_script_loads_it(tmp_path):
    run_dir = tmp_path / 'run'
    run_dir.mkdir()
    states = {s: write_ckpt(run_dir / f'ckpt_{s:06d}.pt', s) for s in (10, 20, 30, 40)}
    r = run(f'--ckpt_dir={run_dir}', '--last=2')
    assert r[0] == 0, r[1]
    out = run_dir / 'avg2_000030-000040.pt'
    model, tok, info = checkpoint.load_model(str(out))
    assert info['averaged_steps'] == [30, 40] and info['step'] == 40 and tok is not None
    for k, v in model.state_dict().items():
        assert torch.equal(v, ((states[30][k].double() + states[40][k].double()) / 2).float())
    # the average is not mistaken for a step
    assert checkpoint.steps(str(run_dir)) == [10, 20, 30, 40]
    # every other one, counted back from the newest; a step range; explicit steps
    assert checkpoint.select(str(run_dir), 2, 2, 0, -1) == [20, 40]
    assert checkpoint.select(str(run_dir), 0, 1, 15, 35) == [20, 30]
    r = run(f'--ckpt_dir={run_dir}', '--steps=[10, 40]', f'--out={tmp_path}/x.pt')
    assert r[0] == 0 and checkpoint.load(str(tmp_path / 'x.pt'))['averaged_steps'] == [10, 40]


def test_mamba2_checkpoints(tmp_path):
    a = write_ckpt(tmp_path / 'a.pt', 1, 'mamba2')
    b = write_ckpt(tmp_path / 'b.pt', 2, 'mamba2')
    r = run(f"--ckpts=['{tmp_path}/a.pt', '{tmp_path}/b.pt']")
    assert r[0] == 0, r[1]
    model, _, _ = checkpoint.load_model(str(tmp_path / 'b_avg2.pt'))  # beside the newest
    assert isinstance(model, Mamba2)
    assert all(torch.equal(v, ((a[k].double() + b[k].double()) / 2).float())
               for k, v in model.state_dict().items())


def test_sharded_weights_folders_in_and_out(tmp_path):
    cfg = dict(TINY, pos_encoding=['rope', 'nope'], mlp='swiglu', norm='rmsnorm', bias=False)
    models = []
    for i in range(3):
        torch.manual_seed(i)
        models.append(Transformer(TransformerConfig(**cfg)))
        save_smollm3(models[-1], str(tmp_path / f'hf{i}'), shard_bytes=4000, dtype=torch.bfloat16)
    shards = sorted(f for f in os.listdir(tmp_path / 'hf2') if f.endswith('.safetensors'))
    assert len(shards) > 2
    r = run(f"--ckpts={[str(tmp_path / f'hf{i}') for i in range(3)]}", f'--out={tmp_path}/avg')
    assert r[0] == 0, r[1]
    assert (sorted(os.listdir(tmp_path / 'avg'))
            == sorted(os.listdir(tmp_path / 'hf2') + ['averaged.json']))
    avg, _, _ = checkpoint.load_model(str(tmp_path / 'avg'))
    for k, v in avg.state_dict().items():
        mean = sum(m.state_dict()[k].to(torch.bfloat16).float() for m in models) / 3
        assert torch.equal(v, mean.to(torch.bfloat16).float()), k
    assert not os.path.exists(tmp_path / 'avg.tmp')
    r = run(f"--ckpts={[str(tmp_path / f'hf{i}') for i in range(2)]}", f'--out={tmp_path}/avg')
    assert r[0] == 1 and 'an earlier output of average_ckpts.py' in r[1]  # unasked: no
    r = run(f"--ckpts={[str(tmp_path / f'hf{i}') for i in range(2)]}", f'--out={tmp_path}/avg',
            '--overwrite=True')
    assert r[0] == 0, r[1]
    assert (json.loads((tmp_path / 'avg' / 'averaged.json').read_text())['averaged_from'][-1]
            .endswith('hf1'))
    assert sorted(os.listdir(tmp_path)) == ['avg', 'hf0', 'hf1', 'hf2']  # no .tmp or .old left


def test_mismatches_raise_and_write_nothing(tmp_path):
    write_ckpt(tmp_path / 'a.pt', 1)
    write_ckpt(tmp_path / 'wide.pt', 2, n_embd=32)
    write_ckpt(tmp_path / 'm.pt', 3, 'mamba2')
    with pytest.raises(ValueError, match='n_embd'):
        average_ckpts.average([str(tmp_path / 'a.pt'), str(tmp_path / 'wide.pt')])
    with pytest.raises(ValueError, match='model_type'):
        average_ckpts.average([str(tmp_path / 'a.pt'), str(tmp_path / 'm.pt')])
    ckpt = dict(checkpoint.load(str(tmp_path / 'a.pt')))
    ckpt['model'] = {k: v for k, v in ckpt['model'].items() if k != 'lm_head.weight'}
    checkpoint.save(ckpt, str(tmp_path / 'missing.pt'))
    with pytest.raises(ValueError, match='lm_head.weight'):
        average_ckpts.average([str(tmp_path / 'a.pt'), str(tmp_path / 'missing.pt')])
    ckpt['model'] = {**ckpt['model'], 'lm_head.weight': torch.zeros(260, 8)}
    checkpoint.save(ckpt, str(tmp_path / 'shape.pt'))
    with pytest.raises(ValueError, match='shape'):
        average_ckpts.average([str(tmp_path / 'a.pt'), str(tmp_path / 'shape.pt')])
    r = run(f"--ckpts=['{tmp_path}/a.pt', '{tmp_path}/wide.pt']", f'--out={tmp_path}/avg.pt')
    assert r[0] != 0 and 'nothing written' in r[1] and 'n_embd' in r[1]
    # fewer checkpoints than asked for
    run_dir = tmp_path / 'run'
    run_dir.mkdir()
    for s in (10, 20):
        write_ckpt(run_dir / f'ckpt_{s:06d}.pt', s)
    r = run(f'--ckpt_dir={run_dir}', '--last=3')
    assert r[0] != 0 and 'fewer than the 3' in r[1]
    r = run(f'--ckpt_dir={run_dir}', '--last=0', '--start=30')
    assert r[0] != 0 and 'no checkpoints' in r[1]
    r = run(f'--ckpt_dir={run_dir}', '--steps=[10, 30]')
    assert r[0] != 0 and 'ckpt_000030.pt' in r[1]
    assert sorted(os.listdir(run_dir)) == ['ckpt_000010.pt', 'ckpt_000020.pt']
    assert not os.path.exists(tmp_path / 'avg.pt')
