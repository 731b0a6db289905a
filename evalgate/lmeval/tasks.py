"""lm-eval tasks as evalgate requests: run unchanged, gated at the token level, scored by lm-eval itself.

Three steps, all in the engine's process (evalgate/execution/runner.py `execute_suite`):
1. `prepare`: find the suite's tasks (its include paths first; lm-eval's built-in tasks only when a name is
   not found there), parse every task YAML of the include paths, anchor relative data paths to the task
   file's directory (lm-eval resolves them against the working directory) and check they exist. Cheap, and
   done before the engine starts, so a broken task file costs no engine start.
2. `TaskRun.build`: lm-eval builds its requests (`simple_evaluate` with an LM that records them, tokenized
   exactly as lm-eval tokenizes: `TemplateLM._encode_pair`, the rolling windows of its vLLM backend). They
   become suite requests keyed `task/doc_id/idx/repeat` and run through the same schedule as plain prompts.
3. `TaskRun.score`: lm-eval scores the first pass's records (`simple_evaluate` again, the LM answering from
   them): lm-eval's own metrics, never reimplemented, per task and per document.

lm-eval's caches (`use_cache`, `cache_requests`) are never used: they ignore model identity and data content.
Local data files are re-read on every run (`download_mode="force_redownload"`) for the same reason.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from ..configuration.config import LFS_FIX, is_lfs_pointer
from ..configuration.lock import FETCH_FIX, HUB_ID, LOCK_FILE, Pin, locked_snapshot, read_lock
from ..configuration.prompts import SCORING_TYPES
from ..configuration.suite import SAMPLING_KEYS, LmEvalConfig, Suite, out_of_bounds
from ..errors import ConfigError, EvalgateError, MissingDependency
from ..hashing import digest, jsonable


def _import_lm_eval():
    try:
        import lm_eval  # noqa: F401
        from lm_eval.api.model import TemplateLM  # noqa: F401
    except ImportError:
        raise MissingDependency("lm-eval (pip install 'lm-eval==0.4.13'; not its [vllm] extra, which pulls GPU vLLM)") from None
    # lm-eval logs every task setting at INFO and warns about overridden few-shot counts: not evalgate's output.
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    logging.getLogger("lm-eval").setLevel(logging.ERROR)
    # Offline: a task's Hub dataset is read from the cache at the commit evalgate.lock pins (`evalgate fetch`).
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        import datasets

        datasets.disable_progress_bars()
        datasets.logging.set_verbosity_error()
    except ImportError:
        pass


@dataclass
class Prepared:
    """The suite's tasks, found and checked; `specs` are what lm-eval loads (names, or anchored configs)."""

    config: LmEvalConfig
    manager: Any  # lm_eval.tasks.TaskManager
    specs: list
    sources: dict[str, str]  # task name -> its YAML file (or "lm-eval built-in")
    pins: dict[str, Pin] = field(default_factory=dict)  # Hub dataset repo -> its pin in evalgate.lock


