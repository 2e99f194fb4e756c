"""tools/figure1_gpu.py on the CPU: its plan at the GPU's size (the dose, the minutes, the data
built from Python's own source) and a tiny run end to end, checked against its JSON."""

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT


def test_the_plan_at_the_gpu_size(tmp_path):
    """The dry run: the four rows, ~25M parameters, WD's summed decay the paper's 4.11 by
    train.py's own schedule, at most 8 minutes on an H100, the corpus built from the standard
    library (nothing downloaded)."""
    r = subprocess.run([sys.executable, '-m', 'tools.figure1_gpu', '--dry_run=True',
                        f'--out={tmp_path}'], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    assert 'rows WD, no-WD, PL-D, VPAD' in out and '25.3M parameters, NoPE' in out
    assert 'summed decay 4.110 (the paper' in out
    minutes = float(out.split('estimated ')[1].split(' minutes')[0])
    assert 0 < minutes <= 8
    meta = json.load(open(tmp_path / 'data' / 'byte' / 'meta.json'))
    assert meta['train']['documents'] > 100 and all('site-packages' not in p
                                                     for p in meta['source'])


def test_a_tiny_run_writes_its_json_and_figure(tmp_path, tiny_data):
    """--tiny=True: every row trained and evaluated, the JSON and the PNG written; the WD row at
    its dose (the checkpoint's own summed decay), every row on the same batches from the same
    initial weights (the same validation loss before training, the same first training loss for
    the rows without dropout), the comparisons as the JSON's numbers say."""
    r = subprocess.run([sys.executable, '-m', 'tools.figure1_gpu', '--tiny=True',
                        f'--data={tiny_data}', f'--out={tmp_path}'], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    result = json.load(open(tmp_path / 'figure1.json'))
    rows = {v: x['seeds']['1'] for v, x in result['rows'].items()}
    assert list(rows) == ['wd', 'no_wd', 'pl_d', 'vpad']
    assert rows['wd']['summed_decay'] == pytest.approx(4.11, rel=1e-3)
    assert all(rows[v]['summed_decay'] == 0 for v in ('no_wd', 'pl_d', 'vpad'))
    assert len({x['val_loss_0'] for x in rows.values()}) == 1
    assert rows['wd']['first_loss'] == rows['no_wd']['first_loss']
    far = list(rows['wd']['bands'])[-1]
    gain = rows['wd']['bands'][far] - rows['vpad']['bands'][far]
    assert f"VPAD better than WD at {far} (CE, lower is better): one seed, an observation: " \
           f"{gain:+.3f}" in r.stdout
    assert os.path.getsize(tmp_path / 'figure1.png') > 10_000
    ckpt = next(f for f in os.listdir(tmp_path / 'wd' / 's1') if f.startswith('ckpt_'))
    assert torch.load(tmp_path / 'wd' / 's1' / ckpt, weights_only=True)['config']['seed'] == 1
