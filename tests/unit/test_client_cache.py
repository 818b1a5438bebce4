"""The SDK clients of a process (`ClientCache`): one per key and settings, built once, the oldest
dropped past the limit, never one built twice by threads asking at once."""

from __future__ import annotations

import threading

from orchestrator.models._clients import ClientCache


class Built:
    """A client stand-in that says what it was built for."""

    def __init__(self, what: str) -> None:
        self.what = what


def test_a_client_is_built_once_per_key_and_settings() -> None:
    cache: ClientCache[Built] = ClientCache()
    built: list[str] = []

    def build(what: str) -> Built:
        built.append(what)
        return Built(what)

    first = cache.get("key-1", ("http://a", 30.0), lambda: build("a"))
    assert cache.get("key-1", ("http://a", 30.0), lambda: build("again")) is first
    rotated = cache.get("key-2", ("http://a", 30.0), lambda: build("rotated key"))
    other = cache.get("key-1", ("http://a", 60.0), lambda: build("other timeout"))

    assert built == ["a", "rotated key", "other timeout"]
    assert len({id(first), id(rotated), id(other)}) == 3


def test_past_its_limit_the_oldest_client_is_dropped_and_built_again_when_asked_for() -> None:
    cache: ClientCache[Built] = ClientCache(limit=2)
    one = cache.get("k", ("one",), lambda: Built("one"))
    cache.get("k", ("two",), lambda: Built("two"))
    cache.get("k", ("three",), lambda: Built("three"))  # drops "one"

    assert cache.get("k", ("three",), lambda: Built("three again")).what == "three"
    again = cache.get("k", ("one",), lambda: Built("one again"))
    assert again is not one and again.what == "one again"


def test_threads_asking_at_once_get_the_one_client_built_once() -> None:
    cache: ClientCache[Built] = ClientCache()
    builds: list[int] = []
    start = threading.Barrier(8)
    got: list[Built] = []

    def build() -> Built:
        builds.append(1)
        return Built("shared")

    def ask() -> None:
        start.wait(timeout=10)
        got.append(cache.get("k", ("s",), build))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)

    assert len(got) == 8 and len({id(client) for client in got}) == 1 and builds == [1]


def test_the_api_key_is_not_kept_in_the_cache_s_keys() -> None:
    cache: ClientCache[Built] = ClientCache()
    cache.get("sk-secret-0123456789", ("http://a",), lambda: Built("a"))

    assert "sk-secret-0123456789" not in repr(vars(cache))
