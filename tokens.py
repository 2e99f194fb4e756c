"""
Tokenizers and token shards: the data side shared by train.py, the evals and data/*/prepare.py.

Tokenizers, named by a small spec dict that travels in every checkpoint:
    {'kind': 'byte'}                          the 256 bytes, and <|endoftext|> = 256; works offline
    {'kind': 'gpt2', 'path': None}            GPT-2's BPE through tiktoken (path: a .tiktoken file)
    {'kind': 'hf', 'path': 'tokenizer.json', 'eot': '<|end_of_text|>'}   a Hugging Face tokenizer
    {'kind': 'symbols', 'n_vocab': 32, 'eot': 3}   the symbols of a synthetic task (tasks.py), as
                                                   numbers

Shards: a 64-byte header of int64 (magic, version, bytes per token, token count), then the
tokens as uint16 (when the vocab fits) or uint32. A split is every `{split}*.bin` in a folder,
next to a meta.json that names the tokenizer. Documents end with the tokenizer's eot token.
"""

import glob
import importlib.util
import json
import os
import types

import numpy as np
import tiktoken
from tiktoken.load import load_tiktoken_bpe
import torch


MAGIC, VERSION, HEADER_INTS = 20261129, 1, 8
EOT = '<|endoftext|>'
# GPT-2's pre-tokenisation pattern (tiktoken r50k_base)
R50K_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# r50k_base.tiktoken
GPT2_SHA256 = '306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930'


# -----------------------------------------------------------------------------
# tokenizers

class Tokenizer:
    """encode/decode/eot/n_vocab over tiktoken (byte, gpt2) or Hugging Face `tokenizers` (hf)."""

    def __init__(self, spec):
        self.spec = dict(spec)
        kind = spec.get('kind')
        self.hf = None
        if kind == 'byte':
            self.enc = tiktoken.Encoding(name='byte', pat_str=R50K_PAT,
                                         mergeable_ranks={bytes([i]): i for i in range(256)},
                                         special_tokens={EOT: 256})
        elif kind == 'gpt2':
            ranks = load_tiktoken_bpe(gpt2_ranks_file(spec.get('path')), expected_hash=GPT2_SHA256)
            self.enc = tiktoken.Encoding(name='gpt2', pat_str=R50K_PAT, mergeable_ranks=ranks,
                                         special_tokens={EOT: 50256})
        elif kind == 'hf':
            from tokenizers import Tokenizer as HFTokenizer
            path = spec['path']
            path = os.path.join(path, 'tokenizer.json') if os.path.isdir(path) else path
            if not os.path.exists(path):
                raise FileNotFoundError(f"no tokenizer.json at {spec['path']}")
            self.hf = HFTokenizer.from_file(path)
        elif kind == 'symbols':
            self.n_vocab, self.eot = spec['n_vocab'], spec['eot']
            return
        else:
            raise ValueError(f"unknown tokenizer kind {kind!r}: use 'byte', 'gpt2', 'hf' or "
                             f"'symbols'")
        if self.hf is not None:
            self.n_vocab = self.hf.get_vocab_size(with_added_tokens=True)
            self.eot = self.hf.token_to_id(spec.get('eot', EOT))
            if self.eot is None:
                raise ValueError(f"the tokenizer at {spec['path']} has no token "
                                 f"{spec.get('eot', EOT)!r}: set 'eot' in its spec")
        else:
            self.n_vocab, self.eot = self.enc.n_vocab, self.enc.eot_token

    def encode(self, text):
        if self.spec['kind'] == 'symbols':
            return [int(t) for t in text.split()]
        return (self.hf.encode(text, add_special_tokens=False).ids if self.hf
                else self.enc.encode_ordinary(text))

    def encode_prompt(self, text):
        """A prompt as a Hugging Face pipeline feeds it (RULER's wrapper calls tokenizer(prompt)):
        with the special tokens the tokenizer's own post-processor adds, a BOS where it uses one.
        byte and gpt2 add none (GPT-2's tokenizer adds no BOS)."""
        return self.hf.encode(text).ids if self.hf else self.encode(text)

    def encode_batch(self, texts):
        """Many texts at once, in parallel threads (tiktoken and tokenizers both release the
        GIL)."""
        if self.spec['kind'] == 'symbols':
            return [self.encode(t) for t in texts]
        if self.hf:
            return [e.ids for e in self.hf.encode_batch(texts, add_special_tokens=False)]
        return self.enc.encode_ordinary_batch(texts, num_threads=os.cpu_count() or 1)

    def decode(self, ids):
        if self.spec['kind'] == 'symbols':
            return ' '.join(str(int(t)) for t in ids)
        return (self.hf.decode(list(ids), skip_special_tokens=False) if self.hf
                else self.enc.decode(list(ids)))


