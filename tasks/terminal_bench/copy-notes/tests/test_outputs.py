from pathlib import Path


def test_backup():
    assert Path("/app/backup.txt").read_text() == "buy milk\ncall Sam\n"
