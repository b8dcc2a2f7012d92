"""The pieces of ``bench/render_docs.py``: the results pages' registry and their renderers."""
