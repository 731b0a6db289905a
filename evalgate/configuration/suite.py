"""Suite files: what to run (model, engine, sampling, prompts) and how (the schedule).

A suite is a TOML file, or the `[tool.evalgate]` table of a pyproject.toml. Relative paths resolve against
the directory of that file, never the working directory. Every mistake is reported as a ConfigError that
names the file, the field (or prompts-file line) and the fix (evalgate/configuration/config.py reads every table).
Each engine kind parses its own `[engine]` keys (evalgate/engines/). docs/suite.md documents the format.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..hashing import digest
from ..registry import ENGINES, PROBE_PRESETS, PROBES
from .adapters import BASE_MODEL, Adapter, adapter_choices, lora_settings, misfit, model_weight_shapes, parse_adapters
from .config import (
    DEFAULT_DATABASE,
    chat_template_in,
    check_keys,
    evalgate_tables,
    fail,
    is_dir,
    is_file,
    not_json,
    os_reason,
    resolve_database_url,
    resolve_path,
    short,
    typed,
    vocabulary_sizes,
)
from .load import parse_load
from .lock import HubResolver, resolve_hub_repo
from .policy import FAIL_ON, GatePolicy, parse_gate_table
from .prompts import SCORING_TYPES, Prompt, load_prompts
from .schedule import FULL, PRESETS, ROTATING, Schedule, rotating_problem
from .template_date import AUTO, parse_template_date

SAMPLING_KEYS = {
    "temperature": (int, float),
    "top_p": (int, float),
    "top_k": int,
    "min_p": (int, float),
    "max_tokens": int,
    "seed": int,
    "logprobs": int,
    "stop": list,
    "repetition_penalty": (int, float),
    "presence_penalty": (int, float),
    "frequency_penalty": (int, float),
    "ignore_eos": bool,
}
# vLLM's bounds (SamplingParams._verify_args): a value outside them is refused by vLLM on every request, mid-run.
SAMPLING_BOUNDS = {
    "temperature": (lambda v: 0 <= v <= 2, "in [0, 2]"),
    "top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "min_p": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "top_k": (lambda v: v >= -1, "0 or -1 for no cut-off, or at least 1"),
    "repetition_penalty": (lambda v: v > 0, "above 0, where 1 is none"),
    "presence_penalty": (lambda v: -2 <= v <= 2, "in [-2, 2]"),
    "frequency_penalty": (lambda v: -2 <= v <= 2, "in [-2, 2]"),
    "seed": (lambda v: -(2**63) <= v < 2**63, "within 64 bits, -2**63 to 2**63 - 1"),
}


def out_of_bounds(key: str, value: Any) -> str | None:
    """vLLM's bounds of a sampling parameter where `value` lies outside them (None: within, or unbounded)."""
    within, bounds = SAMPLING_BOUNDS.get(key, (None, ""))
    return bounds if within is not None and isinstance(value, (int, float)) and not within(value) else None


TOP_TABLES = ("suite", "engine", "sampling", "prompts", "schedule", "lm_eval", "cost", "load", "gate", "probes", "adapters")
SUITE_KEYS = {"name", "database", "code_paths", "template_date"}
PROMPTS_TABLE_KEYS = {"file", "adapters"}
SCHEDULE_KEYS = {"concurrency", "shuffles", "repeats", "seed", "hot_pass", "probes", "preset", "rotation"}
LM_EVAL_KEYS = {"tasks", "include_path", "limit", "num_fewshot", "fewshot_seed", "bootstrap_iters", "add_bos_token",
                "apply_chat_template", "system_instruction", "fewshot_as_multiturn", "adapter"}