def prepare(config: LmEvalConfig, suite_path: Path) -> Prepared:
    _import_lm_eval()
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._yaml_loader import load_yaml

    where = str(suite_path)
    for directory in config.include_path:
        for yaml_file in sorted([*directory.rglob("*.yaml"), *directory.rglob("*.yml")]):
            try:
                load_yaml(yaml_file, resolve_func=True)
            except Exception as exc:  # yaml errors, a missing include, a !function that does not import
                raise ConfigError(f"{yaml_file}: lm-eval task file does not load: {type(exc).__name__}: {exc}",
                                  fix="fix the YAML (it is in the suite's [lm_eval].include_path)") from None
    include = [str(p) for p in config.include_path] or None
    manager = TaskManager(include_path=include, include_defaults=False)
    if any(name not in manager.all_tasks for name in config.tasks):
        # A name not in the include paths: lm-eval's built-in tasks (indexing them takes a few seconds).
        manager = TaskManager(include_path=include, include_defaults=True)
    for name in config.tasks:
        if name not in manager.all_tasks:
            import difflib

            close = difflib.get_close_matches(name, manager.all_tasks, n=1)
            raise ConfigError(
                f"{where}: `lm_eval.tasks` names {name!r}, which is neither a task of the include paths "
                f"({', '.join(map(str, config.include_path)) or 'none set'}) nor an lm-eval built-in task",
                fix=f"did you mean {close[0]!r}?" if close else "check the name (the `task:` key of its YAML)",
            )
    _anchor_every_task_file(manager, config.include_path)
    pins = _locked_datasets(manager, config, suite_path)
    specs: list = []
    sources: dict[str, str] = {}
    for name in config.tasks:
        entry = manager.task_index[name]
        yaml_path = Path(entry.yaml_path).resolve() if entry.yaml_path else None
        ours = yaml_path is not None and any(yaml_path.is_relative_to(p) for p in config.include_path)
        if ours and getattr(entry.kind, "name", "") == "TASK":
            cfg = load_yaml(yaml_path, resolve_func=True)
            specs.append(_anchor_data_paths(cfg, yaml_path))
        else:  # groups, tags and built-in tasks load by name
            specs.append(name)
        sources[name] = str(yaml_path) if yaml_path else "lm-eval built-in"
        _check_loads(manager, specs[-1], name, sources[name], pins)
    return Prepared(config, manager, specs, sources, pins)


def _anchor_every_task_file(manager, include_path) -> None:
    """Data paths relative to their task file for every task file of the include paths as lm-eval builds it,
    a group's or a tag's member too (lm-eval's own rule is the working directory): a group runs the same from
    any directory, as a task named by itself does. Hooked where lm-eval reads a task or group file
    (`TaskFactory._load_full_config`, lm-eval 0.4.13), on this manager only."""
    factory = manager._factory
    read = factory._load_full_config

    def anchored(entry, overrides=None):
        cfg = read(entry, overrides)
        path = Path(entry.yaml_path).resolve() if entry.yaml_path else None
        if path is not None and any(path.is_relative_to(p) for p in include_path):
            cfg = _anchor_data_paths(cfg, path)
        return cfg

    factory._load_full_config = anchored


def _check_loads(manager, spec, name: str, source: str, pins: dict[str, Pin]) -> None:
    """Build the task once (its data included) so a data file that does not parse, or a Hub dataset not in
    the cache, is an error naming the task before the engine starts."""
    try:
        with pinned_datasets(pins):
            manager.load([spec])
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"{source}: lm-eval could not load task {name!r}: {type(exc).__name__}: {exc}",
                          fix="check the task's data files (JSON Lines, one object per line); a Hub dataset is read "
                              f"from the cache offline: {FETCH_FIX}") from None


def hub_datasets(config: LmEvalConfig, suite_path: Path) -> dict[str, tuple[str, str | None, str | None]]:
    """{task: (Hub dataset repo, its configuration, the revision its YAML asks for)} for every task the suite
    runs (a group or tag: each of its tasks) whose data is a Hub dataset: lm-eval's built-in tasks, and any
    task file of the include paths whose `dataset_path` names one. What `evalgate fetch` downloads."""
    _import_lm_eval()
    from lm_eval.tasks import TaskManager

    include = [str(p) for p in config.include_path] or None
    return _task_datasets(TaskManager(include_path=include, include_defaults=True), config.tasks)


def _task_datasets(manager, names) -> dict[str, tuple[str, str | None, str | None]]:
    found: dict[str, tuple[str, str | None, str | None]] = {}

    def visit(name: str, seen: frozenset = frozenset()) -> None:
        entry = manager.task_index.get(name)
        if entry is None or name in seen:
            return
        kind = getattr(entry.kind, "name", "")
        cfg = entry.cfg or {}
        if kind == "TAG":
            for member, other in manager.task_index.items():
                if name in (getattr(other, "tags", None) or ()):
                    visit(member, seen | {name})
        elif kind == "GROUP":
            for item in cfg.get("task") or []:
                visit(item if isinstance(item, str) else item.get("task", ""), seen | {name})
        elif kind == "TASK":
            path, kwargs = cfg.get("dataset_path"), cfg.get("dataset_kwargs") or {}
            base = Path(entry.yaml_path).parent if entry.yaml_path else Path.cwd()
            if isinstance(path, str) and HUB_ID.match(path) and "data_files" not in kwargs \
                    and not (base / path).exists() and not Path(path).exists():
                found[name] = (path, cfg.get("dataset_name"), kwargs.get("revision"))

    for name in names:
        visit(name)
    return found


