"""`evalgate init`: a project's first day, written for it.

`Scaffold` holds the choices (a model directory or a server, lm-eval tasks, the user's prompts or a few
examples, the gate level, the schedule preset, the database); `scaffold_files` renders the files;
`write_scaffold` writes them all or none: it refuses when any of them exists (naming it), and removes what
it wrote if the suite it wrote does not load. Nothing here runs a model: the CLI then surveys the machine
(evalgate/survey.py) and writes the remedy into the suite where the passes disagree, as the demo does.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from . import __version__
from .configuration.config import chat_template_in
from .configuration.lock import LOCK_FILE
from .configuration.policy import FAIL_ON
from .configuration.schedule import FULL, PRESETS, ROTATING
from .configuration.suite_file import SUITE_FILE
from .errors import ConfigError

PROMPTS_FILE = "prompts.jsonl"
WORKFLOW_FILE = ".github/workflows/evalgate.yml"
BASELINES_DIR = "baselines"
DEFAULT_DATABASE = "sqlite:///baselines/evalgate.sqlite"
ACTION_REPO = "evalgate/evalgate"


def action_ref() -> str:
    """The action this evalgate pins in the workflow it writes (docs/ci.md "The composite action"): the commit
    it was installed from, with the version in a comment, as a workflow audit asks (a tag can be moved); the
    version tag only where the commit is unknown (an install from a wheel)."""
    commit = installed_commit()
    return f"{ACTION_REPO}@{commit} # v{__version__}" if commit else f"{ACTION_REPO}@v{__version__}"


def installed_commit() -> str | None:
    """The git commit evalgate was installed from: pip's record of a VCS install (direct_url.json), or the
    HEAD of the checkout an editable install runs from."""
    import subprocess
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        direct = json.loads(distribution("evalgate").read_text("direct_url.json") or "{}")
    except (PackageNotFoundError, ValueError):
        direct = {}
    commit = (direct.get("vcs_info") or {}).get("commit_id")
    if commit:
        return commit
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() if head.returncode == 0 and re.match(r"^[0-9a-f]{40}$", head.stdout.strip()) else None

PLAIN_EXAMPLES = [
    "The capital of France is",
    "Q: What is 12 times 12?\nA:",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "The three primary colors are",
    "Translate to French: good morning =>",
]
CHAT_EXAMPLES = [
    "What is the boiling point of water at sea level, in Celsius?",
    "Write one sentence explaining what a hash function is.",
    "Name a prime number between 20 and 30.",
]


@dataclass(frozen=True)
class Scaffold:
    """What `evalgate init` writes into `directory`. A local model (`model`, the vllm kind) or a server
    (`url`, the openai kind, serving `served_model`); `model` with `url` is the server's local copy."""

    directory: Path
    model: Path | None = None  # the model directory (for a Hub model: its snapshot in the cache)
    hub: str | None = None  # a Hub repo id (`--model org/name`): the suite names it at `revision`, and fetches it
    revision: str = "main"  # with `hub`: what to resolve; `write_scaffold` records the commit it resolved to
    url: str | None = None
    served_model: str | None = None
    tasks: tuple[str, ...] = ()
    prompts: Path | None = None  # the user's prompts file (None: a few examples are written)
    fail_on: str = "bits"
    preset: str = FULL
    database: str = DEFAULT_DATABASE
    name: str | None = None
    action: str = ""  # the action's `uses:` reference (default: `action_ref()`)
    engine_extra: str = ""  # more [engine] lines (the tests' fake engine)
    chat: bool = False  # whether the model has a chat template (the examples then include chats; `validate` sets it)

    @property
    def suite_name(self) -> str:
        return self.name or re.sub(r"[^A-Za-z0-9_.-]+", "-", self.directory.resolve().name).strip("-") or "suite"


