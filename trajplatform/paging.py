"""Pages of long lists without their total (the trajectory list, a batch's tasks).

A COUNT(*) of every row the filters leave is linear in the table: at 1M trajectories on
PostgreSQL it was most of the trajectory list's time. A window reads `size + 1` rows, so it knows
whether an older page exists, and shows "page N" with newer / older links instead of a total.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Pages go no deeper than this (an OFFSET this deep is still an index walk; past it, filter).
MAX_PAGE = 10_000


@dataclass
class Window:
    """One page of a list without its total: `size + 1` rows are read, so whether an older page
    exists is known without counting every row (a COUNT(*) over 1M trajectories was most of the
    list's time on PostgreSQL)."""

    object_list: list[Any]
    number: int
    has_next: bool

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def previous_page_number(self) -> int:
        return self.number - 1

    @property
    def next_page_number(self) -> int:
        return self.number + 1


def window(queryset: Any, page: str | None, size: int) -> Window:
    """Page `page` (1 when it is not a number from 1 to MAX_PAGE) of an ordered queryset."""
    number = int(page) if page and page.isascii() and page.isdigit() and 1 <= int(page) <= MAX_PAGE else 1
    rows = list(queryset[(number - 1) * size:number * size + 1])
    return Window(object_list=rows[:size], number=number, has_next=len(rows) > size)


def without_page(query: Any) -> str:
    """A request's query string (its GET) without `page`: what a pager's links carry."""
    query = query.copy()
    query.pop("page", None)
    return str(query.urlencode())
