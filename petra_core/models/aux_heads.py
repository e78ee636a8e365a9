"""Auxiliary heads: a small classifier on a stage's output, for local learning (``local``, ``fg-local``).

A local-learning method trains stage j (also, or only) from the loss of its own auxiliary head.
Heads are small by design, as the authors of "Can Forward Gradient Match Backpropagation?"
(Fournier et al., ICML 2023) keep theirs, under 10 % of the network's FLOPs (tested):

* ``cnn``    — 1x1 conv to ``hidden`` channels, BN, ReLU; 3x3 stride-2 conv, BN, ReLU; global
  average pool; linear;
* ``linear`` — BN, global average pool, linear.

A transformer stage's head (``TokenAuxHead``, ``linear`` only) is a layer norm and a linear layer
on its tokens (below).

A head is a stage's submodule (``stage.aux``), so the stage's optimizer and checkpoints carry it;
the stage's own forward never runs it, and a model built without heads is the model as before.
"""

from __future__ import annotations

from torch import Tensor, nn

AUX_HEADS = ("cnn", "linear")


class AuxHead(nn.Module):
    def __init__(self, kind: str, c_in: int, num_classes: int, hidden: int):
        super().__init__()
        if kind not in AUX_HEADS:
            raise ValueError(f"unknown auxiliary head {kind!r}; allowed: {', '.join(AUX_HEADS)}")
        if kind == "cnn":
            self.body = nn.Sequential(
                nn.Conv2d(c_in, hidden, 1, bias=False),
                nn.BatchNorm2d(hidden),
                nn.ReLU(inplace=True),
                nn.Conv2d(hidden, hidden, 3, stride=2, padding=1, bias=False),
                nn.BatchNorm2d(hidden),
                nn.ReLU(inplace=True),
                nn.AdaptiveAvgPool2d(1),
                nn.Flatten(1),
                nn.Linear(hidden, num_classes),
            )
        else:
            self.body = nn.Sequential(
                nn.BatchNorm2d(c_in), nn.AdaptiveAvgPool2d(1), nn.Flatten(1), nn.Linear(c_in, num_classes)
            )

    def forward(self, h: Tensor) -> Tensor:
        return self.body(h)  # a RevNet's two streams side by side (``streams.join``)


TOKEN_AUX_HEADS = ("linear",)


class TokenAuxHead(nn.Module):
    """A transformer stage's auxiliary head (``linear``): the streams averaged, LN, then Linear.

    It reads what local learning hands a head, ``streams.join(output)``: a reversible pair of
    (B, T, width) streams side by side along dimension 1, (B, 2T, width), which it splits back and
    averages (``n_streams``), as the model's head does. ``per_token`` (a language model): logits
    at every position, laid out (B, classes, T), the layout ``F.cross_entropy`` takes with (B, T)
    targets, so its loss is the mean over tokens; else (images) the tokens are mean-pooled first.
    """

    def __init__(self, width: int, num_classes: int, *, n_streams: int, per_token: bool):
        super().__init__()
        self.n_streams, self.per_token = n_streams, per_token
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, h: Tensor) -> Tensor:
        h = self.norm(h.unflatten(1, (self.n_streams, -1)).mean(1))
        return self.fc(h).transpose(1, 2) if self.per_token else self.fc(h.mean(1))
