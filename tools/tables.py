"""
Every table and figure of the paper from the runs that make its rows (docs/tables.md): the rows'
checkpoints found from their configs, scored by the eval scripts (eval_niah.py, eval_ruler.py,
eval_loss.py, tools/probe_variance.py, average_ckpts.py for a missing average; each prints its
own command line and output, and a row scored before is read back), then printed in the paper's
layout with the paper's own numbers under each row, and the GPU-hours its training costs (each
config's plan: python train.py configs/<config>.py --dry_run=True).

    python -m tools.tables --table=1          # Tables 1, 5-12, 15, 17; figure1, 3, 4, 6
    python -m tools.tables --table=figure6 --samples=100 --ks="[10, 20]"

A run is found by its config's out_dir (its name, under --runs), a released model by its
config's init_from (its name, under --weights); a row is the run's newest ckpt_*.pt, or its
avg{K}_*.pt (written by average_ckpts.py when missing). Writes the eval scripts' files beside each
checkpoint, and the tables and figures under --out (table1_niah.md, figure4.png, ...).
"""

import contextlib
import functools
import glob
import io
import json
import math
import os
import re
import runpy
import shlex
import sys

import checkpoint
from ruler import check_prefix, is_summary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
K = 1024
LENGTHS_SMOLLM3 = [4 * K, 8 * K, 16 * K, 32 * K, 64 * K, 128 * K, 256 * K]
LENGTHS_SCRATCH = [2 * K, 4 * K, 8 * K, 16 * K, 32 * K]
LOSS_DATA = 'data/common_pile_arxiv/gpt2'  # the paper's "ArXiv papers from The Common Pile"

# A row: (label, config, which checkpoint): 'last' (the run's newest), 'orig' (the config's
# init_from), 'sw' (init_from with the config's windows, no training), 'avgK' (the average of
# the run's last K) or 'steps' (Figure 1: several of the run's checkpoints, a row each). The
# paper's numbers by measure, one per length (its "32-128K" and "— V —" spread over them).
Z4 = [0.0] * 4
SMOLLM3 = [('Orig.', 'smollm3_cpt', 'orig'), ('SW', 'smollm3_cpt', 'sw'),
           ('SW, WD', 'smollm3_wd', 'last'), ('SW, no-WD', 'smollm3_no_wd', 'last')]
PAPER_SMOLLM3 = {'Orig.': {'niah': [100.0, 0.0, 0.0] + Z4, 'ruler': [83.5, 0.1, 0.0, 0.0]},
                 'SW': {'niah': [100.0, 0.0, 0.0] + Z4, 'ruler': [83.4, 0.5, 0.0, 0.0]},
                 'SW, WD': {'niah': [100.0, 0.0, 0.0] + Z4, 'ruler': [83.5, 1.1, 0.0, 0.0]},
                 'SW, no-WD': {'niah': [100.0, 0.0, 0.0] + Z4, 'ruler': [83.5, 1.1, 0.0, 0.0]}}


def dropout_rows(ps):
    """SmolLM3 CPT with each dropout at each p (configs/smollm3_pn_d_p02.py and its siblings)."""
    return [(f"SW, {name}, p={p}", f"smollm3_{key}" + ('' if p == 0.1 else f"_p0{round(p * 10)}"),
             'last') for name, key in (('PN-D', 'pn_d'), ('PL-D', 'pl_d'), ('VPAD', 'vpad'))
            for p in ps]


MAMBA2 = {'title': "Mamba2-1.3B performance on NIAH-1 and on RULER",
          'rows': [('Orig.', 'mamba2_1b3_cpt', 'orig'), ('WD', 'mamba2_1b3_wd', 'last'),
                   ('no-WD', 'mamba2_1b3_no_wd', 'last'),
                   ('PN-D, p=0.2', 'mamba2_1b3_pn_d', 'last')],
          'measures': [('niah', LENGTHS_SCRATCH), ('ruler', LENGTHS_SCRATCH)],
          'paper': {'Orig.': {'niah': [100.0, 100.0, 100.0, 0.0, 0.0],
                              'ruler': [38.3, 14.3, 8.5, 0.4, 0.0]},
                    'WD': {'niah': [100.0, 100.0, 100.0, 0.0, 0.0],
                           'ruler': [42.0, 16.2, 9.6, 0.7, 0.0]},
                    'no-WD': {'niah': [100.0, 100.0, 100.0, 0.0, 0.0],
                              'ruler': [42.2, 16.0, 9.6, 0.0, 0.0]},
                    'PN-D, p=0.2': {'niah': [100.0, 100.0, 100.0, 11.8, 0.0],
                                    'ruler': [50.7, 22.5, 11.5, 2.6, 0.8]}}}
