"""A vision-language model's image inputs as the trainer feeds them: the same processor, the same
expansion of each image placeholder, the same pixel values the generation server computed.

Token ids travel compact: one placeholder token (`processor.image_token`, `<image>` for Idefics3 /
SmolVLM) per image, which is what the generation servers take (vLLM expands it itself, from the model
folder's processor). The trainer expands each placeholder into the processor's tokens for that image
(`<fake_token_around_image><global-img><image>...`) and computes the pixel values from the image's
PNG bytes, the bytes the server was sent, so both sides run the model on the same inputs.

Families: Idefics3 (SmolVLM's architecture; plain 1-D positions, which every trainer path here uses).
Qwen2-VL / Qwen2.5-VL place image tokens with 3-D rotary positions (mrope) that the trainer's
left-padded forward does not build; they are refused by name.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from dockyard.errors import DockyardError

FAMILIES = ("idefics3", "smolvlm")


class VisionInputError(DockyardError, ValueError):
    """A sample's images and its placeholder tokens disagree, or the model cannot take images."""


def is_vision_model(path: str | Path) -> bool:
    """A model folder whose config has a vision tower (its weights load as image-text-to-text)."""
    config = Path(path).expanduser() / "config.json"
    try:
        return "vision_config" in json.loads(config.read_text())
    except (OSError, ValueError):
        return False


def vision_family_problem(path: str | Path) -> str | None:
    """Why the trainer cannot take this model's images, or None."""
    try:
        family = json.loads((Path(path).expanduser() / "config.json").read_text()).get("model_type")
    except (OSError, ValueError) as err:
        return f"{path}: config.json cannot be read ({err})"
    if family not in FAMILIES:
        return (f"{path} is a {family!r} vision model; the trainer feeds images to the "
                f"{', '.join(FAMILIES)} families (Qwen2-VL's 3-D rotary positions are not built)")
    return None


@dataclass
class ExpandedSample:
    token_ids: list[int]          # every placeholder replaced by its image's tokens
    prompt_length: int            # of the expanded prompt
    where: list[int]              # the expanded position of each original token (a placeholder: its last)
    pixels: dict                  # pixel_values [images, 3, H, W] (and pixel_attention_mask) of its images


@dataclass
class VisionBatch:
    """Expanded token rows' images: pixel values [rows, images, 3, H, W] (zeros pad a row with fewer
    images, as the model's own batching does) and their attention mask."""

    pixel_values: torch.Tensor
    pixel_attention_mask: torch.Tensor | None


class VisionInputs:
    """The model folder's processor, as the trainer uses it."""

    def __init__(self, model_path: str | Path):
        from transformers import AutoProcessor

        problem = vision_family_problem(model_path)
        if problem:
            raise VisionInputError(problem)
        self.processor = AutoProcessor.from_pretrained(Path(model_path).expanduser())
        self.image_token = self.processor.image_token
        self.image_token_id = self.processor.tokenizer.convert_tokens_to_ids(self.image_token)
        self._expansions: dict[bytes, tuple[list[int], dict]] = {}

    def expansion(self, png: bytes) -> tuple[list[int], dict]:
        """(the placeholder's expansion, the image's processor outputs), cached per image."""
        cached = self._expansions.get(png)
        if cached is None:
            from PIL import Image

            with Image.open(io.BytesIO(png)) as image:
                out = self.processor(text=[self.image_token], images=[[image.convert("RGB")]],
                                     add_special_tokens=False, return_tensors="pt")
            pixels = {name: out[name][0] for name in ("pixel_values", "pixel_attention_mask") if name in out}
            cached = (out["input_ids"][0].tolist(), pixels)
            if len(self._expansions) > 256:   # a step's screenshots; older steps' are not asked again
                self._expansions.clear()
            self._expansions[png] = cached
        return cached

    def expand(self, token_ids: list[int], prompt_length: int, images: list[bytes]) -> "ExpandedSample":
        """One sample with each placeholder replaced by its image's tokens. Placeholders sit in the prompt
        (the first screenshot) or in observations the environment added after a reply (loss mask 0)."""
        places = [i for i, token in enumerate(token_ids) if token == self.image_token_id]
        if len(places) != len(images):
            raise VisionInputError(f"a sample holds {len(places)} {self.image_token} placeholder(s) and "
                                   f"{len(images)} image(s); each image needs exactly one placeholder")
        ids: list[int] = []
        where: list[int] = []
        pixels: dict[str, list[torch.Tensor]] = {}
        start = 0
        for place, png in zip(places, images):
            expansion, tensors = self.expansion(png)
            where += range(len(ids), len(ids) + place - start)
            ids += token_ids[start:place]
            ids += expansion
            where.append(len(ids) - 1)
            for name, tensor in tensors.items():
                pixels.setdefault(name, []).append(tensor)
            start = place + 1
        where += range(len(ids), len(ids) + len(token_ids) - start)
        ids += token_ids[start:]
        prompt = where[prompt_length - 1] + 1 if prompt_length else 0
        return ExpandedSample(ids, prompt, where, {name: torch.cat(parts) for name, parts in pixels.items()})

    @staticmethod
    def batch(per_row: list[dict]) -> VisionBatch | None:
        """Rows' pixel tensors stacked, zero-padded to the most images in a row; None when no row has any."""
        counts = [len(row["pixel_values"]) if row else 0 for row in per_row]
        if not any(counts):
            return None
        example = next(row for row in per_row if row)
        most = max(counts)
        values = torch.zeros((len(per_row), most) + tuple(example["pixel_values"].shape[1:]))
        mask = None
        if "pixel_attention_mask" in example:
            mask = torch.zeros((len(per_row), most) + tuple(example["pixel_attention_mask"].shape[1:]), dtype=torch.bool)
        for row, tensors in enumerate(per_row):
            if tensors:
                values[row, :counts[row]] = tensors["pixel_values"]
                if mask is not None:
                    mask[row, :counts[row]] = tensors["pixel_attention_mask"].bool()
        return VisionBatch(values, mask)
