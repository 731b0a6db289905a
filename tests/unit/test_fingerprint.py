"""Fingerprint components (docs/design.md "Identity", docs/fingerprint.md), without any engine."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from evalgate.configuration.suite import load_suite
from evalgate.fingerprint import (
    COMPONENTS,
    REDACTED,
    STACK_COMPONENTS,
    code_component,
    component,
    delta,
    describe_changes,
    env_snapshot,
    fingerprint_hash,
    hardware_component,
    hardware_label,
    hash_files,
    model_component,
    runtime_libraries,
    tokenizer_component,
)
from evalgate.hashing import digest


@pytest.fixture(autouse=True)
def evalgate_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "evalgate-home"
    monkeypatch.setenv("EVALGATE_HOME", str(home))
    return home


def write(path: Path, data: bytes | str, mtime_ns: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))
    return path


def model_dir(root: Path, weights: bytes = b"\x00\x01\x02weights") -> Path:
    write(root / "config.json", '{"architectures": ["LlamaForCausalLM"]}')
    write(root / "generation_config.json", '{"do_sample": false}')
    write(root / "model.safetensors", weights)
    write(root / "tokenizer.json", '{"model": {"type": "BPE"}}')
    write(root / "tokenizer_config.json", '{"bos_token": "<s>"}')
    write(root / "chat_template.jinja", "{{ messages }}")
    write(root / "README.md", "# a model")
    write(root / "LICENSE", "Apache")
    write(root / "notes.md", "notes")
    write(root / ".gitattributes", "*.safetensors filter=lfs")
    return root


# --- component / fingerprint_hash / delta ----------------------------------------------------------------


def test_component_hashes_data_only():
    a = component({"x": 1}, {"path": "/a"})
    b = component({"x": 1}, {"path": "/b"})
    assert a["hash"] == b["hash"] == digest({"x": 1})
    assert a["info"] == {"path": "/a"} and component({"x": 1})["info"] == {}
    assert component({"x": 2})["hash"] != a["hash"]


def test_fingerprint_hash_is_digest_of_component_hashes():
    fp = {name: component({"n": name}) for name in COMPONENTS}
    assert fingerprint_hash(fp) == digest({name: c["hash"] for name, c in fp.items()})
    fp2 = dict(fp, env=component({"n": "env"}, {"note": "info differs"}))
    assert fingerprint_hash(fp2) == fingerprint_hash(fp)
    fp3 = dict(fp, env=component({"n": "other"}))
    assert fingerprint_hash(fp3) != fingerprint_hash(fp)


def test_delta_lists_changed_stack_components_in_order():
    old = {name: component({"n": name}) for name in COMPONENTS}
    new = dict(old, env=component({"OMP_NUM_THREADS": "4"}), model=component({"files": {}}),
               suite=component({"requests": {}}))
    assert delta(old, new) == ["model", "env"]  # `suite` is never a stack-wide change
    assert delta(old, old) == []
    assert delta(old, new, components=COMPONENTS) == ["model", "suite", "env"]
    missing = {k: v for k, v in old.items() if k != "hardware"}
    assert delta(old, missing) == ["hardware"]
    # `suite` and `prompt` are judged per request (a request's hash, its prompt ids), never stack-wide
    assert {"suite", "prompt"}.isdisjoint(STACK_COMPONENTS) and set(STACK_COMPONENTS) | {"suite", "prompt"} == set(COMPONENTS)


def test_describe_changes():
    old = {"model": component({"files": {"a.bin": "1", "b.bin": "2"}}), "engine": component({"dtype": "fp32", "seed": 0})}
    new = {"model": component({"files": {"a.bin": "1", "b.bin": "3", "c.bin": "4"}}),
           "engine": component({"dtype": "bf16", "seed": 0})}
    out = describe_changes(old, new, ["model", "engine"])
    assert out["model"] == "files changed: b.bin, c.bin"
    assert out["engine"] == "dtype: 'fp32' -> 'bf16'"


# --- env -------------------------------------------------------------------------------------------------


def test_env_snapshot_allow_list_and_ignore_list():
    environ = {
        "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "0", "VLLM_ATTENTION_BACKEND": "FLASH_ATTN",
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "TORCHINDUCTOR_MAX_AUTOTUNE": "1", "NCCL_ALGO": "Ring",
        # not allow-listed
        "HOME": "/home/x", "PATH": "/usr/bin", "HF_HOME": "/hf", "LANG": "C",
        # allow-listed prefix but cannot change numerics
        "VLLM_CACHE_ROOT": "/c", "TORCHINDUCTOR_CACHE_DIR": "/t", "VLLM_LOGGING_LEVEL": "DEBUG",
        "VLLM_HOST_IP": "10.0.0.1", "VLLM_PORT": "8000", "VLLM_NO_USAGE_STATS": "1", "VLLM_RPC_TIMEOUT": "5",
    }
    assert env_snapshot(environ) == {
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "CUDA_VISIBLE_DEVICES": "0", "NCCL_ALGO": "Ring",
        "OMP_NUM_THREADS": "1", "TORCHINDUCTOR_MAX_AUTOTUNE": "1", "VLLM_ATTENTION_BACKEND": "FLASH_ATTN",
    }
    assert list(env_snapshot(environ)) == sorted(env_snapshot(environ))


AVX512 = ("Some AVX-512 CPU", {"avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"})
AVX2 = ("Some AVX2 CPU", {"avx", "avx2", "fma"})


def stack(environ: dict, cpu=AVX512) -> dict:
    """The components a setting of the environment can move: hardware (kernel dispatch) and env."""
    return {"hardware": hardware_component(environ, cpu), "env": component(env_snapshot(environ))}


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="torch's CPU capabilities are x86's")
def test_a_capped_kernel_dispatch_is_another_hardware_class_never_nothing_changed():
    """ATEN_CPU_CAPABILITY=avx2 on an AVX-512 CPU changes the bits of every output (docs/conditions.md) and was
    in no component: a check under it reported silent regressions, "nothing changed"."""
    native = stack({"OMP_NUM_THREADS": "1"})
    capped = stack({"OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "avx2"})
    assert delta(native, capped, ("hardware", "env")) == ["hardware"]
    assert capped["hardware"]["data"]["dispatch"] == {"torch_cpu_capability": "avx2"}
    assert "kernels: torch avx2" in hardware_label(capped["hardware"])
    # asking for what the CPU does anyway (or more than it has) changes no kernel: the same class
    for same in ({"ATEN_CPU_CAPABILITY": "avx512"}, {"ATEN_CPU_CAPABILITY": "bogus"}):
        assert delta(native, stack({"OMP_NUM_THREADS": "1", **same}), ("hardware", "env")) == []
    assert delta(stack({}, AVX2), stack({"ATEN_CPU_CAPABILITY": "avx512"}, AVX2), ("hardware",)) == []
    assert delta(stack({}, AVX2), stack({"ATEN_CPU_CAPABILITY": "default"}, AVX2), ("hardware",)) == ["hardware"]
    # oneDNN's cap is hardware too, counted once: it left the env component
    onednn = stack({"OMP_NUM_THREADS": "1", "ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert delta(native, onednn, ("hardware", "env")) == ["hardware"]
    assert "ONEDNN_MAX_CPU_ISA" not in onednn["env"]["data"]
    assert onednn["hardware"]["data"]["dispatch"] == {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    # an uncapped machine's class is what it was before dispatch was recorded (committed baselines stay valid)
    assert "dispatch" not in native["hardware"]["data"]


# The settings of docs/fingerprint.md's table ("What moves outputs with the suite file unchanged",
# benchmarks/identity_holes.py) and the component each must move: none may read "nothing changed".
RECORDED = {
    ("OMP_NUM_THREADS", "2"): "env", ("ONEDNN_DEFAULT_FPMATH_MODE", "BF16"): "env",
    ("VLLM_CPU_KVCACHE_SPACE", "2"): "env", ("VLLM_CPU_OMP_THREADS_BIND", "0"): "env",
    ("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"): "env",
    ("ATEN_CPU_CAPABILITY", "avx2"): "hardware", ("ONEDNN_MAX_CPU_ISA", "AVX2"): "hardware",
    ("MKL_ENABLE_INSTRUCTIONS", "AVX2"): "hardware",
}


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="torch's CPU capabilities are x86's")
@pytest.mark.parametrize("setting", sorted(RECORDED), ids="=".join)
def test_every_setting_found_to_move_outputs_is_recorded(setting):
    base = {"OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    name, value = setting
    assert delta(stack(base), stack({**base, name: value}), ("hardware", "env")) == [RECORDED[setting]]


def test_runtime_libraries_are_the_mapped_files_by_content(tmp_path):
    """Which OpenMP, allocator or BLAS a process loaded is decided outside the suite (LD_PRELOAD,
    LD_LIBRARY_PATH, a package): the engine component holds their content, read from the process's maps."""
    gomp, other = tmp_path / "libgomp.so.1", tmp_path / "libpython3.so"
    gomp.write_bytes(b"one runtime")
    other.write_bytes(b"not a runtime library")
    maps = tmp_path / "maps"
    maps.write_text("".join(f"7f00-7f01 r-xp 00000000 08:01 12 {p}\n" for p in (gomp, other, gomp))
                    + "7f02-7f03 rw-p 00000000 00:00 0 \n")
    first = runtime_libraries(maps)
    assert list(first) == ["libgomp.so.1"]
    twin = tmp_path / "elsewhere" / "libgomp.so.1"  # one name, two files: both count, in a fixed order
    twin.parent.mkdir()
    twin.write_bytes(b"a second runtime")
    maps.write_text(maps.read_text() + f"7f04-7f05 r-xp 00000000 08:01 13 {twin}\n")
    both = runtime_libraries(maps)
    assert len(both["libgomp.so.1"].split(",")) == 2 and both == runtime_libraries(maps)
    maps.write_text(maps.read_text().replace(f" {twin}\n", " \n"))
    gomp.write_bytes(b"another runtime, same name")
    assert runtime_libraries(maps) != first
    assert runtime_libraries(tmp_path / "absent") == {}


