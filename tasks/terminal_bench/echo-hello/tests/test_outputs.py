from pathlib import Path


def test_hello():
    assert Path("/app/hello.txt").read_text() == "hello\n"
