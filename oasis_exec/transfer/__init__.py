"""Bytes between host and GPU: ``uva.py``, ``host.py``, ``inline.py`` (the copy paths), ``choice.py`` + ``table.json``
(``transfer=auto``), ``writeback.py`` (filled local blocks to the host pool)."""
