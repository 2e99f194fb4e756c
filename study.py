"""
The paper's comparisons in small, with seeds (README "Reproduction at small scale"):

    python study.py                                   # everything: about 1.5 hours on 2 CPU cores
    python study.py --parts="['copy_mamba']" --seeds="[1]"     # a part, one seed

Trains every part x variant x seed with train.py under out/study/<part>/<variant>/s<seed>, `jobs`
runs at a time (each on cores / jobs threads: small models use two single-threaded processes
better than one with two threads), evaluates each finished run (eval.json beside it), then writes
out/study/results.json, out/study/summary.md (the README's tables, made from results.json) and
the figures. Rerun it to resume: finished runs and evaluations are kept, a run cut short goes on
from its newest checkpoint.

The parts, each with the same token budget for every variant:
  lm_nape, lm_nope   next-byte prediction on the first 50K bytes of Shakespeare, 12 epochs of it:
                     a 4 x 128 transformer over-fits them, the regime regularization is for. With
                     NAPE (the paper's) and with no positional encoding at all. Trained on 128
                     tokens, per-position CE on validation plays from 1x to 16x (2048).
  needle             NIAH-1 in symbols (tasks.Needle): the Shakespeare models never answer RULER's
                     English NIAH-1 (README), this is its closest form that a small model learns.
  copy_transformer, copy_mamba   the Copy task (tasks.Copy), exact-match copies up to 16x.
Then the variance-mismatch probe (lm_nape, PL-D vs VPAD, by layer) and checkpoint averaging
(the last K checkpoints of lm_nape and needle runs).
"""

import json
import math
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from statistics import mean, stdev

import torch
from tqdm import tqdm

import checkpoint
from average_ckpts import average
from configurator import configure
from dropout import variance_mismatch
from eval_loss import length_bands, loss_curve, moving_average
from tasks import Copy, Needle, correct_answers
from tokens import TokenData, batch_rng

# -----------------------------------------------------------------------------
out = 'out/study'
data_dir = 'data/shakespeare/byte'  # the LM parts' corpus (python data/shakespeare/prepare.py --tokenizer=byte)
parts = ['lm_nape', 'lm_nope', 'needle', 'copy_transformer', 'copy_mamba']
seeds = [1, 2, 3]
variants = ['wd', 'no_wd', 'pn_d', 'pl_d', 'vpad', 'vpad_p0.3']  # of VARIANTS (Copy has no larger p)
jobs = 2  # runs at a time
tiny = False  # a few steps of a tiny model per run: checks the pipeline in a minute (tests), no results
eval_run = ''  # internal: evaluate one finished run (<part>/<variant>/s<seed>) and exit
# -----------------------------------------------------------------------------
globals().update(configure(globals(), sys.argv[1:]))

# the paper's regularizers (p = 0.1 unless named); every dropout variant without weight decay, as in the paper
VARIANTS = {
    'wd': ['--weight_decay=0.1', '--dropout_type=none', '--dropout=0.0'],
    'no_wd': ['--weight_decay=0.0', '--dropout_type=none', '--dropout=0.0'],
    'pn_d': ['--weight_decay=0.0', '--dropout_type=pre_norm', '--dropout=0.1'],
    'pl_d': ['--weight_decay=0.0', '--dropout_type=pre_linear', '--dropout=0.1'],
    'vpad': ['--weight_decay=0.0', '--dropout_type=vpad', '--dropout=0.1'],
    'vpad_p0.3': ['--weight_decay=0.0', '--dropout_type=vpad', '--dropout=0.3'],
}
NAMES = {'wd': 'WD', 'no_wd': 'no-WD', 'pn_d': 'PN-D', 'pl_d': 'PL-D', 'vpad': 'VPAD', 'vpad_p0.3': 'VPAD p=0.3'}
LM = ['configs/quickstart.py', f'--data_dir={data_dir}', '--block_size=128', '--tokens_per_batch=2048', '--max_tokens=600000',
      '--train_tokens=50000', '--eval_lengths=[]', '--eval_interval=100', '--ckpt_interval=10', '--keep_last=10']
