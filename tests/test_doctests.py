"""Every ``>>>`` example in the shipped package runs: a docstring's worked example is a test."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

# the installed package maps lsp/, decoder/ and models/ into specls (setuptools package-dir), so a walk
# of specls/ alone would miss them
ROOTS = ("specls", "specls.lsp", "specls.decoder", "specls.models")


def _modules() -> list[str]:
    names = set(ROOTS)
    for root in ROOTS:
        package = importlib.import_module(root)
        for info in pkgutil.walk_packages(package.__path__, f"{root}."):
            if not info.name.endswith("__main__"):  # running it is the command itself
                names.add(info.name)
    return sorted(names)


def _with_examples(name: str) -> bool:
    try:
        module = importlib.import_module(name)
    except ImportError:  # an optional extra's module (torch) where the extra is absent
        return False
    finder = doctest.DocTestFinder()
    return any(t.examples for t in finder.find(module))


MODULES = [m for m in _modules() if _with_examples(m)]


def test_the_package_has_examples() -> None:
    # Not []: the walk found the package's modules (a broken walk would pass every case below vacuously)
    assert len(MODULES) >= 5, MODULES


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