AVERAGED = [('Orig.', 'smollm3_cpt', 'orig')] + [
    (f"SW, K={k}", 'smollm3_no_wd', f'avg{k}') for k in (10, 20, 30)] + [
    ('SW, attention dropout', 'smollm3_attn_dropout', 'last')] + [
    (f"SW, attention dropout, K={k}", 'smollm3_attn_dropout', f'avg{k}') for k in (10, 20, 30)]
SCRATCH = [(name, key, 'last') for name, key in (('WD', 'wd'), ('no-WD', 'no_wd'),
                                                 ('PN-D', 'pn_d'), ('PL-D', 'pl_d'),
                                                 ('VPAD', 'vpad'))]
TABLES = {
    '1': {'title': "SmolLM3 performance on NIAH-1 and on RULER",
          'rows': SMOLLM3 + dropout_rows([0.1]),
          'measures': [('niah', LENGTHS_SMOLLM3), ('ruler', LENGTHS_SMOLLM3[:4])],
          'paper': PAPER_SMOLLM3},
    '5': MAMBA2,
    '6': {'title': "Hyperparameters of the trained models (from their configs)",
          'rows': [('Transformers, NAPE', 'vpad', ''), ('Mamba2-85M, State=128', 'mamba2_85m', ''),
                   ('Mamba2-45M, State=128', 'mamba2_45m_copy', ''),
                   ('SmolLM3, SW', 'smollm3_pl_d', '')],
          'paper': {'Transformers, NAPE': '0.1 24 768 3072 12 2048 DCLM-Edu 40B 512K 6e-4 SWUA '
                                          '2.5% 20% 6e-5',
                    'Mamba2-85M, State=128': '0.1 12 768 - 24 1024 ThePile 25B 512K 1e-3 Cosine '
                                             '10% - 1e-4',
                    'Mamba2-45M, State=128': '0.1 12 768 - 24 50-100 Copy 0.3B 19K 1e-3 Cosine '
                                             '5% - 0',
                    'SmolLM3, SW': '0.1-0.3 36 2048 11008 16 4096 DCLM-Edu 1B 1M 2e-5 SWU 10% - '
                                   '2e-5'}},
    '7': {'title': "SmolLM3-3B results on short benchmarks (lm-eval; acc_norm where the task has "
                   "it, else acc; x100)",
          'rows': [('Original', 'smollm3_cpt', 'orig'), ('WD', 'smollm3_wd', 'last'),
                   ('no-WD', 'smollm3_no_wd', 'last'), ('PN-D, p=0.1', 'smollm3_pn_d', 'last'),
                   ('PL-D, p=0.1', 'smollm3_pl_d', 'last')],
          'paper': {'Original': [77.8, 53.2, 75.3, 79.0, 69.6, 44.2, 80.4, 70.8, 68.8],
                    'WD': [77.7, 53.2, 75.5, 79.2, 68.9, 43.4, 79.9, 70.5, 68.5],
                    'no-WD': [77.6, 53.3, 75.4, 79.1, 69.6, 43.6, 80.0, 70.6, 68.7],
                    'PN-D, p=0.1': [78.3, 53.2, 74.7, 79.2, 69.4, 45.6, 78.3, 69.7, 68.5],
                    'PL-D, p=0.1': [79.0, 54.3, 74.9, 79.4, 69.1, 44.6, 81.0, 70.4, 69.1]}},
    '8': {'title': "SmolLM3 performance on NIAH-1 and on RULER for all dropout probabilities",
          'rows': SMOLLM3 + dropout_rows([0.1, 0.2, 0.3]),
          'measures': [('niah', LENGTHS_SMOLLM3), ('ruler', LENGTHS_SMOLLM3[:4])],
          'paper': PAPER_SMOLLM3},
    '9': {'title': "Performance on NIAH-1 of SmolLM3: checkpoint averages (SW no-WD), attention "
                   "dropout and its averages",
          'rows': AVERAGED, 'measures': [('niah', LENGTHS_SMOLLM3[:3])],
          'paper': {'Orig.': {'niah': [100.0, 0.0, 0.0]},
                    'SW, K=10': {'niah': [100.0, 41.2, 0.8]},
                    'SW, K=20': {'niah': [97.2, 66.4, 11.4]},
                    'SW, K=30': {'niah': [80.4, 68.2, 2.2]}}},
    '10': {'title': "Performance on RULER of SmolLM3: checkpoint averages (SW no-WD), attention "
                    "dropout and its averages",
           'rows': AVERAGED, 'measures': [('ruler', LENGTHS_SMOLLM3[:3])],
           'paper': {'Orig.': {'ruler': [83.5, 0.1, 0.0]},
                     'SW, K=10': {'ruler': [79.4, 11.4, 0.7]},
                     'SW, K=20': {'ruler': [61.6, 13.8, 1.6]},
                     'SW, K=30': {'ruler': [43.2, 10.7, 1.7]}}},
    '11': {'title': "Performance of ASEntmax models on RULER",
           'rows': [('Softmax WD', 'wd', 'last'), ('Softmax VPAD', 'vpad', 'last'),
                    ('ASEntmax WD', 'asentmax_wd', 'last'),
                    ('ASEntmax PN-D', 'asentmax_pn_d', 'last'),
                    ('ASEntmax PL-D', 'asentmax_pl_d', 'last'),
                    ('ASEntmax VPAD', 'asentmax_vpad', 'last')],
           'measures': [('ruler', LENGTHS_SCRATCH)],
           'paper': {'Softmax WD': {'ruler': [40.39, 3.09, 0.06, 0.04, 0.04]},
                     'Softmax VPAD': {'ruler': [44.24, 34.76, 12.30, 4.54, 1.93]},
                     'ASEntmax WD': {'ruler': [43.96, 20.94, 5.44, 2.97, 2.44]},
                     'ASEntmax PN-D': {'ruler': [42.76, 26.85, 7.72, 2.36, 1.59]},
                     'ASEntmax PL-D': {'ruler': [47.30, 36.80, 20.11, 11.39, 6.73]},
                     'ASEntmax VPAD': {'ruler': [48.09, 37.32, 21.64, 13.51, 6.98]}}},
    '12': {'title': "Full SmolLM3 results on NIAH-1 (averages of the SW no-WD run)",
           'rows': [('SmolLM3', 'smollm3_cpt', 'orig'), ('SmolLM3-SW', 'smollm3_cpt', 'sw')] + [
               (f"SmolLM3-SW, K={k}", 'smollm3_no_wd', f'avg{k}') for k in (10, 20, 30)],
           'measures': [('niah', LENGTHS_SMOLLM3)],
           'paper': {'SmolLM3': {'niah': [100.0] + [0.0] * 6},
                     'SmolLM3-SW': {'niah': [100.0] + [0.0] * 6},
                     'SmolLM3-SW, K=10': {'niah': [100.0, 41.2, 0.8, 0.0, 0.0, 0.0, 0.0]},
                     'SmolLM3-SW, K=20': {'niah': [97.2, 66.4, 11.4, 0.0, 0.0, 0.0, 0.0]},
                     'SmolLM3-SW, K=30': {'niah': [80.4, 68.2, 2.2, 0.0, 0.0, 0.0, 0.0]}}},
    '15': MAMBA2,
    '17': MAMBA2,  # the paper's text shows Table 15's numbers under Table 17's heading
    'figure1': {'title': "Transformer performance across training steps (WD and VPAD)",
                'rows': [('WD', 'wd', 'steps'), ('VPAD', 'vpad', 'steps')],
                'measures': [('loss', None), ('ruler', [4 * K, 8 * K])]},
    'figure3': {'title': "Relative error of the pre-activation variances, SmolLM3 CPT",
                'rows': [('PL-D', 'smollm3_pl_d', 'last'), ('VPAD', 'smollm3_vpad', 'last')],
                'paper': {'PL-D': (0.29, 0.37), 'VPAD': (0.09, 0.06)}},
    'figure4': {'title': "Transformers trained from scratch: arXiv loss, NIAH-1, RULER",
                'rows': SCRATCH,
                'measures': [('loss', None), ('niah', LENGTHS_SCRATCH),
                             ('ruler', LENGTHS_SCRATCH)]},
    'figure6': {'title': "Transformers trained from scratch before and after checkpoint averaging",
                'rows': [(f"{label}, K={k}" if k else label, name, f'avg{k}' if k else 'last')
                         for label, name, _ in SCRATCH for k in (0, 10, 20, 30)],
                'measures': [('ruler', [2 * K, 4 * K, 8 * K]), ('loss', None)]},
}
NAMES = {'niah': 'NIAH-1', 'ruler': 'RULER', 'loss': 'loss'}
BENCHMARKS = [('ARC-E', 'arc_easy'), ('ARC-C', 'arc_challenge'), ('HS', 'hellaswag'),
              ('PIQA', 'piqa'), ('WG', 'winogrande'), ('OPQA', 'openbookqa'), ('BoolQ', 'boolq'),
              ('LMBD', 'lambada_openai')]


