import urllib.request
from pathlib import Path


def test_the_answer_is_the_services_secret():
    secret = urllib.request.urlopen("http://api:8000/secret", timeout=10).read().decode()
    assert Path("/app/answer.txt").read_text().strip() == secret
