"""train.py end to end on a tiny model: checkpoints, exact resume, CPT, schedules, DDP, errors."""

import glob
import json
import math
import os
import subprocess
import sys

import pytest
import torch

import checkpoint
from conftest import ROOT, TINY, read_log, run_script, run_train


@pytest.fixture(scope='module')
def straight(tiny_data, tmp_path_factory):
    """8 iterations straight through, checkpoints at 4 and 8."""
    out = str(tmp_path_factory.mktemp('straight'))
    r = run_train(*TINY, f'--data_dir={tiny_data}', f'--out_dir={out}', '--dropout_type=vpad',
                  '--dropout=0.1', '--anneal_frac=0.5', *AVERAGES)
    assert r.returncode == 0, r.stderr
    return out, r.stdout


AVERAGES = ['--average_last=[2, 3]', '--average_interval=2']  # steps 6-8 and 4-8 of 8


def test_checkpoints_log_and_table(straight):
    out, stdout = straight
    # every model, two optimizers
    assert checkpoint.steps(out) == [4, 8] and checkpoint.steps(out, 'optim') == [4, 8]
    model, tok, ckpt = checkpoint.load_model(checkpoint.step_path(out, 8))
    assert (ckpt['step'] == 8 and ckpt['model_type'] == 'transformer'
            and tok.spec == {'kind': 'byte'})
    assert ckpt['config']['dropout_type'] == 'vpad' and ckpt['config']['eval_lengths'] == [32, 64]
    assert not any(k.startswith(('_orig_mod.', 'module.')) for k in ckpt['model'])
    assert model.config.vocab_size == 320  # 257 rounded up to a multiple of 64
    evals = read_log(out, 'eval')
    assert [e['iter'] for e in evals] == [0, 4, 8]
    assert list(evals[-1]['position_loss']) == ['16-32', '32-64']
    assert evals[-1]['val_loss'] < evals[0]['val_loss'] - 0.5  # it learns
    # 2 x (q,k,v,o,up,down); norms, wte
    assert 'weight decay 0.1 on 12 tensors' in stdout and 'none on 6 tensors' in stdout
    assert '16-32' in stdout.split('per-position validation loss')[-1]  # the closing table


def test_wsd_schedule(straight):
    """2 warm-up iterations, 2 stable, then the last 4 annealed linearly down to min_lr."""
    lrs = [r['lr'] for r in read_log(straight[0])]
    assert lrs == pytest.approx([1.5e-3, 3e-3, 3e-3, 3e-3, 2.325e-3, 1.65e-3, 0.975e-3, 3e-4])


def summed_decay(stdout):
    """train.py's printed dose of weight decay -> (summed decay, shrink in %)."""
    line = next(x for x in stdout.splitlines() if 'summed decay' in x)
    return float(line.split(' = ')[1].split()[0]), float(line.split('shrinks by ')[1][:-1])


def test_weight_decay_dose_is_summed_over_the_schedule(straight):
    """The printed dose sum_t lr_t * wd and shrink 1 - prod_t (1 - lr_t * wd) are those of the
    learning rates the run took (its log, every step); configs/wd.py's is the paper's, ~4.1."""
    lrs = [r['lr'] for r in read_log(straight[0])]
    dose, shrink = summed_decay(straight[1])
    assert dose == pytest.approx(0.1 * sum(lrs), rel=1e-3)
    assert shrink == pytest.approx(100 * (1 - math.prod(1 - 0.1 * lr for lr in lrs)), rel=1e-2)
    ckpt = torch.load(checkpoint.step_path(straight[0], 8), weights_only=True)
    assert ckpt['summed_decay'] == pytest.approx(0.1 * sum(lrs))
    r = run_train(os.path.join(ROOT, 'configs', 'wd.py'), '--dry_run=True')
    assert r.returncode == 0, r.stderr
    dose, shrink = summed_decay(r.stdout)
    assert dose == pytest.approx(4.108, abs=1e-3) and shrink == pytest.approx(98.4, abs=0.1)


@pytest.mark.parametrize('schedule,expected', [
    ('constant', [1.5e-3] + [3e-3] * 7),
    ('cosine', [1.5e-3, 3e-3, 2.8191e-3, 2.325e-3, 1.65e-3, 0.975e-3, 0.4809e-3, 3e-4]),
])
def test_other_schedules(tiny_data, tmp_path, schedule, expected):
    r = run_train(*TINY, f'--data_dir={tiny_data}', f'--out_dir={tmp_path}',
                  f'--schedule={schedule}', '--eval_lengths=[]', '--ckpt_interval=100')
    assert r.returncode == 0, r.stderr
    assert [r['lr'] for r in read_log(str(tmp_path))] == pytest.approx(expected, abs=2e-5)


def test_resume_repeats_the_straight_run_exactly(straight, tiny_data, tmp_path):
    """Stopped at step 6, inside both averages' steps, and resumed: the losses, the weights and
    the running averages are the straight run's, bit for bit."""
    args = (*TINY, f'--data_dir={tiny_data}', f'--out_dir={tmp_path}', '--dropout_type=vpad',
            '--dropout=0.1', '--anneal_frac=0.5', *AVERAGES)
    first = run_train(*args, '--halt_at=6')
    assert first.returncode == 0, first.stderr
    assert checkpoint.steps(str(tmp_path)) == [4, 6] and not glob.glob(str(tmp_path / 'avg*'))
    second = run_train(*args, '--init_from=resume')
    assert second.returncode == 0, second.stderr
    assert 'resuming' in second.stdout
    resumed = [(r['iter'], r['loss']) for r in read_log(str(tmp_path))]
    # loss for loss, bit for bit
    assert resumed == [(r['iter'], r['loss']) for r in read_log(straight[0])]
    for name in ('ckpt_000008.pt', 'avg2_000006-000008.pt', 'avg3_000004-000008.pt'):
        a, b = (checkpoint.load(os.path.join(d, name))['model']
                for d in (straight[0], str(tmp_path)))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    r = run_train(*args[:-2], '--average_last=[2]', '--average_interval=2', '--init_from=resume')
    assert r.returncode != 0 and 'average_last or its steps changed' in r.stderr