def validate(scaffold: Scaffold) -> Scaffold:
    """Every choice checked before anything is written; each refusal names its flag. Returns the scaffold
    with what the model directory says (`chat`)."""
    if scaffold.model is None and scaffold.url is None:
        raise ConfigError("init needs a model: --model DIR (a local Hugging Face model directory), --model org/name "
                          "(a Hub repo) or --url URL (an OpenAI-compatible vLLM server)",
                          fix="e.g. evalgate init --model models/my-model")
    if scaffold.model is not None and not (scaffold.model / "config.json").is_file():
        raise ConfigError(f"--model: {scaffold.model} is not a Hugging Face model directory (no config.json)",
                          fix="give the directory holding config.json and the weights (`evalgate build-model` makes one)")
    if scaffold.url is not None:
        if not re.match(r"^https?://[^/\s]+", scaffold.url):
            raise ConfigError(f"--url: {scaffold.url!r} is not an http(s) URL", fix="e.g. --url http://127.0.0.1:8000")
        if not scaffold.served_model:
            scaffold = replace(scaffold, served_model=served_model(scaffold.url))
    if scaffold.fail_on not in FAIL_ON:
        raise ConfigError(f"--fail-on: {scaffold.fail_on!r} is not a gate level", fix=f"one of {', '.join(FAIL_ON)}")
    if scaffold.preset not in PRESETS:
        raise ConfigError(f"--preset: {scaffold.preset!r} is not a schedule preset", fix=f"one of {', '.join(PRESETS)}")
    if scaffold.prompts is not None and not scaffold.prompts.is_file():
        raise ConfigError(f"--prompts: {scaffold.prompts} is not a file", fix="give a JSONL prompts file (docs/suite.md)")
    bad = [t for t in scaffold.tasks if not re.match(r"^[A-Za-z0-9_.-]+$", t)]
    if bad:
        raise ConfigError(f"--tasks: {bad[0]!r} is not an lm-eval task name", fix="comma-separated names, e.g. --tasks arc_easy,hellaswag")
    # a server without a local model directory gets plain examples only: its chat template is unknown here
    chat = chat_template_in(scaffold.model) is True
    return replace(scaffold, chat=chat)


def served_model(url: str) -> str:
    """The one model a server serves (GET /v1/models), for `--url` without `--served-model`."""
    import urllib.request

    listing = f"{url.rstrip('/').removesuffix('/v1')}/v1/models"
    try:
        with urllib.request.urlopen(listing, timeout=10) as response:
            models = [m.get("id") for m in json.loads(response.read()).get("data") or [] if isinstance(m, dict)]
    except (OSError, ValueError, AttributeError) as exc:
        raise ConfigError(f"--url: could not list the models of {listing} ({exc})",
                          fix="start the server, or name its model with --served-model") from None
    if len(models) != 1:
        raise ConfigError(f"--url: {listing} serves {len(models)} models ({', '.join(map(str, models)) or 'none'}): "
                          "which one is meant is --served-model's to say",
                          fix="e.g. --served-model " + (models[0] if models else "my-model"))
    return models[0]


MAX_MODEL_LEN = 2048  # enough for the examples and a few-shot task; small enough for a CPU's KV cache
LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def model_max_len(model: Path) -> int:
    """The suite's max_model_len: MAX_MODEL_LEN, or less where the model's config allows less (vLLM refuses
    a longer one)."""
    try:
        config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return MAX_MODEL_LEN
    limits = [value for table in (config, config.get("text_config") or {}) for key in LENGTH_KEYS
              if isinstance(value := table.get(key), (int, float)) and value > 0]
    return int(min([MAX_MODEL_LEN, *limits]))


def _path_in_suite(path: Path, directory: Path) -> str:
    """A path as the suite file gives it: relative to the suite's directory when it lies beside it."""
    path, directory = path.resolve(), directory.resolve()
    try:
        return os.path.relpath(path, directory) if path.is_relative_to(directory) else str(path)
    except ValueError:  # another drive
        return str(path)


