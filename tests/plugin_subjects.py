"""Backends for tests/test_plugin_deviations.py, loaded by path (``plugin_subjects:Class``): the
example plugin's deviating backend with its declaration taken away, and the conformant example
backend carrying that declaration although it does not deviate."""

from attnspec_example_plugin import ExampleBackend
from attnspec_example_plugin.deviations import NAN_ROWS_DEVIATIONS
from attnspec_example_plugin.nan_rows import NanRowsBackend


class UndeclaredNanRows(NanRowsBackend):
    deviations = ()


class DeclaresWhatItDoesNotDo(ExampleBackend):
    deviations = NAN_ROWS_DEVIATIONS