@dataclass(frozen=True)
class LmEvalConfig:
    """The suite's [lm_eval] table: lm-eval tasks to run as evalgate requests (docs/suite.md)."""

    tasks: tuple[str, ...]
    include_path: tuple[Path, ...] = ()
    limit: int | float | None = None
    num_fewshot: int | None = None
    fewshot_seed: int = 1234
    bootstrap_iters: int = 100000
    add_bos_token: bool | None = None
    # Chat, as lm-eval's simple_evaluate defines them: lm-eval builds the chat-templated requests itself.
    apply_chat_template: bool | str = False  # true: the tokenizer's template; a name: one of its named templates
    system_instruction: str | None = None
    fewshot_as_multiturn: bool = True  # with a template: few-shot examples as user/assistant turns (lm-eval's default)
    adapter: str | None = None  # the LoRA adapter every task request runs under (None: the base model)


@dataclass
class Suite:
    name: str
    path: Path  # the suite file
    model: Path | None  # None only for kind = "openai" without a local copy of the model
    tokenizer: Path | None
    engine_kind: str
    batch_invariant: bool
    engine_args: dict[str, Any]
    sampling: dict[str, Any]
    prompts_file: Path | None  # None: the suite has lm-eval tasks only
    prompts: list[Prompt]
    schedule: Schedule
    code_paths: list[Path]
    database: str
    lm_eval: LmEvalConfig | None = None
    # Identity of the lm-eval tasks (config and documents), filled in once they are built (evalgate/lmeval/tasks.py).
    task_identity: dict[str, Any] = field(default_factory=dict)
    server: Any = None  # the server kinds' own settings (evalgate/engines/openai_api.py ServerConfig)
    cost_table: Any = None  # the file's [cost] table, for `evalgate cost` only (evalgate/cost.py parses it)
    gate: GatePolicy = field(default_factory=GatePolicy)  # [gate]: what fails a run (a policy, not identity)
    notes: tuple[str, ...] = ()  # what the file still says the old way, and where it moved (the CLI shows them)
    # the date chat templates render with (template_date.py): "auto" until a run resolves it, a date, or "wall-clock"
    template_date: str = AUTO
    adapters: dict[str, Adapter] = field(default_factory=dict)  # [adapters]: name -> LoRA adapter
    root: Path = field(init=False)

    def __post_init__(self) -> None:
        self.root = self.path.parent

    def sampling_for(self, prompt: Prompt) -> dict[str, Any]:
        """The effective vLLM sampling parameters of a request. Scoring requests generate nothing: they
        ask for the top-k logprobs of every prompt token."""
        if prompt.request_type in SCORING_TYPES:
            return {"max_tokens": 1, "temperature": 0.0, "prompt_logprobs": self.sampling["logprobs"]}
        params = dict(self.sampling)
        if prompt.max_tokens is not None:
            params["max_tokens"] = prompt.max_tokens
        params.update(prompt.sampling or {})
        return params

    def request_hash(self, prompt: Prompt) -> str:
        """Identity of one request: its text and effective sampling parameters (not its key), and the files
        of the adapter it runs under (**contract**: a request without an adapter hashes as it always has)."""
        return self._adapted(self.own_hash(prompt), prompt)

    def _adapted(self, own: str, prompt: Prompt) -> str:
        """A request's hash from its own hash: with its adapter's files when it runs under one."""
        if prompt.adapter is None:
            return own
        return digest({"request": own, "adapter": self.adapters[prompt.adapter].digest})

    def own_hash(self, prompt: Prompt) -> str:
        """The request's own part of its identity: text and sampling, whatever adapter it runs under."""
        if prompt.request_type == "generate":
            chat = {"chat_template_kwargs": prompt.chat_template_kwargs} if prompt.chat_template_kwargs else {}
            return digest({"prompt": prompt.text, "sampling": self.sampling_for(prompt), **chat})
        return digest({"type": prompt.request_type, "prompt": prompt.text, "continuation": prompt.continuation,
                       "sampling": self.sampling_for(prompt)})

    def identity(self) -> dict[str, Any]:
        """The `suite` fingerprint component: every request key with its request hash, plus the lm-eval
        tasks' configuration and document digests when the suite has tasks, and the adapters when requests
        run under one: each adapter's files, and per request its adapter and its own hash (so a judgement
        can tell an edited adapter from an edited prompt: judgement/verdict.py)."""
        own = {p.key: self.own_hash(p) for p in self.prompts}  # each request hashed once
        identity: dict[str, Any] = {"requests": {p.key: self._adapted(own[p.key], p) for p in self.prompts}}
        if self.task_identity:
            identity["tasks"] = self.task_identity
        adapted = [p for p in self.prompts if p.adapter is not None]
        if adapted:
            identity["adapters"] = {
                "files": {name: self.adapters[name].files for name in sorted({p.adapter for p in adapted})},
                "requests": {p.key: {"adapter": p.adapter, "own": own[p.key]} for p in adapted}}
        return identity

    def location_of(self, prompt: Prompt) -> str:
        """A request's 'file:line' (or its lm-eval task and document), for reports that point at the source."""
        return prompt.location or f"{self.prompts_file}:{prompt.line}"


