"""Text views: the tables and headers that commands print."""
