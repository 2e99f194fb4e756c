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

Two probes of how positions generalize (docs/methods.md), in Copy's format:
Offset, fixed-offset retrieval: {bos} src {sep} a1 .. am {eos}, each answer token the one `offset`
positions before it, so a piece of src that ends offset - m - 1 symbols before its end. Relative
positions can learn the rule for every length; absolute ones learn it per position.
DelayCopy, distance with the context length fixed: {bos} filler src filler {sep} src {eos}, the
copy `delay` filler symbols after its source, and the front filler making every sequence as long
as the longest test delay needs. In training the delays are in [min_len, max_len]; the test
lengths are delays: only the distance is new, never the length.
"""

import numpy as np
import torch

import hardware

PAD, BOS, SEP, EOS = 0, 1, 2, 3  # Needle uses SEP as its key; the symbols from 4 on are data
FIRST_SYMBOL = 4
LENGTHS = {'copy': 'source lengths', 'needle': 'sequence lengths', 'offset': 'source lengths',
           'delay_copy': 'delays'}


def symbols_meta(vocab_size):
    """A task's stand-in for a tokenizer's meta.json: its symbols are its tokens."""
    return {'tokenizer': {'kind': 'symbols', 'n_vocab': vocab_size, 'eot': EOS},
            'vocab_size': vocab_size}


def check(vocab_size, min_len, max_len, least=1):
    if not FIRST_SYMBOL < vocab_size or not least <= min_len <= max_len:
        raise ValueError(f"the task needs vocab_size > {FIRST_SYMBOL} and {least} <= min_len "
                         f"<= max_len, got {vocab_size}, {min_len}, {max_len}")


class Copy:
    def __init__(self, vocab_size=32, min_len=50, max_len=100):
        check(vocab_size, min_len, max_len)
        self.vocab_size, self.min_len, self.max_len = vocab_size, min_len, max_len
        # the inputs of the longest sequence (2L + 3 tokens, minus the last)
        self.block_size = 2 * max_len + 2
        self.meta = symbols_meta(vocab_size)

    def batch(self, batch_size, T, rng):
        """batch_size sequences with source lengths uniform in [min_len, max_len], padded to T
        inputs -> inputs and targets (B, T), int64; targets are -1 except where the next token is
        part of the copy or its eos."""
        if T < self.block_size:
            raise ValueError(f"Copy with max_len {self.max_len} needs block_size >= "
                             f"{self.block_size}, got {T}")
        x = np.full((batch_size, T + 1), PAD, dtype=np.int64)
        y = np.full((batch_size, T), -1, dtype=np.int64)
        for i, L in enumerate(rng.integers(self.min_len, self.max_len + 1, size=batch_size)):
            src = rng.integers(FIRST_SYMBOL, self.vocab_size, size=L)
            x[i, :2 * L + 3] = np.concatenate([[BOS], src, [SEP], src, [EOS]])
            # the inputs sep, trg[0], ... predict trg and eos
            y[i, L + 1:2 * L + 2] = x[i, L + 2:2 * L + 3]
        return torch.from_numpy(x[:, :-1]), torch.from_numpy(y)

    def test_set(self, L, n, seed):
        """n held-out sources of length L (they depend on seed and L only) -> prompts (n, L + 2)
        and answers (n, L + 1)."""
        src = torch.from_numpy(np.random.default_rng([seed, 7, L]).integers(
            FIRST_SYMBOL, self.vocab_size, size=(n, L)))
        prompts = torch.cat([torch.full((n, 1), BOS), src, torch.full((n, 1), SEP)], dim=1)
        return prompts, torch.cat([src, torch.full((n, 1), EOS)], dim=1)


class Answered:
    """A task whose sequences end {sep} answer {eos} (Copy's layout): batches with the loss on the
    answer and eos, and test sets; a subclass makes `sequence(L, rng)` and sets `answer_len`,
    `block_size`, `meta` and `stream` (its test sets' seed stream, its own for every task)."""

    def batch(self, batch_size, T, rng):
        """batch_size sequences for lengths uniform in [min_len, max_len], padded to T inputs ->
        inputs and targets (B, T), int64; targets are -1 except for the answer and its eos."""
        if T < self.block_size:
            raise ValueError(f"{type(self).__name__} needs block_size >= {self.block_size}, "
                             f"got {T}")
        x = np.full((batch_size, T + 1), PAD, dtype=np.int64)
        y = np.full((batch_size, T), -1, dtype=np.int64)
        for i, L in enumerate(rng.integers(self.min_len, self.max_len + 1, size=batch_size)):
            seq = self.sequence(L, rng)
            n, m = len(seq), self.answer_len + 1  # the answer and eos: the last m tokens
            x[i, :n] = seq
            # the token before the answer, and the answer, predict it and eos
            y[i, n - m - 1:n - 1] = seq[n - m:]
        return torch.from_numpy(x[:, :-1]), torch.from_numpy(y)

    def test_set(self, L, n, seed):
        """n held-out sequences for length L (they depend on seed, the task's stream and L only) ->
        prompts up to sep, and answers with eos (n, answer_len + 1)."""
        rng = np.random.default_rng([seed, self.stream, L])
        seqs = torch.from_numpy(np.stack([self.sequence(L, rng) for _ in range(n)]))
        return seqs.split([seqs.size(1) - self.answer_len - 1, self.answer_len + 1], dim=1)


class Needle(Answered):
    stream = 8

    def __init__(self, vocab_size=32, min_len=32, max_len=64, value_len=4, keys=1):
        named = keys > 1  # one needle needs no name: the key symbol alone marks it
        check(vocab_size, min_len, max_len,
              least=keys * (value_len + 1 + named) + value_len + 3 + named)
        # the haystack's symbols below, the values' from here
        self.first_value = (FIRST_SYMBOL + vocab_size) // 2
        if self.first_value - FIRST_SYMBOL < max(1, keys * named) or keys < 1:
            raise ValueError(f"Needle with {keys} keys needs keys >= 1 and vocab_size >= "
                             f"{FIRST_SYMBOL + 2 * max(1, keys)}: a haystack symbol for each key's "
                             f"name and as many for values, got {vocab_size}")
        self.vocab_size, self.min_len, self.max_len, self.value_len = (
            vocab_size, min_len, max_len, value_len)
        self.keys, self.answer_len = keys, value_len
        self.block_size = max_len  # a sequence of L tokens: L - 1 inputs (and the PAD after eos)
        self.meta = symbols_meta(vocab_size)

    def sequence(self, L, rng):
        """One sequence of L tokens: bos, haystack and needles, the query (key, and name if
        keys > 1), value, eos."""
        if self.keys > 1:
            return self.multikey_sequence(L, rng)
        k = self.value_len
        value = rng.integers(self.first_value, self.vocab_size, size=k)
        # the noise "sentence", repeated
        hay = FIRST_SYMBOL + np.arange(L - 2 * k - 4) % (self.first_value - FIRST_SYMBOL)
        # the needle goes before haystack symbol `depth` (or last)
        depth = rng.integers(0, len(hay) + 1)
        return np.concatenate([[BOS], hay[:depth], [SEP], value, hay[depth:], [SEP], value, [EOS]])

    def multikey_sequence(self, L, rng):
        k, n = self.value_len, self.keys
        names = rng.choice(np.arange(FIRST_SYMBOL, self.first_value), size=n, replace=False)
        needles = [np.concatenate([[SEP, s],
                                   rng.integers(self.first_value, self.vocab_size, size=k)])
                   for s in names]
        hay = FIRST_SYMBOL + np.arange(L - n * (k + 2) - k - 4) % (self.first_value - FIRST_SYMBOL)
        # needle i goes before haystack symbol depths[i]
        depths = np.sort(rng.integers(0, len(hay) + 1, size=n))
        asked = needles[rng.integers(n)]
        pieces = [[BOS]] + [p for i in range(n)
                            for p in (hay[depths[i - 1] if i else 0:depths[i]], needles[i])]
        return np.concatenate(pieces + [hay[depths[-1]:], asked, [EOS]])


class Offset(Answered):
    stream = 9

    def __init__(self, vocab_size=16, min_len=32, max_len=64, offset=8, answer_len=4):
        check(vocab_size, min_len, max_len, least=offset)
        if not 1 <= answer_len < offset:
            raise ValueError(f"Offset needs 1 <= answer_len < offset (the answer looks back into "
                             f"the source), got {answer_len}, {offset}")
        self.vocab_size, self.min_len, self.max_len = vocab_size, min_len, max_len
        self.offset, self.answer_len = offset, answer_len
        self.block_size = max_len + answer_len + 2  # the inputs of the longest sequence
        self.meta = symbols_meta(vocab_size)

    def sequence(self, L, rng):
        """bos, L source symbols, sep, the answer (token j at position L + 1 + j is the one at
        L + 1 + j - offset: source symbol L + 1 + j - offset, counted from 1), eos."""
        src = rng.integers(FIRST_SYMBOL, self.vocab_size, size=L)
        answer = src[L - self.offset + 1:L - self.offset + 1 + self.answer_len]
        return np.concatenate([[BOS], src, [SEP], answer, [EOS]])


class DelayCopy(Answered):
    stream = 10

    def __init__(self, vocab_size=16, min_len=4, max_len=16, copy_len=8, longest=64):
        check(vocab_size, min_len, max_len, least=0)
        if max_len > longest or copy_len < 1:
            raise ValueError(f"DelayCopy needs copy_len >= 1 and its longest test delay "
                             f"({longest}) >= the training delays ({min_len}-{max_len}), "
                             f"got {copy_len}")
        self.vocab_size, self.min_len, self.max_len, self.answer_len = (
            vocab_size, min_len, max_len, copy_len)
        # the fillers' symbols below, the sources' from here
        self.first_value = (FIRST_SYMBOL + vocab_size) // 2
        # every sequence: bos, filler, src, delay, sep, src, eos
        self.length = longest + 2 * copy_len + 3
        self.block_size = self.length - 1
        self.meta = symbols_meta(vocab_size)

    def sequence(self, delay, rng):
        n = self.answer_len
        src = rng.integers(self.first_value, self.vocab_size, size=n)
        filler = (FIRST_SYMBOL
                  + np.arange(self.length - 2 * n - 3) % (self.first_value - FIRST_SYMBOL))
        front = len(filler) - delay
        return np.concatenate([[BOS], filler[:front], src, filler[front:], [SEP], src, [EOS]])


def from_config(c):
    """The task of a train.py config (c['task']: 'copy', 'needle', 'offset' or 'delay_copy');
    its test lengths are c['eval_lengths']."""
    v, lo, hi = c['task_vocab'], c['task_min_len'], c['task_max_len']
    if c['task'] == 'copy':
        return Copy(v, lo, hi)
    if c['task'] == 'offset':
        return Offset(v, lo, hi, c['task_offset'], c['needle_value_len'])
    if c['task'] == 'delay_copy':
        return DelayCopy(v, lo, hi, c['needle_value_len'], max(c['eval_lengths'], default=hi))
    return Needle(v, lo, hi, c['needle_value_len'], c.get('needle_keys', 1))


@torch.no_grad()
def correct_answers(task, model, lengths, n, seed, device, batch_size=64, rank=0, world=1):
    """Greedy answers to the task's n held-out prompts per length (the same ones for every model
    and call); this process scores samples rank::world, in as many batches as every other process
    (hardware.share: FSDP runs each forward on all at once). -> (len(lengths), 2): the answers
    exactly right, and the sum over answers of the fraction of their tokens that are right."""
    # (items, 2): an item, and whether it counts
    mine = torch.tensor(hardware.share(n, rank, world), dtype=torch.long).reshape(-1, 2)
    correct = torch.zeros(len(lengths), 2, device=device)
    for j, L in enumerate(lengths):
        prompts, answers = task.test_set(L, n, seed)
        for batch in mine.split(batch_size):
            p, a = prompts[batch[:, 0]], answers[batch[:, 0]].to(device)
            real = batch[:, 1].to(device)  # 0 for a pad
            out = model.generate(p.to(device), a.size(1))[:, p.size(1):]  # (b, answer length)
            right = out == a
            correct[j, 0] += (right.all(dim=1) * real).sum()
            correct[j, 1] += (right.float().mean(dim=1) * real).sum()
    return correct