def parse_probes(value, where: str, sec: str) -> tuple[str, ...]:
    """`probes = ["needle", "prefill_decode"]` or a preset name (`probes = "vllm"`): evalgate/probes/."""
    if isinstance(value, str) and value in PROBE_PRESETS:
        return PROBE_PRESETS[value]
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise fail(where, f"`{sec}probes` must be a list of probe names or a preset",
                   f'e.g. probes = ["needle", "prefill_decode"] or probes = "vllm"; probes: {", ".join(PROBES.names())}')
    for name in names:
        if name not in PROBES:
            raise fail(where, f"`{sec}probes`: unknown probe {name!r}",
                       f"{PROBES.unknown(name)}, or the preset \"vllm\" (all of them)")
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class SuiteHeader:
    """A suite file's [suite] table alone: its name and its store. All that the commands which only read runs
    need (runs list/show/history, baseline list, report, pr-comment, diff): no model, lock, prompts or Hub, so a
    teammate, a dashboard job or a PR-comment job reads the history without the model."""

    name: str
    path: Path
    database: str  # the resolved URL


def read_suite_header(path: str | Path, *, database: str | None = None) -> SuiteHeader:
    """The [suite] table of a suite file, checked as load_suite checks it; `database` (--db) as in load_suite."""
    path = _resolved(path)
    data, prefix = evalgate_tables(path)
    table = data.get("suite", {})
    if not isinstance(table, dict):
        raise fail(str(path), f"`{prefix}suite` must be a table", f"write it as [{prefix}suite]")
    name, db_url = _suite_name_and_database(table, path, str(path), prefix)
    return SuiteHeader(name, path, _database(database, db_url, path, prefix))


def _resolved(path: str | Path) -> Path:
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: symlink loop (Python < 3.13)
        raise ConfigError(f"{path}: cannot read suite file ({os_reason(exc)})", fix="check the path") from None


def _database(given: str | None, written: str, path: Path, prefix: str) -> str:
    """A database from the file is relative to the file; one given on the command line (--db), to the cwd."""
    if given:
        return resolve_database_url(given, Path.cwd(), where="--db")
    return resolve_database_url(written, path.parent, where=f"{path}: `{prefix}suite.database`")