def config(name):
    """A config file's settings (plain Python: configs/<name>.py, with what it imports)."""
    path = os.path.join(ROOT, 'configs', name + '.py')
    if not os.path.exists(path):
        raise SystemExit(f"no config {path}")
    return {k: v for k, v in runpy.run_path(path).items() if not k.startswith('_')}


def run(script, args, quiet=False):
    """python <script> args, in this process (no second start of torch): its command line said
    first, its output as it prints (or kept, quiet), a refusal passed on as one."""
    print(f"\n$ python {'-m ' + script[:-3].replace('/', '.') if '/' in script else script} "
          + shlex.join(args), flush=True)
    argv, printed = sys.argv, io.StringIO()
    sys.argv = [script, *args]
    try:
        with contextlib.redirect_stdout(printed) if quiet else contextlib.nullcontext():
            runpy.run_path(os.path.join(ROOT, script), run_name='__main__')
    except SystemExit as e:
        if e.code not in (0, None):
            raise
    finally:
        sys.argv = argv
        checkpoint.release()
    return printed.getvalue()


@functools.cache
def gpu_hours(name):
    """The H100 GPU-hours of a config's plan (train.py --dry_run=True)."""
    said = run('train.py', [os.path.join('configs', name + '.py'), '--dry_run=True'], quiet=True)
    found = re.search(r"([\d,.]+) GPU-hours on H100", said)
    if not found:
        raise SystemExit(f"configs/{name}.py: its plan gives no GPU-hours:\n{said}")
    return float(found.group(1).replace(',', ''))


