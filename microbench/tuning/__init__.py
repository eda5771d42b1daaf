"""Tuning on the pattern's own messages: settings grids (env_grid) and their best (best)."""
