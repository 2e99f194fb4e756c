"""train.py end to end on a tiny model: checkpoints, exact resume, CPT, schedules, DDP, errors."""

import glob
import os
import subprocess
import sys

import pytest
import torch

import checkpoint
from conftest import ROOT, TINY, read_log, run_train


@pytest.fixture(scope='module')
def straight(tiny_data, tmp_path_factory):
    """8 iterations straight through, checkpoints at 4 and 8."""
    out = str(tmp_path_factory.mktemp('straight'))
    r = run_train(*TINY, f'--data_dir={tiny_data}', f'--out_dir={out}', '--dropout_type=vpad', '--dropout=0.1',
                  '--anneal_frac=0.5')
    assert r.returncode == 0, r.stderr
    return out, r.stdout


def test_checkpoints_log_and_table(straight):
    out, stdout = straight
    assert checkpoint.steps(out) == [4, 8] and checkpoint.steps(out, 'optim') == [8]  # every model kept, newest optimizer
    model, tok, ckpt = checkpoint.load_model(checkpoint.step_path(out, 8))
    assert ckpt['step'] == 8 and ckpt['model_type'] == 'transformer' and tok.spec == {'kind': 'byte'}
    assert ckpt['config']['dropout_type'] == 'vpad' and ckpt['config']['eval_lengths'] == [32, 64]
    assert not any(k.startswith(('_orig_mod.', 'module.')) for k in ckpt['model'])
    assert model.config.vocab_size == 320  # 257 rounded up to a multiple of 64
    evals = read_log(out, 'eval')
    assert [e['iter'] for e in evals] == [0, 4, 8]
    assert list(evals[-1]['position_loss']) == ['16-32', '32-64']
    assert evals[-1]['val_loss'] < evals[0]['val_loss'] - 0.5  # it learns
    assert 'weight decay 0.1 on 12 tensors' in stdout and 'none on 6 tensors' in stdout  # 2 x (q,k,v,o,up,down); norms, wte
    assert '16-32' in stdout.split('per-position validation loss')[-1]  # the closing table


def test_wsd_schedule(straight):
    """2 warm-up iterations, 2 stable, then the last 4 annealed linearly down to min_lr."""
    lrs = [r['lr'] for r in read_log(straight[0])]
    assert lrs == pytest.approx([1.5e-3, 3e-3, 3e-3, 3e-3, 2.325e-3, 1.65e-3, 0.975e-3, 3e-4])


@pytest.mark.parametrize('schedule,expected', [('constant', [1.5e-3] + [3e-3] * 7),
                                               ('cosine', [1.5e-3, 3e-3, 2.8191e-3, 2.325e-3, 1.65e-3, 0.975e-3, 0.4809e-3, 3e-4])])
def test_other_schedules(tiny_data, tmp_path, schedule, expected):
    r = run_train(*TINY, f'--data_dir={tiny_data}', f'--out_dir={tmp_path}', f'--schedule={schedule}', '--eval_lengths=[]',
                  '--ckpt_interval=100')
    assert r.returncode == 0, r.stderr
    assert [r['lr'] for r in read_log(str(tmp_path))] == pytest.approx(expected, abs=2e-5)


def test_resume_repeats_the_straight_run_exactly(straight, tiny_data, tmp_path):
    args = (*TINY, f'--data_dir={tiny_data}', f'--out_dir={tmp_path}', '--dropout_type=vpad', '--dropout=0.1',
            '--anneal_frac=0.5')
    first = run_train(*args, '--halt_at=4')
    assert first.returncode == 0, first.stderr
    assert checkpoint.steps(str(tmp_path)) == [4]
    second = run_train(*args, '--init_from=resume')
    assert second.returncode == 0, second.stderr
    assert 'resuming' in second.stdout
    resumed = [(r['iter'], r['loss']) for r in read_log(str(tmp_path))]
    assert resumed == [(r['iter'], r['loss']) for r in read_log(straight[0])]  # loss for loss, bit for bit
    a = checkpoint.load(checkpoint.step_path(straight[0], 8))['model']
    b = checkpoint.load(checkpoint.step_path(str(tmp_path), 8))['model']
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_continued_pretraining_starts_from_the_weights(straight, tiny_data, tmp_path):
    source = checkpoint.step_path(straight[0], 8)
    r = run_train(*TINY, f'--data_dir={tiny_data}', f'--out_dir={tmp_path}', f'--init_from={source}',
                  '--dropout_type=pre_linear', '--dropout=0.2', '--n_embd=999', '--max_tokens=512')
    assert r.returncode == 0, r.stderr
    first_eval = read_log(str(tmp_path), 'eval')[0]
    assert first_eval['iter'] == 0
    assert first_eval['val_loss'] == read_log(straight[0], 'eval')[-1]['val_loss']  # same weights, same batches
    ckpt = checkpoint.load(checkpoint.step_path(str(tmp_path), 2))
    assert ckpt['model_args']['dropout_type'] == 'pre_linear' and ckpt['model_args']['dropout'] == 0.2
    assert ckpt['model_args']['n_embd'] == 32  # the architecture comes from the checkpoint


