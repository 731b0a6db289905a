"""evalgate's CPU batch-invariant mode in real vLLM (evalgate/kernels, docs/conditions.md "CPU batch invariance").

What varies on a CPU depends on the CPU, so the batch effect these tests remove is planted where vLLM's own
varies (tests/planted: vLLM's CPU GEMM kernels give a call of fewer than 4 rows other bits), and the claim is
held on every CPU: with the mode on, nothing differs; off, the planted effect shows; plain vLLM with evalgate's
plugin on the same plan gives the same zeros. The kernels' own row invariance is asked of the kernels vLLM picks
on this CPU, for shapes drawn at random."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys

import pytest
from helpers import TEST_ENV, planted_linear_variance, write_suite
from variance import differing_keys, long_prompts, run_plain_vllm, tiny_prompts

pytestmark = pytest.mark.e2e

PROMPTS = list(tiny_prompts(12))
# 39 to 1,019 of the tiny tokenizer's tokens: long enough that two threads cut a crowded call inside a request
CROWD_PROMPTS = list(long_prompts(12, 8, 24))


def survey_counts(stdout: str) -> dict[str, int]:
    """The survey table's rows (comparison, factor, differing/requests): comparison -> requests differing."""
    rows = [re.split(r"\s{2,}", line.strip()) for line in stdout.splitlines()]
    return {row[0]: int(row[-1].split("/")[0]) for row in rows if len(row) == 3 and re.fullmatch(r"\d+/\d+", row[-1])}


def test_the_mode_removes_a_planted_batch_effect_on_every_comparison_of_the_vllm_survey(cli, tmp_path, tiny_model):
    """The planted effect shows in plain vLLM (the next test); with the mode on, the survey finds it nowhere."""
    cli.env = {**cli.env, **planted_linear_variance(cli.env)}
    suite = write_suite(tmp_path / "ws", tiny_model, PROMPTS, concurrency=(1, len(PROMPTS)), max_tokens=8,
                        batch_invariant=True)
    surveyed = cli("survey", suite, "--probes", "vllm", check=0).stdout
    counts = survey_counts(surveyed)
    assert "NOT in force" not in surveyed and "batch-invariant kernels in force" in surveyed
    # every comparison of the preset ran, and none differs: batch size and its edges, order, neighbours, prefix
    # cache (hot and half), prefill vs decode, chunked prefill, preemption
    for comparison in ("batch size 1→12", "order", "neighbours", "prefix cache cold→hot", "prefill vs decode",
                       "chunked prefill", "preemption"):
        assert any(name.startswith(comparison) for name in counts), (comparison, surveyed)
    assert len(counts) >= 10 and all(n == 0 for n in counts.values()), surveyed
    assert "nothing varies here" in surveyed


def assert_prefill_scores_as_decode(conditions: dict) -> None:
    """Prefill vs decode: each output's own logprobs ("alone"), scored again by one prefill of prompt + output."""
    for key, out in conditions["alone"].items():
        decoded = [struct.unpack("<d", bytes.fromhex(b))[0] for b in out["logprob_bits"]]
        assert conditions["rescored"][key]["logprobs"] == decoded, key


