import pytest
from shopcart.money import Money


def test_parse_whole_and_decimal_amounts():
    assert Money.parse("12.34") == Money(1234)
    assert Money.parse("7") == Money(700)
    assert Money.parse("0.5") == Money(50)


def test_parse_refuses_more_than_two_decimals():
    with pytest.raises(ValueError):
        Money.parse("1.234")


def test_arithmetic_is_exact():
    assert Money.parse("0.10") + Money.parse("0.20") == Money.parse("0.30")
    assert Money(250) * 3 == Money(750)


def test_format_pads_cents():
    assert str(Money(1205)) == "12.05"
