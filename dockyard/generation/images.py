"""The multimodal gate (docs/generation.md, "Image inputs"): what a sample's images must pass before a
generation server sees them.

Off unless `policy.generation.allow_multimodal_inputs`: a sample that carries images through a
closed gate is an error naming the setting, never a silent drop. When open, for each sample:
- at most `max_images_per_sample` images;
- each image's size is read from its header and checked against `max_image_pixels` before any
  pixel is decoded (a decompression bomb is a few KB whose header claims gigapixels);
- multi-frame images (GIF, APNG, TIFF) are pinned to their first frame;
- EXIF orientation is applied, so the engine sees the picture the way a viewer shows it
  (GHSA-8jr5-v98p-w75m: an unnormalised image reached the model rotated or with its alpha channel);
- transparency is flattened onto white and every image leaves as 8-bit RGB.

Backends receive the normalised PIL images; vLLM gets them re-encoded as PNG, so nothing of the
original file (EXIF, extra frames, palettes) reaches its decoder.
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Union

from PIL import Image, ImageOps, UnidentifiedImageError

from dockyard.errors import DockyardError

# A path, a `data:image/...;base64,` URL, raw encoded bytes, or an already opened image.
ImageSource = Union[str, Path, bytes, Image.Image]


class ImageRejected(DockyardError, ValueError):
    """An image (or a sample's set of images) the gate refuses; the message names the setting."""


@dataclass(frozen=True)
class ImageGate:
    allowed: bool = False
    max_pixels: int = 178_956_970
    max_per_sample: int = 8

    @classmethod
    def from_generation(cls, generation) -> "ImageGate":
        """From the policy.generation section of a config."""
        return cls(generation.allow_multimodal_inputs, generation.max_image_pixels, generation.max_images_per_sample)

    def admit(self, images: list[list[ImageSource]] | None, count: int) -> list[list[Image.Image]] | None:
        """Normalised images per prompt (`count` prompts), or None when no prompt carries any."""
        if not images or not any(images):
            return None
        if len(images) != count:
            raise ValueError(f"{len(images)} image lists for {count} prompts (one list per prompt)")
        if not self.allowed:
            carrying = [i for i, sample in enumerate(images) if sample]
            raise ImageRejected(f"sample {carrying[0]} carries {len(images[carrying[0]])} image(s) but "
                                "policy.generation.allow_multimodal_inputs is false; a VLM recipe must turn it on")
        admitted = []
        for index, sample in enumerate(images):
            if len(sample) > self.max_per_sample:
                raise ImageRejected(f"sample {index} carries {len(sample)} images, more than "
                                    f"policy.generation.max_images_per_sample ({self.max_per_sample})")
            admitted.append([self.normalise(source, f"sample {index}, image {position}")
                             for position, source in enumerate(sample)])
        return admitted

    def normalise(self, source: ImageSource, where: str = "image") -> Image.Image:
        image, where = _open(source, where)
        width, height = image.size
        if width * height > self.max_pixels:
            raise ImageRejected(f"{where} is {width}x{height} = {width * height} pixels, more than "
                                f"policy.generation.max_image_pixels ({self.max_pixels})")
        try:
            if getattr(image, "n_frames", 1) > 1:
                image.seek(0)
            image = ImageOps.exif_transpose(image)   # decodes the (first) frame
            return _flatten_to_rgb(image)
        except (OSError, ValueError, SyntaxError) as err:
            raise ImageRejected(f"{where} could not be decoded: {err}") from None


def as_png(image: Image.Image) -> bytes:
    """A normalised image as PNG: what a server is sent and what the trainer decodes (the same pixels)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def as_data_url(image: Image.Image) -> str:
    """A normalised image as the PNG data URL vLLM's media loader accepts."""
    return "data:image/png;base64," + base64.b64encode(as_png(image)).decode("ascii")


def _open(source: ImageSource, where: str) -> tuple[Image.Image, str]:
    """Open lazily: PIL reads the header (size, mode, frames) and decodes pixels only on load()."""
    if isinstance(source, Image.Image):
        return source, where
    if isinstance(source, str) and source.startswith("data:"):
        header, _, payload = source.partition(",")
        if ";base64" not in header:
            raise ImageRejected(f"{where}: only base64 data URLs are accepted")
        try:
            source = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise ImageRejected(f"{where}: the data URL is not valid base64") from None
    if isinstance(source, (str, Path)):
        where = f"{where} ({source})"
        if not Path(source).is_file():
            raise ImageRejected(f"{where}: no such file")
        stream = source   # by name, so PIL closes the file once it has decoded it
    else:
        stream = io.BytesIO(source)
    try:
        with warnings.catch_warnings():
            # the gate's own pixel limit decides; PIL's warning at half its hard limit is noise here
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            return Image.open(stream), where
    except Image.DecompressionBombError as err:
        raise ImageRejected(f"{where} was refused before decoding, as a decompression bomb ({err}); "
                            "policy.generation.max_image_pixels cannot admit more than PIL's own limit") from None
    except (UnidentifiedImageError, OSError) as err:
        raise ImageRejected(f"{where} is not an image this machine can read: {err}") from None


def _flatten_to_rgb(image: Image.Image) -> Image.Image:
    has_alpha = image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info)
    if not has_alpha:
        return image.convert("RGB")
    rgba = image.convert("RGBA")
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(white, rgba).convert("RGB")