def _locked_datasets(manager, config: LmEvalConfig, suite_path: Path) -> dict[str, Pin]:
    """The lock's pin of every Hub dataset the tasks read; a dataset the lock does not pin is a ConfigError:
    data that moves under the same name would be a silent change."""
    lock = read_lock(suite_path.parent)
    pins = {}
    for task, (repo, _, revision) in _task_datasets(manager, config.tasks).items():
        pin = lock.find("dataset", repo, revision or "main", task)
        if pin is None:
            raise ConfigError(f"{suite_path}: lm-eval task {task!r} reads the Hub dataset {repo!r} "
                              f"(revision {revision or 'main'!r}), which {LOCK_FILE} does not pin", fix=FETCH_FIX)
        locked_snapshot(pin, str(suite_path), f"lm_eval task {task!r}: dataset", verify=False)
        pins[repo] = pin
    return pins


@contextlib.contextmanager
def pinned_datasets(pins: dict[str, Pin]):
    """lm-eval loads a Hub dataset by name (`datasets.load_dataset(path=..., name=...)`): while this is open,
    each pinned repo loads from its locked snapshot in the cache (a local directory: offline, and exactly the
    locked commit, whatever branch the task's YAML would follow)."""
    if not pins:
        yield
        return
    import datasets

    load = datasets.load_dataset

    def load_pinned(path=None, *args, **kwargs):
        pin = pins.get(path) if isinstance(path, str) else None
        if pin is not None and kwargs.get("revision") in (None, pin.revision, pin.commit):
            kwargs.pop("revision", None)
            path = str(pin.snapshot)
        return load(path, *args, **kwargs)

    datasets.load_dataset = load_pinned
    try:
        yield
    finally:
        datasets.load_dataset = load


def _anchor_data_paths(cfg: dict, yaml_path: Path) -> dict:
    """Relative `dataset_kwargs.data_files` (and a local `dataset_path`) resolve against the task file's
    directory, so a suite runs the same from any working directory. A missing file is a ConfigError."""
    base = yaml_path.parent
    kwargs = dict(cfg.get("dataset_kwargs") or {})

    def anchor(value: str) -> str:
        if "://" in value:
            return value
        path = (base / value).resolve()
        if not path.exists():
            raise ConfigError(
                f"{yaml_path}: `dataset_kwargs.data_files` names {value!r}, which does not exist ({path})",
                fix="data paths in a task file are relative to the task file's directory",
            )
        if is_lfs_pointer(path):
            raise ConfigError(f"{yaml_path}: `dataset_kwargs.data_files` names {value!r}, a Git LFS pointer, not the "
                              f"file it stands for ({path})", fix=LFS_FIX)
        return str(path)

    files = kwargs.get("data_files")
    if files is not None:
        if isinstance(files, str):
            files = anchor(files)
        elif isinstance(files, list):
            files = [anchor(f) for f in files]
        elif isinstance(files, dict):
            files = {split: anchor(f) if isinstance(f, str) else [anchor(x) for x in f] for split, f in files.items()}
        kwargs["data_files"] = files
        kwargs.setdefault("download_mode", "force_redownload")  # datasets' cache keys local files by mtime
    dataset_path = cfg.get("dataset_path")
    if isinstance(dataset_path, str) and dataset_path.startswith((".", "/")) and (base / dataset_path).exists():
        cfg = {**cfg, "dataset_path": str((base / dataset_path).resolve())}
    return {**cfg, "dataset_kwargs": kwargs} if kwargs else cfg