def same_tokenizer(a, b):
    """Whether two specs name the same tokenizer (equal specs, or the same ids for a probe text:
    one tokenizer.json may sit at two paths)."""
    if a == b:
        return True
    if a is None or b is None or a['kind'] != b['kind']:
        return False
    ta, tb = Tokenizer(a), Tokenizer(b)
    probe = "The grass is green. 1234567 Ünïcödé <|endoftext|>"
    return (ta.n_vocab, ta.eot, ta.encode(probe)) == (tb.n_vocab, tb.eot, tb.encode(probe))


def gpt2_ranks_file(path=None):
    """GPT-2's BPE ranks without a download: an explicit file, or the copy inside the
    openai-whisper package (byte-identical to tiktoken's r50k_base), or tiktoken's own cache."""
    if path:
        return path
    spec = importlib.util.find_spec('whisper')
    if spec is not None:
        path = os.path.join(spec.submodule_search_locations[0], 'assets', 'gpt2.tiktoken')
        if os.path.exists(path):
            return path
    try:  # on a machine with internet access tiktoken downloads (and caches) the same file
        tiktoken.get_encoding('r50k_base')
        return 'https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken'
    except Exception as e:
        raise RuntimeError("GPT-2's BPE file is not available offline: "
                           "`pip install --no-deps openai-whisper` (it ships gpt2.tiktoken), "
                           "or give the tokenizer spec a 'path' to a .tiktoken file") from e


# -----------------------------------------------------------------------------
# shards

def write_shard(path, tokens, vocab_size):
    """Write tokens (any int sequence) to path atomically: a temporary file, then a rename."""
    dtype = np.uint16 if vocab_size <= 2 ** 16 else np.uint32
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size}), got [{tokens.min()}, "
                         f"{tokens.max()}]")
    header = np.zeros(HEADER_INTS, dtype=np.int64)
    header[:4] = MAGIC, VERSION, np.dtype(dtype).itemsize, tokens.size
    tmp = path + '.tmp'
    with open(tmp, 'wb') as f:
        f.write(header.tobytes())
        f.write(tokens.astype(dtype).tobytes())
    os.replace(tmp, path)


def write_documents(out_dir, tok, splits, **meta):
    """A prepared dataset: splits {name: [a document's token ids]} -> out_dir/<name>.bin, every
    document followed by tok's end-of-text, and out_dir/meta.json (the tokenizer, vocab_size, eot,
    each split's documents, tokens and longest document, and meta), each split's figures printed:
    what data/*/prepare.py write and TokenData reads."""
    stats = {}
    for split, docs in splits.items():
        stream = [t for d in docs for t in d + [tok.eot]]  # every document ends with eot
        write_shard(os.path.join(out_dir, f'{split}.bin'), stream, tok.n_vocab)
        stats[split] = {'documents': len(docs), 'tokens': len(stream),
                        'longest_document': max(map(len, docs))}
        print(f"{split}: {len(docs)} documents, {len(stream):,} tokens, "
              f"longest {max(map(len, docs)):,}")
    with open(os.path.join(out_dir, 'meta.json'), 'w') as f:
        json.dump({'tokenizer': tok.spec, 'vocab_size': tok.n_vocab, 'eot': tok.eot, **meta,
                   **stats}, f, indent=2)
    print(f"wrote {out_dir}")


