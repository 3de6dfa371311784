"""`trainer.precision: auto` on the CPU: the choice follows the measured steps, and bf16's one-off
kernel setup never decides it."""

from drafters.training import precision


def _scripted(monkeypatch, seconds: dict[bool, list[float]]):
    """_step_seconds replaced by scripted timings per call, fp32 (False) and bf16 (True)."""
    calls = {False: iter(seconds[False]), True: iter(seconds[True])}
    monkeypatch.setattr(precision, "_step_seconds", lambda x, w, bf16, reps: next(calls[bf16]))


def test_a_slow_first_bf16_call_does_not_choose_fp32(monkeypatch):
    # fp32: warm-up, timed; bf16: kernel setup (5x a step), single timed call, best of reps
    _scripted(monkeypatch, {False: [0.06, 0.05], True: [0.25, 0.026, 0.024]})
    m = precision.measure_cpu_bf16.__wrapped__()
    assert m["bf16_s"] == 0.024 and m["speedup"] >= precision.MARGIN


def test_bf16_far_slower_is_timed_once_and_not_chosen(monkeypatch):
    _scripted(monkeypatch, {False: [0.06, 0.05], True: [2.0, 1.6]})  # no native bf16
    m = precision.measure_cpu_bf16.__wrapped__()
    assert m["bf16_s"] == 1.6 and m["speedup"] < precision.MARGIN
    monkeypatch.setattr(precision, "measure_cpu_bf16", lambda: m)
    assert precision.auto_precision("cpu") == "32-true"
    assert precision.resolve_precision("bf16-mixed") == "bf16-mixed"  # an explicit value stays
