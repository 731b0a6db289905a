"""evalgate's CPU batch-invariant mode without vLLM: the tiling, its calibration and the status it reports,
on GEMMs whose batch dependence is planted (a summation order that follows M or a row's position), so the
tests hold on every CPU. The real kernels are tests/e2e/test_e2e_cpu_kernels.py."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from evalgate import kernels  # noqa: E402
from evalgate.engines.base import arrange_batch_invariance, confirm_cpu_invariance  # noqa: E402
from evalgate.kernels.attention import cut_at_positions  # noqa: E402
from evalgate.kernels.linear import (  # noqa: E402
    Geometry,
    bits,
    calibrate,
    linear_path,
    probe_rows,
    probe_weight,
    tiled,
)
from evalgate.kernels.status import KERNELS, STATUS_PATH_ENV, KernelStatus, judge_status  # noqa: E402

K, N = 96, 40


def rowwise(x, w):
    """x @ w.T one row at a time: every row through the same one-row call, so batch invariant by construction
    (this CPU's own GEMM may well not be: torch's fp32 matmul was seen to give M < 5 other bits)."""
    return torch.cat([row[None] @ w.T for row in x]) if len(x) else x.new_zeros((0, w.shape[0]))


def halves(x, w):
    """The same product summed in another order: K in two halves, added."""
    h = x.shape[1] // 2
    return rowwise(x[:, :h], w[:, :h]) + rowwise(x[:, h:], w[:, h:])


def small_m_differs(x, w, bias=None):
    """A GEMM with its own path for fewer than 4 rows (as oneDNN has for M=1, the sgl kernel for M<=4)."""
    return halves(x, w) if x.shape[0] < 4 else rowwise(x, w)


def late_rows_differ(x, w, bias=None):
    """A GEMM whose rows after the 8th of a call are summed in another order (a row's bits follow its place)."""
    y = rowwise(x, w)
    if x.shape[0] > 8:
        y[8:] = halves(x[8:], w)
    return y


@pytest.fixture(scope="module")
def weight():
    return torch.randn(N, K, generator=torch.Generator().manual_seed(0))


def test_the_planted_gemms_vary_with_the_batch(weight):
    x = probe_rows(12, K, torch.float32, torch.Generator().manual_seed(1))
    assert not torch.equal(bits(small_m_differs(x[:1], weight)), bits(small_m_differs(x, weight)[:1]))
    assert not torch.equal(bits(late_rows_differ(x, weight)[9]), bits(late_rows_differ(x[9:10], weight)[0]))


def test_probe_rows_show_an_order_random_rows_hide_in_bf16():
    """Two summation orders of one bf16 product: the probe's cancelling columns make them differ."""
    generator = torch.Generator().manual_seed(2)
    w = probe_weight(N, K, torch.bfloat16, generator)
    probe = probe_rows(32, K, torch.bfloat16, generator)
    assert not torch.equal(bits((probe.float() @ w.float().T).bfloat16().float()),
                           bits(halves(probe.float(), w.float()).bfloat16().float()))


@pytest.mark.parametrize("fn, geometry", [
    (small_m_differs, Geometry("planted", 32, 4)),     # whole tiles, and a tail padded up to 4 rows
    (late_rows_differ, Geometry("planted", 8, 1)),     # a tile of 8: no row ever sits after the 8th
    (lambda x, w, bias=None: rowwise(x, w), Geometry("planted", 32, 1)),
])
def test_calibration_measures_the_planted_geometry(fn, geometry):
    assert calibrate(lambda w: ("planted", fn), K, N, torch.float32) == geometry


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 100), row=st.integers(0, 99), planted=st.sampled_from(["small_m", "late_rows"]))
def test_a_row_gets_the_same_bits_in_any_batch_once_tiled(weight, m, row, planted):
    fn = small_m_differs if planted == "small_m" else late_rows_differ
    linear = tiled(fn, calibrate(lambda w: ("planted", fn), K, N, torch.float32))
    x = torch.randn(m, K, generator=torch.Generator().manual_seed(m))
    row = row % m
    alone = linear(x[row:row + 1], weight)[0]
    assert torch.equal(bits(linear(x, weight)[row]), bits(alone))
    assert torch.equal(bits(linear(x.flip(0), weight)[m - 1 - row]), bits(alone))  # another place in the batch


def test_an_empty_call_and_leading_dimensions_keep_their_shape(weight):
    linear = tiled(small_m_differs, Geometry("planted", 8, 4))
    assert linear(torch.zeros(0, K), weight).shape == (0, N)
    x = torch.randn(3, 7, K)
    y = linear(x, weight)
    assert y.shape == (3, 7, N)
    assert torch.equal(bits(y[2, 6]), bits(linear(x[2, 6:7], weight)[0]))  # a row is a row, however it is laid out


