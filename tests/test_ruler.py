"""The 13 RULER tasks: RULER's strings and layouts (as its code at c3f5e3b writes them), the fit
to the length with byte and GPT-2 tokenizers and RULER's steps, the reference answers, the data
(essays in RULER's order, its English words), and ruler.evaluate with a test double."""

import collections
import hashlib
import json
import random
import re

import pytest
import torch

import ruler
from tokens import Tokenizer

BYTE, GPT2 = Tokenizer({'kind': 'byte'}), Tokenizer({'kind': 'gpt2'})


def squad(articles):
    return {'data': [{'title': f'article {a}', 'paragraphs': [
        {'context': f"Paragraph {a}.{p}: the river {a}{p} flows north past the town of Town{a}{p}.",
         'qas': [{'question': f"Where does river {a}{p} flow?",
                  'answers': [{'text': 'north'}, {'text': 'to the north'}],
                  'is_impossible': False},
                 {'question': f"Who drank river {a}{p}?", 'answers': [], 'is_impossible': True}]}
        for p in range(3)]} for a in range(articles)]}


def hotpot(questions):
    return [{'question': f"Which city hosts team {i}?", 'answer': f"City{i}",
             'context': [[f"Team {i}", ["Team ", f"{i} plays in City{i}."]],
                         [f"Other {i}", ["Nothing ", "here."]]]}
            for i in range(questions)]


SQUAD, HOTPOT = squad(4), hotpot(6)


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp('qa')
    (d / 'squad.json').write_text(json.dumps(SQUAD))
    (d / 'hotpot.json').write_text(json.dumps(HOTPOT))
    return ruler.Data(squad=str(d / 'squad.json'), hotpotqa=str(d / 'hotpot.json'),
                      say=lambda *a: None)


def strings(task):
    """The fixed strings of a task's prompt (the template and answer prefix around their fields)."""
    kind, args = ruler.TASKS[task]
    template = ruler.KINDS[kind].template + ruler.KINDS[kind].answer_prefix
    if kind == 'niah':
        single = args.get('num_needle_v', 1) * args.get('num_needle_q', 1) == 1
        if single:
            template = template.replace('Some', 'A').replace('are all', 'is').replace('are', 'is')
        v = args['type_needle_v'][:-1] if single else args['type_needle_v']
        template = template.replace('{type_needle_v}', v)
    return [s for s in re.split(r'\{[a-z_]+\}', template) if s.strip()]


@pytest.mark.parametrize('tok,length', [(BYTE, 2048), (BYTE, 8192), (GPT2, 2048), (GPT2, 4096)],
                         ids=['byte2K', 'byte8K', 'gpt2-2K', 'gpt2-4K'])
@pytest.mark.parametrize('task', ruler.SUBSETS['paper'])  # RULER's 13
def test_prompts_fit_and_hold_rulers_strings(task, tok, length, data):
    kind = ruler.TASKS[task][0]
    try:
        text, answers = ruler.prompt(task, tok, length, f'{task}/0', 42, data, {})
    except ValueError as e:
        # 30 repeats of 10 words need more bytes
        assert task == 'cwe' and tok is BYTE and 'too few' in str(e)
        return
    assert all(s in text for s in strings(task))
    n = len(tok.encode(text)) + ruler.TOKENS_TO_GENERATE[kind]
    assert n <= length  # fits
    # fills it (a sample that overflows is redrawn one RULER step smaller: up to 500 essay words,
    # a third of 8K bytes), or holds every document
    assert length * (0.6 if kind == 'niah' else 0.8) < n or (
        kind == 'qa'
        and text.count('\nDocument ') == len(data.qa(ruler.TASKS[task][1]['dataset'])[1]))
    check_answers(task, text, answers)


