"""A run's progress off a terminal (a CI log): plain lines, a pass's first and last always, between them at
most one every LOG_EVERY seconds, with the pass's rate and time left."""

from __future__ import annotations

from evalgate.cli.common import LOG_EVERY, ProgressLines


def test_a_pass_says_its_start_its_end_and_at_most_one_line_per_interval_between():
    now = [0.0]
    lines: list[str] = []
    progress = ProgressLines(lambda text, **_: lines.append(text), clock=lambda: now[0])
    progress(1, 200, "pass 0 (concurrency 1)", 1, 100)
    for done in range(2, 100):
        now[0] += 1.0  # one request a second
        progress(done, 200, "pass 0 (concurrency 1)", done, 100)
    now[0] += 1.0
    progress(100, 200, "pass 0 (concurrency 1)", 100, 100)
    progress(108, 200, "pass 1 (concurrency 8)", 8, 100)
    assert lines[0] == "pass 0 (concurrency 1): 1/100 requests; run 1/200"
    n = int(LOG_EVERY) + 1  # the first line after LOG_EVERY seconds: n requests done in LOG_EVERY seconds
    assert lines[1] == f"pass 0 (concurrency 1): {n}/100 requests, {n / LOG_EVERY:.1f}/s, " \
                       f"{(100 - n) / (n / LOG_EVERY):.0f} s left; run {n}/200"
    assert lines[-2] == "pass 0 (concurrency 1): 100/100 requests, 1.0/s; run 100/200"  # its end, always
    assert lines[-1] == "pass 1 (concurrency 8): 8/100 requests; run 108/200"  # the next pass's start
    assert len(lines) == 2 + 99 // int(LOG_EVERY) + 1


def test_a_step_with_no_requests_of_its_own_is_named_once_as_it_starts():
    lines: list[str] = []
    progress = ProgressLines(lambda text, **_: lines.append(text), clock=lambda: 0.0)
    progress(0, 0, "starting the vllm engine", 0, 0)
    progress(0, 0, "starting the vllm engine", 0, 0)
    progress(1, 20, "pass 0", 1, 10)
    progress(10, 20, "starting the engine of probe needle", 0, 0)  # mid-run: the run's count stays as it was
    assert lines == ["starting the vllm engine ...", "pass 0: 1/10 requests; run 1/20",
                     "starting the engine of probe needle ..."]
