"""Oracles for the reversible transformers and their twins (issue 43): exact inverses, reconstruction
gradients, parameter counts (twin = reversible, one block in closed form), causality, bad options."""

import pytest
import torch

from petra_core.families import CHARACTERS, VISION_TRANSFORMERS, build, family_of
from petra_core.models import streams
from petra_core.models.transformer import ReversibleTransformerBlock, TransformerBlock, block_params

TINY = dict(width=8, depth=4, heads=2)
VOCAB, CONTEXT = 11, 6


def tiny(arch, dtype=torch.float32, seed=0, **options):
    """``arch`` at width 8, depth 4, 2 heads (10 classes, or a vocabulary of 11 with context 6)."""
    torch.manual_seed(seed)
    options = {**TINY, **options}
    if arch in CHARACTERS.archs:
        return build(arch, num_classes=VOCAB, context=CONTEXT, **options).to(dtype)
    return build(arch, num_classes=10, image_size=8, patch=2, **options).to(dtype)


def inputs(arch, dtype=torch.float32, batch=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    if arch in CHARACTERS.archs:
        return torch.randint(0, VOCAB, (batch, CONTEXT), generator=g)
    return torch.randn(batch, 3, 8, 8, generator=g, dtype=dtype)


def rel(a, b):
    a, b = torch.cat([t.flatten() for t in streams.tensors(a)]), torch.cat([t.flatten() for t in streams.tensors(b)])
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("causal", [False, True])
def test_the_reversible_block_inverts_within_float32_rounding(causal):
    torch.manual_seed(0)
    block = ReversibleTransformerBlock(16, 4, causal)
    x = (torch.randn(4, 10, 16), torch.randn(4, 10, 16))
    with torch.no_grad():
        y = block(x)
    assert rel(block.inverse(y), x) < 1e-6
    assert rel(block.reconstruct(y).input_value(), x) < 1e-6


@pytest.mark.parametrize("arch", ["revvit", "revgpt"])
@pytest.mark.parametrize("blocks_per_stage", [1, 2])
def test_every_reversible_stage_of_a_model_inverts(arch, blocks_per_stage):
    model = tiny(arch, blocks_per_stage=blocks_per_stage)
    x = inputs(arch)
    checked = 0
    with torch.no_grad():
        for stage in model:
            y = stage(x)
            if stage.reversible:
                assert rel(stage.inverse(y), x) < 1e-6, f"{arch} stage {stage.kind}"
                assert rel(stage.reconstruct(y).input_value(), x) < 1e-6
                checked += 1
            x = y
    assert checked == len(model.reversible_stages) == 4 // blocks_per_stage
    assert model.kinds == " ".join(["S", *["R"] * (4 // blocks_per_stage), "H"])


@pytest.mark.parametrize("arch", ["revvit", "revgpt"])
@pytest.mark.parametrize("blocks_per_stage", [1, 2])
@pytest.mark.parametrize("input_grad", [True, False])
def test_reconstruct_gives_autograd_gradients(arch, blocks_per_stage, input_grad):
    """Backpropagating through the rebuilt graph gives autograd's gradients through the forward."""
    model = tiny(arch, torch.float64, blocks_per_stage=blocks_per_stage)
    x = inputs(arch, torch.float64)
    with torch.no_grad():
        x = model[0](x)
    for stage in list(model)[1:-1]:
        x_in = streams.apply(lambda t: t.detach().requires_grad_(), x)
        y = stage(x_in)
        g = streams.apply(torch.randn_like, y)
        ref = torch.autograd.grad(streams.tensors(y), [*streams.tensors(x_in), *stage.parameters()], streams.tensors(g))
        graph = stage.reconstruct(streams.apply(torch.Tensor.detach, y), input_grad=input_grad)
        stage.zero_grad(set_to_none=True)
        graph.backward(g)
        got = [*(streams.tensors(graph.input_grad()) if input_grad else ()), *(p.grad for p in stage.parameters())]
        ref = ref if input_grad else ref[2:]
        assert len(got) == len(ref)
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
        assert (graph.input_grad() is None) != input_grad
        torch.testing.assert_close(graph.output, y, rtol=1e-12, atol=1e-12)
        x = streams.apply(torch.Tensor.detach, y)


def test_one_block_has_its_closed_form_count_and_the_twin_block_the_same():
    for width in (8, 128, 384):
        for block in (
            ReversibleTransformerBlock(width, 4 if width % 4 == 0 else 2, False),
            TransformerBlock(width, 2, True),
        ):
            assert sum(p.numel() for p in block.parameters()) == block_params(width) == 12 * width**2 + 13 * width
    assert block_params(128) == 198_272 and block_params(384) == 1_774_464


def stage_params(model):
    return [sum(p.numel() for p in stage.parameters()) for stage in model]


# the stem (patch conv or token embedding, positions), the blocks, the head (LN + Linear), in closed form
VIT_128 = (3 * 16 * 128 + 128 + 64 * 128) + 6 * block_params(128) + (2 * 128 + 128 * 10 + 10)
GPT_CPU = (65 * 128 + 64 * 128) + 4 * block_params(128) + (2 * 128 + 128 * 65 + 65)
GPT_GPU = (65 * 384 + 256 * 384) + 6 * block_params(384) + (2 * 384 + 384 * 65 + 65)


@pytest.mark.parametrize(
    "reversible,twin,options,total",
    [
        ("revvit", "vit", dict(num_classes=10), VIT_128),
        ("revgpt", "gpt", dict(num_classes=65, size="cpu"), GPT_CPU),
        ("revgpt", "gpt", dict(num_classes=65, size="gpu"), GPT_GPU),
    ],
)
def test_the_reversible_model_and_its_twin_have_the_same_parameters_stage_by_stage(reversible, twin, options, total):
    with torch.device("meta"):
        rev, plain = build(reversible, **options), build(twin, **options)
    assert stage_params(rev) == stage_params(plain)
    assert rev.num_params() == plain.num_params() == total
    assert (VIT_128, GPT_CPU, GPT_GPU) == (1_205_642, 818_241, 10_795_841)


def test_the_default_shapes_are_the_minrev_recipe_and_nanogpt_sizes():
    with torch.device("meta"):
        vit = build("revvit", num_classes=10)
        cpu, gpu = build("revgpt", num_classes=65), build("gpt", num_classes=65, size="gpu")
        grouped = build("vit", num_classes=10, blocks_per_stage=3)
    assert vit.kinds == "S " + "R " * 6 + "H" and vit[0].pos.shape == (1, 64, 128)
    assert vit[1].blocks[0].F[1].heads == 8
    assert cpu.kinds == "S " + "R " * 4 + "H" and cpu[0].pos.shape == (64, 128) and cpu[1].blocks[0].F[1].heads == 4
    assert gpu.kinds == "S " + "B " * 6 + "H" and gpu[0].pos.shape == (256, 384) and gpu[1].blocks[0].F[1].heads == 6
    assert grouped.kinds == "S B B H" and len(grouped[1].blocks) == 3


@pytest.mark.parametrize("arch", ["revgpt", "gpt"])
def test_attention_is_causal(arch):
    """Changing the tokens after position t changes no logit at positions <= t."""
    model = tiny(arch, torch.float64)
    ids = inputs(arch, batch=2)
    changed = ids.clone()
    t = 2
    changed[:, t + 1 :] = (changed[:, t + 1 :] + 1) % VOCAB
    with torch.no_grad():
        a, b = model(ids), model(changed)
    assert a.shape == (2, CONTEXT, VOCAB)
    assert torch.equal(a[:, : t + 1], b[:, : t + 1])
    assert not torch.allclose(a[:, t + 1 :], b[:, t + 1 :])


def test_vision_attention_sees_every_patch():
    model = tiny("revvit", torch.float64)
    x = inputs("revvit", torch.float64)
    changed = x.clone()
    changed[:, :, -2:, -2:] += 1  # the last patch only
    with torch.no_grad():
        assert not torch.allclose(model[:2](x)[0][:, 0], model[:2](changed)[0][:, 0])


def test_the_stem_copies_its_embedding_into_two_separate_streams():
    model = tiny("revgpt")
    x1, x2 = model[0](inputs("revgpt"))
    assert torch.equal(x1, x2) and x1.data_ptr() != x2.data_ptr() and x1.is_contiguous()
    a, b = tiny("revvit")[0](inputs("revvit"))
    assert torch.equal(a, b) and a.shape == (3, 16, 8) and a.is_contiguous()


def test_a_sequence_longer_than_the_context_is_refused():
    model = tiny("gpt")
    with pytest.raises(ValueError, match=r"a sequence of 7 tokens is longer than the context \(6\)"):
        model(torch.zeros(1, 7, dtype=torch.long))


@pytest.mark.parametrize(
    "arch,options,needle",
    [
        ("revvit", dict(num_classes=10, width=30, heads=8), "width 30 is not a multiple of heads (8)"),
        ("vit", dict(num_classes=10, depth=6, blocks_per_stage=4), "blocks_per_stage 4 does not divide depth 6"),
        ("revvit", dict(num_classes=10, stem="imagenet"), "unknown stem 'imagenet'; allowed: cifar"),
        ("revvit", dict(num_classes=10, patch=5), "image_size 32 is not a multiple of patch (5)"),
        ("vit", dict(num_classes=10, aux_head="cnn"), "unknown aux_head 'cnn'; allowed: linear"),
        ("revvit", dict(num_classes=1), "num_classes must be an integer >= 2, got 1"),
        ("revvit", dict(num_classes=10, depth=0), "depth must be an integer >= 1, got 0"),
        ("revgpt", dict(num_classes=65, size="tpu"), "unknown size 'tpu'; allowed: cpu, gpu"),
        ("gpt", dict(num_classes=65, context=0), "context must be an integer >= 1, got 0"),
        ("revgpt", dict(num_classes=65, heads=5), "width 128 is not a multiple of heads (5)"),
        ("gpt", dict(num_classes=65, width=2.5), "width must be an integer >= 1, got 2.5"),
    ],
)
def test_bad_options_raise_one_line_value_errors(arch, options, needle):
    with pytest.raises(ValueError) as err:
        build(arch, **options)
    assert needle in str(err.value) and "\n" not in str(err.value)
    if "divide" in needle:
        assert "allowed: 1, 2, 3, 6" in str(err.value)


def test_the_archs_belong_to_their_families():
    assert family_of("revvit") is family_of("vit") is VISION_TRANSFORMERS
    assert family_of("revgpt") is family_of("gpt") is CHARACTERS
    with pytest.raises(ValueError, match=r"unknown arch 'revbert'; allowed: .*revvit, vit, revgpt, gpt"):
        build("revbert", num_classes=2)
