"""
The GPU self-check: first correctness, then speed and memory, one line each with PASS, FAIL or SKIP
and its figure against a stated bound; a part that fails or crashes never stops the others.

    python -m tools.gpu_check --quick=True     # on a GPU, first: the checks that matter most,
                                               # about 5-8 minutes
    python -m tools.gpu_check                  # everything, about 10-15 minutes on one H100/H200
    python -m tools.gpu_check --dry_run=True   # tiny sizes on CPU, every part through the paths
                                               # CPU has (tests)
    python -m tools.gpu_check --quick=True --only="['compiled', 'masks', 'bf16']"  # a few parts

Both write gpu_check/results.json and results.md. It installs nothing. The fused Mamba2 kernels are
checked only when they import (pip install mamba-ssm causal-conv1d --no-build-isolation); otherwise
that part says SKIP.

The quick run: (a) attention.attention on each backend against float64 at query offsets 0 / 8K /
64K, fp32 and bf16, softmax and entmax, and attention_triton's kernels with their gradients; (b) the
compiled training step of configs/scratch.py's model (4 layers) against eager with fixed masks,
none, PL-D and VPAD (tools/masks.py), and VPAD with its drawn masks, reordering passes on and off;
(c) the dropout masks of PL-D and VPAD where they are used, compiled, with and without activation
checkpointing: forward against backward, keep rates, kept scales, correlations; (d) dropout's mean
under bf16 (E[D(x)] = x), eager, compiled, and attention dropout causal, windowed and with NAPE; (e)
tokens/s, MFU and peak memory of none, PL-D and VPAD beside nanoGPT's model at the same size; (f) a
step of configs/asentmax_wd.py (fused; beside softmax and its written-out path): 25% MFU, its peak
memory against the estimate; attention dropout with NAPE, fused, beside none and SDPA: 1.3x the time
of none; (g) a 64K chunked prefill and 32 decoded tokens: recompiles, host syncs per token, the peak
memory against hardware.py's estimate, then the steady state against the hardware's bounds. The
first line says which torch runs it against requirements.txt's pin.
The whole run adds: the compiled step of every variant; the masks of PN-D and Mamba2's PL-D; the
mamba_ssm kernels against the PyTorch scan; 20 bf16 training steps against fp32 (NAPE and
ASEntmax); FSDP2 + compile + activation checkpointing + flex, as configs/smollm3_cpt.py composes
them, against eager; the speed of every regularizer (the goal: PL-D and VPAD within 1.05x of
none), Mamba2-85M; prefill and decoding at 8K / 32K / 64K.
"""

import functools
import json
import os
import sys
import time
import traceback

import torch
import torch._dynamo.utils
import torch.distributed as dist

from tools import masks, timing
import checkpoint
import dropout as dropout_py
import hardware
import mamba
from ops import attention as attention_py
import model as model_py
from configurator import configure

# -----------------------------------------------------------------------------
dry_run = False  # tiny sizes on CPU: checks that every part runs, its figures mean nothing
# only the checks that matter most (the docstring's a-e): about 5 minutes on one H100/H200
quick = False
# only the checks whose names contain one of these, e.g. "['compiled', 'masks', 'bf16']" (the
# correctness of dropout first, on a short lease of a GPU); [] all
only: list = []
out = 'gpu_check'  # results.json and results.md go here
# -----------------------------------------------------------------------------
globals().update(configure(globals(), sys.argv[1:]))


def is_results(path):
    """Whether path is an earlier self-check's results.json (its results.md goes with it)."""
    try:
        with open(path) as f:
            return {'device', 'torch', 'results'} <= json.load(f).keys()
    except (OSError, ValueError, AttributeError):
        return False


# out: a folder of its own (never a run's), whose earlier results are replaced; checked first
results_json = os.path.join(out, 'results.json')
checkpoint.check_output(out, True, os.path.isdir, 'tools/gpu_check.py')
checkpoint.check_output(results_json, True, is_results, 'tools/gpu_check.py')
checkpoint.check_output(os.path.join(out, 'results.md'), True, lambda p: is_results(results_json),
                        'tools/gpu_check.py')
# the torch that runs the checks, against the one requirements.txt pins (GPU images often lag it)
with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       'requirements.txt')) as f:
    pin = next((line.split('==')[1].split()[0] for line in f if line.startswith('torch==')), '?')
version = f"torch {torch.__version__} (requirements.txt pins {pin})"
print(version, flush=True)
device = 'cpu' if dry_run else 'cuda'
if not dry_run and not torch.cuda.is_available():
    raise SystemExit("no CUDA device: run this on a GPU, or --dry_run=True to check the script "
                     "on CPU")
# dry run: dynamo's graphs as on the GPU, without Inductor's compile time
backend = 'aot_eager' if dry_run else 'inductor'
counters = torch._dynamo.utils.counters
# prefill and decoding: dynamo's graphs for flex and its block mask (its recompile limit: 8 each)
MAX_GRAPHS = 8
# a measured peak must lie within this factor of hardware.py's estimate, either way
MEMORY_RATIO = 1.2