def test_continued_pretraining_starts_from_the_weights(straight, tiny_data, tmp_path):
    source = checkpoint.step_path(straight[0], 8)
    # a model key that CPT cannot change is an error that names it, before anything is written
    r = run_train(*TINY, f'--data_dir={tiny_data}', f'--out_dir={tmp_path}/other',
                  f'--init_from={source}', '--n_embd=999')
    assert (r.returncode != 0 and 'sets n_embd = 999 (the checkpoint has 32)' in r.stderr
            and 'Traceback' not in r.stderr)
    # and so is another model type: CPT would have trained the source's
    r = run_train(*TINY, f'--data_dir={tiny_data}', f'--out_dir={tmp_path}/other',
                  f'--init_from={source}', '--model_type=mamba2')
    assert r.returncode != 0 and 'is a transformer, but the config sets model_type' in r.stderr
    assert not os.path.exists(f'{tmp_path}/other')
    r = run_train(*TINY, f'--data_dir={tiny_data}', f'--out_dir={tmp_path}',
                  f'--init_from={source}', '--dropout_type=pre_linear', '--dropout=0.2',
                  '--max_tokens=512')
    assert r.returncode == 0, r.stderr
    first_eval = read_log(str(tmp_path), 'eval')[0]
    assert first_eval['iter'] == 0
    # same weights, same batches
    assert first_eval['val_loss'] == read_log(straight[0], 'eval')[-1]['val_loss']
    ckpt = checkpoint.load(checkpoint.step_path(str(tmp_path), 2))
    assert (ckpt['model_args']['dropout_type'] == 'pre_linear'
            and ckpt['model_args']['dropout'] == 0.2)
    assert ckpt['model_args']['n_embd'] == 32  # the architecture comes from the checkpoint
    # at another length: the model keeps its source's block_size, the config records the run's
    r = run_train(*TINY, f'--data_dir={tiny_data}', f'--out_dir={tmp_path}/short',
                  f'--init_from={source}', '--block_size=16', '--max_tokens=512')
    assert r.returncode == 0, r.stderr
    ckpt = checkpoint.load(checkpoint.step_path(f'{tmp_path}/short', 2))
    assert ckpt['model_args']['block_size'] == 32 and ckpt['config']['block_size'] == 16
    assert 'trained on 16 tokens' in r.stdout


def test_continued_pretraining_needs_the_same_tokenizer(straight, tiny_data, tmp_path):
    ckpt = checkpoint.load(checkpoint.step_path(straight[0], 8))
    ckpt['tokenizer'] = {'kind': 'gpt2'}
    checkpoint.save(ckpt, str(tmp_path / 'gpt2.pt'))
    code, message = run_script('train.py', *TINY, f'--data_dir={tiny_data}',
                               f'--out_dir={tmp_path}/cpt', f'--init_from={tmp_path}/gpt2.pt')
    assert code != 0 and "prepare the data with the checkpoint's tokenizer" in message


def test_resume_with_another_model_shape_fails_clearly(straight, tiny_data, tmp_path):
    code, message = run_script('train.py', *TINY, f'--data_dir={tiny_data}',
                               f'--out_dir={straight[0]}', '--init_from=resume', '--n_embd=64')
    assert (code != 0 and "cannot resume" in message
            and "n_embd: checkpoint 32 vs config 64" in message)


def test_scratch_and_cpt_refuse_to_overwrite_a_run(straight, tiny_data, tmp_path):
    """From scratch, or CPT (from one of the run's own checkpoints, or from another run's), into a
    folder that holds checkpoints: refused before anything is written, the source untouched."""
    files = lambda: {p: os.path.getmtime(p)  # noqa: E731
                     for p in glob.glob(os.path.join(straight[0], '*')) if 'lock' not in p}
    before = files()
    other = tmp_path / 'other.pt'
    checkpoint.save(checkpoint.load(checkpoint.step_path(straight[0], 4)), str(other))
    for init in ('scratch', checkpoint.step_path(straight[0], 4), str(other)):
        code, message = run_script('train.py', *TINY, f'--data_dir={tiny_data}',
                                   f'--out_dir={straight[0]}', f'--init_from={init}')
        assert (code != 0 and 'already holds checkpoints' in message
                and '--init_from=resume' in message)
    # the checkpoints and the log (the lock file names each run that asked for it)
    assert files() == before