def step_of(path):
    """The step in a checkpoint's name: out/wd/ckpt_076293.pt -> 76293."""
    return int(re.findall(r'\d+', os.path.basename(path))[-1])


def trained(rows):
    """The configs a table's rows train (a released model's rows train nothing)."""
    return sorted({name for _, name, which in rows if which not in ('orig', 'sw')})


def checkpoints(name, which, runs, weights, points, write=True):
    """The checkpoint paths of a row (see the rows above): one, or for 'steps' up to `points` of
    the run's checkpoints, evenly spaced, the newest included. A missing average is written by
    average_ckpts.py (with write; without, only checked: the run has the checkpoints it needs)."""
    c = config(name)
    if which in ('orig', 'sw'):
        path = os.path.join(weights, os.path.basename(c['init_from'].rstrip('/')))
        if not os.path.exists(path):
            raise SystemExit(f"no {path}: put the released weights that configs/{name}.py starts "
                             f"from there (docs/smollm3-cpt.md), or give --weights")
        return [path]
    folder = os.path.join(runs, os.path.basename(c['out_dir']))
    steps = checkpoint.steps(folder)
    if not steps:
        raise SystemExit(f"{folder} holds no checkpoint: train it, torchrun --standalone "
                         f"--nproc_per_node=8 train.py configs/{name}.py (or give --runs)")
    if which == 'last':
        return [checkpoint.step_path(folder, steps[-1])]
    if which == 'steps':
        picks = sorted({steps[round(i * (len(steps) - 1) / max(points - 1, 1))]
                        for i in range(min(points, len(steps)))})
        return [checkpoint.step_path(folder, s) for s in picks]
    k = int(which[3:])
    found = sorted(glob.glob(os.path.join(folder, f'avg{k}_*.pt')))
    if not found and not write:  # train.py's average_last writes them; else the last k saved
        try:
            checkpoint.select(folder, k, 1, 0, -1)
        except ValueError as e:
            raise SystemExit(f"no average of {k} in {folder}, and {e}")
    if not found and write:
        run('average_ckpts.py', [f'--ckpt_dir={folder}', f'--last={k}'])
        found = sorted(glob.glob(os.path.join(folder, f'avg{k}_*.pt')))
    return found[-1:]


