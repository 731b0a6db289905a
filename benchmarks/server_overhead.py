"""evalgate's client overhead per request in server mode, against a raw httpx loop on the same server.

Starts a vLLM api_server on the tiny fp32 model (evalgate's launcher), then sends the same requests
(1) with a bare httpx.AsyncClient, same JSON body, and (2) through `OpenAIEngine.generate` (request
building, retries wrapper, response parsing into Completions, top-k re-ranking, token texts). Both at
concurrency 1 and 8. Prints per-request latency for each and the difference, plus the time spent in
evalgate's own parsing code (`ClientStats.client_seconds`).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/server_overhead.py [--requests 64] [--max-tokens 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--model", default=None, help="model dir (default: build the tiny model)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # what the vllm-server engine sets on CPU
    work = Path(tempfile.mkdtemp(prefix="evalgate-bench-"))
    model = Path(args.model) if args.model else work / "tiny"
    if not args.model:
        from evalgate.models.tinymodel import build_model

        build_model(model, "tiny", seed=0)

    from evalgate.configuration.suite import load_suite
    from evalgate.engines.openai_api import OpenAIEngine
    from evalgate.engines.vllm_server import ServerProcess

    server = ServerProcess(model, {"dtype": "float32", "max_model_len": 512, "enforce_eager": True, "seed": 0},
                           startup_timeout=300).start()
    try:
        prompts = [f"Benchmark prompt {i}: the quick brown fox jumps over the lazy dog" for i in range(args.requests)]
        (work / "prompts.jsonl").write_text("".join(json.dumps({"id": f"b{i}", "prompt": p}) + "\n"
                                                    for i, p in enumerate(prompts)))
        (work / "suite.toml").write_text(f"""
[engine]
kind = "openai"
base_url = "{server.url}"
served_model = "{model}"
model = "{model}"
[sampling]
max_tokens = {args.max_tokens}
logprobs = 5
[prompts]
file = "prompts.jsonl"
""")
        suite = load_suite(work / "suite.toml")
        engine = OpenAIEngine(suite)
        body = {"model": str(model), "max_tokens": args.max_tokens, "temperature": 0.0, "logprobs": 5,
                "return_token_ids": True, "return_tokens_as_token_ids": True}

        async def raw(concurrency: int) -> float:
            import httpx

            async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=None)) as client:
                t0 = time.perf_counter()
                for i in range(0, len(prompts), concurrency):
                    await asyncio.gather(*(client.post(server.url + "/v1/completions", json={**body, "prompt": p})
                                           for p in prompts[i:i + concurrency]))
                return time.perf_counter() - t0

        def through_engine(concurrency: int) -> float:
            t0 = time.perf_counter()
            for i in range(0, len(suite.prompts), concurrency):
                engine.generate(suite.prompts[i:i + concurrency])
            return time.perf_counter() - t0

        through_engine(8)  # warm: token-text cache, connections
        asyncio.run(raw(8))
        for concurrency in (1, 8):
            raws, ours = [], []
            stats0 = (engine.client.stats.client_seconds, engine.client.stats.requests)
            for _ in range(3):
                raws.append(asyncio.run(raw(concurrency)))
                ours.append(through_engine(concurrency))
            parse = (engine.client.stats.client_seconds - stats0[0]) / (engine.client.stats.requests - stats0[1])
            n = len(prompts)
            r, o = statistics.median(raws) / n * 1e3, statistics.median(ours) / n * 1e3
            print(f"concurrency {concurrency}: raw httpx {r:.2f} ms/request, evalgate {o:.2f} ms/request, "
                  f"overhead {o - r:+.2f} ms/request ({(o - r) / r * 100:+.1f}%); evalgate parsing "
                  f"{parse * 1e3:.3f} ms/request")
        engine.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
