"""The strided 1×1 convolution (petra_core/models/pointwise.py): the function and gradients of
``nn.Conv2d`` on every input, including the channels-last few-channel inputs where oneDNN's strided
kernel hangs, crashes or returns wrong weight gradients on the CPU."""

import pytest
import torch
from torch import nn

from petra_core import build_model
from petra_core.models.pointwise import PointwiseConv, channel_block, hits_the_strided_kernel_bug


def _grads(conv: nn.Module, x: torch.Tensor, g: torch.Tensor):
    x = x.detach().requires_grad_()
    conv.zero_grad(set_to_none=True)
    y = conv(x)
    y.backward(g)
    return y.detach(), x.grad, conv.weight.grad


@pytest.mark.parametrize("c_in", [2, 4, 7, 8, 12, 16])
@pytest.mark.parametrize("channels_last", [True, False])
def test_a_strided_pointwise_conv_has_the_float64_convolutions_gradients(c_in, channels_last):
    """Against ``nn.Conv2d`` in float64 (oneDNN has no float64 kernel): output, input gradient and
    weight gradient, 30 steps in a row (the kernel's overrun shows after a few)."""
    torch.manual_seed(0)
    conv = PointwiseConv(c_in, 8, stride=2)
    reference = nn.Conv2d(c_in, 8, 1, stride=2, bias=False).double()
    reference.weight.data.copy_(conv.weight.data.double())
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    conv = conv.to(memory_format=fmt)
    for _ in range(30):
        x = torch.randn(8, c_in, 32, 32).contiguous(memory_format=fmt)
        g = torch.randn(8, 8, 16, 16).contiguous(memory_format=fmt)
        got = _grads(conv, x, g)
        want = _grads(reference, x.double(), g.double())
        for a, b in zip(got, want):
            torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)  # a sum of 2,048 products in fp32


def test_the_workaround_applies_only_where_the_kernel_is_unsafe():
    conv = PointwiseConv(4, 8, stride=2)
    cl = torch.randn(2, 4, 8, 8).contiguous(memory_format=torch.channels_last)
    assert hits_the_strided_kernel_bug(conv, cl)
    assert not hits_the_strided_kernel_bug(conv, cl.contiguous())  # NCHW: the blocked kernel
    wide = torch.randn(2, 16, 8, 8).contiguous(memory_format=torch.channels_last)
    assert not hits_the_strided_kernel_bug(PointwiseConv(16, 8, stride=2), wide)  # a full channel block
    eight = torch.randn(2, 8, 8, 8).contiguous(memory_format=torch.channels_last)
    assert hits_the_strided_kernel_bug(PointwiseConv(8, 8, stride=2), eight) == (channel_block() == 16)
    assert not hits_the_strided_kernel_bug(PointwiseConv(4, 8, stride=1), cl)


def test_it_is_a_conv2d_with_the_same_parameters_and_keys():
    conv, plain = PointwiseConv(4, 8, stride=2), nn.Conv2d(4, 8, 1, stride=2, bias=False)
    assert isinstance(conv, nn.Conv2d) and conv.state_dict().keys() == plain.state_dict().keys()
    assert conv.weight.shape == plain.weight.shape


@pytest.mark.parametrize("arch", ["resnet18", "revnet18", "resnet50", "revnet50"])
def test_every_strided_pointwise_conv_of_the_models_is_the_safe_one(arch):
    """A model built with a plain strided 1×1 ``nn.Conv2d`` would meet the kernel bug at small widths."""
    model = build_model(arch, num_classes=10, width=4)
    strided_pointwise = [
        m for m in model.modules() if isinstance(m, nn.Conv2d) and m.kernel_size == (1, 1) and m.stride != (1, 1)
    ]
    assert strided_pointwise and all(type(m) is PointwiseConv for m in strided_pointwise)


def test_a_tiny_channels_last_revnet_trains_a_step_with_the_float64_gradients():
    """End to end, width 4 in channels-last: every weight gradient equals the float64 model's."""
    torch.manual_seed(0)
    model = build_model("revnet18", num_classes=10, width=4)
    wide = build_model("revnet18", num_classes=10, width=4).double()
    wide.load_state_dict(model.state_dict())
    model = model.to(memory_format=torch.channels_last)
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    nn.functional.cross_entropy(model(x.contiguous(memory_format=torch.channels_last)), y).backward()
    nn.functional.cross_entropy(wide(x.double()), y).backward()
    for (name, p), q in zip(model.named_parameters(), wide.parameters()):
        torch.testing.assert_close(p.grad.double(), q.grad, rtol=1e-4, atol=1e-5, msg=name)