@pytest.mark.parametrize("name", ["VLLM_API_KEY", "VLLM_AUTH_HEADER", "NVIDIA_API_TOKEN", "CUDA_SECRET",
                                  "TORCH_PASSWORD", "vllm_api_key", "VLLM_DB_PASSWD", "NCCL_CREDENTIALS"])
def test_env_snapshot_redacts_secret_looking_names(name):
    secret = "s3cr3t-value-123"
    snap = env_snapshot({name: secret, "OMP_NUM_THREADS": "2"})
    assert snap[name] == REDACTED
    assert snap["OMP_NUM_THREADS"] == "2"
    assert secret.encode() not in json.dumps(snap).encode()
    assert secret not in json.dumps(component(snap))


@pytest.mark.parametrize("name", ["VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD", "VLLM_MAX_TOKENS_PER_EXPERT_FP4_MOE",
                                  "VLLM_USE_FASTOKENS", "VLLM_KEYED_CACHE_SIZE"])
def test_numeric_knobs_with_token_or_key_inside_the_name_stay_visible(name):
    assert env_snapshot({name: "64"}) == {name: "64"}


def test_env_snapshot_reads_os_environ(monkeypatch):
    monkeypatch.setenv("VLLM_TEST_KNOB_XYZ", "7")
    monkeypatch.setenv("VLLM_TEST_API_KEY", "hunter2")
    snap = env_snapshot()
    assert snap["VLLM_TEST_KNOB_XYZ"] == "7" and snap["VLLM_TEST_API_KEY"] == REDACTED
    assert "hunter2" not in json.dumps(snap)