def check_answers(task, text, answers):
    """The reference answers, recomputed from the prompt text alone."""
    kind, args = ruler.TASKS[task]
    question = text.rsplit('Question:', 1)[-1] if kind != 'niah' else text.rsplit('\n', 1)[-1]
    if kind == 'niah':
        keys = re.findall(r'special magic \w+ for (.+?) mentioned',
                          text.rsplit('\n', 1)[-1])[0].replace(', and ', ', ').split(', ')
        v = args['type_needle_v']
        found = [val for k in keys
                 for val in re.findall(rf"One of the special magic {v} for {re.escape(k)} "
                                       rf"is: (\S+)\.", text)]
        assert (sorted(found) == sorted(answers)
                and len(answers) == args.get('num_needle_v', 1) * args.get('num_needle_q', 1))
        if args['type_haystack'] == 'needle':
            assert all(line.startswith('One of the special magic')
                       for line in text.split('\n')[1:-1])
    elif kind == 'variable_tracking':
        body = text.split('\n\nMemorize and track')[-1]  # after the solved example
        value = re.search(r'assigned the value (\d+) in the text above', body).group(1)
        chain = [re.search(rf'VAR (\w+) = {value}', body).group(1)]
        while (nxt := re.search(rf'VAR (\w+) = VAR {chain[-1]} ', body)):
            chain.append(nxt.group(1))
        assert chain == answers and len(answers) == 5
    elif kind == 'common_words':
        listing = text.rsplit('Below is a numbered list of words.', 1)[-1].split('\nQuestion:')[0]
        counts = collections.Counter(re.findall(r'\d+\. (\S+)', listing))
        top = [w for w, _ in counts.most_common()]
        assert sorted(answers) == sorted(top[:10]) and counts[top[9]] > counts[top[10]]
    elif kind == 'freq_words':
        counts = collections.Counter(
            text.split('coded words. ', 1)[1].split('\nQuestion')[0].split())
        del counts['...']
        assert answers == [w for w, _ in counts.most_common(3)]
    else:
        assert ('Document 1:\n' in text
                and question.strip().startswith(('Where does river', 'Which city hosts team')))
        if task == 'qa_1':
            river = re.search(r'river (\d+) flow', question).group(1)
            assert f"the river {river} flows north" in text and answers == ['north', 'to the north']
        else:
            team = re.search(r'team (\d+)\?', question).group(1)
            assert (f"Team {team}\nTeam {team} plays in City{team}." in text
                    and answers == [f"City{team}"])


def test_cwe_below_4k_uses_rulers_small_counts(data):
    text, answers = ruler.prompt('cwe', BYTE, 2048, 'x', 42, data, {})
    listing = text.rsplit('Below is a numbered list of words.', 1)[-1]
    counts = collections.Counter(re.findall(r'\d+\. (\S+)', listing.split('\nQuestion:')[0]))
    assert {counts[w] for w in answers} == {6} and set(counts.values()) == {6, 1}
    example = text.split('\nQuestion:')[0]
    # the 20-word example
    assert set(collections.Counter(re.findall(r'\d+\. (\S+)', example)).values()) == {3, 1}


def test_vt_has_a_solved_example_first(data):
    text, answers = ruler.prompt('vt', GPT2, 4096, 'x', 42, data, {})
    assert text.count('Memorize and track the chain(s)') == 2
    example = text.split('\n\nMemorize and track')[0]
    names = re.search(r'they are: +(.*)$', example).group(1).split()
    assert len(names) == 5 and all(len(n) == 3 for n in names)  # 3-letter names in the example
    assert not set(names) & set(answers)


def test_errors(data):
    with pytest.raises(SystemExit, match="unknown RULER task 'niah_single_9'"):
        ruler.task_list(['niah_single_1', 'niah_single_9'])
    assert ruler.task_list('synthetic') == [t for t in ruler.SUBSETS['paper']
                                            if not t.startswith('qa')]
    assert len(ruler.task_list('paper')) == 13 and ruler.task_list('vt') == ['vt']
    with pytest.raises(ValueError, match='too few for this task'):
        ruler.prompt('qa_1', BYTE, 64, 'x', 42, data, {})
    missing = ruler.Data(squad='/nonexistent/squad.json', say=lambda *a: None)
    with pytest.raises(SystemExit, match="--squad=/nonexistent/squad.json is not squad's dev JSON"):
        missing.missing('qa_1')  # said in one line, before any sample runs


