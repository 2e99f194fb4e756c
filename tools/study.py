"""
Figure 1 in small: the paper's comparisons where a small model over-fits its training length,
measured across training, with seeds (docs/study.md has the results, how to read them and the
time each part takes).

    python -m tools.study                                      # everything, resumable
    python -m tools.study --parts="['lm_nope']" --seeds="[1]"  # one part, one seed

Trains every part x variant x seed with train.py under out/study/<part>/<variant>/s<seed>, `jobs`
runs at a time (each on cores / jobs threads: small models use two single-threaded processes
better than one with two threads), evaluates checkpoints along each finished run (eval.json
beside it), then writes out/study/results.json (every number, per seed and as mean and std),
summary.md (the claims with verdicts and the tables, made from results.json) and the figures.
Rerun it to resume: finished runs are kept, a run cut short goes on from its newest checkpoint.

The parts (every variant of a part has the same token budget):
  lm_nope, lm_sw, lm_nape   next-byte prediction on the whole Shakespeare corpus: a 4 x 128
      transformer trained on 128-byte windows for 708 steps of 4096 tokens (WSD, the last 20%
      annealed), with no positional encoding (NoPE); with the continued-pre-training
      architecture in small (SW: three RoPE layers with a 32-key sliding window, every 4th layer
      global and without positions, as SmolLM3); and with NAPE. Per-position CE on validation
      windows of 2048 bytes (16x) at 10 checkpoints along training, denser in the anneal.
  needle_nope, needle_sw    NIAH-1 in symbols (tasks.Needle) with a 2-layer NoPE model and a
      2-layer SW hybrid (a RoPE layer with a 16-key window, then a global NoPE layer): exact-match
      accuracy from 1x to 16x at the same checkpoints along training.
Not in the default list (copy_mamba about 25 minutes, lm_mamba about 56; docs/study.md):
python -m tools.study --parts="['copy_mamba', 'lm_mamba']" --out=out/study_mamba
  lm_mamba    the LM parts with a 4 x 128 Mamba2 (state 32, heads of 32) instead of a transformer
      (Table 6's Mamba2-85M row in small); lm_mamba_32 the same on 32-byte windows (WD, no-WD,
      PN-D).
  copy_mamba  the Copy task (tasks.Copy) with a 2 x 128 Mamba2, sources of 5-10 symbols, 1500
      steps: exact-match accuracy, and the fraction of right tokens, from 1x to 16x the longest
      source (Table 6's Mamba2-45M row in small).
Not in the default list (docs/methods.md):
python -m tools.study --parts="['methods']" --out=out/study_methods
  methods     the lm part's 4 x 128 transformer with RoPE and the field's length-generalization
      methods beside the regularizers, each alone and with PL-D (no WD anywhere): randomized
      positions and SSMax trained; YaRN (s = 16) and the log-length temperature on the no-WD and
      PL-D checkpoints (views: nothing trained); DroPE, 100 steps of CPT without positions from
      their final checkpoints.
  methods_needle, methods_offset, methods_delay   the same rows (VPAD aside) on the needle with a
      2-layer RoPE model, and on the two probes of tasks.py (configs/offset.py,
      configs/delay_copy.py), each with other positions beside RoPE: NoPE; ALiBi on the probes;
      learned on the delay copy.
Not in the default list (docs/study.md has their times):
python -m tools.study --parts="['cpt_sw', 'cpt_sw_needle']" --out=out/study_cpt
  cpt_sw, cpt_sw_needle  continued pre-training into sliding windows (Table 1 in small), in two
      phases. Phase 1 ('orig'): the lm part's 4 x 128 SmolLM3 pattern (RoPE, RoPE, RoPE, NoPE) with
      full attention and WD, or the needle's 2-layer RoPE, NoPE hybrid, trained once per seed. 'sw':
      its checkpoints with windows (32 keys; 16 for the needle) on the RoPE layers and no CPT. Every
      other variant continues phase 1's final weights with those windows (constant LR a tenth of
      phase 1's after 10% warm-up; 400 steps, 800 for the needle; a checkpoint every 10 / 20 steps
      for Table 12's averages of the last 10, 20 and 30), attention dropout among them (Tables 9,
      10; the p = 0.2 rows in cpt_sw only).
Not in the default list (docs/study.md, the reading rules and the times):
python -m tools.study --parts="['cpt_niah', 'cpt_niah_mamba']" --out=out/study_niah
  cpt_niah, cpt_niah_mamba  Tables 1 and 5 where their premise can show: the same two phases,
      with NIAH-1 learned in phase 1 (language mixed with its documents, 256-byte windows) by an
      8 x 128 transformer with SmolLM3's pattern twice (NoPE inside the stack, 4000 steps), or an
      8 x 128 Mamba2 (8000 steps, 90% documents); CPT on language alone for 600 steps (15% of the
      transformer's phase 1 tokens), into 128-key windows on the RoPE layers (Mamba2: none).
      NIAH-1 accuracy and CE at 1x to 16x.
python -m tools.study --parts="['cpt_niah_far']" --out=out/study_niah_far
  cpt_niah_far  Table 1 with a positive control (docs/study.md; its pilot: --seeds="[1]"):
      cpt_niah's phase 1, CPT on phase 1's mixture (NIAH-1 documents at most the training length
      kept), every scored needle beyond the window (FAR_GAP); a gate on seed 1 (gate()) before
      any outcome.
Not in the default list (docs/study.md, its design and reading rules):
python -m tools.study --parts="['lm_nope_dose', 'lm_nope_dose_2x']" --seeds="[1, 2, 3, 4, 5]" \
    --out=out/study_dose
  lm_nope_dose, lm_nope_dose_2x  weight decay at the paper's dose: lm_nope with weight decay 0,
      0.1, 1.0 and 3.28 (summed decays 0, 0.125, 1.25 and 4.11, configs/scratch.py's), PN-D, PL-D
      and VPAD at p = 0.1 without it; and on twice the steps no-WD, 0.5 and 1.64 (the same doses
      at half the per-step rate). Beside the CE, the norm of the decayed matrices at each
      checkpoint.
And at those checkpoints: the entropy of every head's attention by query position (the
mechanism; transformers), the uniform average of the last 5 checkpoints of the stable phase and
of the anneal (the paper's checkpoint averaging), and at the end of the LM runs with pre-linear
dropout the variance-mismatch probe (tools/variance.py, Figure 3).
"""

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from statistics import mean, stdev

import torch
from tqdm import tqdm

import average_ckpts
import checkpoint
import tasks
from configurator import configure
from dropout import PRE_LINEAR
from measures import attention_entropy, band_means, decayed_norm, loss_curve, moving_average
import ruler
from tokens import TokenData, Tokenizer, batch_rng
from tools.variance import variance_mismatch
from tools.verdict import paired

# -----------------------------------------------------------------------------
out = 'out/study'
# the LM parts' corpus: python data/shakespeare/prepare.py --tokenizer=byte
data_dir = 'data/shakespeare/byte'
parts = ['lm_nope', 'lm_sw', 'lm_nape', 'needle_nope', 'needle_sw']
seeds = [1, 2, 3]
variants = []  # of VARIANTS; [] runs each part's own list (PARTS)
jobs = 2  # runs at a time
tiny = False  # a few steps of a tiny model per run: the pipeline in a minute (tests), no results
eval_run = ''  # internal: evaluate one finished run (<part>/<variant>/s<seed>) and exit
# a results.json (e.g. assets/study_results.json): its summary and figures in `out`, nothing trained
report = ''
# -----------------------------------------------------------------------------
globals().update(configure(globals(), sys.argv[1:]))
checkpoint.check_output(out, True, os.path.isdir, 'tools/study.py')  # a folder of its own, or new

# the paper's regularizers; every dropout variant without weight decay, as in the paper
VARIANTS = {
    'wd': ['--weight_decay=0.1', '--dropout_type=none', '--dropout=0.0'],
    'no_wd': ['--weight_decay=0.0', '--dropout_type=none', '--dropout=0.0'],
    **{f'pn_d{s}': ['--weight_decay=0.0', '--dropout_type=pre_norm', f'--dropout={p}'] for s, p in
       (('', 0.1), ('_p0.05', 0.05), ('_p0.2', 0.2))},
    **{f'pl_d{s}': ['--weight_decay=0.0', '--dropout_type=pre_linear', f'--dropout={p}'] for s, p in
       (('', 0.1), ('_p0.05', 0.05), ('_p0.2', 0.2))},
    # reconstruction A (dropout.py); B: per feature
    'vpad': ['--weight_decay=0.0', '--dropout_type=vpad', '--dropout=0.1'],
    'vpad_b': ['--weight_decay=0.0', '--dropout_type=vpad', '--dropout=0.1', '--vpad_variant=B'],
    'vpad_p0.2': ['--weight_decay=0.0', '--dropout_type=vpad', '--dropout=0.2'],
    # Tables 9, 10
    'attn_d': ['--weight_decay=0.0', '--dropout_type=none', '--dropout=0.0', '--attn_dropout=0.1'],
    # weight decay at other doses (lm_nope_dose: the summed decay sum_t lr_t * wd, train.py)
    **{f'wd{x}': [f'--weight_decay={x}', '--dropout_type=none', '--dropout=0.0']
       for x in ('0.5', '1.0', '1.64', '3.28')},
}
DOSED = ('wd0.5', 'wd1.0', 'wd1.64', 'wd3.28')
NAMES = {'wd': 'WD', 'no_wd': 'no-WD', 'pn_d': 'PN-D', 'pl_d': 'PL-D', 'vpad': 'VPAD',
         'vpad_b': 'VPAD-B', 'pn_d_p0.05': 'PN-D p=0.05', 'pn_d_p0.2': 'PN-D p=0.2',
         'pl_d_p0.05': 'PL-D p=0.05', 'pl_d_p0.2': 'PL-D p=0.2', 'vpad_p0.2': 'VPAD p=0.2',
         'attn_d': 'Attn-D', 'orig': 'Orig.', 'sw': 'SW, no CPT',
         **{v: f'WD {v[2:]}' for v in DOSED}}
CORE = ['wd', 'no_wd', 'pn_d', 'pl_d', 'vpad', 'vpad_b']
# the field's length-generalization methods (docs/methods.md), each alone and with PL-D, none with
# WD. Trained: randomized positions (from 8x the training length) and SSMax. DroPE: CPT of the
# no-WD (or PL-D) run's final checkpoint without positions, as the CPT parts' SWU (constant LR a
# tenth of the lm parts', 10% warm-up), 100 steps. Views, which train nothing (VIEWS): YaRN with
# s = 16 (the reach of the evaluation) and the log-length temperature, on the no-WD and PL-D
# checkpoints
METHODS = ('rand', 'yarn', 'drope', 'ssmax', 'log_len')
# (and see train(): its learning rate and length)
DROPE = ['--pos_encoding=nope', '--schedule=constant', '--warmup_frac=0.1', '--ckpt_interval=10']
for m, args in (('rand', ['--rope_random=8']), ('ssmax', ['--attn_scale=ssmax']), ('drope', DROPE)):
    VARIANTS[m], VARIANTS[f'{m}_pl_d'] = VARIANTS['no_wd'] + args, VARIANTS['pl_d'] + args
SOURCES = {'drope': 'no_wd', 'drope_pl_d': 'pl_d'}  # rows that continue another row's final ckpt
for pe in ('nope', 'alibi', 'learned'):  # the probes' other positions beside RoPE (docs/methods.md)
    VARIANTS[pe] = VARIANTS['no_wd'] + [f'--pos_encoding={pe}']
