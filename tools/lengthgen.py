"""
lm-eval's model 'lengthgen' (LengthGenLM): any checkpoint that checkpoint.load_model reads (NAPE,
ALiBi and ASEntmax transformers, Mamba2, SmolLM3 CPT runs, weights folders) as an lm-eval LM over
our own forward pass, KV cache and tokenizer. Most of these fit no Hugging Face layout
(tools/export_hf.py refuses them). tools/eval_lm.py is its command line (the paper's Table 7).

From lm-eval's CLI: lm_eval 0.4.13 finds models only in its registry, filled by its own
hard-coded MODEL_MAPPING and by @register_model when a module is imported; it scans no entry
points and has no option that imports a module (--include_path is for tasks). So plain
`lm_eval --model lengthgen` cannot work, but importing this module first registers the class:

    python -c \\
        "from tools import lengthgen; from lm_eval.__main__ import cli_evaluate; cli_evaluate()" \\
        --model lengthgen --model_args ckpt=out/nape/ckpt_000953.pt,dtype=bfloat16 \\
        --tasks arc_easy --batch_size 16

(from the repository root; in Python, after `import lengthgen`,
lm_eval.simple_evaluate(model='lengthgen', model_args={'ckpt': ...}) works likewise.)

How requests are answered (lm-eval's contract, as its HFLM does it, so that numbers agree with
`lm_eval --model hf` on an export of the same model):
- loglikelihood(context, continuation): trailing spaces of the context move to the
  continuation; the continuation's tokens are encode(context + continuation) past the first
  len(encode(context)); an empty context becomes the end-of-text token. The input is the last
  max_length tokens of context + continuation minus its final token, right-padded in a batch
  (the models are causal, so padding after a row changes nothing before it). Returns the sum of
  the continuation's log-probs and whether each of its tokens is the argmax.
- loglikelihood_rolling(text): windows of max_length tokens (default: the length the checkpoint
  was trained at), as lm-eval's get_rolling_token_windows: the end-of-text token first, every
  token predicted once, the last window given a full context. Windows rather than one pass
  through the cache because that is lm-eval's contract ("uses the full max context length of the
  model") and what --model hf does, and learned positions stop at block_size; each window still
  runs through the model's cache in chunks, so --max_length=16384 scores a document in one piece
  (the extrapolating models' long-context perplexity) without T x T or T x vocab at once.
- generate_until(context, gen_kwargs): greedy decoding through the model's cache, one request at
  a time (the models take no padding mask, so prompts of different lengths cannot share a batch),
  stopping at the end-of-text token, at any `until` string (checked on the decoded text after
  every token) or after max_gen_toks; the text is cut before the first stop string. The context
  keeps its last max_length - max_gen_toks tokens. Sampling (do_sample=True) is refused.
"""

import torch
import torch.nn.functional as F
try:
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
    from lm_eval.models.utils import normalize_gen_kwargs
except ImportError:
    raise SystemExit("tools/lengthgen.py (tools/eval_lm.py's lm-eval model) needs lm-eval: "
                     "pip install lm_eval") from None
from tqdm import tqdm

import ruler


def encode_pair(tok, context, continuation):
    """(context tokens, continuation tokens) by lm-eval's rule for causal models (TemplateLM)."""
    # nothing to condition on: the end-of-text token, unless the text starts with it
    if not context:
        cont = tok.encode(continuation)
        return ([tok.eot], cont) if not cont or cont[0] != tok.eot else (cont[:1], cont[1:])
    n = len(context) - len(context.rstrip())
    if n:  # " world" is one token in most BPEs: the space belongs to the continuation
        context, continuation = context[:-n], context[-n:] + continuation
    ctx = tok.encode(context)
    return ctx, tok.encode(context + continuation)[len(ctx):]


def rolling_windows(tokens, prefix, max_length):
    """The (inputs, targets) windows that score every token of a text once, targets -1 where a
    position is context only (lm-eval's rolling windows with context_len 1)."""
    seq = [prefix] + tokens  # seq[j] predicts tokens[j]
    windows = []
    for a in range(0, len(tokens), max_length):
        b = min(a + max_length, len(tokens))
        lo = max(0, b - max_length)  # the last window reaches back to a full max_length
        windows.append((seq[lo:b], [-1] * (a - lo) + tokens[a:b]))
    return windows