@pytest.mark.parametrize('args,message', [
    (['--n_embed=64'], "unknown config key 'n_embed' (did you mean 'n_embd'?)"),
    (['--batch_size=4.5'], "batch_size must be int, got 4.5"),
    (['--data_dir=data/shakespeare/bpe'],
     "run `python data/shakespeare/prepare.py --tokenizer=byte "
     "--out_dir=data/shakespeare/bpe` first"),
    (['--ckpt_interval=0'], "ckpt_interval must be >= 1, got 0"),
    (['--eval_interval=0'], "eval_interval must be >= 1, got 0"),
    (['--keep_last=-1'], "keep_last must be >= 0, got -1"),
    (['--max_tokens=100'],
     "max_tokens (100) is less than one step of tokens_per_batch (256): nothing to train"),
    (['--learning_rate=1e39'], "learning_rate and min_lr must be positive and finite in float32"),
    (['--dropout=-0.1', '--dropout_type=vpad'], "dropout must be in [0, 1), got -0.1"),
    (['--dropout_type=vpda'], "unknown dropout_type 'vpda'"),
    (['--init_from=README.md'], "is not a checkpoint written by torch.save"),
    (["--tokens_per_batch=100"], "tokens_per_batch (100) must be a positive multiple of"),
    (["--tokens_per_batch=0"], "tokens_per_batch must be >= 1, got 0"),
    (['--schedule=linear'], "schedule must be one of ['wsd', 'constant', 'cosine']"),
    (['--init_from=nowhere/ckpt_000001.pt'],
     "init_from must be 'scratch', 'resume', a checkpoint file, a weights folder or "
     "a Hugging Face repo id"),
    (['--model_type=rnn'], "model_type must be one of ['transformer', 'mamba2']"),
    (['--block_size=60000', '--tokens_per_batch=60000', '--max_tokens=60000'],
     "block_size = 60000, but no train shard of"),
    (['--warmup_frac=2.0'], "warmup_frac must be >= 0 and <= 1, got 2.0"),
    (['--warmup_frac=0.5', '--anneal_frac=0.6'], "warm-up plus anneal at most 1"),
    (['--n_embd=66'], "n_embd (66) must be a multiple of n_head (4), or give head_dim"),
    (['--skip_steps=2'], "skip_steps (2) skips batches of a resumed run: give --init_from=resume"),
    (['--dry_run=True', '--init_from=resume'],
     "a dry run plans a new run, from scratch or for CPT"),
])
def test_config_errors(tiny_data, tmp_path, args, message):
    """Refused in one line (run in this process: an exception other than SystemExit fails the
    test), nothing written."""
    code, said = run_script('train.py', *TINY, f'--data_dir={tiny_data}', f'--out_dir={tmp_path}',
                            *args)
    assert code != 0 and message in said and not os.listdir(tmp_path)


@pytest.mark.parametrize('config', sorted(glob.glob(os.path.join(ROOT, 'configs', '*.py'))))
def test_every_config_resolves(config, tmp_path):
    """Each config file passes the strict configurator; the run then stops at the missing data
    (or, for the Copy task, which needs none, at the batch arithmetic)."""
    code, said = run_script('train.py', config, f'--data_dir={tmp_path}/none/byte',
                            '--tokens_per_batch=1')
    assert code != 0
    assert ('no train data in' in said
            or 'tokens_per_batch (1) must be a positive multiple' in said), said


def test_nonfinite_loss_stops_and_keeps_the_last_good_checkpoint(tiny_data, tmp_path):
    r = run_train(*TINY, f'--data_dir={tiny_data}', f'--out_dir={tmp_path}', '--learning_rate=1e30',
                  '--warmup_frac=0.0', '--ckpt_interval=1', '--grad_clip=0.0')
    assert r.returncode == 1
    assert 'stopping at iteration' in r.stdout and '(not finite)' in r.stdout
    saved = checkpoint.steps(str(tmp_path))
    stopped_at = read_log(str(tmp_path), 'diverged')[0]['iter']
    assert saved == list(range(1, stopped_at))  # nothing saved from the failing weights on
    if saved:
        assert checkpoint.step_path(str(tmp_path), saved[-1]) in r.stdout
        checkpoint.load_model(checkpoint.step_path(str(tmp_path), saved[-1]))  # and it loads
    else:
        assert 'No checkpoint was saved yet' in r.stdout


def test_interrupted_checkpoint_write_keeps_the_previous_file(tmp_path, monkeypatch):
    path = str(tmp_path / 'ckpt_000001.pt')
    checkpoint.save({'step': 1}, path)

    def crash(obj, f):
        f.write(b'half a checkpoint')
        raise KeyboardInterrupt
    monkeypatch.setattr(checkpoint.torch, 'save', crash)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save({'step': 2}, path)
    assert checkpoint.load(path) == {'step': 1}


def test_checkpoint_writes_reach_the_disk_before_and_after_the_rename(tmp_path, monkeypatch):
    """The file is synced before it is renamed into place, and its folder after (a machine crash
    then leaves the old file or the new one, whole); the same for a folder of shards."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(checkpoint.os, 'fsync',
                        lambda fd: events.append(('fsync', os.readlink(f'/proc/self/fd/{fd}')))
                        or real_fsync(fd))
    monkeypatch.setattr(checkpoint.os, 'replace',
                        lambda a, b: events.append(('replace', b)) or real_replace(a, b))
    path = str(tmp_path / 'ckpt_000001.pt')
    checkpoint.save({'step': 1}, path)
    assert events == [('fsync', path + '.tmp'), ('replace', path), ('fsync', str(tmp_path))]
    events.clear()
    (tmp_path / 'new.tmp').mkdir()
    (tmp_path / 'new.tmp' / 'shard').write_bytes(b'x')
    checkpoint.replace_folder(str(tmp_path / 'new.tmp'), str(tmp_path / 'optim.dcp'))
    assert events == [('fsync', str(tmp_path / 'new.tmp' / 'shard')),
                      ('fsync', str(tmp_path / 'new.tmp')),
                      ('replace', str(tmp_path / 'optim.dcp')), ('fsync', str(tmp_path))]


@pytest.mark.parametrize('lr', [1e20, 1e6])
def test_divergence_never_poisons_the_last_good_checkpoint(tiny_data, tmp_path, lr):
    """A run resumed at step 10 with a huge learning rate: its weights blow up at the first step
    (NaN with 1e20; with 1e6 a uniform output, ln(vocab)). Nothing is saved from them, the
    message names checkpoint 10, its optimizer state is still there, and resuming from it with
    the run's own rate goes on to the end, loss for loss as a run that never diverged."""
    args = (*TINY, f'--data_dir={tiny_data}', '--max_tokens=4096', '--ckpt_interval=1',
            '--eval_lengths=[]')
    straight = run_train(*args, f'--out_dir={tmp_path}/straight')
    assert straight.returncode == 0, straight.stderr
    out = str(tmp_path / 'run')
    assert run_train(*args, f'--out_dir={out}', '--halt_at=10').returncode == 0
    r = run_train(*args, f'--out_dir={out}', '--init_from=resume', f'--learning_rate={lr}')
    assert r.returncode == 1 and 'stopping at iteration 11' in r.stdout, r.stdout[-2000:]
    # 1e6 gives a uniform output, the loss ln(vocab), and on some CPUs a NaN gradient (AMD EPYC
    # here), on others not
    assert ('not finite' in r.stdout if lr == 1e20
            else ('nats above the lowest' in r.stdout or 'gradient norm nan' in r.stdout))
    assert f'The last good checkpoint is {checkpoint.step_path(out, 10)}' in r.stdout
    assert checkpoint.steps(out) == list(range(1, 11)) and checkpoint.steps(out, 'optim') == [9, 10]
    assert read_log(out, 'diverged')[0]['last_good'] == checkpoint.step_path(out, 10)
    r = run_train(*args, f'--out_dir={out}', '--init_from=resume')
    assert r.returncode == 0, r.stderr
    # the third start's records
    resumed = [(x['iter'], x['loss']) for x in read_log(out) if x['session'] == 2]
    assert resumed == [(x['iter'], x['loss']) for x in read_log(f'{tmp_path}/straight')
                       if x['iter'] > 10]