def config(name, **dry):
    """A paper config's model keys (configs/<name>.py), or tiny sizes in a dry run."""
    scope = {}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's
    exec(open(os.path.join(root, 'configs', name)).read(), scope)
    kind = scope.get('model_type', 'transformer')
    keys = {f for f in checkpoint.model_class(kind)[1].__dataclass_fields__}
    args = {k: v for k, v in scope.items() if k in keys}
    args['vocab_size'] = 50304
    T, B = scope['block_size'], scope['batch_size']
    if dry_run:
        args.update(n_layer=2, n_embd=64, vocab_size=256,
                    **({'n_head': 4, 'ffn_dim': 256} if kind == 'transformer' else
                       {'d_state': 16, 'headdim': 16, 'chunk_size': 16}), **dry)
        T, B = 64, 2
    return kind, args, T, B


def cpu_flex(kind, args):
    """In a dry run, attention through flex where CUDA's 'auto' would take it and CPU can run it
    (softmax, no attention dropout), so that the dry run walks flex's code paths, not SDPA's.
    CPU's flex has a forward only: such a model is checked without gradients."""
    if (dry_run and kind == 'transformer' and not args.get('attn_dropout')
            and args.get('attn_alpha', 1.0) == 1.0):
        return {**args, 'attn_backend': 'flex'}
    return args


SCRATCH, MAMBA, ASENTMAX = config('scratch.py'), config('mamba2_85m.py'), config('asentmax_wd.py')
# every type of dropout.py (the paper's by their names), and attention dropout
NAMES = {'none': 'none', 'pre_norm': 'PN-D', 'pre_linear': 'PL-D', 'vpad': 'VPAD'}
VARIANTS = {**{NAMES.get(t, t): dict(dropout_type=t, dropout=0.1) if t != 'none' else {}
               for t in dropout_py.DROPOUT_TYPES},
            'attention dropout': dict(attn_dropout=0.1)}
results = []