def expand(rows, ks):
    """The rows with the K of --ks: an averaged row of the paper's K = 10 is kept for the first
    of ks, and so on (a row whose K has no counterpart is dropped)."""
    out = []
    for label, name, which in rows:
        if which.startswith('avg'):
            i = (10, 20, 30).index(int(which[3:]))
            if i >= len(ks):
                continue
            label, which = label.replace(f"K={which[3:]}", f"K={ks[i]}"), f'avg{ks[i]}'
        out.append((label, name, which))
    return out


def score(measure, paths, labels, sw, lengths, prefix, o):
    """Rows' scores by length from an eval script's table (eval_niah.py, eval_ruler.py), or their
    per-position loss (eval_loss.py) -> a list of dicts, one per row."""
    given = [f"--ckpt={paths!r}", f"--labels={labels!r}"]
    if measure == 'loss':
        args = given + [f"--data_dir={o['data_dir']}", f"--docs={o['docs']}",
                        f"--smooth={o['smooth']}", f"--out={prefix}_loss", '--overwrite=True']
        if o['max_length']:
            args.append(f"--max_length={o['max_length']}")
        run('eval_loss.py', args)
        with open(prefix + '_loss.json') as f:
            found = json.load(f)['checkpoints']
        return [found[p] for p in paths]
    args = given + [f"--lengths={lengths!r}", f"--table={prefix}_{measure}"]
    if sw:
        args += [f"--sw={sw!r}", f"--window={o['window']!r}"]
    if o['samples']:
        args.append(f"--samples={o['samples']}")
    if measure == 'niah':
        run('eval_niah.py', args + ['--depths=[]', f"--task={o['niah_task']}"])
    else:
        run('eval_ruler.py', args + [f"--tasks={o['tasks']!r}"])
    with open(f"{prefix}_{measure}.json") as f:
        return [{**r, 'score': {int(L): v for L, v in r['score'].items()}}
                for r in json.load(f)['rows']]


def cell(v, width=8):
    return f"{'-':>{width}}" if v is None or (isinstance(v, float) and math.isnan(v)) \
        else f"{v:>{width}.1f}"


def print_layout(title, labels, blocks, paper, paper_lengths):
    """The paper's layout: a group of length columns per measure, a row each, the paper's numbers
    under it ('-' where the paper's text gives none, or at a length it did not score)."""
    width = max(26, *(len(label) + 2 for label in labels))
    print(f"\n{title} (x100; the paper's numbers on the line under each row)")
    print(f"{'':<{width}}" + ' | '.join(f"{NAMES[m]:<{8 * len(ls)}}" for m, ls, _ in blocks))
    print(f"{'model':<{width}}" + ' | '.join(
        ''.join(f"{length_label(L):>8}" for L in ls) for _, ls, _ in blocks))
    for i, label in enumerate(labels):
        print(f"{label:<{width}}" + ' | '.join(
            ''.join(cell(rows[i]['score'][L]) for L in ls) for _, ls, rows in blocks))
        theirs = {m: dict(zip(paper_lengths[m], v)) for m, v in paper.get(label, {}).items()}
        print(f"{'  paper':<{width}}" + ' | '.join(
            ''.join(cell(theirs.get(m, {}).get(L)) for L in ls) for m, ls, _ in blocks))


def length_label(L):
    import ruler
    return ruler.length_label(L)


