"""The 13 RULER tasks: RULER's strings, the fit to the length with byte and GPT-2 tokenizers, the
reference answers, and eval_ruler.py's harness with a test double for the model."""

import collections
import json
import re

import pytest
import torch

import eval_ruler
import ruler
from tokens import Tokenizer

BYTE, GPT2 = Tokenizer({'kind': 'byte'}), Tokenizer({'kind': 'gpt2'})
SQUAD = {'data': [{'title': f'article {a}', 'paragraphs': [
    {'context': f"Paragraph {a}.{p}: the river {a}{p} flows north past the town of Town{a}{p}.",
     'qas': [{'question': f"Where does river {a}{p} flow?", 'answers': [{'text': 'north'}, {'text': 'to the north'}],
              'is_impossible': False},
             {'question': f"Who drank river {a}{p}?", 'answers': [], 'is_impossible': True}]}
    for p in range(3)]} for a in range(4)]}
HOTPOT = [{'question': f"Which city hosts team {i}?", 'answer': f"City{i}",
           'context': [[f"Team {i}", ["Team ", f"{i} plays in City{i}."]], [f"Other {i}", ["Nothing ", "here."]]]}
          for i in range(6)]


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp('qa')
    (d / 'squad.json').write_text(json.dumps(SQUAD))
    (d / 'hotpot.json').write_text(json.dumps(HOTPOT))
    return ruler.Data(squad=str(d / 'squad.json'), hotpotqa=str(d / 'hotpot.json'), say=lambda *a: None)


def strings(task):
    """The fixed strings of a task's prompt (the template and answer prefix around their fields)."""
    kind, args = ruler.TASKS[task]
    template = ''.join(ruler.TEMPLATES[kind])
    if kind == 'niah':
        single = args.get('num_needle_v', 1) * args.get('num_needle_q', 1) == 1
        if single:
            template = template.replace('Some', 'A').replace('are all', 'is').replace('are', 'is')
        v = args['type_needle_v'][:-1] if single else args['type_needle_v']
        template = template.replace('{type_needle_v}', v)
    return [s for s in re.split(r'\{[a-z_]+\}', template) if s.strip()]


@pytest.mark.parametrize('tok,length', [(BYTE, 2048), (BYTE, 8192), (GPT2, 2048), (GPT2, 4096)], ids=['byte2K', 'byte8K', 'gpt2-2K', 'gpt2-4K'])
@pytest.mark.parametrize('task', list(ruler.TASKS))
def test_prompts_fit_and_hold_rulers_strings(task, tok, length, data):
    kind = ruler.TASKS[task][0]
    try:
        text, answers = ruler.prompt(task, tok, length, f'{task}/0', 42, data, {})
    except ValueError as e:
        assert task == 'cwe' and tok is BYTE and 'too few' in str(e)  # 30 repeats of 10 words need more bytes
        return
    assert all(s in text for s in strings(task))
    n = len(tok.encode(text)) + ruler.TOKENS_TO_GENERATE[kind]
    assert n <= length  # fits
    assert length * 0.8 < n or (kind == 'qa' and text.count('\nDocument ') == len(data.qa(ruler.TASKS[task][1]['dataset'])[1]))  # fills it, or holds every document
    check_answers(task, text, answers)


def check_answers(task, text, answers):
    """The reference answers, recomputed from the prompt text alone."""
    kind, args = ruler.TASKS[task]
    question = text.rsplit('Question:', 1)[-1] if kind != 'niah' else text.rsplit('\n', 1)[-1]
    if kind == 'niah':
        keys = re.findall(r'special magic \w+ for (.+?) mentioned', text.rsplit('\n', 1)[-1])[0].replace(', and ', ', ').split(', ')
        v = args['type_needle_v']
        found = [val for k in keys for val in re.findall(rf"One of the special magic {v} for {re.escape(k)} is: (\S+)\.", text)]
        assert sorted(found) == sorted(answers) and len(answers) == args.get('num_needle_v', 1) * args.get('num_needle_q', 1)
        if args['type_haystack'] == 'needle':
            assert all(line.startswith('One of the special magic') for line in text.split('\n')[1:-1])
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
        counts = collections.Counter(text.split('coded words. ', 1)[1].split('\nQuestion')[0].split())
        del counts['...']
        assert answers == [w for w, _ in counts.most_common(3)]
    else:
        assert 'Document 1:\n' in text and question.strip().startswith(('Where does river', 'Which city hosts team'))
        if task == 'qa_1':
            river = re.search(r'river (\d+) flow', question).group(1)
            assert f"the river {river} flows north" in text and answers == ['north', 'to the north']
        else:
            team = re.search(r'team (\d+)\?', question).group(1)
            assert f"Team {team}\nTeam {team} plays in City{team}." in text and answers == [f"City{team}"]


