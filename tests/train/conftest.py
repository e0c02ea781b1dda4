import pytest
import torch


@pytest.fixture
def one_thread():
    """One intra-op thread: other jobs share this machine's cores, and a thread waiting on a
    descheduled one turns a 50-step run of a tiny model into seconds."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