def hyperparameters(spec):
    """Table 6 from the configs themselves (and the released shape a CPT config starts from)."""
    from weights import folder_shape
    heads = ['p', 'Ls', 'Dim', 'FFN-D', 'H', 'Len', 'Data', 'TT', 'BT', 'LR', 'LRS', 'Warm-up',
             'Ann-R', 'min-LR']
    size = lambda n: f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 2 ** 10:.0f}K"  # noqa: E731
    width = 24
    print(f"\n{spec['title']}; the paper's line under each row")
    print(f"{'model':<{width}}" + ' '.join(f"{h:>8}" for h in heads))
    for label, name, _ in spec['rows']:
        c = config(name)
        if 'init_from' in c:  # a CPT run takes the released model's shape
            c = {**folder_shape(c['init_from'])[1], **c}
        mamba = c.get('model_type') == 'mamba2' or 'd_state' in c
        heads_n = c.get('expand', 2) * c['n_embd'] // c['headdim'] if mamba else c['n_head']
        schedule = {'wsd': 'SWUA', 'cosine': 'Cosine', 'constant': 'SWU'}[c['schedule']]
        length = (f"{c['task_min_len']}-{c['task_max_len']}" if c.get('task', 'lm') != 'lm'
                  else c['block_size'])
        data = c['task'] if c.get('task', 'lm') != 'lm' else c['data_dir'].split('/')[1]
        cells = [c['dropout'], c['n_layer'], c['n_embd'], '-' if mamba else c.get('ffn_dim'),
                 heads_n, length, data, size(c['max_tokens']), size(c['tokens_per_batch']),
                 f"{c['learning_rate']:g}", schedule, f"{c['warmup_frac']:.1%}",
                 f"{c['anneal_frac']:.0%}" if c['schedule'] == 'wsd' else '-', f"{c['min_lr']:g}"]
        print(f"{label:<{width}}" + ' '.join(f"{str(v):>8}" for v in cells))
        print(f"{'  paper':<{width}}" + ' '.join(f"{v:>8}" for v in spec['paper'][label].split()))


def benchmarks(spec, paths):
    """Table 7 from tools/eval_lm.py's results beside each row's checkpoint."""
    print(f"\n{spec['title']}; the paper's line under each row")
    print(f"{'model':<16}" + ''.join(f"{h:>8}" for h, _ in BENCHMARKS) + f"{'Avg.':>8}")
    tasks = ','.join(t for _, t in BENCHMARKS)
    for (label, _, _), path in zip(spec['rows'], paths):
        found = path.removesuffix('.pt').rstrip('/') + '_lm_eval.json'
        if not os.path.exists(found):
            raise SystemExit(f"no {found}: python -m tools.eval_lm --ckpt={path} --tasks={tasks}")
        with open(found) as f:
            results = json.load(f)['results']
        got = [100 * results[t].get('acc_norm,none', results[t]['acc,none']) if t in results
               else None for _, t in BENCHMARKS]
        done = [v for v in got if v is not None]
        got.append(sum(done) / len(done) if len(done) == len(BENCHMARKS) else None)
        print(f"{label:<16}" + ''.join(cell(v) for v in got))
        print(f"{'  paper':<16}" + ''.join(cell(v) for v in spec['paper'][label]))


def variance(spec, paths):
    """Figure 3 from tools/probe_variance.py on each row: the first / second half of the layers."""
    print(f"\n{spec['title']}: mean |relative error| over matrices and layers")
    found = []
    for (_, name, _), path in zip(spec['rows'], paths):
        run('tools/probe_variance.py', [f'--ckpt={path}'])
        kind = config(name)['dropout_type']  # the probe's own: the model's operator
        with open(path.removesuffix('.pt') + f'_probe_{kind}.json') as f:
            got = json.load(f)
        found.append((got['first_half'], got['second_half']))
    print(f"{'model':<10}{'first half':>12}{'second half':>12}   paper (first / last 18 of 36)")
    for (label, _, _), (first, second) in zip(spec['rows'], found):
        print(f"{label:<10}{first:>12.3f}{second:>12.3f}   {spec['paper'][label][0]:.2f} / "
              f"{spec['paper'][label][1]:.2f}")


