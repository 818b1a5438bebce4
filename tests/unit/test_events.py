"""Run event ids: four integers, ordered as a tuple, that put every event of a run in one order."""

from __future__ import annotations

import pytest

from orchestrator.errors import InvalidInputError
from orchestrator.events import (
    MAX_PART,
    RunEvent,
    drop_restarted,
    event_id,
    live_key,
    message_key,
    parse_id,
    status_key,
)


def event(key: tuple[int, int, int, int], name: str = "RunContent", content: str | None = None) -> RunEvent:
    return RunEvent.model_validate(
        {"id": event_id(key), "event": name, "run_id": "r", "created_at": 0.0, "content": content}
    )


def test_an_id_is_four_integers_joined_by_dashes_and_reads_back_as_its_key() -> None:
    assert event_id((12, 2, 7, 33)) == "12-2-7-33"
    assert parse_id("12-2-7-33") == (12, 2, 7, 33)


@pytest.mark.parametrize("text", ["", "1-2-3", "1-2-3-4-5", "a-b-c-d", "1--2-3", "-1-2-3-4", "1-2-3-4 "])
def test_an_id_that_is_not_four_non_negative_integers_is_refused(text: str) -> None:
    with pytest.raises(InvalidInputError):
        parse_id(text)


@pytest.mark.parametrize("text", ["999999999999999999-0-0-0", "0-2147483649-0-0", "0-0-0-" + "9" * 5000])
def test_an_id_with_a_part_larger_than_any_event_holds_is_refused_saying_so(text: str) -> None:
    with pytest.raises(InvalidInputError, match=f"a part over {MAX_PART}"):
        parse_id(text)


def test_the_largest_part_an_id_may_have_is_read() -> None:
    assert parse_id(f"{MAX_PART}-0-{MAX_PART}-0") == (MAX_PART, 0, MAX_PART, 0)


def test_at_one_message_count_the_message_events_come_first_then_each_attempt_in_epoch_order() -> None:
    # Count 3: the tool result at idx 2, a continue at epoch 4, the claim at epoch 5 streaming,
    # then its retry logged at epoch 5, and the next claim's restart at epoch 6.
    order = [
        message_key(2, 0),
        status_key(3, 4, 0),
        live_key(3, 5, 0),
        live_key(3, 5, 1),
        live_key(3, 5, 2),
        status_key(3, 5, 0),
        live_key(3, 6, 0),
        live_key(3, 6, 1),
        message_key(3, 0),  # the reply the last attempt committed, at idx 3
        status_key(4, 6, 0),  # the run completing
    ]
    assert order == sorted(order)
    assert parse_id("10-1-0-0") > parse_id("9-1-0-0")  # integer order, not string order
    assert [parse_id(event_id(k)) for k in order] == order


def test_dropping_restarted_deltas_keeps_only_the_text_of_the_attempt_that_committed() -> None:
    events = [
        event(live_key(1, 1, 1), content="Hel"),
        event(status_key(1, 1, 0), "RunRetrying"),
        event(live_key(1, 2, 0), "StepRestarted"),
        event(live_key(1, 2, 1), content="Hello"),
        event(live_key(1, 2, 2), content=" there"),
        event(status_key(2, 2, 0), "RunCompleted", "Hello there"),
    ]

    kept = drop_restarted(events)

    assert "".join(e.content or "" for e in kept if e.event == "RunContent") == "Hello there"
    assert [e.event for e in kept] == ["RunRetrying", "StepRestarted", "RunContent", "RunContent", "RunCompleted"]
