"""tools/study.py end to end at a tiny scale: every run trained and evaluated along its training,
results.json holding the seeds' own numbers, the matched-fit control recomputed here, summary.md's
verdicts made from them, and a rerun that resumes."""

import glob
import json
import os
import platform
import subprocess
import sys
from statistics import mean

import numpy as np
import pytest
import torch

from conftest import ROOT, byte_dataset

PARTS = "--parts=['lm_sw', 'needle_nope']"


@pytest.fixture(scope='module')
def long_data(tmp_path_factory):
    """Documents long enough for the study's 16x windows (2049 bytes): about 3000 bytes each."""
    return byte_dataset(tmp_path_factory.mktemp('long') / 'byte', 4, 2, 600)


def run_study(out, *args):
    return subprocess.run([sys.executable, '-m', 'tools.study', f'--out={out}', '--tiny=True',
                           '--seeds=[1, 2]', *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)


def first_crossing(steps, x):
    """The reference's 8-16x CE where its in-distribution CE first reaches x, written out with
    numpy."""
    xs = np.array([m['bands']['in'] for m in steps.values()])
    ys = np.array([m['bands']['8-16x'] for m in steps.values()])
    for i in range(len(xs) - 1):
        lo, hi = sorted(xs[i:i + 2])
        if lo <= x <= hi and lo < hi:
            order = np.argsort(xs[i:i + 2])
            return float(np.interp(x, xs[i:i + 2][order], ys[i:i + 2][order]))
    return None


def test_study_trains_evaluates_and_summarises(tmp_path, long_data):
    out = str(tmp_path / 'study')
    # one run cut short first, with the study's own arguments (tools/study.py's NEEDLE, the part's,
    # VARIANTS['vpad'], TINY['task']): the study resumes it
    d = os.path.join(out, 'needle_nope', 'vpad', 's1')
    r = subprocess.run([sys.executable, 'train.py', 'configs/needle.py', '--eval_interval=100000',
                        '--task_eval_samples=20', '--ckpt_interval=20', '--spike_threshold=0',
                        '--pos_encoding=nope', '--weight_decay=0.0', '--dropout_type=vpad',
                        '--dropout=0.1', '--n_layer=2', '--n_embd=32', '--n_head=2',
                        '--max_tokens=40960', '--ckpt_interval=2', '--eval_iters=2',
                        '--task_eval_samples=4', '--halt_at=4', '--seed=1', f'--out_dir={d}',
                        '--device=cpu'], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_study(out, f'--data_dir={long_data}', PARTS, "--variants=['no_wd', 'pl_d', 'vpad']")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert '12 runs' in r.stdout
    assert 'resuming' in open(os.path.join(d, 'train.log')).read()
    results = json.load(open(os.path.join(out, 'results.json')))
    P = results['parts']
    assert set(P) == {'lm_sw', 'needle_nope'} and set(P['lm_sw']) == {'no_wd', 'pl_d', 'vpad'}
    # time per run: training from the logged step times (the median x 20 steps), evaluation's wall
    # clock
    log = [json.loads(line) for line in open(os.path.join(out, 'lm_sw', 'pl_d', 's2', 'log.jsonl'))]
    ms = sorted(x['ms'] for x in log if x['event'] == 'train')
    train = ms[len(ms) // 2] * 20 / 60000
    assert results['minutes']['lm_sw']['pl_d'][1][0] == pytest.approx(train, abs=0.005)
    assert all(t >= 0 and e >= 0 for runs in results['minutes']['lm_sw'].values() for t, e in runs)
    # evaluation's wall clock as evaluate() kept it in eval.json (a copied run keeps it, not its
    # files' times), a time and not a measure
    kept = json.load(open(os.path.join(out, 'lm_sw', 'pl_d', 's2', 'eval.json')))
    assert results['minutes']['lm_sw']['pl_d'][1][1] == pytest.approx(kept['eval_minutes'],
                                                                     abs=0.005)
    assert 'eval_minutes' not in P['lm_sw']['pl_d'] and 'cpu' not in P['lm_sw']['pl_d']
    # every run held to AVX2 on x86 (PINNED), so that a rerun on an AVX-512 machine matches
    if platform.machine() == 'x86_64' and torch.backends.cpu.get_cpu_capability() != 'DEFAULT':
        assert kept['cpu'] == 'AVX2'
    assert '| lm_sw / PL-D | ' in open(os.path.join(out, 'summary.md')).read()
    evals = {v: [json.load(open(os.path.join(out, 'lm_sw', v, f's{s}', 'eval.json')))
                 for s in (1, 2)]
             for v in P['lm_sw']}
    e = evals['vpad'][0]
    # checkpoints along training (20 steps, one every 2): at least 6, the last the final, denser in
    # the anneal
    steps = [int(s) for s in e['steps']]
    assert (steps == sorted(steps) and len(steps) >= 6 and steps[-1] == e['final'] == 20
            and e['stable_end'] == 16)
    assert sum(s > 16 for s in steps) >= 2 and sum(s <= 8 for s in steps) <= 3
    # the means and stds are those of the runs' own evaluations, at every checkpoint (results.json:
    # 5 decimals)
    for s in e['steps']:
        band = P['lm_sw']['vpad']['steps'][s]['bands']['8-16x']
        assert band['seeds'] == pytest.approx(
            [x['steps'][s]['bands']['8-16x'] for x in evals['vpad']], abs=6e-6)
        # two different models
        assert band['mean'] == pytest.approx(mean(band['seeds']), abs=1e-5) and band['std'] > 0
        rise = P['lm_sw']['vpad']['steps'][s]['rise']['8-16x']['seeds']
        assert rise == pytest.approx(
            [x['steps'][s]['bands']['8-16x'] - x['steps'][s]['bands']['in'] for x in evals['vpad']],
            abs=6e-6)
    m = e['steps']['20']
    assert (len(m['curve']) == 128 and len(m['entropy_curve']) == 4
            and len(m['entropy_curve'][0]) == 128)
    assert all(0 <= h <= np.log(64 * 16) for layer in m['entropy_curve'] for h in layer)
    assert (e['avg_anneal']['bands'] != m['bands']
            and e['avg_stable']['bands'] != e['steps']['16']['bands'])
    assert (len(e['probe']['rel_err']) == 4 and len(e['probe']['r']) == 4
            and 'probe' not in evals['no_wd'][0])
    # matched fit: the reference's CE at the other run's final in-distribution CE, seed by seed
    for a, b in (('no_wd', 'pl_d'), ('no_wd', 'vpad'), ('pl_d', 'vpad')):
        want = [first_crossing(ea['steps'], eb['steps']['20']['bands']['in'])
                for ea, eb in zip(evals[a], evals[b])]
        got = results['matched']['lm_sw'][f'{a}|{b}']
        if None in want:
            assert '8-16x' not in got
        else:
            assert np.allclose(got['8-16x']['seeds'], want, atol=6e-6, rtol=0)
    acc = P['needle_nope']['pl_d']['steps']['20']['accuracy']
    assert (list(acc) == ['64', '128', '256', '512', '1024']
            and all(0 <= a['mean'] <= 1 for a in acc.values()))
    assert 'avg_anneal' in P['needle_nope']['pl_d'] and 'probe' not in P['needle_nope']['pl_d']
    # a curve: mean and std lists, at the end only
    curve = P['lm_sw']['vpad']['steps']['20']['entropy_curve'][0]
    assert (set(curve) == {'mean', 'std'} and len(curve['mean']) == 128
            and 'entropy_curve' not in P['lm_sw']['vpad']['steps']['2'])
    # the claims: numbers from the JSON, raw and matched verdicts, the probe, averaging
    summary = open(os.path.join(out, 'summary.md')).read()
    x, y = (P['lm_sw']['no_wd']['steps']['20']['bands']['8-16x'],
            P['lm_sw']['vpad']['steps']['20']['bands']['8-16x'])
    assert (f"| dropout helps extrapolation: VPAD better than no-WD | lm_sw, CE 8-16x | "
            f"Table 11: VPAD >> WD | no-WD {x['mean']:.3f} ± {x['std']:.3f} | "
            f"VPAD {y['mean']:.3f} ± {y['std']:.3f} |") in summary
    # the claims (lm_sw; the needle's two measures), then each against every baseline: on lm_sw the
    # final checkpoint, the matched fit and two averages; on the needle the final and two averages
    assert summary.count('VPAD beats pre-linear dropout') == 3 + 4 + 2 * 3
    assert summary.count('| VPAD reduces the pre-activation variance mismatch') == 2
    # no WD runs, no WD row
    assert summary.count('checkpoint averaging helps') == 8 and 'WD over-fits' not in summary
    for fig in ('fig1_lm_sw.png', 'frontier.png', 'entropy.png', 'probe.png', 'tasks.png'):
        assert os.path.getsize(os.path.join(out, fig)) > 10_000
    # a rerun trains nothing; given made-up evaluations, the matched fit is the interpolation
    # written out
    for s in (1, 2):
        for v, final_in in (('no_wd', None), ('pl_d', 2.65), ('vpad', 1.0)):
            path = os.path.join(out, 'lm_sw', v, f's{s}', 'eval.json')
            e = json.load(open(path))
            # no-WD: CE in falls 3.0, 2.9, ..., CE 8-16x rises 4.0, 4.2, ...
            for i, m in enumerate(e['steps'].values()):
                m['bands']['in'], m['bands']['8-16x'] = 3.0 - 0.1 * i, 4.0 + 0.2 * i
            if final_in:
                e['steps']['20']['bands']['in'] = final_in
            if v != 'vpad':  # at the end, seeds far apart, PL-D 0.1 better than no-WD in each
                e['steps']['20']['bands']['8-16x'] = (6.0, 6.5)[s - 1] - 0.1 * (v == 'pl_d')
            json.dump(e, open(path, 'w'))
    r = run_study(out, f'--data_dir={long_data}', PARTS, "--variants=['no_wd', 'pl_d', 'vpad']")
    assert r.returncode == 0 and '12 done; 0 to go' in r.stdout
    matched = json.load(open(os.path.join(out, 'results.json')))['matched']['lm_sw']
    # between 2.7 -> 4.6 and 2.6 -> 4.8
    assert matched['no_wd|pl_d']['8-16x']['seeds'] == pytest.approx([4.7, 4.7])
    assert '8-16x' not in matched['no_wd|vpad']  # no-WD never had CE 1.0 in distribution
    summary = open(os.path.join(out, 'summary.md')).read()
    assert 'no-WD never had VPAD' in summary
    # paired, PL-D's gain holds (by seed it is the same 0.1; by mean and std, 6.25 ± 0.35 against
    # 6.15 ± 0.35, it is well within the spread); the premise holds too: no-WD's CE rises beyond 1x
    claim = ('| dropout helps extrapolation: PL-D better than no-WD | lm_sw, CE 8-16x | '
             'Table 11: PL-D >> WD |')
    assert (f"{claim} no-WD 6.250 ± 0.354 | PL-D 6.150 ± 0.354 | +0.100 +0.100 | "
            f"+0.100 [+0.100, +0.100], detectable 0.000 | holds (every seed better) |") in summary
    # the claims, first
    assert (f"{claim} holds (every seed better): +0.100 [+0.100, +0.100], detectable 0.000 |"
            in summary)


def test_paired_verdict():
    """tools/verdict.py against scipy: Student's t quantiles, the interval, and the three
    verdicts."""
    scipy_stats = pytest.importorskip('scipy.stats')
    from tools.verdict import T975, paired
    assert all(abs(T975[df] - scipy_stats.t.ppf(0.975, df)) < 1e-3 for df in T975)
    # seeds far apart; b lower in each by 0.05-0.15
    a, b = [3.0, 4.0, 5.0, 3.5], [2.9, 3.95, 4.85, 3.4]
    r = paired(a, b, lower_is_better=True)
    d = np.subtract(a, b)
    lo, hi = scipy_stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=scipy_stats.sem(d))
    assert (r['diffs'] == pytest.approx(d)
            and (r['lo'], r['hi']) == pytest.approx((lo, hi), abs=1e-3))
    assert r['verdict'] == 'holds' and r['every_seed'] and lo > 0
    # accuracy: higher is better
    assert paired(a, b, lower_is_better=False)['verdict'] == 'reversed'
    r = paired([1.0, 2.0, 3.0], [0.9, 2.1, 2.8], lower_is_better=True)  # +0.1, -0.1, +0.2
    assert r['verdict'] == 'does not hold' and not r['every_seed']
    assert paired([1.0], [0.5], True)['verdict'] == 'no verdict (one seed)'
    with pytest.raises(ValueError, match='the same seeds on both sides'):
        paired([1.0, 2.0], [1.0], True)


def test_study_mamba_parts(tmp_path, long_data):
    """lm_mamba and copy_mamba: Mamba2 runs through the same harness (no attention to measure the
    entropy of; the variance probe on its in_proj and out_proj), and the Copy task scored at its
    source lengths, its claims made from the accuracy beyond the longest training source."""
    out = str(tmp_path / 'study')
    r = run_study(out, f'--data_dir={long_data}', "--parts=['lm_mamba', 'copy_mamba']",
                  "--variants=['no_wd', 'pl_d']", '--seeds=[1]')
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert '4 runs' in r.stdout
    e = json.load(open(os.path.join(out, 'lm_mamba', 'pl_d', 's1', 'eval.json')))
    m = e['steps'][str(e['final'])]
    assert len(m['curve']) == 128 and 'entropy_curve' not in m and 'entropy_bands' not in m
    assert len(e['probe']['rel_err']) == 4  # 4 layers
    # train.py's model line
    assert 'mamba2: ' in open(os.path.join(out, 'lm_mamba', 'pl_d', 's1', 'train.log')).read()
    P = json.load(open(os.path.join(out, 'results.json')))['parts']
    final = lambda v: P['copy_mamba'][v]['steps'][  # noqa: E731
        str(int(P['copy_mamba'][v]['final']['mean']))]
    acc = final('pl_d')['accuracy']
    assert list(acc) == ['10', '12', '14', '16', '20', '40', '80', '160']
    beyond = final('no_wd')['beyond']['seeds']
    finals = [json.load(open(os.path.join(out, 'copy_mamba', 'no_wd', f's{s}', 'eval.json')))
              for s in (1,)]
    assert beyond == pytest.approx(
        [mean(a for L, a in f['steps'][str(f['final'])]['accuracy'].items() if int(L) > 10)
         for f in finals], abs=6e-6)
    summary = open(os.path.join(out, 'summary.md')).read()
    assert ('| dropout helps extrapolation: PL-D better than no-WD | copy_mamba, '
            'accuracy beyond 1x |') in summary
    assert ('| dropout helps extrapolation: PL-D better than no-WD | copy_mamba, '
            'token accuracy beyond 1x |') in summary
    token = final('pl_d')['token_beyond']['mean']
    assert (f"PL-D {token:.3f} ±" in summary
            and 'fraction of right answer tokens by length' in summary)
    assert '| dropout helps extrapolation: PL-D better than no-WD | lm_mamba, CE 8-16x |' in summary
    for fig in ('fig1_lm_mamba.png', 'frontier.png', 'probe.png', 'tasks.png'):
        assert os.path.getsize(os.path.join(out, fig)) > 10_000
    assert not os.path.exists(os.path.join(out, 'entropy.png'))


def test_study_continued_pretraining(tmp_path, long_data):
    """cpt_sw in two phases: phase 1 ('orig', full attention, WD) once per seed; 'sw' its own
    checkpoints measured with the windows; each CPT variant continues phase 1's final weights with
    the windows on, a constant learning rate, and averages of its last 10 / 20 / 30 checkpoints."""
    out = str(tmp_path / 'study')
    r = run_study(out, f'--data_dir={long_data}', "--parts=['cpt_sw']",
                  "--variants=['sw', 'no_wd', 'pl_d']", '--seeds=[1]')
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert '4 runs' in r.stdout  # phase 1 is kept when --variants leaves it out
    run = lambda v, s=1: os.path.join(out, 'cpt_sw', v, f's{s}')  # noqa: E731
    orig, sw, pl_d = (json.load(open(os.path.join(run(v), 'eval.json')))
                      for v in ('orig', 'sw', 'pl_d'))
    log = open(os.path.join(run('pl_d'), 'train.log')).read()
    assert (f"continued pre-training from {os.path.join(run('orig'), 'ckpt_000020.pt')} (step 20)"
            in log)
    cfg = torch.load(os.path.join(run('pl_d'), 'ckpt_000020.pt'), weights_only=True)['config']
    assert (cfg['window'] == [32, 32, 32, 0]
            and cfg['pos_encoding'] == ['rope', 'rope', 'rope', 'nope'])
    assert (cfg['schedule'] == 'constant' and cfg['learning_rate'] == 2e-4
            and cfg['dropout_type'] == 'pre_linear')
    first = torch.load(os.path.join(run('orig'), 'ckpt_000020.pt'), weights_only=True)['config']
    assert first['window'] == 0 and first['weight_decay'] == 0.1 and first['dropout_type'] == 'none'
    # 'sw' is phase 1's checkpoints with the windows: the same up to the window (curve points every
    # 16 positions, a moving average of 32), different after it
    assert (sw['steps'].keys() == orig['steps'].keys()
            and 'ckpt_000002.pt' not in os.listdir(run('sw')))
    a, b = orig['steps']['20']['curve'], sw['steps']['20']['curve']
    assert (a[:2] == pytest.approx(b[:2], abs=1e-6)
            and all(abs(x - y) > 1e-6 for x, y in zip(a[4:], b[4:])))
    assert ({'avg_10', 'avg_20', 'avg_30'} <= set(pl_d) and 'avg_anneal' not in pl_d
            and 'avg_anneal' in orig)
    summary = open(os.path.join(out, 'summary.md')).read()
    P = json.load(open(os.path.join(out, 'results.json')))['parts']
    x = P['cpt_sw']['sw']['steps']['20']['bands']['8-16x']
    assert ("| windows alone: SW without CPT better than Orig. | cpt_sw, CE 8-16x | "
            "Table 1: Orig. 0.0, SW 0.0 |") in summary
    assert (f"SW, no CPT {x['mean']:.3f} ± {x['std']:.3f}" in summary
            and 'the last 20 of CPT | cpt_sw' in summary)
    assert 'phase 1 (SW: its checkpoints with the windows)' in summary
    assert os.path.getsize(os.path.join(out, 'fig1_cpt_sw.png')) > 10_000


def test_study_methods(tmp_path, long_data):
    """The methods part: randomized positions trained, YaRN a view (no_wd's own checkpoints with
    rope_scaling='yarn'), DroPE a CPT of no_wd's final checkpoint without positions; no_wd is kept
    because YaRN and DroPE need it, and trained in the first wave."""
    out = str(tmp_path / 'study')
    r = run_study(out, f'--data_dir={long_data}', "--parts=['methods']",
                  "--variants=['yarn', 'drope', 'rand']", '--seeds=[1]')
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert '4 runs' in r.stdout
    run = lambda v, s=1: os.path.join(out, 'methods', v, f's{s}')  # noqa: E731
    no_wd, yarn, drope = (json.load(open(os.path.join(run(v), 'eval.json')))
                          for v in ('no_wd', 'yarn', 'drope'))
    assert (f"continued pre-training from {os.path.join(run('no_wd'), 'ckpt_000020.pt')} (step 20)"
            in open(os.path.join(run('drope'), 'train.log')).read())
    cfg = torch.load(os.path.join(run('drope'), 'ckpt_000020.pt'), weights_only=True)['config']
    assert (cfg['pos_encoding'] == 'nope' and cfg['schedule'] == 'constant'
            and cfg['weight_decay'] == 0.0)
    source = torch.load(os.path.join(run('no_wd'), 'ckpt_000020.pt'), weights_only=True)['config']
    assert source['pos_encoding'] == 'rope' and cfg['learning_rate'] == source['learning_rate'] / 10
    # 100 steps, tiny too
    assert max(glob.glob(os.path.join(run('drope'), 'ckpt_*.pt'))).endswith('ckpt_000100.pt')
    assert torch.load(os.path.join(run('rand'), 'ckpt_000020.pt'),
                      weights_only=True)['config']['rope_random'] == 8
    # YaRN: no_wd's checkpoints, no training of its own, every measure changed by the scaling
    assert (os.listdir(run('yarn')) == ['eval.json']
            and yarn['steps'].keys() == no_wd['steps'].keys())
    a, b = no_wd['steps']['20']['bands'], yarn['steps']['20']['bands']
    assert all(abs(a[k] - b[k]) > 1e-6 for k in a)
    summary = open(os.path.join(out, 'summary.md')).read()
    P = json.load(open(os.path.join(out, 'results.json')))['parts']
    x = P['methods']['yarn']['steps']['20']['bands']['8-16x']
    assert ("| YaRN helps: better than no-WD (nothing) | methods, CE 8-16x | its own paper | no-WD"
            in summary)
    # fit, along, final
    assert f"YaRN {x['mean']:.3f} ± {x['std']:.3f}" in summary and summary.count('| DroPE |') == 3
    assert os.path.getsize(os.path.join(out, 'fig1_methods.png')) > 10_000
    assert os.path.getsize(os.path.join(out, 'methods.png')) > 10_000


def test_study_methods_on_the_probes(tmp_path):
    """The methods on the two probes of tasks.py, from their configs: the delay copy with learned
    positions (its length is fixed, so every test delay fits their table), not the offset; DroPE's
    CPT at a tenth of the task's own learning rate. Accuracy is scored at every test length."""
    out = str(tmp_path / 'study')
    r = run_study(out, "--parts=['methods_offset', 'methods_delay']",
                  "--variants=['learned', 'drope']", '--seeds=[1]')
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert '5 runs' in r.stdout  # offset: no_wd, drope; delay: no_wd, drope, learned
    P = json.load(open(os.path.join(out, 'results.json')))['parts']
    assert (list(P['methods_offset']) == ['no_wd', 'drope']
            and list(P['methods_delay']) == ['no_wd', 'drope', 'learned'])
    for p, lengths in (('methods_offset', ['64', '128', '256', '512', '1024']),
                       ('methods_delay', ['8', '16', '32', '64', '128'])):
        assert all(list(m['accuracy']) == lengths for v in P[p] for m in P[p][v]['steps'].values())
    last = lambda v: torch.load(  # noqa: E731
        max(glob.glob(os.path.join(out, 'methods_delay', v, 's1', 'ckpt_*.pt'))),
        weights_only=True)
    cfg = last('drope')['config']
    assert (cfg['task'] == 'delay_copy' and cfg['pos_encoding'] == 'nope'
            and cfg['learning_rate'] == 1e-3 / 10)
    # a task's loss jumps (DroPE's recalibration tripped the check)
    assert cfg['spike_threshold'] == 0
    learned = last('learned')
    assert learned['model']['wpe.weight'].shape[0] == 138  # 128 + 2 * 4 + 3 tokens, less the last
    assert (os.path.getsize(os.path.join(out, 'tasks.png')) > 10_000
            and os.path.getsize(os.path.join(out, 'methods.png')) > 10_000)


def test_report_rebuilds_the_paired_claims_from_saved_results(tmp_path):
    """--report: the summary of a saved results.json (assets/, nothing trained), its paired
    verdicts recomputed here with scipy from the seeds' own numbers in the JSON."""
    scipy_stats = pytest.importorskip('scipy.stats')
    saved = os.path.join(ROOT, 'assets', 'study_cpt_results.json')
    r = subprocess.run([sys.executable, '-m', 'tools.study', f'--report={saved}',
                        f'--out={tmp_path}'],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    P = json.load(open(saved))['parts']['cpt_sw']
    wd, pl_d = (P[v]['steps'][str(int(P[v]['final']['mean']))]['bands']['8-16x']
                for v in ('wd', 'pl_d'))
    d = np.subtract(wd['seeds'], pl_d['seeds'])  # PL-D's gain over WD, per seed
    lo, hi = scipy_stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=scipy_stats.sem(d))
    verdict = 'holds' if lo > 0 else 'reversed' if hi < 0 else 'does not hold'
    claim = ('| SW CPT with dropout extrapolates: PL-D better than WD | cpt_sw, CE 8-16x | '
             'Table 1: WD 0.0, dropout ~100 |')
    summary = open(tmp_path / 'summary.md').read()
    assert (f"{claim} WD {wd['mean']:.3f} ± {wd['std']:.3f} | "
            f"PL-D {pl_d['mean']:.3f} ± {pl_d['std']:.3f} | "
            + ' '.join(f'{x:+.3f}' for x in d)
            + f" | {d.mean():+.3f} [{lo:+.3f}, {hi:+.3f}], detectable {(hi - lo) / 2:.3f} "
            f"| {verdict}") in summary
    # the premise: SW without CPT does not fail beyond the length (its CE falls beyond 1x), so the
    # claim is not shown there, whichever way the comparison goes
    assert f"{claim} not shown |" in summary and not r.stdout.startswith('0 runs')


def test_study_tables_1_and_5_with_retrieval_learned_in_phase_1(tmp_path):
    """cpt_niah and cpt_niah_mamba: phase 1 on language mixed with NIAH-1 documents, CPT from its
    final checkpoint on language alone (the mixture never reaches CPT), NIAH-1 scored by length,
    and the outcome of the reading rules in the summary; Table 1 (and 5) in the layout
    eval_niah.py prints."""
    data = byte_dataset(tmp_path / 'long' / 'byte', 4, 2, 1000)  # 16x of 256: 4097-byte windows
    out = str(tmp_path / 'study')
    r = subprocess.run([sys.executable, '-m', 'tools.study', f'--out={out}', '--tiny=True',
                        '--seeds=[1]',
                        f'--data_dir={data}', "--parts=['cpt_niah', 'cpt_niah_mamba']",
                        "--variants=['sw', 'wd', 'pl_d', 'pn_d_p0.2']"],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    config = lambda part, v: torch.load(  # noqa: E731
        sorted(glob.glob(os.path.join(out, part, v, 's1', 'ckpt_*.pt')))[-1],
        weights_only=True)['config']
    for part, mix in (('cpt_niah', 0.5), ('cpt_niah_mamba', 0.9)):  # Mamba2: its third pilot
        assert config(part, 'orig')['niah_mix'] == mix and config(part, 'orig')['block_size'] == 256
        assert config(part, 'orig')['niah_task'] == 'niah_single_1_short'
        for v in ('wd', 'pl_d' if part == 'cpt_niah' else 'pn_d_p0.2'):
            assert config(part, v)['niah_mix'] == 0.0  # CPT: language alone
            assert 'NIAH-1' not in open(os.path.join(out, part, v, 's1', 'train.log')).read()
    assert config('cpt_niah', 'wd')['window'] == [128, 128, 128, 0] * 2
    P = json.load(open(os.path.join(out, 'results.json')))['parts']
    final = P['cpt_niah']['pl_d']['steps'][str(int(P['cpt_niah']['pl_d']['final']['mean']))]
    assert list(final['niah']) == ['256', '512', '1024', '2048', '4096']
    assert final['niah_far']['mean'] == pytest.approx(mean([final['niah']['2048']['mean'],
                                                             final['niah']['4096']['mean']]),
                                                      abs=1e-5)
    summary = open(os.path.join(out, 'summary.md')).read()
    assert '**Table 1 in small (cpt_niah)**, by the reading rules' in summary
    assert '**Table 5 in small (cpt_niah_mamba)**, by the reading rules' in summary
    assert summary.count('**no outcome yet (1 of 3 seeds)**') == 2  # one seed: no reading
    assert ('NIAH-1 accuracy by length' in summary
            and os.path.getsize(os.path.join(out, 'niah.png')) > 10_000)
    # Table 1 in eval_niah.py's layout: a row per variant, % by length, the training length marked
    table = json.load(open(os.path.join(out, 'table_cpt_niah.json')))
    assert [r['label'] for r in table['rows']] == ['Orig.', 'SW, no CPT', 'WD', 'PL-D']
    assert table['train_length'] == 256
    pl_d = {L: 100 * x['mean'] for L, x in final['niah'].items()}
    assert table['rows'][3]['score'] == pytest.approx(pl_d)
    assert '| row | 256* | 512 |' in open(os.path.join(out, 'table_cpt_niah.md')).read()


# -----------------------------------------------------------------------------
# the claims tables of docs/study-numbers.md against their results JSON: every verdict by its rule,
# its floor clause and its premise (issue 63), recomputed here apart from tools/study.py
NUMBERS = os.path.join(ROOT, 'docs', 'study-numbers.md')
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776}  # Student's t, as any table (test_paired_verdict)


def sections(text):
    """docs/study-numbers.md -> [(results file in assets/, summary text)], one per '## ' heading."""
    out = []
    for part in text.split('\n## ')[1:]:
        results = part.split('--report=assets/')[1].split(' ')[0]
        out.append((results, part.split('\n\n', 2)[2]))
    return out


def rows(summary, head):
    """The rows, split and stripped, of every table of a summary whose header starts with head."""
    out = []
    for table in summary.split(head)[1:]:
        lines = table.split('\n\n')[0].splitlines()[2:]  # (the rest of the header, the rule)
        out += [[c.strip() for c in line.strip('|').split(' | ')] for line in lines]
    return out


def niah_key(measure):
    """A NIAH-1 measure's name in the summary -> its key in the JSON: 8-16x (cpt_niah) or 2x."""
    return 'niah_far' if measure.startswith('NIAH-1 at 8-16x') else 'niah_2x'


def premise(P, p, v, measure, cpt):
    """Does run v of part p fail beyond its training length on this measure (the premise,
    docs/study.md)? Seeds from the JSON; the paired rule (the 95% t-interval's lower bound above
    0) by hand."""
    kind = kind_of(measure)
    r, T = P[p][v], int(P[p][v]['train_length']['mean'])
    last = r['steps'][str(int(r['final']['mean']))]
    orig = P[p].get('orig', {}).get('steps', {})
    orig = orig.get(str(int(P[p]['orig']['final']['mean']))) if orig else None
    if kind == 'niah':
        return last[niah_key(measure)]['mean'] < 0.3 * orig['niah'][str(T)]['mean']

    def above(d):  # the mean of d over seeds lies above 0 by the paired rule (one seed: its sign)
        if len(d) == 1:
            return d[0] > 0
        return mean(d) - T975[len(d) - 1] * np.std(d, ddof=1) / np.sqrt(len(d)) > 0
    if kind == 'lm':
        return above(last['rise']['8-16x']['seeds'])
    acc = last['accuracy']
    far = [mean(x) for x in zip(*(a['seeds'] for L, a in acc.items() if int(L) >= 8 * T))]
    low = not cpt or mean(far) < 0.3 * orig['accuracy'][str(T)]['mean']
    return above(list(np.subtract(acc[str(T)]['seeds'], far))) and low


def kind_of(measure):
    return 'lm' if measure.startswith('CE') else 'niah' if measure.startswith('NIAH') else 'task'


def check_verdict(text):
    """One verdict cell against its rule: 'holds' iff the t-interval lies above 0, 'reversed' iff
    below, else 'does not hold' (rows whose printed bounds round to 0 are not judged)."""
    word = text.split(':')[0].split(' (every')[0]
    lo, hi = (float(x) for x in text.split('[')[1].split(']')[0].split(', '))
    if lo == 0 or hi == 0:
        return
    assert word == ('holds' if lo > 0 else 'reversed' if hi < 0 else 'does not hold'), text


def check_claims(summary, P):
    """The claims of one summary: the floor clause and the rule on every comparison (the detail
    table), the premise per measure on every claim (the first table)."""
    bounded = lambda where: 'accuracy' in where or 'NIAH' in where  # noqa: E731  (0 to 1)
    at = lambda cell: cell.rsplit(' ', 3)[-3:]  # noqa: E731  '... 0.000 ± 0.000' -> its numbers
    checked, floors = 0, {}  # (claim, measure, baseline) -> at a bound: the first table's too
    detail, claims = (f'| claim | part, measure | paper | {x}' for x in ('baseline |', 'verdict'))
    for claim, where, paper, base, second, diffs, interval, word in rows(summary, detail):
        if ' ± ' not in base:  # (a baseline the runs never had: '-')
            continue
        (x, _, sx), (y, _, sy) = at(base), at(second)
        floor = bounded(where) and sx == sy == '0.000' and x == y and x in ('0.000', '1.000')
        floors.setdefault((claim, where, 'final'), floor)  # the first baseline: the final ckpt
        floors[(claim, where, base)] = floor
        assert word.startswith('not testable') == floor, (claim, where, base, second, word)
        if floor:
            assert word == f"not testable ({'floor' if x == '0.000' else 'ceiling'})"
        else:
            check_verdict(f'{word}: {interval}')
        checked += 1
    for claim, where, paper, last, strongest, against in rows(summary, claims):
        p, measure = where.split(', ', 1)
        if p not in P:
            continue
        cpt = paper.startswith(('Table 1:', 'Table 5:'))
        runs = [r for r in ('orig', 'sw') if r in P[p]] if cpt else ['no_wd']
        shown = all(premise(P, p, r, measure, cpt) for r in runs)
        assert (last == 'not shown') == (not shown), (claim, where, last)
        assert (against == 'not shown') == (not shown), (claim, where, against)
        if shown:
            for verdict_, key in ((last, 'final'), (against, strongest)):
                assert verdict_.startswith('not testable') == floors[(claim, where, key)], \
                    (claim, where, key, verdict_)
                if not floors[(claim, where, key)]:
                    check_verdict(verdict_)
        checked += 1
    return checked


def table_1_outcome(P, p, key):
    """Table 1 in small (part p, its NIAH-1 measure key) by the reading rules and the floor
    clause, from the JSON alone."""
    last = {v: r['steps'][str(int(r['final']['mean']))] for v, r in P[p].items()}
    T = str(int(P[p]['orig']['train_length']['mean']))  # 1x
    one_x = last['orig']['niah'][T]['mean']
    if not all(last[r][key]['mean'] < 0.3 * one_x for r in ('orig', 'sw')):
        return 'not shown'
    wd, pl_d = last['wd'][key]['seeds'], last['pl_d'][key]['seeds']
    for bound, name in ((0.0, 'floor'), (1.0, 'ceiling')):
        if all(x == bound for x in (*wd, *pl_d)):
            return f'not testable ({name})'
    d = np.subtract(pl_d, wd)
    beats = mean(d) - T975[len(d) - 1] * np.std(d, ddof=1) / np.sqrt(len(d)) > 0
    wd_fails = mean(wd) < 0.5 * last['wd']['niah'][T]['mean']
    return 'reproduced' if beats and wd_fails else 'not reproduced'


# Table 1's parts: part -> (the reading rules' NIAH-1 measure, the results in assets/)
TABLE_1 = {'cpt_niah': ('niah_far', 'study_niah_results.json'),
           'cpt_niah_far': ('niah_2x', 'study_niah_far_results.json')}


def test_every_claim_verdict_keeps_its_rule_floor_clause_and_premise(tmp_path):
    """In every section of docs/study-numbers.md each verdict agrees with the rule, the floor
    clause (both sides at 0 or 1 in every seed: not testable) and the premise on the claim's own
    measure, recomputed here; Table 1's sections are what --report makes now from their JSON, and
    Table 1's outcome, recomputed from the JSON, is the one the summary, README and docs say."""
    found = dict(sections(open(NUMBERS).read()))
    runs = {p: subprocess.Popen([sys.executable, '-m', 'tools.study', f'--report=assets/{results}',
                                 f'--out={tmp_path / p}'],  # relative: the path is in the text
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
            for p, (_, results) in TABLE_1.items()}
    for results, summary in found.items():
        parts = json.load(open(os.path.join(ROOT, 'assets', results)))['parts']
        assert check_claims(summary, parts) > 0, results
    outcomes = {}
    for p, (key, results) in TABLE_1.items():
        assert runs[p].wait(timeout=120) == 0, runs[p].stderr.read()[-2000:]
        made = open(tmp_path / p / 'summary.md').read()
        P = json.load(open(os.path.join(ROOT, 'assets', results)))['parts']
        assert check_claims(made, P) > 0  # what the code makes now, then what the docs hold
        outcomes[p] = table_1_outcome(P, p, key)
        said = f'**Table 1 in small ({p})**, by the reading rules'
        assert said in made, p
        assert f'**{outcomes[p]}**' in made.split(said)[1].split('\n')[0], p
        assert found[results].rstrip('\n') == made.rstrip('\n'), \
            'docs/study-numbers.md is stale: python -m tools.study_numbers'
    # the committed runs of cpt_niah: WD and PL-D at 0 in every seed
    assert outcomes['cpt_niah'] == 'not testable (floor)'
    for doc in ('README.md', 'docs/study.md'):  # the prose says what the rules say
        prose = open(os.path.join(ROOT, doc)).read()
        for p, outcome in outcomes.items():
            assert f'**{outcome}**' in prose, (doc, p, outcome)
        # a line on cpt_niah alone never reads it "not reproduced" (its rules did, before the
        # floor clause)
        for line in (x for x in prose.splitlines() if 'cpt_niah' in x or 'By the reading' in x):
            if 'cpt_niah_far' not in line:
                assert 'not reproduced' not in line.replace('read "not reproduced"', ''), \
                    (doc, line)


def test_table_1_with_far_needles_reads_its_gate_first(tmp_path):
    """cpt_niah_far (docs/study.md: Table 1 with a positive control): every scored needle lies at
    least FAR_GAP tokens before the prompt's end, and the summary reads the gate, on the pilot's
    seed, before any outcome: on cpt_niah's own numbers it misses ((b) SW without CPT finds 0.65
    at 1x, (c) no CPT variant reaches 0.5 at 2x), so the part is not testable in small; with SW at
    0 and PL-D at 0.8 at 2x in seed 1 it passes and the reading rules give the outcome."""
    import ruler
    from tokens import Tokenizer
    tokenizer, data, sizes = Tokenizer({'kind': 'byte'}), ruler.Data(say=lambda *a: None), {}
    for L in (256, 512):
        for i in range(20):
            text, (answer,) = ruler.far_prompt('niah_single_1_short', tokenizer, L,
                                               f'niah/{L}/{i}', 42, data, sizes, 144)
            assert len(tokenizer.encode(text[text.rfind(answer) + len(answer):])) >= 144
            assert len(tokenizer.encode(text)) + 16 <= L  # room for the answer, as prompt()'s
    saved = json.load(open(os.path.join(ROOT, 'assets', 'study_niah_results.json')))
    runs = []
    for case in ('missed', 'passed'):
        r = json.loads(json.dumps(saved))
        r['parts'] = {'cpt_niah_far': {v: x for v, x in r['parts']['cpt_niah'].items()
                                       if v != 'attn_d'}}
        r['matched'] = {'cpt_niah_far': r['matched']['cpt_niah']}
        r.pop('minutes')
        if case == 'passed':  # (the final checkpoints: phase 1's step 4000, CPT's 600)
            rows_ = r['parts']['cpt_niah_far']
            for x in rows_['sw']['steps']['4000']['niah'].values():
                x['seeds'][0] = 0.0
            rows_['pl_d']['steps']['600']['niah']['512']['seeds'][0] = 0.8
        json.dump(r, open(tmp_path / f'{case}.json', 'w'))
        runs.append(subprocess.Popen([sys.executable, '-m', 'tools.study',
                                      f'--report={tmp_path}/{case}.json',
                                      f'--out={tmp_path}/{case}'], cwd=ROOT,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    for p in runs:
        assert p.wait(timeout=120) == 0, p.stderr.read()[-2000:]
    missed = open(tmp_path / 'missed' / 'summary.md').read()
    assert ('**The gate of cpt_niah_far** (seed 1, the pilot; docs/study.md): **missed**: '
            '(a) Orig. 1.00 at 1x, at most 0.00 beyond: passed; (b) SW without CPT at most 0.65 '
            'at any length: missed; (c) the best CPT variant at 2x WD 0.40: missed.') in missed
    assert '**Table 1 in small (cpt_niah_far)**: **not testable in small**' in missed
    passed = open(tmp_path / 'passed' / 'summary.md').read()
    assert ('(b) SW without CPT at most 0.00 at any length: passed; (c) the best CPT variant at '
            '2x PL-D 0.80: passed.') in passed and '**passed**' in passed
    assert '**Table 1 in small (cpt_niah_far)**, by the reading rules' in passed
    assert 'not testable in small' not in passed


def test_niah_geometry_prints_the_distances_the_docs_quote():
    """tools/niah_geometry.py, the source of docs/study.md's reason for cpt_niah's floor: of the 20
    fixed prompts a length, 14 (13 under 128) put the needle within 128 bytes of the end at 1x, 8
    at 2x, none at 4x-16x (nearest 136, 250, 227)."""
    r = subprocess.run([sys.executable, '-m', 'tools.niah_geometry'], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith('256: within 128: 14 of 20, under 128: 13;')
    assert lines[1].startswith('512: within 128: 8 of 20, under 128: 8;')
    for line, near in zip(lines[2:], (136, 250, 227)):
        assert f'within 128: 0 of 20, under 128: 0; nearest {near};' in line


def dose_results(path):
    """A results.json of both arms of lm_nope_dose made from lm_nope's 5 seeds (assets/), each WD
    row a copy of WD with its CE 8-16x moved by a made-up amount per seed, its summed decay and the
    norm of its decayed matrices planted: the dose section's input, with no training."""
    saved = json.load(open(os.path.join(ROOT, 'assets', 'study_nope5_results.json')))
    lm = saved['parts']['lm_nope']
    step = str(int(lm['wd']['final']['mean']))
    parts = {}
    for p, rows_ in (('lm_nope_dose', {'no_wd': ('no_wd', 0, 1.0, 0), 'wd': ('wd', 0.125, 0.95, 0),
                                       'wd1.0': ('wd', 1.25, 0.7, 0.05),
                                       'wd3.28': ('wd', 4.11, 0.4, 0.2), 'pn_d': ('pn_d', 0, 1, 0),
                                       'pl_d': ('pl_d', 0, 1, 0), 'vpad': ('vpad', 0, 1, 0)}),
                     ('lm_nope_dose_2x', {'no_wd': ('no_wd', 0, 1.0, 0),
                                          'wd0.5': ('wd', 1.25, 0.75, 0.02),
                                          # one seed's decay did not act (rule 2)
                                          'wd1.64': ('wd', 4.11, [0.5, 0.5, 0.95, 0.5, 0.5],
                                                     0.03)})):
        parts[p] = {}
        for v, (src, dose, norm, shift) in rows_.items():
            r = json.loads(json.dumps(lm[src]))
            r['summed_decay'] = {'mean': dose, 'std': 0.0, 'seeds': [dose] * 5}
            for s, m in r['steps'].items():
                norms = [10 * x for x in (norm if isinstance(norm, list) else [norm] * 5)]
                m['decayed_norm'] = {'mean': mean(norms), 'std': 0.0, 'seeds': norms}
            far, inside = r['steps'][step]['bands']['8-16x'], r['steps'][step]['bands']['in']
            far['seeds'] = [x + shift * (i % 3) for i, x in enumerate(far['seeds'])]
            far['mean'] = mean(far['seeds'])
            rise = r['steps'][step]['rise']['8-16x']
            rise['seeds'] = [x - y for x, y in zip(far['seeds'], inside['seeds'])]
            rise['mean'] = mean(rise['seeds'])
            parts[p][v] = r
    json.dump({'seeds': saved['seeds'], 'parts': parts, 'matched': {p: {} for p in parts}},
              open(path, 'w'))
    return parts


def check_dose(summary, P):
    """lm_nope_dose's reading rules 2, 3, 5 and 6 (docs/study.md) against the summary, each
    recomputed here from the JSON: the norm ratios, WD's action at the paper's dose, the paired
    verdict there (scipy), each seed's least-squares slope (numpy) and the dose-or-rate pairs."""
    scipy_stats = pytest.importorskip('scipy.stats')
    final = lambda r: r['steps'][str(int(r['final']['mean']))]  # noqa: E731

    def interval(d):
        d = np.asarray(d, dtype=float)
        return scipy_stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=scipy_stats.sem(d))
    said = 0
    for p, top in (('lm_nope_dose', 'wd3.28'), ('lm_nope_dose_2x', 'wd1.64')):
        if p not in P:
            continue
        section = summary.split(f"**{p}**, weight decay's dose")[1]
        rows_ = {r[0]: r for r in rows(section.split('\n\n**')[0], '| variant | summed decay')}
        base = final(P[p]['no_wd'])['decayed_norm']['seeds']
        ratios = {}
        for v, r in ((v, r) for v, r in P[p].items() if v == 'no_wd' or v.startswith('wd')):
            ratios[v] = np.divide(final(r)['decayed_norm']['seeds'], base)
            name, dose, norms = rows_[NAMES[v]][:3]
            assert float(dose) == pytest.approx(r['summed_decay']['mean'], rel=1e-3, abs=1e-9)
            assert [float(x) for x in norms.split()] == pytest.approx(ratios[v], abs=6e-4)
        acted = all(ratios[top] < 0.9)
        assert (f"({NAMES[top]}, summed decay {P[p][top]['summed_decay']['mean']:.3g}): "
                f"**{'yes' if acted else 'no'}**") in summary
        ce = {v: np.array(final(r)['bands']['8-16x']['seeds']) for v, r in P[p].items()}
        rise = np.array(final(P[p]['no_wd'])['rise']['8-16x']['seeds'])
        premise = interval(rise)[0] > 0
        lo, hi = interval(ce[top] - ce['no_wd'])
        outcome = ('not shown' if not premise else 'not testable (the decay did not act)'
                   if not acted else 'holds' if lo > 0 else 'reversed' if hi < 0
                   else 'does not hold')
        line = summary.split(f"**At the paper's dose ({p})**")[1].split('\n')[0]
        assert line.split('**')[1].split(':')[0].split(' (every')[0] == outcome, line
        if outcome not in ('not shown', 'not testable (the decay did not act)'):
            assert f"[{lo:+.3f}, {hi:+.3f}], detectable {(hi - lo) / 2:.3f}" in line
        wd_rows = [v for v in P[p] if v == 'no_wd' or v.startswith('wd')]
        x = [P[p][v]['summed_decay']['mean'] for v in wd_rows]
        for what, get in (('CE 8-16x', lambda r: r['bands']['8-16x']['seeds']),
                          ('the rise', lambda r: r['rise']['8-16x']['seeds'])):
            y = np.array([get(final(P[p][v])) for v in wd_rows])  # (doses, seeds)
            slopes = [np.polyfit(x, y[:, s], 1)[0] for s in range(y.shape[1])]
            lo, hi = interval(slopes)
            sign = 'positive' if lo > 0 else 'negative' if hi < 0 else 'neither'
            line = summary.split(f"Rule 5, {what} against the summed decay ({p}:")[1]
            line = line.split('\n')[0]
            assert ' '.join(f'{b:+.3f}' for b in slopes) in line, line
            assert f'**{sign}** by the rule' in line, line
            said += 1
    if {'lm_nope_dose', 'lm_nope_dose_2x'} <= set(P):
        A, B = P['lm_nope_dose'], P['lm_nope_dose_2x']
        for a, b in (('wd1.0', 'wd0.5'), ('wd3.28', 'wd1.64')):
            ce = lambda R, v: np.array(final(R[v])['bands']['8-16x']['seeds'])  # noqa: E731
            d = (ce(A, a) - ce(A, 'no_wd')) - (ce(B, b) - ce(B, 'no_wd'))
            lo, hi = interval(d)
            verdict = 'holds' if lo > 0 else 'reversed' if hi < 0 else 'does not hold'
            assert (f"the first minus the second {d.mean():+.3f} [{lo:+.3f}, {hi:+.3f}]: "
                    f"{verdict}.") in summary
            said += 1
    return said


NAMES = {'no_wd': 'no-WD', 'wd': 'WD', 'pn_d': 'PN-D', 'pl_d': 'PL-D', 'vpad': 'VPAD',
         **{f'wd{x}': f'WD {x}' for x in ('0.5', '1.0', '1.64', '3.28')}}


def test_weight_decay_dose_reads_its_rules(tmp_path):
    """lm_nope_dose's dose section on made-up WD rows (dose_results): every figure and verdict
    recomputed from the JSON, and a section whose numbers were edited fails the check."""
    P = dose_results(tmp_path / 'dose.json')
    r = subprocess.run([sys.executable, '-m', 'tools.study', f'--report={tmp_path}/dose.json',
                        f'--out={tmp_path}/out'], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = open(tmp_path / 'out' / 'summary.md').read()
    assert check_dose(summary, P) == 6
    assert ("**At the paper's dose (lm_nope_dose_2x)**, by the reading rules fixed before the runs "
            "(docs/study.md), no-WD better than WD 1.64 on CE 8-16x: **not testable (the decay did "
            "not act)**") in summary
    assert check_claims(summary, P) > 0
    # the claims name each WD row's dose
    assert ('| WD over-fits the training length: no-WD better than WD 3.28 (WD 3.28: summed '
            'decay 4.11) | lm_nope_dose, CE 8-16x |') in summary
    # planted: a verdict edited by hand; a dose computed without the schedule (wd x lr x steps)
    sign = summary.split('Rule 5, ')[1].split('**')[1]
    for edit in ((f'**{sign}** by the rule', f"**{'neither' if sign != 'neither' else 'positive'}"
                                             f"** by the rule"),
                 ('| 4.11 |', '| 5.67 |')):
        assert edit[0] in summary
        with pytest.raises(AssertionError):
            check_dose(summary.replace(*edit, 1), P)
