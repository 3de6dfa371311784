"""The few-row linear kernel: equal to F.linear up to summation order (bfloat16: to the float32
product of the same bfloat16 values, rounded once), and batch-invariant (a row's outputs are
bit-identical alone and inside any batch), on shapes with tails in K and N."""

import pytest
import torch

from drafters.kernels import small_linear as kernel
from drafters.kernels.small_linear import available, small_linear


@pytest.mark.parametrize("K, N", [(576, 1536), (1536, 576), (37, 7), (64, 1)])
def test_matches_f_linear_and_is_batch_invariant(K, N):
    g = torch.Generator().manual_seed(K + N)
    x = torch.randn(11, K, generator=g)
    w = torch.randn(N, K, generator=g)
    b = torch.randn(N, generator=g)
    y = small_linear(x, w, b)
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w, b), rtol=1e-4, atol=1e-4)
    for rows in range(1, 12):  # every prefix, and each row alone
        assert torch.equal(small_linear(x[:rows], w, b), y[:rows])
    for i in range(11):
        assert torch.equal(small_linear(x[i], w, b), y[i])  # a 1-D row, as (..., K)


@pytest.mark.parametrize("K, N", [(576, 1536), (1536, 576), (37, 7), (64, 1)])
def test_bfloat16_sums_in_float32_and_is_batch_invariant(K, N):
    g = torch.Generator().manual_seed(K + N)
    x = torch.randn(11, K, generator=g).bfloat16()
    w = torch.randn(N, K, generator=g).bfloat16()
    y = small_linear(x, w)
    assert y.dtype == torch.bfloat16
    exact = x.double() @ w.double().T  # the products are exact in float32; only the sums round
    torch.testing.assert_close(y.double(), exact, rtol=2**-8, atol=1e-3)  # one bf16 rounding
    for rows in range(1, 12):
        assert torch.equal(small_linear(x[:rows], w), y[:rows])
    for i in range(11):
        assert torch.equal(small_linear(x[i], w), y[i])


def test_both_bfloat16_builds_agree():
    """Where the processor has AVX512-BF16 the kernel multiplies pairs with it; elsewhere it
    widens both halves to float32 in the same order. The two builds give the same bits (normal
    values), so a plan or a record does not depend on which one a machine built."""
    flags = tuple(kernel.CFLAGS) + ("-mno-avx512bf16",)
    default, widened = kernel._module(), kernel._module(flags)
    assert widened.bf16_products() == "widened"
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 96, generator=g).bfloat16()
    w = torch.randn(50, 96, generator=g).bfloat16()
    wp = kernel.packed(w)
    assert torch.equal(default.small_linear(x, wp, 50), widened.small_linear(x, wp, 50))


def test_leading_dimensions_and_refusals():
    x, w = torch.randn(2, 3, 40), torch.randn(5, 40)
    assert small_linear(x, w).shape == (2, 3, 5)
    with pytest.raises(RuntimeError, match="float32 or bfloat16 only"):
        small_linear(x.double(), w.double())
    with pytest.raises(RuntimeError, match="x and w alike"):
        small_linear(x, w.bfloat16())
    with pytest.raises(RuntimeError, match=r"x \(M, K\) and w \(N, K\)"):
        small_linear(x, torch.randn(5, 41))


def test_the_kernel_builds_on_this_machine():
    """CI's machines have a compiler and ninja (a project dependency): a failed build fails."""
    assert available() == (True, "")


def test_the_packed_copy_follows_the_weight():
    """The kernel reads a packed copy made once per weight: an in-place change (an optimizer
    step, load_state_dict) is seen on the next call, and a weight made in inference mode packs."""
    from drafters.kernels.small_linear import packed

    x, w = torch.randn(3, 40), torch.randn(21, 40)
    first = small_linear(x, w)
    assert packed(w) is packed(w)  # made once
    with torch.no_grad():
        w.mul_(2)
    torch.testing.assert_close(small_linear(x, w), 2 * first, rtol=1e-5, atol=1e-5)
    with torch.inference_mode():
        wi = torch.randn(21, 40)
        torch.testing.assert_close(small_linear(x, wi), x @ wi.T, rtol=1e-4, atol=1e-4)
