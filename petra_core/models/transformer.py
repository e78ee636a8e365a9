"""Reversible transformers (RevViT, Mangalam et al., CVPR 2022) and their non-reversible twins, as stages.

A reversible activation is a pair of streams (x₁, x₂), each (batch, tokens, width), as a RevNet's
(``streams.py``). One reversible block is two additive couplings with pre-layer-norm branches:

    y₁ = x₁ + F(x₂),   F = LN → multi-head self-attention (``scaled_dot_product_attention``)
    y₂ = x₂ + G(y₁),   G = LN → MLP (Linear 4·width, GELU, Linear)

and its inverse, exact up to float rounding, is x₂ = y₂ − G(y₁), x₁ = y₁ − F(x₂).

The **twin** of a reversible model is the pre-LN residual transformer of the same width, depth and
heads: one stream, x → x + F(x) → (·) + G(·), with F and G built by the same functions. Each twin
block has exactly the reversible block's modules, hence its parameter count (12·w² + 13·w per
block, :func:`block_params`); the stems and heads are the same modules too (the reversible stem
copies its embedding into both streams, the reversible head averages them). The models have the
same parameters; the reversible one carries two streams of ``width`` between blocks, twice the
twin's activation.

**No dropout**, anywhere: PETRA and reversible backprop rebuild a stage's input from its output
with a second evaluation of F and G, and a random mask drawn again there would not be the
forward's, so the rebuilt input and the gradients would be wrong.

Initialisation is PyTorch's layer default (the token embedding N(0, 1)); learned position
embeddings start at zero, as minREV's. A small embedding (GPT-2's N(0, 0.02²)) under a layer norm
would make the first inverse ill-conditioned: LN's Jacobian scales as 1 / the stream's spread, so
the rounding of y₁ = x₁ + F(x₂) came back amplified (measured on a width-8 revgpt: inverses within
3e-5 of the input, relative, against 1e-7 with this initialisation).

A stage holds ``blocks_per_stage`` consecutive blocks; a reversible stage inverts them last to
first. Stems and heads are stages of their own (kinds S and H); the blocks' stages are R
(reversible) or B (the twin's).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import streams
from .spec_check import check_int
from .stage import LocalGraph, ReversibleStage, Stage

MLP_RATIO = 4


def block_params(width: int) -> int:
    """Parameters of one block, reversible or twin, in closed form: two layer norms (2·2w), the
    attention's qkv (3w² + 3w) and output projection (w² + w), the MLP (4w² + 4w, 4w² + w)."""
    return 12 * width * width + 13 * width


class Attention(nn.Module):
    """Multi-head self-attention on (batch, tokens, width): qkv projection, ``scaled_dot_product_attention``
    (causal for text), output projection."""

    def __init__(self, width: int, heads: int, causal: bool):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        b, t, w = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(y.transpose(1, 2).reshape(b, t, w))


def attention_branch(width: int, heads: int, causal: bool) -> nn.Sequential:
    """F: LN → attention."""
    return nn.Sequential(nn.LayerNorm(width), Attention(width, heads, causal))


def mlp_branch(width: int) -> nn.Sequential:
    """G: LN → Linear(w, 4w) → GELU → Linear(4w, w)."""
    hidden = MLP_RATIO * width
    return nn.Sequential(nn.LayerNorm(width), nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))


class TwoCouplingGraph(LocalGraph):
    """The rebuilt graph of one reversible block, each branch evaluated once with autograd on.

    G's graph is built on the given y₁ (an autograd leaf), F's on the rebuilt x₂; the backward of
    the couplings is written by hand, as ``CouplingGraph`` does for a RevNet block: G receives δy₂,
    δy₁ gains G's input gradient, F receives that sum; x₁ gets it, x₂ gets δy₂ plus F's input gradient.
    """

    def __init__(self, x1: Tensor, x2: Tensor, y1: Tensor, f: Tensor, g: Tensor):
        self.inputs, self.y1, self.f, self.g, self.weights, self.joined = (x1, x2), y1, f, g, None, False

    @property
    def output(self) -> streams.Activation:
        """(x₁ + F(x₂), x₂ + G(y₁)), built on demand (inspection and tests)."""
        x1, x2 = self.inputs
        return x1 + self.f, x2 + self.g

    def backward(self, grad: streams.Activation, params=None) -> None:
        x1, x2 = self.inputs
        g_y1, g_y2 = grad
        self.g.backward(g_y2)
        g_y1 = g_y1 + self.y1.grad
        self.f.backward(g_y1)
        if x1.requires_grad:
            x1.grad = g_y1
        if x2.requires_grad:
            x2.grad = g_y2 if x2.grad is None else x2.grad.add_(g_y2)


