"""study.py end to end at a tiny scale: every run trained and evaluated, results.json holding
the seeds' own numbers, summary.md's verdicts made from them, and a rerun that resumes."""

import json
import os
import subprocess
import sys
from statistics import mean

import pytest

from conftest import ROOT, byte_dataset


@pytest.fixture(scope='module')
def long_data(tmp_path_factory):
    """Documents long enough for the study's 16x windows (2049 bytes): about 3000 bytes each."""
    return byte_dataset(tmp_path_factory.mktemp('long') / 'byte', 4, 2, 600)


def run_study(out, data, *args):
    return subprocess.run([sys.executable, 'study.py', f'--out={out}', f'--data_dir={data}', '--tiny=True',
                           '--seeds=[1, 2]', "--variants=['pl_d', 'vpad']", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_study_trains_evaluates_and_summarises(tmp_path, long_data):
    out = str(tmp_path / 'study')
    r = run_study(out, long_data, "--parts=['lm_nape', 'needle', 'copy_mamba']")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert '12 runs' in r.stdout
    results = json.load(open(os.path.join(out, 'results.json')))
    P = results['parts']
    assert set(P) == {'lm_nape', 'needle', 'copy_mamba'} and set(P['lm_nape']) == {'pl_d', 'vpad'}
    # the means and stds are those of the runs' own evaluations
    evals = [json.load(open(os.path.join(out, 'lm_nape', 'vpad', f's{s}', 'eval.json'))) for s in (1, 2)]
    band = P['lm_nape']['vpad']['final']['bands']['8-16x']
    assert band['seeds'] == [e['final']['bands']['8-16x'] for e in evals]
    assert band['mean'] == mean(band['seeds']) and band['std'] > 0  # two seeds, two different models
    rel = P['lm_nape']['vpad']['final']['relative']['8-16x']['seeds']
    assert rel == [e['final']['bands']['8-16x'] - e['final']['bands']['<=1x'] for e in evals]
    assert len(evals[0]['final']['curve']) == 128 and 'avg10' in evals[0] and len(evals[0]['probe']) == 2
    assert evals[0]['avg10']['bands'] != evals[0]['final']['bands']
    acc = P['needle']['pl_d']['final']['accuracy']
    assert list(acc) == ['64', '128', '256', '512', '1024'] and all(0 <= a['mean'] <= 1 for a in acc.values())
    assert 'avg10' in P['needle']['pl_d'] and 'avg10' not in P['copy_mamba']['pl_d']
    # the table: PL-D vs VPAD on every measure of these parts, the probe, averaging; numbers from the JSON
    summary = open(os.path.join(out, 'summary.md')).read()
    x, y = P['lm_nape']['pl_d']['final']['relative']['8-16x'], P['lm_nape']['vpad']['final']['relative']['8-16x']
    assert f"PL-D {x['mean']:.3f} ± {x['std']:.3f} | VPAD {y['mean']:.3f} ± {y['std']:.3f} |" in summary
    assert summary.count('VPAD beats pre-linear dropout') == 4 and summary.count('variance mismatch') == 2
    assert 'checkpoint averaging' in summary and 'WD hurts' not in summary  # no WD runs, no WD row
    for fig in ('lm.png', 'tasks.png', 'probe.png'):
        assert os.path.getsize(os.path.join(out, fig)) > 10_000
    # a rerun trains nothing
    r = run_study(out, long_data, "--parts=['lm_nape', 'needle', 'copy_mamba']")
    assert r.returncode == 0 and '12 done; 0 to go' in r.stdout


def test_study_resumes_a_run_cut_short(tmp_path):
    out = str(tmp_path / 'study')
    d = os.path.join(out, 'needle', 'vpad', 's1')
    args = ["--parts=['needle']", '--seeds=[1]']
    r = subprocess.run([sys.executable, 'train.py', 'configs/needle.py', '--weight_decay=0.0', '--dropout_type=vpad',
                        '--dropout=0.1', '--n_layer=1', '--n_embd=32', '--n_head=2', '--max_tokens=20480',
                        '--ckpt_interval=1', '--halt_at=4', '--keep_last=10', '--eval_interval=100000',
                        '--task_eval_samples=20', '--seed=1', f'--out_dir={d}', '--device=cpu'],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([sys.executable, 'study.py', f'--out={out}', '--tiny=True', "--variants=['vpad']", *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert 'resuming' in open(os.path.join(d, 'train.log')).read()