def load_suite(path: str | Path, *, database: str | None = None, hub: HubResolver = resolve_hub_repo) -> Suite:
    """Load and validate a suite file; `database` (e.g. --db) overrides the file's database URL, relative to the cwd;
    `hub` turns each Hub repo id into its directory (default: the lock's snapshot, offline; `evalgate fetch`
    downloads). The one reader of a suite file: one per table, each naming the file, the field and the fix."""
    path = _resolved(path)
    data, prefix = evalgate_tables(path)
    where = str(path)
    root = path.parent

    # [cost] belongs to `evalgate cost` (evalgate/cost.py validates it); it never changes a run.
    check_keys(data, set(TOP_TABLES), where, prefix)
    tables = {}
    for name in ("suite", "engine", "sampling", "prompts", "schedule", "lm_eval", "load", "gate", "probes", "adapters"):
        value = data.get(name, {})
        if not isinstance(value, dict):
            raise fail(where, f"`{prefix}{name}` must be a table", f"write it as [{prefix}{name}]")
        tables[name] = value

    name, db_url, code_paths = _suite_table(tables["suite"], path, where, prefix)
    template_date = parse_template_date(tables["suite"].get("template_date"), where, f"{prefix}suite.template_date")
    sec = f"{prefix}engine."
    kind = typed(tables["engine"], "kind", str, where, sec, default="vllm")
    if kind not in ENGINES:
        raise fail(where, f"`{sec}kind` is {kind!r}", ENGINES.unknown(kind))
    engine_cls = ENGINES.load(kind)
    engine = engine_cls.parse_config(dict(tables["engine"]), root, where, sec, hub=hub)
    sampling = _sampling_table(tables["sampling"], where, f"{prefix}sampling.")
    _logprobs_fit(engine_cls, engine, sampling, where, prefix)
    adapters = parse_adapters(tables["adapters"], root, where, f"{prefix}adapters.", hub=hub)
    if adapters:
        _adapters_fit(adapters, engine.model, where, f"{prefix}adapters.")
        engine = _serving_adapters(engine_cls, engine, adapters, where, sec)
    lm_eval = _lm_eval_config(tables["lm_eval"], root, where, f"{prefix}lm_eval.", tuple(adapters)) \
        if "lm_eval" in data else None
    prompts_file, prompts = _prompts_table(tables["prompts"], root, where, f"{prefix}prompts.", tuple(adapters),
                                           tasks=lm_eval is not None)
    _chat_template_needed(engine, prompts, prompts_file, lm_eval, where, prefix)
    _tokenizer_fits(engine, where, sec)
    schedule, notes = _schedule_table(tables["schedule"], tables["probes"], where, prefix)
    if "load" in data:
        traced = isinstance(tables["load"], dict) and "trace" in tables["load"]
        if traced and engine_cls.placement is None:
            raise fail(where, f"[{prefix}load] trace: the {engine_cls.kind} engine cannot replay a trace",
                       'use `engine.kind` "vllm" (exact placement) or a server kind (timed), or remove `trace`')
        if not traced and not engine_cls.accepts_load:
            raise fail(where, f"[{prefix}load] needs a server engine (filler traffic is sent over HTTP)",
                       'set `engine.kind` to "openai" or "vllm-server", replay a trace (`trace = "traffic.jsonl"`, '
                       'docs/traffic.md), or remove [load] (docs/server.md)')
        schedule = dataclasses.replace(schedule, load=parse_load(tables["load"], where, f"{prefix}load.",
                                                                 schedule.concurrency, root))

    db = _database(database, db_url, path, prefix)
    return Suite(
        name=name, path=path, model=engine.model, tokenizer=engine.tokenizer, engine_kind=kind,
        batch_invariant=engine.batch_invariant, engine_args=engine.engine_args, sampling=sampling,
        prompts_file=prompts_file, prompts=prompts, schedule=schedule,
        code_paths=code_paths, database=db, lm_eval=lm_eval, server=engine.server, cost_table=data.get("cost"),
        gate=parse_gate_table(tables["gate"], where, prefix), notes=notes, template_date=template_date,
        adapters=adapters,
    )


def _logprobs_fit(engine_cls, engine, sampling: dict, where: str, prefix: str) -> None:
    """`logprobs` within the engine's cap (vLLM's `max_logprobs`): else vLLM refuses every request, mid-run."""
    cap = engine_cls.logprobs_cap(engine.engine_args)
    if cap is not None and sampling["logprobs"] > cap:
        how = "set" if "max_logprobs" in engine.engine_args else "by default"
        raise fail(where, f"`{prefix}sampling.logprobs` is {sampling['logprobs']}, above the {engine_cls.kind} engine's "
                   f"cap of {cap} (`{prefix}engine.max_logprobs`, {how})",
                   f"lower it to {cap} or less, or raise the cap: max_logprobs = {sampling['logprobs']} in [{prefix}engine]")