def test_cwe_below_4k_uses_rulers_small_counts(data):
    text, answers = ruler.prompt('cwe', BYTE, 2048, 'x', 42, data, {})
    listing = text.rsplit('Below is a numbered list of words.', 1)[-1]
    counts = collections.Counter(re.findall(r'\d+\. (\S+)', listing.split('\nQuestion:')[0]))
    assert {counts[w] for w in answers} == {6} and set(counts.values()) == {6, 1}
    example = text.split('\nQuestion:')[0]
    assert set(collections.Counter(re.findall(r'\d+\. (\S+)', example)).values()) == {3, 1}  # the 20-word example


def test_vt_has_a_solved_example_first(data):
    text, answers = ruler.prompt('vt', GPT2, 4096, 'x', 42, data, {})
    assert text.count('Memorize and track the chain(s)') == 2
    example = text.split('\n\nMemorize and track')[0]
    names = re.search(r'they are: +(.*)$', example).group(1).split()
    assert len(names) == 5 and all(len(n) == 3 for n in names)  # 3-letter names in the example
    assert not set(names) & set(answers)


def test_errors(data):
    with pytest.raises(SystemExit, match="unknown RULER task 'niah_single_9'"):
        eval_ruler.task_list(['niah_single_1', 'niah_single_9'])
    assert eval_ruler.task_list('synthetic') == [t for t in ruler.TASKS if not t.startswith('qa')]
    assert len(eval_ruler.task_list('paper')) == 13 and eval_ruler.task_list('vt') == ['vt']
    with pytest.raises(ValueError, match='too few for this task'):
        ruler.prompt('qa_1', BYTE, 64, 'x', 42, data, {})
    missing = ruler.Data(essay_dir='', squad='/nonexistent/squad.json', say=lambda *a: None)
    with pytest.raises(FileNotFoundError):
        missing.missing('qa_1')


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
    r = eval_ruler.evaluate(Knower(answers), BYTE, ruler.Results(str(tmp_path / 'a.jsonl')), tasks, lengths, 2, 42, data,
                            say=said.append)
    assert r['too_short'].keys() == {'vt/1024', 'cwe/1024'} and any('not run: cwe at 1024' in s for s in said)
    assert r['scores']['niah_single_1'] == {1024: 100.0, 2048: 100.0} and r['scores']['cwe'][2048] == 100.0
    assert r['average'] == {1024: 100.0, 2048: 100.0} and r['tasks_averaged'] == {1024: 3, 2048: 5}
    silent = eval_ruler.evaluate(Knower(answers, silent=True), BYTE, ruler.Results(str(tmp_path / 'b.jsonl')), tasks,
                                 lengths, 2, 42, data, say=said.append)
    assert silent['average'] == {1024: 0.0, 2048: 0.0} and silent['nulls']['fwe'] == {1024: 2, 2048: 2}
    no_qa = ruler.Data(squad='', say=said.append)
    no_qa._cache['squad'] = None  # as if offline
    r = eval_ruler.evaluate(Knower(answers), BYTE, ruler.Results(str(tmp_path / 'c.jsonl')), ['qa_1', 'niah_single_1'],
                            [2048], 1, 42, no_qa, say=said.append)
    assert 'qa_1' in r['skipped'] and 'qa_1' not in r['scores'] and r['tasks_averaged'] == {2048: 1}


def test_each_task_has_rulers_metric():
    """QA counts a sample right when any reference is in the answer; the others, the fraction found."""
    assert ruler.metric('qa_2')("It is north.", ['north', 'to the north']) == 1.0
    for task in ruler.TASKS:
        if not task.startswith('qa'):
            assert ruler.metric(task)("It is north.", ['north', 'to the north']) == 0.5