@contextlib.contextmanager
def _no_environment_report():
    """simple_evaluate ends by describing its environment for its own report: `git describe` (which prints
    "fatal: not a git repository" outside one), torch's collect_env (pip, nvidia-smi...) and tokenizer info.
    evalgate keeps its own fingerprint and never reads these, so they are skipped while it runs."""
    from lm_eval import evaluator

    saved = {name: getattr(evaluator, name) for name in ("get_git_commit_hash", "add_env_info", "add_tokenizer_info")}
    evaluator.get_git_commit_hash = lambda *args, **kwargs: None
    evaluator.add_env_info = evaluator.add_tokenizer_info = lambda *args, **kwargs: None
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(evaluator, name, fn)


@dataclass
class TaskRun:
    prepared: Prepared
    tokenizer: Any
    max_length: int
    sampling: dict
    identity: dict = field(default_factory=dict)
    keys_by_doc: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    clock: Any = None  # the engine's TemplateClock: lm-eval's chats render with the suite's pinned date

    def _evaluate(self, lm, *, scoring: bool) -> dict:
        from lm_eval import simple_evaluate

        config = self.prepared.config
        try:
            with _no_environment_report(), pinned_datasets(self.prepared.pins):
                return simple_evaluate(
                    model=lm, tasks=list(self.prepared.specs), task_manager=self.prepared.manager, limit=config.limit,
                    num_fewshot=config.num_fewshot, fewshot_random_seed=config.fewshot_seed,
                    bootstrap_iters=config.bootstrap_iters if scoring else 0, log_samples=scoring,
                    use_cache=None, cache_requests=False,
                    apply_chat_template=config.apply_chat_template, system_instruction=config.system_instruction,
                    fewshot_as_multiturn=config.fewshot_as_multiturn,
                )
        except EvalgateError:
            raise
        except Exception as exc:  # a data file that does not parse, a dataset not on this machine, ...
            raise ConfigError(f"lm-eval could not build the tasks {', '.join(config.tasks)}: {type(exc).__name__}: {exc}",
                              fix=f"check the task YAML files and their data (a Hub dataset: {FETCH_FIX})") from None

    def _lm(self, answers: Mapping | None = None):
        """evalgate as an lm-eval model (lmeval/harness.py, which imports lm-eval: loaded here, on first use)."""
        from .harness import EvalgateLM

        return EvalgateLM(self.tokenizer, self.max_length, self.prepared.config.add_bos_token, self.sampling, answers,
                          clock=self.clock)

    def build(self, suite: Suite) -> Suite:
        """The suite with lm-eval's requests added after its plain prompts, and the tasks' identity."""
        lm = self._lm()
        results = self._evaluate(lm, scoring=False)
        requests = lm.recorded
        if not requests:
            raise ConfigError(f"{suite.path}: lm-eval built no requests for {', '.join(self.prepared.config.tasks)}",
                              fix="check the tasks' splits and [lm_eval].limit")
        for p in requests:
            task, doc_id = p.key.split("/")[:2]
            self.keys_by_doc.setdefault((task, int(doc_id)), []).append(p.key)
        docs = _docs_by_task(lm)
        self.identity = {
            "lm_eval": _lm_eval_version(),
            "settings": {"limit": self.prepared.config.limit, "num_fewshot": self.prepared.config.num_fewshot,
                         "fewshot_seed": self.prepared.config.fewshot_seed,
                         "add_bos_token": self.prepared.config.add_bos_token, **_chat_settings(self.prepared.config)},
            "tasks": {name: {"version": results.get("versions", {}).get(name),
                             "config": digest(_portable_config(cfg)), "data": digest(_data_hashes(cfg)),
                             "docs": digest(docs.get(name, {})), "n_docs": len(docs.get(name, {}))}
                      for name, cfg in sorted(results.get("configs", {}).items())},
        }
        _refuse_ungateable_generation(suite, requests)
        built = {p.key for p in requests}
        taken = next((p for p in suite.prompts if p.key in built), None)
        if taken is not None:  # a request key names one request: its outputs, its verdict
            raise ConfigError(f"{suite.location_of(taken)}: prompt id {taken.key!r} is also the key of a request lm-eval "
                              "built (lm-eval's requests are keyed task/doc/index/repeat)",
                              fix="give the prompt another id")
        adapter = self.prepared.config.adapter  # [lm_eval] adapter: every task request runs under it
        if adapter:
            _refuse_unscored(suite, adapter, requests)
            requests = [replace(p, adapter=adapter) for p in requests]
        return replace(suite, prompts=[*suite.prompts, *requests], task_identity=self.identity)

    def score(self, answers: Mapping) -> tuple[list[dict], list[dict]]:
        """lm-eval's metrics on the given records (key -> Completion; a store's pass read by window does): (task
        scores, per-document scores)."""
        lm = self._lm(answers)
        results = self._evaluate(lm, scoring=True)
        scores = []
        for task, metrics in results.get("results", {}).items():
            for name, value in metrics.items():
                if name in ("alias", "sample_len") or "_stderr," in name or not isinstance(value, (int, float)) or isinstance(value, bool):
                    continue
                metric, _, flt = name.partition(",")
                stderr = metrics.get(f"{metric}_stderr,{flt}")
                scores.append({"task": task, "metric": name, "value": _finite(value), "stderr": _finite(stderr)})
        samples = []
        for task, rows in results.get("samples", {}).items():
            for row in rows:
                metric_names = row.get("metrics") or []
                for metric in metric_names:
                    value = row.get(metric)
                    if isinstance(value, bool) or not isinstance(value, (int, float)):
                        continue
                    samples.append({"task": task, "doc_id": int(row["doc_id"]), "metric": f"{metric},{row.get('filter', 'none')}",
                                    "value": _finite(value), "request_keys": self.keys_by_doc.get((task, int(row["doc_id"])), [])})
        return scores, samples