def _tokenizer_fits(engine, where: str, sec: str) -> None:
    """A tokenizer set apart from the model whose ids run past the model's embeddings (another model's): vLLM
    would fail mid-run on the first such id."""
    sizes = vocabulary_sizes(engine.model, engine.tokenizer) if engine.model and engine.tokenizer else None
    if sizes is not None and sizes[1] > sizes[0]:
        raise fail(where, f"`{sec}tokenizer`: {engine.tokenizer} has token ids up to {sizes[1] - 1}, past the model's "
                   f"vocabulary of {sizes[0]} (vocab_size in {engine.model / 'config.json'}): it is another model's "
                   "tokenizer", f"point `{sec}tokenizer` at this model's tokenizer, or remove it (the model directory's)")


def _chat_template_needed(engine, prompts: list[Prompt], prompts_file: Path | None, lm_eval, where: str,
                          prefix: str) -> None:
    """Chats, or lm-eval told to apply the chat template, with a local tokenizer that has none: refused here,
    before an engine starts (a large model's start costs minutes), as the engine would refuse them."""
    tokenizer = engine.tokenizer or engine.model
    if "chat_template" in engine.engine_args or chat_template_in(tokenizer) is not False:
        return  # a server given its own template, or a tokenizer that has one (or may)
    fix = f"add the template to {tokenizer} (chat_template.jinja, or `chat_template` in tokenizer_config.json)"
    chat = next((p for p in prompts if p.messages is not None), None)
    if chat is not None:
        raise fail(f"{prompts_file}:{chat.line}", f"prompt {chat.key!r}: a `messages` prompt, but the tokenizer "
                   f"in {tokenizer} has no chat template", f"{fix}, or write the prompt as text (`prompt`)")
    if lm_eval is not None and lm_eval.apply_chat_template:
        raise fail(where, f"`{prefix}lm_eval.apply_chat_template` is set, but the tokenizer in {tokenizer} has no "
                   "chat template", f"{fix}, or set apply_chat_template = false")


def _adapters_fit(adapters: dict[str, Adapter], model: Path | None, where: str, sec: str) -> None:
    """An adapter trained on another model: vLLM would load it without a word and its requests answer nonsense."""
    weights = model_weight_shapes(model) if model is not None else {}
    for adapter in adapters.values() if weights else ():
        wrong = misfit(adapter, weights)
        if wrong:
            raise fail(where, f"`{sec}{adapter.name}`: {adapter.path} does not fit the model {model} ({wrong}): it is "
                       "another model's adapter", f"point `{sec}{adapter.name}` at an adapter trained on this model")


def _serving_adapters(engine_cls, engine, adapters: dict[str, Adapter], where: str, sec: str):
    """The engine settings of a suite with adapters: an engine evalgate starts gets LoRA turned on, sized
    for the adapters (engine identity, like every [engine] setting); a server you run serves them by name."""
    if engine_cls.serves_adapters is None:
        raise fail(where, f"the {engine_cls.kind} engine cannot run LoRA adapters ([adapters])",
                   'use `engine.kind` "vllm", "vllm-server" or "openai" (a server that serves the adapters by name)')
    if engine_cls.serves_adapters == "by_name":
        return engine
    settings = lora_settings(adapters, engine.engine_args, where, sec)
    return dataclasses.replace(engine, engine_args={**engine.engine_args, **settings})


def _suite_table(table: dict, path: Path, where: str, prefix: str) -> tuple[str, str, list[Path]]:
    """[suite]: the name (default: the file's), the database URL as written, the declared code paths."""
    sec = f"{prefix}suite."
    name, db_url = _suite_name_and_database(table, path, where, prefix)
    code_paths = []
    for item in typed(table, "code_paths", list, where, sec, default=[]):
        if not isinstance(item, str):
            raise fail(where, f"`{sec}code_paths` entries must be strings, got {item!r}", "list paths as strings")
        p = resolve_path(path.parent, item, where, f"{sec}code_paths")
        if not p.exists():
            raise fail(where, f"`{sec}code_paths` entry {item!r} does not exist ({p})", "fix or remove the path")
        code_paths.append(p)
    return name, db_url, code_paths


