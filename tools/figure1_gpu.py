"""
Figure 1 at about 100x the CPU study, in one GPU lease (issue 76): WD at the paper's summed decay
(sum_t lr_t * wd = 4.11, configs/scratch.py's; the CPU study's lm_nope has 0.125), no-WD, PL-D
and VPAD (p = 0.1, no WD), each trained by train.py (compiled and bf16 on CUDA) from the same seed
on the same batches, with no positions (NoPE: the CPU study's lm_nope over-fits its length, NAPE
does not). Then the per-position CE to 8x the training length of each final checkpoint
(eval_loss.py), and CE by band along training (train.py's evaluations). Writes <out>/figure1.json
and figure1.png (Figure 1's left panel, and the CE at 4-8x against the step), and prints the
comparisons: tools/verdict.py's rule with two seeds or more, else single-seed observations.

    python -m tools.figure1_gpu --dry_run=True   # the plan: rows, sizes, dose, minutes, data
    python -m tools.figure1_gpu                  # one H100 or H200, about 8 minutes in all
    python -m tools.figure1_gpu --tiny=True      # on a CPU in a minute: the pipeline, no result

The data: Python's standard library source, each .py file a document (the last 5% held out),
byte level, built by data/text/prepare.py into <out>/data from the Python that runs this, so a
machine that reaches nothing outside has it; or --data=<a prepared folder>.
"""

import json
import os
import re
import subprocess
import sys
import sysconfig
import time
from statistics import mean

import torch

from configurator import configure
from model import Transformer, TransformerConfig
from tokens import TokenData
from tools.verdict import paired

# -----------------------------------------------------------------------------
out = 'out/figure1_gpu'
data = ''  # a prepared data folder; '' builds <out>/data from the standard library's source
seeds = [1]  # [1, 2] for a verdict, if the time allows
n_layer, n_head, n_embd = 8, 8, 512  # about 25M parameters
block_size = 256
tokens_per_batch = 131072  # 512 sequences of 256 per step
batch_size = 64  # per micro-step
max_tokens = 100_000_000  # per row, before --budget_s scales it down
learning_rate, min_lr = 1e-3, 1e-4  # WSD: 5% warm-up, the last 20% annealed
dose = 4.11  # WD's summed decay, sum_t lr_t * wd: configs/scratch.py's
budget_s = 480  # the whole run's wall time: tokens scaled down to fit the estimate
overhead_s = 60  # per row: start, compile and the final evaluation (assumed, unmeasured)
dry_run = False  # print the plan and stop
tiny = False  # a tiny model for a few steps on the CPU (the tests): the pipeline, no result
# -----------------------------------------------------------------------------
globals().update(configure(globals(), sys.argv[1:]))
if tiny:
    n_layer, n_head, n_embd, block_size, batch_size = 2, 2, 32, 32, 8
    tokens_per_batch, max_tokens, overhead_s = 256, 256 * 8, 0
T = block_size
EVAL_WINDOWS = 2 if tiny else 16  # validation windows of 8T for the per-position CE
ROWS = {'wd': ['--dropout_type=none', '--dropout=0.0'],  # weight decay set by the dose below
        'no_wd': ['--weight_decay=0.0', '--dropout_type=none', '--dropout=0.0'],
        'pl_d': ['--weight_decay=0.0', '--dropout_type=pre_linear', '--dropout=0.1'],
        'vpad': ['--weight_decay=0.0', '--dropout_type=vpad', '--dropout=0.1']}
NAMES = {'wd': 'WD', 'no_wd': 'no-WD', 'pl_d': 'PL-D', 'vpad': 'VPAD'}
# Figure 1's comparisons: (baseline, second): the second better than the baseline?
PAIRS = [('wd', 'no_wd'), ('wd', 'pl_d'), ('wd', 'vpad'), ('no_wd', 'vpad')]