# --- model / tokenizer -----------------------------------------------------------------------------------


def test_model_component_is_a_content_hash_not_a_path(tmp_path):
    a = model_component(model_dir(tmp_path / "a"))
    b = model_component(model_dir(tmp_path / "elsewhere" / "b"))
    assert a["hash"] == b["hash"]
    assert a["info"]["path"] != b["info"]["path"]


def test_model_component_changes_with_one_byte_at_the_same_path(tmp_path):
    root = model_dir(tmp_path / "m", b"\x00\x01\x02weights")
    weights = root / "model.safetensors"
    os.utime(weights, ns=(1_700_000_000_000_000_000,) * 2)
    before = model_component(root)
    write(weights, b"\x00\x01\x03weights", mtime_ns=1_700_000_001_000_000_000)  # same size, one byte
    after = model_component(root)
    assert before["hash"] != after["hash"]
    assert before["data"]["files"]["config.json"] == after["data"]["files"]["config.json"]
    assert before["data"]["files"]["model.safetensors"] != after["data"]["files"]["model.safetensors"]


def test_model_and_tokenizer_files_are_separated_and_docs_ignored(tmp_path):
    root = model_dir(tmp_path / "m")
    write(root / "sub" / "README.txt", "doc")
    write(root / "sub" / "shard-2.bin", b"\x09")
    write(root / "__pycache__" / "x.pyc", b"\x00")
    model = model_component(root)["data"]["files"]
    tok = tokenizer_component(root)["data"]["files"]
    assert set(model) == {"config.json", "generation_config.json", "model.safetensors", "sub/shard-2.bin"}
    assert set(tok) == {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}
    before = model_component(root)["hash"]
    write(root / "README.md", "# edited docs")
    write(root / "LICENSE", "MIT")
    assert model_component(root)["hash"] == before
    tok_before = tokenizer_component(root)["hash"]
    write(root / "chat_template.jinja", "{{ messages | join }}", mtime_ns=1_800_000_000_000_000_000)
    assert tokenizer_component(root)["hash"] != tok_before
    assert model_component(root)["hash"] == before  # a tokenizer change is not a model change


