"""The rendered prompt as identity (docs/fingerprint.md "The rendered prompt"): what the engine saw, per request.

A request's `suite` identity is what the user wrote (its text or messages, its sampling). Between that and
the engine, a chat template renders and a tokenizer tokenizes; either can move with the suite file unchanged
(a template that reads the calendar, a `transformers` upgrade, a server that renders differently). Every
run stores each request's prompt ids as the engine was given them, so a check compares them with the
baseline's: a request whose ids differ is explained by `prompt`, and a silent regression is only declared
when the rendered prompts are equal too.
"""

from __future__ import annotations

from dataclasses import dataclass
from os.path import commonprefix

from ..records import unpack_ids

CONTEXT = 24  # characters shown before the first difference
SHOWN = 40  # characters of the differing stretch shown (then "…")
AFTER = 12  # characters shown after it


@dataclass(frozen=True)
class PromptChange:
    """Where a request's rendered prompt first differs from the baseline's: the token position, both token
    ids there (None past an end), and both rendered texts around the first differing character."""

    position: int
    baseline_token: int | None
    token: int | None
    baseline_text: str
    text: str


def prompt_change(baseline, current) -> PromptChange | None:
    """How the prompt the engine was given moved between the baseline's request and this run's (stored
    request rows: `prompt_ids` packed, `rendered` text); None when the ids are equal."""
    if bytes(baseline.prompt_ids) == bytes(current.prompt_ids):
        return None
    before, after = unpack_ids(baseline.prompt_ids), unpack_ids(current.prompt_ids)
    position = len(commonprefix([before, after]))
    old_text, new_text = text_windows(rendered_text(baseline), rendered_text(current))
    return PromptChange(position, _at(before, position), _at(after, position), old_text, new_text)


def rendered_text(request) -> str:
    """A stored request's prompt as the engine saw it (a chat's rendering; else its text)."""
    return getattr(request, "rendered", None) or request.prompt


def text_windows(old: str, new: str) -> tuple[str, str]:
    """Both texts around their first differing character: some context before, the differing stretch
    (capped), a little after; "…" where a text was cut."""
    start = len(commonprefix([old, new]))
    tail = len(commonprefix([old[start:][::-1], new[start:][::-1]]))

    def window(text: str) -> str:
        end = len(text) - tail  # where this text's differing stretch ends
        cut = min(end, start + SHOWN)
        head = max(0, start - CONTEXT)
        return (("…" if head else "") + text[head:cut] + ("…" if cut < end else "") + text[end:end + AFTER]
                + ("…" if end + AFTER < len(text) else ""))

    return window(old), window(new)


def _at(ids: list[int], position: int) -> int | None:
    return ids[position] if position < len(ids) else None


@dataclass(frozen=True)
class PromptCounts:
    """Against a baseline: of the requests both runs have, how many rendered prompts are equal."""

    compared: int
    equal: int


def prompts_compared(current, baseline) -> PromptCounts:
    """Over the requests both runs have: how many rendered prompts are equal (`equal` of `compared`)."""
    shared = [key for key in current.requests if key in baseline.requests]
    equal = sum(bytes(current.requests[k].prompt_ids) == bytes(baseline.requests[k].prompt_ids) for k in shared)
    return PromptCounts(len(shared), equal)
