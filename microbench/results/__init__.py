"""Result files: run folders written atomically (store) and read back with validation (runs)."""