def draw(path, panels, train_length):
    """The figure: one panel each, (title, xlabel, ylabel, [(label, xs, ys)], log x), the training
    length dotted where x is a length or a position."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    for ax, (title, xlabel, ylabel, lines, logx) in zip(axes, panels):
        for label, xs, ys in lines:
            ax.plot(xs, ys, label=label, linewidth=1.2, marker='' if len(xs) > 20 else 'o')
        if xlabel in ('position', 'length (tokens)'):
            ax.axvline(train_length, linestyle=':', color='k', linewidth=1)
        if logx:
            ax.set_xscale('log', base=2)
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


def figure(name, spec, rows, labels, blocks, train_length, path):
    """Figures 1, 4 and 6 from their rows' scores: the numbers printed, then drawn."""
    got = {m: scores for m, _, scores in blocks}
    ls = {m: lengths for m, lengths, _ in blocks}
    loss = got['loss']
    bands = list(loss[0]['bands'])
    print(f"\n{spec['title']}: the paper gives no numbers, only the figure")
    if name == 'figure6':  # per run: the last checkpoint (K=0), then its averages
        ruler_id, ruler_ood = ls['ruler'][0], ls['ruler'][1:]
        print(f"{'run':<10}{'K':>4}{'RULER ' + length_label(ruler_id):>12}{'RULER OOD':>12}"
              f"{'loss':>10}   (OOD: the mean over "
              + ', '.join(map(length_label, ruler_ood)) + "; loss: the mean over all positions)")
        runs = {}
        for (label, _, which), r, lo in zip(rows, got['ruler'], loss):
            k = int(which[3:]) if which.startswith('avg') else 0
            ood = sum(r['score'][L] for L in ruler_ood) / len(ruler_ood) if ruler_ood else math.nan
            mean = sum(lo['curve']) / len(lo['curve'])
            runs.setdefault(label.split(',')[0], []).append((k, r['score'][ruler_id], ood, mean))
            print(f"{label.split(',')[0]:<10}{k:>4}{r['score'][ruler_id]:>12.1f}{cell(ood, 12)}"
                  f"{mean:>10.4f}")
        panels = [(title, 'K (0: the last checkpoint)', what,
                   [(run, [p[0] for p in ps], [p[i] for p in ps]) for run, ps in runs.items()],
                   False)
                  for i, (title, what) in enumerate(
                      [(f"RULER, {length_label(ruler_id)}", 'RULER'),
                       ('RULER, ' + ' and '.join(map(length_label, ruler_ood)), 'RULER'),
                       ('cross-entropy', 'loss (nats)')], 1)]
        return draw(path, panels, train_length)
    print(f"{'row':<16}" + ''.join(f"{b:>10}" for b in bands) + ''.join(
        f" | {NAMES[m]} " + ' '.join(f"{length_label(L):>6}" for L in ls[m])
        for m in ('niah', 'ruler') if m in got))
    for i, label in enumerate(labels):
        print(f"{label:<16}" + ''.join(f"{loss[i]['bands'][b]:>10.4f}" for b in bands) + ''.join(
            f" | {' ' * len(NAMES[m])} " + ' '.join(f"{got[m][i]['score'][L]:>6.1f}"
                                                   for L in ls[m])
            for m in ('niah', 'ruler') if m in got))
    positions = range(1, len(loss[0]['smoothed']) + 1)
    if name == 'figure1':  # a panel per run: its checkpoints' curves; then RULER by step
        runs = {}
        for label, lo, r in zip(labels, loss, got['ruler']):
            run, step = label.rsplit(' ', 1)
            runs.setdefault(run, []).append(
                (int(step), lo['smoothed'], sum(r['score'].values()) / len(r['score'])))
        panels = [(f"{run}: per-position loss", 'position', 'cross-entropy (nats)',
                   [(f"step {step}", positions, curve) for step, curve, _ in points], False)
                  for run, points in runs.items()]
        panels.append(('RULER, ' + ' and '.join(map(length_label, ls['ruler'])), 'step',
                       'RULER (mean over the lengths)',
                       [(run, [p[0] for p in points], [p[2] for p in points])
                        for run, points in runs.items()], False))
        return draw(path, panels, train_length)
    panels = [('arXiv papers', 'position', 'cross-entropy (nats)',
               [(label, positions, lo['smoothed']) for label, lo in zip(labels, loss)], False)]
    panels += [(NAMES[m], 'length (tokens)', NAMES[m],
                [(label, ls[m], [s['score'][L] for L in ls[m]])
                 for label, s in zip(labels, got[m])], True) for m in ('niah', 'ruler')]
    return draw(path, panels, train_length)


