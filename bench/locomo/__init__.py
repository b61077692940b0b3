"""The LoCoMo retrieval benchmark (see ``runner`` and ``dataset``; run ``python -m bench.locomo``)."""
