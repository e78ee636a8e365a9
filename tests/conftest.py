"""Suite-wide settings: one torch thread (tiny tensors on 2 shared cores run far faster so)."""
import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
