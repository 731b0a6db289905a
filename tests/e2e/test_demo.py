"""`evalgate demo` on the fake test engine, both branches on any machine: where the engine varies (the fake
engine's `fake_vary_with_batch`) the finding is the first lesson, the setting that removes it is written
into the suite and verified by a second baseline, and the journey still ends PASS, then explained change,
exit 0; where nothing varies it goes straight on. Step 2 is `evalgate survey` (its table, the flips' answers).
The real model's tokenizer and weights (SmolLM2, built
once per session) feed lm-eval and the weight swap as in `make demo`; `make demo` itself runs real vLLM."""

from __future__ import annotations

import re
import shutil

import pytest
from helpers import cached_model

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def smollm2(models_dir):
    return cached_model(models_dir, "smollm2")


def demo(cli, tmp_path, smollm2, engine_extra: str):
    shutil.copytree(smollm2, tmp_path / "ws" / "model")
    return cli("demo", "--dir", tmp_path / "ws", "--engine-extra", engine_extra, timeout=1200)


def test_demo_where_the_engine_varies_teaches_it_then_goes_on(cli, tmp_path, smollm2):
    proc = demo(cli, tmp_path, smollm2, 'kind = "fake"\nfake_vary_with_batch = ["chat-01", "chat-05"]')
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-3000:]
    lesson = out[out.index("2. evalgate survey: what varies on this machine"):out.index("3. evalgate baseline create")]
    assert re.search(r"batch size 1→8 +batch size +2/\d+", lesson), lesson[:3000]
    assert re.search(r"chat-01: a (near-tie|confident) token flip at output token \d+ \(margin ", lesson)
    assert "concurrency 1: '" in lesson and "concurrency 8: '" in lesson  # both answers, side by side
    assert "why: without batch-invariant kernels" in lesson
    assert "first: batch_invariant = true in [engine]" in lesson  # the kernels are offered before any fallback
    assert "removed by, in [engine]: max_num_seqs = 1 (batch size)" in lesson
    assert "it is never a baseline" in lesson and "written into" in lesson
    # the batch-invariant kernels are asked first; the fake engine has none, so one sequence at a time it is
    again = out[out.index("2b. evalgate survey again, batch_invariant = true"):out.index("3. evalgate baseline create")]
    assert "written into" in again and "batch_invariant = false, max_num_seqs = 1" in again
    assert "the remedy, measured: its passes agree" in out and "output tokens/s" in out
    suite = (tmp_path / "ws" / "evalgate.toml").read_text(encoding="utf-8")
    assert "max_num_seqs = 1" in suite.split("[sampling]")[0]
    assert "PASS" in out[out.index("4. evalgate check"):]
    assert "explained_change" in out[out.index("6. evalgate check"):]
    assert "attributed to model" in out


def test_demo_where_nothing_varies_goes_straight_on(cli, tmp_path, smollm2):
    proc = demo(cli, tmp_path, smollm2, 'kind = "fake"')
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    assert "nothing varies here that the gate fails on" in proc.stdout and "invariant under: batch size 1→8" in proc.stdout
    assert "max_num_seqs" not in (tmp_path / "ws" / "evalgate.toml").read_text(encoding="utf-8")
    assert "attributed to model" in proc.stdout
