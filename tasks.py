"""
Synthetic tasks, generated on the fly from a seed (no files). Each makes training batches and a
held-out test set per length, scored by exact-match greedy answers (`correct_answers`).

Copy, the task of the paper's Mamba2-45M run (Table 6), in the format of the ASEntmax
generator (deep-spin/asentmax): {bos} src {sep} trg {eos}, with src uniform random symbols and
trg a copy of it; the loss is on trg and eos only. Models train on source lengths in
[min_len, max_len] and are scored by exact-match greedy copies at longer lengths.

Needle, NIAH-1 in symbols (for models too small to learn RULER's English version, Section 4):
{bos} haystack with a needle {key} v1 .. vk inside {key} -> v1 .. vk {eos}. As in RULER's
NIAH-1, the haystack repeats one noise "sentence" (every haystack symbol in turn, as RULER repeats
"The grass is green. ...") and the value is drawn from symbols the haystack never holds (as its
7-digit numbers are): the first half of the symbols for the haystack, the second for values. The
needle sits at a uniform random depth, the query is the key again; the loss is on the answer only.
Its lengths are whole-sequence lengths: models train on lengths in [min_len, max_len] and are
scored at longer ones, as NIAH-1 is by context length.
With keys > 1 it is RULER's niah_multikey in symbols: `keys` needles {key} s v1 .. vk, each with
its own name s (distinct haystack symbols), at random depths; the query {key} s asks for one of
them, and the others are distractors that a diluted attention confuses with it.
"""

import numpy as np
import torch

PAD, BOS, SEP, EOS = 0, 1, 2, 3  # Needle uses SEP as its key; the symbols from 4 on are data
FIRST_SYMBOL = 4


def check(vocab_size, min_len, max_len, least=1):
    if not FIRST_SYMBOL < vocab_size or not least <= min_len <= max_len:
        raise ValueError(f"the task needs vocab_size > {FIRST_SYMBOL} and {least} <= min_len <= max_len, "
                         f"got {vocab_size}, {min_len}, {max_len}")


class Copy:
    def __init__(self, vocab_size=32, min_len=50, max_len=100):
        check(vocab_size, min_len, max_len)
        self.vocab_size, self.min_len, self.max_len = vocab_size, min_len, max_len
        self.block_size = 2 * max_len + 2  # the inputs of the longest sequence (2L + 3 tokens, minus the last)
        self.meta = {'tokenizer': {'kind': 'symbols', 'n_vocab': vocab_size, 'eot': EOS}, 'vocab_size': vocab_size}

    def batch(self, batch_size, T, rng):
        """batch_size sequences with source lengths uniform in [min_len, max_len], padded to T
        inputs -> inputs and targets (B, T), int64; targets are -1 except where the next token is
        part of the copy or its eos."""
        if T < self.block_size:
            raise ValueError(f"Copy with max_len {self.max_len} needs block_size >= {self.block_size}, got {T}")
        x = np.full((batch_size, T + 1), PAD, dtype=np.int64)
        y = np.full((batch_size, T), -1, dtype=np.int64)
        for i, L in enumerate(rng.integers(self.min_len, self.max_len + 1, size=batch_size)):
            src = rng.integers(FIRST_SYMBOL, self.vocab_size, size=L)
            x[i, :2 * L + 3] = np.concatenate([[BOS], src, [SEP], src, [EOS]])
            y[i, L + 1:2 * L + 2] = x[i, L + 2:2 * L + 3]  # the inputs sep, trg[0], ... predict trg and eos
        return torch.from_numpy(x[:, :-1]), torch.from_numpy(y)

    def test_set(self, L, n, seed):
        """n held-out sources of length L (they depend on seed and L only) -> prompts (n, L + 2)
        and answers (n, L + 1)."""
        src = torch.from_numpy(np.random.default_rng([seed, 7, L]).integers(FIRST_SYMBOL, self.vocab_size, size=(n, L)))
        prompts = torch.cat([torch.full((n, 1), BOS), src, torch.full((n, 1), SEP)], dim=1)
        return prompts, torch.cat([src, torch.full((n, 1), EOS)], dim=1)