def test_plain_vllm_with_the_plugin_gives_the_same_zeros(cli, tmp_path, tiny_model):
    """The oracle: tests/raw_vllm.py, no evalgate code but the plugin vLLM loads, with the mode on and off."""
    plan = {"model": str(tiny_model), "dtype": "float32",
            "engine": {"max_model_len": 512, "enforce_eager": True, "seed": 0},
            "sampling": {"temperature": 0.0, "max_tokens": 8, "logprobs": 5},
            "prompts": [{"key": f"p{i}", "prompt": p} for i, p in enumerate(PROMPTS)],
            "conditions": [{"name": "alone", "concurrency": 1, "salt": "alone"},
                           {"name": "hot", "concurrency": 1, "salt": "alone"},
                           {"name": "crowded", "concurrency": len(PROMPTS), "salt": "crowded"},
                           {"name": "pairs", "concurrency": 2, "salt": "pairs", "order_seed": 3},
                           {"name": "rescored", "rescore": "alone"}]}
    env = {**cli.env, **planted_linear_variance(cli.env)}
    plain = run_plain_vllm(plan, tmp_path / "off", env)
    assert differing_keys(plain["alone"], plain["crowded"])  # the planted effect, plain vLLM
    on = run_plain_vllm(plan, tmp_path / "on", {**env, "EVALGATE_CPU_BATCH_INVARIANT": "1"})
    for condition in ("hot", "crowded", "pairs"):
        assert differing_keys(on["alone"], on[condition]) == [], condition
    assert_prefill_scores_as_decode(on)


def test_rows_of_vllms_cpu_kernels_keep_their_bits_in_any_batch_once_tiled(tmp_path):
    """Each linear path vLLM picks here, on random shapes and dtypes, tiled as the mode tiles it: a row's bits
    alone equal its bits in a batch of any size and at any place; the attention check passes; and the layers
    the mode does not cover are named."""
    script = tmp_path / "rows.py"
    script.write_text(ROWS_SCRIPT, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], env={**os.environ, **TEST_ENV}, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["checked"] == 10 and result["failures"] == [], result
    assert result["attention"] and result["attention"] == [None] * len(result["attention"]), result
    # what the mode does not cover is named, so a report never claims it
    assert result["uncovered"] == ["LoRA adapters (vLLM's CPU punica ops)", "attention backend FlashAttentionImpl",
                                   "mixture-of-experts layers (FusedMoE)"]


def test_each_activation_row_keeps_its_bits_under_two_threads(tmp_path):
    """PyTorch computes an activation over the call's whole tensor, one slice per thread, and the end of a slice
    takes a scalar path: a row cut there gets other bits. Each activation the mode knows, row-wise, at widths a
    vector does and does not divide, two threads: a row's bits alone equal its bits in calls of any size, at any
    place, and the values are still the activation's. The ones it does not know, and a model file that calls one
inline, are named."""
    script = tmp_path / "activations.py"
    script.write_text(ACTIVATIONS_SCRIPT, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], env={**os.environ, **TEST_ENV, "OMP_NUM_THREADS": "2"},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["checked"] == 2 * 3 * 10 and result["failures"] == [] and result["far"] == [], result
    assert result["uncovered"] == ["a final logit soft cap (tanh over the batch's whole logits)",
                                   "activations computed over the batch's whole tensor (MulAndSilu, Tanh)",
                                   "an activation vLLM's laguna.py calls inline (the mode computes only activation "
                                   "layers row by row)"]


