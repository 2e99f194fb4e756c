"""gpu_check.py in its dry run: every part runs on CPU at tiny sizes, through the code paths CPU
has (flex unfused, compile with aot_eager, no mamba_ssm), and writes its JSON and table."""

import json
import subprocess
import sys

from conftest import ROOT


def test_dry_run_runs_every_part(tmp_path):
    r = subprocess.run([sys.executable, 'gpu_check.py', '--dry_run=True', f'--out={tmp_path}'], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = json.load(open(tmp_path / 'results.json'))
    status = {x['check']: x['status'] for x in out['results']}
    assert out['dry_run'] and not [c for c, s in status.items() if s in ('FAIL', 'ERROR')]
    correctness = [c for c in status if c.startswith(('flex/SDPA', 'compiled vs eager', '20 bf16'))]
    assert len(correctness) == 12 + 11 + 1 and all(status[c] == 'PASS' for c in correctness)
    assert status['mamba_ssm kernels vs the PyTorch scan'] == 'SKIP'  # no kernels on CPU, and it says so
    assert {'the same size as nanoGPT', 'Mamba2-85M', 'ASEntmax at its micro-batch', 'prefill and decoding at 512'} <= set(status)
    table = (tmp_path / 'results.md').read_text()
    assert table.count('\n| ') == len(status) + 1 and 'CPU (dry run)' in table
