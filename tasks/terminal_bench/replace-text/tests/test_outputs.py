from pathlib import Path
import subprocess

def test_port():
    lines = Path("/app/config.ini").read_text().splitlines()
    assert "port = 9090" in lines and "port = 8080" not in lines

def test_rest_unchanged():
    lines = Path("/app/config.ini").read_text().splitlines()
    assert lines == ["[server]", "host = localhost", "port = 9090", "debug = false"]
