"""Demo tests run torch on one thread: tiny models gain nothing from more, and on a shared
2-core machine an oversubscribed thread pool makes them several times slower."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