def test_file_sha256_values(tmp_path):
    import hashlib

    f = write(tmp_path / "w.bin", b"abc")
    assert hash_files({"w.bin": f}) == {"w.bin": hashlib.sha256(b"abc").hexdigest()}


def test_hash_cache_is_used(tmp_path, evalgate_home):
    import hashlib

    root = model_dir(tmp_path / "m")
    first = model_component(root)
    cache_file = evalgate_home / "file-hashes.json"
    cache = json.loads(cache_file.read_text())
    weights = root / "model.safetensors"
    st = weights.stat()
    key = f"{weights.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    assert cache[key] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert len(cache) == 3  # config.json, generation_config.json, model.safetensors

    # A poisoned entry is returned as is: the second call does not read the file again.
    cache[key] = "0" * 64
    cache_file.write_text(json.dumps(cache))
    second = model_component(root)
    assert second["data"]["files"]["model.safetensors"] == "0" * 64
    assert second["hash"] != first["hash"]


def test_hash_cache_is_not_consulted_after_mtime_change(tmp_path, evalgate_home, monkeypatch):
    root = model_dir(tmp_path / "m")
    model_component(root)
    reads = []
    real_open = Path.open

    def counting_open(self, *args, **kwargs):
        if "file-hashes." not in self.name:  # the cache itself (and its temporary file)
            reads.append(self.name)
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", counting_open)
    model_component(root)
    assert reads == []  # everything came from the cache
    os.utime(root / "model.safetensors", ns=(1_600_000_000_000_000_000,) * 2)
    model_component(root)
    assert reads == ["model.safetensors"]


def test_unwritable_cache_is_not_fatal(tmp_path, monkeypatch):
    blocker = write(tmp_path / "not-a-dir", "x")
    monkeypatch.setenv("EVALGATE_HOME", str(blocker))
    assert model_component(model_dir(tmp_path / "m"))["data"]["files"]


# --- code ------------------------------------------------------------------------------------------------


def git(repo: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@example.com", GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path) -> Path:
    root = tmp_path / "repo"
    write(root / "templates" / "chat.j2", "Q: {{ q }}")
    write(root / "templates" / "sub" / "sys.txt", "be brief")
    write(root / "templates" / "__pycache__" / "c.pyc", b"\x00")
    write(root / "serve.py", "print('serve')")
    write(root / "unrelated.txt", "one")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "first")
    return root


def test_code_component_covers_declared_files_and_dirs(repo):
    comp = code_component([repo / "templates", repo / "serve.py"], repo)
    assert set(comp["data"]["files"]) == {"templates/chat.j2", "templates/sub/sys.txt", "serve.py"}
    assert comp["info"] == {"git": git(repo, "rev-parse", "HEAD"), "dirty": False}


def test_code_component_ignores_the_git_commit(repo):
    paths = [repo / "templates", repo / "serve.py"]
    first = code_component(paths, repo)
    write(repo / "unrelated.txt", "two")
    git(repo, "commit", "-q", "-am", "second")
    second = code_component(paths, repo)
    assert second["info"]["git"] != first["info"]["git"]
    assert second["hash"] == first["hash"]

    write(repo / "templates" / "sub" / "sys.txt", "be verbose", mtime_ns=1_900_000_000_000_000_000)
    dirty = code_component(paths, repo)
    assert dirty["hash"] != first["hash"]
    assert dirty["info"]["dirty"] is True
    git(repo, "commit", "-q", "-am", "third")
    committed = code_component(paths, repo)
    assert committed["hash"] == dirty["hash"] and committed["info"]["dirty"] is False


def test_code_component_outside_git(tmp_path):
    f = write(tmp_path / "plain" / "t.txt", "x")
    comp = code_component([f], tmp_path / "plain")
    assert comp["data"]["files"] == {"t.txt": hash_files({"t": f})["t"]}
    assert comp["info"]["git"] is None
    assert code_component([], tmp_path / "plain")["data"] == {"files": {}}


# --- runtime knobs are not identity ----------------------------------------------------------------------