@torch.no_grad()
def score(model, inp, tgt, chunk_size):
    """Sum of log p(tgt) over the positions where tgt >= 0, and whether each of them is the
    argmax: inp, tgt (B, T) -> (B,) float64, (B,) bool. Chunk by chunk through the model's cache,
    the head applied only where there is a target."""
    B, T = inp.shape
    logp = torch.zeros(B, dtype=torch.float64, device=inp.device)
    greedy = torch.ones(B, dtype=torch.bool, device=inp.device)
    cache = model.new_cache(T)
    for s in range(0, T, chunk_size):
        x = model.hidden(inp[:, s:s + chunk_size], cache)  # (B, chunk, C)
        t = tgt[:, s:s + chunk_size]
        m = t >= 0
        if not m.any():
            continue
        lp = F.log_softmax(model.lm_head(x[m]).float(), dim=-1)  # (N, V), N = targets in this chunk
        rows = m.nonzero()[:, 0]
        logp.index_add_(0, rows, lp.gather(1, t[m][:, None])[:, 0].double())
        greedy[rows[lp.argmax(-1) != t[m]]] = False
    return logp, greedy


@torch.no_grad()
def greedy_until(model, tok, ids, until, max_new_tokens, chunk_size, device):
    """The model's greedy continuation of ids, as text, stopped at end-of-text, at any string of
    `until` or after max_new_tokens, and cut before the first stop string; an id that is no token
    (a padding row of the vocabulary) ends it as end-of-text does, as in ruler.predict."""
    cache = model.new_cache(len(ids) + max_new_tokens)
    idx = torch.tensor([ids], device=device)
    for s in range(0, idx.size(1), chunk_size):  # chunked prefill, as model.generate
        x = model.hidden(idx[:, s:s + chunk_size], cache)
    out = []
    for i in range(max_new_tokens):
        nxt = model.lm_head(x[:, -1]).argmax(-1, keepdim=True)  # (1, 1)
        if nxt.item() == tok.eot or nxt.item() >= tok.n_vocab:
            break
        out.append(nxt.item())
        if i == max_new_tokens - 1 or any(u in tok.decode(out) for u in until):
            break
        x = model.hidden(nxt, cache)
    text = tok.decode(out)
    for u in until:
        text = text.split(u)[0]
    return text


