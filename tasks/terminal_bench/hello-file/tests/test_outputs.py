from pathlib import Path
import subprocess

def test_hello_exists():
    assert Path("/app/hello.txt").is_file()

def test_hello_content():
    assert Path("/app/hello.txt").read_text() == "Hello, world!\n"