class Knower:
    """A test double: it answers every prompt with its reference answers (or says nothing)."""

    def __init__(self, answers, silent=False):
        self.answers, self.silent = answers, silent

    def generate(self, idx, max_new_tokens, eos_id=None, chunk_size=1024):
        text = BYTE.decode(idx[0].tolist())
        reply = '' if self.silent else ' ' + ', '.join(self.answers[text]) + '.'
        return torch.cat([idx, torch.tensor([BYTE.encode(reply) + [BYTE.eot]])], dim=1)


def test_harness(data, tmp_path):
    tasks, lengths = ['niah_single_1', 'vt', 'fwe', 'qa_1', 'cwe'], [1024, 2048]
    answers = {}
    for t in tasks:
        for L in lengths:
            for i in range(2):
                try:
                    text, a = ruler.prompt(t, BYTE, L, f"{t}/{L}/{i}", 42, data, {}, index=i)
                    answers[text] = a
                except ValueError:
                    pass
    said = []
    r = ruler.evaluate(Knower(answers), BYTE, ruler.Results(str(tmp_path / 'a.jsonl')), tasks,
                       lengths, 2, 42, data, say=said.append)
    assert (r['too_short'].keys() == {'vt/1024', 'cwe/1024'}
            and any('not run: cwe at 1024' in s for s in said))
    assert (r['scores']['niah_single_1'] == {1024: 100.0, 2048: 100.0}
            and r['scores']['cwe'][2048] == 100.0)
    assert r['average'] == {1024: 100.0, 2048: 100.0} and r['tasks_averaged'] == {1024: 3, 2048: 5}
    silent = ruler.evaluate(Knower(answers, silent=True), BYTE,
                            ruler.Results(str(tmp_path / 'b.jsonl')), tasks, lengths, 2, 42, data,
                            say=said.append)
    assert (silent['average'] == {1024: 0.0, 2048: 0.0}
            and silent['nulls']['fwe'] == {1024: 2, 2048: 2})
    no_qa = ruler.Data(squad='', say=said.append)
    no_qa._cache['squad'] = None  # as if offline
    r = ruler.evaluate(Knower(answers), BYTE, ruler.Results(str(tmp_path / 'c.jsonl')),
                       ['qa_1', 'niah_single_1'], [2048], 1, 42, no_qa, say=said.append)
    assert 'qa_1' in r['skipped'] and 'qa_1' not in r['scores'] and r['tasks_averaged'] == {2048: 1}
    # said before any sample runs
    with pytest.raises(SystemExit, match='no task fits any of the lengths'):
        ruler.evaluate(None, BYTE, ruler.Results(str(tmp_path / 'd.jsonl')), ['vt', 'cwe'], [1024],
                       1, 42, data, say=said.append)


def test_each_task_has_rulers_metric():
    """QA counts a sample right when any reference is in the answer; the others, the fraction
    found."""
    assert ruler.metric('qa_2')("It is north.", ['north', 'to the north']) == 1.0
    for task in ruler.TASKS:
        if not task.startswith('qa'):
            assert ruler.metric(task)("It is north.", ['north', 'to the north']) == 0.5


# -----------------------------------------------------------------------------
# RULER's current code, to the letter (NVIDIA/RULER c3f5e3b, scripts/data/synthetic/*.py)

def test_vt_context_is_rulers_layout(data):
    """variable_tracking.py: noise lines and chain links joined by newlines, each on its own line
    (the link 'VAR B = VAR A ' keeps its trailing space), then '. \\n' -> '.\\n'."""
    text, answers = ruler.variable_tracking(6, random.Random(0), data)
    context = text.split('in the following text.\n\n', 1)[1].split('\nQuestion: ')[0]
    lines = context.split('\n')
    links = [line for line in lines if line.startswith('VAR ')]
    assert lines.count(ruler.NOISE) == 6 and len(links) == 5 and len(lines) == 11
    assert (links[0] == f"VAR {answers[0]} = {links[0].split(' = ')[1]}"
            and links[0].split(' = ')[1].isdigit())
    assert links[1:] == [f"VAR {b} = VAR {a} " for a, b in zip(answers, answers[1:])]
    noise, link = ('The grass is green. The sky is blue. The sun is yellow. Here we go. '
                   'There and back again.', links[1])
    # RULER's "\n".join(sentences)
    expected = '\n'.join(noise if line == ruler.NOISE else line for line in lines)
    assert context == expected
    # no space around a line
    assert f"again.\n{link}\n" in context or context.endswith(link) or context.startswith(link)
    # a link's own trailing space, nothing added
    assert ' \nThe grass' in context or f"{links[-1]}" == lines[-1]


