"""ops/attention_triton.py's fused kernels, run by Triton's interpreter on the CPU (conftest
sets TRITON_INTERPRET=1), against ops/attention.py's written-out path in float64: values and
gradients, softmax and entmax-1.5, NAPE's bias, windows, grouped-query heads, queries at 8K and 64K
into the keys, entmax's support, and attention dropout's masks (forward against backward, keep
rate, scale)."""

import os
import subprocess
import sys

import pytest
import torch

from ops import attention
from conftest import ROOT
from model import alibi_slopes

pytest.importorskip('triton')
from ops.attention_triton import fused_attention  # noqa: E402 (after TRITON_INTERPRET)

B, H, HKV, D = 2, 4, 2, 16  # two query heads per key head
SLOPES = alibi_slopes(H, 'nape')  # 1, 1/2 and two NoPE heads (slope 0)
# name: (slopes, window, position of the first query, queries, keys): the queries are the last Tq
# of the Tk positions (keys from a cache at the offsets)
CASES = {'causal': (None, 0, 0, 24, 24), 'NAPE': (SLOPES, 0, 0, 24, 24),
         'NAPE + window': (SLOPES, 6, 0, 24, 24), 'NAPE at 8K': (SLOPES, 0, 8192, 9, 26),
         'NAPE + window at 64K': (SLOPES, 7, 65536, 20, 27)}


def inputs(Tq, Tk, seed=0, d=D):
    """q, k, v as the model makes them: (B, T, H, hd) transposed, so not contiguous."""
    g = torch.Generator().manual_seed(seed)
    q = 2 * torch.randn(B, Tq, H, d, generator=g, dtype=torch.float64).transpose(1, 2)
    k = 2 * torch.randn(B, Tk, HKV, d, generator=g, dtype=torch.float64).transpose(1, 2)
    v = torch.randn(B, Tk, HKV, d, generator=g, dtype=torch.float64).transpose(1, 2)
    return q, k, v


def reference(q, k, v, q_start, k_start, slopes, window, alpha, mask=None, p=0.0):
    """attention.py's written-out scores in float64; with a keep mask, dropped by it."""
    if mask is None:
        return attention.attention(q, k, v, q_start=q_start, k_start=k_start, slopes=slopes,
                                   window=window, backend='manual', alpha=alpha)
    probs = []
    attention.attention(q, k, v, q_start=q_start, k_start=k_start, slopes=slopes, window=window,
                        backend='manual', alpha=alpha, record=probs.append)
    return (probs[0] * mask / (1 - p)) @ attention.repeat_kv(q, k, v)[1]


