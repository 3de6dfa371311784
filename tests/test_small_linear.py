"""The few-row linear kernel: equal to F.linear up to summation order, and batch-invariant (a
row's outputs are bit-identical alone and inside any batch), on shapes with tails in K and N."""

import pytest
import torch

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


def test_leading_dimensions_and_refusals():
    x, w = torch.randn(2, 3, 40), torch.randn(5, 40)
    assert small_linear(x, w).shape == (2, 3, 5)
    with pytest.raises(RuntimeError, match="float32 only"):
        small_linear(x.double(), w.double())
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