def test_continued_pretraining_needs_the_same_tokenizer(straight, tiny_data, tmp_path):
    ckpt = checkpoint.load(checkpoint.step_path(straight[0], 8))
    ckpt['tokenizer'] = {'kind': 'gpt2'}
    checkpoint.save(ckpt, str(tmp_path / 'gpt2.pt'))
    r = run_train(*TINY, f'--data_dir={tiny_data}', f'--out_dir={tmp_path}/cpt', f'--init_from={tmp_path}/gpt2.pt')
    assert r.returncode != 0 and "prepare the data with the checkpoint's tokenizer" in r.stderr


def test_resume_with_another_model_shape_fails_clearly(straight, tiny_data, tmp_path):
    r = run_train(*TINY, f'--data_dir={tiny_data}', f'--out_dir={straight[0]}', '--init_from=resume', '--n_embd=64')
    assert r.returncode != 0
    assert "cannot resume" in r.stderr and "n_embd: checkpoint 32 vs config 64" in r.stderr


def test_scratch_refuses_to_overwrite_a_run(straight, tiny_data):
    before = {p: os.path.getmtime(p) for p in glob.glob(os.path.join(straight[0], '*.pt'))}
    r = run_train(*TINY, f'--data_dir={tiny_data}', f'--out_dir={straight[0]}')
    assert r.returncode != 0 and '--init_from=resume' in r.stderr
    assert {p: os.path.getmtime(p) for p in glob.glob(os.path.join(straight[0], '*.pt'))} == before


@pytest.mark.parametrize('args,message', [
    (['--n_embed=64'], "unknown config key 'n_embed' (did you mean 'n_embd'?)"),
    (['--batch_size=4.5'], "batch_size must be int, got 4.5"),
    (['--data_dir=data/shakespeare/nonexistent'], "run `python data/shakespeare/prepare.py --tokenizer=nonexistent` first"),
    (['--tokens_per_batch=100'], "tokens_per_batch (100) must be a multiple of"),
    (['--schedule=linear'], "schedule must be 'wsd', 'constant' or 'cosine'"),
    (['--init_from=nowhere/ckpt_000001.pt'], "init_from must be 'scratch', 'resume' or a checkpoint file"),
    (['--model_type=rnn'], "model_type must be one of ['transformer']"),
])
def test_config_errors(tiny_data, tmp_path, args, message):
    r = run_train(*TINY, f'--data_dir={tiny_data}', f'--out_dir={tmp_path}', *args)
    assert r.returncode != 0 and message in r.stderr
    assert 'Traceback' not in r.stderr


@pytest.mark.parametrize('config', sorted(glob.glob(os.path.join(ROOT, 'configs', '*.py'))))
def test_every_config_resolves(config, tmp_path):
    """Each config file passes the strict configurator (it then stops at the missing data)."""
    r = run_train(config, f'--data_dir={tmp_path}/none/byte')
    assert r.returncode != 0 and 'no train data in' in r.stderr, r.stderr


def test_nonfinite_loss_stops_and_keeps_the_last_good_checkpoint(tiny_data, tmp_path):
    r = run_train(*TINY, f'--data_dir={tiny_data}', f'--out_dir={tmp_path}', '--learning_rate=1e30', '--warmup_frac=0.0',
                  '--ckpt_interval=1', '--grad_clip=0.0')
    assert r.returncode == 1
    assert 'stopping at iteration' in r.stdout and '(not finite)' in r.stdout
    saved = checkpoint.steps(str(tmp_path))
    stopped_at = read_log(str(tmp_path), 'nonfinite')[0]['iter']
    assert saved and saved[-1] <= stopped_at  # nothing saved from the failing iteration on
    assert checkpoint.step_path(str(tmp_path), saved[-1]) in r.stdout
    checkpoint.load_model(checkpoint.step_path(str(tmp_path), saved[-1]))  # and it loads


def test_interrupted_checkpoint_write_keeps_the_previous_file(tmp_path, monkeypatch):
    path = str(tmp_path / 'ckpt_000001.pt')
    checkpoint.save({'step': 1}, path)

    def crash(obj, f):
        with open(f, 'wb') as fh:
            fh.write(b'half a checkpoint')
        raise KeyboardInterrupt
    monkeypatch.setattr(checkpoint.torch, 'save', crash)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save({'step': 2}, path)
    assert checkpoint.load(path) == {'step': 1}


def test_ddp_on_cpu_with_gloo(tiny_data, tmp_path):
    """torchrun with 2 processes: each takes 1 of the 2 micro-steps; rank 0 writes the checkpoints."""
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', 'train.py', *TINY,
           f'--data_dir={tiny_data}', f'--out_dir={tmp_path}', '--max_tokens=1024']
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, 'OMP_NUM_THREADS': '1'})
    assert r.returncode == 0, r.stderr[-3000:]
    assert '2 processes x 1 micro-steps' in r.stdout
    assert checkpoint.steps(str(tmp_path)) == [4]
    losses = [x['loss'] for x in read_log(str(tmp_path))]
    assert len(losses) == 4 and losses[-1] < losses[0]
