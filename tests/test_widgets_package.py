"""`import widgets` is cheap, and every name it advertises resolves."""
import pytest

import widgets


@pytest.mark.parametrize("name", widgets.__all__)
def test_every_advertised_widget_resolves(name):
    assert callable(getattr(widgets, name))


def test_an_unknown_name_lists_what_exists():
    with pytest.raises(AttributeError, match="available: BudgetWidget"):
        widgets.NoSuchWidget
