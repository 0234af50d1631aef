"""A vision-language model's image inputs as the trainer feeds them: the same image processor, the same
expansion of each image placeholder, the same pixel values the generation server computed.

Token ids travel compact: one placeholder token per image (`<image>` for Idefics3 / SmolVLM,
`<|image_pad|>` between `<|vision_start|>` and `<|vision_end|>` for Qwen2-VL), which is what the
generation servers take (vLLM expands it itself, from the model folder's processor). The trainer expands
each placeholder into the processor's tokens for that image and computes the pixel values from the
image's PNG bytes, the bytes the server was sent, so both sides run the model on the same inputs.

Families:
- Idefics3 / SmolVLM: the folder's processor expands `<image>` (`<fake_token_around_image><global-img>
  <image>...`); pixel values [rows, images, 3, H, W], a row with fewer images padded with zero images
  (which the model skips); plain 1-D positions.
- Qwen2-VL / Qwen2.5-VL: `<|image_pad|>` repeats once per merged patch (grid t x h x w / merge_size^2, as its
  processor does); pixel values are the batch's patches in order with each image's grid; the model
  builds its 3-D rotary positions itself from the attention mask and the image tokens, so the
  trainer passes no position ids. Only the image processor is read (the full processor's video part
  needs torchvision).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from dockyard.errors import DockyardError

PROCESSOR_FAMILIES = ("idefics3", "smolvlm")
MROPE_FAMILIES = ("qwen2_vl", "qwen2_5_vl")
FAMILIES = PROCESSOR_FAMILIES + MROPE_FAMILIES


class VisionInputError(DockyardError, ValueError):
    """A sample's images and its placeholder tokens disagree, or the model cannot take images."""


def _config(path: str | Path) -> dict:
    return json.loads((Path(path).expanduser() / "config.json").read_text())


def is_vision_model(path: str | Path) -> bool:
    """A model folder whose config has a vision tower (its weights load as image-text-to-text)."""
    try:
        return "vision_config" in _config(path)
    except (OSError, ValueError):
        return False


def vision_family_problem(path: str | Path) -> str | None:
    """Why the trainer cannot take this model's images, or None."""
    try:
        family = _config(path).get("model_type")
    except (OSError, ValueError) as err:
        return f"{path}: config.json cannot be read ({err})"
    if family not in FAMILIES:
        return (f"{path} is a {family!r} vision model; the trainer feeds images to the "
                f"{', '.join(FAMILIES)} families (a new one needs its placeholder expansion and pixel "
                "arguments in dockyard/vision.py)")
    return None


@dataclass
class ExpandedSample:
    token_ids: list[int]          # every placeholder replaced by its image's tokens
    prompt_length: int            # of the expanded prompt
    where: list[int]              # the expanded position of each original token (a placeholder: its last)
    pixels: dict                  # its images' tensors, concatenated per name


class VisionInputs:
    """The model folder's image processing, as the trainer uses it."""

    def __init__(self, model_path: str | Path):
        problem = vision_family_problem(model_path)
        if problem:
            raise VisionInputError(problem)
        folder = Path(model_path).expanduser()
        config = _config(folder)
        self.mrope = config["model_type"] in MROPE_FAMILIES
        if self.mrope:
            from transformers import AutoImageProcessor, AutoTokenizer

            self.images = AutoImageProcessor.from_pretrained(folder)
            tokenizer = AutoTokenizer.from_pretrained(folder)
            self.image_token_id = config["image_token_id"]
            self.image_token = tokenizer.convert_ids_to_tokens(self.image_token_id)
            start, end = (tokenizer.convert_ids_to_tokens(config[key])
                          for key in ("vision_start_token_id", "vision_end_token_id"))
            self.placeholder = f"{start}{self.image_token}{end}"   # what a prompt writes per image
        else:
            from transformers import AutoProcessor

            self.processor = AutoProcessor.from_pretrained(folder)
            self.image_token = self.placeholder = self.processor.image_token
            self.image_token_id = self.processor.tokenizer.convert_tokens_to_ids(self.image_token)
        self._expansions: dict[bytes, tuple[list[int], dict]] = {}

    def stand_in(self) -> tuple[list[int], bytes]:
        """(token ids, image) of a prompt of one small grey image and one response token: what runs the
        vision tower in a training micro-batch that has no image of its own."""
        if not hasattr(self, "_stand_in"):
            from PIL import Image

            buffer = io.BytesIO()
            Image.new("RGB", (28, 28), (128, 128, 128)).save(buffer, "PNG")
            self._stand_in = buffer.getvalue()
        return [self.image_token_id, 0], self._stand_in

    def expansion(self, png: bytes) -> tuple[list[int], dict]:
        """(the placeholder token's expansion, the image's tensors), cached per image."""
        cached = self._expansions.get(png)
        if cached is None:
            from PIL import Image

            with Image.open(io.BytesIO(png)) as image:
                picture = image.convert("RGB")
            if self.mrope:
                out = self.images(images=[picture], return_tensors="pt")
                count = int(out["image_grid_thw"][0].prod()) // self.images.merge_size ** 2
                cached = ([self.image_token_id] * count,
                          {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]})
            else:
                out = self.processor(text=[self.image_token], images=[[picture]], add_special_tokens=False,
                                     return_tensors="pt")
                cached = (out["input_ids"][0].tolist(),
                          {name: out[name][0] for name in ("pixel_values", "pixel_attention_mask") if name in out})
            if len(self._expansions) > 256:   # a step's screenshots; older steps' are not asked again
                self._expansions.clear()
            self._expansions[png] = cached
        return cached

    def expand(self, token_ids: list[int], prompt_length: int, images: list[bytes]) -> ExpandedSample:
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

    def model_inputs(self, per_row: list[dict], ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """The forward's image arguments for rows `ids` (expanded, padded) whose images are `per_row`;
        {} when no row has any."""
        rows = [row for row in per_row if row]
        if not rows:
            return {}
        if self.mrope:   # every image's patches in row order, its grid beside; which tokens are images
            return {"pixel_values": torch.cat([row["pixel_values"] for row in rows]),
                    "image_grid_thw": torch.cat([row["image_grid_thw"] for row in rows]),
                    "mm_token_type_ids": (ids == self.image_token_id).long()}
        counts = [len(row["pixel_values"]) if row else 0 for row in per_row]
        example = rows[0]
        values = torch.zeros((len(per_row), max(counts)) + tuple(example["pixel_values"].shape[1:]))
        out = {"pixel_values": values}
        if "pixel_attention_mask" in example:
            out["pixel_attention_mask"] = torch.zeros((len(per_row), max(counts))
                                                      + tuple(example["pixel_attention_mask"].shape[1:]), dtype=torch.bool)
        for row, tensors in enumerate(per_row):
            if tensors:
                values[row, :counts[row]] = tensors["pixel_values"]
                if "pixel_attention_mask" in out:
                    out["pixel_attention_mask"][row, :counts[row]] = tensors["pixel_attention_mask"].bool()
        return out