def test_the_path_is_named_by_the_kernel_vllm_chose():
    assert linear_path(lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)) == "torch_linear"
    ops = type("ops", (), {"onednn_mm": None})
    assert linear_path(lambda x, weight, bias: ops.onednn_mm(None, x, bias)) == "onednn_mm"


def test_the_mode_is_in_force_only_where_everything_was_covered_and_checked():
    done = KernelStatus(linear=[{"path": "onednn_mm", "dtype": "float32", "k": 1536, "n": 576, "rows": 32,
                                 "tail_floor": 2}],
                        attention=[{"config": "cpu_attention_with_kv_cache isa=vec", "varies": None,
                                    "chunks_hold_to": 2048, "window": 8},
                                   {"config": "cpu_attention_with_kv_cache isa=vec16", "varies": None,
                                    "chunks_hold_to": 600, "window": 0}],
                        model_loaded=True)
    in_force, said = judge_status(done)
    assert in_force and "32-row tiles" in said and "onednn_mm float32 1536x576 pads below 2 rows" in said
    # how far a chunked prefill keeps attention's bits is the least any configuration kept them
    assert "attention on one thread, queries of some configurations cut" in said
    assert "keep its bits up to 600 tokens" in said
    cut = KernelStatus(**{**done.__dict__, "attention": done.attention[:1]})
    assert "queries cut every 8 positions" in judge_status(cut)[1] and "up to 2048 tokens" in judge_status(cut)[1]
    assert judge_status(None) == (False, judge_status(KernelStatus())[1])
    assert "install evalgate where vLLM runs" in judge_status(None)[1]
    moe = KernelStatus(**{**done.__dict__, "uncovered": ["mixture-of-experts layers (FusedMoE)"]})
    assert judge_status(moe) == (False, "not covered by evalgate's CPU kernels: mixture-of-experts layers (FusedMoE)")
    varies = KernelStatus(**{**done.__dict__, "attention": [{"config": "x", "varies": "x: one decode query ..."}]})
    assert judge_status(varies) == (False, "x: one decode query ...")
    assert judge_status(KernelStatus(**{**done.__dict__, "attention": []}))[0] is False


def test_a_cpu_engine_asks_for_the_kernels_and_reads_their_report(tmp_path):
    env = {"VLLM_BATCH_INVARIANT": "1"}
    state = arrange_batch_invariance(True, "cpu", env)
    assert env[kernels.SWITCH] == "1" and "VLLM_BATCH_INVARIANT" not in env  # vLLM's own would crash on CPU
    assert state == {"requested": True, "in_force": False, "reason": "the engine has not reported yet",
                     "kernels": KERNELS}
    status_path = env[STATUS_PATH_ENV]
    with open(status_path, "w", encoding="utf-8") as f:
        json.dump({"kernels": KERNELS, "linear": [], "attention": [{"config": "c", "varies": None, "chunks_hold_to": 300}],
                   "uncovered": [], "model_loaded": True}, f)
    measured = confirm_cpu_invariance(state, env)
    assert state["in_force"] is True and state["reason"] == "" and "checked invariant (1 configuration)" in measured

    off = dict(env)
    assert arrange_batch_invariance(False, "cpu", off)["reason"] == "not requested"
    assert kernels.SWITCH not in off and STATUS_PATH_ENV not in off
    assert "VLLM_BATCH_INVARIANT" not in env or env["VLLM_BATCH_INVARIANT"] != "1"
    gpu = {}
    assert arrange_batch_invariance(True, "cuda", gpu)["reason"] == "" and gpu == {"VLLM_BATCH_INVARIANT": "1"}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), min_size=1, max_size=6), st.integers(1, 9))
def test_queries_cut_at_fixed_positions_keep_their_order_and_their_keys(requests, window):
    """Each request (earlier positions, queries this call) cut at every multiple of `window` positions: the pieces
    cover its queries in order, none crosses a multiple of the window, each attends to its own last query's
    position, and keeps its request's block table."""
    counts = [q for _, q in requests]
    starts = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32)
    seq_lens = torch.tensor([e + q for e, q in requests], dtype=torch.int32)
    table = torch.arange(len(requests), dtype=torch.int32)[:, None].repeat(1, 3)
    cut_starts, cut_lens, cut_table = cut_at_positions(starts, seq_lens, table, window)
    assert cut_starts[0] == 0 and cut_starts[-1] == sum(counts) and bool((cut_starts[1:] > cut_starts[:-1]).all())
    expected = []
    for r, (e, q) in enumerate(requests):
        position, token = e, int(starts[r])
        while position < e + q:
            end = min((position // window + 1) * window, e + q)
            expected.append((token, end - position, end, r))
            token, position = token + end - position, end
    got = [(int(cut_starts[i]), int(cut_starts[i + 1] - cut_starts[i]), int(cut_lens[i]), int(cut_table[i, 0]))
           for i in range(len(cut_lens))]
    assert got == expected
