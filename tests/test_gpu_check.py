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
    """The quick check's parts, each through its code path on CPU with flex forced where CPU runs
    it. Each compiled step is one graph: dynamo's counters are read before the eager reference,
    whose flex compiles itself and adds a graph of its own (read after it, the check would say 2
    and fail a correct step on every GPU)."""
    status, figure, table = dry_run(tmp_path, '--quick=True')
    assert '`python -m tools.gpu_check --quick=True --dry_run=True`' in table
    attention = [c for c in status if c.startswith('attention vs float64')]
    # normalisers, dtypes, offsets
    assert len(attention) == 2 * 2 * 3 and all(status[c] == 'PASS' for c in attention)
    assert all(k in figure[c] for c in attention if 'softmax' in c
               for k in ('flex', 'sdpa', 'manual'))
    # the maths with fixed masks, PASS or FAIL; VPAD's drawn masks, INFO
    compiled = {c: s for c, s in status.items() if c.startswith('compiled vs eager')}
    assert compiled == {'compiled vs eager, none, fixed masks': 'PASS',
                        'compiled vs eager, PL-D, fixed masks': 'PASS',
                        'compiled vs eager, VPAD, fixed masks': 'PASS',
                        'compiled vs eager, VPAD, drawn masks': 'INFO',
                        'compiled vs eager, VPAD, drawn masks, reordering off': 'INFO'}
    # flex, forced
    assert '1 graph(s), 0 graph break(s); forward only' in figure['compiled vs eager, VPAD, ' \
                                                                  'fixed masks']
    sites = {c: s for c, s in status.items() if c.startswith('dropout masks')}
    assert sites == {f'dropout masks, {n}, compiled{r}': 'PASS' for n in ('PL-D', 'VPAD')
                     for r in ('', ', activation checkpointing')}
    assert all('12 sites: 0 units' in figure[c] for c in sites)  # 2 layers of 6 sites
    assert [status[c] for c in status if c.startswith('dropout under bf16')] == ['PASS'] * 5
    assert 'kernel flash' in figure['dropout under bf16, attention dropout, causal']
    # speed beside nanoGPT's model, INFO (the goal is the whole run's)
    assert [c.split(', ')[-1] for c in status if c.startswith('speed')] == [
        'nanoGPT', 'none', 'PL-D', 'VPAD']
    assert all(status[c] == 'INFO' and 'the time of none' in figure[c]
               for c in status if c.startswith('speed'))
    # attention_triton's kernels, interpreted: values and gradients
    assert [status[c] for c in status if c.startswith('fused attention')] == ['PASS'] * 2
    assert all(f'{n} ' in figure[c] for c in status if c.startswith('fused attention')
               for n in ('y', 'dq', 'dk', 'dv'))
    # no memory, MFU or kernel to measure on CPU
    assert status['ASEntmax at its micro-batch, fused'] == 'INFO'
    assert [status[c] for c in status if c.startswith('attention dropout with NAPE')] == [
        'INFO'] * 2
    assert [status[c] for c in status if c.startswith('prefill and decoding')] == ['PASS'] * 2
    # compile time apart; no bound without a GPU's peak and bandwidth
    assert all(status[c] == 'INFO' and 'the first run, compiling' in figure[c]
               for c in status if c.startswith('steady state'))
    assert len(status) == 12 + 2 + 5 + 4 + 5 + 4 + 1 + 2 + 4  # and nothing of the whole run


def test_dry_run_runs_every_part(tmp_path):
    """The whole run's own parts (the parts it shares with the quick run, at the same dry-run
    sizes, are test_quick_dry_run's), chosen by --only: the parts whose names contain one of its
    words, and no other (a short GPU lease runs the correctness of dropout first)."""
    words = "['compiled', 'masks', 'checkpointing', 'mamba', '20 bf16', 'FSDP2', 'regularizers', " \
            "'Mamba2']"
    status, figure, table = dry_run(tmp_path, f"--only={words}")
    assert f'--only="{words}"' in table
    assert {c.split(',')[0] for c in status} == {
        'compiled vs eager', 'dropout masks', 'activation checkpointing',
        'mamba_ssm kernels vs the PyTorch scan', '20 bf16 training steps vs fp32',
        'FSDP2 + compile + activation checkpointing + flex vs eager', 'speed', 'Mamba2-85M'}
    correctness = [c for c in status
                   if c.startswith(('compiled vs eager', 'dropout masks', '20 bf16', 'FSDP2',
                                    'activation checkpointing'))]
    assert len(correctness) == 6 + 8 + 2 + 1 + 2
    assert all(status[c] == 'PASS' for c in correctness if 'drawn masks' not in c)
    # no kernels on CPU, and it says so
    assert status['mamba_ssm kernels vs the PyTorch scan'] == 'SKIP'
    assert {'Mamba2-85M', 'speed, NAPE 2L/64 at 64, nanoGPT',
            'speed, NAPE 2L/64 at 64, attention dropout',
            'dropout masks, Mamba2 PL-D, compiled, activation checkpointing'} <= set(status)
    # SDPA: gradients compared too
    assert 'forward only' not in figure['compiled vs eager, attention dropout, fixed masks']
    assert 'forward only' not in figure['compiled vs eager, Mamba2, fixed masks']