class ChainGraph(LocalGraph):
    """The rebuilt graphs of a stage's blocks, last to first: the backward of each hands its input
    gradient to the block before it. All of them are held until the stage's backward, as a
    recomputed stage holds its graph."""

    def __init__(self, graphs: list[LocalGraph]):
        self.graphs, self.inputs, self.weights, self.joined = graphs, graphs[0].inputs, None, False

    @property
    def output(self) -> streams.Activation:
        return self.graphs[-1].output

    def backward(self, grad: streams.Activation, params=None) -> None:
        for graph in reversed(self.graphs):
            graph.backward(grad)
            grad = graph.input_grad()


class ReversibleTransformerBlock(nn.Module):
    """(x₁, x₂) → (y₁, y₂) = (x₁ + F(x₂), x₂ + G(y₁)); ``inverse`` and ``reconstruct`` undo it."""

    def __init__(self, width: int, heads: int, causal: bool):
        super().__init__()
        self.F = attention_branch(width, heads, causal)
        self.G = mlp_branch(width)

    def forward(self, x: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        x1, x2 = x
        y1 = x1 + self.F(x2)
        return y1, x2 + self.G(y1)

    @torch.no_grad()
    def inverse(self, y: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        y1, y2 = y
        x2 = y2 - self.G(y1)
        return y1 - self.F(x2), x2

    def reconstruct(self, y: tuple[Tensor, Tensor], *, input_grad: bool = True) -> TwoCouplingGraph:
        """The input rebuilt with the current weights while each branch's graph is built once:
        G(y₁) on y₁ as a leaf gives x₂ = y₂ − G(y₁); F(x₂) on x₂ as a leaf gives x₁ = y₁ − F(x₂)."""
        y1, y2 = (t.detach() for t in y)
        y1.requires_grad_(True)  # F's gradient is δy₁ plus what flows back through G
        g = self.G(y1)
        x2 = (y2 - g.detach()).requires_grad_(input_grad)
        f = self.F(x2)
        x1 = (y1.detach() - f.detach()).requires_grad_(input_grad)
        return TwoCouplingGraph(x1, x2, y1, f, g)


class TransformerBlock(nn.Module):
    """The twin's block, pre-LN residual: x → h = x + F(x) → h + G(h) (F, G as the reversible block's)."""

    def __init__(self, width: int, heads: int, causal: bool):
        super().__init__()
        self.F = attention_branch(width, heads, causal)
        self.G = mlp_branch(width)

    def forward(self, x: Tensor) -> Tensor:
        h = x + self.F(x)
        return h + self.G(h)


class ReversibleTransformerStage(ReversibleStage):
    """``blocks`` consecutive reversible blocks as one stage (kind R)."""

    def __init__(self, blocks: list[ReversibleTransformerBlock]):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        for block in self.blocks:
            x = block(x)
        return x

    @torch.no_grad()
    def inverse(self, y: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        for block in reversed(self.blocks):
            y = block.inverse(y)
        return y

    def reconstruct(self, y: tuple[Tensor, Tensor], *, input_grad: bool = True) -> LocalGraph:
        """Each block's graph rebuilt from the output, last block first; a block's rebuilt input is
        the output the block before it starts from."""
        graphs = []
        for i in reversed(range(len(self.blocks))):
            graph = self.blocks[i].reconstruct(y, input_grad=input_grad or i > 0)
            graphs.insert(0, graph)
            y = graph.input_value()
        return graphs[0] if len(graphs) == 1 else ChainGraph(graphs)


class TransformerStage(Stage):
    """``blocks`` consecutive twin blocks as one stage (kind B)."""

    kind = "B"

    def __init__(self, blocks: list[TransformerBlock]):
        super().__init__()
        self.blocks = nn.Sequential(*blocks)

    def forward(self, x: Tensor) -> Tensor:
        return self.blocks(x)


def _two(e: Tensor, two_streams: bool) -> streams.Activation:
    """The embedding, or for a reversible model the embedding in both streams (the second a copy,
    as RevViT concatenates it with itself: no stream aliases the other)."""
    return (e, e.clone()) if two_streams else e


class PatchStem(Stage):
    """Images (B, 3, H, W) → tokens (B, (H/p)·(W/p), width): a patch-p convolution (patchify) plus a
    learned position embedding (minREV's ViT stem)."""

    kind = "S"

    def __init__(self, width: int, patch: int, image_size: int, two_streams: bool):
        super().__init__()
        self.two_streams = two_streams
        self.patchify = nn.Conv2d(3, width, patch, stride=patch)
        self.pos = nn.Parameter(torch.zeros(1, (image_size // patch) ** 2, width))

    def forward(self, x: Tensor) -> streams.Activation:
        tokens = self.patchify(x).flatten(2).transpose(1, 2).contiguous()  # a dense (B, N, width) activation
        return _two(tokens + self.pos, self.two_streams)


class TokenStem(Stage):
    """Token ids (B, T), T ≤ context → (B, T, width): token embedding plus learned position embedding."""

    kind = "S"

    def __init__(self, vocab: int, width: int, context: int, two_streams: bool):
        super().__init__()
        self.two_streams = two_streams
        self.tokens = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(context, width))

    def forward(self, ids: Tensor) -> streams.Activation:
        if ids.shape[-1] > self.pos.shape[0]:
            raise ValueError(f"a sequence of {ids.shape[-1]} tokens is longer than the context ({self.pos.shape[0]})")
        return _two(self.tokens(ids) + self.pos[: ids.shape[-1]], self.two_streams)


def merged(x: streams.Activation) -> Tensor:
    """One stream: a reversible pair averaged, (x₁ + x₂) / 2, as RevViT's head does."""
    return (x[0] + x[1]) / 2 if streams.is_pair(x) else x


class ClassifierHead(Stage):
    """(Averaged streams) → LN → mean over tokens → Linear to classes."""

    kind = "H"

    def __init__(self, width: int, num_classes: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x: streams.Activation) -> Tensor:
        return self.fc(self.norm(merged(x)).mean(1))


class LMHead(Stage):
    """(Averaged streams) → LN → Linear to the vocabulary at every position: logits (B, T, V). Not
    tied to the token embedding, which lives in another stage."""

    kind = "H"

    def __init__(self, width: int, vocab: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, vocab)

    def forward(self, x: streams.Activation) -> Tensor:
        return self.fc(self.norm(merged(x)))


def check_shape(*, width: object, depth: object, heads: object, blocks_per_stage: object) -> None:
    """One line for a shape a transformer cannot have: heads must divide width, and
    blocks_per_stage must divide depth."""
    for name, value in (("width", width), ("depth", depth), ("heads", heads), ("blocks_per_stage", blocks_per_stage)):
        check_int(name, value)
    if width % heads:
        raise ValueError(f"width {width} is not a multiple of heads ({heads}): each head gets width / heads")
    if depth % blocks_per_stage:
        allowed = ", ".join(str(d) for d in range(1, depth + 1) if depth % d == 0)
        raise ValueError(f"blocks_per_stage {blocks_per_stage} does not divide depth {depth}; allowed: {allowed}")


def block_stages(
    *, reversible: bool, width: int, depth: int, heads: int, causal: bool, blocks_per_stage: int
) -> list[Stage]:
    """``depth`` blocks in stages of ``blocks_per_stage``: reversible (R) or the twin's (B)."""
    check_shape(width=width, depth=depth, heads=heads, blocks_per_stage=blocks_per_stage)
    block, stage = (
        (ReversibleTransformerBlock, ReversibleTransformerStage) if reversible else (TransformerBlock, TransformerStage)
    )
    blocks = [block(width, heads, causal) for _ in range(depth)]
    return [stage(blocks[i : i + blocks_per_stage]) for i in range(0, depth, blocks_per_stage)]