def test_resume_passes_over_an_unreadable_newest_pair(straight, tiny_data, tmp_path):
    """The newest checkpoint, then the newest optimizer state, cut short (a disk that lost them):
    resume names the file, passes over it to the pair before (the optimizer state of the two newest
    steps is kept) and ends as the straight run, loss for loss."""
    args = (*TINY, f'--data_dir={tiny_data}', f'--out_dir={tmp_path}', '--dropout_type=vpad',
            '--dropout=0.1', '--anneal_frac=0.5', '--ckpt_interval=2')
    assert run_train(*args, '--halt_at=6').returncode == 0
    for prefix, halt in (('ckpt', 7), ('optim', 0)):
        assert checkpoint.steps(str(tmp_path), 'optim') == ([4, 6] if prefix == 'ckpt' else [6, 7])
        newest = checkpoint.step_path(str(tmp_path), 6 if prefix == 'ckpt' else 7, prefix)
        data = open(newest, 'rb').read()
        open(newest, 'wb').write(data[:len(data) // 2])
        r = run_train(*args, '--init_from=resume', f'--halt_at={halt}')
        assert r.returncode == 0, r.stderr
        assert (f'warning: passing over step {6 if prefix == "ckpt" else 7}: {newest} '
                f'is not a checkpoint' in r.stdout)
        assert f'resuming {tmp_path} at iteration {4 if prefix == "ckpt" else 6}' in r.stdout
    assert [(x['iter'], x['loss']) for x in read_log(str(tmp_path)) if x['session'] == 2] == \
        [(x['iter'], x['loss']) for x in read_log(straight[0]) if x['iter'] > 6]


def test_resume_errors_say_what_to_do(straight, tiny_data, tmp_path):
    args = (*TINY, f'--data_dir={tiny_data}', f'--out_dir={tmp_path}')
    assert run_train(*args, '--halt_at=4').returncode == 0
    code, said = run_script('train.py', *args, '--init_from=resume', '--halt_at=4')
    assert code != 0 and 'halt_at = 4, but the run resumes at iteration 4' in said
    optim = dict(checkpoint.load(checkpoint.step_path(str(tmp_path), 4, 'optim')), sharded=True)
    # as an FSDP run leaves it
    checkpoint.save(optim, checkpoint.step_path(str(tmp_path), 4, 'optim'))
    code, said = run_script('train.py', *args, '--init_from=resume')
    assert code != 0 and 'was trained with parallel=fsdp' in said and '--parallel=fsdp' in said
    for bad, message in ((checkpoint.step_path(straight[0], 8, 'optim'),
                          'is an optimizer state (optim_*.pt)'),
                         (os.path.join(ROOT, 'README.md'),
                          'is not a checkpoint written by torch.save')):
        for cmd in (['train.py', *TINY, f'--data_dir={tiny_data}', f'--out_dir={tmp_path}/cpt',
                     f'--init_from={bad}'],
                    ['eval_loss.py', f'--ckpt={bad}'],
                    ['average_ckpts.py', f'--ckpts=[{bad!r}, {bad!r}]']):
            code, said = run_script(*cmd)
            assert code != 0 and message in said, (cmd, said)


def torchrun(*args, nproc=2):
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone',
           f'--nproc_per_node={nproc}', 'train.py', *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, 'OMP_NUM_THREADS': '1'})


# 3 validation batches and 3 long windows: 2 processes take 2 and 1 (and a pad: FSDP's run alike)
ODD_EVAL = ['--eval_iters=3', '--eval_windows=3']


@pytest.fixture(scope='module')
def one_process(tiny_data, tmp_path_factory):
    """The reference for the distributed runs: one process, 2 micro-steps of 4 sequences, VPAD ->
    its losses, and its evaluations."""
    out = str(tmp_path_factory.mktemp('one'))
    r = run_train(*TINY, *ODD_EVAL, f'--data_dir={tiny_data}', f'--out_dir={out}',
                  '--dropout_type=vpad', '--dropout=0.1')
    assert r.returncode == 0, r.stderr
    return [x['loss'] for x in read_log(out)], read_log(out, 'eval')


def same_evaluations(run, reference):
    """Evaluations equal to float32 summation order (val_loss, per-position loss, accuracy)."""
    assert len(run) == len(reference)
    for a, b in zip(run, reference):
        assert a.keys() == b.keys() and a['iter'] == b['iter']
        for k in a.keys() - {'event', 'iter'}:
            assert a[k] == (pytest.approx(b[k], rel=1e-5) if isinstance(b[k], float) else
                            {band: pytest.approx(v, rel=1e-5) for band, v in b[k].items()}
                            if isinstance(b[k], dict) else b[k]), k


