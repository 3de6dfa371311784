"""The decoders' linears in the measured fastest form: every form equals F.linear, the plan is
measured once per machine and shape, and `fitted` decoders leave the modules stock outside."""

import json

import pytest
import torch

from drafters.decoding import linears
from drafters.decoding.linears import FORMS, PLAN_ROWS, fit_linears, fitted, kernel_plan, project


@pytest.fixture
def fresh_plans(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTERS_KERNEL_CACHE", str(tmp_path / "kernels.json"))
    monkeypatch.setattr(linears, "_PLANS", {})
    return tmp_path / "kernels.json"


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9, 16, 17, 22, 32, 33])
@pytest.mark.parametrize("form", [*FORMS, None])
def test_project_equals_the_head_in_every_form(rows, form, fresh_plans, monkeypatch):
    if form is not None:  # force one form for every row count; None: the measured plan
        monkeypatch.setenv("DRAFTERS_LINEAR_FORMS", form)
    head = torch.nn.Linear(16, 300, bias=rows % 2 == 0)
    x = torch.randn(1, rows, 16)
    with torch.inference_mode():
        out = project(head, x)
    torch.testing.assert_close(out, head(x), rtol=1e-5, atol=1e-5)
    assert out.shape == (1, rows, 300)


def test_kernel_plan_is_measured_once_per_machine_and_shape(fresh_plans, monkeypatch):
    weight = torch.randn(257, 24)
    plan = kernel_plan(weight)
    assert len(plan) == len(PLAN_ROWS) and set(plan) <= set(FORMS)
    assert "small" in linears.forms_for(weight)  # the kernel builds here (CI too)
    stored = json.loads(fresh_plans.read_text())
    assert stored[linears._key(weight, linears.forms_for(weight))] == list(plan)
    monkeypatch.setattr(linears, "_PLANS", {})  # a new process: the file answers, no timing
    monkeypatch.setattr(linears, "measure_plan", lambda w, f: pytest.fail("measured again"))
    assert kernel_plan(weight) == plan
    other = torch.randn(257, 32)  # another shape is measured anew
    monkeypatch.setattr(linears, "measure_plan", lambda w, f: ("mm",) * len(PLAN_ROWS))
    assert kernel_plan(other) == ("mm",) * len(PLAN_ROWS)
    assert len(json.loads(fresh_plans.read_text())) == 2


def test_forms_are_restricted_by_the_environment_and_the_dtype(fresh_plans, monkeypatch):
    w = torch.randn(8, 8)
    assert "small" in linears.forms_for(w.bfloat16())  # the kernel runs float32 and bfloat16
    assert "small" not in linears.forms_for(w.double())
    monkeypatch.setenv("DRAFTERS_LINEAR_FORMS", "linear,mm")
    assert linears.forms_for(w) == ("linear", "mm")
    monkeypatch.setenv("DRAFTERS_LINEAR_FORMS", "linear,blas")
    with pytest.raises(ValueError, match="DRAFTERS_LINEAR_FORMS='linear,blas'"):
        linears.forms_for(w)


@pytest.mark.parametrize("form", ["small", "mm"])
def test_fitted_decoder_runs_the_forms_inside_and_leaves_the_modules_stock(
    tiny, form, fresh_plans, monkeypatch
):
    monkeypatch.setenv("DRAFTERS_LINEAR_FORMS", form)
    model = tiny.model
    drafter = torch.nn.Sequential(torch.nn.Linear(4, 4))
    ids, wide = torch.randint(tiny.vocab_size, (1, 9)), torch.randint(tiny.vocab_size, (1, 33))
    calls = []
    if form == "small":  # fitted modules run the kernel on their packed weight
        packed = linears.packed_product

        def spy(x, wp, n):
            calls.append(x.shape[0])
            return packed(x, wp, n)

        monkeypatch.setattr(linears, "packed_product", spy)
    else:
        real = linears.PRODUCTS[form]
        monkeypatch.setitem(linears.PRODUCTS, form,
                            lambda x, w: calls.append(x.shape[0]) or real(x, w))  # fmt: skip

    @fitted
    def decoder(target, drafter, ids):
        assert all("forward" in vars(m) for m in (*target.model.modules(), *drafter.modules())
                   if isinstance(m, torch.nn.Linear))  # fmt: skip
        with fit_linears(target.model):  # nested (a decoder measuring its cost): re-entrant
            pass
        return target.model(ids).logits, target.model(wide).logits

    with torch.inference_mode():
        plain, plain_wide = model(ids).logits, model(wide).logits
        assert not calls
        ours, ours_wide = decoder(tiny, drafter, ids)
        assert calls and set(calls) == {9}  # 33 rows: F.linear, as outside
        linears_ = [m for m in (*model.modules(), *drafter.modules())
                    if isinstance(m, torch.nn.Linear)]  # fmt: skip
        assert not any("forward" in vars(m) for m in linears_)
        again = model(ids).logits
    torch.testing.assert_close(ours, plain, rtol=1e-4, atol=1e-4)
    assert torch.equal(again, plain) and torch.equal(ours_wide, plain_wide)


def test_autograd_and_autocast_take_f_linear(fresh_plans, monkeypatch):
    monkeypatch.setenv("DRAFTERS_LINEAR_FORMS", "small")
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(2, 8)
    with fit_linears(lin):
        lin(x).sum().backward()  # the kernel has no backward: autograd runs F.linear
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert lin(x).dtype == torch.bfloat16
    assert lin.weight.grad is not None