def read_shard(path):
    """The tokens of a shard as a read-only memmap."""
    header = np.fromfile(path, dtype=np.int64, count=HEADER_INTS)
    if header.size < 4 or header[0] != MAGIC:
        raise ValueError(f"{path} is not a token shard (bad magic number); re-run the data's "
                         f"prepare.py")
    if header[1] != VERSION:
        raise ValueError(f"{path} has shard version {header[1]}, this code reads version "
                         f"{VERSION}; re-run prepare.py")
    dtype = {2: np.uint16, 4: np.uint32}.get(int(header[2]))
    size = 8 * HEADER_INTS + header[2] * header[3]  # the bytes the header promises
    if dtype is None or header[3] < 0 or os.path.getsize(path) < size:
        raise ValueError(f"{path} is cut short or damaged (its header promises {header[3]} "
                         f"tokens); re-run prepare.py")
    return np.memmap(path, dtype=dtype, mode='r', offset=HEADER_INTS * 8, shape=(int(header[3]),))


def prepare_command(data_dir, max_tokens=None, source=None):
    """The command that makes data_dir, for error messages:
    data/<name>/prepare.py --tokenizer=<kind>, and --max_tokens for the scripts that stream a
    corpus (their default is all of it). source: a CPT run's folder of released weights, whose own
    tokenizer (its tokenizer.json, and the end-of-text token its tokenizer_config.json names) the
    data must be in."""
    d = os.path.normpath(data_dir)
    script = os.path.join(os.path.dirname(d), 'prepare.py')
    text = os.path.join('data', 'text', 'prepare.py')
    if not os.path.exists(script) or script == text:  # your own text, from any file, anywhere
        kind = os.path.basename(d) if os.path.basename(d) in ('byte', 'gpt2') else 'byte'
        at = '' if d == os.path.join('data', 'text', kind) else f' --out_dir={d}'
        return f"python {text} --input=<your text file> --tokenizer={kind}{at}"
    if source and not source.endswith('.pt') and os.path.basename(d) not in ('byte', 'gpt2'):
        command = f"python {script} --tokenizer=hf --tokenizer_path={source} --out_dir={d}"
    elif os.path.basename(d) in ('byte', 'gpt2'):  # prepare.py writes data/<name>/<tokenizer>
        command = f"python {script} --tokenizer={os.path.basename(d)}"
    else:
        # not --tokenizer=<d's name>: no such tokenizer
        command = f"python {script} --tokenizer=byte --out_dir={d}"
    with open(script) as f:
        if not max_tokens or "'--max_tokens'" not in f.read():
            return command
    return command + (
        f" --max_tokens={f'{max_tokens / 1e9:g}e9' if max_tokens >= 1e9 else int(max_tokens)}")


def eos_token(folder):
    """The end-of-text token a folder of released weights names in its tokenizer_config.json, or
    None."""
    path = os.path.join(folder, 'tokenizer_config.json')
    if not os.path.exists(path):
        return None
    with open(path) as f:
        eos = json.load(f).get('eos_token')
    return eos['content'] if isinstance(eos, dict) else eos