@pytest.mark.parametrize('parallel', ['ddp', 'fsdp'])
def test_two_processes_match_one(one_process, tiny_data, tmp_path, parallel):
    """torchrun with 2 processes on CPU (gloo), each 1 micro-step of the same global batch: the
    same data, the same dropout masks, the same losses as one process; under FSDP also with
    activation checkpointing (the recomputation replays the masks). The evaluations, shared
    among the processes (under FSDP too, a pad where the shares are uneven), equal one
    process's."""
    extra = ['--activation_checkpointing=True'] if parallel == 'fsdp' else []
    r = torchrun(*TINY, *ODD_EVAL, f'--data_dir={tiny_data}', f'--out_dir={tmp_path}',
                 '--dropout_type=vpad', '--dropout=0.1', f'--parallel={parallel}', *extra)
    assert r.returncode == 0, r.stderr[-3000:]
    assert '2 processes x 1 micro-steps' in r.stdout and 'memory per process (estimate)' in r.stdout
    assert 'plan: ' in r.stdout and '2 written' in r.stdout  # before training: FLOPs, hours, disk
    assert ('FSDP over 2' in r.stdout) == (parallel == 'fsdp')
    assert [x['loss'] for x in read_log(str(tmp_path))] == pytest.approx(one_process[0], rel=1e-4)
    same_evaluations(read_log(str(tmp_path), 'eval'), one_process[1])
    assert checkpoint.steps(str(tmp_path)) == [4, 8]
    # a whole state, FSDP's too
    optim = checkpoint.load(checkpoint.step_path(str(tmp_path), 8, 'optim'))
    assert (checkpoint.steps(str(tmp_path), 'optim') == [4, 8]
            and optim['sharded'] == (parallel == 'fsdp'))
    # whole, with clean keys
    model, _, ckpt = checkpoint.load_model(checkpoint.step_path(str(tmp_path), 8))
    assert not any('_fsdp' in k or 'checkpoint' in k for k in ckpt['model'])
    tied = [ckpt['model'][k].untyped_storage().data_ptr() for k in ('wte.weight', 'lm_head.weight')]
    assert tied[0] == tied[1]  # stored once (FSDP's gathered state dict had two copies)


def test_fsdp_task_evaluation_matches_one_process(tmp_path):
    """A task's accuracy under FSDP with 2 processes (gloo) equals one process's: 129 held-out
    samples per length, in batches of 64, make shares of 65 and 64 samples, 2 batches and 1 (the
    second process runs a batch of one pad, not counted: else FSDP's collectives would not
    pair)."""
    args = ['--device=cpu', '--task=needle', '--task_vocab=16', '--task_min_len=12',
            '--task_max_len=16', '--n_layer=2', '--n_head=2', '--n_embd=16', '--batch_size=4',
            '--tokens_per_batch=128', '--max_tokens=2560', '--eval_interval=10', '--eval_iters=1',
            '--task_eval_samples=129', '--eval_lengths=[16, 32]', '--ckpt_interval=100']
    r = run_train(*args, f'--out_dir={tmp_path}/one')
    assert r.returncode == 0, r.stderr
    r = torchrun(*args, '--parallel=fsdp', f'--out_dir={tmp_path}/fsdp')
    assert r.returncode == 0, r.stderr[-3000:]
    reference = read_log(f'{tmp_path}/one', 'eval')
    assert sum(sum(e['token_accuracy'].values()) for e in reference) > 0
    same_evaluations(read_log(f'{tmp_path}/fsdp', 'eval'), reference)


def test_compiled_ddp_splits_at_its_buckets(tiny_data, tmp_path):
    """The compiled DDP step: dynamo's DDPOptimizer splits the graph at DDP's gradient buckets,
    so that their all-reduce overlaps the backward (with torch._dynamo.config.optimize_ddp off,
    one graph and no overlap). The model is 256 wide so that its gradients fill two buckets
    (DDP's first bucket holds 1 MB)."""
    args = [a for a in TINY if not a.startswith('--n_embd')]
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
           'train.py', *args, '--n_embd=256', '--max_tokens=768', '--eval_lengths=[]',
           f'--data_dir={tiny_data}', f'--out_dir={tmp_path}', '--compile=True']
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, 'OMP_NUM_THREADS': '1', 'TORCH_LOGS': 'ddp_graphs'})
    assert r.returncode == 0, r.stderr[-3000:]
    assert '---split graph---' in r.stderr and 'submod_1' in r.stderr, r.stderr[-3000:]
    assert all(torch.isfinite(torch.tensor(x['loss'])) for x in read_log(str(tmp_path)))