TASK = ['--eval_interval=100000', '--task_eval_samples=20']  # train.py's own evaluation: the final one, small
COPY = ['--batch_size=32', '--tokens_per_batch=704', '--max_tokens=1056000']  # 1500 steps of 32 sequences
PARTS = {  # part -> (kind, train.py arguments, variants)
    'lm_nape': ('lm', LM + ['--pos_encoding=nape'], list(VARIANTS)),
    'lm_nope': ('lm', LM + ['--pos_encoding=nope'], list(VARIANTS)),
    'needle': ('task', ['configs/needle.py', *TASK, '--ckpt_interval=20', '--keep_last=10'], list(VARIANTS)),
    'copy_transformer': ('task', ['configs/copy_mamba.py', *TASK, *COPY, '--model_type=transformer', '--n_head=4'],
                         list(VARIANTS)[:5]),
    'copy_mamba': ('task', ['configs/copy_mamba.py', *TASK, *COPY], list(VARIANTS)[:5]),
}
TINY = {'lm': ['--n_layer=2', '--n_embd=32', '--n_head=2', '--max_tokens=40960', '--ckpt_interval=2'],  # 20 steps
        'task': ['--n_layer=1', '--n_embd=32', '--n_head=2', '--headdim=16', '--max_tokens=20480', '--ckpt_interval=1']}
EVAL_WINDOWS = 32  # lm: validation windows of 16x the training length
AVERAGE_K = [5, 10]  # checkpoint averaging: the last K checkpoints (lm every 10 steps, needle every 20)
TASK_SAMPLES = 100  # needle and copy: held-out samples per length


def run_dir(part, variant, seed):
    return os.path.join(out, part, variant, f's{seed}')


def train(part, variant, seed, threads):
    """Train one run (or resume it); -> None, or the tail of its log if train.py failed."""
    d = run_dir(part, variant, seed)
    if os.path.exists(os.path.join(d, 'eval.json')):
        return None
    env = {**os.environ, 'OMP_NUM_THREADS': str(threads)}
    if not os.path.exists(os.path.join(d, 'done')):
        resume = checkpoint.steps(d) and checkpoint.steps(d, 'optim')
        if not resume:
            shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d, exist_ok=True)
        cmd = [sys.executable, 'train.py', *PARTS[part][1], *VARIANTS[variant], *(TINY[PARTS[part][0]] if tiny else []),
               f'--seed={seed}', f'--out_dir={d}',
               '--device=cpu', '--init_from=' + ('resume' if resume else 'scratch')]
        with open(os.path.join(d, 'train.log'), 'a') as log:
            if subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode:
                return f"{' '.join(cmd)}\n" + open(log.name).read()[-2000:]
        open(os.path.join(d, 'done'), 'w').close()
    cmd = [sys.executable, __file__, f'--out={out}', f'--eval_run={part}/{variant}/s{seed}', f'--tiny={tiny}']
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return f"{' '.join(cmd)}\n{r.stdout[-1000:]}{r.stderr[-2000:]}" if r.returncode else None