def test_a_model_keeps_each_requests_bits_under_two_threads(tmp_path, tiny_model):
    """The model-level oracle with two threads (tests/raw_vllm.py, plain vLLM with the plugin), on a Llama whose
    MLP is 360 wide (a thread's slice of its activation ends inside a row on any vector width) and whose heads
    are 80 wide, with prompts of 39 to 1,019 tokens: two threads cut a crowded call's attention by the call's
    total, and so inside a long request. With the mode on, each request's bits alone equal its bits among all
    twelve, in pairs and shuffled (no prompt is chunked: the crowd alone). Served from the prefix cache, and
    scored again by one prefill, they are equal too wherever the mode says chunks keep their bits that far."""
    model = tmp_path / "wide-mlp"
    subprocess.run([sys.executable, "-c", WIDE_MLP_SCRIPT, str(tiny_model), str(model)], check=True,
                   env={**os.environ, **TEST_ENV}, capture_output=True, timeout=300)
    plan = {"model": str(model), "dtype": "float32",
            "engine": {"max_model_len": 2048, "max_num_batched_tokens": 16384, "enforce_eager": True, "seed": 0},
            "sampling": {"temperature": 0.0, "max_tokens": 4, "logprobs": 5},
            "prompts": [{"key": f"p{i}", "prompt": p} for i, p in enumerate(CROWD_PROMPTS)],
            "conditions": [{"name": "alone", "concurrency": 1, "salt": "alone"},
                           {"name": "hot", "concurrency": 1, "salt": "alone"},
                           {"name": "crowded", "concurrency": len(CROWD_PROMPTS), "salt": "crowded"},
                           {"name": "pairs", "concurrency": 2, "salt": "pairs", "order_seed": 3},
                           {"name": "rescored", "rescore": "alone"}]}
    status = tmp_path / "status.json"
    env = {**os.environ, **TEST_ENV, "OMP_NUM_THREADS": "2", "EVALGATE_CPU_BATCH_INVARIANT": "1",
           "EVALGATE_CPU_INVARIANT_STATUS": str(status)}
    on = run_plain_vllm(plan, tmp_path / "on", env)
    for condition in ("crowded", "pairs"):
        assert differing_keys(on["alone"], on[condition]) == [], condition
    # a cache hit starts a request's queries at a cache block, a rescoring prefill scores each output token
    # where its decode did: the same bits wherever the check held chunks to the longest sequence here
    checked = json.loads(status.read_text(encoding="utf-8"))["attention"]
    longest = 1024 + plan["sampling"]["max_tokens"]  # the prompts are at most 1,019 tokens
    assert checked, "the plugin reported no attention check"
    if all(a["chunks_hold_to"] >= longest for a in checked):
        assert differing_keys(on["alone"], on["hot"]) == []
        assert any(out["cached_tokens"] for out in on["hot"].values())
        assert_prefill_scores_as_decode(on)


WIDE_MLP_SCRIPT = r'''
import shutil, sys, torch, transformers
tiny, out = sys.argv[1:]
torch.manual_seed(0)
config = transformers.AutoConfig.from_pretrained(tiny)
config.intermediate_size, config.num_hidden_layers = 360, 2
config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim = 160, 2, 2, 80
config.max_position_embeddings = 2048
model = transformers.AutoModelForCausalLM.from_config(config).to(torch.float32)
with torch.no_grad():
    for parameter in model.parameters():
        parameter.normal_(0, 0.3)
model.save_pretrained(out)
for name in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(f"{tiny}/{name}", f"{out}/{name}")
'''


ACTIVATIONS_SCRIPT = r'''
import json, torch
from vllm.platforms import current_platform
current_platform.import_kernels()
from vllm.model_executor.layers import activation as vllm_act
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from evalgate.kernels.activation import make_row_wise
from evalgate.kernels.install import uncovered_ops

configured = set_current_vllm_config(VllmConfig())  # vLLM's layers are built inside an engine's configuration
configured.__enter__()
torch.manual_seed(0)
modules = {"SiluAndMul": lambda: vllm_act.SiluAndMul(), "GeluAndMul": lambda: vllm_act.GeluAndMul(),
           "GeluAndMul tanh": lambda: vllm_act.GeluAndMul(approximate="tanh"), "GELU": lambda: vllm_act.GELU(),
           "GELUTanh": lambda: vllm_act.GELUTanh(), "NewGELU": lambda: vllm_act.NewGELU(),
           "FastGELU": lambda: vllm_act.FastGELU(), "QuickGELU": lambda: vllm_act.QuickGELU(),
           "nn.SiLU": lambda: torch.nn.SiLU(), "nn.GELU tanh": lambda: torch.nn.GELU(approximate="tanh")}
failures, far, checked = [], [], 0
for dtype in (torch.float32, torch.bfloat16):
    for width in (352, 360, 100):
        for name, make in modules.items():
            native, module = make(), make()
            assert make_row_wise(module), name
            gated = name.split()[0].endswith("AndMul")
            x = (torch.randn(301, 2 * width if gated else width) * 3).to(dtype)
            alone = [module(x[i:i + 1])[0] for i in range(len(x))]
            for m in (2, 3, 37, 129, 301):
                batch, flipped = module(x[:m]), module(x[:m].flip(0))
                for i in range(m):
                    if not (torch.equal(batch[i], alone[i]) and torch.equal(flipped[m - 1 - i], alone[i])):
                        failures.append(f"{name} {dtype} {width} row {i} of {m}")
                        break
            tolerance = 1e-5 if dtype == torch.float32 else 2e-2
            if not torch.allclose(module(x).float(), native(x).float(), rtol=tolerance, atol=tolerance):
                far.append(f"{name} {dtype} {width}")
            checked += 1
head = LogitsProcessor(64, soft_cap=30.0)
Inline = type("LagunaMLP", (torch.nn.Module,), {"__module__": "vllm.model_executor.models.laguna"})  # F.silu(gate)
Layered = type("LlamaMLP", (torch.nn.Module,), {"__module__": "vllm.model_executor.models.llama"})   # SiluAndMul
uncovered = uncovered_ops(torch.nn.Sequential(vllm_act.SiluAndMul(), vllm_act.MulAndSilu(), torch.nn.Tanh(),
                                              torch.nn.ReLU(), head, Inline(), Layered()))
print(json.dumps({"checked": checked, "failures": failures[:5], "far": far, "uncovered": uncovered}))
'''


