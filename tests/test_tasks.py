"""The Copy task: its sequences, its targets, and its scoring."""

import numpy as np
import pytest
import torch

from tasks import BOS, EOS, FIRST_SYMBOL, PAD, SEP, Copy


def test_batches_hold_copies_with_the_loss_on_the_copy_only():
    task = Copy(vocab_size=10, min_len=3, max_len=6)
    x, y = task.batch(64, task.block_size, np.random.default_rng(0))
    assert x.shape == y.shape == (64, 14)
    lengths = set()
    for xi, yi in zip(x.tolist(), y.tolist()):
        L = xi.index(SEP) - 1
        lengths.add(L)
        src = xi[1:L + 1]
        assert xi[0] == BOS and all(FIRST_SYMBOL <= s < 10 for s in src)
        assert xi[L + 2:2 * L + 2] == src and xi[2 * L + 2:2 * L + 3] in ([EOS], [])  # eos, unless cut off
        assert all(t == PAD for t in xi[2 * L + 3:])
        assert yi[:L + 1] == [-1] * (L + 1)  # no loss on the source
        assert yi[L + 1:2 * L + 2] == src + [EOS]  # the copy and its end
        assert all(t == -1 for t in yi[2 * L + 2:])
    assert lengths == {3, 4, 5, 6}
    a, _ = task.batch(8, 20, np.random.default_rng(1))
    b, _ = task.batch(8, 20, np.random.default_rng(1))
    assert a.shape == (8, 20) and torch.equal(a, b)
    with pytest.raises(ValueError, match='block_size >= 14'):
        task.batch(8, 13, np.random.default_rng(0))


class Copier:
    """A perfect copier, or one that gets the last symbol wrong from some length on."""

    def __init__(self, fail_from=None):
        self.fail_from, self.prompts = fail_from, []

    def generate(self, prompt, n):
        self.prompts.append(prompt)
        src = prompt[:, 1:-1].clone()
        if self.fail_from is not None and src.size(1) >= self.fail_from:
            src[:, -1] = FIRST_SYMBOL + (src[:, -1] - FIRST_SYMBOL + 1) % 6
        return torch.cat([prompt, src, torch.full((len(src), 1), EOS)], dim=1)[:, :prompt.size(1) + n]


def test_scoring_of_greedy_copies():
    task = Copy(vocab_size=10, min_len=3, max_len=6)
    assert task.correct_copies(Copier(), [5, 12], 10, seed=1, device='cpu').tolist() == [[10, 10], [10, 10]]
    # one wrong symbol in 13 tokens (12 and eos)
    assert task.correct_copies(Copier(fail_from=12), [5, 12], 10, seed=1, device='cpu').tolist() == \
        [[10, 10], [0, pytest.approx(10 * 12 / 13)]]
    # the held-out sources depend on (seed, length) only, and are split among processes
    a, b = Copier(), Copier()
    task.correct_copies(a, [7], 9, seed=1, device='cpu', batch_size=4)
    task.correct_copies(b, [7], 9, seed=1, device='cpu', batch_size=4)
    assert all(torch.equal(p, q) for p, q in zip(a.prompts, b.prompts)) and sum(len(p) for p in a.prompts) == 9
    parts = [Copier(), Copier()]
    for r, m in enumerate(parts):
        task.correct_copies(m, [7], 9, seed=1, device='cpu', rank=r, world=2)
    split = torch.cat([p for m in parts for p in m.prompts])
    assert sorted(map(tuple, split.tolist())) == sorted(map(tuple, torch.cat(a.prompts).tolist()))
