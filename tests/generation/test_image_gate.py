"""The multimodal gate on crafted files: rotated JPEG, RGBA PNG, two-frame GIF, decompression bombs."""

import base64
import io
import struct
import zlib

import pytest
from PIL import Image

from dockyard.generation.images import ImageGate, ImageRejected, as_data_url

OPEN = ImageGate(allowed=True, max_pixels=1_000_000, max_per_sample=2)
RED, BLUE, WHITE = (255, 0, 0), (0, 0, 255), (255, 255, 255)


def encoded(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def left_red_right_blue(width=40, height=20) -> Image.Image:
    image = Image.new("RGB", (width, height), BLUE)
    image.paste(RED, (0, 0, width // 2, height))
    return image


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height RGB pixels, followed by a few bytes of pixel data:
    a decoder that trusted the header would allocate width*height*3 bytes."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def test_exif_orientation_is_applied():
    stored = left_red_right_blue()                        # 40 wide, red on the left
    exif = Image.Exif()
    exif[0x0112] = 6                                      # "rotate 90 CW to display"
    jpeg = encoded(stored, "JPEG", exif=exif, quality=95)
    out = OPEN.normalise(jpeg)
    assert out.size == (20, 40)                           # displayed portrait
    top, bottom = out.getpixel((10, 5)), out.getpixel((10, 35))
    assert top[0] > 200 and top[2] < 60                   # the stored left (red) half is now on top
    assert bottom[2] > 200 and bottom[0] < 60


def test_transparency_is_flattened_onto_white():
    image = Image.new("RGBA", (4, 4), (0, 0, 0, 0))       # fully transparent black
    image.putpixel((0, 0), (255, 0, 0, 255))              # one opaque red pixel
    image.putpixel((1, 0), (0, 0, 255, 128))              # half-transparent blue
    out = OPEN.normalise(encoded(image, "PNG"))
    assert out.mode == "RGB"
    assert out.getpixel((3, 3)) == WHITE                  # not black: transparent areas read as white
    assert out.getpixel((0, 0)) == RED
    assert out.getpixel((1, 0)) == (127, 127, 255)


def test_a_palette_image_with_a_transparent_index_is_flattened_too():
    image = Image.new("P", (2, 1))
    image.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    image.putpixel((1, 0), 1)
    out = OPEN.normalise(encoded(image, "PNG", transparency=0))
    assert out.mode == "RGB" and out.getpixel((0, 0)) == WHITE and out.getpixel((1, 0)) == RED


def test_a_multi_frame_image_is_pinned_to_its_first_frame():
    frames = [Image.new("RGB", (8, 8), RED), Image.new("RGB", (8, 8), BLUE)]
    gif = encoded(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100)
    assert Image.open(io.BytesIO(gif)).n_frames == 2
    out = OPEN.normalise(gif)
    assert out.mode == "RGB" and out.getpixel((4, 4)) == RED
    source = Image.open(io.BytesIO(gif))
    source.seek(1)                                        # even when handed the file at a later frame
    assert OPEN.normalise(source).getpixel((4, 4)) == RED


def test_an_image_over_max_image_pixels_is_refused_from_its_header_before_decoding():
    bomb = png_header_only(5000, 4000)                    # 20 M pixels claimed, 100 bytes of file
    assert len(bomb) < 200
    with pytest.raises(ImageRejected) as err:
        OPEN.normalise(bomb, "sample 3, image 0")
    message = str(err.value)
    assert "sample 3, image 0 is 5000x4000 = 20000000 pixels" in message
    assert "policy.generation.max_image_pixels (1000000)" in message
    # under the limit, the same truncated data is only found out when decoded
    with pytest.raises(ImageRejected, match="could not be decoded"):
        ImageGate(True, 30_000_000, 2).normalise(bomb)


def test_a_header_past_pils_own_limit_is_refused_as_a_bomb_with_the_setting_named():
    with pytest.raises(ImageRejected, match="decompression bomb.*max_image_pixels"):
        ImageGate(True, 10**12, 2).normalise(png_header_only(100_000, 100_000))


def test_max_images_per_sample_and_the_closed_gate_name_their_settings():
    small = encoded(Image.new("RGB", (2, 2), RED), "PNG")
    with pytest.raises(ImageRejected, match=r"sample 1 carries 3 images, more than "
                                            r"policy.generation.max_images_per_sample \(2\)"):
        OPEN.admit([[small], [small, small, small]], 2)
    closed = ImageGate()
    with pytest.raises(ImageRejected, match="sample 1 carries 1 image.*allow_multimodal_inputs is false"):
        closed.admit([[], [small]], 2)
    assert closed.admit(None, 2) is None and closed.admit([[], []], 2) is None   # text path unaffected


def test_sources_paths_data_urls_and_garbage(tmp_path):
    path = tmp_path / "red.png"
    Image.new("RGB", (3, 3), RED).save(path)
    url = "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()
    admitted = OPEN.admit([[path, str(path)], [url]], 2)
    assert [[image.getpixel((1, 1)) for image in sample] for sample in admitted] == [[RED, RED], [RED]]
    with pytest.raises(ImageRejected, match=r"sample 0, image 0 \(.*missing.png\): no such file"):
        OPEN.admit([[tmp_path / "missing.png"]], 1)
    with pytest.raises(ImageRejected, match="sample 0, image 1 is not an image"):
        OPEN.admit([[path, b"definitely not an image"]], 1)
    with pytest.raises(ImageRejected, match="not valid base64"):
        OPEN.normalise("data:image/png;base64,@@@")


def test_the_data_url_sent_to_a_server_is_a_plain_rgb_png():
    exif = Image.Exif()
    exif[0x0112] = 6
    out = OPEN.normalise(encoded(left_red_right_blue(), "JPEG", exif=exif))
    url = as_data_url(out)
    assert url.startswith("data:image/png;base64,")
    sent = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert sent.format == "PNG" and sent.mode == "RGB" and sent.size == (20, 40)
    assert not sent.getexif()                             # no orientation left for the engine to re-apply
