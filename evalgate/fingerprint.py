"""A run's fingerprint: named identity components (**contract**, docs/design.md "Identity", docs/fingerprint.md).

Each component is {"hash": digest(data), "data": data, "info": info}. Only `data` is hashed: it holds what
may change outputs. `info` is shown to people but never decides a verdict (e.g. the git commit: the whole
repository commit would make every pull request a "code change"). The fingerprint's own hash is the digest
of {component: hash}. Runtime knobs (concurrency, order, repeats) are never in here: that exclusion is what
lets a check say "your outputs changed and nothing that may change them did".
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from .atomic import write_text_atomic
from .hashing import digest
from .hub_cache import hub_origin

COMPONENTS = ("model", "tokenizer", "engine", "code", "suite", "prompt", "hardware", "env")
# Components that describe the serving stack as a whole; `suite` and `prompt` are judged per request instead
# (a request's hash; the prompt ids the engine was given).
STACK_COMPONENTS = ("model", "tokenizer", "engine", "code", "hardware", "env")

TOKENIZER_FILES = {
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "vocab.txt", "merges.txt", "chat_template.jinja", "chat_template.json", "spiece.model",
}
# Files in a model directory that cannot change outputs.
_DOC_FILE = re.compile(r"(^README|^LICEN[CS]E|\.md$|^\.)", re.IGNORECASE)

# Environment variables that may change numerics, by prefix; and names among them that cannot.
ENV_PREFIXES = ("VLLM_", "CUDA_", "NCCL_", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "CUBLAS", "CUBLASLT", "TORCH",
                "PYTORCH_", "NVIDIA_", "HIP_", "ROCM_", "DNNL_", "ONEDNN_", "XLA_", "GOMP_", "TF32")
ENV_IGNORED = re.compile(r"(CACHE_ROOT|CACHE_DIR|_CACHE$|LOGGING|LOG_LEVEL|_LOG$|_HOST|_PORT|_URL|USAGE_|RPC_|"
                         r"NO_USAGE_STATS|DO_NOT_TRACK|CONFIG_ROOT|_TMP|TMPDIR|ASSETS_|_IDENT$|SHM_|_BUFFER_NAME)")
# Secret-looking names: SECRET/PASSWORD/AUTH/CREDENTIAL anywhere, KEY/TOKEN as the last word (HF_TOKEN,
# VLLM_API_KEY); numeric knobs such as VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD stay visible and hashed.
# Variables outside those prefixes that change what the engine computes with: LD_PRELOAD swaps the OpenMP
# runtime or the allocator in (vLLM's CPU guide preloads tcmalloc and Intel's OpenMP).
ENV_NAMES = ("LD_PRELOAD",)
SECRET_NAME = re.compile(r"(SECRET|PASSWORD|PASSWD|AUTH|CREDENTIAL|APIKEY|(^|_)(KEY|TOKEN)S?$)", re.IGNORECASE)
REDACTED = "<redacted>"

# Settings that choose which kernels every op runs: another instruction set, so other numerics (measured: each
# of ATEN_CPU_CAPABILITY=avx2 and ONEDNN_MAX_CPU_ISA=AVX2/SSE41 changes the bits of every SmolLM2 output on an
# AVX-512 CPU). They are hardware, not env: a capped CPU is another hardware class (`kernel_dispatch`).
DISPATCH_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ONEDNN_CPU_ISA_HINTS",
                "DNNL_CPU_ISA_HINTS", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR")
# torch's CPU kernel levels, lowest first, and the CPU flags each needs (aten/src/ATen/native/DispatchStub.cpp)
TORCH_CAPABILITIES = {"default": (), "avx2": ("avx2", "fma"), "avx512": ("avx512f", "avx512bw", "avx512vl", "avx512dq", "fma")}

ISA_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_fp16",
             "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8", "asimd", "sve", "sve2", "bf16")


def component(data: Any, info: Any = None) -> dict[str, Any]:
    return {"hash": digest(data), "data": data, "info": info or {}}


class RunFingerprint(dict):
    """A run's fingerprint: {component: {"hash", "data", "info"}}, stored, hashed and written out as this plain
    dict, and read back only through the accessors below (one reader: what `build_fingerprint` writes, these
    read; a component absent from an older run reads as empty)."""

    def part(self, name: str, key: str = "data") -> dict:
        """A component's `data` (or `info`); {} when the run has no such component or the part is not a table."""
        value = (self.get(name) or {}).get(key)
        return value if isinstance(value, dict) else {}

    def component_hash(self, name: str) -> str | None:
        return (self.get(name) or {}).get("hash")

    @property
    def hardware(self) -> dict:
        """The whole hardware component (its hash is the run's hardware class)."""
        return self.get("hardware") or {}

    @property
    def engine(self) -> dict:
        """What the engine recorded about itself: kind, versions, dtype, `args`, `batch_invariance`, ..."""
        return self.part("engine")

    @property
    def env(self) -> dict[str, str]:
        """The allow-listed environment the engine started with (secret-looking values redacted)."""
        return self.part("env")

    def local_path(self, name: str) -> str | None:
        """Where the `model` or `tokenizer` directory was on the machine that ran (info only)."""
        return self.part(name, "info").get("path")

    @property
    def request_hashes(self) -> dict[str, str]:
        """Request key -> its request hash (the suite component)."""
        return self.part("suite").get("requests") or {}

    @property
    def tasks(self) -> dict:
        """The lm-eval tasks' identity (configuration, documents, data files), {} without tasks."""
        return self.part("suite").get("tasks") or {}

    @property
    def adapters(self) -> dict:
        """The suite component's adapters section as stored: `files` (adapter -> its files' hashes) and
        `requests` (key -> {"adapter", "own"}); {} when no request ran under an adapter."""
        return self.part("suite").get("adapters") or {}

    @property
    def adapter_files(self) -> dict[str, dict[str, str]]:
        return self.adapters.get("files") or {}

    @property
    def request_adapters(self) -> dict[str, str]:
        """Request key -> the adapter it ran under (requests of the base model are absent)."""
        return {key: entry["adapter"] for key, entry in (self.adapters.get("requests") or {}).items()}

    def own_hash(self, key: str) -> str | None:
        """A request's hash without its adapter: its text and sampling alone (its request hash without one)."""
        entry = (self.adapters.get("requests") or {}).get(key)
        return entry.get("own") if entry is not None else self.request_hashes.get(key)

    @property
    def adapter_paths(self) -> dict[str, str]:
        """Adapter -> where its files were (info only: the repro pack loads them from there)."""
        return self.part("suite", "info").get("adapters") or {}

    @property
    def unscored(self) -> dict[str, list[str]]:
        """Adapter -> its modules whose delta a rescoring leaves out (vllm#51594; `adapters_info`)."""
        return self.part("suite", "info").get("unscored") or {}

    @property
    def template_date(self) -> str | None:
        """The date the chat templates rendered with, when one read the calendar."""
        return self.part("prompt").get("template_date")