# rows that train nothing: another row's checkpoints, with model arguments that change no weights
# ('sw': PHASE1's windows)
VIEWS = {'sw': ('orig', None),
         **{f'{m}{s}': (v, kw)
            for m, kw in (('yarn', {'rope_scaling': 'yarn', 'rope_factor': 16.0}),
                          ('log_len', {'attn_scale': 'log_length'}))
            for s, v in (('', 'no_wd'), ('_pl_d', 'pl_d'))}}
NAMES.update({f'{m}{s}': f'{name}{t}'
              for m, name in (('rand', 'RandPos'), ('yarn', 'YaRN'), ('drope', 'DroPE'),
                              ('ssmax', 'SSMax'), ('log_len', 'LogLen'))
              for s, t in (('', ''), ('_pl_d', ' + PL-D'))})
NAMES.update(nope='NoPE', alibi='ALiBi', learned='Learned')
LM = ['configs/quickstart.py', f'--data_dir={data_dir}', '--block_size=128', '--batch_size=32',
      '--tokens_per_batch=4096', '--max_tokens=2900000', '--eval_lengths=[]',
      '--eval_interval=100000', '--ckpt_interval=20']
# the needle's training loss jumps by more than a nat when the lookup is learned or lost (7 of
# the first 10 runs): that is the task, not a divergence, so train.py's spike check is off there
NEEDLE = ['configs/needle.py', '--eval_interval=100000', '--task_eval_samples=20',
          '--ckpt_interval=20', '--spike_threshold=0']
SW = lambda layers, window: [f"--pos_encoding={['rope'] * (layers - 1) + ['nope']}",  # noqa: E731
                             f"--window={[window] * (layers - 1) + [0]}"]
MAMBA = ['--model_type=mamba2', '--d_state=32', '--headdim=32', '--chunk_size=32']
# SmolLM3's layers, full attention
SMOL = lambda layers: [f"--pos_encoding={['rope'] * (layers - 1) + ['nope']}"]  # noqa: E731
# continued pre-training into sliding windows (Table 1 in small): part -> (phase 1, the windows of
# phase 2). Phase 1 ('orig') pre-trains the full-attention model once per seed, with WD as SmolLM3
# was; 'sw' is its final weights with the windows and no CPT; every other variant continues those
# weights with the windows on, as the paper's SWU: 10% warm-up, then a constant learning rate a
# tenth of phase 1's (SmolLM3's CPT: 2e-5), for a little over half of phase 1's tokens.
# Tables 1 and 5 where their premise can show (docs/study.md, the reading rules): phase 1 learns
# NIAH-1 (its short form, ruler.py) from language mixed with its documents (train.py --niah_mix) on
# 256-byte windows for 4000 steps, SmolLM3's layers twice (NoPE inside the stack), or Mamba2 for
# 8000 with 90% documents (its gate: at 4000, and at 8000 with half, it had not learned the lookup
# yet, docs/study.md); CPT continues on language alone (CPT's --niah_mix=0) for 600 steps, 15% of
# phase 1's tokens (Mamba2: 7.5%)
NIAH_LM = [*LM, '--block_size=256', '--batch_size=16', '--niah_mix=0.5',
           '--niah_task=niah_single_1_short', '--max_tokens=16384000', '--ckpt_interval=250',
           '--n_layer=8', '--spike_threshold=0']
PHASE1 = {'cpt_sw': (LM + SMOL(4), [32, 32, 32, 0]),
          # 3200 steps: at the needle parts' 1600 this hybrid learned the lookup in 1 seed of 3
          'cpt_sw_needle': (NEEDLE + SMOL(2) + [f'--max_tokens={3200 * 2048}'], [16, 0]),
          'cpt_niah': (NIAH_LM + [f"--pos_encoding={['rope', 'rope', 'rope', 'nope'] * 2}"],
                       [128, 128, 128, 0] * 2),
          # no windows: CPT at the same length
          'cpt_niah_mamba': (NIAH_LM + MAMBA + ['--max_tokens=32768000', '--niah_mix=0.9'], None)}
# Table 1 with a positive control (docs/study.md, its design and gate fixed before any run):
# cpt_niah's phase 1 and windows, but CPT keeps phase 1's NIAH-1 documents (at most the training
# length, half the sequences), so a lookup stays taught while the windows are on, and every scored
# needle lies beyond the window (FAR_GAP), so that a found needle went through the global layers
PHASE1['cpt_niah_far'] = PHASE1['cpt_niah']
# NIAH-1 scored with every needle at least this many tokens before the prompt's end: the window
# (128) and the answer's 16 tokens, so no answer token sees a digit of it through a window
FAR_GAP = {'cpt_niah_far': 128 + 16}
NIAH_PARTS = ('cpt_niah', 'cpt_niah_mamba', 'cpt_niah_far')
CPT = lambda part, lr, steps, every, mix=0: [  # noqa: E731
    *PHASE1[part][0], *([f'--window={PHASE1[part][1]}'] if PHASE1[part][1] else []),
    f'--niah_mix={mix}',
    '--schedule=constant', '--warmup_frac=0.1', f'--learning_rate={lr}',
    f"--max_tokens={steps * (4096 if PHASE1[part][0][0] == LM[0] else 2048)}",
    f'--ckpt_interval={every}']
METHOD_ROWS = [f'{m}{s}' for m in METHODS for s in ('', '_pl_d')]
# the probes as the needle, spike check off too (DroPE's recalibration on the offset task, from a
# loss of 11.7 nats once RoPE is gone, rose 1.1 nats above its recent low at step 55 of seed 1)
PROBE = NEEDLE[1:]
PHASE1_ROWS = ('orig', 'sw')  # a CPT part's rows measured along phase 1, not along CPT
CPT_VARIANTS = ['orig', 'sw', 'wd', 'no_wd', 'pn_d', 'pl_d', 'vpad', 'pl_d_p0.2', 'vpad_p0.2',
                'attn_d']
PARTS = {  # part -> (kind, train.py arguments, variants)
    'lm_nope': ('lm', LM + ['--pos_encoding=nope'], list(VARIANTS)),
    'lm_sw': ('lm', LM + SW(4, 32), CORE),
    'lm_nape': ('lm', LM + ['--pos_encoding=nape'], ['wd', 'no_wd', 'pl_d', 'vpad']),
    # not in `parts` by default: does NAPE over-fit its length later? The baseline on 4x the tokens
    # (python -m tools.study --parts="['lm_nape_long']" --seeds="[1]" --out=out/study_long)
    'lm_nape_long': ('lm', LM + ['--pos_encoding=nape', '--max_tokens=11600000'], ['no_wd']),
    # not in the default list: weight decay at the paper's dose (docs/study.md, its design and
    # reading rules fixed before its runs). lm_nope's setting, weight decay at summed doses of 0,
    # 0.125, 1.25 and 4.11 (configs/scratch.py's), and the dropouts without it; then the high doses
    # again with twice the steps at half the decay, to part the dose from the per-step rate
    'lm_nope_dose': ('lm', LM + ['--pos_encoding=nope'],
                     ['no_wd', 'wd', 'wd1.0', 'wd3.28', 'pn_d', 'pl_d', 'vpad']),
    'lm_nope_dose_2x': ('lm', LM + ['--pos_encoding=nope', '--max_tokens=5800000'],
                        ['no_wd', 'wd0.5', 'wd1.64']),
    'needle_nope': ('task', NEEDLE + ['--pos_encoding=nope'], CORE[:5]),
    'needle_sw': ('task', NEEDLE + SW(2, 16), CORE[:5]),
    'lm_mamba': ('lm', LM + MAMBA, CORE[:5]),
    # 32-byte windows, where a one-seed probe saw the gap beyond the length grow; WD, no-WD and PN-D
    # (the paper's Mamba2 dropout) only, for time
    'lm_mamba_32': ('lm', LM + MAMBA + ['--block_size=32', '--batch_size=128'], CORE[:3]),
    'copy_mamba': ('task', ['configs/copy_mamba.py', '--eval_interval=100000',
                            '--task_eval_samples=20', '--ckpt_interval=50'], CORE[:4]),
    'cpt_sw': ('lm', CPT('cpt_sw', 2e-4, 400, 10), CPT_VARIANTS),
    'cpt_sw_needle': ('task', CPT('cpt_sw_needle', 3e-4, 800, 20),
                      [v for v in CPT_VARIANTS if 'p0.2' not in v]),
    # not in the default list: Tables 1 and 5 with retrieval learned in phase 1 (docs/study.md)
    'cpt_niah': ('lm', CPT('cpt_niah', 2e-4, 600, 20),
                 ['orig', 'sw', 'wd', 'no_wd', 'pn_d', 'pl_d', 'pl_d_p0.2', 'vpad', 'attn_d']),
    'cpt_niah_mamba': ('lm', CPT('cpt_niah_mamba', 2e-4, 600, 20),
                       ['orig', 'wd', 'no_wd', 'pn_d_p0.2']),
    # the same CPT with phase 1's mixture kept (0.5, documents of 192-256 bytes), far needles
    'cpt_niah_far': ('lm', CPT('cpt_niah_far', 2e-4, 600, 20, mix=0.5),
                     ['orig', 'sw', 'wd', 'no_wd', 'pn_d', 'pl_d', 'pl_d_p0.2', 'vpad']),
    'methods': ('lm', LM + ['--pos_encoding=rope'], ['no_wd', 'pl_d', 'vpad', *METHOD_ROWS]),
    # the methods on retrieval and the two probes, each task with the positions it asks about
    # (tasks.py): learned ones cannot be scored beyond their table, so only on the delay copy (whose
    # length is fixed)
    'methods_needle': ('task', NEEDLE + ['--pos_encoding=rope'],
                       ['no_wd', 'pl_d', *METHOD_ROWS, 'nope']),
    'methods_offset': ('task', ['configs/offset.py', *PROBE],
                       ['no_wd', 'pl_d', *METHOD_ROWS, 'nope', 'alibi']),
    'methods_delay': ('task', ['configs/delay_copy.py', *PROBE],
                      ['no_wd', 'pl_d', *METHOD_ROWS, 'nope', 'alibi', 'learned']),
}
TINY = {'lm': ['--n_layer=4', '--n_embd=32', '--n_head=2', '--block_size=64', '--max_tokens=81920',
               '--ckpt_interval=2', '--eval_iters=2'],  # 20 steps
        'task': ['--n_layer=2', '--n_embd=32', '--n_head=2', '--max_tokens=40960',
                 '--ckpt_interval=2', '--eval_iters=2', '--task_eval_samples=4']}
# the NIAH parts' 256-byte windows (the mixture's) and 4K evaluations: 8 steps, and no more
# NIAH-1 than one prompt per length at the final checkpoint (evaluate)
TINY.update(dict.fromkeys(NIAH_PARTS, ['--n_embd=16', '--n_head=1', '--tokens_per_batch=1024',
                                       '--batch_size=4', '--max_tokens=8192', '--ckpt_interval=4',
                                       '--eval_iters=2']))
