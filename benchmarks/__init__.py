"""The benchmark scripts (run as scripts: python benchmarks/NAME.py); a package so that the tests import them."""
