from pathlib import Path


def test_total_written():
    assert float(Path("/app/total.txt").read_text()) == 35.0


def test_what_the_build_made_is_still_there():
    assert Path("/opt/tools/made.txt").read_text() == "made by RUN\n"
    assert Path("/app/readme.txt").read_text() == "written in WORKDIR by RUN\n"
    assert Path("/etc/tally.conf").read_text() == "precision=2\n"
    assert Path("/home/alice/notes.txt").read_text() == "notes of alice\n"