@register_model('lengthgen')
class LengthGenLM(LM):
    """lm-eval's LM over checkpoint.load_model: any checkpoint file or weights folder with a
    tokenizer.
    max_length: the most tokens one forward pass sees (0: the length the checkpoint was trained at).
    dtype: 'bfloat16' runs under autocast (the eval scripts' default on CUDA), 'float32' plain.
    window, overrides: model arguments that change no weight (ruler.load_for_eval), e.g. YaRN."""

    def __init__(self, ckpt, device=None, batch_size=1, dtype=None, max_length=0, chunk_size=1024,
                 window=None, overrides=None, max_batch_size=None, max_gen_toks=256):
        super().__init__()
        device = device or ('cuda' if torch.cuda.is_available() else 'cpu')
        # lm-eval's CLI defaults to cuda:0
        if device.startswith('cuda') and not torch.cuda.is_available():
            raise ValueError(f"device {device!r} but CUDA is not available here: give --device cpu")
        dtype = dtype or ('bfloat16' if device.startswith('cuda') else 'float32')
        if str(batch_size).startswith('auto'):
            raise ValueError("batch_size 'auto' is not supported here: give a number")
        if dtype not in ('bfloat16', 'float32'):
            raise ValueError(f"dtype must be 'bfloat16' or 'float32', got {dtype!r}")
        self.model, self.tok, info, self.autocast = ruler.eval_setup(
            ckpt, device, dtype, 'lm-eval', window, overrides=overrides)
        if self.tok.spec['kind'] == 'symbols':
            raise ValueError(f"{ckpt} reads the symbols of a synthetic task, not text: "
                             f"lm-eval's tasks need a text tokenizer")
        trained = ((info.get('config') or {}).get('block_size')
                   or getattr(self.model.config, 'block_size', 2048))
        self.max_length = int(max_length) or trained
        ruler.check_length(self.model, self.max_length, ckpt)
        self.ckpt, self.step = ckpt, info.get('step')
        self.batch_size, self.chunk_size = int(batch_size), int(chunk_size)
        self.max_gen_toks, self.dtype, self._device = int(max_gen_toks), dtype, torch.device(device)

    def get_model_info(self):  # lm-eval adds this to its results' config
        return {'ckpt': self.ckpt, 'step': self.step, 'max_length': self.max_length,
                'dtype': self.dtype}

    def _score_rows(self, rows, desc, disable_tqdm):
        """(inputs, targets) token lists -> [(sum of log-probs, all greedy)], batched longest
        first (similar lengths share a batch), right-padded, in the original order."""
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
        out = [None] * len(rows)
        for b in tqdm(range(0, len(order), self.batch_size), desc=desc, disable=disable_tqdm):
            batch = order[b:b + self.batch_size]
            T = len(rows[batch[0]][0])
            inp = torch.full((len(batch), T), self.tok.eot, dtype=torch.long)
            tgt = torch.full((len(batch), T), -1, dtype=torch.long)
            for r, i in enumerate(batch):
                x, y = rows[i]
                inp[r, :len(x)], tgt[r, :len(y)] = torch.tensor(x), torch.tensor(y)
            with self.autocast:
                logp, greedy = score(self.model, inp.to(self._device), tgt.to(self._device),
                                     self.chunk_size)
            for i, lp, g in zip(batch, logp.tolist(), greedy.tolist()):
                out[i] = (lp, g)
        return out

    def loglikelihood(self, requests, disable_tqdm=False):
        rows = []
        for req in requests:
            ctx, cont = encode_pair(self.tok, *req.args)
            # at most max_length inputs, the oldest context dropped
            whole = (ctx + cont)[-(self.max_length + 1):]
            if len(cont) >= len(whole):
                raise ValueError(f"a continuation of {len(cont)} tokens does not fit "
                                 f"max_length = {self.max_length}")
            rows.append((whole[:-1], [-1] * (len(whole) - 1 - len(cont)) + cont))
        return self._score_rows(rows, 'loglikelihood', disable_tqdm)

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        rows, owner = [], []
        for i, req in enumerate(requests):
            for w in rolling_windows(self.tok.encode(req.args[0]), self.tok.eot, self.max_length):
                rows.append(w)
                owner.append(i)
        total = [0.0] * len(requests)
        for i, (logp, _) in zip(owner,
                                self._score_rows(rows, 'loglikelihood_rolling', disable_tqdm)):
            total[i] += logp
        return total

    def generate_until(self, requests, disable_tqdm=False):
        out = []
        for req in tqdm(requests, desc='generate_until', disable=disable_tqdm):
            context, gen_kwargs = req.args
            # lm-eval's aliases and defaults
            kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
            if kwargs.get('do_sample'):
                raise ValueError(f"this model decodes greedily only; the task asks for sampling "
                                 f"({gen_kwargs})")
            # as HFLM: the eot text stops too
            until = list(kwargs['until']) + [self.tok.decode([self.tok.eot])]
            n = kwargs['max_gen_toks']
            if n >= self.max_length:
                raise ValueError(f"max_gen_toks = {n} leaves no room for a context in "
                                 f"max_length = {self.max_length}")
            ids = (self.tok.encode(context) or [self.tok.eot])[-(self.max_length - n):]
            with self.autocast:
                out.append(greedy_until(self.model, self.tok, ids, until, n, self.chunk_size,
                                        self._device))
        return out


def task_names(tasks, manager):
    """--tasks as a list (a comma-separated string or a list), every name known to the
    TaskManager, else SystemExit naming the unknown ones, with the closest known names."""
    import difflib
    names = [n.strip() for n in (tasks.split(',') if isinstance(tasks, str) else tasks)
             if n.strip()]
    unknown = [n for n in names if n not in manager.all_tasks]
    if unknown:
        hints = {n: difflib.get_close_matches(n, manager.all_tasks, n=1) for n in unknown}
        raise SystemExit("unknown lm-eval task(s): "
                         + ', '.join(n + (f" (did you mean {h[0]!r}?)" if h else '')
                                     for n, h in hints.items()))
    return names