def test_the_training_step_drops_the_logits(tiny_data, tmp_path):
    """The logits (16 x 2048 x 128K in bf16 at paper scale: 3.3 GB after the fp32 loss has its
    own copy) are not needed by the backward: train.py must not hold them through it. A weak
    reference taken in the forward must be dead when the backward reaches the loss."""
    script = f"""
import runpy, sys, weakref
import model
forward, alive = model.Transformer.forward, []
def watched(self, idx, targets=None):
    logits, loss = forward(self, idx, targets)
    if loss is not None and loss.requires_grad:
        ref = weakref.ref(logits)
        loss.register_hook(lambda g: alive.append(ref() is not None))
    return logits, loss
model.Transformer.forward = watched
sys.argv = ['train.py', *{[*TINY, '--max_tokens=512', '--eval_lengths=[]']!r},
            '--data_dir={tiny_data}', '--out_dir={tmp_path}']
runpy.run_path('train.py', run_name='__main__')
print('logits alive in the backward:', alive)
"""
    r = subprocess.run([sys.executable, '-c', script], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ('logits alive in the backward: [False, False, False, False]'
            in r.stdout), r.stdout[-1500:]


def test_any_process_count_with_the_same_micro_batch_trains_alike(tiny_data, tmp_path):
    """8 sequences a step in micro-batches of 2: 4 micro-steps in one process, 2 in each of 2, 1 in
    each of 4 (torchrun, gloo): the same batches and masks, so the same losses. 3 processes
    cannot split 8 sequences: an error that names the counts that can."""
    args = [*TINY, '--batch_size=2', f'--data_dir={tiny_data}', '--dropout_type=vpad',
            '--dropout=0.1', '--max_tokens=512', '--eval_interval=100', '--ckpt_interval=100']
    r = run_train(*args, f'--out_dir={tmp_path}/1')
    assert r.returncode == 0 and '1 processes x 4 micro-steps x 2 x 32' in r.stdout, r.stderr
    losses = [x['loss'] for x in read_log(f'{tmp_path}/1')]
    for n in (2, 4):
        r = torchrun(*args, f'--out_dir={tmp_path}/{n}', nproc=n)
        assert (r.returncode == 0
                and f'{n} processes x {4 // n} micro-steps x 2 x 32' in r.stdout), r.stderr[-3000:]
        assert [x['loss'] for x in read_log(f'{tmp_path}/{n}')] == pytest.approx(losses, rel=1e-4)
    r = torchrun(*args, f'--out_dir={tmp_path}/3', nproc=3)
    assert (r.returncode != 0
            and 'do not split over 3 processes: use a process count that divides 8 (1, 2, 4, 8)'
            in r.stdout + r.stderr)
    # 8 = 4 x 2: micro-batches of 2
    r = run_train(*args, '--batch_size=3', f'--out_dir={tmp_path}/b3')
    assert (r.returncode == 0
            and 'note: micro-batches of 2 sequences, the largest up to batch_size = 3'
            in r.stdout), r.stderr


def test_two_nodes_over_loopback_match_one_process(tiny_data, tmp_path):
    """scripts/slurm.sh as SLURM runs it on two nodes (srun, scontrol and nvidia-smi stood in for
    on this machine: two "nodes" of one process each, a c10d rendezvous on the loopback, gloo):
    the single-process losses."""
    args = [*TINY, f'--data_dir={tiny_data}', '--dropout_type=vpad', '--dropout=0.1',
            '--max_tokens=1024', '--eval_interval=100', '--ckpt_interval=100']
    r = run_train(*args, f'--out_dir={tmp_path}/one')
    assert r.returncode == 0, r.stderr
    bin_ = tmp_path / 'bin'
    bin_.mkdir()
    fakes = {'srun': '"$@" & a=$!; "$@" & b=$!; wait $a && wait $b',  # one task per node, both here
             'scontrol': 'echo 127.0.0.1', 'nvidia-smi': 'echo "GPU 0: (a CPU process here)"',
             'torchrun': f'exec {sys.executable} -m torch.distributed.run "$@"'}
    for name, body in fakes.items():
        (bin_ / name).write_text(f'#!/bin/bash\n{body}\n')
        (bin_ / name).chmod(0o755)
    import socket
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    env = {**os.environ, 'PATH': f"{bin_}:{os.environ['PATH']}", 'SLURM_NNODES': '2',
           'SLURM_JOB_ID': '7', 'SLURM_JOB_NODELIST': 'node[0-1]', 'SLURM_SUBMIT_DIR': ROOT,
           'MASTER_PORT': str(port), 'OMP_NUM_THREADS': '1'}
    r = subprocess.run(['bash', 'scripts/slurm.sh', *args, f'--out_dir={tmp_path}/two'], cwd=ROOT,
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert '2 processes x 1 micro-steps' in r.stdout
    assert [x['loss'] for x in read_log(f'{tmp_path}/two')] == pytest.approx(
        [x['loss'] for x in read_log(f'{tmp_path}/one')], rel=1e-4)


class Payload:
    """Unpickled, it creates a file: what a crafted file could run instead of holding tensors."""
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, 'w'))


def test_fsdp_resume_reads_no_pickle(one_process, tiny_data, tmp_path):
    """FSDP's optimizer state is one file read with weights_only=True, like every checkpoint: a
    resume repeats the straight run; a crafted optimizer file is refused without running its code,
    and so is a torch.distributed.checkpoint folder whose pickled .metadata has its digest recorded
    in the checkpoint (such folders are never read)."""
    import hashlib
    import pickle
    import shutil
    out, forged = tmp_path / 'run', tmp_path / 'forged'
    # steps 4 and 8, summed in shards, the sum saved whole at 4
    args = (*TINY, f'--data_dir={tiny_data}', '--dropout_type=vpad', '--dropout=0.1',
            '--parallel=fsdp', '--average_last=[2]')
    first = torchrun(*args, f'--out_dir={out}', '--halt_at=4')
    assert first.returncode == 0, first.stderr[-3000:]
    assert checkpoint.load(checkpoint.step_path(str(out), 4, 'optim'))['sharded']
    shutil.copytree(out, forged)
    marker = tmp_path / 'ran'
    (forged / 'optim_000004.dcp').mkdir()
    (forged / 'optim_000004.dcp' / '.metadata').write_bytes(pickle.dumps(Payload(str(marker))))
    digest = {'.metadata': hashlib.sha256(
        (forged / 'optim_000004.dcp' / '.metadata').read_bytes()).hexdigest()}
    # the digest an older train.py checked, forged
    ckpt = checkpoint.load(checkpoint.step_path(str(forged), 4))
    checkpoint.save({**ckpt, 'optim_digest': digest}, checkpoint.step_path(str(forged), 4))
    # a torch.save file
    torch.save({'optimizer': Payload(str(marker)), 'sharded': True}, forged / 'optim_000004.pt')
    r = torchrun(*args, f'--out_dir={forged}', '--init_from=resume')
    assert r.returncode != 0 and 'could be read with its optimizer state' in r.stdout + r.stderr
    assert 'passing over step 4' in r.stdout and 'holds objects other than tensors' in r.stdout
    assert not marker.exists()
    second = torchrun(*args, f'--out_dir={out}', '--init_from=resume')
    assert second.returncode == 0, second.stderr[-3000:]
    assert [x['loss'] for x in read_log(str(out))] == pytest.approx(one_process[0], rel=1e-4)
    import average_ckpts
    reference = average_ckpts.average([checkpoint.step_path(str(out), s) for s in (4, 8)])
    averaged = checkpoint.load(str(out / 'avg2_000004-000008.pt'))['model']
    assert averaged.keys() == reference.keys()
    assert all(torch.allclose(averaged[k], t, rtol=1e-6, atol=1e-7) for k, t in reference.items())


