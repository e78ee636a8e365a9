"""The contract of a model family: what the engine and the run layer need of a kind of model.

The engine trains any :class:`~petra_core.models.StagedModel`; what the model is *for* (its loss,
what is counted of each minibatch, what evaluation reports, what an input looks like) belongs to
its family. A family builds its models with :meth:`ModelFamily.staged`, which hands the family to
the model (``model.family``) and to its head (``head.objective``): the head's worker asks its
stage for the objective, so a new family needs no edit of the engine or of the run layer, only
:func:`~petra_core.families.registry.register_family`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

from torch import Tensor

from ..models.stage import Stage
from ..models.staged import StagedModel
from ..models.streams import Activation


class ModelFamily(ABC):
    """A kind of model: the archs it builds, its training objective, its evaluation, its inputs.

    ``train_sums`` names the per-minibatch sums the head keeps on the device (they add up over
    minibatches, so a log read once per interval, or gathered across ranks, loses nothing);
    ``eval_names`` the fields an evaluation adds to a record (None where an epoch is not evaluated);
    ``data_kind`` the kind of dataset its models read (a data source's ``kind``: ``images``, or
    ``text`` for token ids), which the run's config checks against its dataset;
    ``cuts_blocks_per_stage`` whether :meth:`build` takes ``blocks_per_stage`` (several blocks in
    one stage: a run's ``blocks_per_stage`` key).
    A family holds no state: copies of a model share it.
    """

    name: str
    train_sums: tuple[str, ...]
    eval_names: tuple[str, ...]
    data_kind: str = "images"
    cuts_blocks_per_stage: bool = False

    @property
    @abstractmethod
    def archs(self) -> tuple[str, ...]:
        """The arch names :meth:`build` accepts."""

    @abstractmethod
    def build(self, arch: str, **options) -> StagedModel:
        """A fresh model of ``arch`` (initialised from torch's current seed), built with :meth:`staged`."""

    @abstractmethod
    def loss(self, output: Tensor, targets: Tensor) -> Tensor:
        """The mean loss of a minibatch, the one the head backpropagates (scaled by 1/k there)."""

    @abstractmethod
    def minibatch_sums(self, output: Tensor, targets: Tensor) -> Tensor:
        """The minibatch's ``train_sums``, a 1-D tensor left on the device (no host sync)."""

    @abstractmethod
    def train_record(self, loss_sum: float, sums: Sequence[float], n: int) -> dict:
        """An epoch's training fields from Σ loss·n, the summed ``train_sums`` and n samples."""

    @abstractmethod
    def eval_sums(self, output: Tensor, targets: Tensor) -> Mapping[str, float]:
        """What evaluation adds up over the test batches, for one batch (host floats)."""

    @abstractmethod
    def eval_record(self, sums: Mapping[str, float], n: float) -> dict:
        """The ``eval_names`` fields from the test set's summed :meth:`eval_sums` and n samples."""

    @abstractmethod
    def sample_input(self, batch: int, *, device=None, **options) -> Activation:
        """An input of ``batch`` samples (zeros or uninitialised: its shape matters, e.g. for shape
        propagation on the meta device in accounting)."""

    def staged(self, arch: str, stages: list[Stage]) -> StagedModel:
        """``stages`` as a model of this family: its head (the last stage) is trained on this
        family's objective."""
        stages[-1].objective = self
        return StagedModel(arch, stages, family=self)

    def __deepcopy__(self, memo) -> ModelFamily:
        return self  # stateless: a deep copy of a model keeps its family