def test_vt_one_shot_example_is_rulers(data):
    """The example: sized to 500 tokens with nothing to generate counted (RULER passes
    tokens_to_generate=0 for it), 3-letter names and value 12345, then renamed per sample."""
    example = ruler.one_shot_vt(GPT2, random.Random(1), data)
    names = example.split('they are: ')[1].split()
    solved = ' ' + ' '.join(names) + '\n'
    assert example.endswith(solved)
    # 500 - 30 to generate would be <= 470
    assert 470 < len(GPT2.encode(example.removesuffix(solved))) <= 500
    assert '= 12345\n' in example and example.count('\n\n') == 1
    assert len(names) == 5 and all(len(n) == 3 and n.isupper() for n in names)
    first, second = (ruler.prompt('vt', GPT2, 4096, f'x{i}', 42, data, sizes := {})[0]
                     for i in range(2))
    shot = [t.split('\n\nMemorize and track')[0] for t in (first, second)]
    names = [set(re.findall(r'\b[A-Z]{3}\b', t.replace('VAR', '')))
             for t in (sizes['vt_icl'], *shot)]
    # renamed and revalued per sample
    assert len({frozenset(n) for n in names}) == 3 and '12345' not in shot[0]
    strip = lambda t: re.sub(r'\b[A-Z]{3}\b|\d{5}', '#', t.replace('VAR', 'var'))  # noqa: E731
    assert strip(shot[0]) == strip(shot[1])  # the same example otherwise (RULER's randomize_icl)
    assert shot[0].count('\n') == strip(sizes['vt_icl']).count('\n') - 1


@pytest.mark.parametrize('task,tok,length,unit', [
    ('niah_multikey_1', BYTE, 8192, 500), ('niah_single_1', GPT2, 4096, 25),
    ('niah_single_1', GPT2, 2048, 5), ('vt', GPT2, 4096, 10), ('vt', GPT2, 2048, 5),
    ('qa_1', BYTE, 4096, 10), ('cwe', GPT2, 8192, 10)])
def test_an_overflowing_sample_shrinks_by_rulers_step(task, tok, length, unit, data, tmp_path,
                                                      monkeypatch):
    """niah.py drops 500 essay words or 25 lines (5 below 4K), variable_tracking.py 10 noise lines
    (5 below 4K), common_words_extraction.py 10 words, qa.py 10 documents, until the sample fits
    (here the fitted size is made two steps too large, so that the sample overflows)."""
    if task == 'qa_1':  # enough documents to overflow 4K bytes
        squad = {'data': [{'title': f'a{a}', 'paragraphs': [
            {'context': f"Paragraph {a}.{p} " + 'text ' * 20,
             'qas': [{'question': f"Q{a}{p}?", 'answers': [{'text': 'text'}],
                      'is_impossible': False}]}
            for p in range(3)]}
            for a in range(40)]}
        (tmp_path / 'squad.json').write_text(json.dumps(squad))
        data = ruler.Data(squad=str(tmp_path / 'squad.json'), say=lambda *a: None)
    kind = ruler.TASKS[task][0]
    asked, make = [], ruler.KINDS[kind].generator
    record = ruler.KINDS[kind]._replace(
        generator=lambda n, *a, **kw: (asked.append(n), make(n, *a, **kw))[1])
    monkeypatch.setitem(ruler.KINDS, kind, record)
    sizes = {}
    ruler.prompt(task, tok, length, 'fit', 42, data, sizes)
    sizes[(task, length)] += 2 * unit
    asked.clear()
    text, _ = ruler.prompt(task, tok, length, 'x', 42, data, sizes)
    assert len(asked) >= 2 and asked[0] == sizes[(task, length)]
    assert [a - b for a, b in zip(asked, asked[1:])] == [unit] * (len(asked) - 1)
    assert len(tok.encode(text)) + ruler.TOKENS_TO_GENERATE[kind] <= length