def fingerprint_hash(fingerprint: dict[str, dict]) -> str:
    return digest({name: comp["hash"] for name, comp in sorted(fingerprint.items())})


def delta(old: dict[str, dict], new: dict[str, dict], components=STACK_COMPONENTS) -> list[str]:
    """Names of the components whose hash differs between two fingerprints."""
    return [name for name in components if old.get(name, {}).get("hash") != new.get(name, {}).get("hash")]


def describe_changes(old: dict[str, dict], new: dict[str, dict], names: list[str]) -> dict[str, str]:
    """A short human description of what changed in each named component."""
    out = {}
    for name in names:
        a, b = old.get(name, {}).get("data", {}), new.get(name, {}).get("data", {})
        if isinstance(a, dict) and isinstance(b, dict) and "files" in a and "files" in b:
            files = sorted(k for k in set(a["files"]) | set(b["files"]) if a["files"].get(k) != b["files"].get(k))
            out[name] = _commits(old.get(name, {}).get("info") or {}, new.get(name, {}).get("info") or {}) + \
                "files changed: " + ", ".join(files[:8]) + (" ..." if len(files) > 8 else "")
        elif isinstance(a, dict) and isinstance(b, dict):
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            out[name] = "; ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in keys[:8])
        else:
            out[name] = f"{a!r} -> {b!r}"
    return out


