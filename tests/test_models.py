"""Oracles for the staged models: parameter counts, stage kinds, exact inverses."""

import pytest
import torch

from petra_core import ARCHS, build_model
from petra_core.models import streams

# ImageNet head (1000 classes), convolutions without bias (batch norm follows every conv).
PARAMS = {
    "resnet18": 11_689_512,  # = torchvision
    "resnet34": 21_797_672,
    "resnet50": 25_557_032,
    "revnet18": 12_211_048,
    "revnet34": 22_319_208,
    "revnet50": 30_391_144,
}
PAPER_MILLIONS = {
    "resnet18": 11.7,
    "resnet34": 21.8,
    "resnet50": 25.6,
    "revnet18": 12.2,
    "revnet34": 22.3,
    "revnet50": 30.4,
}
KINDS = {
    "resnet18": "S" + " B" * 8 + " H",
    "resnet34": "S" + " B" * 16 + " H",
    "resnet50": "S" + " B" * 16 + " H",
    "revnet18": "S R R D R D R D R H",
    "revnet34": "S R R R D R R R D R R R R R D R R H",
    "revnet50": "S D R R D R R R D R R R R R D R R H",
}


def n_params(model):
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("arch", ARCHS)
def test_imagenet_parameter_counts_and_stage_kinds(arch):
    model = build_model(arch, num_classes=1000, stem="imagenet")
    assert n_params(model) == PARAMS[arch]
    assert round(n_params(model) / 1e6, 1) == PAPER_MILLIONS[arch]
    assert model.kinds == KINDS[arch]
    assert len(model) == len(KINDS[arch].split())
    assert [s.reversible for s in model] == [k == "R" for k in KINDS[arch].split()]


def test_resnets_match_torchvision_counts():
    import torchvision

    for arch in ("resnet18", "resnet34", "resnet50"):
        reference = getattr(torchvision.models, arch)(weights=None)
        assert n_params(build_model(arch, num_classes=1000, stem="imagenet")) == n_params(reference)


@pytest.mark.parametrize("arch", [a for a in ARCHS if a.startswith("revnet")])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_reversible_stages_invert_in_training_mode(arch, dtype, tol):
    torch.manual_seed(0)
    model = build_model(arch, num_classes=10, width=4).to(dtype).train()
    x = torch.randn(8, 3, 16, 16, dtype=dtype)
    checked = 0
    with torch.no_grad():
        for stage in model:
            y = stage(x)
            if stage.reversible:
                x_back = stage.inverse(y)
                assert streams.shape(x_back) == streams.shape(x)
                back, true = streams.join(x_back), streams.join(x)
                rel = (back - true).abs().max() / true.abs().max()
                assert rel < tol, f"{arch} stage {stage.kind}: relative error {rel:.2e}"
                rebuilt = stage.reconstruct(y)
                assert torch.allclose(streams.join(rebuilt.input_value()), back, rtol=0, atol=tol * true.abs().max())
                checked += 1
            x = y
    assert checked == len(model.reversible_stages) > 0


@pytest.mark.parametrize("arch", [a for a in ARCHS if a.startswith("revnet")])
def test_reconstruct_gives_autograd_gradients(arch):
    """Backprop through the reconstructed graph equals backprop through the forward graph."""
    torch.manual_seed(0)
    model = build_model(arch, num_classes=10, width=4).double()
    x = torch.randn(4, 3, 8, 8, dtype=torch.float64)
    for stage in model:
        if stage.reversible:
            x_in = streams.apply(lambda t: t.detach().requires_grad_(), x)
            y = stage(x_in)
            g = streams.apply(torch.randn_like, y)
            ref = torch.autograd.grad(
                streams.tensors(y), [*streams.tensors(x_in), *stage.parameters()], streams.tensors(g)
            )
            graph = stage.reconstruct(streams.apply(torch.Tensor.detach, y))  # the engine's path
            stage.zero_grad(set_to_none=True)
            graph.backward(g)
            got = [*streams.tensors(graph.input_grad()), *(p.grad for p in stage.parameters())]
            assert len(got) == len(ref)
            for a, b in zip(got, ref):
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
        with torch.no_grad():
            x = stage(x)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("stem,size", [("cifar", 16), ("imagenet", 64)])
def test_forward_and_backward_run_end_to_end(arch, stem, size):
    torch.manual_seed(0)
    model = build_model(arch, num_classes=7, stem=stem, width=2)
    x = torch.randn(2, 3, size, size)
    logits = model(x)
    assert logits.shape == (2, 7)
    torch.nn.functional.cross_entropy(logits, torch.tensor([1, 3])).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(arch="vgg16", num_classes=10), "'vgg16'"),
        (dict(arch="revnet18", num_classes=10, width=0), "width"),
        (dict(arch="revnet18", num_classes=10, stem="mnist"), "'mnist'"),
        (dict(arch="revnet18", num_classes=1), "num_classes"),
    ],
)
def test_bad_arguments_raise_one_line_value_errors(kwargs, needle):
    arch = kwargs.pop("arch")
    with pytest.raises(ValueError) as err:
        build_model(arch, **kwargs)
    message = str(err.value)
    assert needle in message and "\n" not in message
    if "unknown" in message:
        assert "allowed" in message


def test_staged_model_is_a_sequence():
    model = build_model("revnet18", num_classes=10, width=2)
    assert len(model) == 10 and model[0].kind == "S" and model[-1].kind == "H"
    assert [s.kind for s in model] == model.kinds.split()


def test_a_model_split_over_two_devices_runs_end_to_end():
    """Evaluation of a model whose stages sit on several devices (cpu and meta stand in for two GPUs)."""
    torch.manual_seed(0)
    model = build_model("revnet18", num_classes=5, width=4)
    for stage in model[5:]:
        stage.to("meta")
    model.eval()
    with torch.no_grad():
        out = model(torch.randn(2, 3, 16, 16))
    assert out.device.type == "meta" and out.shape == (2, 5)


def test_reconstruction_error_per_precision_compounds_along_a_chain_of_rebuilds():
    """PETRA's rebuilt inputs (accounting/reconstruction.py): fp32 within 1e-5; bf16 with float32
    messages (as training runs it) closer still, since a bf16 F added to a float32 stream is
    exact and so is its subtraction; bf16 activations between stages drift (1e-3 and more);
    kept inputs start chains afresh."""
    from petra_core.accounting.reconstruction import reconstruction_errors

    torch.manual_seed(0)
    model = build_model("revnet18", num_classes=5, width=8)
    x = torch.randn(4, 3, 16, 16)
    fp32 = reconstruction_errors(model, x, "fp32")
    bf16 = reconstruction_errors(model, x, "bf16")
    native = reconstruction_errors(model, x, "bf16", messages="native")
    assert [r["chain"] for r in fp32] == [0, 2, 1, 0, 1, 0, 1, 0, 1, 0]  # S R R D R D R D R H
    assert all(r["rel_error"] < 1e-5 for r in fp32) and all(r["rel_error"] < 1e-9 for r in bf16)
    assert native[1]["rel_error"] > native[2]["rel_error"] > 1e-4  # drifts, more for a rebuilt input
    with pytest.raises(ValueError, match="precision 'fp8' is not allowed; allowed: fp32, tf32, bf16"):
        reconstruction_errors(model, x, "fp8")
    with pytest.raises(ValueError, match="messages 'fp8' is not allowed; allowed: float32, native"):
        reconstruction_errors(model, x, "bf16", messages="fp8")
