"""The circuit-tracer agreement scripts (run as scripts); a package so that the tests import them."""
