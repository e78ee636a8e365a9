"""The one exception the data layer raises for bad inputs.

Every message is a single line that names the offending path or value and says what
was expected, so a failed run can be fixed from its log without reading code.
``DataError`` subclasses ``ValueError`` so callers that only know about ``ValueError``
(argument parsers, config validation) still catch it.
"""
from __future__ import annotations


class DataError(ValueError):
    """A data source, prepared dataset or data parameter is missing, malformed or corrupt."""
