"""bench/rollout.py's decode decomposition: the matrix products of one decode pass, timed alone."""

from __future__ import annotations

from tests.bench_modules import load_bench
from turnrl.engines.native import NativeEngine
from turnrl.engines.native import model as native_model


def test_matmuls_alone_runs_each_projection_of_a_decode_pass(tiny_model, tokenizer, monkeypatch):
    """One pass = four fused projections per layer over the bucketed rows, and the LM head over the real rows only,
    each with the engine's stored weight (so a packed engine times its packed kernel)."""
    rollout = load_bench("rollout")
    engine = NativeEngine(tiny_model, tokenizer, dtype="fp32", max_slots=8, max_len=64)
    calls: list[tuple[int, int]] = []
    real = native_model._linear

    def counted(x, weight, bias=None):
        calls.append((x.shape[0], id(weight)))
        return real(x, weight, bias)

    monkeypatch.setattr(native_model, "_linear", counted)
    seconds = rollout.matmuls_alone(engine, rows=3, n=1)

    assert seconds > 0
    per_pass = 4 * tiny_model.config.num_hidden_layers + 1
    assert len(calls) == 4 * per_pass  # three warm-up passes and one timed
    first = calls[:per_pass]
    stored = {id(layer[name]) for layer in engine._w.layers for name in ("qkv", "o", "gate_up", "down")}
    assert {w for _, w in first[:-1]} == stored
    assert first[-1] == (3, id(engine._w.lm_head))
    assert {rows for rows, _ in first[:-1]} == {native_model._bucket_tokens(3)}