def in_git_lfs(directory: Path) -> bool:
    """Whether git would keep any of the model's files in Git LFS (its .gitattributes `filter=lfs`, asked of
    git for every file, committed or not): the workflow's checkout then needs `lfs: true`, or it brings
    pointers. False outside a git repository, or without git."""
    import subprocess

    files = sorted(str(path.relative_to(directory)) for path in directory.rglob("*")
                   if path.is_file() and not any(part.startswith(".") for part in path.relative_to(directory).parts))
    if not files:
        return False
    try:
        attributes = subprocess.run(["git", "check-attr", "filter", "--stdin"], input="\n".join(files), cwd=directory,
                                    capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return attributes.returncode == 0 and any(line.endswith(": filter: lfs") for line in attributes.stdout.splitlines())


def example_prompts(chat: bool) -> list[dict]:
    lines = [{"id": f"text-{i:02d}", "prompt": text} for i, text in enumerate(PLAIN_EXAMPLES)]
    if chat:
        lines += [{"id": f"chat-{i:02d}", "messages": [{"role": "user", "content": text}]} for i, text in enumerate(CHAT_EXAMPLES)]
    return lines


def _render(template: str, s: Scaffold, **extra) -> str:
    """One of the files `init` writes, from its template (evalgate/templates/init/) and the scaffold's choices."""
    import jinja2
    import tomlkit

    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates" / "init"),
                                     trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                                     undefined=jinja2.StrictUndefined, autoescape=False)
    environment.filters["toml"] = lambda value: tomlkit.item(value).as_string()  # a TOML value, quoted as TOML
    model = s.hub or (_path_in_suite(s.model, s.directory) if s.model is not None else None)
    return environment.get_template(template).render(
        s=s, model=model, **extra,
        action=s.action or action_ref(), prompts=_path_in_suite(s.prompts, s.directory) if s.prompts else PROMPTS_FILE,
        max_model_len=model_max_len(s.model) if s.model else MAX_MODEL_LEN, rotating=ROTATING, suite_file=SUITE_FILE)


def suite_text(s: Scaffold) -> str:
    return _render("evalgate.toml.j2", s)


def workflow_text(s: Scaffold) -> str:
    """The workflow, bringing a local model the way it lives: beside the suite, the checkout brings it (with
    `lfs: true` where git keeps it in LFS), unless it is a git clone of its own (git keeps a link, no files)."""
    in_repository = s.hub is None and s.model is not None and not os.path.isabs(_path_in_suite(s.model, s.directory))
    clone = in_repository and (s.model / ".git").exists()
    return _render("evalgate.yml.j2", s, in_repository=in_repository and not clone, clone=clone,
                   lfs=in_repository and not clone and in_git_lfs(s.model))


def scaffold_files(s: Scaffold) -> dict[str, str]:
    """The files `init` writes, by path relative to the directory."""
    files = {SUITE_FILE: suite_text(s), WORKFLOW_FILE: workflow_text(s)}
    if s.prompts is None:
        files[PROMPTS_FILE] = "".join(json.dumps(line) + "\n" for line in example_prompts(s.chat))
    return files


def write_scaffold(scaffold: Scaffold) -> list[Path]:
    """Write the scaffold, all of it or nothing: a file that exists is never overwritten (the refusal names
    it), and a suite that does not load is removed with everything written beside it. Returns the paths."""
    from .configuration.suite import load_suite

    if scaffold.hub is not None:  # the snapshot, to read what the model says (its chat template, its length)
        from .fetch import download_model

        pin = download_model(scaffold.hub, scaffold.revision, "--model")
        scaffold = replace(scaffold, model=pin.snapshot, revision=pin.commit)
    scaffold = validate(scaffold)
    files = {scaffold.directory / name: text for name, text in scaffold_files(scaffold).items()}
    existing = [path for path in files if path.exists()]
    if existing:
        raise ConfigError(f"{existing[0]} exists: `evalgate init` never overwrites a file",
                          fix="remove it, or run init in another directory (--dir)")
    written: list[Path] = []
    made = [d for d in (scaffold.directory, scaffold.directory / ".github", scaffold.directory / ".github" / "workflows",
                        scaffold.directory / BASELINES_DIR) if not d.exists()]
    try:
        for directory in made:
            directory.mkdir()
        for path, text in files.items():
            path.write_text(text, encoding="utf-8")
            written.append(path)
        if scaffold.hub is not None:  # the lock (and any Hub dataset of the tasks) before the suite can load
            from .fetch import fetch

            written.append(scaffold.directory / LOCK_FILE)
            fetch(scaffold.directory / SUITE_FILE, progress=False)
        load_suite(scaffold.directory / SUITE_FILE)
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        for directory in reversed(made):
            if directory.exists() and not any(directory.iterdir()):
                directory.rmdir()
        raise
    return [*written, scaffold.directory / BASELINES_DIR]
