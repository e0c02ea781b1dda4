"""Fixtures shared by more than one test package."""

import pytest

# The oracle's assert helpers keep pytest's detailed failure messages.
pytest.register_assert_rewrite("tests.shapes.oracle")


@pytest.fixture
def one_thread():
    """One torch intra-op thread during the test (the count before is restored after)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
