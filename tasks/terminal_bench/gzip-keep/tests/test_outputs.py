from pathlib import Path
import subprocess

import gzip

def test_compressed():
    assert gzip.open("/app/big.txt.gz").read() == Path("/app/big.txt").read_bytes()

def test_original_kept():
    assert Path("/app/big.txt").read_text().startswith("line 0")
