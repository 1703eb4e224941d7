"""fast_dropout.py against the definition of inverted dropout."""
import torch

from fast_dropout import Dropout, dropout


def test_drops_the_requested_fraction_and_scales_the_rest():
    x = torch.ones(1 << 20)
    y = dropout(x, 0.1, training=True)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - 0.1) < 0.002
    assert torch.allclose(y[y != 0], torch.full_like(y[y != 0], 1 / 0.9))
    for p in (0.25, 0.5):
        assert abs((dropout(x, p, True) == 0).float().mean().item() - p) < 0.003


def test_every_lane_of_the_random_draws_is_used_evenly():
    # Four decisions come from each 64-bit draw; a lane stuck at one value would show as a skewed position mod 4.
    y = dropout(torch.ones(1 << 20), 0.5, training=True).view(-1, 4)
    for lane in range(4):
        assert abs((y[:, lane] == 0).float().mean().item() - 0.5) < 0.005


def test_gradient_uses_the_forward_mask():
    x = torch.randn(64, 33, dtype=torch.bfloat16, requires_grad=True)
    y = dropout(x, 0.3, training=True)
    y.float().sum().backward()
    kept = y != 0
    assert torch.equal(x.grad != 0, kept)
    assert torch.allclose(x.grad[kept].float(), torch.full((int(kept.sum()),), 1 / 0.7), rtol=1e-2)


def test_identity_in_eval_and_at_zero_and_reproducible_under_a_seed():
    x = torch.randn(100)
    assert dropout(x, 0.1, training=False) is x and dropout(x, 0.0, training=True) is x
    module = Dropout(0.1).eval()
    assert module(x) is x
    torch.manual_seed(3)
    a = dropout(torch.ones(1000), 0.1, True)
    torch.manual_seed(3)
    b = dropout(torch.ones(1000), 0.1, True)
    assert torch.equal(a, b) and not torch.equal(a, dropout(torch.ones(1000), 0.1, True))


def test_odd_sizes_and_shapes():
    for shape in [(1,), (3,), (5, 7), (2, 3, 5)]:
        y = dropout(torch.ones(shape), 0.5, True)
        assert y.shape == shape and set(y.unique().tolist()) <= {0.0, 2.0}
