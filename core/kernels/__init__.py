"""Low-level numerical kernels the statistics and the block passes share."""
