"""The date a chat template renders with (docs/fingerprint.md "The calendar").

Chat templates can read the clock: transformers gives every template a `strftime_now(format)` global, and
the Llama 3.1-3.3 instruct templates write "Today Date: <strftime_now('%d %b %Y')>" into the system prompt
(unless a `date_string` variable is given, which then falls back to it). Rendered on another day, the same
messages become another prompt, and a check would read that as outputs changing while nothing changed.

So evalgate renders every chat with a pinned `strftime_now`: a render variable of that name shadows the
global, in evalgate's own renders (engines/base.py), in lm-eval's `apply_chat_template`, and in the local
renders the server kinds send as token ids. The pin is also the detector: a template that calls it reads the
calendar, and the `TemplateClock` records which requests did.

The setting, `[suite] template_date`: "auto" (default: a baseline pins today's date; a check reuses the
date its baseline recorded), an ISO date or date-time (pinned to that moment), or "wall-clock" (not pinned:
templates read the real clock, and a rendered prompt that moves is reported as a `prompt` change).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import date, datetime

from ..errors import ConfigError

AUTO = "auto"
WALL_CLOCK = "wall-clock"


def parse_template_date(value, where: str, key: str) -> str:
    """`[suite] template_date` as written: "auto", "wall-clock", or an ISO date / date-time (normalised)."""
    if value is None or value == AUTO:
        return AUTO
    if isinstance(value, (date, datetime)):  # a TOML date or date-time literal
        return _iso(value if isinstance(value, datetime) else datetime.combine(value, datetime.min.time()))
    if value == WALL_CLOCK:
        return WALL_CLOCK
    if isinstance(value, str):
        try:
            return _iso(datetime.fromisoformat(value))
        except ValueError:
            pass
    raise ConfigError(f"{where}: `{key}` is {value!r}",
                      fix=f'use "{AUTO}" (default: the baseline\'s date), an ISO date such as "2026-03-01", or '
                          f'"{WALL_CLOCK}" (not pinned)')


def _iso(moment: datetime) -> str:
    moment = moment.replace(tzinfo=None, microsecond=0)
    return moment.date().isoformat() if moment.time() == datetime.min.time() else moment.isoformat()


def today() -> date:
    """This machine's local date, as `strftime_now` reads it (one place, so tests can move the calendar)."""
    return date.today()


def now() -> datetime:
    return datetime.now()


def resolve_template_date(setting: str, recorded: str | None = None) -> str:
    """The date a run renders with: an explicit setting as is; "auto" the date a baseline recorded (`recorded`),
    else today's (this machine's local date, as `strftime_now` would read it)."""
    if setting != AUTO:
        return setting
    if recorded and recorded != WALL_CLOCK:
        return recorded
    return today().isoformat()


def dated(suite, recorded: str | None = None):
    """The suite (a `Suite`) with the date its chat templates render with resolved: its own setting, else the
    date a baseline recorded (`recorded`), else today's."""
    return replace(suite, template_date=resolve_template_date(suite.template_date, recorded))


class TemplateClock:
    """`strftime_now` for chat templates, pinned to one moment (or the wall clock), recording which
    requests' renders called it."""

    def __init__(self, setting: str):
        resolved = resolve_template_date(setting)
        self.setting = resolved
        self.moment = None if resolved == WALL_CLOCK else datetime.fromisoformat(resolved)
        self.read_by: set[str] = set()

    def render_variables(self, key: str) -> dict:
        """The render variables that pin the clock for one request's render (`key`: who reads it)."""
        def strftime_now(format: str) -> str:
            self.read_by.add(key)
            return (self.moment or now()).strftime(format)

        return {"strftime_now": strftime_now}

    def reads(self, key: str) -> bool:
        return key in self.read_by

    def identity(self) -> dict:
        """The `prompt` fingerprint component's data: the pinned date, when any render read it (else
        nothing: a template that never reads the calendar makes a run's identity independent of the day)."""
        if not self.read_by:
            return {}
        return {"template_date": self.setting}