def test_keep_last_and_running_averages(tiny_data, tmp_path):
    """The newest keep_last checkpoints kept; the running averages equal average_ckpts.py's over
    saved checkpoints of the same steps, to float32 rounding, in a checkpoint it would write."""
    import average_ckpts
    r = run_train(*TINY, f'--data_dir={tiny_data}', f'--out_dir={tmp_path}', '--ckpt_interval=2',
                  '--keep_last=3', '--average_last=[2, 3]')
    assert r.returncode == 0, r.stderr
    assert checkpoint.steps(str(tmp_path)) == [4, 6, 8]
    for K, steps in ((2, [6, 8]), (3, [4, 6, 8])):
        path = str(tmp_path / f'avg{K}_{steps[0]:06d}-{steps[-1]:06d}.pt')
        ckpt = checkpoint.load(path)
        reference = average_ckpts.average([checkpoint.step_path(str(tmp_path), s) for s in steps])
        assert (ckpt['averaged_steps'] == steps and ckpt['step'] == 8
                and average_ckpts.is_average(path))
        assert ckpt['model'].keys() == reference.keys()
        for k, t in reference.items():
            assert (ckpt['model'][k].dtype == t.dtype
                    and torch.allclose(ckpt['model'][k], t, rtol=1e-6, atol=1e-7)), k
        assert not all(torch.equal(ckpt['model'][k], t) for k, t in checkpoint.load(
            checkpoint.step_path(str(tmp_path), 8))['model'].items())  # not the last weights
    r = run_train(*TINY, f'--data_dir={tiny_data}', f'--out_dir={tmp_path}/short',
                  '--average_last=[3]')
    assert r.returncode != 0 and 'the run has 2 averaging steps (every 4 of 8)' in r.stderr
    assert not os.path.exists(tmp_path / 'short')


MAMBA = ['--model_type=mamba2', '--n_embd=32', '--d_state=8', '--headdim=16', '--chunk_size=16']


def test_mamba2_language_model(tiny_data, tmp_path):
    r = run_train(*TINY, *MAMBA, f'--data_dir={tiny_data}', f'--out_dir={tmp_path}',
                  '--dropout_type=pre_linear', '--dropout=0.1', '--ckpt_interval=8')
    assert r.returncode == 0, r.stderr
    # decayed: in_proj, conv1d and out_proj of each layer; not: A_log, D, dt_bias, conv bias,
    # 2 norms, and the embedding
    assert 'weight decay 0.1 on 6 tensors' in r.stdout and 'none on 14 tensors' in r.stdout
    model, tok, ckpt = checkpoint.load_model(checkpoint.step_path(str(tmp_path), 8))
    assert ckpt['model_type'] == 'mamba2' and type(model).__name__ == 'Mamba2'
    assert model.config.dropout_type == 'pre_linear' and model.config.d_state == 8
    evals = read_log(str(tmp_path), 'eval')
    assert (list(evals[-1]['position_loss']) == ['16-32', '32-64']
            and evals[-1]['val_loss'] < evals[0]['val_loss'])


def test_each_model_keeps_its_own_defaults(tiny_data, tmp_path):
    """A model key the config leaves unset takes its own model's default: a Mamba2 run without
    n_layer has Mamba2Config's 24 layers, not the transformer's 12 (the keys share a name)."""
    args = ([a for a in TINY if not a.startswith('--n_layer')] + MAMBA
            + ['--max_tokens=256', '--eval_interval=100'])
    r = run_train(*args, f'--data_dir={tiny_data}', f'--out_dir={tmp_path}', '--ckpt_interval=1')
    assert r.returncode == 0, r.stderr
    ckpt = checkpoint.load(checkpoint.step_path(str(tmp_path), 1))
    assert ckpt['model_args']['n_layer'] == 24 and ckpt['config']['n_layer'] == 24
    assert ckpt['model_args']['d_state'] == 8  # and a key it sets is its own


def test_copy_task(tmp_path):
    r = run_train(*TINY, *MAMBA, '--task=copy', '--task_vocab=12', '--task_min_len=3',
                  '--task_max_len=6', '--batch_size=8', '--tokens_per_batch=112',
                  '--max_tokens=448', '--eval_lengths=[6, 12]', '--task_eval_samples=129',
                  f'--out_dir={tmp_path}')
    assert r.returncode == 0, r.stderr
    assert 'sequences padded to 14' in r.stdout  # block_size follows task_max_len
    evals = read_log(str(tmp_path), 'eval')
    assert set(evals[-1]['accuracy']) == set(evals[-1]['token_accuracy']) == {'6', '12'}
    assert all(0 <= v <= 1 for v in evals[-1]['token_accuracy'].values())
    assert 'copy accuracy of' in r.stdout and 'exact' in r.stdout.split('copy accuracy of')[-1]
    _, tok, _ = checkpoint.load_model(checkpoint.step_path(str(tmp_path), 4))
    assert tok.spec == {'kind': 'symbols', 'n_vocab': 12, 'eot': 3} and tok.decode([4, 5]) == '4 5'


