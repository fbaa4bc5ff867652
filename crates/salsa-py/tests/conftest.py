import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]


@pytest.fixture
def repo():
    return REPO


@pytest.fixture
def scratch(tmp_path):
    return tmp_path
