"""
RULER (Hsieh et al. 2024, NVIDIA/RULER) offline: its prompts, needles and haystacks, the sizing
of a prompt to a target length with the model's own tokenizer, RULER's metrics, and the small
harness that eval_niah.py and eval_ruler.py share (greedy answers, resumable per-sample JSONL).
The template strings below are RULER's, character for character (scripts/data/synthetic/constants.py,
niah.py); for base models a prompt is the task template followed by the answer prefix.
"""

import json
import os
import random
import re
import uuid
from contextlib import nullcontext

import torch

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
NIAH_TEMPLATE = ("Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
                 "I will quiz you about the {type_needle_v} afterwards.\n{context}\n"
                 "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?")
NIAH_ANSWER_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
TOKENS_TO_GENERATE = {'niah': 128}

# RULER's scripts/synthetic.yaml, the niah tasks
TASKS = {
    'niah_single_1': dict(type_haystack='noise', type_needle_k='words', type_needle_v='numbers'),
}


# -----------------------------------------------------------------------------
# random keys and values

_words = None


def random_value(kind, rng):
    """A needle key or value as RULER draws them: 7-digit numbers, adjective-noun words from
    wonderwords' lists, or uuid4 strings. (RULER picks from the sorted list of all 6.2M
    adjective-noun pairs; picking the two halves independently is the same distribution.)"""
    global _words
    if kind == 'numbers':
        return str(rng.randint(10 ** 6, 10 ** 7 - 1))
    if kind == 'words':
        if _words is None:
            from wonderwords import random_word
            _words = (random_word._get_words_from_text_file('adjectivelist.txt'),
                      random_word._get_words_from_text_file('nounlist.txt'))
        return f"{rng.choice(_words[0])}-{rng.choice(_words[1])}"
    if kind == 'uuids':
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise ValueError(f"unknown needle type {kind!r}")


# -----------------------------------------------------------------------------
# needle in a haystack

def niah(num_haystack, rng, type_haystack='noise', type_needle_k='words', type_needle_v='numbers',
         num_needle_k=1, num_needle_v=1, num_needle_q=1, depth=None, seed=42):
    """One NIAH prompt with num_haystack haystack lines -> (text ending with the answer prefix,
    answers). The needles go at random lines, or, for a single needle, at `depth` percent of the
    lines (the classic depth x length view)."""
    num_needle_k = max(num_needle_k, num_needle_q)
    keys, values, needles = [], [], []
    for _ in range(num_needle_k):
        keys.append(random_value(type_needle_k, rng))
        values.append([random_value(type_needle_v, rng) for _ in range(num_needle_v)])
        needles += [NEEDLE.format(type_needle_v=type_needle_v, key=keys[-1], value=v) for v in values[-1]]
    random.Random(seed).shuffle(needles)  # RULER shuffles with its fixed seed

    if type_haystack == 'noise':
        lines = [NOISE] * num_haystack
    elif type_haystack == 'needle':  # every line a distractor needle
        lines = [NEEDLE.format(type_needle_v=type_needle_v, key=random_value(type_needle_k, rng),
                               value=random_value(type_needle_v, rng)) for _ in range(num_haystack)]
    else:
        raise ValueError(f"unknown haystack {type_haystack!r}")
    if depth is not None:
        assert len(needles) == 1, "a needle depth is for a single needle"
        positions = [round(depth / 100 * num_haystack)]
    else:
        positions = sorted(rng.sample(range(num_haystack), len(needles)), reverse=True)
    for i, needle in zip(positions, needles):  # from the last position, so earlier ones stay valid
        lines.insert(i, needle)

    asked = rng.sample(range(num_needle_k), num_needle_q)
    queries, answers = [keys[i] for i in asked], [v for i in asked for v in values[i]]
    query = ', '.join(queries[:-1]) + ', and ' + queries[-1] if len(queries) > 1 else queries[0]
    template = NIAH_TEMPLATE + NIAH_ANSWER_PREFIX
    if num_needle_q * num_needle_v == 1:  # RULER's wording for a single answer
        template = template.replace('Some', 'A').replace('are all', 'is').replace('are', 'is').replace('answers', 'answer')
        type_needle_v = type_needle_v[:-1]
    return template.format(type_needle_v=type_needle_v, context='\n'.join(lines), query=query), answers


def fit(make, tokenizer, max_length, tokens_to_generate):
    """RULER's sizing: the largest haystack size n for which make(n)'s prompt plus the tokens to
    generate fit max_length tokens of the model's tokenizer (found by doubling, then bisection)."""
    def fits(n):
        return len(tokenizer.encode(make(n)[0])) + tokens_to_generate <= max_length
    if not fits(1):
        raise ValueError(f"{max_length} tokens are too few for this task: its prompt with a one-unit haystack and "
                         f"{tokens_to_generate} tokens to generate take {len(tokenizer.encode(make(1)[0])) + tokens_to_generate}")
    lo, hi = 1, 2
    while fits(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:  # fits(lo), not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def sample(make, size, tokenizer, max_length, tokens_to_generate):
    """One prompt of at most max_length tokens with the tokens to generate. A sample that
    overflows (its random needles tokenize longer) is redrawn one unit smaller; RULER steps down
    by 25 lines (500 essay words), which with a byte-level tokenizer would cost 2K tokens."""
    while True:
        text, answers = make(size)
        if len(tokenizer.encode(text)) + tokens_to_generate <= max_length or size == 1:
            return text, answers
        size -= 1


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
# the harness

def predict(model, tokenizer, text, max_new_tokens, device, chunk_size=1024, autocast=None):
    """The model's greedy continuation of text: chunked prefill through its cache, at most
    max_new_tokens, cut at its end-of-text token."""
    idx = torch.tensor([tokenizer.encode(text)], device=device)
    with torch.no_grad(), autocast or nullcontext():
        out = model.generate(idx, max_new_tokens, eos_id=tokenizer.eot, chunk_size=chunk_size)[0, idx.size(1):].tolist()
    if tokenizer.eot in out:
        out = out[:out.index(tokenizer.eot)]
    return tokenizer.decode(out)


class Results:
    """Per-sample results in a JSONL file, appended as they come: an interrupted run continues
    where it stopped, and no sample is scored twice."""

    def __init__(self, path):
        self.path, self.rows = path, {}
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    if line.strip():
                        row = json.loads(line)
                        self.rows[row['id']] = row

    def __contains__(self, id):
        return id in self.rows

    def add(self, row):
        self.rows[row['id']] = row
        with open(self.path, 'a') as f:
            f.write(json.dumps(row) + '\n')


def length_label(n):
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)