def _commits(old_info: dict, new_info: dict) -> str:
    """"org/name: commit <old sha> -> <new sha>; " when a Hub model moved to another commit."""
    a, b = old_info.get("commit"), new_info.get("commit")
    if not (a or b) or a == b:
        return ""
    repos = dict.fromkeys(filter(None, (old_info.get("repo"), new_info.get("repo"))))
    return f"{' -> '.join(repos) or 'Hub repo'}: commit {a or 'none'} -> {b or 'none'}; "


# --- file hashing, cached by (path, size, mtime) so large weights are hashed once -----------------------


def _cache_file() -> Path:
    return Path(os.environ.get("EVALGATE_HOME", Path.home() / ".cache" / "evalgate")) / "file-hashes.json"


def file_sha256(path: Path, cache: dict | None = None) -> str:
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    if cache is not None and key in cache:
        return cache[key]
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    if cache is not None:
        cache[key] = h.hexdigest()
    return h.hexdigest()


def hash_files(paths: dict[str, Path]) -> dict[str, str]:
    """{name: sha256} for the given files, through the on-disk hash cache."""
    cache_path = _cache_file()
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    before = len(cache)
    hashes = {name: file_sha256(p, cache) for name, p in sorted(paths.items())}
    if len(cache) != before:
        try:
            write_text_atomic(cache_path, json.dumps(cache))
        except OSError:
            pass  # the cache is an optimisation only
    return hashes


def _files_under(root: Path) -> dict[str, Path]:
    if root.is_file():
        return {root.name: root}
    return {
        str(p.relative_to(root)): p
        for p in sorted(root.rglob("*"))
        if p.is_file() and not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(root).parts)
    }


# --- the components --------------------------------------------------------------------------------------


def model_component(model_dir: Path) -> dict:
    """Content hash of every file in the model directory except tokenizer files and docs (not the path:
    vLLM's own fingerprint does not change when weights at the same path change)."""
    files = {n: p for n, p in _files_under(model_dir).items() if Path(n).name not in TOKENIZER_FILES and not _DOC_FILE.search(Path(n).name)}
    return component({"files": hash_files(files)}, _origin(model_dir))


def adapter_files(adapter_dir: Path) -> dict[str, str]:
    """{file: sha256} of a LoRA adapter directory, docs aside: its identity (configuration/adapters.py)."""
    return hash_files({n: p for n, p in _files_under(adapter_dir).items() if not _DOC_FILE.search(Path(n).name)})


def tokenizer_component(tokenizer_dir: Path) -> dict:
    files = {n: p for n, p in _files_under(tokenizer_dir).items() if Path(n).name in TOKENIZER_FILES}
    return component({"files": hash_files(files)}, _origin(tokenizer_dir))


def _origin(directory: Path) -> dict:
    """Where the files came from, for people: the path, and the Hub repo and commit of a hub-cache snapshot.
    Info only: the same files fetched from the Hub or copied to a directory are the same model."""
    return {"path": str(directory), **(hub_origin(directory) or {})}


def code_component(paths: list[Path], root: Path) -> dict:
    """Content of the user-declared paths that affect outputs; git commit and dirty flag as info only."""
    files: dict[str, Path] = {}
    for p in paths:
        base = os.path.relpath(p, root)
        for name, f in _files_under(p).items():
            files[base if p.is_file() else f"{base}/{name}"] = f
    return component({"files": hash_files(files)}, _git_info(root, paths))


def _git_info(root: Path, paths: list[Path]) -> dict:
    def git(*args: str) -> str | None:
        try:
            res = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return res.stdout.strip() if res.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"git": None}
    status = git("status", "--porcelain", "--", *[str(p) for p in paths]) if paths else ""
    return {"git": commit, "dirty": bool(status)}


def torch_cpu_capability(flags: set[str], machine: str, environ: dict[str, str]) -> str | None:
    """The CPU kernels torch dispatches to: the highest level the CPU supports, or a lower one that
    $ATEN_CPU_CAPABILITY asks for (torch ignores a request above what the CPU has). None off x86."""
    if machine.lower() not in ("x86_64", "amd64", "i686", "i386"):
        return environ.get("ATEN_CPU_CAPABILITY") or None
    supported = [level for level, needs in TORCH_CAPABILITIES.items() if all(f in flags for f in needs)]
    asked = environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    return asked if asked in supported else supported[-1]


