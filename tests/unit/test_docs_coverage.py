"""The docs match the code, kept so: every command, flag and suite-file key (listed from the Typer app and
the parsers themselves) is named in some doc, and every evalgate flag a doc names exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from evalgate.cli import app

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TEXT = "\n".join(p.read_text(encoding="utf-8") for p in DOCS)


def commands(group=None, path=()):
    group = group or typer.main.get_command(app)
    if path and not getattr(group, "hidden", False):
        yield path, group
    for name, command in getattr(group, "commands", {}).items():
        yield from commands(command, (*path, name))


COMMANDS = list(commands())
# the root's own flags (`evalgate --version`) with every command's
FLAGS = {name: path for path, command in [((), typer.main.get_command(app)), *COMMANDS] for p in command.params
         if not getattr(p, "hidden", False)
         for name in getattr(p, "opts", []) if name.startswith("--") and name != "--help"}


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=" ".join)
def test_every_command_is_named_in_a_doc(path):
    assert f"evalgate {' '.join(path)}" in TEXT, f"no doc names `evalgate {' '.join(path)}`"


@pytest.mark.parametrize("flag", sorted(FLAGS))
def test_every_flag_is_named_in_a_doc(flag):
    assert re.search(re.escape(flag) + r"(?![a-z-])", TEXT), f"no doc names {flag} (of evalgate {' '.join(FLAGS[flag])})"


def suite_keys() -> list[str]:
    from evalgate.configuration.load import LOAD_KEYS
    from evalgate.configuration.policy import GATE_KEYS
    from evalgate.configuration.suite import LM_EVAL_KEYS, PROMPTS_TABLE_KEYS, SAMPLING_KEYS, SCHEDULE_KEYS, SUITE_KEYS, TOP_TABLES
    from evalgate.cost import CANDIDATE_KEYS, COST_KEYS
    from evalgate.engines.base import COMMON_KEYS
    from evalgate.engines.openai_api import OPENAI_KEYS, VLLM_SERVER_OWN_KEYS
    from evalgate.probes import get_probe, probe_names

    keys = {f"[{t}]" for t in TOP_TABLES} | SUITE_KEYS | PROMPTS_TABLE_KEYS | set(SAMPLING_KEYS) | SCHEDULE_KEYS
    keys |= set(LM_EVAL_KEYS) | set(GATE_KEYS) | set(LOAD_KEYS) | CANDIDATE_KEYS | COST_KEYS | set(COMMON_KEYS)
    keys |= set(OPENAI_KEYS) | set(VLLM_SERVER_OWN_KEYS)
    keys |= {f"[probes.{name}] {key}" for name in probe_names() for key in get_probe(name).settings}
    keys |= set(probe_names())
    return sorted(keys)


@pytest.mark.parametrize("key", suite_keys())
def test_every_suite_key_is_named_in_a_doc(key):
    if key.startswith("[probes."):  # a probe's setting: its table named, and the key under it
        table, name = key.split("] ")
        assert f"{table}]" in TEXT and re.search(rf"\b{name}\b", TEXT), f"no doc names {key}"
        return
    if key.startswith("["):  # a table: `[gate]`, or `[probes.needle]` for the probes' own
        assert key in TEXT or f"{key[:-1]}." in TEXT, f"no doc names the {key} table"
        return
    # a key with an underscore is specific enough anywhere (a list in a comment); a plain word must be code
    loose = rf"|\b{re.escape(key)}\b" if "_" in key else ""
    assert re.search(rf"`{re.escape(key)}`|\b{re.escape(key)} =|\.{re.escape(key)}\]{loose}", TEXT), \
        f"no doc names the suite key `{key}`"


def evalgate_invocations() -> list[str]:
    """Every evalgate command line the docs show: code lines that start with `evalgate `, and inline code
    spans that do (prose around them is not a command)."""
    found = [m.group(1) for m in re.finditer(r"`(evalgate [^`]+)`", TEXT)]
    fenced = False
    for line in TEXT.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced and re.match(r"\s*(\$ )?(- run: )?evalgate ", line):
            found.append(line.strip())
    return found


def test_every_evalgate_flag_a_doc_names_exists():
    named = {flag for line in evalgate_invocations() for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line)}
    unknown = sorted(named - set(FLAGS) - {"--help"})
    assert not unknown, f"docs show evalgate flags that do not exist: {unknown}"
    assert len(named) > 20  # the scan sees the docs' command lines