def evaluate(d, kind):
    """The metrics of the run in d (its final checkpoint, and its last-K averages) -> eval.json."""
    steps = checkpoint.steps(d)
    model, _, ckpt = checkpoint.load_model(checkpoint.step_path(d, steps[-1]))
    cfg = ckpt['config']
    weights = {'final': None} | {f'avg{k}': average([checkpoint.step_path(d, s) for s in steps[-k:]])
                                 for k in AVERAGE_K if (kind == 'lm' or cfg['task'] == 'needle') and len(steps) >= k}
    result = {'step': steps[-1]}
    if kind == 'lm':
        T = cfg['block_size']
        windows = TokenData(cfg['data_dir'], 'val').long_windows(16 * T, 4 if tiny else EVAL_WINDOWS)  # (n, 16T + 1)
        for name, state in weights.items():
            if state is not None:
                model.load_state_dict(state)
            total, n = loss_curve(model, windows, T, 'cpu')
            curve = total / n  # (16T,) mean loss per position
            result[name] = {'bands': length_bands(curve, T),
                            'curve': moving_average(curve, T // 4)[T // 8 - 1::T // 8].tolist()}  # every T/8 positions
        if cfg['dropout_type'] in ('pre_linear', 'vpad'):
            model.load_state_dict(ckpt['model'])
            torch.manual_seed(0)
            idx = TokenData(cfg['data_dir'], 'val').batch(8, T, batch_rng(0, 1))[0]
            rows = variance_mismatch(model, idx)
            layers = sorted({r['layer'] for r in rows})
            result['probe'] = [mean(abs(r['rel_err']) for r in rows if r['layer'] == l) for l in layers]
    else:
        task = (Copy(cfg['task_vocab'], cfg['task_min_len'], cfg['task_max_len']) if cfg['task'] == 'copy' else
                Needle(cfg['task_vocab'], cfg['task_min_len'], cfg['task_max_len'], cfg['needle_value_len']))
        lengths, n = cfg['eval_lengths'], 10 if tiny else TASK_SAMPLES
        for name, state in weights.items():
            if state is not None:
                model.load_state_dict(state)
            correct = correct_answers(task, model, lengths, n, cfg['seed'], 'cpu') / n
            result[name] = {'accuracy': {str(L): c for L, c in zip(lengths, correct[:, 0].tolist())},
                            'token_accuracy': {str(L): c for L, c in zip(lengths, correct[:, 1].tolist())},
                            'train_length': cfg['task_max_len']}
    with open(os.path.join(d, 'eval.json.tmp'), 'w') as f:
        json.dump(result, f)
    os.replace(os.path.join(d, 'eval.json.tmp'), os.path.join(d, 'eval.json'))


if eval_run:
    evaluate(os.path.join(out, eval_run), PARTS[eval_run.split('/')[0]][0])
    sys.exit(0)

# -----------------------------------------------------------------------------
# 1. train and evaluate every run
unknown = [p for p in parts if p not in PARTS] + [v for v in variants if v not in VARIANTS]
if unknown:
    raise SystemExit(f"unknown parts or variants {unknown}: choose from {list(PARTS)} and {list(VARIANTS)}")
for p in PARTS:
    PARTS[p] = PARTS[p][:2] + ([v for v in PARTS[p][2] if v in variants],)
runs = [(p, v, s) for p in parts for v in PARTS[p][2] for s in seeds]
pending = [r for r in runs if not os.path.exists(os.path.join(run_dir(*r), 'eval.json'))]
threads = max(1, (os.cpu_count() or 2) // jobs)
print(f"{len(runs)} runs in {out}, {len(runs) - len(pending)} done; {len(pending)} to go, {jobs} at a time "
      f"on {threads} thread(s) each")
failed = []
with ThreadPoolExecutor(jobs) as pool, tqdm(total=len(pending), unit='run') as bar:
    for r, error in zip(pending, pool.map(lambda r: train(*r, threads), pending)):
        bar.update()
        if error:
            failed.append(r)
            tqdm.write(f"{'/'.join(map(str, r))} failed:\n{error}")
if failed:
    raise SystemExit(f"{len(failed)} runs failed (above); the others are kept: fix and rerun to resume")


# -----------------------------------------------------------------------------
# 2. results.json: every metric per part and variant, per seed and as mean and std over seeds
def stats(values):
    return {'mean': mean(values), 'std': stdev(values) if len(values) > 1 else 0.0, 'seeds': values}


def gather(dicts):
    """[{key: number or dict}] (one per seed) -> the same tree with stats() at its leaves."""
    if isinstance(dicts[0], dict):
        return {k: gather([d[k] for d in dicts]) for k in dicts[0]}
    if isinstance(dicts[0], list):
        return [gather(list(v)) for v in zip(*dicts)]
    return stats(dicts)


def beyond(acc, train_length):
    """Mean accuracy over the test lengths beyond the training length."""
    return mean(a for L, a in acc.items() if int(L) > train_length)


def derive(e):
    """The measures the claims use, added to one seed's eval.json: for lm the loss relative to
    the in-distribution one (<=1x) and the probe's mean over the first and second half of the
    layers; for tasks the accuracy beyond the training length."""
    for r in (r for r in e.values() if isinstance(r, dict)):
        if 'bands' in r:
            r['relative'] = {b: x - r['bands']['<=1x'] for b, x in r['bands'].items()}
        if 'accuracy' in r:
            r['beyond'] = beyond(r['accuracy'], r['train_length'])
            r['token_beyond'] = beyond(r['token_accuracy'], r['train_length'])
    if 'probe' in e:
        n = len(e['probe']) // 2
        e['probe_halves'] = [mean(e['probe'][:n]), mean(e['probe'][n:])]
    return e


results = {'seeds': seeds, 'parts': {p: {v: gather([derive(json.load(open(os.path.join(run_dir(p, v, s), 'eval.json'))))
                                                 for s in seeds]) for v in PARTS[p][2]} for p in parts}}
with open(os.path.join(out, 'results.json'), 'w') as f:
    json.dump(results, f, indent=1)
print(f"wrote {out}/results.json")


# -----------------------------------------------------------------------------
# 3. summary.md: the claims, ours as mean +- std over seeds, and a verdict by the spread
def fmt(s, digits=3):
    return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f}"


def verdict(a, b, lower_is_better):
    """Whether b beats a as the paper says: a win only when the difference exceeds the spread
    across seeds (the sum of the two standard deviations)."""
    diff = (a['mean'] - b['mean']) * (1 if lower_is_better else -1)
    spread = a['std'] + b['std']
    if a['std'] == b['std'] == 0 and diff == 0:
        return 'no signal (equal on every seed)'
    if diff > spread:
        return 'holds'
    if diff > 0:
        return 'holds weakly (same direction, within the seed spread)'
    return 'does not hold (reversed beyond the spread)' if -diff > spread else 'does not hold (within the spread)'


CLAIMS = [('wd', 'no_wd', 'WD hurts extrapolation: no-WD better than WD',
           'from scratch: WD over-fits the training length (Fig. 1); CPT: equal, SmolLM3 RULER 8K 1.1 vs 1.1 (Table 1)'),
          ('pn_d', 'pl_d', 'pre-linear beats pre-norm dropout: PL-D better than PN-D',
           'RULER 8K: PN-D 7.72 vs PL-D 20.11 (Table 10, ASEntmax)'),
          ('pl_d', 'vpad', 'VPAD beats pre-linear dropout: VPAD better than PL-D',
           'RULER 8K: PL-D 20.11 vs VPAD 21.64; 16K 11.39 vs 13.51 (Table 10)')]
RELATIVE, BEYOND, TOKEN_BEYOND = (lambda r: r['relative']['8-16x']), (lambda r: r['beyond']), (lambda r: r['token_beyond'])
MEASURES = [('lm_nape', 'CE 8-16x minus CE <=1x, NAPE', RELATIVE, True),  # part, measure, its value in a result, lower is better
            ('lm_nope', 'CE 8-16x minus CE <=1x, NoPE', RELATIVE, True),
            ('needle', 'needle accuracy beyond 1x', BEYOND, False),
            ('copy_transformer', 'Copy exact match beyond 1x, transformer', BEYOND, False),
            ('copy_transformer', 'Copy token accuracy beyond 1x, transformer', TOKEN_BEYOND, False),
            ('copy_mamba', 'Copy exact match beyond 1x, Mamba2', BEYOND, False),
            ('copy_mamba', 'Copy token accuracy beyond 1x, Mamba2', TOKEN_BEYOND, False)]
P = results['parts']
lines = [f"Every number: mean ± std over {len(seeds)} seeds ({', '.join(map(str, seeds))}). A claim holds when the "
         f"difference exceeds the sum of the two standard deviations. Made by `python study.py` from "
         f"{out}/results.json.", '',
         "| claim | measure | paper | ours: first | ours: second | verdict |", "|---|---|---|---|---|---|"]
for a, b, claim, paper in CLAIMS:
    for part, measure, get, lower in MEASURES:
        if part in P and a in P[part] and b in P[part]:
            x, y = get(P[part][a]['final']), get(P[part][b]['final'])
            lines.append(f"| {claim} | {measure} | {paper} | {NAMES[a]} {fmt(x)} | {NAMES[b]} {fmt(y)} | "
                         f"{verdict(x, y, lower)} |")
if 'lm_nape' in P and {'pl_d', 'vpad'} <= P['lm_nape'].keys():
    for i, which in enumerate(('first', 'second')):
        x, y = P['lm_nape']['pl_d']['probe_halves'][i], P['lm_nape']['vpad']['probe_halves'][i]
        lines.append(f"| VPAD reduces the pre-activation variance mismatch | mean \\|rel. error\\|, {which} half of the "
                     f"layers, NAPE LM | PL-D {(0.29, 0.37)[i]} vs VPAD {(0.09, 0.06)[i]} (Fig. 3) | PL-D {fmt(x)} "
                     f"| VPAD {fmt(y)} | {verdict(x, y, True)} |")
for part, measure, get, lower in (MEASURES[0], MEASURES[2]):
    for v in ('wd', 'vpad'):
        if part in P and v in P[part] and 'avg10' in P[part][v]:
            x, y = get(P[part][v]['final']), get(P[part][v]['avg10'])
            lines.append(f"| checkpoint averaging helps extrapolation | {measure}, {NAMES[v]} | NIAH-1 8K: 0.0 -> 41.2 "
                         f"(K = 10, Table 12) | final {fmt(x)} | last 10 averaged {fmt(y)} | {verdict(x, y, lower)} |")

# per-variant tables: every band / length
for p in parts:
    kind, _, variants = PARTS[p]
    r0 = P[p][variants[0]]['final']
    cols = list(r0['bands']) if kind == 'lm' else list(r0['accuracy'])
    what = ('per-position CE (nats/byte) by band of the training length 128, then CE 8-16x minus CE <=1x, '
            'and the same after averaging the last 5 / 10 checkpoints' if kind == 'lm' else
            'exact-match accuracy by length (training lengths up to ' + str(int(r0['train_length']['mean'])) + ')'
            + (', and beyond 1x after averaging the last 5 / 10 checkpoints' if 'avg10' in P[p][variants[0]] else ''))
    lines += ['', f"**{p}**: {what}", '',
              '| variant | ' + ' | '.join(cols) + (' | relative 8-16x | avg5 | avg10 |' if kind == 'lm' else
                                                     ' | token acc. beyond 1x |' + (' avg5 | avg10 |' if 'avg10' in P[p][variants[0]] else '')),
              '|---' * (len(cols) + (4 if kind == 'lm' else 2 + 2 * ('avg10' in P[p][variants[0]]))) + '|']
    for v in variants:
        r = P[p][v]
        if kind == 'lm':
            cells = [fmt(r['final']['bands'][c]) for c in cols]
            cells += [fmt(RELATIVE(r[k])) if k in r else '-' for k in ('final', 'avg5', 'avg10')]
        else:
            cells = [fmt(r['final']['accuracy'][c], 2) for c in cols] + [fmt(r['final']['token_beyond'], 2)]
            cells += [fmt(r[k]['beyond'], 2) for k in ('avg5', 'avg10') if k in r]
        lines.append(f"| {NAMES[v]} | " + ' | '.join(cells) + ' |')
with open(os.path.join(out, 'summary.md'), 'w') as f:
    f.write('\n'.join(lines) + '\n')
print('\n'.join(lines))

# -----------------------------------------------------------------------------
# 4. figures
import matplotlib  # noqa: E402
matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402

lm_parts = [p for p in parts if PARTS[p][0] == 'lm']
if lm_parts:
    fig, axes = plt.subplots(len(lm_parts), 2, figsize=(11, 3.8 * len(lm_parts)), squeeze=False)
    for row, p in zip(axes, lm_parts):
        for ax, relative in zip(row, (False, True)):
            for v in PARTS[p][2]:
                c = P[p][v]['final']['curve']
                m = torch.tensor([x['mean'] for x in c])
                s = torch.tensor([x['std'] for x in c])
                x = torch.arange(1, len(c) + 1) / 8  # in multiples of the training length
                if relative:
                    m = m - P[p][v]['final']['bands']['<=1x']['mean']
                ax.plot(x, m, label=NAMES[v])
                ax.fill_between(x, m - s, m + s, alpha=0.2)
            ax.axvline(1, color='k', ls=':', lw=1)
            ax.set_xscale('log', base=2)
            ax.set_xlabel('position / training length (128)')
            ax.set_ylabel('CE minus CE <=1x' if relative else 'CE (nats/byte), moving average of 32')
            ax.set_title(f"{p}: {'relative to in-distribution' if relative else 'per-position CE'}", fontsize=9)
        row[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, 'lm.png'), dpi=110)
task_parts = [p for p in parts if PARTS[p][0] == 'task']
if task_parts:
    fig, axes = plt.subplots(1, len(task_parts), figsize=(4.2 * len(task_parts), 3.6), squeeze=False)
    for ax, p in zip(axes[0], task_parts):
        for v in PARTS[p][2]:
            acc = P[p][v]['final']['accuracy']
            ax.errorbar([int(L) for L in acc], [a['mean'] for a in acc.values()], yerr=[a['std'] for a in acc.values()],
                        marker='o', ms=3, capsize=2, label=NAMES[v])
        ax.axvline(P[p][PARTS[p][2][0]]['final']['train_length']['mean'], color='k', ls=':', lw=1)
        ax.set_xscale('log', base=2)
        ax.set_ylim(-0.05, 1.05)  # mean +- std of bimodal seeds can pass 0 and 1
        ax.set_xlabel('sequence length' if p == 'needle' else 'source length')
        ax.set_ylabel('exact-match accuracy')
        ax.set_title(p, fontsize=9)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, 'tasks.png'), dpi=110)
if 'lm_nape' in P and 'probe' in P['lm_nape'].get('pl_d', {}):
    fig, ax = plt.subplots(figsize=(5, 3.6))
    probed = [v for v in PARTS['lm_nape'][2] if 'probe' in P['lm_nape'][v]]
    for i, v in enumerate(probed):
        layers = P['lm_nape'][v]['probe']
        ax.bar([l + (i - (len(probed) - 1) / 2) * 0.8 / len(probed) for l in range(len(layers))],
               [l['mean'] for l in layers], yerr=[l['std'] for l in layers], width=0.8 / len(probed), capsize=2,
               label=NAMES[v])
    ax.set_xticks(range(len(layers)))
    ax.set_xlabel('layer')
    ax.set_ylabel('mean |Var[y train] - Var[y eval]| / Var[y eval]')
    ax.set_title('pre-activation variance mismatch, lm_nape', fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, 'probe.png'), dpi=110)
print(f"wrote {out}/summary.md and the figures (lm.png, tasks.png, probe.png)")
