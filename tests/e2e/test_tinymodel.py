"""The local model builder: byte-identical per (preset, seed), different weights per seed, cached."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest


def tree_digest(directory) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def build(out, *args):
    subprocess.run([sys.executable, "-m", "evalgate", "build-model", str(out), *args], check=True,
                   capture_output=True, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.e2e
def test_builds_are_byte_identical_and_seeded(tmp_path, tiny_model):
    build(tmp_path / "a")
    first = tree_digest(tmp_path / "a")
    assert first == tree_digest(tiny_model)  # a separate process, an earlier build: same bytes
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(first)
    build(tmp_path / "b", "--seed", "1")
    other = tree_digest(tmp_path / "b")
    assert other["model.safetensors"] != first["model.safetensors"]
    assert other["tokenizer.json"] == first["tokenizer.json"]


def test_cached_model_reuses_the_build(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from evalgate.models import tinymodel

    calls = []
    real = tinymodel.build_model
    monkeypatch.setattr(tinymodel, "build_model", lambda *a, **k: calls.append(a) or real(*a, **k))
    first = tinymodel.cached_model("tiny", 0, cache_dir=tmp_path)
    again = tinymodel.cached_model("tiny", 0, cache_dir=tmp_path)
    assert first == again and len(calls) == 1
    assert tinymodel.cached_model("tiny", 1, cache_dir=tmp_path) != first and len(calls) == 2


@pytest.mark.e2e
def test_trained_preset_is_reproducible_and_steps_matter(tmp_path):
    """`arith` is trained single-threaded with fixed seeds: two builds in two processes give the same bytes;
    more steps give other weights (the demo's "weaker checkpoint")."""
    build(tmp_path / "a", "--preset", "arith", "--steps", "6")
    build(tmp_path / "b", "--preset", "arith", "--steps", "6")
    build(tmp_path / "c", "--preset", "arith", "--steps", "3")
    first = tree_digest(tmp_path / "a")
    assert first == tree_digest(tmp_path / "b")
    assert tree_digest(tmp_path / "c")["model.safetensors"] != first["model.safetensors"]
    assert '"steps": 6' in (tmp_path / "a" / "evalgate-model.json").read_text()
