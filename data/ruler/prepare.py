"""
RULER's data for eval_ruler.py, fetched once (internet needed), as RULER's own scripts build it:

- essays.json: Paul Graham's essays, RULER's PaulGrahamEssays.json (the haystack of 5 of its 13
  tasks), made as its download_paulgraham_essay.py makes it from the 217 URLs of
  PaulGrahamEssays_URLs.txt (beside this script, copied from NVIDIA/RULER): the 49 .txt essays of
  gkamradt/LLMTest_NeedleInAHaystack first, then the 168 pages of paulgraham.com (the page's
  <font> element through html2text with RULER's settings), each group sorted by file name, the
  texts concatenated with nothing between them. A sorted listing of all the files would
  interleave the two groups: the haystack would not be RULER's.
- english_words.json: RULER's English word list, from which cwe draws beyond wonderwords'
  8166 words (about 111K GPT-2 tokens), checked against its SHA-256.

    pip install beautifulsoup4 html2text   # for the paulgraham.com pages
    python data/ruler/prepare.py

Nothing is written unless every essay downloaded: a missing one would shift every haystack.
"""

import argparse
import hashlib
import json
import os
import urllib.request

from tqdm import tqdm

HERE = os.path.dirname(os.path.abspath(__file__))
RULER = ('https://github.com/NVIDIA/RULER/raw/c3f5e3b4f87f97e048793bb510a3a6b19a46bf3a/'
         'scripts/data/synthetic/json')
# its Git LFS pointer's oid
WORDS_SHA256 = 'affcd6d45fdf3cc843d585c99c97ad615094e760e6c4756b654bab6c73bc2eca'


def page_text(raw):
    """A paulgraham.com page as RULER keeps it: decoded as its script decodes it, the <font>
    element through html2text without images, tables, reference links or code marks."""
    import html2text
    from bs4 import BeautifulSoup
    h = html2text.HTML2Text()
    h.ignore_images = h.ignore_tables = h.escape_all = True
    h.reference_links = h.mark_code = False
    return h.handle(str(BeautifulSoup(raw.decode('unicode_escape', 'utf-8'),
                                      'html.parser').find('font')))


def fetch(url):
    with urllib.request.urlopen(url) as r:
        return r.read()


def write_json(path, obj):
    with open(path + '.tmp', 'w') as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + '.tmp', path)


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--urls', default=os.path.join(HERE, 'PaulGrahamEssays_URLs.txt'),
                        help="RULER's essay URLs")
    parser.add_argument('--words_url', default=f'{RULER}/english_words.json',
                        help="RULER's english_words.json")
    parser.add_argument('--words_sha256', default=WORDS_SHA256)
    parser.add_argument('--out_dir', default=HERE)
    args = parser.parse_args()
    with open(args.urls) as f:
        urls = [line.strip() for line in f if line.strip()]
    if any('.html' in u for u in urls):
        try:
            import bs4  # noqa: F401
            import html2text  # noqa: F401
        except ImportError:
            raise SystemExit("the paulgraham.com pages need beautifulsoup4 and html2text: "
                             "pip install beautifulsoup4 html2text")
    repo, html, failed = {}, {}, []
    for url in tqdm(urls, desc='essays', unit='essay'):
        name = url.split('/')[-1].replace('.html', '.txt')
        try:
            raw = fetch(url)
            if '.html' in url:  # RULER's test for the two sources
                html[name] = page_text(raw)
            else:
                repo[name] = raw.decode('utf-8')
        except Exception as e:  # as RULER, go on, and say which; but write nothing below
            failed.append(url)
            tqdm.write(f"failed: {url} ({e})")
    if failed:
        raise SystemExit(f"{len(failed)} of {len(urls)} essays did not download (above): "
                         f"nothing written; run it again")
    words = fetch(args.words_url)
    if hashlib.sha256(words).hexdigest() != args.words_sha256:
        raise SystemExit(f"{args.words_url} is not RULER's english_words.json "
                         f"(its SHA-256 differs): nothing written")
    text = ''.join(repo[k] for k in sorted(repo)) + ''.join(html[k] for k in sorted(html))
    os.makedirs(args.out_dir, exist_ok=True)
    write_json(os.path.join(args.out_dir, 'essays.json'), {'text': text})
    print(f"wrote {os.path.join(args.out_dir, 'essays.json')}: {len(repo)} + {len(html)} essays, "
          f"{len(text.split()):,} words")
    write_json(os.path.join(args.out_dir, 'english_words.json'), json.loads(words))
    print(f"wrote {os.path.join(args.out_dir, 'english_words.json')}: "
          f"{len(json.loads(words)):,} words")