TINY['cpt_niah_mamba'] = TINY['cpt_niah'] + ['--n_layer=2']
# the checkpoints evaluated, as fractions of training
FRACTIONS = (0.15, 0.3, 0.45, 0.6, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0)
ANNEAL_START = 0.8  # the WSD anneal of both configs starts here (anneal_frac = 0.2)
AVERAGE_K = 5  # checkpoint averaging: the last K checkpoints of the stable phase, and of the anneal
# in: positions (T/2, T], with long context inside the training length
BANDS = ('in', '1-2x', '2-4x', '4-8x', '8-16x')
EVAL_WINDOWS, ENTROPY_WINDOWS = 16, 4  # lm: validation windows of 16x the training length
if tiny:  # the tests: the pipeline, not the numbers
    EVAL_WINDOWS, ENTROPY_WINDOWS = 2, 1
TASK_SAMPLES = 100  # needle: held-out samples per length
NIAH_SAMPLES = 1 if tiny else 20  # NIAH-1 prompts per length (eval_niah.py's), at 1x to 16x
NIAH_TASK = 'niah_single_1_short'  # (ruler.py) scored as eval_niah.py --task=niah_single_1_short
# the tokens an answer may take (eot ends it)
NIAH_NEW = ruler.TOKENS_TO_GENERATE[ruler.TASKS[NIAH_TASK][0]]
# every run's vector instructions held to AVX2 on x86 (unless set already), so that a rerun on
# another machine matches bit for bit: on AVX-512, oneDNN's matmuls round otherwise, and a rerun of
# cpt_niah_far's phase 1 there left the pilot's gradient norm at step 50 in its 7th digit
PINNED = ({'ONEDNN_MAX_CPU_ISA': 'AVX2', 'ATEN_CPU_CAPABILITY': 'avx2', 'MKL_CBWR': 'AVX2'}
          if platform.machine() in ('x86_64', 'AMD64') else {})


def run_dir(part, variant, seed):
    return os.path.join(out, part, variant, f's{seed}')


def source(part, variant):
    """The row whose checkpoints this one needs (None if it trains from scratch): a view's, a CPT
    part's phase 1 ('orig'), or the row a method's CPT continues (SOURCES)."""
    if variant in VIEWS:
        return VIEWS[variant][0]
    return 'orig' if part in PHASE1 and variant != 'orig' else SOURCES.get(variant)


def train(part, variant, seed, threads):
    """Train one run (or resume it), then evaluate it in a subprocess; -> None, or what failed."""
    d = run_dir(part, variant, seed)
    if os.path.exists(os.path.join(d, 'eval.json')):
        return None
    env = {**PINNED, **os.environ, 'OMP_NUM_THREADS': str(threads)}
    os.makedirs(d, exist_ok=True)
    # a view trains nothing
    if variant not in VIEWS and not os.path.exists(os.path.join(d, 'done')):
        resume = checkpoint.steps(d) and checkpoint.steps(d, 'optim')
        if not resume:
            shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d, exist_ok=True)
        args, start, from_source = [*PARTS[part][1], *VARIANTS.get(variant, [])], 'scratch', []
        if variant == 'orig':  # phase 1 of continued pre-training, with WD
            args = [*PHASE1[part][0], *VARIANTS['wd']]
        elif source(part, variant):  # CPT from its source's final checkpoint (trained first)
            src = run_dir(part, source(part, variant), seed)
            start = checkpoint.step_path(src, checkpoint.steps(src)[-1])
            # as the CPT parts: a tenth of the source's learning rate, 100 of its steps (100 in the
            # tiny runs too: after TINY)
            if variant in SOURCES:
                c = checkpoint.load_any(start)['config']
                from_source = [f"--learning_rate={c['learning_rate'] / 10}",
                               f"--max_tokens={100 * c['tokens_per_batch']}"]
        cmd = [sys.executable, 'train.py', *args,
               *(TINY.get(part, TINY[PARTS[part][0]]) if tiny else []), *from_source,
               f'--seed={seed}', f'--out_dir={d}', '--device=cpu',
               '--init_from=' + ('resume' if resume else start)]
        with open(os.path.join(d, 'train.log'), 'a') as log:
            if subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode:
                return f"{' '.join(cmd)}\n" + open(log.name).read()[-2000:]
        open(os.path.join(d, 'done'), 'w').close()
    cmd = [sys.executable, '-m', 'tools.study', f'--out={out}',
           f'--eval_run={part}/{variant}/s{seed}', f'--tiny={tiny}']
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return f"{' '.join(cmd)}\n{r.stdout[-1000:]}{r.stderr[-2000:]}" if r.returncode else None


# -----------------------------------------------------------------------------
# the measures of one checkpoint

