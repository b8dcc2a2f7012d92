"""Depth pruning: whole transformer blocks as prunable units. ``replace``: the least-squares stand-in of
a span and the block surgery; ``select``: which span goes. The recipe integration is
``core/pipeline/depth.py`` (in memory; streamed runs refuse depth), the speed target
``core/pipeline/target.py``.
"""