class TokenData:
    """One split of a tokenized dataset: every `{split}*.bin` shard in data_dir and its meta.json
    (or only the first `limit` tokens of the shards, if limit > 0)."""

    def __init__(self, data_dir, split, limit=0, tokens_wanted=None, hint=None):
        files = sorted(glob.glob(os.path.join(data_dir, f'{split}*.bin')))
        meta_path = os.path.join(data_dir, 'meta.json')
        if not files or not os.path.exists(meta_path):  # tokens_wanted: the run's, for the hint
            command = prepare_command(data_dir, tokens_wanted, **(hint or {}))
            raise FileNotFoundError(f"no {split} data in {data_dir} (expected {split}*.bin and "
                                    f"meta.json): run `{command}` first")
        with open(meta_path) as f:
            try:
                self.meta = json.load(f)
            except ValueError:
                self.meta = None
        fields = {'tokenizer', 'vocab_size', 'eot'}
        if not (isinstance(self.meta, dict) and fields <= self.meta.keys()):
            command = prepare_command(data_dir, tokens_wanted, **(hint or {}))
            raise ValueError(f"{meta_path} is not the meta.json of a prepared dataset (tokenizer, "
                             f"vocab_size, eot): run `{command}` again")
        self.shards = [read_shard(p) for p in files]
        # only the first `limit` tokens (a small corpus to over-fit, for regularization studies)
        if limit:
            ends = np.minimum(np.cumsum([len(s) for s in self.shards]), limit)
            self.shards = [s[:e - b] for s, b, e in
                           zip(self.shards, np.concatenate([[0], ends[:-1]]), ends) if e > b]
        self.sizes = np.array([len(s) for s in self.shards], dtype=np.int64)
        self.eot = self.meta['eot']

    def __len__(self):
        return int(self.sizes.sum())

    def batch(self, batch_size, T, rng):
        """batch_size random windows of T+1 tokens -> inputs and targets, int64 (B, T) each."""
        ok = self.sizes > T
        if not ok.any():
            raise ValueError(f"every shard holds {self.sizes.max()} tokens or fewer, too few for "
                             f"windows of {T + 1}")
        shard = rng.choice(len(self.shards), size=batch_size,
                           p=ok * self.sizes / (ok * self.sizes).sum())
        rows = []
        for s in shard:
            i = rng.integers(0, self.sizes[s] - T)
            rows.append(np.asarray(self.shards[s][i:i + T + 1], dtype=np.int64))
        xy = torch.from_numpy(np.stack(rows))
        return xy[:, :-1], xy[:, 1:]

    def doc_spans(self):
        """(shard, start, end) of every document: the tokens between eot tokens, eot excluded."""
        for i, shard in enumerate(self.shards):
            start = 0
            for end in np.flatnonzero(np.asarray(shard) == self.eot):
                if end > start:
                    yield i, start, int(end)
                start = int(end) + 1

    def long_windows(self, length, n, per_document=None):
        """Up to n windows of length+1 tokens that never cross a document boundary, for
        per-position losses: the first window of every long enough document (it starts at the
        document's first token), then the second of each, and so on, at most per_document from
        one document. (n, length+1) int64, or None if no document is long enough."""
        spans = [s for s in self.doc_spans() if s[2] - s[1] > length]
        picks = []
        for j in range(min(max((b - a) // (length + 1) for _, a, b in spans) if spans else 0,
                           per_document or 1 << 62)):
            picks += [(i, a + j * (length + 1)) for i, a, b in spans
                      if a + (j + 1) * (length + 1) <= b]
        rows = [np.asarray(self.shards[i][a:a + length + 1], dtype=np.int64) for i, a in picks[:n]]
        return torch.from_numpy(np.stack(rows)) if rows else None


def planned(data_dir, needed=True):
    """What a dry run (train.py --dry_run) knows of data_dir without its shards: its meta.json's
    tokenizer and vocabulary if it is there, else those of the tokenizer its name says (byte,
    gpt2) -> an object with .meta. needed=False (a CPT run, which takes its source's): {} if
    neither."""
    path = os.path.join(data_dir, 'meta.json')
    if os.path.exists(path):
        with open(path) as f:
            meta = json.load(f)
    elif os.path.basename(os.path.normpath(data_dir)) in ('byte', 'gpt2'):
        tok = Tokenizer({'kind': os.path.basename(os.path.normpath(data_dir))})
        meta = {'tokenizer': tok.spec, 'vocab_size': tok.n_vocab}
    elif needed:
        raise SystemExit(f"a dry run needs the vocabulary: {path} is not there, and "
                         f"{data_dir} names no tokenizer (byte, gpt2); set vocab_size")
    else:
        meta = {}
    return types.SimpleNamespace(meta=meta)


def training_data(c, dry_run=False, say=print):
    """train.py's data for its config c -> (train, val): a symbol task (tasks.py), both splits
    one object; or data_dir's two splits, each with a shard longer than block_size, with
    niah_mix of the training sequences NIAH-1 documents (ruler.NiahMixture; validation stays
    language alone); or, for a dry run, what planned() knows. SystemExit says what to do."""
    scratch = c['init_from'] == 'scratch'
    if c['task'] != 'lm':
        import tasks  # the symbol tasks (docs/study.md, the paper's Copy)
        try:
            data = tasks.from_config(c)
        except ValueError as e:
            raise SystemExit(f"config error: {e}")
        say(f"data: the {c['task']} task, {c['task_vocab']} symbols, {tasks.LENGTHS[c['task']]} "
            f"{c['task_min_len']}-{c['task_max_len']}, sequences padded to {data.block_size}")
        return data, data
    if dry_run:  # the vocabulary alone: the data's meta.json, else its tokenizer's
        return planned(c['data_dir'], c['vocab_size'] is None and scratch), None
    data_dir, block_size = c['data_dir'], c['block_size']
    hint = {'source': None if scratch or c['init_from'] == 'resume' else c['init_from']}
    try:
        train, val = (TokenData(data_dir, 'train', c['train_tokens'], c['max_tokens'], hint),
                      TokenData(data_dir, 'val', hint=hint))
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(str(e))
    for split, d in (('train', train), ('val', val)):
        if d.sizes.max() <= block_size:
            raise SystemExit(f"config error: block_size = {block_size}, but no {split} shard of "
                             f"{data_dir} holds more than {d.sizes.max():,} tokens: windows of "
                             f"block_size + 1 do not fit; use a shorter block_size")
    if c['niah_mix']:
        from ruler import NiahMixture  # RULER's generators, only for this (eval_niah.py's prompts)
        try:
            lengths = [block_size * (12 + i) // 16 for i in range(5)]
            train = NiahMixture(train, c['niah_mix'], Tokenizer(train.meta['tokenizer']), lengths,
                                c['seed'], c['niah_task'])
        except ValueError as e:
            raise SystemExit(f"config error: {e}")
        say(f"data: {c['niah_mix']:.0%} of the sequences are NIAH-1 documents ({c['niah_task']}), "
            f"the loss on the answer")
    epochs = f"; {c['max_tokens'] / len(train):.1f} epochs" if c['train_tokens'] else ""
    say(f"data: {data_dir}, {len(train):,} train / {len(val):,} val tokens; tokenizer "
        f"{train.meta['tokenizer']}{epochs}")
    return train, val


def micro_batches(tokens_per_batch, block_size, world, batch_size, say=print):
    """A step's tokens_per_batch // block_size sequences go in micro-batches of the largest size up
    to batch_size that splits them evenly over the `world` processes -> (micro-batch size,
    micro-steps), said if it is not batch_size. SystemExit if the sequences do not split over the
    processes."""
    sequences = tokens_per_batch // block_size
    if tokens_per_batch % block_size or sequences < 1:
        raise SystemExit(f"config error: tokens_per_batch ({tokens_per_batch}) must be a positive "
                         f"multiple of block_size ({block_size})")
    if sequences % world:
        counts = ', '.join(str(n) for n in range(1, sequences + 1) if sequences % n == 0)
        raise SystemExit(f"config error: the {sequences} sequences of a step (tokens_per_batch / "
                         f"block_size) do not split over {world} processes: use a process count "
                         f"that divides {sequences} ({counts}) or another tokens_per_batch")
    per_process = sequences // world
    micro = max(b for b in range(1, min(batch_size, per_process) + 1) if per_process % b == 0)
    if micro < batch_size:
        say(f"note: micro-batches of {micro} sequences, the largest up to batch_size = "
            f"{batch_size} that splits the {per_process} per process evenly; a run with other "
            f"micro-batches has other batches and masks")
    return micro, per_process // micro


# the streams of batch_rng: batch_rng(seed, TRAIN, step, micro-batch), batch_rng(seed, VAL, i)
TRAIN, VAL = 0, 1


def batch_rng(seed, *keys):
    """A numpy Generator determined by (seed, *keys): the batch of step s is the same whether the
    run went straight through or was resumed, with no sampler state to save."""
    return np.random.default_rng([seed, *keys])