class Needle:
    def __init__(self, vocab_size=32, min_len=32, max_len=64, value_len=4, keys=1):
        named = keys > 1  # one needle needs no name: the key symbol alone marks it
        check(vocab_size, min_len, max_len, least=keys * (value_len + 1 + named) + value_len + 3 + named)
        self.first_value = (FIRST_SYMBOL + vocab_size) // 2  # the haystack's symbols below, the values' from here
        if self.first_value - FIRST_SYMBOL < max(1, keys * named) or keys < 1:
            raise ValueError(f"Needle with {keys} keys needs keys >= 1 and vocab_size >= {FIRST_SYMBOL + 2 * max(1, keys)}:"
                             f" a haystack symbol for each key's name and as many for values, got {vocab_size}")
        self.vocab_size, self.min_len, self.max_len, self.value_len = vocab_size, min_len, max_len, value_len
        self.keys = keys
        self.block_size = max_len  # a sequence of L tokens: L - 1 inputs (and the PAD after eos)
        self.meta = {'tokenizer': {'kind': 'symbols', 'n_vocab': vocab_size, 'eot': EOS}, 'vocab_size': vocab_size}

    def sequence(self, L, rng):
        """One sequence of L tokens: bos, haystack and needles, the query (key, and name if keys > 1), value, eos."""
        if self.keys > 1:
            return self.multikey_sequence(L, rng)
        k = self.value_len
        value = rng.integers(self.first_value, self.vocab_size, size=k)
        hay = FIRST_SYMBOL + np.arange(L - 2 * k - 4) % (self.first_value - FIRST_SYMBOL)  # the noise "sentence", repeated
        depth = rng.integers(0, len(hay) + 1)  # the needle goes before haystack symbol `depth` (or last)
        return np.concatenate([[BOS], hay[:depth], [SEP], value, hay[depth:], [SEP], value, [EOS]])

    def multikey_sequence(self, L, rng):
        k, n = self.value_len, self.keys
        names = rng.choice(np.arange(FIRST_SYMBOL, self.first_value), size=n, replace=False)
        needles = [np.concatenate([[SEP, s], rng.integers(self.first_value, self.vocab_size, size=k)]) for s in names]
        hay = FIRST_SYMBOL + np.arange(L - n * (k + 2) - k - 4) % (self.first_value - FIRST_SYMBOL)
        depths = np.sort(rng.integers(0, len(hay) + 1, size=n))  # needle i goes before haystack symbol depths[i]
        asked = needles[rng.integers(n)]
        pieces = [[BOS]] + [p for i in range(n) for p in (hay[depths[i - 1] if i else 0:depths[i]], needles[i])]
        return np.concatenate(pieces + [hay[depths[-1]:], asked, [EOS]])

    def batch(self, batch_size, T, rng):
        """batch_size sequences with lengths uniform in [min_len, max_len], padded to T inputs ->
        inputs and targets (B, T), int64; targets are -1 except for the answer and its eos."""
        if T < self.block_size:
            raise ValueError(f"Needle with max_len {self.max_len} needs block_size >= {self.block_size}, got {T}")
        x = np.full((batch_size, T + 1), PAD, dtype=np.int64)
        y = np.full((batch_size, T), -1, dtype=np.int64)
        for i, L in enumerate(rng.integers(self.min_len, self.max_len + 1, size=batch_size)):
            x[i, :L] = self.sequence(L, rng)
            y[i, L - self.value_len - 2:L - 1] = x[i, L - self.value_len - 1:L]  # the query's last and value predict value and eos
        return torch.from_numpy(x[:, :-1]), torch.from_numpy(y)

    def test_set(self, L, n, seed):
        """n held-out sequences of L tokens (they depend on seed and L only) -> prompts up to the
        query (n, L - k - 1) and answers (n, k + 1)."""
        rng = np.random.default_rng([seed, 8, L])
        seqs = torch.from_numpy(np.stack([self.sequence(L, rng) for _ in range(n)]))
        return seqs.split([L - self.value_len - 1, self.value_len + 1], dim=1)


@torch.no_grad()
def correct_answers(task, model, lengths, n, seed, device, batch_size=64, rank=0, world=1):
    """Greedy answers to the task's n held-out prompts per length (the same ones for every model
    and call); this process scores samples rank::world. -> (len(lengths), 2): the answers exactly
    right, and the sum over answers of the fraction of their tokens that are right."""
    correct = torch.zeros(len(lengths), 2, device=device)
    for j, L in enumerate(lengths):
        prompts, answers = task.test_set(L, n, seed)
        for p, a in zip(prompts[rank::world].split(batch_size), answers[rank::world].split(batch_size)):
            out = model.generate(p.to(device), a.size(1))[:, p.size(1):]  # (b, answer length)
            right = out == a.to(device)
            correct[j, 0] += right.all(dim=1).sum()
            correct[j, 1] += right.float().mean(dim=1).sum()
    return correct
