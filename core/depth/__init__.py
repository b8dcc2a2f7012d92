"""Depth pruning: whole transformer blocks as prunable units (issue in progress: the least-squares
stand-in and the block surgery are here; the recipe, allocation and streamed integration are not yet).
"""
