"""fast_dropout.py against the definition of inverted dropout."""
import torch

from bertrecipe.model.fast_dropout import Dropout, dropout


def test_drops_the_requested_fraction_and_scales_the_rest():
    x = torch.ones(1 << 20)
    y = dropout(x, 0.1, training=True)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - 0.1) < 0.002
    assert torch.allclose(y[y != 0], torch.full_like(y[y != 0], 1 / 0.9))
    for p in (0.25, 0.5):
        assert abs((dropout(x, p, True) == 0).float().mean().item() - p) < 0.003


def test_every_lane_of_the_random_draws_is_used_evenly_and_independently():
    # Four decisions come from each 64-bit draw; a lane stuck at one value would show as a skewed position mod 4,
    # lanes cut from the same bits as decisions that agree more often than independent coins do (half the time).
    dropped = dropout(torch.ones(1 << 20), 0.5, training=True).view(-1, 4) == 0
    for lane in range(4):
        assert abs(dropped[:, lane].float().mean().item() - 0.5) < 0.005
        for other in range(lane + 1, 4):
            assert abs((dropped[:, lane] == dropped[:, other]).float().mean().item() - 0.5) < 0.005


def test_gradient_uses_the_forward_mask():
    x = torch.randn(64, 33, dtype=torch.bfloat16, requires_grad=True)
    y = dropout(x, 0.3, training=True)
    assert y.dtype == torch.bfloat16  # the mask is made in the activations' dtype
    y.float().sum().backward()
    kept = y != 0
    assert torch.equal(x.grad != 0, kept)
    assert torch.allclose(x.grad[kept].float(), torch.full((int(kept.sum()),), 1 / 0.7), rtol=1e-2)


def test_identity_in_eval_and_at_zero_and_reproducible_under_a_seed():
    x = torch.randn(100)
    assert dropout(x, 0.1, training=False) is x and dropout(x, 0.0, training=True) is x
    assert torch.equal(dropout(x, 1.0, training=True), torch.zeros_like(x))  # p = 1 drops everything
    module = Dropout(0.1).eval()
    assert module(x) is x
    torch.manual_seed(3)
    a = dropout(torch.ones(1000), 0.1, True)
    torch.manual_seed(3)
    b = dropout(torch.ones(1000), 0.1, True)
    assert (a == 0).any() and torch.equal(a, b) and not torch.equal(a, dropout(torch.ones(1000), 0.1, True))


def test_the_module_drops_with_its_own_p_when_training():
    module = Dropout(0.25).train()
    y = module(torch.ones(1 << 18))
    assert abs((y == 0).float().mean().item() - 0.25) < 0.005
    assert torch.allclose(y[y != 0], torch.full_like(y[y != 0], 1 / 0.75))


def test_odd_sizes_and_shapes():
    # Sizes that are not a multiple of the four decisions per draw: every element, the last ones included, is
    # dropped half the time over many draws (seeded: 69 positions at a 4.5-sigma bound).
    torch.manual_seed(0)
    for shape in [(1,), (3,), (5, 7), (2, 3, 5)]:
        draws = torch.stack([dropout(torch.ones(shape), 0.5, True) for _ in range(2000)])
        assert draws.shape == (2000, *shape) and set(draws.unique().tolist()) == {0.0, 2.0}
        assert ((draws == 0).float().mean(0) - 0.5).abs().max() < 0.05
