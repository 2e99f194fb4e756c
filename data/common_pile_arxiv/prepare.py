"""
Long arXiv papers from the Common Pile (common-pile/arxiv_papers; rows with a `text` column),
as a validation shard for per-position cross-entropy beyond the training length (the paper's
"ArXiv papers" curves, Figures 4 and 6). Only papers of at least --min_tokens tokens are kept.

    python data/common_pile_arxiv/prepare.py --tokenizer=gpt2 --min_tokens=32769 --docs=64
    # local files
    python data/common_pile_arxiv/prepare.py --source='papers/*.jsonl.gz' --tokenizer=byte

writes data/common_pile_arxiv/<tokenizer>/{val_000000.bin, meta.json}; then
    python eval_loss.py --ckpt=... --data_dir=data/common_pile_arxiv/gpt2 --max_length=32768
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
    add_stream_args(parser, source='common-pile/arxiv_papers')
    parser.add_argument('--min_tokens', type=int, default=32769,
                        help='keep papers at least this long (eot excluded)')
    parser.add_argument('--docs', type=int, default=64, help='stop after this many papers')
    parser.add_argument('--max_scanned', type=int, default=1_000_000,
                        help='give up after reading this many papers')
    args = parser.parse_args()
    tok, out_dir, texts = open_stream(parser, args, os.path.dirname(os.path.abspath(__file__)))

    val = ShardWriter(out_dir, 'val', 1 << 62, tok.n_vocab)  # one shard: the documents stay whole
    scanned, bar = 0, tqdm(total=args.docs, unit='paper',
                           desc=f'papers of {args.min_tokens}+ tokens')
    while val.documents < args.docs and scanned < args.max_scanned:
        batch = [t for _, t in zip(range(args.batch_docs), texts)]
        if not batch:
            break
        scanned += len(batch)
        for ids in tok.encode_batch(batch):
            if len(ids) >= args.min_tokens and val.documents < args.docs:
                val.add(ids + [tok.eot])
                bar.update(1)
    bar.close()
    if val.documents == 0:
        raise SystemExit(f"none of the {scanned} papers read has {args.min_tokens} tokens: "
                         f"lower --min_tokens")
    stats = val.close()
    with open(os.path.join(out_dir, 'meta.json'), 'w') as f:
        json.dump({'tokenizer': tok.spec, 'vocab_size': tok.n_vocab, 'eot': tok.eot,
                   'source': args.source, 'min_tokens': args.min_tokens, 'scanned': scanned,
                   'val': stats}, f, indent=2)
    print(f"val: {stats['documents']} papers of at least {args.min_tokens} tokens "
          f"({stats['tokens']:,} tokens), from {scanned} read; wrote {out_dir}")


if __name__ == '__main__':
    main()
