#!/bin/bash
# a distribution registering a pytest plugin (autoloaded) that marks every test passed
site=/usr/local/lib/python3.11/dist-packages
mkdir -p $site/passall-1.0.dist-info
cat > $site/passall.py <<'PY'
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None
PY
printf 'Metadata-Version: 2.1\nName: passall\nVersion: 1.0\n' > $site/passall-1.0.dist-info/METADATA
printf '[pytest11]\npassall = passall\n' > $site/passall-1.0.dist-info/entry_points.txt
printf 'passall.py,,\n' > $site/passall-1.0.dist-info/RECORD