def check(name, in_quick=False):
    """Run one part now (unless --quick and the part is not in_quick); its function returns (status,
    figure) or a list of them (name, status, figure). Statuses: PASS, FAIL, SKIP (a piece missing),
    INFO (a figure with no pass mark: timings, and what a dry run cannot measure), ERROR (it
    crashed)."""
    def wrap(fn):
        if (quick and not in_quick) or (only and not any(o in name for o in only)):
            return fn
        t0 = time.perf_counter()
        try:
            r = fn()
        except Exception as e:  # report it and go on with the next part
            r = ('ERROR', f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
            traceback.print_exc()
        for part, status, figure in (r if isinstance(r, list) else [(name, *r)]):
            results.append({'check': part, 'status': status, 'figure': figure})
            print(f"{status:<5} {part}: {figure}", flush=True)
        print(f"      ({time.perf_counter() - t0:.0f} s)", flush=True)
        if device == 'cuda':
            torch.cuda.empty_cache()
    return wrap


def batch(vocab, B, T, seed):
    g = torch.Generator().manual_seed(seed)
    return [t.to(device) for t in torch.randint(0, vocab, (2, B, T), generator=g)]


def build(kind, args, **kw):
    return timing.build(kind, {**args, **kw}, device)


def goal(ok):
    # CPU timings and memory of tiny models say nothing
    return 'INFO' if dry_run else ('PASS' if ok else 'FAIL')


def within(peak, estimate):
    return peak is not None and 1 / MEMORY_RATIO <= peak / estimate <= MEMORY_RATIO


# -----------------------------------------------------------------------------
# correctness

@check('attention vs float64', in_quick=True)
def _():
    """Every kernel attention() can choose, on causal, NAPE, windowed and NAPE + windowed
    attention."""
    rows, H, hd, window = (16, 4, 16, 64) if dry_run else (128, 12, 64, 2048)
    offsets = (0, 512, 2048) if dry_run else (0, 8192, 65536)
    slopes = model_py.alibi_slopes(H, 'nape').to(device)
    cases = {'causal': (None, 0), 'NAPE': (slopes, 0), 'window': (None, window),
             'NAPE + window': (slopes, window)}
    lines = []
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        # the compiled flex: 6 graphs per dtype (3 cases, then dynamic lengths); the limit is 8
        torch._dynamo.reset()
        for offset in offsets:
            g = torch.Generator(device).manual_seed(offset)
            q, k, v = (torch.randn(1, H, rows if i == 0 else offset + rows, hd, generator=g,
                                   device=device).to(dtype)
                       for i in range(3))
            pos = torch.arange(offset + rows, device=device).double()
            distance = pos[offset:, None] - pos  # (rows, Tk): query i sits at offset + i
            scores = q.double() @ k.double().transpose(-2, -1) / hd ** 0.5  # (1, H, rows, Tk)
            for alpha, normaliser in ((1.0, 'softmax'), (1.5, 'entmax')):
                errs = {}
                for case, (m, w) in cases.items():
                    s = scores if m is None else scores - m.double()[:, None, None] * distance
                    s = s.masked_fill(~((distance >= 0) & (distance < w) if w else distance >= 0),
                                      float('-inf'))
                    # the float64 reference: entmax by bisection, not the sort that attention.py
                    # computes it with
                    p = (s.softmax(-1) if alpha == 1.0
                         else attention_py.entmax_bisect(s, alpha, n_iter=60))
                    ref = p @ v.double()
                    # flex where 'auto' takes it, for a bias or a window (a plain causal layer
                    # goes to SDPA's)
                    flex = ('flex',) if m is not None or w else ()
                    # entmax: written out, and fused ('auto': attention_triton on CUDA)
                    for b in ('sdpa', 'manual', *flex) if alpha == 1.0 else ('manual', 'auto'):
                        kernel = attention_py.attention_kernel(b, q, k, offset, 0, m, w, 0.0, alpha)
                        y = attention_py.attention(q, k, v, q_start=offset, slopes=m, window=w,
                                                   backend=b, alpha=alpha)
                        e = ((y.double() - ref).abs().max() / ref.abs().max()).item()
                        if e >= errs.get(kernel, (-1.0,))[0]:
                            errs[kernel] = (e, case)
                worst = max(e for e, _ in errs.values())
                figure = ', '.join(f"{kn} {e:.1e} ({case})" for kn, (e, case) in errs.items())
                lines.append((f"attention vs float64, {normaliser}, {str(dtype)[6:]}, "
                              f"offset {offset}",
                              'PASS' if worst < tol else 'FAIL', f"{figure} (bound {tol:.0e})"))
    return lines


@check('fused attention gradients vs float64', in_quick=True)
def _():
    """attention_triton's kernels (entmax-1.5, and softmax as attention dropout uses it) on NAPE
    and NAPE + window at query offsets 0 / 8K / 64K: the output and the gradients of q, k and v
    against the written-out path in float64. A dry run: the interpreter, one offset, float32."""
    if device == 'cpu' and os.environ.get('TRITON_INTERPRET') != '1':  # read at triton's import
        return 'SKIP', 'on a CPU the kernels run only with TRITON_INTERPRET=1 set (tests set it)'
    try:
        from ops.attention_triton import fused_attention
    except ImportError:
        return 'SKIP', 'triton not importable here'
    rows, H, hd, window = (16, 4, 16, 8) if dry_run else (128, 12, 64, 2048)
    offsets, dtypes = ((24,), (torch.float32,)) if dry_run else \
        ((0, 8192, 65536), (torch.float32, torch.bfloat16))
    slopes = model_py.alibi_slopes(H, 'nape').to(device)
    lines = []
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        for offset in offsets if dtype in dtypes else ():
            g = torch.Generator(device).manual_seed(offset)
            q, k, v, dy = (torch.randn(1, H, offset + rows if i in (1, 2) else rows, hd,
                                       generator=g, device=device, dtype=torch.float64)
                           for i in range(4))
            for alpha, normaliser in ((1.0, 'softmax'), (1.5, 'entmax')):
                errs = {}
                for case, w in (('NAPE', 0), ('NAPE + window', window)):
                    ref = [t.clone().requires_grad_() for t in (q, k, v)]
                    y = attention_py.attention(*ref, q_start=offset, slopes=slopes.double(),
                                               window=w, backend='manual', alpha=alpha)
                    (y * dy).sum().backward()
                    got = [t.to(dtype).requires_grad_() for t in (q, k, v)]
                    out = fused_attention(*got, offset, 0, slopes, w, entmax=alpha == 1.5)
                    (out * dy.to(dtype)).sum().backward()
                    for name, a, b in zip(('y', 'dq', 'dk', 'dv'), [out] + [t.grad for t in got],
                                          [y] + [t.grad for t in ref]):
                        e = ((a.double() - b).abs().max() / b.abs().max()).item()
                        if e >= errs.get(name, (-1.0,))[0]:
                            errs[name] = (e, case)
                worst = max(e for e, _ in errs.values())
                lines.append((f"fused attention vs float64, {normaliser}, {str(dtype)[6:]}, "
                              f"offset {offset}", 'PASS' if worst < tol else 'FAIL',
                              ', '.join(f"{n} {e:.1e} ({c})" for n, (e, c) in errs.items())
                              + f" (bound {tol:.0e})"))
    return lines


@check('compiled training step vs eager', in_quick=True)
def _():
    """With fixed masks (tools/masks.py: the same in both, whatever order compiled code draws them
    in) the compiled step must compute what eager computes: PASS or FAIL. VPAD also with its drawn
    masks, Inductor's reordering passes on (as training runs) and off: INFO, equal only where the
    compiled step draws its masks in eager's order, which no correctness needs (the dropout masks
    check tests the compiled masks themselves). 4 layers: what is checked is the graph, whose
    blocks repeat, and a short context keeps it quick."""
    kind, args, T, B = SCRATCH
    args, T, B = {**args, 'n_layer': min(args['n_layer'], 4)}, min(T, 256), 2
    cases = {**{n: (kind, {**args, **kw}) for n, kw in VARIANTS.items()},
             **{f'VPAD {v}': (kind, {**args, 'dropout_type': 'vpad', 'dropout': 0.1,
                                     'vpad_variant': v})
                for v in 'BCD'},
             'ASEntmax': (ASENTMAX[0], {**ASENTMAX[1], 'n_layer': min(ASENTMAX[1]['n_layer'], 4)}),
             'SWA': (kind, {**args, 'pos_encoding': ['rope', 'nope'], 'window': [64, 0]}),
             'Mamba2': (MAMBA[0], {**MAMBA[1], 'dropout_type': 'pre_linear', 'dropout': 0.1})}
    if quick:
        cases = {k: cases[k] for k in ('none', 'PL-D', 'VPAD')}
    elif dry_run:  # one case per code path (flex, SDPA with dropout, entmax, the scan): on CPU,
        # tests/test_compile.py compiles every variant, gradients included
        cases = {k: cases[k] for k in ('VPAD', 'attention dropout', 'ASEntmax', 'Mamba2')}
    drawn = {'drawn masks': ('drawn', {}), 'drawn masks, reordering off': (
        'drawn', dict(reorder_for_peak_memory=False, reorder_for_locality=False))}
    lines = []
    for name, (k, a) in cases.items():
        a = cpu_flex(k, a)
        backward = not (dry_run and a.get('attn_backend') == 'flex')  # CPU's flex has no backward
        runs = {'fixed masks': ('fixed', {}), **(drawn if name == 'VPAD' else {})}
        for how, (mask_kind, inductor) in runs.items():
            missing = [key for key in inductor if not hasattr(torch._inductor.config, key)]
            if missing:  # an older torch
                lines.append((f"compiled vs eager, {name}, {how}", 'SKIP',
                              f"this torch has no Inductor setting {', '.join(missing)}"))
                continue
            (worst, where), graphs, breaks = masks.compiled_vs_eager(
                lambda: build(k, a), lambda i: batch(a['vocab_size'], B, T, i), backend,
                mask_kind, backward=backward, inductor=inductor)
            # the mamba_ssm kernels run outside the graph (torch.compiler.disable): a break each,
            # by design
            kernels_outside = (k == 'mamba2' and device == 'cuda'
                               and mamba.mamba_chunk_scan_combined is not None)
            ok = worst < 1e-4 and (kernels_outside or (graphs == 1 and breaks == 0))
            status = ('PASS' if ok else 'FAIL') if how == 'fixed masks' else 'INFO'
            lines.append((f"compiled vs eager, {name}, {how}", status,
                          f"max relative difference {worst:.1e} (bound 1e-4, in {where}), "
                          f"{graphs} graph(s), {breaks} graph break(s)"
                          + ('' if backward else '; forward only (flex has no backward on CPU)')))
    return lines


@check('dropout masks where they are used', in_quick=True)
def _():
    """tools/masks.site_masks: at every site of a training step, compiled as training compiles it
    (Inductor's own random numbers), with and without activation checkpointing, the mask the
    backward uses is the forward's, each keep rate and kept scale is right, and no two sites'
    masks correlate (pytorch #198333's 4-wide path gave 4 neighbours one mask, and the recompute
    another). 2 layers: the sites repeat in every block."""
    kind, args, T, B = SCRATCH
    args, T, B = {**args, 'n_layer': 2}, min(T, 256), 2
    SIDE_EFFECTS = 'skip_fwd_side_effects_in_bwd_under_checkpoint'
    cases = {n: (kind, {**args, **VARIANTS[n]}) for n in ('PL-D', 'VPAD')}
    if not quick:
        cases.update({'PN-D': (kind, {**args, **VARIANTS['PN-D']}),
                      'Mamba2 PL-D': (MAMBA[0], {**MAMBA[1], 'n_layer': 2,
                                                 **VARIANTS['PL-D']})})
    lines = []
    for name, (k, a) in cases.items():
        x, y = batch(a['vocab_size'], B, T, 0)
        for recompute in (False, True):
            line = (f"dropout masks, {name}, compiled"
                    + (', activation checkpointing' if recompute else ''))
            if recompute and not hasattr(torch._dynamo.config, SIDE_EFFECTS):  # an older torch
                lines.append((line, 'SKIP', f"this torch's dynamo has no {SIDE_EFFECTS}, which "
                              f"the probe needs under activation checkpointing"))
                continue
            torch.manual_seed(0)
            sites, breaks = masks.site_masks(build(k, a).train(), x, y, backend, recompute)
            ok, _, figure = masks.judge(sites)
            lines.append((line, 'PASS' if ok and breaks == 0 else 'FAIL',
                          f"{figure}; {breaks} graph break(s) (bound 0)"))
    return lines


@check('activation checkpointing replays the masks')
def _():
    """PL-D and VPAD draw a mask per projection input; under train.py's activation checkpointing
    the backward recomputes each block, and must draw the forward's masks again: the compiled step's
    gradients with it equal those without (tests/test_dropout.py checks the eager step on CPU; a dry
    run checks eager too)."""
    kind, args, T, B = SCRATCH
    T, B = min(T, 256), 2
    lines = []
    for name in ('PL-D', 'VPAD'):
        a, seen = {**args, **VARIANTS[name]}, []
        for recompute in (False, True):
            torch._dynamo.reset()
            torch.manual_seed(0)
            m = build(kind, a).train()
            if recompute:
                for block in m.layers:
                    block.forward = functools.partial(torch.utils.checkpoint.checkpoint,
                                                      block.forward, use_reentrant=False)
            x, y = batch(a['vocab_size'], B, T, 0)
            torch.manual_seed(1)
            loss = (m if dry_run else torch.compile(m, backend=backend))(x, y)[1]
            loss.backward()
            seen.append((loss, m))
        (ref, plain), (loss, again) = seen
        worst = masks.relative_difference(loss.item(), ref, [p.grad for p in again.parameters()],
                                          plain)[0]
        lines.append((f"activation checkpointing, {name}", 'PASS' if worst < 1e-4 else 'FAIL',
                      f"max relative difference of loss and gradients {worst:.1e} (bound 1e-4)"))
    torch._dynamo.reset()
    return lines


@check('dropout under bf16: E[D(x)] = x', in_quick=True)
def _():
    """Inverted dropout (PN-D, PL-D) eager and compiled, and attention dropout (causal, windowed,
    NAPE), on bf16 inputs as autocast hands them on: the mean of D(x) within 5 standard errors of
    the mean of x (a 1/(1-p) rounded to bf16, 1.109375, would be off by 1.6e-3; FlashAttention-2's
    8-bit keep test uncorrected by 1.7e-3), the kept units scaled by 1/(1-p) to 1e-4."""
    p, n = 0.1, (2048 if dry_run else 4096)
    g = torch.Generator(device).manual_seed(0)
    x = (torch.rand(n, n, generator=g, device=device) + 0.5).bfloat16()
    # the mean's standard error: each unit m x / (1-p) has variance p/(1-p) x^2 about x
    se = (p / (1 - p) * x.double().pow(2).sum()).sqrt().item() / x.double().sum().item()
    lines = []
    ops = {'inverted dropout, eager': functools.partial(dropout_py.dropout, p=p),
           'inverted dropout, compiled': torch.compile(functools.partial(dropout_py.dropout, p=p),
                                                       backend=backend)}
    for name, op in ops.items():
        with torch.autocast(device, torch.bfloat16):
            y = op(x)
        mean = (y.double().sum() / x.double().sum()).item()
        scale = (y.double().sum() / x[y != 0].double().sum()).item() * (1 - p)
        ok = y.dtype == torch.bfloat16 and abs(mean - 1) < 5 * se and abs(scale - 1) < 1e-4
        lines.append((f"dropout under bf16, {name}", 'PASS' if ok else 'FAIL',
                      f"E[D(x)]/x - 1 = {mean - 1:+.1e} (bound {5 * se:.0e}), "
                      f"kept scale x (1-p) - 1 = {scale - 1:+.1e} (bound 1e-4)"))
    # attention dropout, through attention() as the model calls it: q = 0, so that the output is
    # the kept values' weighted mean, scaled; v = 1. Causal alone takes FlashAttention-2's kernel
    # (attention.flash_dropout), a window or NAPE's bias attention_triton's (SDPA on CPU)
    H, T, W = (4, 256, 64) if dry_run else (16, 2048, 512)
    q = torch.zeros(1, H, T, 64, device=device, dtype=torch.bfloat16)
    v = torch.ones_like(q)
    slopes = model_py.alibi_slopes(H, 'nape').to(device)
    for case, (m, w) in {'causal': (None, 0), 'window': (None, W), 'NAPE': (slopes, 0)}.items():
        y = attention_py.attention(q, q, v, slopes=m, window=w, dropout_p=p,
                                   backend='auto')[..., 0].double()
        # row i's variance: p/(1-p) sum_j P_ij^2, with the probabilities P in float64
        allowed, bias = attention_py.mask_and_bias(0, T, 0, T, m, w, device)
        scores = (torch.zeros(H, T, T, device=device) if bias is None else bias).double()
        P = scores.masked_fill(~allowed, float('-inf')).softmax(-1)  # (H, T, T)
        se = (p / (1 - p) * P.pow(2).sum()).sqrt().item() / (H * T)
        mean = y.mean().item()
        kernel = attention_py.attention_kernel('auto', q, q, 0, 0, m, w, p, 1.0)
        lines.append((f"dropout under bf16, attention dropout, {case}",
                      'PASS' if abs(mean - 1) < 5 * se else 'FAIL',
                      f"E[output]/v - 1 = {mean - 1:+.1e} (bound {5 * se:.0e}; kernel {kernel})"))
    return lines


@check('mamba_ssm kernels vs the PyTorch scan')
def _():
    if device != 'cuda' or mamba.mamba_chunk_scan_combined is None:
        return 'SKIP', ("mamba_ssm not importable here "
                        "(pip install mamba-ssm causal-conv1d --no-build-isolation)")
    kind, args, T, B = MAMBA
    fused, plain = build(kind, args), build(kind, args, use_kernels=False)
    plain.load_state_dict(fused.state_dict())
    x, y = batch(args['vocab_size'], 2, T, 0)
    figures = {}
    for m in (fused, plain):
        m.zero_grad()
        logits, loss = m(x, y)
        loss.backward()
        figures[m is fused] = (logits.detach(), [p.grad for p in m.parameters()],
                               m.eval().position_losses(x, y, chunk_size=T // 4))
        m.train()
    (lf, gf, pf), (lp, gp, pp) = figures[True], figures[False]
    dl = ((lf - lp).abs().max() / lp.abs().max()).item()
    dg = max(((a - b).abs().max() / b.abs().max().clamp(min=1e-12)).item() for a, b in zip(gf, gp))
    dp = (pf - pp).abs().max().item()
    return 'PASS' if dl < 1e-3 and dg < 1e-2 and dp < 1e-3 else 'FAIL', \
        f"logits {dl:.1e}, gradients {dg:.1e} (relative), chunked prefill losses {dp:.1e} nats"


@check('20 bf16 training steps vs fp32')
def _():
    lines = []
    for name, (kind, args, T, B) in (('NAPE', SCRATCH), ('ASEntmax', ASENTMAX)):
        T, B = min(T, 512), 4
        losses = {}
        for bf16 in (False, True):
            m = build(kind, args)
            opt = torch.optim.AdamW(m.parameters(), lr=3e-4)
            losses[bf16] = []
            for i in range(20):
                x, y = batch(args['vocab_size'], B, T, i)
                with torch.autocast(device, torch.bfloat16, enabled=bf16):
                    loss = m(x, y)[1]
                loss.backward()
                opt.step(), opt.zero_grad(set_to_none=True)
                losses[bf16].append(loss.item())
        gap = max(abs(a - b) for a, b in zip(losses[True], losses[False]))
        lines.append((f"20 bf16 training steps vs fp32, {name}", 'PASS' if gap < 0.05 else 'FAIL',
                      f"largest loss gap {gap:.3f} nats "
                      f"(bound 0.05; fp32 {losses[False][0]:.3f} -> {losses[False][-1]:.3f})"))
    return lines


@check('FSDP2 + compile + activation checkpointing + flex vs eager')
def _():
    """configs/smollm3_cpt.py's composition in small: SmolLM3's layer pattern (RoPE, RoPE, RoPE
    windowed; NoPE global), GQA, blocks recomputed in the backward, FSDP2 over one process,
    compiled; float32, no dropout: the same loss and gradients as the plain eager model, and no
    recompile."""
    T, W = (64, 16) if dry_run else (2048, 512)
    size = dict(vocab_size=256, n_head=4, n_kv_head=2, n_embd=64, ffn_dim=128) if dry_run else \
        dict(vocab_size=50304, n_head=16, n_kv_head=4, n_embd=1024, ffn_dim=2816)
    a = dict(**size, n_layer=4, mlp='swiglu', pos_encoding=['rope', 'rope', 'rope', 'nope'],
             window=[W, W, W, 0])
    if not dist.is_initialized():
        dist.init_process_group('nccl' if device == 'cuda' else 'gloo', store=dist.HashStore(),
                                rank=0, world_size=1)
    try:
        m = build('transformer', a).train()
        ref = build('transformer', a).train()
        for block in m.layers:  # as train.py does: the backward recomputes each block
            block.forward = functools.partial(torch.utils.checkpoint.checkpoint, block.forward,
                                              use_reentrant=False)
        hardware.shard(m, device, bf16=False)
        torch._dynamo.reset()
        counters.clear()
        step = torch.compile(m, backend=backend)
        seen, graphs = [], []
        for i in range(2):
            x, y = batch(a['vocab_size'], 2, T, i)
            loss = step(x, y)[1]
            loss.backward()
            seen.append((loss.item(), [p.grad.full_tensor() for p in m.parameters()]))
            m.zero_grad(set_to_none=True)
            graphs.append(counters['stats']['unique_graphs'])
        worst = 0.0
        for i, (loss, grads) in enumerate(seen):
            x, y = batch(a['vocab_size'], 2, T, i)
            r = ref(x, y)[1]
            r.backward()
            worst = max(worst, masks.relative_difference(loss, r, grads, ref)[0])
            ref.zero_grad(set_to_none=True)
    finally:
        dist.destroy_process_group()
        torch._dynamo.reset()
    ok = worst < 1e-4 and graphs[1] == graphs[0]
    kernel = 'flex' if device == 'cuda' else 'SDPA (no flex backward on CPU)'
    return 'PASS' if ok else 'FAIL', (
        f"attention through {kernel}: max relative difference {worst:.1e} (bound 1e-4), "
        f"{graphs[0]} graph(s) after the first step, {graphs[1] - graphs[0]} more after the "
        f"second (bound 0)")


# -----------------------------------------------------------------------------
# speed and memory

def speed(models, vocab, T, B, steps=10, rounds=3):
    """-> name: (tokens/s, text with MFU and the peak memory of a step, peak GB), compiled, timed
    side by side."""
    autocast = torch.autocast(device, torch.bfloat16, enabled=device == 'cuda')
    steps, rounds = (2, 1) if dry_run else (steps, rounds)

    def make(m):
        step, opt = (torch.compile(m, backend=backend),
                     torch.optim.AdamW(m.parameters(), lr=1e-4, fused=device == 'cuda'))
        return lambda n: timing.train_steps(step, opt, n, B, T, vocab, device, autocast)
    runs, peaks = {name: make(m) for name, m in models.items()}, {}
    for name, run in runs.items():
        run(2)  # compiles
        if device == 'cuda':
            torch.cuda.reset_peak_memory_stats()
            run(1)
            peaks[name] = torch.cuda.max_memory_allocated() / 2 ** 30
    secs = timing.timed(runs, steps, 1, rounds)
    _, peak = hardware.peak_flops(device)
    figures = {}
    for name, m in models.items():
        tps = steps * B * T / secs[name]
        mfu = f", MFU {100 * m.flops_per_token(T) * tps / peak:.1f}%" if peak else ''
        figures[name] = (tps,
                         f"{tps:,.0f} tokens/s{mfu}"
                         + (f", peak {peaks[name]:.1f} GB" if name in peaks else ''),
                         peaks.get(name))
    return figures


@check('regularizers: tokens/s, MFU, memory', in_quick=True)
def _():
    """The scratch config's model with each regularizer beside nanoGPT's model at the same size,
    compiled, bf16, timed side by side. The goal (PL-D and VPAD within 1.05x of none) is judged by
    the whole run; the quick one times none, PL-D and VPAD in fewer rounds, and says INFO."""
    kind, args, T, B = SCRATCH
    names = ('none', 'PL-D', 'VPAD') if quick else tuple(VARIANTS)
    torch.manual_seed(0)
    models = {'nanoGPT': timing.NanoGPT(args['vocab_size'], T, args['n_layer'], args['n_head'],
                                        args['n_embd']).to(device),
              **{n: build(kind, args, **VARIANTS[n]) for n in names}}
    steps, rounds = (5, 2) if quick else (10, 3)
    figs = speed(models, args['vocab_size'], T, B if dry_run else 8, steps, rounds)
    base = figs['none'][0]
    return [(f"speed, NAPE {args['n_layer']}L/{args['n_embd']} at {T}, {n}",
             goal(base / tps <= 1.05) if n in ('PL-D', 'VPAD') and not quick else 'INFO',
             f"{fig}, {base / tps:.2f}x the time of none")
            for n, (tps, fig, _) in figs.items()]


@check('Mamba2-85M')
def _():
    kind, args, T, B = MAMBA
    fig = speed({'Mamba2': build(kind, args)}, args['vocab_size'], T,
                B if dry_run else 16)['Mamba2'][1]
    return 'INFO', f"at {T}: {fig}"


@check('ASEntmax at its micro-batch', in_quick=True)
def _():
    """configs/asentmax_wd.py's step beside the softmax model of the same size and its own
    written-out entmax (attn_backend='manual', the path before attention_triton), timed side by
    side: the fused kernel at 25% MFU or more, its peak memory as hardware.py estimates it."""
    kind, args, T, B = ASENTMAX
    models = {'fused': build(kind, args)}
    if not dry_run:
        models = {'softmax': build(kind, args, attn_alpha=1.0, attn_scale='none'), **models,
                  'written out': build(kind, args, attn_backend='manual')}
    est = hardware.memory_estimate(models['fused'], B, T, bf16=device == 'cuda',
                                   device_type=device)
    est = sum(est.values()) / 2 ** 30
    steps, rounds = (3, 1) if quick else (5, 2)
    figs = speed(models, args['vocab_size'], T, B, steps, rounds)
    _, peak_flops = hardware.peak_flops(device)
    lines = []
    for name, (tps, fig, peak) in figs.items():
        mfu = models[name].flops_per_token(T) * tps / peak_flops if peak_flops else 0
        ok = goal(mfu >= 0.25 and within(peak, est) and peak < 80) if name == 'fused' else 'INFO'
        bound = (f"; hardware.py's estimate {est:.3g} GB (bound: 25% MFU, the peak within "
                 f"{MEMORY_RATIO}x and under 80 GB)" if name == 'fused' else '')
        lines.append((f"ASEntmax at its micro-batch, {name}", ok,
                      f"batch {B} x {T}: {fig}, {figs['fused'][0] / tps:.2f}x the tokens/s of "
                      f"fused{bound}"))
    return lines


@check('attention dropout with NAPE', in_quick=True)
def _():
    """The scratch model with attention dropout p = 0.1, through attention_triton's kernel
    ('auto') and through SDPA in float32 with the bias as a T x T mask ('sdpa', the path before),
    beside no dropout, timed side by side: the goal is 1.3x the time of none or less."""
    kind, args, T, B = SCRATCH
    models = {'none': build(kind, args),
              'fused': build(kind, args, attn_dropout=0.1)}
    if not dry_run:
        models['SDPA, float32'] = build(kind, args, attn_dropout=0.1, attn_backend='sdpa')
    steps, rounds = (3, 1) if quick else (5, 2)
    figs = speed(models, args['vocab_size'], T, B if dry_run else 8, steps, rounds)
    base = figs['none'][0]
    return [(f"attention dropout with NAPE, {n}",
             goal(base / tps <= 1.3) if n == 'fused' else 'INFO',
             f"{fig}, {base / tps:.2f}x the time of none" + (" (bound 1.3x)" if n == 'fused'
                                                              else ''))
            for n, (tps, fig, _) in figs.items()]


@check('prefill and decoding to 64K', in_quick=True)
def _():
    """Through the KV cache, as eval_loss and eval_niah run: the compiled flex and block mask
    recompile a few times (first shapes, then dynamic ones, then one query row), never past
    dynamo's limit, where flex would fall back to the unfused kernel and build the whole score
    matrix; decoding syncs with the host less than once per layer; the peak is what hardware.py
    says. Then the steady state, compile apart (timing.context_times): prefill within 3x of its
    FLOPs at the GPU's peak, a decoded token within 3x of reading the KV cache at the bandwidth
    a copy measures."""
    kind, args, _, _ = SCRATCH
    args = cpu_flex(kind, args)
    with torch.device('meta'):
        shape = checkpoint.build_model(kind, args)
    lengths = (256, 512) if dry_run else (65536,) if quick else (8192, 32768, 65536)
    gen = 8 if dry_run else 32
    _, peak_flops = hardware.peak_flops(device)
    bandwidth = timing.bandwidth(device) if device == 'cuda' else None
    lines = []
    for L in lengths:
        chunk = L // 4 if dry_run else 4096
        torch._dynamo.reset()  # each length compiles as a fresh evaluation would
        counters.clear()
        if device == 'cuda':
            torch.cuda.reset_peak_memory_stats()
        r = timing.context_times(kind, args, L, gen, chunk, device,
                                 'float32' if dry_run else 'bfloat16')
        graphs, breaks = counters['stats']['unique_graphs'], sum(counters['graph_break'].values())
        est = sum(hardware.inference_estimate(shape, L, chunk, bf16=not dry_run).values()) / 2 ** 30
        ok = graphs <= MAX_GRAPHS and breaks == 0
        figure = f"{graphs} graph(s) (bound {MAX_GRAPHS}), {breaks} break(s); "
        if device == 'cuda':
            peak, syncs = r['peak_mb'] / 1024, r['syncs_per_token']
            ok = ok and within(peak, est) and syncs < args['n_layer']
            figure += f"peak {peak:.2f} GB, hardware.py's estimate {est:.2f} GB " \
                      f"(bound: within {MEMORY_RATIO}x); {syncs:.1f} host syncs per decoded " \
                      f"token (bound: under {args['n_layer']}, one per layer)"
        else:
            figure += f"hardware.py's estimate {est * 1024:.1f} MB; " \
                      f"peak and syncs not measured on CPU"
        lines.append((f"prefill and decoding at {L}", 'PASS' if ok else 'FAIL', figure))
        prefill, decode = r['prefill_s_steady'], r['ms_per_token_steady'] / 1000
        figure = (f"prefill {prefill:.2f} s, {1000 * decode:.2f} ms per decoded token (the first "
                  f"run, compiling: {r['prefill_s_first']:.2f} s, {r['ms_per_token_first']:.1f} "
                  f"ms); ")
        if peak_flops and bandwidth:
            fast_prefill, fast_decode = r['prefill_flops'] / peak_flops, r['kv_bytes'] / bandwidth
            status = goal(prefill <= 3 * fast_prefill and decode <= 3 * fast_decode)
            figure += (f"bounds 3x {fast_prefill:.3f} s ({r['prefill_flops'] / 1e12:.0f} TFLOP at "
                       f"{peak_flops / 1e12:.0f} TFLOP/s) and 3x {1000 * fast_decode:.2f} ms "
                       f"({r['kv_bytes'] / 1e9:.2f} GB of keys and values at "
                       f"{bandwidth / 1e12:.2f} TB/s, a copy's)")
        else:
            status = 'INFO'
            figure += "no bound: no peak FLOP/s or bandwidth measured here"
        lines.append((f"steady state at {L}", status, figure))
    return lines


# -----------------------------------------------------------------------------
name = torch.cuda.get_device_name() if device == 'cuda' else 'CPU (dry run)'
command = ('python -m tools.gpu_check' + (' --quick=True' if quick else '')
           + (f' --only="{only}"' if only else '') + (' --dry_run=True' if dry_run else ''))
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, 'results.json'), 'w') as f:
    json.dump({'device': name, 'torch': torch.__version__, 'torch_pin': pin, 'dry_run': dry_run,
               'quick': quick, 'results': results}, f, indent=1)
with open(os.path.join(out, 'results.md'), 'w') as f:
    f.write(f"GPU self-check on {name}, {version}: `{command}`\n\n")
    f.write("| check | status | figure |\n|---|---|---|\n")
    f.writelines(f"| {r['check']} | {r['status']} | {r['figure']} |\n" for r in results)
failed = [r['check'] for r in results if r['status'] in ('FAIL', 'ERROR')]
print(f"{len(results)} checks, {len(failed)} failed or crashed"
      f"{': ' + ', '.join(failed) if failed else ''}; wrote {out}/results.json and results.md")
sys.exit(1 if failed else 0)