def test_fwe_is_sized_on_rulers_grid(data):
    """freq_words_extraction.py: a vocabulary of (max_length - 50) // 50 coded words; the word count
    searched from budget // 6 up in steps of budget // 32 (budget: the length less 50 to
    generate), the text with the template within the budget."""
    text, _ = ruler.freq_words(20000, random.Random(0), data, max_length=4096)
    words = set(text.split('coded words. ', 1)[1].split('\nQuestion')[0].split())
    assert len(words) == (4096 - 50) // 50  # 80, with '...'; max_length // 50 would be 81
    sizes = {}
    text, _ = ruler.prompt('fwe', GPT2, 4096, 'x', 42, data, sizes)
    budget = 4096 - 50
    n = sizes[('fwe', 4096)]
    assert (n - budget // 6) % (budget // 32) == 0 and len(GPT2.encode(text)) <= budget


def test_cwe_beyond_wonderwords_draws_rulers_english_words(tmp_path):
    """common_words_extraction.py: more words than wonderwords has come from its
    english_words.json."""
    (tmp_path / 'words.json').write_text(json.dumps({str(i): f"word{i}x" for i in range(12000)}))
    data = ruler.Data(english_words=str(tmp_path / 'words.json'), say=lambda *a: None)
    n = len(set(data.words['noun'] + data.words['adjective'] + data.words['verb']))
    text, answers = ruler.common_words(n + 1, random.Random(0), data, max_length=8192)
    assert all(re.fullmatch(r'word\d+x', w) for w in answers)
    small, _ = ruler.common_words(n, random.Random(0), data, max_length=8192)
    assert 'word1x' not in small.split('\n', 1)[1]
    assert ruler.Data(english_words=str(tmp_path / 'none.json')).english_words is None


def test_the_essay_is_rulers_text_and_a_stand_in_says_so(tmp_path):
    """RULER splits PaulGrahamEssays.json's text as re.sub(r'\\s+', ' ', text).split(' '); without
    it the haystack is Shakespeare's, and evaluate() says which tasks ran on it."""
    (tmp_path / 'essays.json').write_text(
        json.dumps({'text': '\nFirst essay.\n\nIt ends.Second  essay\tstarts.\n'}))
    assert ruler.Data(essay=str(tmp_path / 'essays.json')).essay == [
        '', 'First', 'essay.', 'It', 'ends.Second', 'essay', 'starts.', '']
    said = []
    stand_in = ruler.Data(essay=str(tmp_path / 'none.json'), say=said.append)
    r = ruler.evaluate(Knower({}, silent=True), BYTE, ruler.Results(str(tmp_path / 'r.jsonl')),
                       ['niah_single_1', 'niah_single_2'], [4096], 1, 42, stand_in,
                       say=said.append)
    assert (list(r['stand_in_haystack']) == ['niah_single_2']
            and "Shakespeare" in r['stand_in_haystack']['niah_single_2'])
    assert any('not Paul Graham' in s for s in said)


def test_the_prompt_gets_the_tokenizers_bos_as_in_rulers_wrapper(tmp_path):
    """RULER's Hugging Face wrapper calls tokenizer(prompt), which adds the special tokens of the
    tokenizer's post-processor (a BOS for tokenizers that use one); its sizing does not count
    them."""
    from tokenizers import Tokenizer as HF, models, pre_tokenizers, processors
    hf = HF(models.WordLevel({'<bos>': 0, '<|endoftext|>': 1, 'a': 2, 'b': 3}, unk_token='a'))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.post_processor = processors.TemplateProcessing(single='<bos> $A',
                                                      special_tokens=[('<bos>', 0)])
    hf.save(str(tmp_path / 'tokenizer.json'))
    tok = Tokenizer({'kind': 'hf', 'path': str(tmp_path / 'tokenizer.json')})
    assert tok.encode('a b') == [2, 3] and tok.encode_prompt('a b') == [0, 2, 3]
    assert GPT2.encode_prompt('a b') == GPT2.encode('a b')  # GPT-2's tokenizer adds none

    class Echo:
        def generate(self, idx, max_new_tokens, eos_id=None, chunk_size=1024):
            self.idx = idx
            return torch.cat([idx, torch.tensor([[3, 1]])], dim=1)
    model = Echo()
    assert ruler.predict(model, tok, 'a b', 4, 'cpu') == 'b' and model.idx.tolist() == [[0, 2, 3]]


def test_the_answer_ends_at_a_padding_id():
    """train.py pads the byte vocabulary (257) to 320 rows: a weak model's argmax may be one of
    them, which no tokenizer decodes; the answer ends there, as at eot."""
    class Padded:
        def generate(self, idx, max_new_tokens, eos_id=None, chunk_size=1024):
            return torch.cat([idx, torch.tensor([[52, 50, BYTE.n_vocab, 55, BYTE.eot]])], dim=1)
    assert ruler.predict(Padded(), BYTE, 'The number is', 8, 'cpu') == '42'


# -----------------------------------------------------------------------------
# the prompts themselves, fixed: every task's prompts and answers (sha256 of their JSON, per task)
# as ruler.py made them before its generator kinds became records (issue 29), so that a change of
# a template, a setting, a step or a sizing shows here. A deliberate change updates the hashes.

PROMPTS_SHA256 = {
    'niah_single_1': 'd5506a51b4c8db1d73d39c453af6533f33a11df5d0b56e3665b9cea3caaef96a',
    'niah_single_2': '67a934f623a4fb3e71f7902f117f2c16ff80393e7afc6536f694b330e9024216',
    'niah_single_3': '2a6e2508a853ab80be9e88b7b3a4364d8097830199e11df91b370a7b2d2a934c',
    'niah_multikey_1': 'dc1546bbaddebf05487f5d12251c956db11771287a866b3cdd0fac5226d0062c',
    'niah_multikey_2': '03c3a5112ac58e58f2ca29b8fb825488e69c598ef0f748d8303317ad9d41e109',
    'niah_multikey_3': '084714bedf928e1b990786243b5dc788820e7789afda9f16b94c373705195070',
    'niah_multivalue': 'f680ec045ba28e1241574b5c9e21e6289f048145c7d0f3c7954e8cf7d238323b',
    'niah_multiquery': '35957e932ca32ed525fd4452aa9ca154fc8e971e15b7adae88d6f9007b4deca1',
    'vt': '55068724f6558e8653b66c86daecf39e2676cdab6801631e35a48b758ec46b94',
    'cwe': 'aca43cf9ea973d6cee1bad25cbacbe027068d24da9c91bc5d5d326cb26116340',
    'fwe': '980c838a3cf438183e879f5b224a93163386dfa972a1a2bccdaa21fb2489124a',
    'qa_1': '3e9aaa8b53f4cbf0945c1e906351f3f589ee2d4c43383eaed15cb36c4c51e1a4',
    'qa_2': '82ca724f528cbc2883a65e526dc11967311d34f1e27cf5c6bc5ca4b4e90162ea',
    'niah_single_1/depth': 'e6d7a98480c4d84e9c32e1f74a7a9c186671f44fb146fc66769a3b13a2d1e7f1',
    'niah_single_2/depth': '323066794a4bcae2404011590fa93c236730357f7dfed0346a5f37592f47b33e',
    'cwe/limit': '6d63ee5a792e16f9de7c3dab96f7f8fe7b976fc9f1759fa175a8675139da06ec',
}


class Words:
    """A word-level tokenizer (words and punctuation marks): no tokenizer file, and cwe fits 1K."""

    def encode(self, text):
        return re.findall(r"\w+|[^\w\s]", text)


def test_the_short_niah_is_niah_single_1_in_fewer_bytes(data):
    """niah_single_1_short (the study's Tables 1 and 5 parts): in no RULER subset; a prompt and
    its 16 tokens of answer fill 1x to 16x of 256 bytes; one needle, whose number is the answer,
    among the noise's sentences, at many depths; the prompt ends in the question."""
    assert all('niah_single_1_short' not in tasks for tasks in ruler.SUBSETS.values())
    sizes, depths = {}, set()
    for L in (256, 512, 1024, 4096):
        for i in range(8):
            text, answers = ruler.prompt('niah_single_1_short', BYTE, L, f'short/{i}', 42, data,
                                         sizes)
            assert 0.6 * L < len(BYTE.encode(text)) + 16 <= L
            lines = text.split('\n')
            key = re.fullmatch(r'The magic number for (.+) is', lines[-1])[1]
            needles = [n for n, line in enumerate(lines)
                       if line.startswith('The magic number')][:-1]
            assert len(needles) == 1 and lines[0] == 'Remember the magic number.'
            assert lines[needles[0]] == f'The magic number for {key} is {answers[0]}.'
            assert set(lines[1:-1]) - {lines[needles[0]]} <= set(ruler.sentences(ruler.NOISE))
            depths.add(needles[0] / len(lines))
    assert len(depths) > 16


def test_prompts_are_unchanged(tmp_path):
    """Per task, at 1K and 2K words and seeds 1, 2, 42, three samples as ruler.evaluate makes
    them (one sizes cache; the third with the fitted size half again too large, so that it is
    redrawn smaller by the task's step); niah_single_1/2 at three depths; and cwe with too few words
    for 2K, and its notice. The data is made here: an essay, word lists, and QA sets that hold more
    documents than 1K (qa_1) or fewer (qa_2)."""
    essay = ' '.join(f"Essay sentence {i} says that the {w} is {c}. "
                     + ("\n\n" if i % 7 == 6 else "")
                     for i, (w, c) in enumerate(zip(
                         ['river', 'hill', 'town', 'field', 'tree'] * 40,
                         ['green', 'blue', 'old', 'wide', 'tall', 'quiet'] * 40)))
    for name, obj in (('squad', squad(30)), ('hotpot', hotpot(40)), ('essays', {'text': essay})):
        (tmp_path / f'{name}.json').write_text(json.dumps(obj))
    data = ruler.Data(essay=str(tmp_path / 'essays.json'), squad=str(tmp_path / 'squad.json'),
                      hotpotqa=str(tmp_path / 'hotpot.json'),
                      english_words=str(tmp_path / 'none.json'), say=lambda *a: None)
    data._cache['words'] = {k: [f"{k[:3]}{i}" for i in range(300)]
                            for k in ('adjective', 'noun', 'verb')}

    def samples(task, length, seed, depths=()):
        sizes = {}
        if depths:
            return [ruler.prompt(task, Words(), length, f'{task}/{length}/d{d}', seed, data, sizes,
                                 depth=d)
                    for d in depths]
        out = [ruler.prompt(task, Words(), length, f'{task}/{length}/{i}', seed, data, sizes,
                            index=i)
               for i in range(2)]
        for key in sizes:  # the fitted size, (task, length) (vt's example is the other entry)
            if isinstance(key, tuple):
                sizes[key] = sizes[key] * 3 // 2
        return out + [ruler.prompt(task, Words(), length, f'{task}/{length}/2', seed, data, sizes,
                                   index=2)]

    made = {task: [samples(task, L, s) for L in (1024, 2048) for s in (1, 2, 42)]
            for task in ruler.SUBSETS['paper']}
    made.update({f'{t}/depth': [samples(t, 1024, 42, depths=(0, 37, 100))]
                 for t in ('niah_single_1', 'niah_single_2')})
    said = []  # no English word list, and 120 words: all of them, and a notice
    few = ruler.Data(essay=str(tmp_path / 'essays.json'), english_words=str(tmp_path / 'none.json'),
                     say=said.append)
    few._cache['words'] = {k: [f"{k[:3]}{i}" for i in range(40)]
                           for k in ('adjective', 'noun', 'verb')}
    sizes = {}
    made['cwe/limit'] = [[[ruler.prompt('cwe', Words(), 2048, f'cwe/{i}', 42, few, sizes)
                           for i in range(2)], said]]
    digest = lambda runs: hashlib.sha256(  # noqa: E731
        '\n'.join(map(json.dumps, runs)).encode()).hexdigest()
    assert {t: digest(runs) for t, runs in made.items()} == PROMPTS_SHA256
