from pathlib import Path


def test_done():
    assert Path("/app/done.txt").is_file()
