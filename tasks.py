"""
Synthetic tasks, generated on the fly from a seed (no files).

Copy, the task of the paper's Mamba2-45M run (Table 6), in the format of the ASEntmax
generator (deep-spin/asentmax): {bos} src {sep} trg {eos}, with src uniform random symbols and
trg a copy of it; the loss is on trg and eos only. Models train on source lengths in
[min_len, max_len] and are scored by exact-match greedy copies at longer lengths.
"""

import numpy as np
import torch

PAD, BOS, SEP, EOS = 0, 1, 2, 3  # the symbols from 4 on are the ones to copy
FIRST_SYMBOL = 4


class Copy:
    def __init__(self, vocab_size=32, min_len=50, max_len=100):
        if not FIRST_SYMBOL < vocab_size or not 0 < min_len <= max_len:
            raise ValueError(f"Copy needs vocab_size > {FIRST_SYMBOL} and 0 < min_len <= max_len, "
                             f"got {vocab_size}, {min_len}, {max_len}")
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

    @torch.no_grad()
    def correct_copies(self, model, lengths, n, seed, device, batch_size=64, rank=0, world=1):
        """Greedy copies of n held-out sources per length (the same ones for every model and
        call: they depend on seed and length only); this process scores samples rank::world.
        -> (len(lengths), 2): the copies exactly right (src, then eos), and the sum over copies
        of the fraction of their L + 1 tokens that are right."""
        correct = torch.zeros(len(lengths), 2, device=device)
        for j, L in enumerate(lengths):
            src = torch.from_numpy(np.random.default_rng([seed, 7, L]).integers(FIRST_SYMBOL, self.vocab_size, size=(n, L)))
            src = src[rank::world]
            for s in src.split(batch_size):
                prompt = torch.cat([torch.full((len(s), 1), BOS), s, torch.full((len(s), 1), SEP)], dim=1)
                out = model.generate(prompt.to(device), L + 1)[:, prompt.size(1):]  # (b, L + 1)
                right = out == torch.cat([s, torch.full((len(s), 1), EOS)], dim=1).to(device)
                correct[j, 0] += right.all(dim=1).sum()
                correct[j, 1] += right.float().mean(dim=1).sum()
        return correct