if __name__ == '__main__':
    from configurator import configure

    # -------------------------------------------------------------------------
    table: int | str = ''  # 1, 5-12, 15, 17, figure1, figure3, figure4 or figure6
    runs = 'out'  # the folder of the runs: each config's out_dir, by its last name
    weights = 'weights'  # the folder of released weights: each config's init_from, by its name
    out = 'out/tables'  # the tables (table1_niah.md, .json) and figures (figure4.png)
    lengths: list[int] = []  # every measure's lengths, []: the paper's (Figure 6: the first, ID)
    samples = 0  # NIAH-1 and RULER samples per task and length; 0: the scripts' defaults
    tasks: str | list = 'paper'  # RULER's tasks (eval_ruler.py)
    niah_task = 'niah_single_1'  # or niah_single_1_short (eval_niah.py)
    window: int | list | None = None  # the SW rows' windows; default: the config's pattern
    ks: list[int] = [10, 20, 30]  # the K of the averaged rows
    points = 8  # Figure 1: checkpoints per run, evenly spaced, the last included
    data_dir = LOSS_DATA  # the documents of the per-position loss
    max_length = 0  # the loss's positions; 0: 16x the training length (eval_loss.py)
    docs = 16  # documents of the per-position loss
    smooth = 512  # the loss's moving average, as the paper's figures
    plans = True  # say what training the rows costs: each config's plan (train.py --dry_run)
    # -------------------------------------------------------------------------
    LIMITS = {'lengths': (1, None, []), 'samples': (0, None), 'ks': (1, None), 'points': (1, None),
              'max_length': (1, None, 0), 'docs': (1, None), 'smooth': (1, None)}
    globals().update(configure(globals(), sys.argv[1:], limits=LIMITS))
    table = str(table)
    if table not in TABLES:
        raise SystemExit(f"give --table= one of {', '.join(TABLES)}")
    spec = TABLES[table]
    prefix = os.path.join(out, table if table.startswith('figure') else f'table{table}')
    # this tool's own outputs, then every row's checkpoint, before anything is written
    if not out:
        raise SystemExit("give --out=<folder> for the tables and figures, e.g. out/tables")
    checkpoint.check_output(out, True, os.path.isdir, 'tools/tables.py')  # not a run's folder
    check_prefix(prefix, 'tools/tables.py')
    checkpoint.check_output(prefix + '.png', True, lambda p: True, 'tools/tables.py')
    for m, _ in spec.get('measures', []):
        for ext in ('.json', '.md'):
            ours = lambda p, m=m: is_summary(f"{prefix}_{m}.json")  # noqa: E731
            checkpoint.check_output(f"{prefix}_{m}{ext}", True, ours, 'tools/tables.py')
    rows = expand(spec['rows'], ks)
    if table == '6':
        os.makedirs(out, exist_ok=True)
        hyperparameters(spec)
    else:
        for _, name, which in rows:  # said at once: a missing run, weights or checkpoints
            checkpoints(name, which, runs, weights, points, write=False)
        os.makedirs(out, exist_ok=True)
        # a row each, Figure 1's several (a checkpoint each, named by its file's step)
        entries = [(label + (f" {step_of(p)}" if which == 'steps' else ''), name, which, p)
                   for label, name, which in rows
                   for p in checkpoints(name, which, runs, weights, points)]
        labels = [e[0] for e in entries]
        paths = [e[3] for e in entries]
        sw = [i for i, e in enumerate(entries) if e[2] == 'sw']
        if window is None and sw:  # the config's pattern: [2048, 2048, 2048, 0] of SmolLM3's 36
            w = config(entries[sw[0]][1]).get('window', 0)
            window = next(w[:n] for n in range(1, len(w) + 1)
                          if w == w[:n] * (len(w) // n)) if isinstance(w, list) else w
        o = {'window': window, 'samples': samples, 'niah_task': niah_task, 'tasks': tasks,
             'data_dir': data_dir, 'docs': docs, 'smooth': smooth, 'max_length': max_length}
        if table == '7':
            benchmarks(spec, paths)
        elif table == 'figure3':
            variance(spec, paths)
        else:
            blocks = [(m, lengths or ls, score(m, paths, labels, sw, lengths or ls, prefix, o))
                      for m, ls in spec['measures']]
            # the training length: the checkpoints' own (a weights folder's is not recorded)
            train_length = next((r['block_size'] for _, _, got in blocks for r in got
                                 if r.get('block_size')), None) or \
                next(r['train_length'] for _, _, got in blocks for r in got)
            if table.startswith('figure'):
                figure(table, spec, rows, labels, blocks, train_length, prefix + '.png')
            else:
                print_layout(spec['title'], labels, blocks, spec.get('paper', {}),
                             dict(spec['measures']))
    if not plans:
        sys.exit(0)
    hours = {name: gpu_hours(name) for name in trained(spec['rows'])}
    print(f"\ntraining: {sum(hours.values()):,.0f} GPU-hours on H100 at the plans' assumed MFU ("
          + ', '.join(f"configs/{n}.py {h:,.3g}" for n, h in hours.items()) + ")")
