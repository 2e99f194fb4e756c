"""The synthetic tasks (Copy, Needle, Offset, DelayCopy): their sequences, their targets, and their
scoring."""

import numpy as np
import pytest
import torch

from tasks import BOS, EOS, FIRST_SYMBOL, PAD, SEP, Copy, DelayCopy, Needle, Offset, correct_answers


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
        # eos, unless cut off
        assert xi[L + 2:2 * L + 2] == src and xi[2 * L + 2:2 * L + 3] in ([EOS], [])
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
        return torch.cat([prompt, src, torch.full((len(src), 1), EOS)],
                         dim=1)[:, :prompt.size(1) + n]


def test_scoring_of_greedy_copies():
    task = Copy(vocab_size=10, min_len=3, max_len=6)
    assert (correct_answers(task, Copier(), [5, 12], 10, seed=1, device='cpu').tolist()
            == [[10, 10], [10, 10]])
    # one wrong symbol in 13 tokens (12 and eos)
    assert (correct_answers(task, Copier(fail_from=12), [5, 12], 10, seed=1, device='cpu').tolist()
            == [[10, 10], [0, pytest.approx(10 * 12 / 13)]])
    # the held-out sources depend on (seed, length) only, and are split among processes in as many
    # batches each (FSDP's forwards run on all at once): 9 as 5 and 4 with a pad, a repeat of
    # the first
    a, b = Copier(), Copier()
    correct_answers(task, a, [7], 9, seed=1, device='cpu', batch_size=4)
    correct_answers(task, b, [7], 9, seed=1, device='cpu', batch_size=4)
    assert (all(torch.equal(p, q) for p, q in zip(a.prompts, b.prompts))
            and sum(len(p) for p in a.prompts) == 9)
    parts = [Copier(), Copier()]
    for r, m in enumerate(parts):
        correct_answers(task, m, [7], 9, seed=1, device='cpu', rank=r, world=2, batch_size=4)
    assert [[len(p) for p in m.prompts] for m in parts] == [[4, 1], [4, 1]]
    split, every = torch.cat([p for m in parts for p in m.prompts]), torch.cat(a.prompts)
    assert (sorted(map(tuple, split.tolist()))
            == sorted(map(tuple, [*every.tolist(), every[0].tolist()])))


def test_needle_batches_hide_one_key_and_ask_for_its_value():
    task = Needle(vocab_size=12, min_len=12, max_len=20, value_len=3)
    x, y = task.batch(64, task.block_size, np.random.default_rng(0))
    assert x.shape == y.shape == (64, 20)
    lengths, depths = set(), set()
    for xi, yi in zip(x.tolist(), y.tolist()):
        L = xi.index(EOS) + 1
        lengths.add(L)
        keys = [i for i, t in enumerate(xi) if t == SEP]
        assert xi[0] == BOS and len(keys) == 2 and keys[1] == L - 5
        value = xi[keys[0] + 1:keys[0] + 4]
        depths.add(keys[0])
        assert all(8 <= t < 12 for t in value) and xi[keys[1] + 1:keys[1] + 4] == value
        # the haystack's own symbols
        assert all(FIRST_SYMBOL <= t < 8 for t in xi[1:keys[0]] + xi[keys[0] + 4:keys[1]])
        assert all(t == PAD for t in xi[L:])
        # the loss on the answer only
        assert yi[:L - 5] == [-1] * (L - 5) and all(t == -1 for t in yi[L - 1:])
        assert yi[L - 5:L - 1] == value + [EOS]
    assert lengths == set(range(12, 21)) and len(depths) > 5
    with pytest.raises(ValueError, match='block_size >= 20'):
        task.batch(8, 19, np.random.default_rng(0))


class Retriever:
    """Answers with the symbols after the first key (right), or after a random position (wrong)."""

    def __init__(self, right=True):
        self.right = right

    def generate(self, prompt, n):
        starts = [(row.tolist().index(SEP) if self.right else 0) + 1 for row in prompt]
        answer = torch.stack([row[s:s + n - 1] for row, s in zip(prompt, starts)])
        return torch.cat([prompt, answer, torch.full((len(prompt), 1), EOS)], dim=1)


def test_needle_scoring():
    task = Needle(vocab_size=12, min_len=12, max_len=20, value_len=3)
    prompts, answers = task.test_set(40, 10, seed=1)
    assert prompts.shape == (10, 36) and answers.shape == (10, 4) and (prompts[:, -1] == SEP).all()
    assert (correct_answers(task, Retriever(), [20, 40], 10, seed=1, device='cpu').tolist()
            == [[10, 10], [10, 10]])
    wrong = correct_answers(task, Retriever(right=False), [40], 50, seed=1, device='cpu')
    # eos right, the haystack's symbols never a value (unless the needle is within 3 of bos)
    assert wrong[0, 0] <= 3 and 12.5 <= wrong[0, 1] < 15