def _suite_name_and_database(table: dict, path: Path, where: str, prefix: str) -> tuple[str, str]:
    """[suite]'s name (default: the file's) and database URL as written; its keys checked."""
    sec = f"{prefix}suite."
    check_keys(table, SUITE_KEYS, where, sec)
    name = typed(table, "name", str, where, sec, default=path.parent.name if prefix else path.stem)
    return name, typed(table, "database", str, where, sec, default=DEFAULT_DATABASE)


def _sampling_table(table: dict, where: str, sec: str) -> dict[str, Any]:
    """[sampling]: vLLM's sampling parameters, greedy by default, each value checked and hashable."""
    check_keys(table, set(SAMPLING_KEYS), where, sec)
    sampling: dict[str, Any] = {"temperature": 0.0, "max_tokens": 32, "logprobs": 5}
    for key, types in SAMPLING_KEYS.items():
        value = typed(table, key, types, where, sec)
        if value is not None:
            if key == "stop" and not all(isinstance(s, str) and s for s in value):
                raise fail(where, f"`{sec}stop` entries must be non-empty strings, got {short(value)}",
                           'list stop strings, e.g. stop = ["\\n\\n"]')
            reason = not_json(value)
            if reason:  # request hashes are canonical JSON: nan/inf cannot be identity
                raise fail(where, f"`{sec}{key}` is {reason}", f"set `{key}` to a finite number")
            bounds = out_of_bounds(key, value)
            if bounds:
                raise fail(where, f"`{sec}{key}` is {value}; vLLM takes {bounds}", f"set `{key}` {bounds}")
            # 1 and 1.0 must hash alike: numbers of float-valued parameters are stored as floats.
            sampling[key] = float(value) if isinstance(types, tuple) and float in types else value
    if sampling["max_tokens"] < 1:
        raise fail(where, f"`{sec}max_tokens` must be >= 1", "set max_tokens to a positive integer")
    if sampling["logprobs"] < 2:
        raise fail(where, f"`{sec}logprobs` must be >= 2", "evalgate needs the top-2 logprobs for margins; use 2 or more")
    if float(sampling["temperature"]) > 0 and "seed" not in sampling:
        raise fail(where, f"`{sec}temperature` > 0 without `{sec}seed`", "set a sampling seed, or temperature = 0")
    return sampling


def _prompts_table(table: dict, root: Path, where: str, sec: str, adapters: tuple[str, ...], *,
                   tasks: bool) -> tuple[Path | None, list[Prompt]]:
    """[prompts]: the prompts file and its prompts; a suite of lm-eval tasks alone may have none. `adapters`:
    the suite's adapter names, which `[prompts] adapters` (and a line's `adapter`) choose from."""
    check_keys(table, PROMPTS_TABLE_KEYS, where, sec)
    run_under = typed(table, "adapters", list, where, sec, default=[])
    for name in run_under:
        if name != BASE_MODEL and name not in adapters:
            raise fail(where, f"`{sec}adapters`: {name!r} is not an adapter of the suite", adapter_choices(adapters))
    if len(set(run_under)) != len(run_under):
        raise fail(where, f"`{sec}adapters` names an adapter twice", "list every adapter once")
    file_s = typed(table, "file", str, where, sec)
    if not file_s:
        if tasks:
            return None, []
        raise fail(where, f"`{sec}file` is missing",
                   "set it to a JSONL file of {\"id\": ..., \"prompt\": ...} lines, or name lm-eval tasks in [lm_eval]")
    prompts_file = resolve_path(root, file_s, where, f"{sec}file")
    if not is_file(prompts_file):
        state = ("is a directory" if is_dir(prompts_file) else "does not exist" if not prompts_file.exists()
                 else "is not a regular file")
        raise fail(where, f"`{sec}file`: {prompts_file} {state}", "set it to an existing JSONL file (relative to the suite file)")
    return prompts_file, load_prompts(prompts_file, adapters, tuple(run_under))


