"""tools/gpu_check.py in its dry run: every part runs on CPU at tiny sizes, through the code paths
CPU has (flex forward only, compile with aot_eager, no mamba_ssm), and writes its JSON and table."""

import json
import subprocess
import sys

from conftest import ROOT


def dry_run(tmp_path, *flags):
    r = subprocess.run([sys.executable, '-m', 'tools.gpu_check', '--dry_run=True', *flags,
                        f'--out={tmp_path}'], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = json.load(open(tmp_path / 'results.json'))
    status = {x['check']: x['status'] for x in out['results']}
    figure = {x['check']: x['figure'] for x in out['results']}
    assert out['dry_run'] and not [c for c, s in status.items() if s in ('FAIL', 'ERROR')]
    table = (tmp_path / 'results.md').read_text()
    assert table.count('\n| ') == len(status) + 1 and 'CPU (dry run)' in table
    # the torch that ran it, against the pin
    pin = next(line.split('==')[1].split()[0] for line in open(f'{ROOT}/requirements.txt')
               if line.startswith('torch=='))
    assert out['torch_pin'] == pin
    assert f"torch {out['torch']} (requirements.txt pins {pin})" in table
    return status, figure, table


def test_quick_dry_run(tmp_path):
    """The quick check's five parts, each through its code path on CPU with flex forced where
    CPU runs it. The compiled NAPE + VPAD step is one graph: dynamo's counters are read before the
    eager reference, whose flex compiles itself and adds a graph of its own (read after it, the
    check would say 2 and fail a correct step on every GPU)."""
    status, figure, table = dry_run(tmp_path, '--quick=True')
    assert '`python -m tools.gpu_check --quick=True --dry_run=True`' in table
    attention = [c for c in status if c.startswith('attention vs float64')]
    # normalisers, dtypes, offsets
    assert len(attention) == 2 * 2 * 3 and all(status[c] == 'PASS' for c in attention)
    assert all(k in figure[c] for c in attention if 'softmax' in c
               for k in ('flex', 'sdpa', 'manual'))
    assert [c for c in status if c.startswith('compiled vs eager')] == ['compiled vs eager, VPAD']
    assert status['compiled vs eager, VPAD'] == 'PASS'
    # flex, forced
    assert '1 graph(s), 0 graph break(s); forward only' in figure['compiled vs eager, VPAD']
    assert [status[c] for c in status if c.startswith('dropout under bf16')] == ['PASS'] * 3
    assert status['ASEntmax at its micro-batch'] == 'INFO'  # no memory to measure on CPU
    assert [status[c] for c in status if c.startswith('prefill and decoding')] == ['PASS'] * 2
    assert len(status) == 12 + 1 + 3 + 1 + 2  # and nothing of the whole run


def test_dry_run_runs_every_part(tmp_path):
    status, figure, _ = dry_run(tmp_path)
    correctness = [c for c in status
                   if c.startswith(('attention vs float64', 'compiled vs eager',
                                    'dropout under bf16', '20 bf16', 'FSDP2',
                                    'activation checkpointing'))]
    assert (len(correctness) == 12 + 4 + 3 + 2 + 1 + 2
            and all(status[c] == 'PASS' for c in correctness))
    # no kernels on CPU, and it says so
    assert status['mamba_ssm kernels vs the PyTorch scan'] == 'SKIP'
    assert {'the same size as nanoGPT', 'Mamba2-85M', 'ASEntmax at its micro-batch',
            'prefill and decoding at 512'} <= set(status)
    # SDPA: gradients compared too
    assert 'forward only' not in figure['compiled vs eager, attention dropout']
    assert 'forward only' not in figure['compiled vs eager, Mamba2']
