"""Behaviour of extended sequence numbers: the total order of docs/protocol.md §8, validation, formatting."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lease_core.errors import InvalidSequenceNumberError
from lease_core.model.sequence import (
    AT_TIMESTAMP,
    LATEST,
    SHARD_END,
    TRIM_HORIZON,
    ExtendedSequenceNumber,
    Sentinel,
)

HUGE_SMALLER = "49590338271490256608559692538361571095921575989136588898"  # 56 digits
HUGE_LARGER = "9" + "0" * 55  # also 56 digits, numerically larger, lexically larger
SHORT_BUT_LARGER = "6" + "0" * 55

# Every value strictly below the next one.
ASCENDING = [
    pytest.param(AT_TIMESTAMP, id="AT_TIMESTAMP"),
    pytest.param(TRIM_HORIZON, id="TRIM_HORIZON"),
    pytest.param(LATEST, id="LATEST"),
    pytest.param(ExtendedSequenceNumber("0"), id="0"),
    pytest.param(ExtendedSequenceNumber("1"), id="1"),
    pytest.param(ExtendedSequenceNumber("1", 1), id="1/1"),
    pytest.param(ExtendedSequenceNumber("2"), id="2"),
    pytest.param(ExtendedSequenceNumber("10"), id="10"),
    pytest.param(ExtendedSequenceNumber(HUGE_SMALLER), id="huge-4959"),
    pytest.param(ExtendedSequenceNumber(SHORT_BUT_LARGER), id="huge-6000"),
    pytest.param(ExtendedSequenceNumber(HUGE_LARGER), id="huge-9000"),
    pytest.param(SHARD_END, id="SHARD_END"),
]
ASCENDING_VALUES = [param.values[0] for param in ASCENDING]
ADJACENT_PAIRS = [
    pytest.param(low.values[0], high.values[0], id=f"{low.id}<{high.id}") for low, high in itertools.pairwise(ASCENDING)
]


@pytest.mark.parametrize(("low", "high"), ADJACENT_PAIRS)
def test_each_value_is_below_the_next_in_the_total_order(
    low: ExtendedSequenceNumber, high: ExtendedSequenceNumber
) -> None:
    assert low < high and high > low and low <= high and low != high


def test_sorting_a_shuffled_list_restores_the_spec_order() -> None:
    assert sorted(ASCENDING_VALUES) == ASCENDING_VALUES


NUMERIC_NOT_LEXICAL = [
    pytest.param("9", "10", id="9<10"),
    pytest.param("99", "100", id="99<100"),
    pytest.param("9" * 55, "1" + "0" * 55, id="55-nines<1e55"),
    pytest.param(HUGE_SMALLER, HUGE_LARGER, id="56-digits"),
]


@pytest.mark.parametrize(("low", "high"), NUMERIC_NOT_LEXICAL)
def test_digit_strings_compare_numerically_not_lexically(low: str, high: str) -> None:
    assert ExtendedSequenceNumber(low) < ExtendedSequenceNumber(high)


def test_ties_in_the_sequence_number_are_broken_by_the_sub_sequence_number() -> None:
    assert ExtendedSequenceNumber(HUGE_SMALLER, 7) < ExtendedSequenceNumber(HUGE_SMALLER, 8)


def test_a_sub_sequence_number_never_outweighs_a_larger_sequence_number() -> None:
    assert ExtendedSequenceNumber("1", 10**9) < ExtendedSequenceNumber("2", 0)


def test_shard_end_equals_itself() -> None:
    assert ExtendedSequenceNumber("SHARD_END") == SHARD_END and not SHARD_END < SHARD_END


def test_shard_end_is_above_a_huge_sequence_number_with_a_huge_sub_sequence() -> None:
    assert ExtendedSequenceNumber(HUGE_LARGER * 2, 2**63) < SHARD_END


EQUALITY = [
    pytest.param(ExtendedSequenceNumber("5", 1), ExtendedSequenceNumber("5", 1), True, id="same-both-parts"),
    pytest.param(ExtendedSequenceNumber("5", 1), ExtendedSequenceNumber("5", 2), False, id="different-sub"),
    pytest.param(ExtendedSequenceNumber("5", 1), ExtendedSequenceNumber("6", 1), False, id="different-sequence"),
    pytest.param(ExtendedSequenceNumber("5"), ExtendedSequenceNumber("5", 0), True, id="default-sub-is-0"),
    pytest.param(LATEST, ExtendedSequenceNumber("LATEST"), True, id="sentinel-by-name"),
    pytest.param(LATEST, TRIM_HORIZON, False, id="different-sentinels"),
]


@pytest.mark.parametrize(("left", "right", "equal"), EQUALITY)
def test_equality_is_on_both_parts_and_hash_agrees(
    left: ExtendedSequenceNumber, right: ExtendedSequenceNumber, equal: bool
) -> None:
    assert (left == right) is equal
    if equal:
        assert hash(left) == hash(right)


def test_a_sequence_number_is_never_equal_to_a_plain_string() -> None:
    assert ExtendedSequenceNumber("5") != "5"


# --- hypothesis: sorting agrees with a reference key ------------------------------------------------

SENTINEL_REFERENCE = {"AT_TIMESTAMP": -3, "TRIM_HORIZON": -2, "LATEST": -1}

sequence_numbers = st.one_of(
    st.sampled_from([sentinel.value for sentinel in Sentinel]),
    st.integers(min_value=0, max_value=10**60).map(str),
)
extended_sequence_numbers = st.builds(
    ExtendedSequenceNumber, sequence_numbers, st.integers(min_value=0, max_value=2**64)
)


def reference_key(value: ExtendedSequenceNumber) -> tuple[int, int, int]:
    """An independent statement of §8, kept deliberately naive."""
    if value.sequence_number == "SHARD_END":
        return (1, 0, 0)
    rank = SENTINEL_REFERENCE.get(value.sequence_number)
    return (0, int(value.sequence_number) if rank is None else rank, value.sub_sequence_number)


@given(st.lists(extended_sequence_numbers, max_size=30))
def test_sorting_random_values_agrees_with_the_reference_key(values: list[ExtendedSequenceNumber]) -> None:
    assert [reference_key(v) for v in sorted(values)] == sorted(reference_key(v) for v in values)


@given(extended_sequence_numbers, extended_sequence_numbers)
def test_comparisons_agree_with_the_reference_key(left: ExtendedSequenceNumber, right: ExtendedSequenceNumber) -> None:
    left_key, right_key = reference_key(left), reference_key(right)
    assert (left < right, left == right) == (left_key < right_key, left_key == right_key)


@given(extended_sequence_numbers, extended_sequence_numbers)
def test_equal_values_hash_equally(left: ExtendedSequenceNumber, right: ExtendedSequenceNumber) -> None:
    assert left != right or hash(left) == hash(right)


# --- validation ------------------------------------------------------------------------------------

INVALID = [
    pytest.param("12a", 0, id="digits-then-letter"),
    pytest.param("", 0, id="empty"),
    pytest.param("latest", 0, id="lowercase-sentinel"),
    pytest.param(" 12", 0, id="leading-space"),
    pytest.param("-12", 0, id="negative-sequence"),
    pytest.param("1.5", 0, id="decimal-point"),
    pytest.param("١٢", 0, id="arabic-indic-digits"),
    pytest.param("１２", 0, id="fullwidth-digits"),
    pytest.param(12, 0, id="int-sequence"),
    pytest.param(None, 0, id="none-sequence"),
    pytest.param("12", -1, id="negative-sub-sequence"),
    pytest.param("12", 1.0, id="float-sub-sequence"),
    pytest.param("12", "1", id="string-sub-sequence"),
    pytest.param("12", True, id="bool-sub-sequence"),
    pytest.param("12", None, id="none-sub-sequence"),
]


@pytest.mark.parametrize(("sequence_number", "sub_sequence_number"), INVALID)
def test_invalid_values_are_rejected(sequence_number: object, sub_sequence_number: object) -> None:
    with pytest.raises(InvalidSequenceNumberError):
        ExtendedSequenceNumber(sequence_number, sub_sequence_number)  # type: ignore[arg-type]


def test_the_error_names_the_offending_value() -> None:
    with pytest.raises(InvalidSequenceNumberError, match="12a"):
        ExtendedSequenceNumber("12a")


# --- formatting and sentinel helpers -----------------------------------------------------------------

FORMATTING = [
    pytest.param(ExtendedSequenceNumber("123"), "123", id="plain"),
    pytest.param(ExtendedSequenceNumber("123", 0), "123", id="sub-0-omitted"),
    pytest.param(ExtendedSequenceNumber("123", 4), "123/4", id="with-sub"),
    pytest.param(LATEST, "LATEST", id="sentinel"),
    pytest.param(SHARD_END, "SHARD_END", id="shard-end"),
    pytest.param(ExtendedSequenceNumber(HUGE_SMALLER), HUGE_SMALLER, id="huge-unchanged"),
]


@pytest.mark.parametrize(("value", "text"), FORMATTING)
def test_str_shows_the_sequence_number_and_a_non_zero_sub_sequence(value: ExtendedSequenceNumber, text: str) -> None:
    assert str(value) == text


@pytest.mark.parametrize("sentinel", list(Sentinel), ids=[s.value for s in Sentinel])
def test_sentinels_are_stored_as_their_plain_name_with_sub_sequence_0(sentinel: Sentinel) -> None:
    value = ExtendedSequenceNumber.of(sentinel)
    assert (value.sequence_number, value.sub_sequence_number, value.sentinel) == (sentinel.value, 0, sentinel)


def test_a_real_sequence_number_is_no_sentinel() -> None:
    value = ExtendedSequenceNumber("42")
    assert (value.sentinel, value.is_sentinel, value.is_shard_end) == (None, False, False)


def test_only_shard_end_is_shard_end() -> None:
    assert [v.is_shard_end for v in (AT_TIMESTAMP, TRIM_HORIZON, LATEST, SHARD_END)] == [False, False, False, True]
