"""Host buffers for KV bytes: 2 MiB aligned, exactly the size asked, advised to use huge pages."""

from __future__ import annotations

import sys

import pytest

from psrl.kvcache.host_buffer import HUGE_PAGE_BYTES, THP_SETTING, advise_huge_pages, huge_page_buffer


def test_a_buffer_is_aligned_to_a_huge_page_and_as_long_as_asked() -> None:
    buffer = huge_page_buffer(3 * HUGE_PAGE_BYTES + 100)
    assert buffer.data_ptr() % HUGE_PAGE_BYTES == 0 and buffer.numel() == 3 * HUGE_PAGE_BYTES + 100
    buffer.fill_(7)
    assert int(buffer[-1]) == 7


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="transparent huge pages are Linux's")
def test_the_advice_is_taken_where_the_kernel_offers_huge_pages() -> None:
    setting = THP_SETTING.read_text() if THP_SETTING.exists() else "[never]"
    assert advise_huge_pages(huge_page_buffer(2 * HUGE_PAGE_BYTES)) is ("[never]" not in setting)


def test_a_buffer_shorter_than_a_huge_page_is_left_as_it_is() -> None:
    assert advise_huge_pages(huge_page_buffer(4096)) is False