def lm_measures(net, windows, T, entropy=True):
    """Per-position CE on windows (n, 16T + 1): its mean per band of the training length T and the
    curve (a moving average of T/4, every T/8 positions); a transformer's attention entropy per
    layer likewise."""
    total, n = loss_curve(net, windows, windows.size(1) - 1, 'cpu')
    curve = total / n  # (16T,)
    edges = [T // 2, T, 2 * T, 4 * T, 8 * T, 16 * T]
    m = {'bands': dict(zip(BANDS, band_means(curve, edges).values())),
         'curve': moving_average(curve, T // 4)[T // 8 - 1::T // 8].tolist()}
    if entropy:
        ent = attention_entropy(net, windows[:ENTROPY_WINDOWS]).mean(1)  # (L, 16T), mean over heads
        m['entropy_bands'] = [dict(zip(BANDS, band_means(e, edges).values())) for e in ent]
        m['entropy_curve'] = [moving_average(e, T // 4)[T // 8 - 1::T // 8].tolist() for e in ent]
    return m


def task_measures(net, task, lengths, seed):
    n = 10 if tiny else TASK_SAMPLES
    correct = tasks.correct_answers(task, net, lengths, n, seed, 'cpu') / n
    return {'accuracy': {str(L): c for L, c in zip(lengths, correct[:, 0].tolist())},
            'token_accuracy': {str(L): c for L, c in zip(lengths, correct[:, 1].tolist())}}


def niah_measures(net, tokenizer, T, gap=0):
    """NIAH-1 as eval_niah.py --task=niah_single_1_short scores it (prompts at seed 42, greedy
    answers, string match) at T to 16T tokens -> {'niah': {length: the fraction of NIAH_SAMPLES
    found}}. gap: every needle at least that many tokens before the prompt's end
    (ruler.far_prompt)."""
    data, sizes, acc = ruler.Data(say=lambda *args: None), {}, {}
    for L in (T, 2 * T, 4 * T, 8 * T, 16 * T):
        found = 0.0
        for i in range(NIAH_SAMPLES):
            args = (NIAH_TASK, tokenizer, L, f'niah/{L}/{i}', 42, data, sizes)
            text, answers = ruler.far_prompt(*args, gap) if gap else ruler.prompt(*args)
            answer = ruler.predict(net, tokenizer, text, NIAH_NEW, 'cpu')
            found += ruler.string_match_all(ruler.postprocess(answer), answers)
        acc[str(L)] = found / NIAH_SAMPLES
    return {'niah': acc}


def evaluate(part, variant, seed):
    """The measures of one run at the checkpoints FRACTIONS of the way through its training, and
    of the averages of its last AVERAGE_K checkpoints of the stable phase and of the anneal (of the
    last K = 10, 20, 30 for a CPT run, Table 12) -> eval.json. A view: its source's checkpoints,
    with its model arguments."""
    start, kind, d = time.time(), PARTS[part][0], run_dir(part, variant, seed)
    src = run_dir(part, VIEWS[variant][0], seed) if variant in VIEWS else d
    overrides = {}
    if variant in VIEWS:
        overrides = {'window': PHASE1[part][1]} if variant == 'sw' else VIEWS[variant][1]
    steps = checkpoint.steps(src)
    nearest = lambda f: min(steps, key=lambda s: abs(s - f * steps[-1]))  # noqa: E731
    stable_end = nearest(ANNEAL_START)
    picked = sorted({nearest(f) for f in FRACTIONS})
    net, _, ckpt = checkpoint.load_model(checkpoint.step_path(src, steps[-1]), **overrides)
    cfg = ckpt['config']
    if kind == 'lm':
        T = cfg['block_size']
        n = 1 if tiny and part in NIAH_PARTS else EVAL_WINDOWS  # (the tests: one of 4K tokens)
        val = TokenData(cfg['data_dir'], 'val')
        windows = val.long_windows(16 * T, n)  # (n, 16T + 1)
        # the entropy of 4K-token windows of 8 layers costs more than the rest: not for NIAH parts
        attends = ckpt['model_type'] == 'transformer' and part not in NIAH_PARTS
        measure = lambda entropy=True: lm_measures(  # noqa: E731
            net, windows, T, entropy and attends)
        if part in NIAH_PARTS:  # and retrieval, learned in phase 1 (the tests: at the end only)
            tokenizer, lm = Tokenizer(val.meta['tokenizer']), measure
            measure = lambda entropy=True, niah=True: {  # noqa: E731
                **lm(entropy), **(niah_measures(net, tokenizer, T, FAR_GAP.get(part, 0))
                                  if niah else {})}
    else:
        T = cfg['task_max_len']
        task = tasks.from_config(cfg)
        measure = lambda entropy=True: task_measures(  # noqa: E731
            net, task, cfg['eval_lengths'], cfg['seed'])
    result = {'train_length': T, 'final': steps[-1], 'stable_end': stable_end, 'steps': {}}
    if 'summed_decay' in ckpt:  # sum_t lr_t * wd (train.py; runs before it kept none)
        result['summed_decay'] = ckpt['summed_decay']
    for s in tqdm(picked, desc=d, leave=False):
        net.load_state_dict(checkpoint.load_any(checkpoint.step_path(src, s))['model'])
        niah = {'niah': s == steps[-1] or not tiny} if part in NIAH_PARTS else {}
        result['steps'][str(s)] = measure(**niah)
        # how far weight decay pulled the matrices in (against no-WD's: lm_nope_dose)
        result['steps'][str(s)]['decayed_norm'] = decayed_norm(net)
    if part in PHASE1 and variant not in ('orig', 'sw'):
        groups = {f'avg_{K}': steps[-K:] for K in (10, 20, 30)}
    else:
        groups = {name: [s for s in steps if s <= last][-AVERAGE_K:]
                  for name, last in (('avg_stable', stable_end), ('avg_anneal', steps[-1]))}
    for name, group in groups.items():
        net.load_state_dict(average_ckpts.average([checkpoint.step_path(src, s) for s in group]))
        result[name] = measure(entropy=False, **({'niah': not tiny} if part in NIAH_PARTS else {}))
    if kind == 'lm' and cfg['dropout_type'] in PRE_LINEAR:
        net.load_state_dict(ckpt['model'])
        torch.manual_seed(0)
        rows = variance_mismatch(net, val.batch(8, T, batch_rng(0, 1))[0])
        layers = sorted({r['layer'] for r in rows})
        result['probe'] = {
            'rel_err': [mean(abs(r['rel_err']) for r in rows if r['layer'] == i) for i in layers],
            'r': [mean(r['r'] for r in rows if r['layer'] == i) for i in layers]}
    # its wall clock, kept with it: a copy of the run folder keeps it, not the files' times
    result['eval_minutes'] = (time.time() - start) / 60
    result['cpu'] = torch.backends.cpu.get_cpu_capability()  # the vector instructions (PINNED)
    with open(os.path.join(d, 'eval.json.tmp'), 'w') as f:
        json.dump(result, f)
    os.replace(os.path.join(d, 'eval.json.tmp'), os.path.join(d, 'eval.json'))


if eval_run:
    part, variant, seed = eval_run.split('/')
    evaluate(part, variant, int(seed[1:]))
    sys.exit(0)

# -----------------------------------------------------------------------------
# 1. train and evaluate every run
unknown = ([p for p in parts if p not in PARTS]
           + [v for v in variants if v not in (*VARIANTS, *VIEWS, 'orig')])
if unknown:
    raise SystemExit(f"unknown parts or variants {unknown}: choose from {list(PARTS)} and "
                     f"{[*VARIANTS, *VIEWS, 'orig']}")
if report:  # the parts, variants and seeds the results hold; nothing to train
    if not os.path.exists(report):
        raise SystemExit(f"no results at {report}: give a study's results.json "
                         "(assets/study_*results.json)")
    results = json.load(open(report))
    parts, seeds = list(results['parts']), results['seeds']
    variants = [v for p in parts for v in results['parts'][p]]
    os.makedirs(out, exist_ok=True)
if variants:  # a row keeps the row whose checkpoints it needs (a CPT part its phase 1)
    PARTS = {p: (kind, args,
                 [v for v in vs if v in variants or v in {source(p, w) for w in variants}])
             for p, (kind, args, vs) in PARTS.items()}
runs = [] if report else [(p, v, s) for p in parts for v in PARTS[p][2] for s in seeds]
needed = {(p, source(p, v), s) for p, v, s in runs if source(p, v)}  # trained in a first wave
pending = [r for r in runs if not os.path.exists(os.path.join(run_dir(*r), 'eval.json'))]
threads = max(1, (os.cpu_count() or 2) // jobs)
if runs:
    print(f"{len(runs)} runs in {out}, {len(runs) - len(pending)} done; {len(pending)} to go, "
          f"{jobs} at a time on {threads} thread(s) each")
failed = []
bar = tqdm(total=len(pending), unit='run', disable=not runs)
with ThreadPoolExecutor(jobs) as pool, bar:
    for wave in ([r for r in pending if r in needed], [r for r in pending if r not in needed]):
        for r, error in zip(wave, pool.map(lambda r: train(*r, threads), wave)):
            bar.update()
            if error:
                failed.append(r)
                tqdm.write(f"{'/'.join(map(str, r))} failed:\n{error}")
        if failed:
            break
if failed:
    raise SystemExit(f"{len(failed)} runs failed (above); the others are kept: fix and rerun to "
                     "resume")


# -----------------------------------------------------------------------------
# 2. results.json: every measure per part and variant, per seed and as mean and std over seeds
def stats(values):
    return {'mean': mean(values), 'std': stdev(values) if len(values) > 1 else 0.0, 'seeds': values}


def gather(dicts):
    """[{key: number or dict}] (one per seed) -> the same tree with stats() at its leaves."""
    if isinstance(dicts[0], dict):
        return {k: gather([d[k] for d in dicts]) for k in dicts[0]}
    if isinstance(dicts[0], list):
        return [gather(list(v)) for v in zip(*dicts)]
    return stats(dicts)


def derive(e):
    """The measures the claims use, added to one seed's eval.json: for lm the rise of each band's
    CE over the in-distribution CE, and the probe's mean over the first and second half of the
    layers; for tasks the accuracy beyond the training length, exact and per token."""
    e.pop('eval_minutes', None)  # a time, not a measure (run_minutes)
    e.pop('cpu', None)  # where it ran, not a measure
    for s, m in e['steps'].items():
        if int(s) != e['final']:  # the figures draw the entropy curve of the final checkpoint only
            m.pop('entropy_curve', None)
    T = e['train_length']
    for m in [*e['steps'].values(), *(m for k, m in e.items() if k.startswith('avg_'))]:
        if 'bands' in m:
            m['rise'] = {b: x - m['bands']['in'] for b, x in m['bands'].items() if b != 'in'}
        if 'niah' in m:  # the reading rules' measures: Table 1's at 8-16x, Table 5's at 2x
            m['niah_far'] = mean([m['niah'][str(8 * T)], m['niah'][str(16 * T)]])
            m['niah_2x'] = m['niah'][str(2 * T)]
        if 'accuracy' in m:
            m['beyond'] = mean(a for L, a in m['accuracy'].items() if int(L) > T)
            m['token_beyond'] = mean(a for L, a in m['token_accuracy'].items() if int(L) > T)
    if 'probe' in e:
        n = len(e['probe']['rel_err']) // 2
        e['probe_halves'] = [mean(e['probe']['rel_err'][:n]), mean(e['probe']['rel_err'][n:])]
    return e


def at_fit(e, x, band):
    """The value of `band` in run e where its in-distribution CE equals x: interpolated linearly
    between the two checkpoints, along training, where it first crosses x; None if it never does."""
    points = [(m['bands']['in'], m['bands'][band]) for m in e['steps'].values()]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if min(x0, x1) <= x <= max(x0, x1) and x0 != x1:
            return y0 + (x - x0) * (y1 - y0) / (x1 - x0)
    return None


MATCHED = [('no_wd', v) for v in [*VARIANTS, *VIEWS] if v not in ('no_wd', 'sw')] + [
    ('wd', 'no_wd'), ('pn_d', 'pl_d'), ('pl_d', 'vpad'), ('vpad', 'vpad_b'),
    *[pair for m in METHODS for pair in ((m, f'{m}_pl_d'), ('pl_d', m))],
    *[(v, 'no_wd') for v in DOSED], *[('wd3.28', v) for v in ('pn_d', 'pl_d', 'vpad')]]
# (reference, run)


def matched(runs_a, runs_b):
    """Matched fit, seed by seed: run b's final CE beyond the training length against run a's at
    the same in-distribution CE (a's own checkpoints along training). None if a never had b's
    fit."""
    pairs = {}
    for band in ('4-8x', '8-16x'):
        ys = [at_fit(a, b['steps'][str(b['final'])]['bands']['in'], band)
              for a, b in zip(runs_a, runs_b)]
        if None not in ys:
            pairs[band] = stats(ys)
    return pairs


def compact(tree, curve=False):
    """Numbers to 5 decimals, and a curve's points as two lists, mean and std (what the figures
    draw), so that results.json stays small. Everything below is made from this rounded tree."""
    if isinstance(tree, dict):
        return {k: compact(v, curve or k in ('curve', 'entropy_curve')) for k, v in tree.items()}
    if curve and isinstance(tree, list) and isinstance(tree[0], dict):
        return {k: [round(x[k], 5) for x in tree] for k in ('mean', 'std')}
    if isinstance(tree, list):
        return [compact(v, curve) for v in tree]
    return round(tree, 5) if isinstance(tree, float) else tree


def run_minutes(d):
    """One run's time in minutes -> [training, evaluation]: training as the median step time
    train.py logged times the steps (robust to a run paused or resumed; a view trains nothing:
    0.0), evaluation as the wall clock evaluate() kept in eval.json (before it kept one: from the
    end of training, the run's `done` mark, to its eval.json; None for a view, which has no mark).
    """
    train, log = 0.0, os.path.join(d, 'log.jsonl')
    if os.path.exists(log):
        rows = [json.loads(line) for line in open(log)]
        ms = sorted(r['ms'] for r in rows if r['event'] == 'train')
        train = ms[len(ms) // 2] * max(r['iter'] for r in rows) / 60000 if ms else 0.0
    done, ev = os.path.join(d, 'done'), os.path.join(d, 'eval.json')
    evaluation = json.load(open(ev)).get('eval_minutes')
    if evaluation is None and os.path.exists(done):
        evaluation = (os.path.getmtime(ev) - os.path.getmtime(done)) / 60
    return [round(train, 2), None if evaluation is None else round(evaluation, 2)]


if not report:
    evals = {p: {v: [derive(json.load(open(os.path.join(run_dir(p, v, s), 'eval.json'))))
                     for s in seeds]
                 for v in PARTS[p][2]} for p in parts}
    results = compact({
        'seeds': seeds,
        'parts': {p: {v: gather(e) for v, e in evals[p].items()} for p in parts},
        'matched': {p: {f'{a}|{b}': matched(evals[p][a], evals[p][b])
                        for a, b in MATCHED if a in evals[p] and b in evals[p]}
                    for p in parts if PARTS[p][0] == 'lm'},
        'minutes': {p: {v: [run_minutes(run_dir(p, v, s)) for s in seeds] for v in PARTS[p][2]}
                    for p in parts}})
    with open(os.path.join(out, 'results.json.tmp'), 'w') as f:
        json.dump(results, f)
    os.replace(os.path.join(out, 'results.json.tmp'), os.path.join(out, 'results.json'))
    print(f"wrote {out}/results.json")
else:  # results kept before the right tokens beyond 1x were measured: made from the seeds' numbers
    for r in (r for rows in results['parts'].values() for r in rows.values()):
        for m in [*r['steps'].values(), *(m for k, m in r.items() if k.startswith('avg_'))]:
            if 'token_accuracy' in m and 'token_beyond' not in m:
                far = [a['seeds'] for L, a in m['token_accuracy'].items()
                       if int(L) > r['train_length']['mean']]
                m['token_beyond'] = stats([mean(x) for x in zip(*far)])


# -----------------------------------------------------------------------------
# 3. summary.md: every comparison seed by seed, with the verdict of one rule (tools/verdict.py)
def fmt(s, digits=3):
    return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f}"


def at_bound(a, b, bounds):
    """The floor clause: 'floor' ('ceiling') when both sides (stats with their 'seeds') sit at the
    measure's lowest (highest) value in every seed, else None. Neither side could move the way the
    claim needs, so the comparison measures nothing: *not testable*, never *does not hold*. bounds:
    (floor, ceiling) of a bounded measure (an accuracy: 0, 1); None for one without (CE)."""
    for x, name in zip(bounds or (), ('floor', 'ceiling')):
        if all(abs(v - x) < 1e-9 for v in (*a['seeds'], *b['seeds'])):
            return name
    return None


def verdict(a, b, lower_is_better, cells=True, bounds=None):
    """b against a (stats with their 'seeds') -> the cells: b better by, per seed | mean and its
    95% t-interval, and what the seeds could detect | the verdict of tools/verdict.py, and 'every
    seed' when they all agree; or, not cells, one line: the verdict, the mean and the interval.
    Both at a bound in every seed (at_bound): 'not testable (floor)' or '(ceiling)' instead of the
    verdict. Detectable: the interval's half-width, the smallest mean gain that would have held
    with this spread of the seeds (so a 'does not hold' is read against what could have)."""
    r = paired(a['seeds'], b['seeds'], lower_is_better)
    every = f" (every seed {'better' if r['mean'] > 0 else 'worse'})" if r['every_seed'] else ''
    interval = f"{r['mean']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}]" + (
        f", detectable {(r['hi'] - r['lo']) / 2:.3f}" if len(r['diffs']) > 1 else '')
    if at_bound(a, b, bounds):
        r['verdict'], every = f'not testable ({at_bound(a, b, bounds)})', ''
    if not cells:
        return f"{r['verdict']}{every}: {interval}"
    return ' '.join(f"{x:+.3f}" for x in r['diffs']) + f" | {interval} | {r['verdict']}{every}"


P, M = results['parts'], results['matched']
# the in-distribution band: the second half of the training length
inside = lambda p: '-'.join(  # noqa: E731
    str(int(next(iter(P[p].values()))['train_length']['mean']) // d) for d in (2, 1))
final = lambda r: r['steps'][str(int(r['final']['mean']))]  # noqa: E731  (seeds share their steps)
# what a part is measured by: (name, the value from one checkpoint's measures, lower is better,
# (floor, ceiling) for the floor clause or None, the premise it is read with: fails()); a task by
# exact match, and by the right tokens, which move at 0
ACCURACY = (0.0, 1.0)
MEASURES = {'lm': [('CE 8-16x', lambda m: m['bands']['8-16x'], True, None, 'lm')],
            'task': [('accuracy beyond 1x', lambda m: m['beyond'], False, ACCURACY, 'task'),
                     ('token accuracy beyond 1x', lambda m: m['token_beyond'], False, ACCURACY,
                      'task')]}
AVERAGED = {'avg_stable': 'its average of the last 5 of the stable phase',
            'avg_anneal': 'its average of the last 5 of the anneal',
            **{f'avg_{K}': f'its average of the last {K} of CPT' for K in (10, 20, 30)}}


def fails(p, v, cpt=False, kind=None):
    """The premise of a claim (docs/study.md): run v fails beyond its training length T, on the
    measure the claim is read by (its kind: MEASURES; by default the part's own), never on another
    one's. lm: its CE at 8-16x lies above its CE inside, by the rule; task: its accuracy at 8T and
    16T (their mean) lies below its accuracy at T, by the rule, and for a CPT claim (Table 1: 0.0
    at 2x) under 30% of Orig.'s accuracy at T (seed means); niah (the reading rules): its NIAH-1
    measure under 30% of Orig.'s accuracy at T."""
    r, kind = final(P[p][v]), kind or PARTS[p][0]
    if kind == 'niah':
        T = str(int(P[p][v]['train_length']['mean']))
        return r[RULES[p][0]]['mean'] < 0.3 * final(P[p]['orig'])['niah'][T]['mean']
    if kind == 'lm':
        rise = r['rise']['8-16x']['seeds']  # one seed: its sign
        verdict_ = paired(rise, [0.0] * len(rise), True)['verdict']
        return verdict_ == 'holds' or (len(rise) == 1 and rise[0] > 0)
    T, acc = int(P[p][v]['train_length']['mean']), r['accuracy']
    far = [mean(x) for x in zip(*(a['seeds'] for L, a in acc.items() if int(L) >= 8 * T))]
    low = not cpt or mean(far) < 0.3 * final(P[p]['orig'])['accuracy'][str(T)]['mean']
    drop = paired(acc[str(T)]['seeds'], far, True)
    return (drop['verdict'] == 'holds' or (len(far) == 1 and drop['mean'] > 0)) and low


# the reading rules of the parts with retrieval learned in phase 1 (docs/study.md, fixed before
# their runs): part -> (measure, the dropout that must beat WD, the rows that must fail, table)
RULES = {'cpt_niah': ('niah_far', 'pl_d', ('orig', 'sw'), 'Table 1'),
         'cpt_niah_mamba': ('niah_2x', 'pn_d_p0.2', ('orig',), 'Table 5'),
         # Table 1's own column (8K, 2x its 4K), every needle beyond the window (FAR_GAP)
         'cpt_niah_far': ('niah_2x', 'pl_d', ('orig', 'sw'), 'Table 1')}


def measures(p):
    """The measures a part's claims are read by: MEASURES, and the reading rules' NIAH-1 measure."""
    # (None: not measured)
    extra = {'cpt_niah': ('NIAH-1 at 8-16x', lambda m: m.get('niah_far'), False, ACCURACY, 'niah'),
             'cpt_niah_mamba': ('NIAH-1 at 2x', lambda m: m.get('niah_2x'), False, ACCURACY,
                                'niah'),
             'cpt_niah_far': ('NIAH-1 at 2x, needles beyond the window',
                              lambda m: m.get('niah_2x'), False, ACCURACY, 'niah')}
    return MEASURES[PARTS[p][0]] + ([extra[p]] if p in extra else [])


SETTINGS = {'': 'p = 0.1', '_p0.05': 'p = 0.05', '_p0.2': 'p = 0.2'}
CLAIMS = [
    ('wd', 'no_wd', 'WD over-fits the training length: no-WD better than WD',
     'Fig. 1 (from scratch)'),
    *[(v, 'no_wd', f'WD over-fits the training length: no-WD better than {NAMES[v]}',
       'Fig. 1 (from scratch; summed decay 4.11)') for v in DOSED],
    # the paper's Figure 1 pair (WD against VPAD), and the other dropouts, at its dose
    *[('wd3.28', v, f"dropout at the paper's dose of WD: {NAMES[v]} better than WD 3.28",
       'Fig. 1: WD over-fits, VPAD mitigates') for v in ('pn_d', 'pl_d', 'vpad')],
    *[('no_wd', f'{v}{s}', f'dropout helps extrapolation: {NAMES[f"{v}{s}"]} better than no-WD',
       f'Table 11: {paper}')
      for s in SETTINGS
      for v, paper in (('pn_d', 'PN-D ~ WD'), ('pl_d', 'PL-D >> WD'), ('vpad', 'VPAD >> WD'))
      if f'{v}{s}' in VARIANTS],
    *[(f'pn_d{s}', f'pl_d{s}',
       f'pre-linear beats pre-norm dropout, {SETTINGS[s]}: PL-D better than PN-D',
       'RULER 8K: PN-D 7.72 vs PL-D 20.11 (Table 10)') for s in SETTINGS],
    *[(f'pl_d{s}', f'vpad{s}',
       f'VPAD beats pre-linear dropout, {SETTINGS[s]}: VPAD better than PL-D',
       'RULER 8K: PL-D 20.11 vs VPAD 21.64 (Table 10)') for s in SETTINGS],
    ('vpad', 'vpad_b', 'VPAD-B (per feature) vs VPAD-A (per token)',
     'not in the paper (our reconstructions)'),
    # continued pre-training into sliding windows (Table 1: NIAH-1 at 2x, 4K trained)
    ('orig', 'sw', 'windows alone: SW without CPT better than Orig.', 'Table 1: Orig. 0.0, SW 0.0',
     'CPT'),
    ('sw', 'wd', 'CPT with WD: better than SW without CPT', 'Table 1: SW 0.0, CPT WD 0.0', 'CPT'),
    *[('wd', v, f'SW CPT with dropout extrapolates: {NAMES[v]} better than WD',
       'Table 1: WD 0.0, dropout ~100', 'CPT')
      for v in ('pn_d', 'pl_d', 'vpad', 'pl_d_p0.2', 'vpad_p0.2')],
    ('wd', 'pn_d_p0.2', 'Mamba2 CPT with dropout extrapolates: PN-D p=0.2 better than WD',
     'Table 5: WD 0.0, PN-D p=0.2 11.8 at 2x', 'CPT'),
    ('no_wd', 'attn_d', 'attention dropout helps: Attn-D better than no-WD',
     'Tables 9, 10 (rows lost)'),
    ('attn_d', 'pl_d', 'attention dropout helps less than PL-D: PL-D better than Attn-D',
     'Tables 9, 10'),
    # the field's methods (docs/methods.md): does a method help, and does PL-D add to or replace it?
    *[('no_wd', m, f'{NAMES[m]} helps: better than no-WD (nothing)', 'its own paper')
      for m in METHODS],
    *[(m, f'{m}_pl_d', f'PL-D adds to {NAMES[m]}: {NAMES[m]} + PL-D better than {NAMES[m]}',
       'not in the paper') for m in METHODS],
    *[('pl_d', m, f'{NAMES[m]} instead of PL-D: {NAMES[m]} better than PL-D', 'not in the paper')
      for m in METHODS]]
HEAD = ["| claim | part, measure | paper | baseline | second | second better by, per seed "
        "| mean [95% t-interval] | verdict |", "|---|---|---|---|---|---|---|---|"]
lines = [f"Every number: mean ± std over {len(seeds)} seeds ({', '.join(map(str, seeds))}), "
         f"at the "
         f"final checkpoint unless named. Every comparison is paired, seed by seed (the seeds of "
         f"two variants share their initial weights and batches): the second's gain over the "
         f"baseline per seed, its mean and the 95% t-interval of the mean; the verdict *holds* "
         f"when the interval lies above 0, *reversed* when below, else *does not hold* (within the "
         f"seeds' spread); *(every seed better)* or *(every seed worse)* when all seeds agree "
         f"(tools/verdict.py); *detectable*: the interval's half-width, the smallest mean gain "
         f"that would have held with the seeds' spread. *not testable (floor)* (or "
         f"*(ceiling)*): on an accuracy, both "
         f"sides at 0 (or 1) in every seed, so no difference could show. *not shown*: the part "
         f"does not show the claim's premise (its baseline, or for CPT Orig. and SW without CPT, "
         f"does not fail beyond the training length on the claim's own measure: `fails` in "
         f"tools/study.py), so the claim is not tested there. Each claim is read against every "
         f"baseline the runs have: the baseline's final checkpoint; on "
         f"language, its own checkpoint along training with the second's in-distribution CE (the "
         f"second half of the training length, interpolated: *matched fit*); its averaged "
         f"checkpoints (their in-distribution CE beside them). The first table gives, per claim, "
         f"the verdict against the final checkpoint and against the strongest baseline (the best "
         f"of them at the measure). Made by `python -m tools.study` from "
         f"{report or out + '/results.json'}.", '',
         '| claim | part, measure | paper | verdict against the final checkpoint '
         '| the strongest baseline | verdict against it |', '|---|---|---|---|---|---|']
detail = []


def dose(p, v):
    """' (WD 3.28: summed decay 4.11)' for a row with weight decay whose runs kept their summed
    decay sum_t lr_t * wd (train.py: runs since issue 73), else ''."""
    d = P[p][v].get('summed_decay', {}).get('mean', 0) if v in ('wd', *DOSED) else 0
    return f" ({NAMES[v]}: summed decay {d:.3g})" if d else ''


for a, b, claim_, paper, *cpt in CLAIMS:  # cpt: a claim about CPT, made of the CPT parts only
    for p in (p for p in parts if a in P[p] and b in P[p] and (p in PHASE1 or not cpt)):
        claim = claim_ + dose(p, a) + dose(p, b)
        for what, get, lower, bounds, kind in measures(p):
            # per measure: a part that fails beyond its length on one measure may not on another
            premise = (all(fails(p, r, True, kind) for r in ('orig', 'sw') if r in P[p]) if cpt
                       else fails(p, 'no_wd' if 'no_wd' in P[p] else a, kind=kind))
            y = get(final(P[p][b]))
            bases = [(NAMES[a], get(final(P[p][a])))]
            m = M.get(p, {}).get(f'{a}|{b}', {}).get('8-16x') if what == 'CE 8-16x' else None
            if m:
                bases.append((f"{NAMES[a]} at {NAMES[b]}'s fit", m))
            elif f'{a}|{b}' in M.get(p, {}):
                bases.append((f"{NAMES[a]} never had {NAMES[b]}'s fit", None))
            for k in (k for k in P[p][a] if k in AVERAGED):
                fit = f" (in {fmt(P[p][a][k]['bands']['in'])})" if 'bands' in P[p][a][k] else ''
                bases.append((f"{NAMES[a]}, {AVERAGED[k]}{fit}", get(P[p][a][k])))
            for base, x in bases:
                cells = (f"{fmt(x)} | {NAMES[b]} {fmt(y)} | {verdict(x, y, lower, True, bounds)}"
                         if x
                         else '- | - | - | - | -')
                detail.append(f"| {claim} | {p}, {what} | {paper} | {base} {cells} |")
            scored = [(name, x) for name, x in bases if x]
            strongest = min(scored, key=lambda t: t[1]['mean'] * (1 if lower else -1))
            shown = lambda x: (  # noqa: E731
                verdict(x, y, lower, False, bounds) if premise else 'not shown')
            lines.append(f"| {claim} | {p}, {what} | {paper} | {shown(bases[0][1])} "
                         f"| {strongest[0]} {fmt(strongest[1])} | {shown(strongest[1])} |")


def gate(p):
    """cpt_niah_far's gate (docs/study.md, fixed before its pilot), on the first seed, the pilot's
    -> (passed, what it read). (a) Orig. finds at least 0.9 at 1x and at most 0.3 of that at 2x to
    16x; (b) SW without CPT at most 0.3 of Orig.'s 1x at every length (each needle lies beyond the
    window); (c) the positive control: some CPT variant finds at least 0.5 at 2x."""
    acc = {v: {int(L): x['seeds'][0] for L, x in final(P[p][v])['niah'].items()} for v in P[p]}
    T = int(P[p]['orig']['train_length']['mean'])
    one_x, cpt = acc['orig'][T], [v for v in acc if v not in PHASE1_ROWS]
    a = one_x >= 0.9 and max(x for L, x in acc['orig'].items() if L > T) <= 0.3 * one_x
    b = max(acc['sw'].values()) <= 0.3 * one_x
    c = bool(cpt) and max(acc[v][2 * T] for v in cpt) >= 0.5
    best = max(cpt, key=lambda v: acc[v][2 * T]) if cpt else None
    said = (f"(a) Orig. {one_x:.2f} at 1x, at most "
            f"{max(x for L, x in acc['orig'].items() if L > T):.2f} beyond: "
            f"{'passed' if a else 'missed'}; (b) SW without CPT at most "
            f"{max(acc['sw'].values()):.2f} at any length: {'passed' if b else 'missed'}; (c) the "
            f"best CPT variant at 2x " + (f"{NAMES[best]} {acc[best][2 * T]:.2f}" if best else
                                          "(none run)") + f": {'passed' if c else 'missed'}")
    return a and b and c, said


GATES = ('cpt_niah_far',)
for p in (p for p in parts if p in RULES):  # the outcome by the reading rules
    key, v, failing, table = RULES[p]
    if p in GATES and {'orig', 'sw'} <= set(P[p]):
        passed, said = gate(p)
        lines += ['', f"**The gate of {p}** (seed {seeds[0]}, the pilot; docs/study.md): "
                  f"**{'passed' if passed else 'missed'}**: {said}."]
        if not passed:
            lines += ['', f"**{table} in small ({p})**: **not testable in small** (its gate "
                      "missed, above): no outcome is read."]
            continue
    if not {*failing, 'wd', v} <= set(P[p]):  # a pilot, or a part run in pieces
        lines += ['', f"**{table} in small ({p})**: no outcome by the reading rules yet: it needs "
                  f"the rows {', '.join(NAMES[r] for r in (*failing, 'wd', v))}."]
        continue
    T, last = str(int(P[p]['orig']['train_length']['mean'])), {r: final(P[p][r]) for r in P[p]}
    premise = all(last[r][key]['mean'] < 0.3 * last['orig']['niah'][T]['mean'] for r in failing)
    wd_fails = last['wd'][key]['mean'] < 0.5 * last['wd']['niah'][T]['mean']
    beats = paired(last['wd'][key]['seeds'], last[v][key]['seeds'], False)['verdict'] == 'holds'
    n = len(last['wd'][key]['seeds'])  # the rules read seeds 1-3
    # the floor clause: WD and the dropout both at 0 (or 1) in every seed can show no difference
    bound = at_bound(last['wd'][key], last[v][key], ACCURACY)
    outcome = (f'no outcome yet ({n} of 3 seeds)' if n < 3 else 'not shown' if not premise
               else f'not testable ({bound})' if bound
               else 'reproduced' if wd_fails and beats else 'not reproduced')
    floor = (f" (WD and {NAMES[v]} both at {ACCURACY[bound == 'ceiling']:.0f} in every seed: "
             f"the measure could show no difference)" if bound else '')
    lines += ['', f"**{table} in small ({p})**, by the reading rules fixed before the runs and "
              f"the floor clause (added after cpt_niah's runs, before cpt_niah_far's design: "
              f"docs/study.md): **{outcome}**{floor}. "
              f"Premise, under 30% of Orig.'s 1x accuracy "
              f"({last['orig']['niah'][T]['mean']:.2f}): " + ', '.join(
                  f"{NAMES[r]} {last[r][key]['mean']:.2f}" for r in failing) +
              f"; WD-CPT {last['wd'][key]['mean']:.2f} against half its own 1x accuracy "
              f"({last['wd']['niah'][T]['mean'] / 2:.2f}); {NAMES[v]} against WD: "
              f"{verdict(last['wd'][key], last[v][key], False, False, ACCURACY)}."]
lines += ['', 'Every comparison behind the table above, against each baseline:', '', *HEAD,
          *detail, '', 'Checkpoint averaging (Table 12) and the variance mismatch (Figure 3), '
          'paired the same way:', '', *HEAD]
AVERAGES = {name: (step, f'the last {AVERAGE_K} of the {what}', 41.2) for name, step, what in
            (('avg_anneal', 'final', 'anneal'), ('avg_stable', 'stable_end', 'stable phase'))}
AVERAGES.update({f'avg_{K}': ('final', f'the last {K} of CPT', x)
                 for K, x in ((10, 41.2), (20, 66.4), (30, 68.2))})
for p in parts:
    # the part's first measure, and the reading rules' NIAH-1 measure (Table 12's own) if it has one
    own = MEASURES[PARTS[p][0]]
    avg_rows = ('wd', 'no_wd', 'vpad', 'pl_d') if p in PHASE1 else ('wd', 'no_wd', 'vpad')
    for v in (v for v in avg_rows if v in P[p]):
        for what, get, lower, bounds, _ in own[:1] + measures(p)[len(own):]:
            for name, (step, avg, paper) in ((n, a) for n, a in AVERAGES.items() if n in P[p][v]):
                last, averaged_ = P[p][v]['steps'][str(int(P[p][v][step]['mean']))], P[p][v][name]
                x, y = get(last), get(averaged_)
                if x is None or y is None:  # (NIAH-1 not measured there)
                    continue
                fit = lambda r: f" (in {fmt(r['bands']['in'])})" if lower else ''  # noqa: E731
                lines.append(f"| checkpoint averaging helps: {avg} | {p}, {what}, {NAMES[v]} "
                             f"| NIAH-1 8K: 0.0 -> {paper} (Table 12) | its last checkpoint "
                             f"{fmt(x)}{fit(last)} | averaged {fmt(y)}{fit(averaged_)} "
                             f"| {verdict(x, y, lower, True, bounds)} |")
for p in (p for p in parts if 'pl_d' in P[p] and 'probe_halves' in P[p]['pl_d']):
    for v in (v for v in ('vpad', 'vpad_b') if v in P[p]):
        for i, which in enumerate(('first', 'second')):
            x, y = P[p]['pl_d']['probe_halves'][i], P[p][v]['probe_halves'][i]
            lines.append(f"| VPAD reduces the pre-activation variance mismatch | {p}, {which} "
                         f"half of the layers | PL-D {(0.29, 0.37)[i]} vs VPAD "
                         f"{(0.09, 0.06)[i]} (Fig. 3) | PL-D {fmt(x)} | {NAMES[v]} {fmt(y)} "
                         f"| {verdict(x, y, True)} |")

# weight decay's dose (docs/study.md, lm_nope_dose's reading rules 2, 3, 5 and 6): each row's
# summed decay, its decayed matrices' norm against no-WD's, the slope of CE against the dose, and
# the effect of one dose at two per-step rates
PAPER_DOSE = {'lm_nope_dose': 'wd3.28', 'lm_nope_dose_2x': 'wd1.64'}  # summed decay 4.11
SAME_DOSE = (('wd1.0', 'wd0.5'), ('wd3.28', 'wd1.64'))  # (lm_nope_dose's, lm_nope_dose_2x's)
ACTED = 0.9  # rule 2: WD's norm at the end below this fraction of no-WD's in every seed


def slope(x, y):
    """The least-squares slope of y against x."""
    mx, my = mean(x), mean(y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)


def norm_ratio(p, v):
    """Row v's norm of the decayed matrices at the end over no-WD's, seed by seed."""
    return [x / y for x, y in zip(final(P[p][v])['decayed_norm']['seeds'],
                                  final(P[p]['no_wd'])['decayed_norm']['seeds'])]


ce_far = lambda p, v: final(P[p][v])['bands']['8-16x']  # noqa: E731
dosed = [p for p in parts if PARTS[p][0] == 'lm' and 'summed_decay' in P[p].get('no_wd', {})]
for p in dosed:
    wd_rows = [v for v in P[p] if v in ('no_wd', 'wd', *DOSED)]  # weight decay alone
    if len(wd_rows) < 2:  # no-WD alone: no dose to state
        continue
    lines += ['', f"**{p}**, weight decay's dose: each row's summed decay sum_t lr_t * wd "
              "(train.py), the norm of its decayed matrices at the end over no-WD's, per seed, "
              "and its CE at the end", '',
              "| variant | summed decay | norm / no-WD's, per seed | CE in | CE 8-16x "
              "| rise 8-16x |",
              '|---|---|---|---|---|---|']
    for v in wd_rows:
        r = final(P[p][v])
        lines.append(f"| {NAMES[v]} | {P[p][v]['summed_decay']['mean']:.3g} | "
                     + ' '.join(f'{x:.3f}' for x in norm_ratio(p, v))
                     + f" | {fmt(r['bands']['in'])} | {fmt(r['bands']['8-16x'])} "
                     f"| {fmt(r['rise']['8-16x'])} |")
    top = PAPER_DOSE.get(p)
    if top not in P[p]:
        continue
    ratio = norm_ratio(p, top)
    acted = all(x < ACTED for x in ratio)
    lines += ['', f"Rule 2, weight decay acted at the paper's dose ({NAMES[top]}, summed decay "
              f"{P[p][top]['summed_decay']['mean']:.3g}): **{'yes' if acted else 'no'}**: its "
              f"norm at the end is {min(ratio):.3f} to {max(ratio):.3f} of no-WD's (the rule: "
              f"below {ACTED} in every seed)."]
    premise = fails(p, 'no_wd')
    outcome = ('not shown' if not premise else 'not testable (the decay did not act)'
               if not acted else verdict(ce_far(p, top), ce_far(p, 'no_wd'), True, False))
    lines += ['', f"**At the paper's dose ({p})**, by the reading rules fixed before the runs "
              f"(docs/study.md), no-WD better than {NAMES[top]} on CE 8-16x: **{outcome}**"
              + ('.' if premise else " (no-WD's rise is not above 0 by the rule).")]
    if len(wd_rows) < 3:  # a slope needs three doses
        continue
    x = [P[p][v]['summed_decay']['mean'] for v in wd_rows]
    for what, get in (('CE 8-16x', lambda r: r['bands']['8-16x']),
                      ('the rise', lambda r: r['rise']['8-16x'])):
        ys = list(zip(*(get(final(P[p][v]))['seeds'] for v in wd_rows)))  # per seed, per dose
        slopes = [slope(x, y) for y in ys]
        r = paired(slopes, [0.0] * len(slopes), True)  # 'holds': the slopes' mean above 0
        sign = {'holds': 'positive', 'reversed': 'negative'}.get(r['verdict'], 'neither')
        lines += ['', f"Rule 5, {what} against the summed decay ({p}: "
                  + ', '.join(f'{NAMES[v]} {d:.3g}' for v, d in zip(wd_rows, x))
                  + "), the least-squares slope per seed: "
                  + ' '.join(f'{b:+.3f}' for b in slopes)
                  + f" ({sum(b > 0 for b in slopes)} of {len(slopes)} positive); mean "
                  f"{r['mean']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}]: **{sign}** by the rule."]
if {'lm_nope_dose', 'lm_nope_dose_2x'} <= set(dosed):  # rule 6: the same dose at half the rate
    A, B = 'lm_nope_dose', 'lm_nope_dose_2x'
    for a, b in (pair for pair in SAME_DOSE if pair[0] in P[A] and pair[1] in P[B]):
        eff = [[x - y for x, y in zip(ce_far(p, v)['seeds'], ce_far(p, 'no_wd')['seeds'])]
               for p, v in ((A, a), (B, b))]  # WD's effect on CE 8-16x, per seed
        r = paired(eff[0], eff[1], True)  # d = effect at the full rate minus at half of it
        lines += ['', f"Rule 6, the dose or the rate, summed decay "
                  f"{P[A][a]['summed_decay']['mean']:.3g}: WD's effect on CE 8-16x (its CE minus "
                  f"its arm's no-WD's, per seed) at lm_nope_dose's rate ({NAMES[a]}) "
                  + ' '.join(f'{d:+.3f}' for d in eff[0]) + f", at half of it ({B}, {NAMES[b]}) "
                  + ' '.join(f'{d:+.3f}' for d in eff[1]) + f"; the first minus the second "
                  f"{r['mean']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}]: {r['verdict']}."]

# the matched-fit control for every dropout variant against no-WD (the p sweep included)
for p in (p for p in parts if PARTS[p][0] == 'lm' and 'no_wd' in P[p]):
    lines += ['', f"**{p}**, matched fit: each variant's final checkpoint against no-WD's own "
              f"checkpoint of the same in-distribution CE (CE {inside(p)})", '',
              f'| variant | CE {inside(p)} | CE 4-8x | no-WD at that fit | CE 8-16x '
              '| no-WD at that fit | better by, per seed (8-16x) | mean [95% t-interval] '
              '| verdict |',
              '|---|---|---|---|---|---|---|---|---|']
    for v in (v for v in P[p] if f'no_wd|{v}' in M[p]):  # not the rows of a CPT part's phase 1
        r, m = final(P[p][v])['bands'], M[p][f'no_wd|{v}']
        cells = [fmt(r['in'])]
        for band in ('4-8x', '8-16x'):
            cells += [fmt(r[band]), fmt(m[band]) if band in m else 'never at that fit']
        lines.append(f"| {NAMES[v]} | " + ' | '.join(cells) + ' | '
                     + (verdict(m['8-16x'], r['8-16x'], True) if '8-16x' in m else '- | - | -')
                     + ' |')

# per part: the measure across training, and every band (or length) at the end
# (CPT: the last 20, Table 12's best at 2x)
averaged = lambda r: r.get('avg_anneal') or r['avg_20']  # noqa: E731
for p in parts:
    kind, _, vs = PARTS[p]
    what = (f'CE 8-16x minus CE {inside(p)} (the rise beyond the training length)' if kind == 'lm'
            else 'exact-match accuracy beyond the training length')
    # phase 1 and CPT: steps of their own
    step_axes = list(dict.fromkeys(tuple(P[p][v]['steps']) for v in vs))
    for group in ([v for v in vs if tuple(P[p][v]['steps']) == a] for a in step_axes):
        steps = list(P[p][group[0]]['steps'])
        along = (', phase 1 (SW: its checkpoints with the windows)' if group[0] in PHASE1_ROWS else
                 ', CPT' if p in PHASE1 or group[0] in SOURCES else '')
        lines += ['', f"**{p}** across training{along}: {what}, by training step", '',
                  '| variant | ' + ' | '.join(steps) + ' |', '|---' * (len(steps) + 1) + '|']
        for v in group:
            cells = [fmt(m['rise']['8-16x'], 3) if kind == 'lm' else fmt(m['beyond'], 2)
                     for m in P[p][v]['steps'].values()]
            lines.append(f"| {NAMES[v]} | " + ' | '.join(cells) + ' |')
    cols = list(BANDS) if kind == 'lm' else list(final(P[p][vs[0]])['accuracy'])
    if kind == 'lm':
        what = (f"per-position CE (nats/byte) by band (in = positions {inside(p)}), and the CE "
                "8-16x of the averaged last 5 checkpoints")
    else:
        what = (f"exact-match accuracy by length (trained on lengths up to "
                f"{int(P[p][vs[0]]['train_length']['mean'])}), and beyond 1x for the averaged "
                "last 5 checkpoints")
    lines += ['', f"**{p}** at the final checkpoint: {what}"
              + (' (of CPT: the last 20)' if p in PHASE1 else ''),
              '', '| variant | ' + ' | '.join(cols) + ' | averaged |',
              '|---' * (len(cols) + 2) + '|']
    for v in vs:
        r = final(P[p][v])
        if kind == 'lm':
            cells = [fmt(r['bands'][c]) for c in cols] + [fmt(averaged(P[p][v])['bands']['8-16x'])]
        else:
            cells = [fmt(r['accuracy'][c], 2) for c in cols] + [fmt(averaged(P[p][v])['beyond'], 2)]
        lines.append(f"| {NAMES[v]} | " + ' | '.join(cells) + ' |')
    if p in NIAH_PARTS:  # 1x after CPT too: CPT on language alone may erode the skill
        lengths = list(final(P[p][vs[0]])['niah'])
        lines += ['', f"**{p}** at the final checkpoint: NIAH-1 accuracy by length ({NIAH_TASK}, "
                  f"{NIAH_SAMPLES} per length), and of the average of the last 20 CPT checkpoints "
                  "at 8-16x", '', '| variant | ' + ' | '.join(lengths) + ' | averaged |',
                  '|---' * (len(lengths) + 2) + '|']
        for v in vs:
            avg = P[p][v].get('avg_20', {})
            lines.append(f"| {NAMES[v]} | "
                         + ' | '.join(fmt(final(P[p][v])['niah'][L], 2) for L in lengths) + ' | '
                         + (fmt(avg['niah_far'], 2) if 'niah_far' in avg else '-') + ' |')
    if kind == 'task':
        lines += ['', f"**{p}** at the final checkpoint: the fraction of right answer tokens by "
                  "length", '', '| variant | ' + ' | '.join(cols) + ' |',
                  '|---' * (len(cols) + 1) + '|']
        lines += [f"| {NAMES[v]} | "
                  + ' | '.join(fmt(final(P[p][v])['token_accuracy'][c], 2) for c in cols) + ' |'
                  for v in vs]
if 'minutes' in results:  # (results.json made before the times were kept has none)
    lines += ['', 'Time per run, in minutes, the mean over seeds: training (the median step time x '
              'the steps) and evaluation (wall clock), runs 2 at a time on 2 cores', '',
              '| part / variant | training | evaluation |', '|---|---|---|']
    for p in parts:
        for v, runs in results['minutes'].get(p, {}).items():
            ev = [e for _, e in runs if e is not None]
            lines.append(f"| {p} / {NAMES[v]} | {mean(t for t, _ in runs):.1f} | "
                         + (f"{mean(ev):.1f} |" if ev else "- |"))
with open(os.path.join(out, 'summary.md'), 'w') as f:
    f.write('\n'.join(lines) + '\n')
print('\n'.join(lines))
# Table 1 (cpt_niah) and Table 5 (cpt_niah_mamba) as eval_niah.py prints a paper table: a row per
# variant (and per average of its last K CPT checkpoints), NIAH-1 in % by length, seeds' means
for p in (p for p in parts if p in NIAH_PARTS):
    vs = [v for v in PARTS[p][2] if v in P[p]]
    T = int(P[p][vs[0]]['train_length']['mean'])
    rows = []
    for v in vs:
        for k in ('', 'avg_10', 'avg_20', 'avg_30'):
            r = P[p][v].get(k, {}) if k else final(P[p][v])
            if 'niah' in r:
                rows.append({'label': NAMES[v] + (f' K={k[4:]}' if k else ''),
                             'ckpt': f'{p}/{v}' + (f'/{k}' if k else ''),
                             'score': {int(L): 100 * x['mean'] for L, x in r['niah'].items()}})
    ruler.write_table(os.path.join(out, f'table_{p}'), rows, list(rows[0]['score']), T,
                      f"{RULES[p][3]} in small ({p}): NIAH-1 accuracy (%) by length in bytes, the "
                      f"mean of {len(seeds)} seeds; K=n: the average of the last n CPT checkpoints")

# -----------------------------------------------------------------------------
# 4. figures
import matplotlib  # noqa: E402
matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402

# tab20's 20 colours, then tab20b's
COLORS = {v: plt.cm.tab20.colors[(2 * i) % 20 + (2 * i) // 20] if i < 20 else
          plt.cm.tab20b.colors[(4 * i) % 20 + i // 25] for i, v in enumerate([*VARIANTS, *VIEWS])}
COLORS.update(orig='black', sw='gray')


def save(fig, name):
    fig.tight_layout()
    fig.savefig(os.path.join(out, name), dpi=100)
    plt.close(fig)


def mean_std(xs):
    """A curve ({'mean': [...], 'std': [...]}) or a list of stats -> two tensors."""
    if isinstance(xs, dict):
        return torch.tensor(xs['mean']), torch.tensor(xs['std'])
    return torch.tensor([x['mean'] for x in xs]), torch.tensor([x['std'] for x in xs])


lm_parts = [p for p in parts if PARTS[p][0] == 'lm']
task_parts = [p for p in parts if PARTS[p][0] == 'task']


def after(p, v):
    """The step a row's own steps start from on a shared axis: its source's last (DroPE), else 0."""
    return int(P[p][SOURCES[v]]['final']['mean']) if v in SOURCES and p not in PHASE1 else 0


def band_plot(ax, x, values, v, **kw):
    m, s = mean_std(values)
    ax.plot(x, m, color=COLORS[v], label=NAMES[v], **kw)
    ax.fill_between(x, m - s, m + s, color=COLORS[v], alpha=0.15)


# Figure 1, left: per-position CE at several steps; right: CE beyond 1x against the step
for p in lm_parts:
    vs = [v for v in (*PHASE1_ROWS, *CORE, *METHODS) if v in P[p]]
    cols = (len(vs) + 3) // 2
    fig, axes = plt.subplots(2, cols, figsize=(3.6 * cols, 7), squeeze=False)
    axes = axes.flatten()
    for ax, v in zip(axes, vs):
        steps = list(P[p][v]['steps'])
        for i, s in enumerate(steps):
            m, _ = mean_std(P[p][v]['steps'][s]['curve'])
            ax.plot(torch.arange(1, len(m) + 1) / 8, m, lw=1,
                    color=plt.cm.viridis(i / max(len(steps) - 1, 1)),
                    label=f'step {s}' if i in (0, len(steps) - 1) else None)
        ax.axvline(1, color='k', ls=':', lw=1)
        ax.set_xscale('log', base=2)
        ax.set_title(f'{p}, {NAMES[v]}', fontsize=9)
        ax.set_xlabel('position / training length')
        ax.set_ylabel('CE (nats/byte), moving average of T/4', fontsize=8)
    lo = min(ax.get_ylim()[0] for ax in axes[:len(vs)])
    hi = max(ax.get_ylim()[1] for ax in axes[:len(vs)])
    for ax in axes[:len(vs)]:  # one scale for every variant
        ax.set_ylim(lo, hi)
    axes[0].legend(fontsize=7)
    for ax, get, label in ((axes[-2], lambda m: m['bands']['8-16x'], 'CE at 8-16x'),
                           (axes[-1], lambda m: m['rise']['8-16x'],
                            f'CE 8-16x minus CE {inside(p)}')):
        for v in P[p]:
            steps = list(P[p][v]['steps'])
            if v in PHASE1_ROWS:  # measured along phase 1: its end, as a level for CPT to beat
                ax.axhline(get(final(P[p][v]))['mean'], color=COLORS[v], ls=':',
                           label=f'{NAMES[v]} (end of phase 1)')
                continue
            band_plot(ax, [after(p, v) + int(s) for s in steps],
                      [get(P[p][v]['steps'][s]) for s in steps], v, ls='-' if v in CORE else '--')
        if p not in PHASE1:
            ax.axvline(int(P[p][vs[0]]['stable_end']['mean']), color='k', ls=':', lw=1)
        ax.set_xlabel('step of CPT' if p in PHASE1 else 'training step (dotted: the anneal starts)')
        ax.set_ylabel(label)
        ax.set_title(f'{p}: beyond the training length', fontsize=9)
    axes[-1].legend(fontsize=6)
    for ax in axes[len(vs):-2]:
        ax.axis('off')
    save(fig, f'fig1_{p}.png')

if lm_parts:  # the matched-fit control: in-distribution CE against CE beyond it, every checkpoint
    fig, axes = plt.subplots(len(lm_parts), 2, figsize=(10, 4 * len(lm_parts)), squeeze=False)
    for row, p in zip(axes, lm_parts):
        for ax, band in zip(row, ('4-8x', '8-16x')):
            for v in P[p]:
                x, _ = mean_std([m['bands']['in'] for m in P[p][v]['steps'].values()])
                y, _ = mean_std([m['bands'][band] for m in P[p][v]['steps'].values()])
                ax.plot(x, y, marker='o', ms=2.5, color=COLORS[v], ls='-' if v in CORE else '--',
                        label=NAMES[v])
                ax.plot(x[-1:], y[-1:], marker='*', ms=9, color=COLORS[v])
            ax.invert_xaxis()  # training goes from left to right
            ax.set_xlabel(f'CE at positions {inside(p)} '
                          '(in distribution; training goes left to right)')
            ax.set_ylabel(f'CE at {band}')
            ax.set_title(f'{p}: every checkpoint (seed means; star: final)', fontsize=9)
        row[0].legend(fontsize=6)
    save(fig, 'frontier.png')

attending = [p for p in lm_parts if 'entropy_curve' in final(P[p][PARTS[p][2][0]])]  # transformers
# the mechanism: attention entropy by query position (final), and beyond 1x across training
if attending:
    L = len(final(P[attending[0]][PARTS[attending[0]][2][0]])['entropy_curve'])  # layers
    fig, axes = plt.subplots(len(attending), L + 1, figsize=(3.2 * (L + 1), 3.2 * len(attending)),
                             squeeze=False)
    for row, p in zip(axes, attending):
        vs = [v for v in ('wd', 'no_wd', 'pn_d', 'pl_d', 'vpad') if v in P[p]]
        for layer, ax in enumerate(row[:-1]):
            for v in vs:
                curve = final(P[p][v])['entropy_curve'][layer]
                n = len(curve['mean'])
                band_plot(ax, torch.arange(1, n + 1) / 8, curve, v)
            T = int(P[p][vs[0]]['train_length']['mean'])
            t = torch.arange(1, n + 1) * T / 8
            ax.plot(t / T, torch.log(t), color='gray', ls='--', lw=1, label='uniform, log t')
            ax.axvline(1, color='k', ls=':', lw=1)
            ax.set_xscale('log', base=2)
            ax.set_title(f'{p}, layer {layer}: entropy (final)', fontsize=9)
            ax.set_xlabel('query position / training length')
        row[0].set_ylabel('attention entropy (nats), mean of heads')
        row[0].legend(fontsize=6)
        ax = row[-1]
        for v in vs:
            steps = list(P[p][v]['steps'])
            m = [P[p][v]['steps'][s]['entropy_bands'] for s in steps]  # per step, per layer
            rise = [stats([mean(layer['8-16x']['seeds'][i] - layer['in']['seeds'][i] for layer in e)
                           for i in range(len(seeds))]) for e in m]
            band_plot(ax, [int(s) for s in steps], rise, v)
        ax.set_xlabel('training step')
        ax.set_ylabel('entropy 8-16x minus 64-128 (nats)')
        ax.set_title(f'{p}: across training, mean of layers', fontsize=9)
    save(fig, 'entropy.png')

probed = [p for p in lm_parts if 'probe' in P[p].get('pl_d', {})]
if probed:
    fig, axes = plt.subplots(1, len(probed), figsize=(5 * len(probed), 3.6), squeeze=False)
    for ax, p in zip(axes[0], probed):
        vs = [v for v in P[p] if 'probe' in P[p][v]]
        for i, v in enumerate(vs):
            m, s = mean_std(P[p][v]['probe']['rel_err'])
            ax.bar(torch.arange(len(m)) + (i - (len(vs) - 1) / 2) * 0.8 / len(vs), m, yerr=s,
                   width=0.8 / len(vs), capsize=2, color=COLORS[v], label=NAMES[v])
        ax.set_xticks(range(len(m)))
        r = ', '.join(f"{x['mean']:.2f}" for x in P[p]['pl_d']['probe']['r'])
        ax.set_xlabel(f'layer (PL-D r by layer: {r})')
        ax.set_ylabel('mean |Var[y train] - Var[y eval]| / Var[y eval]')
        ax.set_title(f'{p}: pre-activation variance mismatch', fontsize=9)
        ax.legend(fontsize=6)
    save(fig, 'probe.png')

method_parts = [p for p in parts if any(m in P[p] for m in METHODS)]
# each method alone and with PL-D (docs/methods.md), at the final checkpoint; dots: the seeds
if method_parts:
    fig, axes = plt.subplots(len(method_parts), 2, figsize=(12, 3.8 * len(method_parts)),
                             squeeze=False)
    for row, p in zip(axes, method_parts):
        groups = [('RoPE', 'no_wd', 'pl_d'),
                  *((NAMES[m], m, f'{m}_pl_d') for m in METHODS if m in P[p]),
                  *((NAMES[v], v, None) for v in P[p] if v not in ('no_wd', 'pl_d', *METHOD_ROWS))]
        if PARTS[p][0] == 'lm':
            panels = ((lambda r: r['bands']['1-2x'], 'CE at 1-2x'),
                      (lambda r: r['bands']['8-16x'], 'CE at 8-16x'))
        else:
            panels = ((lambda r: r['beyond'], 'exact match beyond 1x'),
                      (lambda r: r['token_beyond'], 'right tokens beyond 1x'))
        for ax, (get, label) in zip(row, panels):
            for i, (name, alone, with_pl_d) in enumerate(groups):
                for j, v in ((j, v) for j, v in enumerate((alone, with_pl_d)) if v in P[p]):
                    x, st = i + (j - 0.5) * 0.4, get(final(P[p][v]))
                    ax.bar(x, st['mean'], yerr=st['std'], width=0.4, capsize=2,
                           color=('tab:blue', 'tab:orange')[j],
                           label=('alone (no WD)', 'with PL-D')[j] if i == 0 else None)
                    ax.plot([x] * len(st['seeds']), st['seeds'], 'k.', ms=3)
            ax.set_xticks(range(len(groups)), [g[0] for g in groups], rotation=30, fontsize=8)
            ax.set_ylabel(f'{label} (final)')
            ax.set_ylim(*(ax.get_ylim() if PARTS[p][0] == 'lm' else (0, 1.02)))
            ax.set_title(f'{p}: each method alone and with PL-D', fontsize=9)
        row[0].legend(fontsize=7)
    save(fig, 'methods.png')

# the tasks: accuracy by length at the end, and beyond 1x across training; exact, and per token
if task_parts:
    fig, axes = plt.subplots(len(task_parts), 4, figsize=(18, 3.6 * len(task_parts)), squeeze=False)
    for row, p in zip(axes, task_parts):
        for v in P[p]:
            steps = list(P[p][v]['steps'])
            for col, (by_length, beyond) in enumerate((('accuracy', 'beyond'),
                                                       ('token_accuracy', 'token_beyond'))):
                acc = final(P[p][v])[by_length]
                band_plot(row[col], [int(L) for L in acc], list(acc.values()), v, marker='o', ms=3)
                if v in PHASE1_ROWS:  # measured along phase 1: its end, as a level for CPT to beat
                    row[col + 2].axhline(final(P[p][v])[beyond]['mean'], color=COLORS[v], ls=':')
                else:
                    band_plot(row[col + 2], [after(p, v) + int(s) for s in steps],
                              [P[p][v]['steps'][s][beyond] for s in steps], v)
        for col, what in enumerate(('exact-match accuracy', 'fraction of right tokens')):
            row[col].axvline(P[p][PARTS[p][2][0]]['train_length']['mean'], color='k', ls=':', lw=1)
            row[col].set_xscale('log', base=2)
            row[col].set_xlabel('length (dotted: the longest trained)')
            row[col].set_ylabel(f'{what} (final)')
            row[col + 2].set_xlabel('step of CPT (dotted: the end of phase 1)' if p in PHASE1
                                    else 'training step')
            row[col + 2].set_ylabel(f'{what} beyond 1x')
        for ax in row:
            ax.set_ylim(-0.05, 1.05)
            ax.set_title(p, fontsize=9)
        row[0].legend(fontsize=6)
    save(fig, 'tasks.png')
niah_parts = [p for p in parts if p in NIAH_PARTS]
if niah_parts:  # NIAH-1 by length at the end, and the reading rules' measure along CPT
    fig, axes = plt.subplots(len(niah_parts), 2, figsize=(10, 3.6 * len(niah_parts)), squeeze=False)
    for row, p in zip(axes, niah_parts):
        key, what = RULES[p][0], measures(p)[-1][0]  # the reading rules' measure and its name
        for v in P[p]:
            acc = final(P[p][v])['niah']
            style = dict(marker='o', ms=3, ls='-' if v in (*CORE, *PHASE1_ROWS) else '--')
            band_plot(row[0], [int(L) for L in acc], list(acc.values()), v, **style)
            if v in PHASE1_ROWS:  # measured along phase 1: its end, as a level for CPT to beat
                row[1].axhline(final(P[p][v])[key]['mean'], color=COLORS[v], ls=':')
            else:
                steps = [s for s in P[p][v]['steps'] if key in P[p][v]['steps'][s]]
                band_plot(row[1], [int(s) for s in steps],
                          [P[p][v]['steps'][s][key] for s in steps], v, **style)
        row[0].axvline(P[p]['orig']['train_length']['mean'], color='k', ls=':', lw=1)
        row[0].set_xscale('log', base=2)
        row[0].set_xlabel('prompt length, tokens (dotted: the training length)')
        row[0].set_ylabel('NIAH-1 accuracy (final)')
        row[1].set_xlabel('step of CPT (dotted: the end of phase 1)')
        row[1].set_ylabel(what)
        for ax in row:
            ax.set_ylim(-0.05, 1.05)
            ax.set_title(p, fontsize=9)
        row[0].legend(fontsize=6)
    save(fig, 'niah.png')
print(f"wrote {out}/summary.md and the figures")
