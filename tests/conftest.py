import contextlib
import io
import json
import os
import runpy
import subprocess
import sys

import numpy as np
import pytest
import torch

# Triton's kernels (ops/attention_triton.py) run on the CPU, interpreted: set before they exist
os.environ['TRITON_INTERPRET'] = '1'
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
# one thread per pytest-xdist worker (the README's -n 2 on 2 cores), two in a lone pytest; the
# processes tests start inherit it
THREADS = 1 if 'PYTEST_XDIST_WORKER' in os.environ else 2
torch.set_num_threads(THREADS)
os.environ['OMP_NUM_THREADS'] = str(THREADS)

import checkpoint  # noqa: E402
from tokens import Tokenizer, write_shard  # noqa: E402

# a tiny model and run for train.py: 2 micro-steps per iteration, 8 iterations
TINY = ['--device=cpu', '--n_layer=2', '--n_head=4', '--n_embd=32', '--block_size=32',
        '--batch_size=4', '--tokens_per_batch=256', '--max_tokens=2048', '--learning_rate=3e-3',
        '--min_lr=3e-4', '--warmup_frac=0.25', '--eval_iters=2', '--eval_lengths=[32, 64]',
        '--eval_windows=2', '--log_interval=1', '--eval_interval=4', '--ckpt_interval=4']
# CPT takes the source's architecture
CPT = [a for a in TINY if a.split('=')[0] not in ('--n_layer', '--n_head', '--n_embd')]


def byte_dataset(d, n_train, n_val, words_per_doc):
    """A byte-level dataset of made-up sentences in folder d (a pathlib.Path): n_train train and
    n_val val documents of words_per_doc words (about 5 bytes each) -> str(d)."""
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    words = 'the grass is green and the sky is blue while a sun shines over quiet hills'.split()
    tok = Tokenizer({'kind': 'byte'})
    docs = [' '.join(rng.choice(words, size=words_per_doc)) + '.' for _ in range(n_train + n_val)]
    for split, part in (('train', docs[:n_train]), ('val', docs[n_train:])):
        write_shard(str(d / f'{split}.bin'),
                    [t for doc in part for t in tok.encode(doc) + [tok.eot]], tok.n_vocab)
    (d / 'meta.json').write_text(json.dumps({'tokenizer': tok.spec, 'vocab_size': tok.n_vocab,
                                             'eot': tok.eot}))
    return str(d)


@pytest.fixture(scope='session')
def tiny_data(tmp_path_factory):
    """40 train and 4 val documents of a few hundred bytes."""
    return byte_dataset(tmp_path_factory.mktemp('data') / 'tiny' / 'byte', 40, 4, 80)


def run_script(name, *args):
    """python <name> *args in this process (a refusal then costs no torch import) -> (exit code,
    the one-line message of a SystemExit, or ''). Any other exception is the test's failure."""
    argv, cwd = sys.argv, os.getcwd()
    sys.argv = [name, *args]
    os.chdir(ROOT)
    try:
        runpy.run_path(os.path.join(ROOT, name), run_name='__main__')
    except SystemExit as e:
        return (e.code, '') if isinstance(e.code, int) or e.code is None else (1, str(e.code))
    finally:
        sys.argv = argv
        os.chdir(cwd)
        checkpoint.release()  # what the exit of a process of its own would do
    return 0, ''


def run_train(*args):
    """python train.py *args, run in this process (as run_script: a run then costs no torch import)
    -> CompletedProcess with what it printed as stdout and stderr, a refusal's message in stderr.
    Tests that kill a run, or need a process of its own (torchrun, wandb), start one, as do runs
    made from threads: sys.argv, stdout and torch's global generator belong to the process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code, message = run_script('train.py', *args)
    return subprocess.CompletedProcess(['train.py', *args], code, out.getvalue(),
                                       err.getvalue() + (message + '\n' if message else ''))


def read_log(out_dir, event='train'):
    with open(os.path.join(out_dir, 'log.jsonl')) as f:
        return [r for r in map(json.loads, f) if r['event'] == event]


@pytest.fixture(scope='session')
def tiny_run(tiny_data, tmp_path_factory):
    """A finished tiny run (TINY: checkpoints and optimizer states at 4 and 8) -> its out_dir. Read
    only: a test that changes it copies it first."""
    out = str(tmp_path_factory.mktemp('tiny_run') / 'run')
    r = run_train(*TINY, f'--data_dir={tiny_data}', f'--out_dir={out}')
    assert r.returncode == 0, r.stderr
    return out


# The files with the slowest tests first, handed out two at a time (pytest-xdist's default
# gives each worker a quarter of its share at once): the long tests start at once on both workers
# and the short ones fill in behind them, where a long test that started last kept one worker busy
# while the other waited.
SLOW_FIRST = ('test_study.py', 'test_gpu_check.py', 'test_faults.py')


def pytest_configure(config):
    if getattr(config.option, 'maxschedchunk', 0) is None:  # under -n, unless given
        config.option.maxschedchunk = 2


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's order
