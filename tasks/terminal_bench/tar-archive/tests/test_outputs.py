from pathlib import Path
import subprocess

import tarfile

def test_archive():
    with tarfile.open("/app/docs.tar.gz", "r:gz") as archive:
        names = set(archive.getnames())
    assert {"docs/a.md", "docs/b.md"} <= names