def _chat_settings(config) -> dict:
    """The chat settings in the tasks' identity, only when used: suites without chat keep their fingerprint.
    The template itself is `tokenizer` identity (fingerprint.py)."""
    if config.apply_chat_template is False and config.system_instruction is None:
        return {}
    return {"apply_chat_template": config.apply_chat_template, "system_instruction": config.system_instruction,
            "fewshot_as_multiturn": config.fewshot_as_multiturn}


def _finite(value) -> float | None:
    """A metric value as stored and reported: a finite float, or None (lm-eval's "N/A", NaN, inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)



def _refuse_unscored(suite: Suite, adapter: str, requests) -> None:
    """A loglikelihood is a teacher-forced rescoring: under an adapter whose output head or embeddings vLLM leaves
    out of prompt_logprobs it would score the base model, silently. Refused before anything runs (exit 2)."""
    reason = suite.adapters[adapter].unscored_reason
    scoring = sorted({p.request_type for p in requests if p.request_type in SCORING_TYPES})
    if reason and scoring:
        tasks = sorted({p.key.split("/")[0] for p in requests if p.request_type in SCORING_TYPES})
        raise ConfigError(f"{suite.path}: `[lm_eval] adapter` = {adapter!r}, and {', '.join(tasks)} ask for "
                          f"{' and '.join(scoring)} requests: {reason}, so these would be scored without the adapter",
                          fix="run the loglikelihood tasks under an adapter that leaves out lm_head and the embeddings "
                              "(or none), and keep generation tasks under this one")

# What a task's generation_kwargs may set: [sampling]'s keys, and the vLLM sampling parameters evalgate (like
# lm-eval's vLLM backend) passes on as they are.
TASK_SAMPLING_KEYS = frozenset(SAMPLING_KEYS) | {"skip_special_tokens", "spaces_between_special_tokens", "min_tokens",
                                                 "stop_token_ids", "include_stop_str_in_output"}


def _refuse_ungateable_generation(suite: Suite, requests) -> None:
    """A task's generation_kwargs that vLLM would refuse on every request, mid-run (a Hugging Face key such as
    `num_beams`, a value out of vLLM's bounds), or that sample without a seed (random outputs cannot be gated):
    exit 2 naming the task, before anything is stored. [sampling]'s own are checked as the suite loads."""
    for p in requests:
        if p.request_type != "generate_until":
            continue
        where = f"lm-eval task {p.key.split('/')[0]!r} ({p.location})"
        own = p.sampling or {}
        unknown = sorted(set(own) - TASK_SAMPLING_KEYS)
        if unknown:
            raise ConfigError(f"{where}: generation_kwargs `{unknown[0]}` is not a vLLM sampling parameter",
                              fix=f"remove `{unknown[0]}` from the task's generation_kwargs (vLLM decodes one sequence; "
                                  f"it takes: {', '.join(sorted(TASK_SAMPLING_KEYS))})")
        if isinstance(own.get("max_tokens"), int) and own["max_tokens"] < 1:
            raise ConfigError(f"{where}: generation_kwargs `max_gen_toks` is {own['max_tokens']}; vLLM takes 1 or more",
                              fix="set max_gen_toks to a positive number of tokens in the task's generation_kwargs")
        for key, value in own.items():
            if bounds := out_of_bounds(key, value):
                raise ConfigError(f"{where}: generation_kwargs `{key}` is {value}; vLLM takes {bounds}",
                                  fix=f"set `{key}` {bounds} in the task's generation_kwargs")
        params = suite.sampling_for(p)
        if float(params.get("temperature") or 0) > 0 and params.get("seed") is None:
            raise ConfigError(f"{where}: its generation_kwargs sample (temperature {params['temperature']}) without a "
                              "seed: its outputs would be random, which no gate can compare",
                              fix="set `seed` in [sampling] (the tasks' requests take it), or make the task greedy "
                                  "(do_sample: false)")


