"""`evalgate init` on real vLLM, as a new user runs it: init with a model, then `baseline create`, then
`check`, each exit 0, on whatever CPU this is (init surveys the machine first and writes the remedy where
its passes disagree; the fake-engine tests in tests/plumbing/test_init.py plant both branches, and run a survey
afterwards)."""

from __future__ import annotations

import pytest
from helpers import db_runs, tomllib

pytestmark = pytest.mark.e2e


def test_init_then_baseline_create_then_check_pass_on_vllm(cli, tmp_path, tiny_model):
    proj = tmp_path / "proj"
    out = cli("init", "--dir", proj, "--model", tiny_model, check=0, timeout=900).stdout
    assert "evalgate survey: what varies on this machine" in out and "comparison" in out
    suite = proj / "evalgate.toml"
    engine = tomllib.loads(suite.read_text(encoding="utf-8"))["engine"]
    if "written into" in out:  # this CPU varies for this model: the remedy is in the suite and was verified
        assert engine.get("max_num_seqs") == 1 or engine.get("enable_prefix_caching") is False
        assert "verified: the passes agree" in out, out[-3000:]
    else:
        assert "nothing varies here that the gate fails on" in out and "max_num_seqs" not in engine
    cli("baseline", "create", suite, check=0, timeout=900)
    cli("check", suite, check=0, timeout=900)
    db = f"sqlite:///{proj / 'baselines' / 'evalgate.sqlite'}"
    kinds = [row[1] for row in db_runs(db)]
    assert kinds[0] == "survey" and kinds[-2:] == ["baseline", "check"]
