"""Gradio web app: a thin shell over ``jobs`` and ``core``. Not built yet."""
