"""Depth pruning: whole transformer blocks as prunable units. ``replace``: the least-squares stand-in of
a span and the block surgery; ``select``: which span goes; ``blockwise``: the same choice one block at a
time (a streamed model). The recipe integration is ``core/pipeline/depth.py`` (in memory) and
``core/pipeline/streamed_depth.py`` (streamed), the speed target ``core/pipeline/target.py``.
"""