def test_multikey_needle_names_its_needles_and_asks_for_one():
    task = Needle(vocab_size=16, min_len=30, max_len=40, value_len=3, keys=3)
    x, y = task.batch(64, task.block_size, np.random.default_rng(0))
    asked = set()
    for xi, yi in zip(x.tolist(), y.tolist()):
        L = xi.index(EOS) + 1
        marks = [i for i, t in enumerate(xi[:L]) if t == SEP]
        # three needles, then the query: key, name, 3 values, eos
        assert len(marks) == 4 and marks[-1] == L - 6
        needles = {xi[i + 1]: xi[i + 2:i + 5] for i in marks[:3]}
        # distinct names: haystack symbols
        assert len(needles) == 3 and all(FIRST_SYMBOL <= s < 10 for s in needles)
        assert all(10 <= t < 16 for v in needles.values() for t in v)  # values: the other half
        name = xi[marks[-1] + 1]
        asked.add(list(needles).index(name))
        assert yi[L - 5:L - 1] == needles[name] + [EOS] and set(yi[:L - 5] + yi[L - 1:]) == {-1}
        assert xi[L - 4:L - 1] == needles[name]
    assert asked == {0, 1, 2}  # any of the needles is asked for
    prompts, answers = task.test_set(80, 5, seed=1)
    assert prompts.shape == (5, 76) and answers.shape == (5, 4) and (prompts[:, -2] == SEP).all()
    with pytest.raises(ValueError, match='3 keys needs'):
        Needle(vocab_size=8, min_len=30, max_len=40, value_len=3, keys=3)
    # 3 needles of 5 and the query's 6 do not fit in 20 with bos
    with pytest.raises(ValueError, match='min_len'):
        Needle(vocab_size=16, min_len=21, max_len=40, value_len=3, keys=3)


class Looker:
    """A model that answers by a rule written out here: each new token is the one `back` positions
    before it."""
    def __init__(self, back):
        self.back = back

    def generate(self, prompt, n):
        out = prompt
        for _ in range(n):
            # the token `back` before the new one
            out = torch.cat([out, out[:, -self.back:][:, :1]], dim=1)
        return out


def test_offset_answers_are_the_tokens_offset_back():
    task = Offset(vocab_size=16, min_len=10, max_len=20, offset=6, answer_len=4)
    x, y = task.batch(64, task.block_size, np.random.default_rng(0))
    assert x.shape == (64, 20 + 4 + 2) and task.block_size == 26
    for row, tgt in zip(x.tolist(), y.tolist()):
        # the sequence: bos, L symbols, sep, 4 answers, eos (its last input cut)
        L = row.index(SEP) - 1
        seq = row[:L + 6] + [tgt[L + 5]]
        assert (10 <= L <= 20 and seq[0] == BOS and seq[-1] == EOS
                and all(t == PAD for t in row[L + 7:]))
        assert all(FIRST_SYMBOL <= t < 16 for t in seq[1:L + 1])
        for j in range(L + 2, L + 6):  # every answer token is the one 6 positions before it
            assert seq[j] == seq[j - 6]
        assert tgt[L + 1:L + 6] == seq[L + 2:] and all(t == -1 for t in tgt[:L + 1] + tgt[L + 6:])
    prompts, answers = task.test_set(50, 8, seed=3)
    assert prompts.shape == (8, 52) and answers.shape == (8, 5) and (prompts[:, -1] == SEP).all()
    assert torch.equal(prompts, task.test_set(50, 8, seed=3)[0])
    # the rule scores every answer right at any length (eos aside, which the rule does not know)
    right = correct_answers(task, Looker(6), [20, 80], 10, seed=1, device='cpu')
    assert (right[:, 0].tolist() == [0, 0]
            and right[:, 1].tolist() == [pytest.approx(8), pytest.approx(8)])
    # one position off: chance
    assert correct_answers(task, Looker(5), [20], 10, seed=1, device='cpu')[0, 1] < 4
    with pytest.raises(ValueError, match='answer_len < offset'):
        Offset(16, 10, 20, offset=4, answer_len=4)


def test_delay_copy_keeps_the_length_and_moves_the_copy():
    task = DelayCopy(vocab_size=16, min_len=2, max_len=8, copy_len=4, longest=32)
    x, y = task.batch(64, task.block_size, np.random.default_rng(0))
    assert task.block_size == 32 + 2 * 4 + 2 and x.shape == (64, 42)
    for row, tgt in zip(x.tolist(), y.tolist()):
        # every sequence fills the context: bos .. sep, the copy; its eos is the last target
        sep = len(row) - 5
        assert row[0] == BOS and row[sep] == SEP
        # the source's symbols (the fillers' are below 10)
        src = [i for i, t in enumerate(row[:sep]) if t >= 10]
        assert len(src) == 4 and src == list(range(src[0], src[0] + 4))
        delay = sep - src[-1] - 1
        assert 2 <= delay <= 8 and row[sep + 1:] == [row[i] for i in src]
        assert tgt[sep:] == [row[i] for i in src] + [EOS] and all(t == -1 for t in tgt[:sep])
    for delay in (2, 16, 32):  # test lengths are delays, in sequences of the same length
        prompts, answers = task.test_set(delay, 5, seed=1)
        assert prompts.shape == (5, 32 + 4 + 2) and answers.shape == (5, 5)
        p = prompts[0].tolist()
        assert (p[-1] == SEP and all(t < 10 for t in p[-1 - delay:-1])
                and all(t >= 10 for t in p[-5 - delay:-1 - delay]))
    with pytest.raises(ValueError, match='longest test delay'):
        DelayCopy(16, 2, 40, 4, longest=32)
