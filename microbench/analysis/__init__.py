"""What is computed from result files only: compare, predict, figures, report."""