def kernel_dispatch(flags: set[str], machine: str, environ: dict[str, str]) -> dict[str, str]:
    """What the kernels run with, where a setting moves it off the CPU's own best: torch's capability when
    capped, and every dispatch setting that is set (`DISPATCH_ENV`). Empty on an uncapped machine, so a
    machine's class is the same as before these were recorded."""
    capped = {name: environ[name] for name in DISPATCH_ENV if environ.get(name, "").strip()}
    native = torch_cpu_capability(flags, machine, {})
    actual = torch_cpu_capability(flags, machine, environ)
    capped.pop("ATEN_CPU_CAPABILITY", None)
    if actual != native:
        capped["torch_cpu_capability"] = actual
    return capped


def hardware_component(environ: dict[str, str] | None = None, cpuinfo: tuple[str, set[str]] | None = None) -> dict:
    """The hardware class: CPU model and ISA flags (GPUs when there are any), and the kernel dispatch when a
    setting caps it. `info` says what the kernels run with in any case (`kernels`), for reports."""
    environ = dict(os.environ if environ is None else environ)
    machine = platform.machine()
    data: dict[str, Any] = {"machine": machine, "system": platform.system()}
    cpu_model, flags = cpuinfo or _cpuinfo()
    data["cpu"] = cpu_model
    data["isa"] = sorted(f for f in ISA_FLAGS if f in flags)
    dispatch = kernel_dispatch(flags, machine, environ)
    if dispatch:
        data["dispatch"] = dispatch
    gpus = may_have_gpus()
    if gpus:
        data.update(_torch_gpus())
    kernels = {"torch": torch_cpu_capability(flags, machine, environ),
               "onednn": environ.get("ONEDNN_MAX_CPU_ISA") or environ.get("DNNL_MAX_CPU_ISA") or "native"}
    if "torch" in sys.modules:  # the engine process: torch's own word beside the derivation, for people
        kernels["torch_reported"] = _torch_reported_capability()
    return component(data, {"cpu_count": os.cpu_count(), "driver": _nvidia_driver() if gpus else None,
                            "kernels": kernels})


def _torch_reported_capability() -> str | None:
    try:
        import torch

        return str(torch.backends.cpu.get_cpu_capability()).lower()
    except Exception:  # an old torch without it
        return None


def hardware_label(hardware: dict) -> str:
    """A hardware class for people: the GPU (with its capability) or the CPU, and the kernels in use."""
    data, info = hardware.get("data") or {}, hardware.get("info") or {}
    gpus = data.get("gpus") or []
    if gpus:
        names = sorted({f"{g['name']} (sm {'.'.join(map(str, g.get('capability') or []))})" for g in gpus})
        head = ", ".join(names)
    else:
        isa = data.get("isa") or []
        family = next((f for f in ("amx_tile", "avx512_bf16", "avx512f", "avx2", "avx", "sve2", "sve", "asimd")
                       if f in isa), None)
        head = f"{data.get('cpu') or 'unknown CPU'} ({data.get('machine')}{', ' + family if family else ''})"
    kernels = info.get("kernels") or {}
    dispatch = data.get("dispatch") or {}
    parts = [f"torch {dispatch.get('torch_cpu_capability') or kernels.get('torch')}"] if (
        dispatch.get("torch_cpu_capability") or kernels.get("torch")) else []
    parts += [f"{k}={v}" for k, v in sorted(dispatch.items()) if k != "torch_cpu_capability"]
    return head + (f"; kernels: {', '.join(parts)}" if parts else "")


