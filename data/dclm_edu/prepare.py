"""
DCLM-Edu (HuggingFaceTB/dclm-edu: DCLM web text filtered for educational value) as token shards,
for the paper-scale from-scratch runs. Rows have a `text` column (the document) and metadata
columns (url, scores, ...), which are ignored. The dataset is streamed, never downloaded whole:

    # paper scale
    python data/dclm_edu/prepare.py --tokenizer=gpt2 --max_tokens=40e9
    python data/dclm_edu/prepare.py --tokenizer=hf --tokenizer_path=path/to/tokenizer.json \\
        --eot='<|endoftext|>'
    # local files, same schema
    python data/dclm_edu/prepare.py --source='shards/*.parquet' --tokenizer=byte

writes data/dclm_edu/<tokenizer>/{val_000000.bin, train_000000.bin, train_000001.bin, ...,
meta.json}. The first --val_docs documents are the validation split, the rest (up to
--max_tokens) train. The paper does not say which tokenizer its from-scratch models use; GPT-2's
BPE is our guess.
"""

import argparse
import json
import os
import sys

from tqdm import tqdm

# the repository root, for tokens.py
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))  # data/stream.py
from stream import ShardWriter, add_stream_args, open_stream  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_stream_args(parser, source='HuggingFaceTB/dclm-edu')
    parser.add_argument('--val_docs', type=int, default=10_000,
                        help='the first documents, held out for validation')
    parser.add_argument('--shard_tokens', type=lambda s: int(float(s)), default=100_000_000)
    parser.add_argument('--max_tokens', type=lambda s: int(float(s)), default=None,
                        help='train tokens, e.g. 40e9; default: all')
    args = parser.parse_args()
    tok, out_dir, texts = open_stream(parser, args, os.path.dirname(os.path.abspath(__file__)))

    val = ShardWriter(out_dir, 'val', args.shard_tokens, tok.n_vocab)
    train = ShardWriter(out_dir, 'train', args.shard_tokens, tok.n_vocab)
    budget = args.max_tokens
    bar = tqdm(total=args.max_tokens, unit='tok', unit_scale=True, desc='train tokens')
    seen = 0
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
                    # exactly max_tokens: the last document may be cut
                    ids = ids[:budget - train.tokens]
                train.add(ids)
                bar.update(len(ids))
                if budget is not None and train.tokens >= budget:
                    break
            seen += 1
    bar.close()

    stats = {'val': val.close(), 'train': train.close()}
    if stats['train']['tokens'] == 0:
        print(f"warning: no train documents (the source has {seen} documents, "
              f"--val_docs={args.val_docs})")
    # meta.json last: TokenData refuses a folder without it, so an interrupted run is never mistaken
    # for a finished one
    meta = {'tokenizer': tok.spec, 'vocab_size': tok.n_vocab, 'eot': tok.eot, 'source': args.source,
            'val_docs': args.val_docs, 'shard_tokens': args.shard_tokens,
            'max_tokens': args.max_tokens, **stats}
    with open(os.path.join(out_dir, 'meta.json'), 'w') as f:
        json.dump(meta, f, indent=2)
    for split, s in stats.items():
        print(f"{split}: {s['documents']:,} documents, {s['tokens']:,} tokens, "
              f"{s['shards']} shards")
    print(f"wrote {out_dir}")


if __name__ == '__main__':
    main()