def _docs_by_task(lm) -> dict[str, dict]:
    """Each task's documents as lm-eval evaluated them (doc_id -> doc), from the recorded instances: the
    data's identity whatever its source (local files, a dataset already on this machine)."""
    return lm.docs


def _local_data(cfg: dict) -> dict:
    """The task's local data paths: `dataset_kwargs.data_files` and an absolute `dataset_path`."""
    data = {}
    files = (cfg.get("dataset_kwargs") or {}).get("data_files")
    if files is not None:
        data["data_files"] = files
    if isinstance(cfg.get("dataset_path"), str) and Path(cfg["dataset_path"]).is_absolute():
        data["dataset_path"] = cfg["dataset_path"]
    return data


def _portable_config(cfg: dict) -> dict:
    """A task config for identity: local data paths by file name (absolute paths differ between checkouts;
    their content is the separate `data` identity), without lm-eval's bookkeeping `metadata`."""
    cfg = {k: v for k, v in cfg.items() if k != "metadata"}
    local = _local_data(cfg)
    if "data_files" in local:
        cfg["dataset_kwargs"] = {**cfg["dataset_kwargs"], "data_files": _map_paths(local["data_files"], lambda p: p.name)}
    if "dataset_path" in local:
        cfg["dataset_path"] = Path(local["dataset_path"]).name
    return jsonable(cfg)


def _data_hashes(cfg: dict) -> dict:
    """SHA-256 of every local data file (a directory: of each file in it)."""
    def content(path: Path):
        if path.is_file():
            return _file_sha256(path)
        if path.is_dir():
            return {str(p.relative_to(path)): _file_sha256(p) for p in sorted(path.rglob("*")) if p.is_file()}
        return None

    return {k: _map_paths(v, content) for k, v in _local_data(cfg).items()}


def _map_paths(value, fn):
    if isinstance(value, str):
        return fn(Path(value)) if "://" not in value else value
    if isinstance(value, list):
        return [_map_paths(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: _map_paths(v, fn) for k, v in value.items()}
    return value


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _lm_eval_version() -> str:
    from importlib.metadata import version

    return version("lm_eval")
