"""
DCLM-Edu (HuggingFaceTB/dclm-edu: DCLM web text filtered for educational value) as token shards,
for the paper-scale from-scratch runs. Rows have a `text` column (the document) and metadata
columns (url, scores, ...), which are ignored. The dataset is streamed, never downloaded whole:

    python data/dclm_edu/prepare.py --tokenizer=gpt2 --max_tokens=40e9          # paper scale
    python data/dclm_edu/prepare.py --tokenizer=hf --tokenizer_path=path/to/tokenizer.json --eot='<|endoftext|>'
    python data/dclm_edu/prepare.py --source='shards/*.parquet' --tokenizer=byte   # local files, same schema

writes data/dclm_edu/<tokenizer>/{val_000000.bin, train_000000.bin, train_000001.bin, ..., meta.json}.
The first --val_docs documents are the validation split, the rest (up to --max_tokens) train.
The paper does not say which tokenizer its from-scratch models use; GPT-2's BPE is our guess.
"""

import argparse
import glob
import json
import os
import sys

import numpy as np
from datasets import load_dataset
from tqdm import tqdm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
from tokens import EOT, Tokenizer, write_shard  # noqa: E402

LOCAL_FORMATS = {'.parquet': 'parquet', '.json': 'json', '.jsonl': 'json'}  # also with .gz/.zst/... on top


def stream_texts(source):
    """The `text` column of source: local files/globs by extension, else a hub name or a folder."""
    name = source.lower()
    for ext in ('.gz', '.bz2', '.xz', '.zst', '.zstd'):
        name = name.removesuffix(ext)
    fmt = LOCAL_FORMATS.get(os.path.splitext(name)[1])
    if fmt:
        ds = load_dataset(fmt, data_files=source, split='train', streaming=True)
    else:
        ds = load_dataset(source, split='train', streaming=True)
    return (row['text'] for row in ds.select_columns(['text']))


class ShardWriter:
    """Cuts one split's token stream into shards of exactly shard_tokens (the last one shorter).
    Documents may straddle two shards: the loader samples windows within a shard, so a document
    cut at a boundary only loses the windows that would cross it."""

    def __init__(self, out_dir, split, shard_tokens, vocab_size):
        self.out_dir, self.split, self.shard_tokens, self.vocab_size = out_dir, split, shard_tokens, vocab_size
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
        write_shard(os.path.join(self.out_dir, f'{self.split}_{self.shards:06d}.bin'), tokens, self.vocab_size)
        self.shards += 1

    def close(self):
        if self.buffered:
            self.write(np.concatenate(self.buf))
            self.buf, self.buffered = [], 0
        return {'documents': self.documents, 'tokens': self.tokens, 'shards': self.shards}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--source', default='HuggingFaceTB/dclm-edu', help='hub name, local folder, or .parquet/.jsonl files (globs ok)')
    parser.add_argument('--tokenizer', default='gpt2', choices=['byte', 'gpt2', 'hf'])
    parser.add_argument('--tokenizer_path', default=None, help='hf: tokenizer.json or its folder; gpt2: a .tiktoken file')
    parser.add_argument('--eot', default=EOT, help='hf: the end-of-text token string')
    parser.add_argument('--out_dir', default=None, help='default: data/dclm_edu/<tokenizer>')
    parser.add_argument('--val_docs', type=int, default=10_000, help='the first documents, held out for validation')
    parser.add_argument('--shard_tokens', type=lambda s: int(float(s)), default=100_000_000)
    parser.add_argument('--max_tokens', type=lambda s: int(float(s)), default=None, help='train tokens, e.g. 40e9; default: all')
    parser.add_argument('--batch_docs', type=int, default=1024, help='documents per encode_batch call')
    parser.add_argument('--overwrite', action='store_true', help='delete the shards already in out_dir')
    args = parser.parse_args()
    out_dir = args.out_dir or os.path.join(os.path.dirname(os.path.abspath(__file__)), args.tokenizer)

    spec = {'kind': args.tokenizer}
    if args.tokenizer == 'hf':
        if not args.tokenizer_path:
            parser.error('--tokenizer=hf needs --tokenizer_path')
        spec.update(path=args.tokenizer_path, eot=args.eot)
    elif args.tokenizer == 'gpt2' and args.tokenizer_path:
        spec['path'] = args.tokenizer_path
    tok = Tokenizer(spec)

    # old shards would be read as part of the new splits (a split is every {split}*.bin), so never mix them
    old = sorted(glob.glob(os.path.join(out_dir, '*.bin')) + glob.glob(os.path.join(out_dir, 'meta.json')))
    if old and not args.overwrite:
        sys.exit(f"{out_dir} already holds {len(old)} shard/meta files ({os.path.basename(old[0])}, ...): "
                 f"pass --overwrite to replace them, or choose another --out_dir")
    for f in old:
        os.remove(f)
    os.makedirs(out_dir, exist_ok=True)

    val = ShardWriter(out_dir, 'val', args.shard_tokens, tok.n_vocab)
    train = ShardWriter(out_dir, 'train', args.shard_tokens, tok.n_vocab)
    budget = args.max_tokens
    bar = tqdm(total=args.max_tokens, unit='tok', unit_scale=True, desc='train tokens')
    texts, seen = stream_texts(args.source), 0
    while budget is None or train.tokens < budget:
        batch = [t for _, t in zip(range(args.batch_docs), texts)]
        if not batch:
            break
        for ids in tok.encode_batch(batch):
            ids.append(tok.eot)  # every document ends with eot
            if seen < args.val_docs:
                val.add(ids)
            else:
                if budget is not None:
                    ids = ids[:budget - train.tokens]  # exactly max_tokens: the last document may be cut
                train.add(ids)
                bar.update(len(ids))
                if budget is not None and train.tokens >= budget:
                    break
            seen += 1
    bar.close()

    stats = {'val': val.close(), 'train': train.close()}
    if stats['train']['tokens'] == 0:
        print(f"warning: no train documents (the source has {seen} documents, --val_docs={args.val_docs})")
    # meta.json last: TokenData refuses a folder without it, so an interrupted run is never mistaken for a finished one
    meta = {'tokenizer': tok.spec, 'vocab_size': tok.n_vocab, 'eot': tok.eot, 'source': args.source,
            'val_docs': args.val_docs, 'shard_tokens': args.shard_tokens, 'max_tokens': args.max_tokens, **stats}
    with open(os.path.join(out_dir, 'meta.json'), 'w') as f:
        json.dump(meta, f, indent=2)
    for split, s in stats.items():
        print(f"{split}: {s['documents']:,} documents, {s['tokens']:,} tokens, {s['shards']} shards")
    print(f"wrote {out_dir}")


if __name__ == '__main__':
    main()