ROWS_SCRIPT = r'''
import json, random, torch
from vllm.platforms import current_platform
current_platform.import_kernels()
from vllm.model_executor.layers import utils
from evalgate.kernels.attention import AttentionConfig, check_attention
from evalgate.kernels.install import linear_for
from evalgate.kernels.linear import calibrate, tiled

rng = random.Random(7)
failures, checked = [], 0
for dtype in (torch.float32, torch.bfloat16):
    for _ in range(5):
        k, n = rng.choice((64, 128, 352, 576, 1536)), rng.choice((64, 128, 576, 960, 3072))
        geometry = calibrate(lambda w: linear_for(utils.dispatch_cpu_unquantized_gemm, w), k, n, dtype)
        weight = (torch.randn(n, k) / k ** 0.5).to(dtype)
        path, fn = linear_for(utils.dispatch_cpu_unquantized_gemm, weight)
        linear = tiled(lambda x, w, bias=None: fn(x, w), geometry)
        x = torch.randn(70, k).to(dtype)
        alone = [linear(x[i:i + 1], weight)[0] for i in range(70)]
        for m in (1, 2, 3, 4, 5, 9, 31, 32, 33, 64, 70):
            batch = linear(x[:m], weight)
            flipped = linear(x[:m].flip(0), weight)
            for i in range(m):
                if not (torch.equal(batch[i], alone[i]) and torch.equal(flipped[m - 1 - i], alone[i])):
                    failures.append(f"{path} {dtype} {k}x{n} {geometry} row {i} of {m}")
                    break
        checked += 1
attention = []
for dtype in ("float32", "bfloat16"):
    for heads, kv, dim in ((4, 2, 64), (9, 3, 64), (8, 8, 128)):
        isa = "amx" if dtype == "bfloat16" and torch.cpu._is_amx_tile_supported() else "vec"
        attention.append(check_attention(AttentionConfig(heads, kv, dim, dtype, 128, isa, -1, "auto")).varies)
from evalgate.kernels.install import uncovered_ops


class FusedMoE(torch.nn.Module):  # named as vLLM names its layers: the mode reads the class
    pass


class FlashAttentionImpl:
    pass


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.impl = FlashAttentionImpl()


uncovered = uncovered_ops(torch.nn.Sequential(FusedMoE(), Attention(), torch.nn.Linear(2, 2)), lora=True)
print(json.dumps({"checked": checked, "failures": failures[:5], "attention": attention, "uncovered": uncovered}))
'''