# [schedule] keys that moved to a probe's own table: old key -> (probe, its key there)
MOVED_TO_PROBES = {"needle_batch": ("needle", "batch"), "needle_filler_tokens": ("needle", "filler_tokens")}


def _probe_options(schedule_table: dict, probes_table: dict, where: str, prefix: str) -> tuple[tuple, tuple[str, ...]]:
    """[probes.<name>] tables, each parsed by its probe (`Probe.options`), and the `[schedule]` keys that moved
    there: still read, with a note saying where they belong now (a key in both places is refused)."""
    tables = {name: dict(table) for name, table in probes_table.items()}
    notes = []
    for old, (probe, key) in MOVED_TO_PROBES.items():
        if old in schedule_table:
            table = tables.setdefault(probe, {})
            if not isinstance(table, dict) or key in table:
                raise fail(where, f"`{prefix}schedule.{old}` and `{prefix}probes.{probe}.{key}` both set", f"keep `{key}` "
                           f"under [{prefix}probes.{probe}] only")
            table[key] = schedule_table[old]
            notes.append(f"{where}: `[{prefix}schedule] {old}` moved to `[{prefix}probes.{probe}] {key}`; "
                         "it is read as before")
    options = []
    for name, table in sorted(tables.items()):
        if name not in PROBES:
            raise fail(where, f"[{prefix}probes.{name}]: unknown probe {name!r}", PROBES.unknown(name))
        probe = PROBES.load(name)()
        if not isinstance(table, dict):
            raise fail(where, f"`{prefix}probes.{name}` must be a table", f"write it as [{prefix}probes.{name}]")
        options.append((name, probe.options(table, where, f"{prefix}probes.{name}.")))
    return tuple(options), tuple(notes)


def _schedule_table(table: dict, probes_table: dict, where: str, prefix: str) -> tuple[Schedule, tuple[str, ...]]:
    """[schedule]: the passes a run makes (runtime knobs, never identity), the probes it adds and (from
    [probes.<name>]) their settings; and the notes on keys that moved."""
    sec = f"{prefix}schedule."
    check_keys(table, SCHEDULE_KEYS | set(MOVED_TO_PROBES), where, sec)
    probe_options, notes = _probe_options(table, probes_table, where, prefix)
    preset = typed(table, "preset", str, where, sec, default=FULL)
    if preset not in PRESETS:
        raise fail(where, f"`{sec}preset` is {preset!r}", f"use one of {', '.join(map(repr, PRESETS))} (docs/conditions.md)")
    concurrency = typed(table, "concurrency", list, where, sec, default=[1, 8])
    if not concurrency or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in concurrency):
        raise fail(where, f"`{sec}concurrency` must be a non-empty list of positive integers", "e.g. concurrency = [1, 8, 32]")
    schedule = Schedule(
        concurrency=tuple(concurrency),
        shuffles=typed(table, "shuffles", int, where, sec, default=1 if preset == FULL else 0),
        repeats=typed(table, "repeats", int, where, sec, default=1),
        seed=typed(table, "seed", int, where, sec, default=0),
        hot_pass=typed(table, "hot_pass", bool, where, sec, default=True),
        probes=parse_probes(table.get("probes", []), where, sec),
        probe_options=probe_options,
        preset=preset,
        rotation=typed(table, "rotation", int, where, sec, default=16),
    )
    if "rotation" in table and preset != ROTATING:
        raise fail(where, f"`{sec}rotation` is a setting of the rotating preset", 'add `preset = "rotating"` or remove it')
    problem = rotating_problem(schedule) if preset == ROTATING else None
    if problem:
        setting, why, fix = problem
        raise fail(where, f"`{sec}{setting}` {why}", fix)
    if schedule.shuffles < 0 or schedule.repeats < 1:
        raise fail(where, f"`{sec}shuffles` must be >= 0 and `{sec}repeats` >= 1", "fix the schedule counts")
    return schedule, notes


