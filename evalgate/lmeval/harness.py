"""evalgate as an lm-eval model (lm-eval's `TemplateLM`): the one place that speaks lm-eval's model API.

It runs twice per suite (evalgate/lmeval/tasks.py). First it records every request lm-eval builds
(`answers` None) as an evalgate Prompt, tokenized the way lm-eval's vLLM backend tokenizes; then it answers
the same requests from evalgate's own records, so lm-eval computes its metrics from the tokens evalgate
gated. This module imports lm-eval at its top: it is loaded only for suites that have tasks.
"""

from __future__ import annotations

from array import array
from typing import Any, Mapping

from lm_eval.api.model import TemplateLM
from lm_eval.models.utils import handle_stop_sequences, has_bos_prefix, maybe_truncate, normalize_gen_kwargs, postprocess_generated_text
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from ..configuration.prompts import Prompt
from ..errors import ConfigError, EvalgateError
from ..hashing import jsonable

DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's default when a task sets no max_gen_toks
LM_EVAL_READER = "lm-eval"  # who read the template's clock (lm-eval's renders have no request key)


class EvalgateLM(TemplateLM):
    """Records lm-eval's requests (answers=None) or answers them from evalgate's records.

    Tokenization follows lm-eval's vLLM backend: `tok_encode` (BOS as the tokenizer or `add_bos_token`
    says), `_encode_pair` for context/continuation, left truncation, rolling windows of max_length - 2."""

    def __init__(self, tokenizer, max_length: int, add_bos_token: bool | None, sampling: dict,
                 answers: Mapping | None = None, clock=None):
        super().__init__()
        self.tokenizer = tokenizer
        self._max_length = max_length
        self.add_bos_token = add_bos_token
        self.sampling = sampling
        self.answers = answers
        self.clock = clock  # a TemplateClock (configuration/template_date.py): the date chat templates render with
        self.recorded: list[Prompt] = []
        self.docs: dict[str, dict[str, Any]] = {}  # task -> doc_id -> document, as evaluated
        self._pending: list = []

    # -- tokenization, as lm-eval's vLLM backend does it
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.tokenizer.eos_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        if not string:
            return []
        flags: dict = {}
        if add_special_tokens is not None:
            flags["add_special_tokens"] = add_special_tokens
        elif self.add_bos_token is not None:
            flags["add_special_tokens"] = self.add_bos_token
        if has_bos_prefix(string, self.tokenizer.decode(self.prefix_token_id)):
            flags["add_special_tokens"] = False  # the text already starts with BOS (chat templates)
        return list(self.tokenizer(string, **flags).input_ids)

    # -- chat, as lm-eval's vLLM backend renders it (simple_evaluate decides when)
    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", "tokenizer")).replace("/", "__")

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        import jinja2

        pinned = self.clock.render_variables(LM_EVAL_READER) if self.clock is not None else {}

        def render(history):
            return self.tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=add_generation_prompt,
                                                      continue_final_message=not add_generation_prompt, **pinned)

        if not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError("[lm_eval] apply_chat_template is set, but the model's tokenizer has no chat template",
                              fix="add the template to the model directory (chat_template.jinja), or set "
                                  "apply_chat_template = false")
        try:
            return render(chat_history)
        except jinja2.exceptions.TemplateError:  # a template without a system role: lm-eval drops it
            return render([m for m in chat_history if m["role"] != "system"])

    def _keys(self, instances) -> list[str]:
        """task/doc_id/idx/repeat: lm-eval passes an instance once per repeat, consecutively."""
        seen: dict[tuple, int] = {}
        keys = []
        for inst in instances:
            base = (inst.task_name, inst.doc_id, inst.idx)
            seen[base] = seen.get(base, -1) + 1
            keys.append(f"{inst.task_name}/{inst.doc_id}/{inst.idx}/{seen[base]}")
        return keys

    def _answer(self, key: str):
        try:
            return self.answers[key]
        except KeyError:
            raise EvalgateError(f"lm-eval built request {key!r} when scoring but not when running the suite",
                                fix="task building must be deterministic: check the task's process_docs") from None

    def _record(self, key: str, inst, request_type: str, **fields) -> None:
        self.docs.setdefault(inst.task_name, {})[str(inst.doc_id)] = jsonable(inst.doc)
        self.recorded.append(Prompt(key=key, max_tokens=None, line=0, request_type=request_type,
                                    location=f"{inst.task_name} doc {inst.doc_id}", **fields))

    # -- the three request types
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        keys = self._keys(requests)
        results = []
        eos = self.tokenizer.decode(self.eot_token_id)
        for key, inst in zip(keys, requests):
            context, gen_kwargs = inst.args
            kwargs = normalize_gen_kwargs(gen_kwargs, default_max_gen_toks=DEFAULT_MAX_GEN_TOKS)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            max_gen_toks = int(kwargs.pop("max_gen_toks", DEFAULT_MAX_GEN_TOKS))
            kwargs.pop("do_sample", None)
            if self.answers is None:
                ids, max_gen_toks = maybe_truncate(self.tok_encode(context), max_gen_toks=max_gen_toks,
                                                   max_model_len=self.max_length, side="left", verbose=False)
                sampling = {"skip_special_tokens": False, "spaces_between_special_tokens": False, **kwargs,
                            "max_tokens": max_gen_toks, "stop": until}
                self._record(key, inst, "generate_until", text=context, prompt_ids=token_array(ids), sampling=sampling)
                results.append("")
            else:
                results.append(postprocess_generated_text(self._answer(key).text, until, None))
        return results

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        self._pending = list(requests)
        return super().loglikelihood(requests, disable_tqdm=True)  # _encode_pair, then _loglikelihood_tokens

    def _loglikelihood_tokens(self, requests, **kwargs):
        keys = self._keys(self._pending)
        results = []
        limit = self.max_length - 1  # the engine generates one token after the scored prompt
        for key, inst, ((context, continuation), context_enc, continuation_enc) in zip(keys, self._pending, requests):
            if self.answers is None:
                if len(continuation_enc) >= limit:
                    raise ConfigError(f"{inst.task_name} doc {inst.doc_id}: the continuation is {len(continuation_enc)} "
                                      f"tokens, over the engine's context ({self.max_length})",
                                      fix="raise engine.max_model_len or shorten the task's choices")
                whole = (list(context_enc) + list(continuation_enc))[-limit:]  # left truncation, as lm-eval
                context_ids = whole[: len(whole) - len(continuation_enc)]
                self._record(key, inst, "loglikelihood", text=context, continuation=continuation,
                             segments=((token_array(context_ids), token_array(continuation_enc)),))
                results.append((0.0, False))
            else:
                results.append(loglikelihood_result(self._answer(key)))
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        keys = self._keys(requests)
        results = []
        for key, inst in zip(keys, requests):
            (string,) = inst.args
            if self.answers is None:
                windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                    token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length - 2, context_len=1)]
                segments = tuple((token_array(ctx), token_array(cont)) for ctx, cont in windows)
                self._record(key, inst, "loglikelihood_rolling", text=string, continuation=string, segments=segments)
                results.append(0.0)
            else:
                results.append(loglikelihood_result(self._answer(key))[0])
        return results


def token_array(ids) -> array:
    """Token ids as int32, held for the whole run: 4 bytes a token. A tuple of Python ints holds 8 bytes a token
    and keeps each int object (28 bytes, as token ids are mostly over 256) alive after lm-eval lets its own lists
    go: a leaderboard suite's few-shot prompts are hundreds of tokens each."""
    return array("i", ids)


def loglikelihood_result(completion) -> tuple[float, bool]:
    """(sum of the continuation's logprobs, whether every token was the top-1), lm-eval's answer format."""
    logprobs = completion.logprobs.tolist()  # summed in order as Python floats, as lm-eval's own backends do
    total = sum(logprobs)
    rows = (completion.top(i)[1] for i in range(len(completion.top_ids)))
    greedy = all(row and lp >= row[0] for lp, row in zip(logprobs, rows))
    return total, bool(greedy)
