"""Model families: what a kind of model is trained on and evaluated by (``family.py``), and the
families there are (``registry.py``; image classification, ``image.py``, is the first; vision
transformers and a character-level language model, ``transformers.py``).

Families sit on the models floor: they assemble stages into a :class:`~petra_core.models.StagedModel`
and give it its objective; they never import methods, the engine or the run layer.
"""

from ..lazy import lazy

_EXPORTS = {
    "ModelFamily": "family",
    "ImageClassification": "image",
    "IMAGES": "image",
    "FAMILIES": "registry",
    "register_family": "registry",
    "family_of": "registry",
    "build": "registry",
    "build_model": "image",
    "VisionTransformers": "transformers",
    "CharacterLM": "transformers",
    "VISION_TRANSFORMERS": "transformers",
    "CHARACTERS": "transformers",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy(__name__, _EXPORTS)