SUITE = """
[suite]
name = "knobs"
database = "{database}"

[engine]
model = "model"
dtype = "float32"

[sampling]
max_tokens = {max_tokens}
logprobs = 5

[prompts]
file = "{prompts}"

[schedule]
{schedule}
"""


def make_suite(directory: Path, *, database="sqlite:///evalgate.sqlite", max_tokens=16, schedule="",
               prompts=None) -> Path:
    model_dir(directory / "model")
    prompts = prompts or [{"id": "a", "prompt": "Hello"}, {"id": "b", "prompt": "World", "max_tokens": 4}]
    write(directory / "prompts.jsonl", "\n".join(json.dumps(p) for p in prompts) + "\n")
    return write(directory / "evalgate.toml", SUITE.format(database=database, max_tokens=max_tokens,
                                                           prompts="prompts.jsonl", schedule=schedule))


def test_runtime_knobs_are_excluded_from_identity(tmp_path):
    one = load_suite(make_suite(tmp_path / "one", schedule="concurrency = [1, 8]\nshuffles = 1\nrepeats = 1\nseed = 0"))
    two = load_suite(make_suite(tmp_path / "two", database="postgresql://ci@db/evalgate",
                                schedule="concurrency = [2, 16, 64]\nshuffles = 5\nrepeats = 3\nseed = 1234"))
    assert one.schedule != two.schedule and one.database != two.database
    assert one.identity() == two.identity()
    assert component(one.identity())["hash"] == component(two.identity())["hash"]
    assert [one.request_hash(p) for p in one.prompts] == [two.request_hash(p) for p in two.prompts]


def test_prompt_and_sampling_changes_are_identity(tmp_path):
    base = load_suite(make_suite(tmp_path / "base"))
    text = load_suite(make_suite(tmp_path / "text", prompts=[{"id": "a", "prompt": "Hello!"},
                                                            {"id": "b", "prompt": "World", "max_tokens": 4}]))
    sampling = load_suite(make_suite(tmp_path / "sampling", max_tokens=17))
    per_prompt = load_suite(make_suite(tmp_path / "per-prompt", prompts=[{"id": "a", "prompt": "Hello"},
                                                                        {"id": "b", "prompt": "World", "max_tokens": 5}]))
    b_ids = base.identity()["requests"]
    assert text.identity()["requests"] == {"a": ne(b_ids["a"]), "b": b_ids["b"]}
    # max_tokens = 16 in [sampling] applies to `a` only: `b` has its own max_tokens.
    assert sampling.identity()["requests"] == {"a": ne(b_ids["a"]), "b": b_ids["b"]}
    assert per_prompt.identity()["requests"] == {"a": b_ids["a"], "b": ne(b_ids["b"])}
    for other in (text, sampling, per_prompt):
        assert component(other.identity())["hash"] != component(base.identity())["hash"]


class ne:
    """Compares equal to anything except the given value."""

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return other != self.value

    def __repr__(self):
        return f"ne({self.value!r})"


def test_a_run_fingerprint_is_read_through_one_typed_reader_and_absent_parts_read_empty():
    from evalgate.fingerprint import RunFingerprint, component

    suite = {"requests": {"a": "ha", "b": "hb"},
             "adapters": {"files": {"legal": {"w.safetensors": "1"}}, "requests": {"b": {"adapter": "legal", "own": "ob"}}}}
    fp = RunFingerprint({"suite": component(suite, {"adapters": {"legal": "/x"}, "unscored": {"legal": ["lm_head"]}}),
                         "engine": component({"dtype": "float32"}), "prompt": component({"template_date": "2026-01-02"})})
    assert fp.request_adapters == {"b": "legal"} and fp.adapter_files == {"legal": {"w.safetensors": "1"}}
    assert (fp.own_hash("a"), fp.own_hash("b")) == ("ha", "ob")  # without an adapter, the request hash itself
    assert (fp.adapter_paths, fp.unscored) == ({"legal": "/x"}, {"legal": ["lm_head"]})
    assert (fp.engine, fp.template_date, fp.component_hash("engine")) == ({"dtype": "float32"}, "2026-01-02",
                                                                           component({"dtype": "float32"})["hash"])
    old = RunFingerprint({"engine": {"hash": "e", "data": "not a table"}})  # an older run, a component missing
    assert (old.engine, old.env, old.hardware, old.request_adapters, old.tasks, old.template_date) == ({}, {}, {}, {}, {}, None)
    assert json.loads(json.dumps(fp)) == dict(fp)  # stored and hashed as the plain dict it is