def common(tokens):
    """train.py's arguments every row shares: the same model, data, schedule and evaluations."""
    steps = max(int(tokens // tokens_per_batch), 10)
    return ['configs/quickstart.py', f'--data_dir={data}', '--pos_encoding=nope',
            f'--n_layer={n_layer}', f'--n_head={n_head}', f'--n_embd={n_embd}',
            f'--block_size={T}', f'--batch_size={batch_size}',
            f'--tokens_per_batch={tokens_per_batch}', f'--max_tokens={steps * tokens_per_batch}',
            f'--learning_rate={learning_rate}', f'--min_lr={min_lr}', '--warmup_frac=0.05',
            '--anneal_frac=0.2', f'--eval_lengths=[{8 * T}]', f'--eval_windows={EVAL_WINDOWS}',
            f'--eval_interval={max(steps // (2 if tiny else 8), 1)}', f'--ckpt_interval={steps}',
            f'--log_interval={1 if tiny else 50}', '--eval_iters=4',
            f"--device={'cpu' if tiny else 'auto'}"]


def dry(args):
    """train.py --dry_run=True with args -> (summed decay, H100-hours at the plan's MFU)."""
    r = subprocess.run([sys.executable, 'train.py', *args, '--dry_run=True', '--dry_run_gpus=1'],
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"train.py's dry run failed:\n{r.stdout[-1500:]}{r.stderr[-1500:]}")
    summed = float(re.search(r'summed decay sum_t lr_t \* wd = (\S+)', r.stdout).group(1))
    hours = float(re.search(r'([\d.e+-]+) GPU-hours on H100', r.stdout).group(1))
    return summed, hours


def plan(tokens):
    """Each row's train.py arguments, WD's weight decay set so that its summed decay is `dose`
    on this schedule (train.py's own sum: a dry run at weight decay 1), and the H100 hours."""
    per_unit, hours = dry([*common(tokens), '--weight_decay=1.0'])
    rows = {v: [*common(tokens), *a] for v, a in ROWS.items()}
    rows['wd'].append(f'--weight_decay={dose / per_unit:.6g}')
    return rows, hours


# -----------------------------------------------------------------------------
# the plan
if not data:  # Python's standard library source, byte level
    data = os.path.join(out, 'data', 'byte')
    if not os.path.exists(os.path.join(data, 'meta.json')):
        stdlib = sysconfig.get_paths()['stdlib']
        print(f"building {data} from {stdlib} (every .py file a document)")
        subprocess.run([sys.executable, 'data/text/prepare.py', f'--input={stdlib}',
                        '--suffix=.py', "--exclude=['site-packages', 'dist-packages']",
                        '--val_frac=0.05', f'--out_dir={data}'], check=True)
with torch.device('meta'):
    params = Transformer(TransformerConfig(vocab_size=320, block_size=T, n_layer=n_layer,
                                           n_head=n_head, n_embd=n_embd,
                                           pos_encoding='nope')).num_params(False)
rows, hours = plan(max_tokens)
minutes = len(seeds) * len(rows) * (60 * hours + overhead_s / 60)
tokens = max_tokens
if minutes * 60 > budget_s and not tiny:  # fewer tokens, the same schedule's shape
    train_s = budget_s - len(seeds) * len(rows) * overhead_s
    tokens = max_tokens * max(train_s, 0) / (len(seeds) * len(rows) * 3600 * hours)
    rows, hours = plan(tokens)
    minutes = len(seeds) * len(rows) * (60 * hours + overhead_s / 60)
wd_dose, _ = dry(rows['wd'])
corpus = len(TokenData(data, 'train'))  # its training tokens
row_tokens = int(next(a for a in rows['wd'] if a.startswith('--max_tokens=')).split('=')[1])
print(f"rows {', '.join(NAMES.values())}, seeds {seeds}; {params / 1e6:.1f}M parameters, NoPE, "
      f"{n_layer} x {n_embd}, trained on {T} tokens, evaluated to {8 * T}")
print(f"{row_tokens:,} tokens per row ({corpus:,} in {data}: {row_tokens / corpus:.1f} epochs)")
print(f"WD: {rows['wd'][-1][2:]}, summed decay {wd_dose:.3f} (the paper's {dose}); PL-D and VPAD "
      f"p = 0.1 without WD")
print(f"estimated {minutes:.1f} minutes on one H100 (train.py's plan at its assumed MFU, and "
      f"{overhead_s} s a row for start, compile and evaluation; budget {budget_s} s)")
if dry_run:
    sys.exit(0)

# -----------------------------------------------------------------------------
# the runs: each row and seed by train.py, then eval_loss.py on its final checkpoint
start, results = time.time(), {v: {} for v in rows}
for s in seeds:
    for v, args in rows.items():
        d = os.path.join(out, v, f's{s}')
        r = subprocess.run([sys.executable, 'train.py', *args, f'--seed={s}', f'--out_dir={d}'],
                           capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"{v}, seed {s}: train.py failed:\n{r.stderr[-2000:]}")
        ckpt = os.path.join(d, sorted(f for f in os.listdir(d) if f.startswith('ckpt_'))[-1])
        r = subprocess.run([sys.executable, 'eval_loss.py', f'--ckpt={ckpt}',
                            f'--max_length={8 * T}', f'--smooth={max(T // 4, 1)}',
                            f'--docs={EVAL_WINDOWS}', f'--out={d}/loss', '--overwrite=True',
                            *(['--device=cpu'] * tiny)],
                           capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"{v}, seed {s}: eval_loss.py failed:\n{r.stderr[-2000:]}")
        loss = next(iter(json.load(open(f'{d}/loss.json'))['checkpoints'].values()))
        log = [json.loads(line) for line in open(os.path.join(d, 'log.jsonl'))]
        results[v][s] = {
            'summed_decay': torch.load(ckpt, weights_only=True)['summed_decay'],
            'bands': loss['bands'], 'smoothed': loss['smoothed'],
            # CE at the farthest band along training (train.py's evaluations)
            'along': [(e['iter'], list(e['position_loss'].values())[-1])
                      for e in log if e['event'] == 'eval'],
            'first_loss': next(e['loss'] for e in log if e['event'] == 'train'),
            'val_loss_0': next(e['val_loss'] for e in log if e['event'] == 'eval')}
        print(f"{NAMES[v]}, seed {s}: CE by band {loss['bands']} ({time.time() - start:.0f} s)",
              flush=True)

# -----------------------------------------------------------------------------
# the comparisons, the JSON, the figure
far = list(next(iter(results['wd'].values()))['bands'])[-1]  # the last band: 4-8x
lines = []
for a, b in PAIRS:
    x, y = ([results[v][s]['bands'][far] for s in seeds] for v in (a, b))
    r = paired(x, y, True)
    said = (f"{r['verdict']}: {r['mean']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}]" if len(seeds) > 1
            else f"one seed, an observation: {r['mean']:+.3f}")
    lines.append(f"{NAMES[b]} better than {NAMES[a]} at {far} (CE, lower is better): {said}")
print('\n'.join(lines))
device = torch.cuda.get_device_name() if torch.cuda.is_available() and not tiny else 'cpu'
with open(os.path.join(out, 'figure1.json'), 'w') as f:
    json.dump({'device': device, 'torch': torch.__version__, 'data': data, 'seeds': seeds,
               'parameters': params, 'rows': {v: {'args': rows[v], 'seeds': results[v]}
                                              for v in rows},
               'comparisons': lines, 'minutes': (time.time() - start) / 60, 'tiny': tiny}, f)
import matplotlib  # noqa: E402
matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
for v in rows:
    curve = [mean(c) for c in zip(*(results[v][s]['smoothed'] for s in seeds))]
    left.plot(range(1, len(curve) + 1), curve, label=NAMES[v], lw=1)
    steps = [step for step, _ in results[v][seeds[0]]['along']]
    along = [mean(x for _, x in c) for c in zip(*(results[v][s]['along'] for s in seeds))]
    right.plot(steps, along, marker='o', ms=3, label=NAMES[v])
left.axvline(T, color='k', ls=':', lw=1)
left.set_xlabel('position (dotted: the training length)')
left.set_ylabel(f'CE (nats/byte), moving average of {max(T // 4, 1)}')
right.set_xlabel('training step')
right.set_ylabel('CE at the last band (4-8x)')
left.legend()
left.set_title(f'Figure 1 at {params / 1e6:.1f}M parameters ({device})', fontsize=9)
fig.tight_layout()
fig.savefig(os.path.join(out, 'figure1.png'), dpi=110)
print(f"wrote {out}/figure1.json and figure1.png in {(time.time() - start) / 60:.1f} minutes")
