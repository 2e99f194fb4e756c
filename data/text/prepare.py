"""
Any text as token shards, nanoGPT's shakespeare_char/prepare.py for your own input.txt: one or
more text files, cut into documents where you say, the last documents held out for validation.

    python data/text/prepare.py --input=input.txt                   # byte level
    python data/text/prepare.py --input="['a.txt', 'b.txt']" --tokenizer=gpt2 --doc_sep='\\n\\n\\n'
    python data/text/prepare.py --input=some/folder --suffix=.py    # each file a document
    python train.py configs/quickstart.py --data_dir=data/text/byte --out_dir=out/mine

writes data/text/<tokenizer>/{train.bin, val.bin, meta.json} (or --out_dir). Each file is a
document unless --doc_sep cuts it further; the last --val_frac of the documents (at least one) are
validation, and a single document is cut at 1 - val_frac of its characters instead. The long-context
evaluations read whole validation documents: keep some 16x the training length (2048 tokens for
the quick start's 128) or longer. The format: each shard is a header of 256 int64 (a magic number,
the version, the bytes per token, the token count) and then the token ids (uint16, or uint32 for
vocabularies over 65,536), every document followed by the tokenizer's end-of-text id; meta.json
holds the tokenizer spec, vocab_size and eot (tokens.py's TokenData reads both).
"""

import argparse
import ast
import glob
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
import checkpoint  # noqa: E402
from tokens import Tokenizer, write_documents  # noqa: E402


def documents(paths, sep):
    """The documents of the files, in order: each file, cut at sep if given; empty ones dropped."""
    docs = []
    for path in paths:
        with open(path, encoding='utf-8', errors='replace') as f:  # (bad bytes: U+FFFD)
            text = f.read()
        docs += [d.strip() for d in (text.split(sep) if sep else [text]) if d.strip()]
    return docs


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--input', required=True,
                        help="a text file, a list of them (\"['a', 'b']\"), or a folder: its files "
                        "ending in --suffix, sorted, at any depth")
    parser.add_argument('--suffix', default='.txt', help="a folder's files to take")
    parser.add_argument('--exclude', default='[]', help="a folder's files whose path has one "
                        "of these folders are left out: \"['site-packages']\"")
    parser.add_argument('--tokenizer', default='byte', choices=['byte', 'gpt2'])
    parser.add_argument('--doc_sep', default='', help="cut documents at this string "
                        "(escapes such as \\n work); default: one document per file")
    parser.add_argument('--val_frac', type=float, default=0.1)
    parser.add_argument('--out_dir', default=None, help='default: data/text/<tokenizer>')
    args = parser.parse_args()
    paths = ast.literal_eval(args.input) if args.input.startswith('[') else [args.input]
    if len(paths) == 1 and os.path.isdir(paths[0]):
        exclude = set(ast.literal_eval(args.exclude))
        paths = sorted(p for p in glob.glob(os.path.join(paths[0], '**', f'*{args.suffix}'),
                                             recursive=True)
                       if not exclude & set(os.path.normpath(p).split(os.sep)))
        if not paths:
            sys.exit(f"no file ending in {args.suffix} in {args.input}: give --suffix")
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        sys.exit(f"no such file: {', '.join(missing)}: give --input=<a text file> (or a list)")
    if not 0 < args.val_frac < 1:
        sys.exit(f"--val_frac must lie in (0, 1), got {args.val_frac}")
    sep = args.doc_sep.encode().decode('unicode_escape')  # '\n\n' typed on a command line
    docs = documents(paths, sep)
    if not docs:
        sys.exit(f"no text in {', '.join(paths)}")
    if len(docs) == 1:  # one document: its end is the validation text
        cut = int(len(docs[0]) * (1 - args.val_frac))
        docs = [docs[0][:cut], docs[0][cut:]]
    n_val = max(1, round(len(docs) * args.val_frac))
    out_dir = args.out_dir or os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                           args.tokenizer)
    checkpoint.check_output(out_dir, True, os.path.isdir, 'prepare.py')  # not a run's, writable
    os.makedirs(out_dir, exist_ok=True)
    tok = Tokenizer({'kind': args.tokenizer})
    ids = tok.encode_batch(docs)
    write_documents(out_dir, tok, {'train': ids[:len(ids) - n_val], 'val': ids[len(ids) - n_val:]},
                    source=[os.path.abspath(p) for p in paths])

if __name__ == '__main__':
    main()
