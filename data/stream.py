"""
The streaming side of data/*/prepare.py for the large corpora (DCLM-Edu, Common Pile arXiv): a
dataset's text column streamed from the hub or local files (never downloaded whole), the
scripts' shared arguments, and the writer that cuts the token stream into shards (tokens.py's
format).
"""

import glob
import os

import numpy as np

import checkpoint
from tokens import EOT, Tokenizer, eos_token, write_shard


def stream_texts(source):
    """The `text` column of a dataset, streamed (never downloaded whole): local
    .parquet/.json/.jsonl files or globs (also compressed), else a Hugging Face hub name or a local
    folder."""
    from datasets import load_dataset  # only the prepare scripts need it
    name = source.lower()
    for ext in ('.gz', '.bz2', '.xz', '.zst', '.zstd'):
        name = name.removesuffix(ext)
    fmt = {'.parquet': 'parquet', '.json': 'json', '.jsonl': 'json'}.get(os.path.splitext(name)[1])
    ds = load_dataset(fmt, data_files=source, split='train', streaming=True) if fmt else \
        load_dataset(source, split='train', streaming=True)
    return (row['text'] for row in ds.select_columns(['text']))


class ShardWriter:
    """Cuts one split's token stream into shards {split}_000000.bin, ... of exactly shard_tokens
    (the last one shorter). Documents may straddle two shards: the loader samples windows within
    a shard, so a document cut at a boundary only loses the windows that would cross it."""

    def __init__(self, out_dir, split, shard_tokens, vocab_size):
        self.out_dir, self.split = out_dir, split
        self.shard_tokens, self.vocab_size = shard_tokens, vocab_size
        self.buf, self.buffered, self.documents, self.tokens, self.shards = [], 0, 0, 0, 0

    def add(self, ids):
        self.buf.append(np.asarray(ids, dtype=np.uint32))
        self.buffered += len(ids)
        self.tokens += len(ids)
        self.documents += 1
        if self.buffered >= self.shard_tokens:
            stream = np.concatenate(self.buf)
            while len(stream) >= self.shard_tokens:
                self.write(stream[:self.shard_tokens])
                stream = stream[self.shard_tokens:]
            self.buf, self.buffered = [stream], len(stream)

    def write(self, tokens):
        path = os.path.join(self.out_dir, f'{self.split}_{self.shards:06d}.bin')
        write_shard(path, tokens, self.vocab_size)
        self.shards += 1

    def close(self):
        if self.buffered:
            self.write(np.concatenate(self.buf))
            self.buf, self.buffered = [], 0
        return {'documents': self.documents, 'tokens': self.tokens, 'shards': self.shards}


def add_stream_args(parser, source, tokenizer='gpt2'):
    """The arguments of the prepare scripts that stream a text dataset (data/dclm_edu,
    data/common_pile_arxiv)."""
    parser.add_argument('--source', default=source,
                        help='hub name, local folder, or .parquet/.jsonl files (globs ok)')
    parser.add_argument('--tokenizer', default=tokenizer, choices=['byte', 'gpt2', 'hf'])
    parser.add_argument('--tokenizer_path', default=None,
                        help='hf: tokenizer.json or its folder; gpt2: a .tiktoken file')
    parser.add_argument('--eot', default=None,
                        help="hf: the end-of-text token string; default: the eos_token of the "
                             f"tokenizer_config.json beside tokenizer.json, else {EOT}")
    parser.add_argument('--out_dir', default=None, help='default: data/<dataset>/<tokenizer>')
    parser.add_argument('--batch_docs', type=int, default=1024,
                        help='documents per encode_batch call')
    parser.add_argument('--overwrite', action='store_true',
                        help='delete the shards already in out_dir')


def open_stream(parser, args, dataset_dir):
    """-> (tokenizer, out_dir, texts) for add_stream_args' arguments. Refuses an out_dir that holds
    shards already (they would be read as part of the new splits) unless --overwrite deletes
    them."""
    spec = {'kind': args.tokenizer}
    if args.tokenizer == 'hf':
        if not args.tokenizer_path:
            parser.error('--tokenizer=hf needs --tokenizer_path')
        folder = (args.tokenizer_path if os.path.isdir(args.tokenizer_path)
                  else os.path.dirname(args.tokenizer_path))
        spec.update(path=args.tokenizer_path, eot=args.eot or eos_token(folder) or EOT)
    elif args.tokenizer == 'gpt2' and args.tokenizer_path:
        spec['path'] = args.tokenizer_path
    tok = Tokenizer(spec)
    out_dir = args.out_dir or os.path.join(dataset_dir, args.tokenizer)
    checkpoint.check_output(out_dir, True, os.path.isdir, 'prepare.py')  # not a run's, writable
    old = sorted(glob.glob(os.path.join(out_dir, '*.bin'))
                 + glob.glob(os.path.join(out_dir, 'meta.json')))
    if old and not args.overwrite:
        raise SystemExit(f"{out_dir} already holds {len(old)} shard/meta files "
                         f"({os.path.basename(old[0])}, ...): pass --overwrite to replace them, "
                         f"or choose another --out_dir")
    for f in old:
        os.remove(f)
    os.makedirs(out_dir, exist_ok=True)
    return tok, out_dir, stream_texts(args.source)