def test_continued_pretraining_from_released_mamba2_weights(tmp_path):
    """A state-spaces/mamba2-* folder (mamba_ssm names, pytorch_model.bin) with its tokenizer.json,
    and data tokenized with that tokenizer: train.py starts from the released weights."""
    from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers
    from mamba import Mamba2, Mamba2Config
    from tokens import TokenData, Tokenizer, batch_rng, write_shard
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer, hf.decoder = (pre_tokenizers.ByteLevel(add_prefix_space=False),
                                    decoders.ByteLevel())
    text = "the grass is green and the sky is blue while a sun shines over quiet hills. " * 40
    hf.train_from_iterator([text], trainers.BpeTrainer(vocab_size=300,
                                                       special_tokens=['<|endoftext|>']))
    weights, data = tmp_path / 'mamba2-tiny', tmp_path / 'data' / 'x' / 'neox'
    weights.mkdir(), data.mkdir(parents=True)
    hf.save(str(weights / 'tokenizer.json'))
    tok = Tokenizer({'kind': 'hf', 'path': str(weights / 'tokenizer.json')})
    for split in ('train', 'val'):
        write_shard(str(data / f'{split}.bin'), (tok.encode(text) + [tok.eot]) * 3, tok.n_vocab)
    (data / 'meta.json').write_text(json.dumps({'tokenizer': tok.spec, 'vocab_size': tok.n_vocab,
                                                'eot': tok.eot}))
    torch.manual_seed(0)
    released = Mamba2(Mamba2Config(vocab_size=tok.n_vocab, n_layer=2, n_embd=32, d_state=8,
                                   headdim=16, chunk_size=16))
    torch.save({'backbone.' + k: v for k, v in released.state_dict().items()},
               weights / 'pytorch_model.bin')
    (weights / 'config.json').write_text(json.dumps({
        'd_model': 32, 'n_layer': 2, 'vocab_size': tok.n_vocab, 'pad_vocab_size_multiple': 1,
        'ssm_cfg': {'layer': 'Mamba2', 'd_state': 8, 'headdim': 16, 'chunk_size': 16}}))
    out = tmp_path / 'cpt'
    r = run_train(*TINY, f'--data_dir={data}', f'--out_dir={out}', f'--init_from={weights}',
                  '--dropout_type=pre_norm', '--dropout=0.2', '--weight_decay=0.0',
                  '--max_tokens=512', '--eval_lengths=[]')
    assert r.returncode == 0, r.stderr
    assert f'continued pre-training from {weights}' in r.stdout
    model, _, ckpt = checkpoint.load_model(checkpoint.step_path(str(out), 2))
    assert ckpt['model_type'] == 'mamba2' and ckpt['model_args']['dropout'] == 0.2
    # the first evaluation is the released model's loss on the same validation batches
    val = TokenData(str(data), 'val')
    with torch.no_grad():
        losses = [released.eval()(*val.batch(4, 32, batch_rng(1337, 1, i)))[1].item()
                  for i in range(2)]
    assert read_log(str(out), 'eval')[0]['val_loss'] == pytest.approx(sum(losses) / 2, abs=1e-5)
    (weights / 'tokenizer.json').unlink()
    r = run_train(*TINY, f'--data_dir={data}', f'--out_dir={tmp_path}/cpt2',
                  f'--init_from={weights}')
    assert r.returncode != 0 and 'has no tokenizer.json' in r.stderr


def test_wandb_offline(tiny_data, tmp_path):
    """wandb_log=True in wandb's offline mode: the metrics of log.jsonl and the config as the run's;
    a resume continues the same wandb run. Off by default, and never needed by the quick start."""
    pytest.importorskip('wandb')
    env = {**os.environ, 'WANDB_MODE': 'offline', 'WANDB_SILENT': 'true'}
    args = [*TINY, f'--data_dir={tiny_data}', f'--out_dir={tmp_path}', '--wandb_log=True',
            '--max_tokens=1024']
    for extra in (['--halt_at=2'], ['--init_from=resume']):
        r = subprocess.run([sys.executable, 'train.py', *args, *extra], cwd=ROOT,
                           capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
    runs = sorted(glob.glob(str(tmp_path / 'wandb' / 'offline-run-*' / 'run-*.wandb')))
    run_id = (tmp_path / 'wandb_id').read_text()
    # one wandb run, two sessions
    assert len(runs) == 2 and all(r.endswith(f'run-{run_id}.wandb') for r in runs)
    # wandb's protobuf records hold keys and JSON values as text
    records = open(runs[-1], 'rb').read()
    last = [x for x in read_log(str(tmp_path)) if x['session'] == 1][-1]
    assert (json.dumps(last['loss']).encode() in records
            and json.dumps(last['grad_norm']).encode() in records)
    assert b'position_loss/32-64' in records and b'n_embd' in records and b'wandb_log' in records


def test_the_planned_disk_peak_is_the_measured_one(tiny_data, tmp_path, monkeypatch):
    """The plan's 'at most N GB on the disk at once' against the run's own files, measured after
    every write: a save holds its new pair beside the old ones (4 saves, keep_last=1: 2
    checkpoints and 3 optimizer states at once), then the average is written at the end. Within
    10% (the files' own records beyond the float32 weights and moments)."""
    out, sizes = tmp_path / 'run', []
    real = checkpoint.save

    def save(obj, path):
        real(obj, path)
        sizes.append(sum(f.stat().st_size for f in out.iterdir()
                         if f.name.startswith(('ckpt_', 'optim_', 'avg'))))
    monkeypatch.setattr(checkpoint, 'save', save)
    r = run_train(*TINY, f'--data_dir={tiny_data}', f'--out_dir={out}', '--ckpt_interval=2',
                  '--keep_last=1', '--average_last=[2]', '--average_interval=4',
                  '--n_embd=96')  # the records' bytes beside the tensors' a few percent
    assert r.returncode == 0, r.stderr[-3000:]
    planned = float(r.stdout.split('; at most ')[1].split(' GB')[0]) * 2 ** 30
    assert len(sizes) == 4 * 2 + 1 and max(sizes) == pytest.approx(planned, rel=0.1)
    print(f"planned {planned:,.0f} bytes, measured {max(sizes):,} at most")