def with_fail_on(suite: Suite, fail_on: str) -> Suite:
    """The suite judged at another level (--fail-on): a policy, so nothing about the run changes."""
    if fail_on not in FAIL_ON:
        raise ConfigError(f"--fail-on must be bits or tokens, got {fail_on!r}",
                          fix="--fail-on tokens lets logprob-bit drift pass and fails token flips")
    return dataclasses.replace(suite, gate=dataclasses.replace(suite.gate, fail_on=fail_on))


def _lm_eval_config(table: dict, root: Path, where: str, sec: str, adapters: tuple[str, ...] = ()) -> LmEvalConfig:
    check_keys(table, LM_EVAL_KEYS, where, sec)
    adapter = typed(table, "adapter", str, where, sec)
    if adapter is not None and adapter != BASE_MODEL and adapter not in adapters:
        raise fail(where, f"`{sec}adapter` is {adapter!r}, not an adapter of the suite", adapter_choices(adapters))
    tasks = typed(table, "tasks", list, where, sec, default=[])
    if not tasks or not all(isinstance(t, str) and t.strip() for t in tasks):
        raise fail(where, f"`{sec}tasks` must be a non-empty list of task names",
                    'e.g. tasks = ["my_task"] with include_path = ["tasks"], or built-in names such as "arc_easy"')
    if len(set(tasks)) != len(tasks):
        raise fail(where, f"`{sec}tasks` names a task twice", "list every task once")
    include = typed(table, "include_path", (str, list), where, sec, default=[])
    include = [include] if isinstance(include, str) else include
    paths = []
    for item in include:
        if not isinstance(item, str):
            raise fail(where, f"`{sec}include_path` entries must be strings, got {item!r}", "list directories as strings")
        p = resolve_path(root, item, where, f"{sec}include_path")
        if not is_dir(p):
            raise fail(where, f"`{sec}include_path`: {p} is not a directory",
                        "point it at a directory of lm-eval task YAML files (relative to the suite file)")
        paths.append(p)
    limit = typed(table, "limit", (int, float), where, sec)
    if limit is not None and (limit <= 0 or (isinstance(limit, float) and limit > 1.0)):
        raise fail(where, f"`{sec}limit` is {limit}", "use a document count (integer >= 1) or a fraction in (0, 1]")
    num_fewshot = typed(table, "num_fewshot", int, where, sec)
    if num_fewshot is not None and num_fewshot < 0:
        raise fail(where, f"`{sec}num_fewshot` must be >= 0", "set num_fewshot to 0 or more")
    bootstrap = typed(table, "bootstrap_iters", int, where, sec, default=100000)
    if bootstrap < 0:
        raise fail(where, f"`{sec}bootstrap_iters` must be >= 0", "use 0 to skip bootstrapped standard errors")
    return LmEvalConfig(
        tasks=tuple(tasks), include_path=tuple(paths), limit=limit, num_fewshot=num_fewshot,
        fewshot_seed=typed(table, "fewshot_seed", int, where, sec, default=1234), bootstrap_iters=bootstrap,
        add_bos_token=typed(table, "add_bos_token", bool, where, sec),
        adapter=None if adapter == BASE_MODEL else adapter,
        **_lm_eval_chat(table, where, sec),
    )


def _lm_eval_chat(table: dict, where: str, sec: str) -> dict:
    template = typed(table, "apply_chat_template", (bool, str), where, sec, default=False)
    if isinstance(template, str) and not template.strip():
        raise fail(where, f"`{sec}apply_chat_template` is an empty string",
                    "true (the tokenizer's chat template), false, or the name of one of its named templates")
    instruction = typed(table, "system_instruction", str, where, sec)
    multiturn = typed(table, "fewshot_as_multiturn", bool, where, sec)
    if multiturn and template is False:
        raise fail(where, f"`{sec}fewshot_as_multiturn = true` needs a chat template",
                    f"set {sec}apply_chat_template = true as well (lm-eval's rule)")
    return {"apply_chat_template": template, "system_instruction": instruction,
            "fewshot_as_multiturn": True if multiturn is None else multiturn}
