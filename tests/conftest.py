"""Fixtures tests in several folders share."""
import pytest


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The path of a 20,000-character corpus file of the user's own (a slice of the
    built-in one), for a test module's tiny training runs."""
    from engine.trainer.data import load_corpus
    path = tmp_path_factory.mktemp("corpus") / "notes.txt"
    path.write_text(load_corpus()[:20_000], encoding="utf-8")
    return str(path)
