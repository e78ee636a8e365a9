"""Activations as a tensor or a pair of streams (petra_core/models/streams.py)."""

import pytest
import torch

from petra_core import build_model
from petra_core.models import streams


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_stems_output_becomes_two_dense_streams_in_its_memory_format(channels_last):
    t = torch.randn(2, 8, 5, 5)
    if channels_last:
        t = t.contiguous(memory_format=torch.channels_last)
    a, b = streams.streams_of(t)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert a.is_contiguous(memory_format=fmt) and b.is_contiguous(memory_format=fmt)
    assert torch.equal(streams.join((a, b)), t)
    assert streams.shape((a, b)) == tuple(t.shape) and streams.nbytes((a, b)) == t.numel() * 4


def test_a_tensor_passes_through_and_leaves_are_fresh():
    pair = (torch.randn(2, 3, 4, 4), torch.randn(2, 5, 4, 4))
    assert streams.shape(pair) == (2, 8, 4, 4) and torch.equal(streams.join(pair)[:, 3:], pair[1])
    t = torch.randn(2, 3)
    assert streams.join(t) is t and streams.tensors(None) == ()
    assert streams.apply(torch.neg, None) is None and streams.grads(t.requires_grad_()) is None
    leaves = streams.leaves(pair, requires_grad=True)
    assert all(x.is_leaf and x.requires_grad and x is not y for x, y in zip(leaves, pair))
    assert not streams.leaves(torch.arange(3), requires_grad=True).requires_grad  # integers never do


def test_a_coupling_hands_its_first_stream_on_without_a_copy():
    """(x, x̃) -> (x̃ + F(x), x): the output's second stream is the input's first, the same tensor,
    and its inverse hands ỹ back as x the same way."""
    torch.manual_seed(0)
    model = build_model("revnet18", num_classes=10, width=4)
    x = model[0](torch.randn(2, 3, 8, 8))
    assert streams.is_pair(x)
    coupling = model[1]
    assert coupling.kind == "R"
    with torch.no_grad():
        y = coupling(x)
        assert y[1] is x[0]
        back = coupling.inverse(y)
    assert back[0] is y[1]
    torch.testing.assert_close(back[1], x[1], rtol=0, atol=1e-6)


def test_the_head_of_a_pair_equals_the_head_of_the_joined_tensor():
    torch.manual_seed(0)
    head = build_model("revnet18", num_classes=10, width=4)[-1]
    pair = (torch.randn(2, 32, 4, 4), torch.randn(2, 32, 4, 4))
    torch.testing.assert_close(head(pair), head(streams.join(pair)), rtol=0, atol=0)