def relative(a, b):
    return ((a.double() - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize('entmax', [False, True], ids=['softmax', 'entmax'])
@pytest.mark.parametrize('case', CASES)
def test_values_and_gradients_equal_float64(case, entmax):
    slopes, window, q_start, Tq, Tk = CASES[case]
    k_start = q_start + Tq - Tk
    q, k, v = inputs(Tq, Tk)
    leaves = [t.float().requires_grad_() for t in (q, k, v)]
    y = fused_attention(*leaves, q_start, k_start, slopes, window, entmax=entmax)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    (y * g).sum().backward()
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = reference(*ref_leaves, q_start, k_start, None if slopes is None else slopes.double(),
                    window, 1.5 if entmax else 1.0)
    (ref * g).sum().backward()
    assert relative(y, ref) < 1e-5  # tools/gpu_check.py's float32 bound
    for got, want in zip(leaves, ref_leaves):
        assert relative(got.grad, want.grad) < 1e-5


def test_entmax_support_is_exact():
    """With v the identity the output is the probabilities: exactly 0 where float64 entmax is 0,
    positive where it is, rows summing to 1; an ALiBi head's support lies nearer than a NoPE
    head's."""
    T = 32
    q, k, _ = inputs(T, T, seed=2, d=T)
    v = torch.eye(T, dtype=torch.float64).expand(B, HKV, T, T)
    P = fused_attention(q.float(), k.float(), v.float(), slopes=SLOPES, entmax=True)
    ref = reference(q, k, v, 0, 0, SLOPES.double(), 0, 1.5)  # (B, H, T, T)
    assert (P[ref == 0] == 0).all() and (P[ref > 1e-6] > 0).all()
    assert (ref == 0).float().mean() > 0.5  # sparse, so the support is tested
    torch.testing.assert_close(P.sum(-1).double(), torch.ones(B, H, T, dtype=torch.float64))
    distance = torch.arange(T)[:, None] - torch.arange(T)
    far = (P > 0) * distance  # (B, H, T, T)
    assert far[:, 0].sum() < far[:, 3].sum() / 2  # slope 1 against NoPE


@pytest.mark.parametrize('entmax', [False, True], ids=['softmax', 'entmax'])
def test_attention_dropout_masks(entmax):
    """One seed draws one mask, in the forward and again in the backward. With v the identity the
    output is the kept probabilities times 1/(1-p): the keep rate is 1-p (5 sigma) and the kept
    values P/(1-p); with that mask the gradients equal float64's."""
    p, T = 0.25, 32
    slopes, alpha = SLOPES.double(), 1.5 if entmax else 1.0
    q, k, v = inputs(T, T, seed=3, d=T)
    eye = torch.eye(T, dtype=torch.float64).expand(B, HKV, T, T)
    torch.manual_seed(5)
    y = fused_attention(q.float(), k.float(), eye.float(), slopes=SLOPES, window=20, dropout_p=p,
                        entmax=entmax)  # (B, H, T, T)
    P = reference(q, k, eye, 0, 0, slopes, 20, alpha)
    live = P > 1e-3
    mask = y != 0
    rate, n = mask[live].float().mean().item(), live.sum().item()
    assert abs(rate - (1 - p)) < 5 * (p * (1 - p) / n) ** 0.5
    torch.testing.assert_close(y[mask].double(), P[mask] / (1 - p), rtol=1e-5, atol=1e-7)
    torch.manual_seed(6)  # another seed, another mask
    assert (fused_attention(q.float(), k.float(), eye.float(), slopes=SLOPES, window=20,
                            dropout_p=p, entmax=entmax) != 0).ne(mask).any()
    # the same seed with other values: the same mask, in the forward and the backward
    leaves = [t.float().requires_grad_() for t in (q, k, v)]
    torch.manual_seed(5)
    out = fused_attention(*leaves, slopes=SLOPES, window=20, dropout_p=p, entmax=entmax)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    (out * g).sum().backward()
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    keep = mask.double().where(P > 0, 1.0)  # where P is 0 the mask does not show; nor matter
    ref = reference(*ref_leaves, 0, 0, slopes, 20, alpha, keep, p)
    (ref * g).sum().backward()
    assert relative(out, ref) < 1e-5
    for got, want in zip(leaves, ref_leaves):
        assert relative(got.grad, want.grad) < 1e-5


def test_attention_calls_it_as_it_calls_the_others(monkeypatch):
    """attention() hands the kernel its arguments in order (offsets, bias, window, entmax): the
    choice forced to 'triton', as on CUDA, it equals the written-out path."""
    q, k, v = inputs(9, 26)
    kw = dict(q_start=8192, k_start=8192 + 9 - 26, slopes=SLOPES, window=11)
    want = {alpha: attention.attention(q, k, v, **kw, alpha=alpha, backend='manual')
            for alpha in (1.0, 1.5)}
    monkeypatch.setattr(attention, 'fused_attention', fused_attention)
    monkeypatch.setattr(attention, 'attention_kernel', lambda *args: 'triton')
    for alpha in (1.0, 1.5):
        got = attention.attention(q.float(), k.float(), v.float(), **kw, alpha=alpha)
        assert relative(got, want[alpha]) < 1e-5


@pytest.mark.parametrize('entmax', [False, True], ids=['softmax', 'entmax'])
def test_the_custom_ops_pass_opcheck(entmax):
    """torch.library.opcheck on both ops with q, k, v in model.py's transposed layout: the fakes
    give the real ops' shapes, dtypes and strides (the backward's once copied q's strides, which
    Inductor refused at the first backward: test_compile.py runs that step), the autograd
    registration and the schema hold. The compiled training steps: test_compile.py."""
    from ops import attention_triton as at
    q, k, v = (t.float() for t in inputs(24, 24))
    seed = torch.tensor([7])
    fwd = (q, k, v, SLOPES.float(), seed, 0, 0, 6, 0.1, entmax)
    torch.library.opcheck(at._forward, fwd)
    o, o2, s1, s2 = at._forward(*fwd)
    do = torch.randn_like(o).transpose(1, 2).contiguous().transpose(1, 2)
    delta = (do * (o2 if entmax else o)).sum(-1)
    torch.library.opcheck(at._backward, (do, q, k, v, delta, s1, s2, *fwd[3:]))


@pytest.fixture
def bf16_dot(monkeypatch):
    """Test-only: Triton's interpreter (3.9) keeps bf16 as its raw 16 bits (uint16) and tl.dot
    multiplies those integers; a GPU multiplies the values. Here the dot's bf16 operands are
    widened to float32 first (exact), as a tensor core reads them, products and sums in float32.
    Every other bf16 operation of the interpreter (loads, casts, stores) is right as it is."""
    import triton.language as tl
    from triton.runtime import interpreter
    real = interpreter.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        wide = [self.cast_impl(x, tl.float32) if x.dtype.scalar == tl.bfloat16 else x
                for x in (a, b)]
        return real(self, *wide, d, input_precision, max_num_imprecise_acc)
    monkeypatch.setattr(interpreter.InterpreterBuilder, 'create_dot', create_dot)


@pytest.mark.parametrize('entmax', [False, True], ids=['softmax', 'entmax'])
def test_bf16_within_the_bound_of_gpu_check(entmax, bf16_dot):
    """bf16 q, k, v (as autocast hands them on) against float64, as tools/gpu_check.py's fused
    attention check reads them: the output and the gradients of q, k and v, each's largest error
    relative to its largest value, under 2e-2; NAPE with and without a window, queries at 0 and
    after 40 cached keys; heads of 64 (gpu_check's; 24 queries, not 128: the interpreter)."""
    slopes, H, hd = alibi_slopes(4, 'nape'), 4, 64
    for offset in (0, 40):
        g = torch.Generator().manual_seed(offset)
        q, k, v, dy = (torch.randn(1, H, offset + 24 if i in (1, 2) else 24, hd, generator=g,
                                   dtype=torch.float64) for i in range(4))
        for window in (0, 8):
            ref = [t.clone().requires_grad_() for t in (q, k, v)]
            y = attention.attention(*ref, q_start=offset, slopes=slopes.double(), window=window,
                                    backend='manual', alpha=1.5 if entmax else 1.0)
            (y * dy).sum().backward()
            got = [t.bfloat16().requires_grad_() for t in (q, k, v)]
            out = fused_attention(*got, offset, 0, slopes, window, entmax=entmax)
            (out * dy.bfloat16()).sum().backward()
            assert out.dtype == torch.bfloat16
            for a, b in zip([out] + [t.grad for t in got], [y] + [t.grad for t in ref]):
                assert relative(a, b) < 2e-2, (offset, window)


COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ops import attention_triton as at
pointers = {**dict.fromkeys(('Q', 'K', 'V', 'O', 'DO'), '*bf16'), 'SEED': '*i64',
            **dict.fromkeys(('O2', 'S1', 'S2', 'SL', 'DELTA', 'DQ', 'DK', 'DV'), '*fp32')}
for entmax in (False, True):
    constants = dict(ENTMAX=entmax, HAS_BIAS=True, WINDOW=True, DROPOUT=True, PRECISION='tf32',
                     D=64, BLOCK_M=at.BLOCK, BLOCK_N=at.BLOCK, N_ITER=at.N_ITER)
    for fn in (at._fwd, at._bwd_dkdv, at._bwd_dq):
        names = fn.arg_names
        signature = {n: 'constexpr' if n in constants else pointers.get(n) or (
            'fp32' if n in ('sm_scale', 'p_drop') else 'i32') for n in names}
        src = ASTSource(fn=fn, signature=signature, constexprs={
            (names.index(n),): v for n, v in constants.items() if n in names})
        kernel = triton.compile(src, target=GPUTarget('cuda', 90, 32),
                                options=dict(num_warps=at.NUM_WARPS))
        assert '.target sm_90' in kernel.asm['ptx'] and kernel.asm['cubin']
        print(fn.__name__, 'entmax' if entmax else 'softmax', len(kernel.asm['cubin']))
"""


def test_the_kernels_compile_for_an_h100(tmp_path):
    """What the interpreter lets pass, a GPU's compiler may not (the types of values carried
    through loops): Triton's compiler and its bundled ptxas build each kernel for sm_90, in bf16,
    with every feature on (bias, window, dropout), at the GPU's tile and warps. In a process of its
    own: this one's kernels are interpreted."""
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    r = subprocess.run([sys.executable, '-c', COMPILE], cwd=ROOT, capture_output=True, text=True,
                       env={**env, 'TRITON_CACHE_DIR': str(tmp_path)}, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(r.stdout.split('\n')) == 7  # 2 x 3 kernels
