"""`bisect batch` refuses what it cannot bisect, before any engine starts, on every machine: the fake engine
varies exactly the request it is told to (`fake_vary_with_batch`), so a stable request always exists."""

from __future__ import annotations

from helpers import database_url, db_query, write_suite

PROMPTS = [f"Question {i}: what is the colour of the river number {i}?" for i in range(4)]


def test_a_request_without_batch_variance_has_nothing_to_bisect(inline_cli, tmp_path, fake_model):
    suite = write_suite(tmp_path / "ws", fake_model, PROMPTS, concurrency=(1, 4), shuffles=0, kind="fake", max_tokens=6,
                        extra_engine='fake_vary_with_batch = ["p001"]')
    inline_cli("baseline", "create", suite, "--allow-variance", check=1)
    ((run_id,),) = db_query(database_url(suite), "select id from runs where kind = 'baseline'")
    proc = inline_cli("bisect", "batch", run_id, "p000", "--suite", suite, check=2)
    assert "no batch variance" in proc.stderr + proc.stdout and "p000" in proc.stderr + proc.stdout
    proc = inline_cli("bisect", "batch", run_id, "no-such-key", "--suite", suite, check=2)
    assert "no-such-key" in proc.stderr + proc.stdout
    assert db_query(database_url(suite), "select count(*) from bisect_sessions") == [(0,)]  # nothing started
