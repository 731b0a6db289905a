"""Print the environment of the lowest instruction-set class this machine emulates for vLLM: `make test-isa`
runs the machine-dependent e2e tests under it, so another CPU's numerics are seen before a CI runner of
another kind sees them (docs/design.md, "Tests on any CPU").

Candidates, lowest first: torch's kernels capped at AVX2 together with oneDNN's (an AVX2 machine's kernels on
an AVX-512 one), torch's alone (oneDNN's bf16 path dies of SIGILL under any cap on an AMX Xeon), and oneDNN's
capped at AVX (on an AVX2-only CPU, where torch's AVX2 is its own). A candidate counts only if evalgate's
fingerprint takes it for another hardware class and a tiny model generates under it in vLLM, in fp32 and
bf16 (a few seconds each). Prints `NAME=value ...` (nothing where no candidate works) and the reason on stderr.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

CANDIDATES = [{"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}, {"ATEN_CPU_CAPABILITY": "avx2"},
              {"ONEDNN_MAX_CPU_ISA": "AVX"}]
PROBE = """
import sys
from vllm import LLM, SamplingParams
llm = LLM(model=sys.argv[1], dtype=sys.argv[2], max_model_len=256, enforce_eager=True, seed=0)
out = llm.generate(["a b c d e f g"] * 3, SamplingParams(max_tokens=4, temperature=0.0), use_tqdm=False)
assert all(len(o.outputs[0].token_ids) == 4 for o in out)
"""
ENV = {"OMP_NUM_THREADS": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
       "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def runs(model: str, caps: dict[str, str]) -> str | None:
    """None if vLLM generates in fp32 and bf16 under `caps`; else why not."""
    env = {**os.environ, **ENV, **caps}
    for dtype in ("float32", "bfloat16"):
        proc = subprocess.run([sys.executable, "-c", PROBE, model, dtype], env=env, capture_output=True, text=True,
                              timeout=300)
        if proc.returncode != 0:
            return f"{dtype}: exit {proc.returncode} {(proc.stderr.strip().splitlines() or [''])[-1][:100]}"
    return None


def main() -> int:
    from evalgate.fingerprint import hardware_component
    from evalgate.models.tinymodel import build_model

    native = hardware_component(dict(os.environ))["hash"]
    with tempfile.TemporaryDirectory() as tmp:
        build_model(f"{tmp}/tiny")
        for caps in CANDIDATES:
            words = " ".join(f"{k}={v}" for k, v in caps.items())
            if hardware_component({**os.environ, **caps})["hash"] == native:
                print(f"{words}: this CPU's own class", file=sys.stderr)
                continue
            why = runs(f"{tmp}/tiny", caps)
            if why is None:
                print(f"{words}: another class, vLLM runs under it", file=sys.stderr)
                print(words)
                return 0
            print(f"{words}: {why}", file=sys.stderr)
    print("no lower instruction-set class runs vLLM here", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