def _torch_gpus() -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    return {"gpus": [{"name": torch.cuda.get_device_name(i), "capability": list(torch.cuda.get_device_capability(i))}
                     for i in range(torch.cuda.device_count())],
            "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None)}


# Device nodes through which a CUDA (NVIDIA), ROCm (AMD) or XPU (Intel) GPU is used on Linux.
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dri")


def may_have_gpus() -> bool:
    """Whether torch must be asked about GPUs. Importing torch takes seconds, in every evalgate process; on
    Linux without a GPU device node no GPU can be used, torch would list none, and the component is the
    same without asking."""
    if "torch" in sys.modules or not sys.platform.startswith("linux"):
        return True
    return any(os.path.exists(node) for node in GPU_DEVICE_NODES)


def _cpuinfo() -> tuple[str, set[str]]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor(), set()
    model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    flags = re.search(r"^(?:flags|Features)\s*:\s*(.+)$", text, re.M)
    return (model.group(1).strip() if model else platform.processor()), set(flags.group(1).split() if flags else [])


def _nvidia_driver() -> str | None:
    try:
        res = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return res.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def env_snapshot(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The allow-listed variables that may change numerics; secret-looking names keep only "<redacted>"."""
    environ = dict(os.environ if environ is None else environ)
    snapshot = {}
    for name, value in environ.items():
        if name.upper() not in ENV_NAMES and (not name.upper().startswith(ENV_PREFIXES) or ENV_IGNORED.search(name.upper())):
            continue
        if name.upper() in DISPATCH_ENV:  # hardware (`kernel_dispatch`): counted once, there
            continue
        snapshot[name] = REDACTED if SECRET_NAME.search(name) else value
    return dict(sorted(snapshot.items()))


# The libraries that render chat templates and tokenize prompts in evalgate's process (every kind: lm-eval's
# requests and pinned chats are rendered here): an upgrade that renders or tokenizes differently is named.
RENDERERS = ("transformers", "tokenizers", "jinja2")


def renderer_versions() -> dict[str, str | None]:
    """The installed versions of `RENDERERS` (None: not installed), read without importing them."""
    from importlib import metadata

    versions: dict[str, str | None] = {}
    for name in RENDERERS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


# The runtime libraries that do an engine's arithmetic or threading beside torch's own code: OpenMP runtimes,
# allocators, BLAS and oneDNN builds. Which files a process maps is what LD_PRELOAD, LD_LIBRARY_PATH or an
# installed package decides; their content is identity.
RUNTIME_LIBRARY = re.compile(r"(gomp|iomp|omp5|tcmalloc|jemalloc|dnnl|mkl_|openblas|blis|flame|sleef)", re.IGNORECASE)


def runtime_libraries(maps: Path = Path("/proc/self/maps")) -> dict[str, str]:
    """{file name: sha256} of the runtime libraries this process has mapped (`RUNTIME_LIBRARY`), by content,
    not path (a virtualenv elsewhere is the same engine); two files of one name (torch's own libgomp.so.1 and
    a preloaded system one) keep both hashes, sorted. Empty where the system does not say (no /proc)."""
    try:
        lines = maps.read_text().splitlines()
    except OSError:
        return {}
    found = sorted({fields[5] for fields in (line.split(None, 5) for line in lines) if len(fields) == 6})
    paths = [Path(p) for p in found if ".so" in Path(p).name and RUNTIME_LIBRARY.search(Path(p).name)]
    hashes = hash_files({str(p): p for p in paths if p.is_file()})
    by_name: dict[str, list[str]] = {}
    for path, sha in hashes.items():
        by_name.setdefault(Path(path).name, []).append(sha)
    return {name: ",".join(sorted(shas)) for name, shas in sorted(by_name.items())}



def adapters_info(adapters: dict) -> dict:
    """The suite component's info for its adapters: each one's path, and its modules a rescoring leaves out."""
    info: dict = {"adapters": {n: str(a.path) for n, a in sorted(adapters.items())}}
    unscored = {n: list(a.unscored) for n, a in sorted(adapters.items()) if a.unscored}
    if unscored:
        info["unscored"] = unscored
    return info

def build_fingerprint(suite, engine) -> RunFingerprint:
    """All components for a run of `suite` on a loaded `engine`."""
    # An engine without a local model directory (a remote server) describes its model and tokenizer itself.
    own = engine.identity_components()
    return RunFingerprint({
        "model": own.get("model") or model_component(suite.model),
        "tokenizer": own.get("tokenizer") or tokenizer_component(suite.tokenizer or suite.model),
        "engine": component({**engine.identity(), "renderers": renderer_versions()}, engine.identity_info()),
        "code": code_component(suite.code_paths, suite.root),
        # where each adapter's files were (info only: their content is the identity), for repro packs; and the
        # modules of each whose delta a rescoring leaves out (configuration/adapters.py), for judging across hardware
        "suite": component(suite.identity(), adapters_info(suite.adapters) if suite.adapters else None),
        # the date the chat templates were rendered with, when one read it (configuration/template_date.py)
        "prompt": component(engine.template_clock.identity()),
        "hardware": hardware_component(),
        "env": component(engine.launch_env),
    })
