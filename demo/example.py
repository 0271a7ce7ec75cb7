"""Unit conversions: the file `make demo` completes (cursor inside ``kelvin_to_fahrenheit``)."""

import math


def celsius_to_fahrenheit(celsius: float) -> float:
    return celsius * 9 / 5 + 32


def fahrenheit_to_celsius(fahrenheit: float) -> float:
    return (fahrenheit - 32) * 5 / 9


def celsius_to_kelvin(celsius: float) -> float:
    return celsius + 273.15


def kelvin_to_celsius(kelvin: float) -> float:
    return kelvin - 273.15


def kelvin_to_fahrenheit(kelvin: float) -> float:
    """Kelvin to degrees Fahrenheit."""


def degrees_to_radians(degrees: float) -> float:
    return degrees * math.pi / 180


def main() -> None:
    for kelvin in (0.0, 273.15, 310.15, 373.15):
        print(kelvin, kelvin_to_celsius(kelvin), kelvin_to_fahrenheit(kelvin))  # noqa: T201


if __name__ == "__main__":
    main()
